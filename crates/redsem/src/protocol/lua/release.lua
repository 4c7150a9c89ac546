-- release: remove holders or queued waiters (a cancelled acquire), detach holders, end
-- sessions, then grant what that frees.
-- ARGV (after the common header):
--   4 force ("1" or "2" for an operator's release: the client that owns the entry learns it
--     at its next renewal of the entry's session, and a removed waiter at once from an "r:"
--     record on its channel; "0" otherwise)
--   5 k, the number of sessions to end (a client handle that closes ends its sessions: a
--     session ends only if it has no entry left)
--   6 d, the number of holders to detach (Permit::detach: the holder leaves its client's
--     session for one of its own that nobody renews, which keeps the lease it has now)
--   then k session ids, d holder ids, and the ids to remove
-- Reply: number of entries that existed and were removed; with force "2": {holders removed,
-- waiters removed}. Idempotent.
-- (It does not reap: what it frees it grants, and expired sessions are reaped by the next
-- acquire or renewal, which the waiters' clients make at the next expiry at the latest.)

local k, d = tonumber(ARGV[5]), tonumber(ARGV[6])
-- only sessions to end, of a semaphore that is gone (deleted): nothing to do, and nothing
-- to create
if 6 + k == #ARGV and redis.call('EXISTS', K_CFG) == 0 then return 0 end
-- (load_limit reads `own`, `exp` and `queue` before any write: see check_lost; held_count
-- reads `slots`, and counts the slots held before any is freed; the ZCARD of `free` is its
-- type check before any write, and when it lists nothing, the slots freed below are kept for
-- the grants: prelude's FREE_EMPTY)
ONLY_EXISTING = true
local limit = load_limit()
if not limit then -- deleted (delete.lua): nothing left, nothing re-created
  if ARGV[4] == '2' then return { 0, 0 } end
  return 0
end
held_count()
if redis.call('ZCARD', K_FREE) == 0 then FREE_EMPTY = true end
local force = ARGV[4] == '1' or ARGV[4] == '2'
local removed, unknown = 0, false
local waiters = {} -- the waiters removed by force, as {id, record}
for i = 7 + k, 6 + k + d do
  local id = ARGV[i]
  local m = get_meta(id)
  if m and m.s and not m.o then
    local old = sess_of(m)
    local until_ms = redis.call('ZSCORE', K_EXP, old) or now_ms()
    m.o = 'd.' .. id
    local new = sess_of(m)
    redis.call('ZREM', K_OWN, old .. '|' .. id)
    redis.call('ZADD', K_OWN, '0', new .. '|' .. id)
    redis.call('ZADD', K_EXP, 'NX', until_ms, new)
    redis.call('HSET', K_META, id, encode(m))
  end
end
local ids, seen = {}, {}
for i = 7 + k + d, #ARGV do
  local id = ARGV[i]
  if not seen[id] then
    seen[id] = true
    ids[#ids + 1] = id
  end
end
-- (an id without a record was never written by redsem, or its record was lost: then its
-- slots are freed, and granted below)
if #ids == 1 then
  -- a lone release removes it as it goes, which costs it less
  local raw = redis.call('HGET', K_META, ids[1])
  local m = raw and entry_fields(raw)
  if m then removed = 1 else unknown = true end
  if force and m and not m.s then waiters[1] = { ids[1], m } end
  drop_entry(ids[1], m, limit, (m ~= nil and force) and TOMB_REMOVED or nil)
elseif #ids > 1 then
  -- Removes the entries `ids` (distinct) whose records are `ms` (false where there is none) as
  -- drop_entry does, with one command per key for all of them. Returns how many had a record.
  -- (Built here: a lone release does not pay for it.)
  local function drop_entries(ids, ms, limit, tomb)
    local del, unown, tombs, freed, freed_s, unqueue = {}, {}, {}, {}, {}, {}
    local found = 0
    for i, id in ipairs(ids) do
      local m = ms[i]
      if m then
        found = found + 1
        del[#del + 1] = id
        local sid = sess_of(m)
        unown[#unown + 1] = sid .. '|' .. id
        if tomb then tombs[#tombs + 1] = '0'; tombs[#tombs + 1] = sid .. '|' .. TOMB_REMOVED .. id end
        if m.s then
          local ss = slot_strs(m)
          for i, sl in ipairs(m.s) do freed[#freed + 1] = sl; freed_s[#freed_s + 1] = ss[i] end
        else
          unqueue[#unqueue + 1] = id
          if tomb then waiters[#waiters + 1] = { id, m } end
        end
      end
    end
    call_in_chunks('HDEL', K_META, del)
    call_in_chunks('ZREM', K_OWN, unown)
    call_in_chunks('ZADD', K_OWN, tombs)
    count_slots(-call_in_chunks('HDEL', K_SLOTS, freed_s))
    return_slots(freed, limit, freed_s)
    queue_remove(unqueue)
    for i, id in ipairs(ids) do
      if not ms[i] then drop_entry(id, nil, limit, false) end
    end
    return found
  end
  removed = drop_entries(ids, get_metas(ids, entry_fields), limit, force)
  unknown = removed < #ids
end
for i = 7, 6 + k do
  local sid = ARGV[i]
  if #redis.call('ZRANGEBYLEX', K_OWN, '[' .. sid .. '|"', '[' .. sid .. '|\255', 'LIMIT', '0', '1') == 0 then
    -- no entry left (its tombstones go too: nobody is left to learn them)
    local tombs = redis.call('ZRANGEBYLEX', K_OWN, '[' .. sid .. '|!', '[' .. sid .. '|!\255',
      'LIMIT', 0, 512)
    if #tombs > 0 then redis.call('ZREM', K_OWN, unpack(tombs)) end
    redis.call('ZREM', K_EXP, sid)
  end
end
if removed > 0 or unknown or CREATED then publish(pump(nil, limit), nil) end
-- A waiter an operator removed is told at once ("r:<id>", one message per client), and at its
-- session's next renewal (the tombstone) in case the message is lost.
if #waiters > 0 then
  local by_client, order = {}, {}
  for _, w in ipairs(waiters) do
    local c = w[2].c
    if not by_client[c] then by_client[c] = {}; order[#order + 1] = c end
    table.insert(by_client[c], 'r:' .. w[1])
  end
  for _, c in ipairs(order) do redis.call(PUB, CH_BASE .. c, table.concat(by_client[c], ';')) end
end
finish()
if ARGV[4] == '2' then return { removed - #waiters, #waiters } end
return removed
