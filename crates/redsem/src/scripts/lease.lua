-- lease: change the lease of one holder (Permit::set_lease) and extend it by the new length
-- from now. Later renewals extend it by the new length too. Never re-creates an entry.
-- ARGV (after the common header): 4 id, 5 lease ms
-- Reply: {1, slots, fences, ticket} the entry holds, and its lease is the new one
--        {-1}                       gone (expired, released by someone else, lost with Redis
--                                   data), or not a holder
local now = now_ms()
local limit = load_limit()
settle(now, limit, false)
local id = ARGV[4]
local m = get_meta(id)
if not m or not m.s then return { -1 } end
restore_leases(id, now)
m.l = tonumber(ARGV[5])
redis.call('HSET', K_META, id, cjson.encode(m))
redis.call('ZADD', K_EXP, 'XX', now + m.l, id)
return held_reply(m)
