-- delete: remove the semaphore entirely (Client::delete_semaphore): every key, its limit and
-- its fences included. Refused while anyone holds or waits, unless forced; a forced delete
-- evicts them like force_release (holders learn it at their next renewal, waiters are queued
-- again and re-create the semaphore). Run behind the guard: a missing semaphore is a nil reply.
-- Fences stay monotonic across a delete and a re-create: a new grant's generation is at least
-- Redis TIME in microseconds (see next_generation).
-- ARGV (after the common header): 4 force ("1" or "0"; "2": forced, even over another
--   program's data)
-- Reply: {1, holders, waiters} deleted; the counts are the entries it evicted
--        {0, holders, waiters} refused: live holders or waiters, and not forced
-- A forced delete that evicted entries leaves a tombstone: `own` holds only '!deleted', with
-- a TTL of the longest session lease left plus 10 s, so that the evicted entries' renewals
-- and releases learn that the semaphore was deleted instead of re-creating it (a deliberate
-- use, open.lua or acquire.lua, re-creates it and removes the tombstone).
-- A forced delete reads nothing it relies on, so that it also removes a semaphore whose keys
-- are inconsistent (Error::Corrupt); but it refuses (REDSEM_FOREIGN, nothing deleted) when a
-- key holds another program's data: a type redsem does not use for it, or a `cfg` hash that
-- is not a redsem configuration. ARGV 4 = "2" deletes every key whatever it holds (the
-- operator said explicitly that it is not another program's data, or that it may go).
local force = ARGV[4] == '1' or ARGV[4] == '2'
if ARGV[4] == '1' then
  -- (by the commands the ACL rule allows anyway: HLEN and ZCARD fail on another type)
  local want = { { K_CFG, 'HLEN', 'hash' }, { K_QUEUE, 'ZCARD', 'sorted set' },
    { K_EXP, 'ZCARD', 'sorted set' }, { K_META, 'HLEN', 'hash' }, { K_SLOTS, 'HLEN', 'hash' },
    { K_FREE, 'ZCARD', 'sorted set' }, { K_OWN, 'ZCARD', 'sorted set' } }
  for _, kt in ipairs(want) do
    local r = redis.pcall(kt[2], kt[1])
    if type(r) == 'table' and r.err then
      error({ err = 'REDSEM_FOREIGN key ' .. kt[1] .. ' holds another type of value, not the '
        .. kt[3] .. ' redsem keeps there: another program uses this key name' })
    end
  end
  local cfg = redis.call('HMGET', K_CFG, 'limit', 'ver')
  check_ours(cfg[1], cfg[2])
end
if not force then
  local now = now_ms()
  local limit = load_limit()
  settle(now, limit, false) -- expired entries do not count (and what they free is granted)
  finish()
end
local function count(cmd, key)
  local r = redis.pcall(cmd, key)
  if type(r) == 'number' then return r end
  return 0
end
local entries = count('HLEN', K_META)
local waiters = count('ZCARD', K_QUEUE)
local holders = entries - waiters
if holders < 0 then holders = 0 end
if entries > 0 and not force then return { 0, holders, waiters } end
local ttl = 0
if entries > 0 then
  local now = now_ms()
  -- the longest session lease left: the highest score but the marker's
  local last = redis.pcall('ZRANGE', K_EXP, -2, -1, 'WITHSCORES')
  ttl = 10000
  if type(last) == 'table' then
    for i = 1, #last, 2 do
      if last[i] ~= '#' then ttl = math.max(ttl, 10000 + tonumber(last[i + 1]) - now) end
    end
  end
end
redis.call('DEL', K_CFG, K_QUEUE, K_EXP, K_META, K_SLOTS, K_FREE, K_OWN)
if ttl > 0 then
  redis.call('ZADD', K_OWN, 0, '!deleted')
  redis.call('PEXPIRE', K_OWN, string.format('%d', ttl))
end
return { 1, holders, waiters }
