-- stats: a read-only snapshot (`#!lua flags=no-writes`, run with EVALSHA_RO: a user allowed to
-- read the semaphore's keys and nothing more may take it), of a bounded cost whatever the
-- queue and the limit: the counts, the first waiters of the queue and some holders. It writes
-- nothing (no reap, no repair, no grant): what it reports is what the next script would leave
-- after reaping, computed without it: the entries of sessions whose lease has passed (Redis
-- TIME) are left out, as reaping would remove them (as many as one reap takes: 64 sessions,
-- 512 entries, found through the index `own`; and every listed entry whose session's lease
-- has passed, even when the index was lost). Nor does it create or repair anything: a lost
-- key shows as what is left.
-- ARGV (after the common header): 4 (optional) how many holders and waiters to list at most
--   (default 100), 5 (optional) the position in the queue the list of waiters starts at
--   (default 0, the head)
-- Reply: {now_ms, limit, permits_in_use, grants, expired, listed_holders, listed_waiters,
--         repairs, holders, waiters}
-- listed_holders: up to ARGV 4 holders, in no particular order (all of them when there are no
-- more), as {id, record, expiry, id, record, expiry, ...}: its id, its record as stored (see
-- the prelude's decode) and the lease expiry of its session (ms; -1 for none);
-- listed_waiters: the same for the waiters from position ARGV 5 on, in queue (FIFO) order;
-- holders, waiters: how many there are in all. limit: the stored one (the caller's, ARGV 1,
-- when the configuration is missing: every counter is then 0).
local now = now_ms()
local cfg = redis.call('HMGET', K_CFG, 'limit', 'ver', 'grants', 'expired', 'repairs')
check_ours(cfg[1], cfg[2])
if cfg[1] then check_version(cfg[2]) end
-- (the keys the snapshot does not always read: one overwritten with another type fails it
-- with WRONGTYPE, as it fails the next acquire; the others are read below)
check_zset(K_OWN); check_zset(K_FREE)
local limit = tonumber(cfg[1] or A[1])
local max = tonumber(A[4] or '100')
local from = tonumber(A[5] or '0')

-- The entries a reap would remove now: those of the sessions whose lease has passed.
local dead = {}
local gone_holders, gone_waiters, gone_slots = 0, 0, 0
-- Leaves out the entry `id`, whose record `m` (decoded, or entry_fields) is a dead session's.
local function leave_out(id, m)
  dead[id] = true
  if m.s then
    gone_holders = gone_holders + 1
    gone_slots = gone_slots + #m.s
  else
    gone_waiters = gone_waiters + 1
  end
end
local budget = 512
for _, sid in ipairs(redis.call('ZRANGEBYSCORE', K_EXP, '-inf', now_ms_s(), 'LIMIT', '0', '64')) do
  local members = redis.call('ZRANGEBYLEX', K_OWN, '[' .. sid .. '|', '[' .. sid .. '|\255',
    'LIMIT', 0, budget)
  local ids = {}
  for _, mem in ipairs(members) do
    local id = string.sub(mem, #sid + 2)
    if string.sub(id, 1, 1) ~= '!' then ids[#ids + 1] = id end
  end
  local ms = get_metas(ids)
  for i, id in ipairs(ids) do
    local m = ms[i]
    if m and sess_of(m) == sid then leave_out(id, m) end
  end
  budget = budget - #members
  if budget <= 0 then break end
end

local expiry = {} -- session -> lease expiry (ms), read once each
-- {id, record, expiry, ...} of the entries `ids` that have a record and were not left out,
-- at most `cap` of them. An entry whose session's lease has passed is left out too (and
-- counted as the scan above counts them) when the scan did not find it: the index that
-- scan reads (`own`) was lost, or its budget ran out; the next script repairs and reaps.
local function entries(ids, cap)
  local arr = {}
  if #ids == 0 then return arr end
  local raws = redis.call('HMGET', K_META, unpack(ids))
  for i, id in ipairs(ids) do
    local raw = raws[i]
    if #arr >= 3 * cap then break end
    if raw and not dead[id] then
      local sid = raw_sess_of(raw) or sess_of(decode(raw)) -- (decode names a bad record)
      local e = expiry[sid]
      if e == nil then
        e = tonumber(redis.call('ZSCORE', K_EXP, sid)) or -1
        expiry[sid] = e
      end
      if e >= 0 and e <= now then
        leave_out(id, entry_fields(raw))
      else
        arr[#arr + 1] = id; arr[#arr + 1] = raw; arr[#arr + 1] = e
      end
    end
  end
  return arr
end
-- some holders: the slot map's first fields (all of them while it is small)
local holder_ids, seen = {}, {}
local cursor = '0'
for _ = 1, (max > 0 and 8 or 0) do
  local page = redis.call('HSCAN', K_SLOTS, cursor, 'COUNT', max)
  cursor = page[1]
  local fields = page[2]
  for i = 1, #fields, 2 do
    local id = fields[i + 1]
    if not seen[id] and not dead[id] and #holder_ids < max then
      seen[id] = true
      holder_ids[#holder_ids + 1] = id
    end
  end
  if cursor == '0' or #holder_ids >= max then break end
end
-- (as many more as are left out, so that `max` are listed when there are: the head of the
-- queue is listed even when it is a dead waiter's turn, which the next reap removes)
local waiting = max > 0 and redis.call('ZRANGE', K_QUEUE, from, from + max - 1 + gone_waiters)
  or {}
local h, w = entries(holder_ids, max), entries(waiting, max)
local queued = redis.call('ZCARD', K_QUEUE)
local holders = redis.call('HLEN', K_META) - queued - gone_holders
if holders < 0 then holders = 0 end
local waiters = queued - gone_waiters
if waiters < 0 then waiters = 0 end
local in_use = redis.call('HLEN', K_SLOTS) - gone_slots
if in_use < 0 then in_use = 0 end
-- (the entries left out count as expired, as they will be once reaped)
return { now, limit, in_use, tonumber(cfg[3] or '0'),
  tonumber(cfg[4] or '0') + gone_holders + gone_waiters, h, w,
  tonumber(cfg[5] or '0'), holders, waiters }
