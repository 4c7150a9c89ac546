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
-- A forced delete reads nothing it relies on, so that it also removes a semaphore whose keys
-- are inconsistent (Error::Corrupt); but it refuses (REDSEM_FOREIGN, nothing deleted) when a
-- key holds another program's data: a type redsem does not use for it, or a `cfg` hash that
-- is not a redsem configuration. ARGV 4 = "2" deletes every key whatever it holds (the
-- operator said explicitly that it is not another program's data, or that it may go).
local force = ARGV[4] == '1' or ARGV[4] == '2'
if ARGV[4] == '1' then
  local want = { { K_CFG, 'hash' }, { K_QUEUE, 'zset' }, { K_EXP, 'zset' }, { K_META, 'hash' },
    { K_SLOTS, 'hash' }, { K_FREE, 'zset' }, { K_OWN, 'zset' } }
  for _, kt in ipairs(want) do
    local got = redis.call('TYPE', kt[1])
    got = type(got) == 'table' and got.ok or got
    if got ~= 'none' and got ~= kt[2] then
      error({ err = 'REDSEM_FOREIGN key ' .. kt[1] .. ' holds a ' .. got .. ', not the ' .. kt[2]
        .. ' redsem keeps there: another program uses this key name' })
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
redis.call('DEL', K_CFG, K_QUEUE, K_EXP, K_META, K_SLOTS, K_FREE, K_OWN)
return { 1, holders, waiters }
