local h = require "helpers"
local classify = require("resty.tokenbucket.classify").classify

local T = {}

-- Each error, as nginx's cosocket words it (lua-resty-redis passes the text
-- through) or as Redis replies it, and what it counts as.
local CASES = {
  -- local exhaustion: shed, never admitted, never counted
  { { socket = "too many open files", op = "connect" }, "shed", "EMFILE" },
  { { socket = "too many open files in system", op = "connect" }, "shed", "ENFILE" },
  { { socket = "cannot assign requested address", op = "connect" }, "shed", "EADDRNOTAVAIL" },
  { { socket = "no buffer space available", op = "command" }, "shed", "ENOBUFS" },
  { { socket = "cannot allocate memory", op = "command" }, "shed", "ENOMEM" },
  { { socket = "no memory", op = "connect" }, "shed", "nginx out of memory" },
  { { socket = "too many waiting connect operations", op = "connect" }, "shed", "pool backlog full" },
  { { socket = "timeout", op = "connect" }, "shed", "no connection within the budget" },
  { { socket = "something nobody expected", op = "command" }, "shed", "in doubt" },
  -- Redis failing
  { { socket = "connection refused", op = "connect" }, "failure", "refused" },
  { { socket = "connection reset by peer", op = "command" }, "failure", "reset" },
  { { socket = "closed", op = "command" }, "failure", "closed" },
  { { socket = "broken pipe", op = "command" }, "failure", "broken pipe" },
  { { socket = "timeout", op = "command" }, "failure", "no reply within the budget after the write" },
  { { socket = "timeout", op = "command", answering = true }, "shed",
    "no reply in time, while Redis answered this worker's other commands" },
  { { socket = "no route to host", op = "connect" }, "failure", "no route" },
  { { socket = "redis.example could not be resolved (3: Host not found)", op = "connect" }, "failure", "dns" },
  { { reply = "LOADING Redis is loading the dataset in memory" }, "failure", "LOADING" },
  { { reply = "BUSY Redis is busy running a script." }, "failure", "BUSY" },
  { { reply = "MASTERDOWN Link with MASTER is down" }, "failure", "MASTERDOWN" },
  { { reply = "CLUSTERDOWN The cluster is down" }, "failure", "CLUSTERDOWN" },
  { { reply = "TRYAGAIN Multiple keys request during rehashing of slot" }, "failure", "TRYAGAIN" },
  { { reply = "READONLY You can't write against a read only replica." }, "failure", "READONLY" },
  { { reply = "MISCONF Redis is configured to save RDB snapshots" }, "failure", "MISCONF" },
  { { reply = "NOREPLICAS Not enough good replicas to write." }, "failure", "NOREPLICAS" },
  { { reply = "OOM command not allowed when used memory > 'maxmemory'." }, "failure", "OOM" },
  { { circuit_open = true, message = "the breaker is open" }, "failure", "breaker open" },
  -- usage errors: always returned
  { { reply = "WRONGTYPE Operation against a key holding the wrong kind of value" }, "usage", "WRONGTYPE" },
  { { reply = "NOSCRIPT No matching script. Please use EVAL." }, "usage", "NOSCRIPT reaching the policy" },
  { { reply = "ERR max must be > 0 and <= 1e12" }, "usage", "the module's own error" },
  { { reply = "ERR key is not a token bucket: the hash must hold exactly the fields tokens and ts" }, "usage",
    "not a bucket" },
  { { reply = "NOPERM this user has no permissions to access one of the keys used as arguments" }, "usage",
    "NOPERM" },
  { { reply = "WRONGPASS invalid username-password pair or user is disabled." }, "usage", "wrong password" },
  { { reply = "NOAUTH Authentication required." }, "usage", "no password" },
  { { reply = "BUSYKEY Target key name already exists." }, "usage", "BUSYKEY is not BUSY" },
  { { shape = "Redis answered TB.MCONSUME with the text \"OK\"" }, "usage", "wrong shape" },
  { { usage = "no rate-limit backend answered" }, "usage", "no backend" },
  { "a string", "usage", "not an error table" },
}

function T.each_error_counts_as_the_other_clients_count_it()
  for _, case in ipairs(CASES) do
    h.eq(classify(case[1]), case[2], case[3])
  end
end

function T.local_exhaustion_is_recognised_in_any_case()
  local le = require("resty.tokenbucket.classify").local_exhaustion
  h.ok(le("Too Many Open Files"), "case")
  h.ok(not le("connection refused"), "refused is not local")
end

return T
