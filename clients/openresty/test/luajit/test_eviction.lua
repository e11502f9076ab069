local h = require "helpers"
local requests = require "resty.tokenbucket.requests"

local T = {}

-- The module's own line (core/src/eviction.rs), from contract.json.
function T.the_eviction_warning_is_the_modules()
  h.eq(requests.eviction_warning("volatile-ttl", 1073741824),
    "tb: maxmemory-policy volatile-ttl with maxmemory 1073741824 evicts keys with a TTL, and every bucket and lease "
    .. "key has one (often shorter than other keys', so they go first): an evicted bucket comes back full, minting "
    .. "the tokens it had spent, and an evicted lease key frees every slot of its cap. Set maxmemory-policy "
    .. "noeviction, or keep the limits on an instance or database of their own")
  h.eq(requests.eviction_warning("allkeys-lru", 1):match("^tb: maxmemory%-policy allkeys%-lru with maxmemory 1 may evict any key"),
    "tb: maxmemory-policy allkeys-lru with maxmemory 1 may evict any key")
  h.eq(requests.eviction_warning("noeviction", 1073741824), nil)
  h.eq(requests.eviction_warning("allkeys-lru", 0), nil)
end

return T
