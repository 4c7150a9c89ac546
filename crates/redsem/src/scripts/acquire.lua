-- acquire: take a ticket (or, in try mode, take capacity only if it is free now).
-- ARGV (after the common header): 4 id, 5 n, 6 holder lease ms, 7 waiter lease ms,
--   8 client channel suffix, 9 label, 10 mode ("wait" | "try")
-- Reply: {1, slots, fences, ticket}   granted now
--        {0, ticket, next_expiry_ms}  queued; the grant will be published to the client channel
--        {-1}                         try mode: no capacity (or others are queued: FIFO)
--        {-2, limit}                  n exceeds the limit
-- Idempotent per id: re-sending the same id returns the entry's current state.
local id, n = ARGV[4], tonumber(ARGV[5])
local now = now_ms()
local limit = load_limit()
settle(now, limit, false)
if n > limit then return { -2, limit } end

local m = get_meta(id)
if m then
  if m.s then return held_reply(m) end
  return { 0, m.t, next_expiry(now) }
end

m = { n = n, c = ARGV[8], l = tonumber(ARGV[6]), w = tonumber(ARGV[7]), lb = ARGV[9], q = now }
-- FIFO: capacity goes to the queue first; with nobody queued, take it at once.
if redis.call('ZCARD', K_QUEUE) == 0 and redis.call('HLEN', K_SLOTS) + n <= limit then
  m.t = redis.call('HINCRBY', K_CFG, 'seq', 1)
  grant(id, m, now, true)
  return held_reply(m)
end
if ARGV[10] == 'try' then return { -1 } end

-- Queue at the tail. Nobody ahead could be granted (see settle), so neither can we yet.
m.t = redis.call('HINCRBY', K_CFG, 'seq', 1)
redis.call('ZADD', K_QUEUE, m.t, id)
redis.call('ZADD', K_EXP, now + m.w, id)
redis.call('HSET', K_META, id, cjson.encode(m))
return { 0, m.t, next_expiry(now) }
