local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)

local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #dead > 0 then
  redis.call('ZREM', KEYS[1], unpack(dead))
  redis.call('ZREM', KEYS[2], unpack(dead))
end
if not redis.call('ZSCORE', KEYS[2], ARGV[3]) then return -1 end   -- our entry expired
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[3])        -- extend lease
if redis.call('ZRANK', KEYS[1], ARGV[3]) < tonumber(ARGV[1]) then return 1 end
return 0
