-- lease: change the lease of one holder (Permit::set_lease) and extend it by the new length
-- from now: the entry moves to its client's session for the new length, whose lease reaches
-- at least now + the new length. Never re-creates an entry. Also adopts a holder handed off
-- by another client handle (Semaphore::adopt): the entry moves to the caller's session.
-- ARGV (after the common header): 4 id, 5 lease ms,
--   6 (optional) the calling handle's channel id: the entry must belong to it (its `c`,
--     and not detached), else nothing changes and the reply is {-3};
--   7 (optional, with 6) "1" to adopt instead: whatever session the entry is in (detached, or
--     another handle's), its `c` becomes ARGV 6 and its `o` goes; a detached entry's own
--     session (`d.<id>~<lease>`) leaves `exp`
-- Reply: {1, slots, fences, ticket} the entry holds, and its lease is the new one
--        {-1}                       gone (expired, released by someone else, lost with Redis
--                                   data), or not a holder
--        {-3}                       (ARGV 6 without adopting) it belongs to another handle:
--                                   another client adopted it (a hand-off)
local now = now_ms()
ONLY_EXISTING = true
local limit = load_limit()
if not limit then return { -1 } end -- deleted (delete.lua): not re-created
settle(now, limit, false)
local id = ARGV[4]
local m = get_meta(id)
if not m or not m.s then finish(); return { -1 } end
local me, adopt = ARGV[6], ARGV[7] == '1'
if me and not adopt and (m.o or m.c) ~= me then finish(); return { -3 } end
local old, detached = sess_of(m), m.o
m.l = ARGV[5] -- (a decimal string, as records keep it)
if adopt then m.c = me; m.o = nil end
local new = sess_of(m)
if old ~= new then
  redis.call('ZREM', K_OWN, old .. '|' .. id)
  redis.call('ZADD', K_OWN, '0', new .. '|' .. id)
  -- a detached entry's session was its own: nobody renews or ends it
  if adopt and detached then redis.call('ZREM', K_EXP, old) end
end
redis.call('ZADD', K_EXP, 'GT', int(now + m.l), new)
redis.call('HSET', K_META, id, encode(m))
finish()
return held_reply(m)
