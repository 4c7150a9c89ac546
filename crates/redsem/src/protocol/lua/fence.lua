-- fence: check a fencing token at a resource stored in Redis (not part of the semaphore's
-- keys; this script has no prelude).
-- KEYS: 1 fence record (hash: slot -> highest generation seen), 2 (optional) key to write
-- ARGV: 1 slot, 2 generation, 3 (optional) value to SET at KEYS[2] when the token is current
-- Reply: 1 accepted (the generation is the highest seen for the slot, or equal to it: tokens
--        are unique per slot, so an equal one is the same grant writing again),
--        0 rejected (a later holder of the slot has been seen: this holder is stale)
-- Generations are below 2^53 (Redis TIME in microseconds), so exact in Lua's doubles; the
-- record keeps the decimal string as sent.
local seen = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1') or -1
local gen = tonumber(ARGV[2])
if gen < seen then return 0 end
if gen > seen then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
if KEYS[2] then redis.call('SET', KEYS[2], ARGV[3]) end
return 1
