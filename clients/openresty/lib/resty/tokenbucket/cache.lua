-- The local denial cache, one per nginx worker, with the Python package's
-- rule (clients/python/src/redis_tokenbucket/_cache.py).
--
-- A denial says "this request can't pass for the next R ms"
-- (retry_after_ms is the earliest millisecond at which it would). Until
-- then the same request, or a costlier one, on the same buckets is denied
-- again, so the worker answers it from memory: a client hammering a hot
-- key in a retry loop costs Redis one call per retry window instead of one
-- per attempt.
--
-- It never denies what Redis would admit, only later than Redis could:
-- the deadline counts from when the request was sent, not answered. Any
-- write this worker makes to a key (a charge, a refund, a reset) drops the
-- entries that involve it, and a denial whose request was in flight while
-- such a write finished is not remembered (Redis may have answered it
-- before the write). A request that got no answer forgets its keys
-- (whatever could have written may have). A refund from another worker or
-- node is not seen, so such a request is denied at most until its
-- original retry time.
--
-- Plain Lua: `clock` (seconds) is injected; nginx passes ngx.now, which
-- can step with the wall clock, so an entry whose time runs backwards is
-- dropped rather than trusted.

local setmetatable, ceil, floor, max = setmetatable, math.ceil, math.floor, math.max
local concat = table.concat

local _M = {}
_M.DEFAULT_ENTRIES = 10000

local Cache = {}
Cache.__index = Cache

function _M.new(max_entries, clock)
  max_entries = max_entries or _M.DEFAULT_ENTRIES
  if type(max_entries) ~= "number" or max_entries < 1 or max_entries % 1 ~= 0 then
    error("denial cache: max_entries must be an integer >= 1", 2)
  end
  local head = {}
  head.prev, head.next = head, head -- the LRU ring: head.next is the oldest
  return setmetatable({
    max_entries = max_entries,
    clock = assert(clock, "denial cache: a clock is needed"),
    size = 0,
    hits = 0,
    misses = 0,
    entries = {}, -- ids -> entry
    ring = head,
    by_key = {}, -- key -> {ids = true}
    pending = {}, -- key -> {ticket = true}
  }, Cache)
end

-- A request's keys as one string: each key length-prefixed, so no two key
-- lists collide.
local function ids_of(keys)
  if #keys == 1 then return #keys[1] .. ":" .. keys[1] end
  local parts = {}
  for i = 1, #keys do parts[i] = #keys[i] .. ":" .. keys[i] end
  return concat(parts)
end

local function unlink(e)
  e.prev.next, e.next.prev = e.next, e.prev
end

local function push_newest(ring, e)
  e.prev, e.next = ring.prev, ring
  ring.prev.next = e
  ring.prev = e
end

local function drop(self, ids)
  local e = self.entries[ids]
  if e == nil then return end
  self.entries[ids] = nil
  self.size = self.size - 1
  unlink(e)
  for i = 1, #e.keys do
    local owners = self.by_key[e.keys[i]]
    if owners then
      owners[ids] = nil
      if next(owners) == nil then self.by_key[e.keys[i]] = nil end
    end
  end
end

local function forget_key(self, key)
  local owners = self.by_key[key]
  if owners then
    local list = {}
    for ids in pairs(owners) do list[#list + 1] = ids end
    for i = 1, #list do drop(self, list[i]) end
  end
  local waiting = self.pending[key]
  if waiting then
    for ticket in pairs(waiting) do ticket.stale = true end
  end
end

-- A decision as the cache hands it back: aged by `elapsed_ms`, cached.
local function aged(d, elapsed_ms)
  local retry = 0
  if d.retry_after_ms > 0 then retry = max(0, ceil(d.retry_after_ms - elapsed_ms)) end
  local reset = max(retry, ceil(d.reset_after_ms - elapsed_ms))
  local copy = {}
  for k, v in pairs(d) do copy[k] = v end
  copy.allowed = d.allowed or retry == 0
  copy.retry_after_ms = retry
  copy.reset_after_ms = reset
  copy.cached = true
  return copy
end
_M.aged = aged

-- The live entry for `keys` whose limits and costs match, and now.
local function find(self, keys, buckets, costs)
  local ids = ids_of(keys)
  local e = self.entries[ids]
  if e == nil then
    self.misses = self.misses + 1
    return nil
  end
  local now = self.clock()
  if now >= e["until"] or now < e.at then
    drop(self, ids)
    self.misses = self.misses + 1
    return nil
  end
  -- Another bucket size or a cheaper request may pass: ask Redis. (A
  -- quota never matches a bucket, nor another period: `ident`.)
  for i = 1, #keys do
    local b, d = buckets[i], e.decisions[i]
    if b.max ~= d.bucket.max or b.rate ~= d.bucket.rate or b.ident ~= d.bucket.ident or costs[i] < d.cost then
      self.misses = self.misses + 1
      return nil
    end
  end
  unlink(e)
  push_newest(self.ring, e)
  self.hits = self.hits + 1
  return e, now
end

-- The cached denial of this request, aged to now: {retry_after_ms,
-- decisions}; nil to ask Redis.
function Cache:lookup(keys, buckets, costs)
  local e, now = find(self, keys, buckets, costs)
  if e == nil then return nil end
  -- Rounded to the µs, as `left` below: the noise of a float clock must
  -- not add a whole ms to an aged wait.
  local elapsed_ms = floor((now - e.at) * 1e6 + 0.5) / 1000
  local decisions = {}
  for i = 1, #e.decisions do decisions[i] = aged(e.decisions[i], elapsed_ms) end
  -- Rounded to the µs first: `until` is a sum of floats, and the noise of
  -- (at + retry) - at must not round a whole ms up.
  local left = floor((e["until"] - now) * 1e6 + 0.5) / 1000
  return { retry_after_ms = max(1, ceil(left)), decisions = decisions }
end

-- ---- a request's way: sent, then answered or failed ------------------------

-- What a request does, as far as the cache cares: "consume", "peek",
-- "adjust", "mconsume", "each" (bucket by bucket, refunded on a denial),
-- "reset", or "acquire" (charges its buckets with a lease; its denial is
-- never kept: a release can free a slot at any time).
function Cache:sent(op, keys)
  local ticket = { op = op, keys = keys, sent_at = self.clock(), stale = false }
  local pending = self.pending
  for i = 1, #keys do
    local waiting = pending[keys[i]]
    if waiting == nil then
      waiting = {}
      pending[keys[i]] = waiting
    end
    waiting[ticket] = true
  end
  return ticket
end

local function release(self, ticket)
  local pending, keys = self.pending, ticket.keys
  for i = 1, #keys do
    local waiting = pending[keys[i]]
    if waiting then
      waiting[ticket] = nil
      if next(waiting) == nil then pending[keys[i]] = nil end
    end
  end
end

-- The keys an answered request wrote.
local function written(ticket, allowed, decisions)
  local op, keys, out = ticket.op, ticket.keys, {}
  if op == "adjust" or op == "reset" then return keys end
  if op == "peek" then return out end
  if allowed then -- every bucket paid its cost
    for i = 1, #keys do
      if decisions[i].cost > 0 then out[#out + 1] = keys[i] end
    end
  elseif op == "each" then
    -- Denied bucket by bucket: those before the denying one were charged,
    -- then refunded.
    for i = 1, #keys do
      if not decisions[i].allowed then break end
      if decisions[i].cost > 0 then out[#out + 1] = keys[i] end
    end
  end
  return out
end

local NEVER_KEPT = { adjust = true, reset = true, acquire = true }

-- Redis's answer: forgets the keys it wrote, and remembers it if it is a
-- denial that no write overtook.
function Cache:answered(ticket, allowed, retry_after_ms, decisions)
  release(self, ticket)
  local keys = written(ticket, allowed, decisions)
  for i = 1, #keys do forget_key(self, keys[i]) end
  if allowed or ticket.stale or retry_after_ms <= 0 or NEVER_KEPT[ticket.op] then return end
  local ids = ids_of(ticket.keys)
  drop(self, ids)
  local e = {
    keys = ticket.keys,
    at = ticket.sent_at,
    ["until"] = ticket.sent_at + retry_after_ms / 1000,
    decisions = decisions,
  }
  self.entries[ids] = e
  self.size = self.size + 1
  push_newest(self.ring, e)
  local by_key = self.by_key
  for i = 1, #ticket.keys do
    local owners = by_key[ticket.keys[i]]
    if owners == nil then
      owners = {}
      by_key[ticket.keys[i]] = owners
    end
    owners[ids] = true
  end
  while self.size > self.max_entries do
    local oldest = self.ring.next
    drop(self, ids_of(oldest.keys))
  end
end

-- No answer: whatever could have written may have, so its keys are
-- forgotten (a peek writes nothing).
function Cache:failed(ticket)
  release(self, ticket)
  if ticket.op ~= "peek" then
    for i = 1, #ticket.keys do forget_key(self, ticket.keys[i]) end
  end
end

-- Drops every entry that involves `key`.
function Cache:forget(key)
  forget_key(self, key)
end

function Cache:len()
  return self.size
end

return _M
