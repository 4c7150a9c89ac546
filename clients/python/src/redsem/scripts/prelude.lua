-- redsem prelude: shared by every script (prepended by scripts/mod.rs).
--
-- KEYS (all under one hash tag, see keys.rs):
--   1 cfg    hash  limit, ver, grants, expired, seq
--   2 queue  zset  waiting tickets: member = id, score = ticket number (FIFO order)
--   3 exp    zset  leases of holders AND waiters: member = id, score = expiry (ms, Redis TIME)
--   4 meta   hash  id -> JSON {n, c (client channel suffix), l (holder lease ms), w (waiter lease ms),
--                  lb (label), t (ticket), q (enqueued ms), a (acquired ms), s (slots),
--                  f (fences, as decimal strings: cjson would round 16-digit numbers)}
--   5 slots  hash  slot number -> id of its holder
--   6 free   zset  free slot numbers below the limit (member = score = slot)
--   7 fence  hash  slot number -> generation of its last grant (see next_generation)
-- ARGV (common header):
--   1 limit used only when cfg does not exist (first open, or data loss)
--   2 channel base: a grant for a waiter whose client channel suffix is c is published on base..c
--   3 publish command: PUBLISH (standalone) or SPUBLISH (cluster)
local K_CFG, K_QUEUE, K_EXP, K_META, K_SLOTS, K_FREE, K_FENCE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local CH_BASE, PUB = ARGV[2], ARGV[3]
local CREATED = false -- set when this call had to (re)create the configuration

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Protocol version of these keys and messages (docs/PROTOCOL.md, "Versioning"). A script
-- refuses a semaphore written under another version rather than misread it.
local PROTOCOL = 2

local function get_meta(id)
  local raw = redis.call('HGET', K_META, id)
  if not raw then return nil end
  return cjson.decode(raw)
end

-- Key loss (eviction, a DEL, a partial restore) is detected where a script relies on what was
-- lost, and repaired from what survives, never granting beyond the limit (docs/PROTOCOL.md,
-- "Lost keys"). Each repair counts in cfg.repairs, which stats report.
local function corrupt(what)
  error({ err = 'REDSEM_CORRUPT ' .. what })
end

local function count_repair()
  redis.call('HINCRBY', K_CFG, 'repairs', 1)
end

-- Frees the slots mapped to `id`, whose record is gone (a scan of the slot map: only after a
-- loss of `meta`).
local function free_slots_of(id, limit)
  local all = redis.call('HGETALL', K_SLOTS)
  local found = false
  for i = 1, #all, 2 do
    if all[i + 1] == id then
      found = true
      redis.call('HDEL', K_SLOTS, all[i])
      local s = tonumber(all[i])
      if s < limit then redis.call('ZADD', K_FREE, s, s) end
    end
  end
  if found then count_repair() end
end

-- A slot mapped to `id` stays mapped while `id` has a holder record, or a lease without a
-- record (a live holder that lost its record learns it at its next renewal and releases the
-- slot; a crashed one is reaped: until then nobody else may have the slot).
local function still_held(id)
  local m = get_meta(id)
  if m then return m.s ~= nil end
  return redis.call('ZSCORE', K_EXP, id) ~= false
end

-- Rebuilds the slot map and the free set from the entries' records: a slot mapped to an id
-- without a holder record or lease is freed; a holder record's slots are mapped to it again;
-- every slot below the limit that nobody holds is free. O(limit + entries), run only when a
-- check found the keys inconsistent.
local function repair(limit)
  count_repair()
  local mapped = {}
  local all = redis.call('HGETALL', K_SLOTS)
  for i = 1, #all, 2 do
    local s, id = tonumber(all[i]), all[i + 1]
    if still_held(id) then mapped[s] = id else redis.call('HDEL', K_SLOTS, all[i]) end
  end
  local metas = redis.call('HGETALL', K_META)
  for i = 1, #metas, 2 do
    local id, m = metas[i], cjson.decode(metas[i + 1])
    for _, s in ipairs(m.s or {}) do
      if mapped[s] == nil then
        mapped[s] = id
        redis.call('HSET', K_SLOTS, s, id)
      elseif mapped[s] ~= id then
        corrupt('semaphore records give slot ' .. s .. ' to both ' .. mapped[s] .. ' and ' .. id
          .. ' (key ' .. K_META .. ')')
      end
    end
  end
  redis.call('DEL', K_FREE)
  for s = 0, limit - 1 do
    if mapped[s] == nil then redis.call('ZADD', K_FREE, s, s) end
  end
end

-- The stored limit; (re)creates the configuration and the free-slot set when missing.
-- Every script calls it before its first write. It also reads the keys that a script would
-- otherwise touch first with a write (slots, free, fence), so that a key holding a foreign
-- type fails the script with WRONGTYPE before anything was written: a failing script never
-- leaves partial writes. (cfg, exp, queue and meta are read before they are written.)
local function load_limit()
  redis.call('HLEN', K_SLOTS); redis.call('ZCARD', K_FREE); redis.call('HLEN', K_FENCE)
  local cfg = redis.call('HMGET', K_CFG, 'limit', 'ver')
  if cfg[1] then
    if cfg[2] and tonumber(cfg[2]) ~= PROTOCOL then
      error({ err = 'REDSEM_PROTOCOL semaphore uses redsem protocol version ' .. cfg[2]
        .. ', this client speaks version ' .. PROTOCOL .. ': use a client that speaks it' })
    end
    return tonumber(cfg[1])
  end
  local l = tonumber(ARGV[1])
  CREATED = true
  redis.call('HSET', K_CFG, 'limit', l, 'ver', PROTOCOL)
  -- A configuration lost while entries remain (eviction, a DEL): tickets go on after the
  -- highest one queued, so that no new ticket jumps the queue, and the slot map and free set
  -- are rebuilt from the records (a repair).
  local last = redis.call('ZRANGE', K_QUEUE, -1, -1, 'WITHSCORES')
  if #last > 0 then redis.call('HSET', K_CFG, 'seq', last[2]) end
  if redis.call('HLEN', K_META) > 0 or redis.call('HLEN', K_SLOTS) > 0 then
    repair(l)
  else
    redis.call('DEL', K_FREE)
    for s = 0, l - 1 do redis.call('ZADD', K_FREE, s, s) end
  end
  return l
end

-- A full consistency check, O(limit + entries): every mapped slot belongs to a holder record
-- that lists it, every holder record's slots are mapped to it, the free set is exactly the
-- unheld slots below the limit, every record has a lease, every waiter record is queued.
-- Repairs what it finds (counted in cfg.repairs). Run when a handle opens and by stats, so
-- that a loss no grant notices (a lost record and lease of a crashed holder, a lost queue)
-- is repaired too.
local function audit(limit, now)
  local consistent = true
  local mapped = {}
  local all = redis.call('HGETALL', K_SLOTS)
  for i = 1, #all, 2 do
    if still_held(all[i + 1]) then mapped[tonumber(all[i])] = all[i + 1] else consistent = false end
  end
  local fixed = false
  local metas = redis.call('HGETALL', K_META)
  for i = 1, #metas, 2 do
    local id, m = metas[i], cjson.decode(metas[i + 1])
    for _, s in ipairs(m.s or {}) do
      if mapped[s] ~= id then consistent = false end
    end
    if not redis.call('ZSCORE', K_EXP, id) then
      redis.call('ZADD', K_EXP, now + (m.s and m.l or m.w), id)
      fixed = true
    end
    if not m.s and not redis.call('ZSCORE', K_QUEUE, id) then
      redis.call('ZADD', K_QUEUE, m.t, id)
      fixed = true
    end
  end
  if consistent then
    local free = redis.call('ZRANGE', K_FREE, 0, -1)
    local unheld = 0
    for s = 0, limit - 1 do if mapped[s] == nil then unheld = unheld + 1 end end
    if #free ~= unheld then consistent = false end
    for _, s in ipairs(free) do
      local n = tonumber(s)
      if n >= limit or mapped[n] ~= nil then consistent = false end
    end
  end
  if fixed and consistent then count_repair() end
  if not consistent then repair(limit) end
end

-- A record without a lease lost it (the `exp` key was evicted or deleted): when the live entry
-- `id` has none, it gets its lease back, and so does every other record, so that the entries
-- of crashed processes expire again (a sweep of `meta`, only after such a loss).
local function restore_leases(id, now)
  if redis.call('ZSCORE', K_EXP, id) then return end
  count_repair()
  local metas = redis.call('HGETALL', K_META)
  for j = 1, #metas, 2 do
    local o = cjson.decode(metas[j + 1])
    redis.call('ZADD', K_EXP, 'NX', now + (o.s and o.l or o.w), metas[j])
  end
end

-- Removes an entry (holder or waiter) entirely; a holder's slots go back to the free set.
-- (A record lists exactly the slots its holder has in K_SLOTS: every script keeps them in step;
-- an entry without a record lost it, and the slots still mapped to it are freed.)
local function drop_entry(id, m, limit)
  redis.call('ZREM', K_EXP, id)
  redis.call('HDEL', K_META, id)
  if m and m.s then
    for _, s in ipairs(m.s) do
      redis.call('HDEL', K_SLOTS, s)
      if s < limit then redis.call('ZADD', K_FREE, s, s) end
    end
  else
    redis.call('ZREM', K_QUEUE, id)
    if not m then free_slots_of(id, limit) end
  end
end

-- Removes every entry whose lease expired (holders and waiters alike).
local function reap(now, limit)
  local dead = redis.call('ZRANGEBYSCORE', K_EXP, '-inf', now, 'LIMIT', 0, 512)
  for _, id in ipairs(dead) do
    drop_entry(id, get_meta(id), limit)
  end
  if #dead > 0 then redis.call('HINCRBY', K_CFG, 'expired', #dead) end
  return #dead
end

-- The generation (fencing token) of a new grant of slot `s`: max(stored + 1, Redis TIME in
-- microseconds). It goes up at every grant, and stays above every token issued before even
-- when the fence hash was lost (FLUSHALL, a restart without persistence, a failover to a
-- lagging replica), as long as Redis's clock has not gone back past the earlier grant
-- (docs/PROTOCOL.md, "Fencing tokens"). Below 2^53, so exact in Lua's doubles; stored and
-- carried as a decimal string.
local NOW_US = nil
local function next_generation(s)
  if not NOW_US then
    local t = redis.call('TIME')
    NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local prev = tonumber(redis.call('HGET', K_FENCE, s) or '0') or 0
  local g = string.format('%.0f', math.max(prev + 1, NOW_US))
  redis.call('HSET', K_FENCE, s, g)
  return g
end

-- Makes an entry a holder: lowest free slots, next generation per slot. A queued waiter keeps
-- its current lease (a waiter that died just before its grant blocks the slot no longer than
-- its own lease; a live one renews it as a holder); a fresh entry (try mode) gets a lease.
--
-- Checks first that the free set gives as many slots as the capacity check promised: after a
-- key loss it may not (a lost `free` set, or a lost slot map that made the holders look
-- fewer). Then the keys are repaired and the capacity checked again. Returns whether it
-- granted.
local function grant(id, m, now, fresh, limit)
  local popped = redis.call('ZPOPMIN', K_FREE, m.n)
  if #popped ~= 2 * m.n then
    for i = 1, #popped, 2 do redis.call('ZADD', K_FREE, popped[i + 1], popped[i]) end
    repair(limit)
    if redis.call('HLEN', K_SLOTS) + m.n > limit then return false end
    popped = redis.call('ZPOPMIN', K_FREE, m.n)
    if #popped ~= 2 * m.n then
      corrupt('semaphore free slots (key ' .. K_FREE .. ') do not match its holders (key '
        .. K_SLOTS .. ') after a repair')
    end
  end
  local slots, fences = {}, {}
  for i = 1, #popped, 2 do
    local s = tonumber(popped[i])
    redis.call('HSET', K_SLOTS, s, id)
    slots[#slots + 1] = s
    fences[#fences + 1] = next_generation(s)
  end
  m.s, m.f, m.a = slots, fences, now
  redis.call('ZREM', K_QUEUE, id)
  if fresh then redis.call('ZADD', K_EXP, now + m.l, id) end
  redis.call('HSET', K_META, id, cjson.encode(m))
  redis.call('HINCRBY', K_CFG, 'grants', 1)
  return true
end

-- Grants the head of the queue while capacity allows (strict FIFO: a head that needs more
-- permits than are free blocks everyone behind it). Returns the grants and rejections made.
local function pump(now, limit)
  local out = {}
  local used = nil
  while true do
    local head = redis.call('ZRANGE', K_QUEUE, 0, 0)[1]
    if not head then break end
    used = used or redis.call('HLEN', K_SLOTS)
    local m = get_meta(head)
    if not m then
      redis.call('ZREM', K_QUEUE, head)
      redis.call('ZREM', K_EXP, head)
    elseif m.n > limit then
      -- can never be satisfied (the limit shrank below the request): reject it
      drop_entry(head, m, limit)
      out[#out + 1] = { head, m, false }
    elseif used + m.n > limit then
      break
    elseif grant(head, m, now, false, limit) then
      used = used + m.n
      out[#out + 1] = { head, m, true }
    else
      break -- the holders were more than they looked (repaired): the head waits
    end
  end
  return out
end

local function join(t)
  local parts = {}
  for i, v in ipairs(t) do parts[i] = string.format('%d', v) end
  return table.concat(parts, ',')
end

-- Publishes each grant to the client that owns the waiter (one message per client), except
-- the entry `skip` (the caller learns its own grant from the reply).
-- Message: records separated by ';'  "g:<id>:<ticket>:<slots>:<fences>" granted, "x:<id>" rejected.
local function publish(out, skip)
  local by_client, order = {}, {}
  for _, r in ipairs(out) do
    local id, m, ok = r[1], r[2], r[3]
    if id ~= skip then
      local rec
      if ok then
        rec = 'g:' .. id .. ':' .. string.format('%d', m.t) .. ':' .. join(m.s) .. ':' .. join(m.f)
      else
        rec = 'x:' .. id
      end
      if not by_client[m.c] then by_client[m.c] = {}; order[#order + 1] = m.c end
      table.insert(by_client[m.c], rec)
    end
  end
  for _, c in ipairs(order) do
    redis.call(PUB, CH_BASE .. c, table.concat(by_client[c], ';'))
  end
end

-- Reap, then grant what the freed capacity allows, then notify. Every script starts here.
-- Invariant: after every script, the head of the queue cannot be granted (each change that
-- frees capacity pumps), so only a reap (or `force`) can make a grant possible here.
local function settle(now, limit, force)
  if reap(now, limit) > 0 or force or CREATED then
    publish(pump(now, limit), nil)
  end
end

-- Milliseconds until the nearest lease expiry (the earliest moment reaping can free
-- capacity without a notification), or -1 when there is none.
local function next_expiry(now)
  local e = redis.call('ZRANGE', K_EXP, 0, 0, 'WITHSCORES')
  if #e == 0 then return -1 end
  local d = tonumber(e[2]) - now
  if d < 0 then d = 0 end
  return d
end

-- Permits free now (the limit minus the slots held; 0 while the limit is below them).
local function free_now(limit)
  local f = limit - redis.call('HLEN', K_SLOTS)
  if f < 0 then return 0 end
  return f
end

-- A holder's reply: {1, slots, fences, ticket}
local function held_reply(m)
  local f = {}
  for i, g in ipairs(m.f or {}) do f[i] = tonumber(g) end -- integers in the reply
  return { 1, m.s or {}, f, m.t }
end
