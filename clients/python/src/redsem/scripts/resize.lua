-- resize: change the stored limit live. Growing admits waiters at once; shrinking lets
-- holders finish and admits no one until the permits in use are below the new limit.
-- ARGV (after the common header): 4 new limit
-- Reply: the previous limit
local now = now_ms()
local old = load_limit()
local new = tonumber(ARGV[4])
if new > old then
  for s = old, new - 1 do
    if redis.call('HEXISTS', K_SLOTS, s) == 0 then redis.call('ZADD', K_FREE, s, s) end
  end
elseif new < old then
  redis.call('ZREMRANGEBYSCORE', K_FREE, new, '+inf')
end
redis.call('HSET', K_CFG, 'limit', new)
settle(now, new, true)
return old
