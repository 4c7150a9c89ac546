local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)

local ticket = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[1], ticket, ARGV[2])                -- queue: ordered by ticket
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])  -- lease: ordered by expiry
