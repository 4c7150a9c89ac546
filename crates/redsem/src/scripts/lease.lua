-- lease: change the lease of one holder (Permit::set_lease) and extend it by the new length
-- from now: the entry moves to its client's session for the new length, whose lease reaches
-- at least now + the new length. Never re-creates an entry.
-- ARGV (after the common header): 4 id, 5 lease ms
-- Reply: {1, slots, fences, ticket} the entry holds, and its lease is the new one
--        {-1}                       gone (expired, released by someone else, lost with Redis
--                                   data), or not a holder
local now = now_ms()
check_zset(K_OWN)
ONLY_EXISTING = true
local limit = load_limit()
if not limit then return { -1 } end -- deleted (delete.lua): not re-created
settle(now, limit, false)
local id = ARGV[4]
local m = get_meta(id)
if not m or not m.s then finish(); return { -1 } end
local old = sess_of(m)
m.l = tonumber(ARGV[5])
local new = sess_of(m)
if old ~= new then
  redis.call('ZREM', K_OWN, old .. '|' .. id)
  redis.call('ZADD', K_OWN, 0, new .. '|' .. id)
end
redis.call('ZADD', K_EXP, 'GT', now + m.l, new)
redis.call('HSET', K_META, id, cjson.encode(m))
finish()
return held_reply(m)
