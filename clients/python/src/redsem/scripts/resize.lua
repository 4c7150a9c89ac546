-- resize: change the stored limit live. Growing admits waiters at once; shrinking lets
-- holders finish and admits no one until the permits in use are below the new limit.
-- ARGV (after the common header): 4 new limit, or with ARGV 5 = "add": a change (+/-) of the
--   stored limit, applied atomically, refused when the result is outside 1..ARGV 6
-- Reply: the previous limit; with "add": {previous, new} or {previous, -1} when refused
local now = now_ms()
check_all()
local old = load_limit()
local new = tonumber(ARGV[4])
local relative = ARGV[5] == 'add'
if relative then
  new = old + new
  if new < 1 or new > tonumber(ARGV[6]) then finish(); return { old, -1 } end
end
if new > old then
  for s = old, new - 1 do
    if redis.call('HEXISTS', K_SLOTS, s) == 0 then redis.call('ZADD', K_FREE, s, s) end
  end
elseif new < old then
  redis.call('ZREMRANGEBYSCORE', K_FREE, new, '+inf')
end
redis.call('HSET', K_CFG, 'limit', new)
settle(now, new, true)
finish()
if relative then return { old, new } end
return old
