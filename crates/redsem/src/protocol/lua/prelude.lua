-- redsem prelude: shared by every script (prepended by scripts/mod.rs).
--
-- KEYS (all under one hash tag, see keys.rs):
--   1 cfg    hash  limit, ver, seq (last ticket), gen (last fence generation), grants, expired,
--                  repairs, qlen (the number of members of queue: its loss is detected by it),
--                  s0..s9 (the highest ticket granted in each priority class: see SERVED),
--                  hw (the high-water mark of slots: no slot at or above it is held, so those
--                  below the limit are free without being listed in `free`; 0, or absent,
--                  exactly when no slot is held)
--   2 queue  zset  waiting tickets: member = id, score = the waiter's place (score_of: its ticket,
--                  less AGING per priority class; the ticket itself without a priority)
--   3 exp    zset  session leases: member = session id, score = expiry (ms, Redis TIME); '#'
--                  (score +inf, never expires) marks it as complete (its loss is detected by it)
--   4 meta   hash  id -> the entry's record (encode/decode below): its fields in a fixed order,
--                  separated by '|', the label last, after its length in bytes:
--                  'n|t|p|c|o|l|w|q|a|s|f|<label length>|<label>'
--                  n permits, t ticket, p priority class (1..9; '' for the default 0),
--                  c client channel id, o owner once detached ('' otherwise), l holder
--                  lease ms, w waiter lease ms, q enqueued ms, a acquired ms ('' while queued),
--                  s slots and f their fences (decimal), each comma-separated ('' while queued)
--   5 slots  hash  slot number -> id of its holder (a loss of the map is detected by
--                  held_count: nothing is mapped while cfg.hw says that something is held)
--   6 free   zset  the free slot numbers below both the limit and cfg.hw (member = score = slot);
--                  the slots from hw up to the limit are free too, unlisted (see pop_free)
--   7 own    zset  the entries of each session, all scored 0 (a lexicographic index):
--                  '<session>|<id>' for a live entry; '<session>|!<id>' for an entry an
--                  operator removed (a forced release) and '<session>|!!<id>' for a waiter
--                  rejected after a shrink, until its session learns it; '#' marks the index
--                  as complete (its loss is detected by it); '!deleted' (with a TTL, alone in
--                  the key) marks a semaphore delete.lua removed while entries were left,
--                  which renewals and releases do not re-create
-- A session is the liveness of one client handle for one lease length: '<c>~<lease ms>'. A
-- waiter belongs to the session '<c>~<w>', a holder to '<c>~<l>'. The client renews its
-- sessions, not its entries; when a session's lease passes, all its entries are reaped.
-- ARGV (common header):
--   1 limit used only when cfg does not exist (first open, or data loss)
--   2 channel base: a grant for a waiter whose client channel id is c is published on base..c
--   3 publish command: PUBLISH (standalone) or SPUBLISH (cluster)
-- (renew_many works on several semaphores in one call: it points these at each in turn with
-- on_semaphore; every other script works on KEYS[1..7] and ARGV.)
-- Every value below that a call changes is set by begin() (at the end of this file), which
-- each script and each function of the library calls first: in the library (docs/PROTOCOL.md,
-- "The Functions library") these are created once and shared by every call.
-- The globals the code uses are upvalues, bound by begin() at a library's first call (every
-- call of a script): in the Functions library a global is found through a metatable (the
-- library's globals table is empty, its __index Redis's), two table lookups per use; an
-- upvalue is none. (A library's top level runs where only `redis.register_function` is
-- defined: LOADER keeps that `redis`, which registers the functions at the library's end.)
local function real_globals()
  return redis, string, table, math, tonumber, ipairs, pairs, next, unpack, error, type, tostring
end
local LOADER = redis
local redis, string, table, math, tonumber, ipairs, pairs, next, unpack, error, type, tostring
local K_CFG, K_QUEUE, K_EXP, K_META, K_SLOTS, K_FREE, K_OWN
local A -- the arguments of the semaphore worked on, laid out as ARGV
local CH_BASE, PUB
local CREATED = false -- set when this call had to (re)create the configuration

-- Protocol version of these keys and messages (docs/PROTOCOL.md, "Versioning"). A script
-- refuses a semaphore written under another version rather than misread it.
local PROTOCOL = 4
local PROTOCOL_S = PROTOCOL .. ''

-- Integers as decimal strings. A number passed to redis.call, or joined with `..`, is written
-- by sprintf("%.17g") or ("%.14g"): about 1 µs each for a timestamp, several times what '%d'
-- costs; so what the hot paths pass on is formatted with this, or kept as the string it came
-- as (docs/PROTOCOL.md, "Records").
local function int(x) return string.format('%d', x) end

-- Redis TIME, read once per call (and only by calls that need it): NOW_MS for leases,
-- NOW_US for fence generations, NOW_MS_S the decimal string of NOW_MS (what records store).
local NOW_MS, NOW_US, NOW_MS_S
local function now_ms()
  if NOW_MS then return NOW_MS end
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  NOW_US = tonumber(t[1]) * 1000000 + us
  NOW_MS = math.floor(NOW_US / 1000)
  NOW_MS_S = string.format('%s%03d', t[1], math.floor(us / 1000))
  return NOW_MS
end
local function now_ms_s()
  if not NOW_MS_S then now_ms() end
  return NOW_MS_S
end

-- A failing script writes nothing: Redis does not roll a script back, so every key a script
-- writes is read before its first write, and a key of a foreign type fails the script with
-- WRONGTYPE before anything was written. Each script reads what its own path does not read
-- anyway with these (O(1)) calls; see docs/PROTOCOL.md, "Errors".
-- (the command is spelled out in each: a refusal by ACL names the command of its line)
local function check_zset(key) redis.call('ZCARD', key) end
local function check_hash(key) redis.call('HLEN', key) end
local function check_all()
  check_hash(K_CFG); check_hash(K_META); check_hash(K_SLOTS)
  check_zset(K_QUEUE); check_zset(K_EXP); check_zset(K_FREE); check_zset(K_OWN)
end

-- The counters of cfg, read by load_limit and written once by finish() (one HSET instead of
-- one call per ticket, grant and generation), and W: their values as cfg holds them (an
-- absent field is 0; none known before load_limit read them, or while cfg is created), which
-- finish() does not write again.
local SEQ, GEN, GRANTS, EXPIRED, REPAIRS = 0, 0, 0, 0, 0
local W = {}
-- A counter of cfg as load_limit reads it: an absent field (false) is 0, without parsing.
local function num(v)
  if v then return tonumber(v) end
  return 0
end
-- The counters only a grant, a reap or a repair changes (GEN, GRANTS, EXPIRED, REPAIRS) are
-- parsed when first needed (counters()): until then GEN is nil and COUNTERS holds them as
-- load_limit read them (a generation has 16 digits: parsing it costs about what a small
-- command does, and a call that queues or frees without granting never needs it).
local COUNTERS = nil
local function counters()
  if GEN then return end
  local c = COUNTERS
  GEN, GRANTS, EXPIRED, REPAIRS = num(c[4]), num(c[5]), num(c[6]), num(c[7])
  W.gen, W.grants, W.expired, W.repairs = GEN, GRANTS, EXPIRED, REPAIRS
end
local CFG_DIRTY = false
-- The number of members of `queue`, kept in cfg.qlen by every write of the queue (the
-- replies of ZADD and ZREM count what changed): a queue shorter than qlen was lost
-- (check_lost).
local QLEN = 0
-- The high-water mark of slots (cfg.hw): no slot at or above it is held; those below the limit
-- are free without being listed in `free`, which lists the free slots below it (an idle
-- semaphore of any limit is a few keys of a few bytes). It is 0 exactly when no slot is held
-- (a call that frees the last held slot resets it: tidy_free).
local HW = 0
-- The stored limit, once load_limit read it (resize.lua changes it).
local LIMIT = 0
-- Set when this call freed a holder's slots: tidy_free() then resets the free slots of a
-- semaphore nobody holds any more.
local SLOTS_FREED = false
-- The number of fields of `slots` (the slots held), once held_count read it in this call; every
-- write of the slot map then adds what its reply says it added or removed (count_slots), or,
-- on the rare paths, forgets it (nil: read again). So a call reads HLEN once, and a count
-- taken after this call freed its last slot is not mistaken for a lost slot map.
local HELD = nil
local function count_slots(delta)
  if HELD then HELD = HELD + delta end
end
-- Set while `free` is known to list no slot (release.lua counted it empty) and this call has
-- listed none: the slots this call frees are then KEPT (numbers, highest first) instead of
-- listed, its grants take them (the lowest free slots: nothing below the mark is free but
-- them) without a ZADD and a ZPOPMIN each, and finish() lists those left (list_kept). The rare
-- paths of a release that write `free` list them first (short_free) or list every free slot
-- anew (rebuild_slots). (No other script sets it: acquire.lua always pops, so a Redis user
-- refused ZPOPMIN fails at its first grant, before it wrote anything, not in a later release.)
local FREE_EMPTY = false
local KEPT = nil
-- Set by the scripts that serve the entries of an existing semaphore (renew, release,
-- lease) before load_limit: a semaphore that delete.lua removed while entries were left (its
-- tombstone '!deleted' in `own`) is then not re-created, and load_limit returns nil.
local ONLY_EXISTING = false

-- Calls f with `list` in pieces of at most 4000 elements (Lua's unpack takes about 8000).
local function in_chunks(list, f)
  local n = #list
  if n == 0 then return end
  if n <= 4000 then return f(list) end
  for i = 1, n, 4000 do
    local part = {}
    for j = i, math.min(i + 3999, n) do part[#part + 1] = list[j] end
    f(part)
  end
end

-- redis.call(cmd, key, ...list) in pieces as in_chunks makes them (a list of pairs stays in
-- pairs), without a function built per call; returns the sum of the replies (ZADD, ZREM, HDEL
-- and HSET answer how many members or fields they added or removed).
local function call_in_chunks(cmd, key, list)
  local n = #list
  if n == 0 then return 0 end
  if n <= 4000 then return redis.call(cmd, key, unpack(list)) end
  local sum = 0
  in_chunks(list, function(a) sum = sum + redis.call(cmd, key, unpack(a)) end)
  return sum
end

-- Lists the slots KEPT (see FREE_EMPTY) in `free`; from then on this call lists what it frees.
local function list_kept()
  FREE_EMPTY = false
  local kept = KEPT
  if not kept then return end
  KEPT = nil
  local add = {}
  for i = #kept, 1, -1 do
    local x = int(kept[i])
    add[#add + 1] = x; add[#add + 1] = x
  end
  call_in_chunks('ZADD', K_FREE, add)
end

-- Priority classes (docs/PROTOCOL.md, "Priority classes"): a waiter's place in the queue is
-- its ticket less AGING + 1/16 per class, so a higher class is served first, FIFO within a
-- class, and a waiter is overtaken by at most AGING requests per class above its own that
-- arrive after it (its priority rises with the tickets issued after it: nothing starves).
-- The sixteenth makes every place unique (no two waiters tie). Without a priority the place
-- is the ticket: plain FIFO.
local AGING = 1000
local function score_of(m)
  if m.p then return m.t - m.p * (AGING + 0.0625) end
  return m.t
end

-- Queues `id` at `score` (score_of its record).
local function queue_add(score, id)
  QLEN = QLEN + redis.call('ZADD', K_QUEUE, score, id)
  CFG_DIRTY = true
end

-- Removes the ids `list` from the queue (any number).
local function queue_remove(list)
  if #list == 0 then return end
  QLEN = QLEN - call_in_chunks('ZREM', K_QUEUE, list)
  CFG_DIRTY = true
end

-- An entry's record (the `meta` hash) as a table: n, t (numbers), p (number, nil for class 0),
-- c, o (nil unless detached), l, w (decimal strings: only passed on, or added to a time), q, a
-- (decimal strings; a nil while queued), s (slot numbers), ss (the same as decimal strings,
-- built when first needed: slot_strs) and f (their fences, decimal strings; s and f nil while
-- queued), and `tail`: the label's length, '|' and the label (what follows, a later
-- version's fields, is kept as it is). A new record has `lb`, its label, instead of `tail`;
-- a record granted by this call has `g`, its generation as a number (acquire's reply). One
-- string.match decodes a record; no number is formatted or parsed that is only passed on
-- (docs/PROTOCOL.md, "Records").
local RECORD = '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|'
  .. '([^|]*)|([^|]*)|(.*)$'

-- A record's field s: its slots as numbers, and as the strings they are there.
local function slots_of(s)
  if not string.find(s, ',', 1, true) then return { tonumber(s) }, { s } end
  local slots, strs = {}, {}
  for x in string.gmatch(s, '[^,]+') do slots[#slots + 1] = tonumber(x); strs[#strs + 1] = x end
  return slots, strs
end

local function decode(raw)
  local n, t, p, c, o, l, w, q, a, s, f, tail = string.match(raw, RECORD)
  if not tail then
    error({ err = 'REDSEM_CORRUPT unreadable record in key ' .. K_META .. ': '
      .. string.format('%q', string.sub(raw, 1, 60)) })
  end
  -- (every field is in the constructor, so that the table is sized once; n = 1 is not parsed)
  local m = { n = n == '1' and 1 or tonumber(n), t = tonumber(t), c = c, l = l, w = w, q = q,
    tail = tail, p = nil, o = nil, a = nil, s = nil, ss = nil, f = nil }
  if p ~= '' then m.p = tonumber(p) end
  if o ~= '' then m.o = o end
  if a ~= '' then
    m.a = a
    m.s, m.ss = slots_of(s)
    if #m.s == 1 then
      m.f = { f }
    else
      local fences = {}
      for x in string.gmatch(f, '[^,]+') do fences[#fences + 1] = x end
      m.f = fences
    end
  end
  return m
end

-- The slots of a holder's record as decimal strings (what redis.call is given).
local function slot_strs(m)
  local ss = m.ss
  if not ss then
    ss = {}
    for i, s in ipairs(m.s) do ss[i] = int(s) end
    m.ss = ss
  end
  return ss
end

-- (the numbers n and t are formatted, the rest are strings already; no string goes through
-- string.format's %s, which would cut a label at a NUL byte)
local function encode(m)
  local s, f = '', ''
  if m.s then
    local ss = slot_strs(m)
    if #ss == 1 then -- (one slot without table.concat: 1 % of a cycle, scripts/lua-cost.sh)
      s, f = ss[1], m.f[1]
    else
      s, f = table.concat(ss, ','), table.concat(m.f, ',')
    end
  end
  local tail = m.tail
  if not tail then tail = (m.lb == '' and '0' or int(#m.lb)) .. '|' .. m.lb end
  return (m.n == 1 and '1|' or int(m.n) .. '|') .. int(m.t) .. '|' .. (m.p and int(m.p) or '')
    .. '|' .. m.c .. '|'
    .. (m.o or '') .. '|' .. m.l .. '|' .. m.w .. '|' .. m.q .. '|' .. (m.a or '') .. '|' .. s
    .. '|' .. f .. '|' .. tail
end

-- The label of a record.
local function label_of(m)
  if m.lb then return m.lb end
  local len, at = string.match(m.tail, '^(%d+)|()')
  if not len then return '' end
  return string.sub(m.tail, at, at + tonumber(len) - 1)
end

-- The writes of a batch (acquire.lua): while BUF is set (a table as below), write_entry
-- gathers the records, slot mappings, index entries, queue entries and session leases it
-- writes there, and flush() makes them with one command per key instead of one per entry.
-- What reads those keys flushes first (held_count, rare()); get_meta sees the gathered
-- records.
local BUF = nil
-- Free slots popped ahead for a batch (acquire.lua): its first grant pops as many listed free
-- slots as its fresh requests could take (POOL_WANT) with one ZPOPMIN, and its grants take
-- them in order, as each would have popped them; flush() lists what is left in `free` again
-- before anything else reads the free slots or the batch's writes are made.
local POOL, POOL_I, POOL_WANT = nil, 1, 0
local function flush()
  local b = BUF
  if not b then return end
  BUF = nil
  if POOL then -- (the slots popped ahead and not granted are free again: pop_free)
    local back = {}
    for i = POOL_I, #POOL, 2 do back[#back + 1] = POOL[i + 1]; back[#back + 1] = POOL[i] end
    call_in_chunks('ZADD', K_FREE, back)
    POOL = nil
  end
  count_slots(call_in_chunks('HSET', K_SLOTS, b.slots))
  if #b.queue > 0 then
    QLEN = QLEN + call_in_chunks('ZADD', K_QUEUE, b.queue)
    CFG_DIRTY = true
  end
  call_in_chunks('ZADD', K_OWN, b.own)
  for _, sid in ipairs(b.sids) do redis.call('ZADD', K_EXP, 'GT', int(b.exp[sid]), sid) end
  call_in_chunks('HSET', K_META, b.meta)
end

-- Writes the record of `id`, and with it (each if given) the mapping of its slots `slots`
-- (decimal strings) to it, its queue entry at `score`, and its entry in the session `sid`
-- (whose lease is `lease` ms, a decimal string), whose lease is raised to at least now +
-- `lease`.
local function write_entry(id, m, slots, score, sid, lease)
  local b = BUF
  -- (a place without a priority is a ticket: an integer, written as one)
  if score and not m.p then score = int(score) end
  if b then
    if slots then
      local t = b.slots
      for i = 1, #slots do t[#t + 1] = slots[i]; t[#t + 1] = id end
    end
    if score then
      local t = b.queue
      t[#t + 1] = score; t[#t + 1] = id
    end
    if sid then
      -- (the lease is part of the session's name: one per session and call)
      if not b.exp[sid] then
        b.sids[#b.sids + 1] = sid
        b.exp[sid] = now_ms() + lease
      end
      local t = b.own
      t[#t + 1] = '0'; t[#t + 1] = sid .. '|' .. id
    end
    local t = b.meta
    b.rec[id] = m
    t[#t + 1] = id; t[#t + 1] = encode(m)
    return
  end
  if slots then
    if #slots == 1 then -- (without a table: 0.5 % of a lone cycle, scripts/lua-cost.sh)
      count_slots(redis.call('HSET', K_SLOTS, slots[1], id))
    else
      local map = {}
      for i = 1, #slots do map[2 * i - 1] = slots[i]; map[2 * i] = id end
      count_slots(call_in_chunks('HSET', K_SLOTS, map))
    end
  end
  if score then queue_add(score, id) end
  if sid then
    redis.call('ZADD', K_EXP, 'GT', int(now_ms() + lease), sid)
    redis.call('ZADD', K_OWN, '0', sid .. '|' .. id)
  end
  redis.call('HSET', K_META, id, encode(m))
end

local function get_meta(id)
  if BUF and BUF.rec[id] then return BUF.rec[id] end
  local raw = redis.call('HGET', K_META, id)
  if not raw then return nil end
  return decode(raw)
end

-- The session an entry belongs to: its waiter session while queued, its holder session once
-- granted. (Leases are whole milliseconds below 2^53: '..' writes them as integers.)
local function sess_of(m)
  return (m.o or m.c) .. '~' .. (m.s and m.l or m.w)
end

-- sess_of of a record as stored, without decoding it whole (the fields c, o, l, w and a:
-- a holder is an entry with a grant time; `stats` reads the session of every entry it lists).
-- nil for a record it cannot read.
local SESSION_FIELDS = '^[^|]*|[^|]*|[^|]*|([^|]*)|([^|]*)|([^|]*)|([^|]*)|[^|]*|([^|]*)|'
local function raw_sess_of(raw)
  local c, o, l, w, a = string.match(raw, SESSION_FIELDS)
  if not c then return nil end
  return (o ~= '' and o or c) .. '~' .. (a ~= '' and l or w)
end
-- The fields of a record as stored that removing its entry needs (drop_entry): c, o (nil
-- unless detached), l, w, and for a holder s and ss (its slots as numbers and as strings):
-- a table that sess_of and slot_strs read as they read decode's, for a fraction of decode's
-- cost (a release of many entries reads it of each). A record it cannot read goes to decode,
-- which names it.
local ENTRY_FIELDS = SESSION_FIELDS .. '([^|]*)|'
local function entry_fields(raw)
  local c, o, l, w, a, s = string.match(raw, ENTRY_FIELDS)
  if not c then return decode(raw) end
  local m = { c = c, o = nil, l = l, w = w, s = nil, ss = nil }
  if o ~= '' then m.o = o end
  if a ~= '' then m.s, m.ss = slots_of(s) end
  return m
end

local check_all_then_repair -- (defined below, with the rare paths)

-- The number of slots held. A slot map that is empty while the high-water mark says that a
-- slot is held was lost (a key eviction, a DEL): it is rebuilt from the holders' records
-- before anything relies on it (every grant counts the holders first). That check is made
-- where the count is read (HELD, once per call, before the call freed any slot: a call that
-- frees the last slot while the mark is above 0 lowers it in finish, tidy_free), and every
-- script that may free a slot counts them before its first write.
local function held_count()
  flush()
  if HELD then return HELD end
  local n = redis.call('HLEN', K_SLOTS)
  if n == 0 and HW > 0 then
    check_all_then_repair()
    n = redis.call('HLEN', K_SLOTS)
  end
  HELD = n
  return n
end

-- The generation (fencing token) of a new grant: max(last generation + 1, Redis TIME in
-- microseconds), the same for every slot of the grant. It goes up at every grant of the
-- semaphore, so each slot's tokens go up and no two grants of a slot carry the same, and
-- stays above
-- every token issued before even when the keys were lost (FLUSHALL, a restart without
-- persistence, a failover to a lagging replica), as long as Redis's clock has not gone
-- back past the earlier grant (docs/PROTOCOL.md, "Fencing tokens"). NOW_US is read once per
-- call: k grants in one call take k consecutive generations, the last up to k - 1 above the
-- clock the call read (the lead that bound states). Below 2^53, so exact in Lua's doubles;
-- stored and carried as a decimal string.
local function next_generation()
  if not NOW_US then now_ms() end
  counters()
  GEN = math.max(GEN + 1, NOW_US)
  CFG_DIRTY = true
  return int(GEN)
end

-- The highest ticket granted in each priority class by this call (class -> ticket), written
-- to cfg's fields s0..s9 by finish(). Within a class grants follow tickets, so a waiter whose
-- ticket is at or below its class's was granted or removed: renew.lua reports them, and a
-- client checks such waiters of its own (a lost notification). Unlike the head of the queue,
-- this stays true when a higher class queues ahead of waiters already granted.
local SERVED = nil
-- Set by renew.lua before load_limit, which then reads s0..s9 too (in its one HMGET) into
-- LOADED_SERVED (index = class); finish() raises them by this call's grants.
local READ_SERVED = false
local LOADED_SERVED = nil

-- A semaphore nobody holds any more lists no free slot: the high-water mark goes back to 0,
-- so that every slot is free, unlisted. Keeps an idle semaphore small whatever its limit.
local function tidy_free()
  SLOTS_FREED = false
  if HW > 0 and (HELD or redis.call('HLEN', K_SLOTS)) == 0 then
    if not FREE_EMPTY then redis.call('DEL', K_FREE) end
    HW = 0
    KEPT = nil -- (free, unlisted, above the mark)
    CFG_DIRTY = true
  end
end

local function finish()
  if SLOTS_FREED then tidy_free() end
  if KEPT then list_kept() end
  if CFG_DIRTY then
    -- (only the counters that differ from what cfg holds: W)
    local args = {}
    if SEQ ~= W.seq then args[#args + 1] = 'seq'; args[#args + 1] = int(SEQ) end
    if QLEN ~= W.qlen then args[#args + 1] = 'qlen'; args[#args + 1] = int(QLEN) end
    if HW ~= W.hw then args[#args + 1] = 'hw'; args[#args + 1] = int(HW) end
    if GEN then -- (else none of them was needed: unchanged)
      if GEN ~= W.gen then args[#args + 1] = 'gen'; args[#args + 1] = int(GEN) end
      if GRANTS ~= W.grants then args[#args + 1] = 'grants'; args[#args + 1] = int(GRANTS) end
      if EXPIRED ~= W.expired then args[#args + 1] = 'expired'; args[#args + 1] = int(EXPIRED) end
      if REPAIRS ~= W.repairs then args[#args + 1] = 'repairs'; args[#args + 1] = int(REPAIRS) end
    end
    W = { seq = SEQ, gen = GEN, grants = GRANTS, qlen = QLEN, hw = HW, expired = EXPIRED,
      repairs = REPAIRS }
    if SERVED then -- (a grant made CFG_DIRTY)
      for c, t in pairs(SERVED) do
        args[#args + 1] = 's' .. c; args[#args + 1] = string.format('%d', t)
        if LOADED_SERVED and t > LOADED_SERVED[c] then LOADED_SERVED[c] = t end
      end
      SERVED = nil
    end
    if #args > 0 then redis.call('HSET', K_CFG, unpack(args)) end
    CFG_DIRTY = false
  end
end

local function corrupt(what)
  finish()
  error({ err = 'REDSEM_CORRUPT ' .. what })
end

local drop_entry -- (defined below; the reaper in rare() calls it)

-- The marks of a tombstone in the index ('<session>|<mark><id>', see K_OWN): an entry an
-- operator removed (a forced release), and a waiter rejected because it asked for more
-- permits than the limit (after a shrink). Ids never start with '!'.
local TOMB_REMOVED, TOMB_REJECTED = '!', '!!'

local function next_ticket()
  SEQ = SEQ + 1
  CFG_DIRTY = true
  return SEQ
end

-- Gives back the slots `slots` (numbers) of a holder that is gone: the slot just below the
-- high-water mark lowers it, any other below the limit is listed free (one call for all), or
-- KEPT for this call's grants while nothing is listed (FREE_EMPTY).
-- (A slot at or above the limit, after a shrink, is simply no longer held.)
-- `strs` (optional): the same slots as decimal strings, in the same order.
local function DESCENDING(a, b) return a > b end
local function return_slots(slots, limit, strs)
  SLOTS_FREED = true
  local str_of = {} -- slot -> its string (what is listed), as given
  if strs then
    for i, s in ipairs(slots) do str_of[s] = strs[i] end
  end
  if #slots > 1 then -- (highest first: each may lower the mark for the next)
    local sorted = {}
    for i, s in ipairs(slots) do sorted[i] = s end
    table.sort(sorted)
    slots = sorted
  end
  local add = {}
  for i = #slots, 1, -1 do
    local s = slots[i]
    if s == HW - 1 then
      HW = s
      CFG_DIRTY = true
    elseif s < limit then
      if FREE_EMPTY then
        KEPT = KEPT or {}
        KEPT[#KEPT + 1] = s
      else
        local x = str_of[s] or int(s)
        add[#add + 1] = x; add[#add + 1] = x
      end
    end
  end
  if KEPT and #KEPT > 1 then table.sort(KEPT, DESCENDING) end
  call_in_chunks('ZADD', K_FREE, add)
end

-- Takes up to n free slots, lowest first: those listed in `free` (while nothing is listed,
-- those this call KEPT; either way all below the high-water mark), then the unlisted ones from
-- the mark up to the limit (raising it). Returns them (numbers, ascending), the same as decimal
-- strings, and how many of them (the first) were listed or kept. The rule that a grant takes
-- the lowest free slots holds: every listed or kept slot is below the mark.
local function pop_free(n, limit)
  local popped, i
  if FREE_EMPTY then
    -- (nothing listed: the slots this call freed, lowest first, then the mark's)
    local kept = KEPT
    local k = kept and #kept or 0
    if n == 1 and k > 0 then
      local s = kept[k]
      kept[k] = nil
      return { s }, { int(s) }, 1
    end
    popped, i = {}, 1
    for j = k, math.max(k - n + 1, 1), -1 do
      local x = int(kept[j])
      popped[#popped + 1] = x; popped[#popped + 1] = x -- (as ZPOPMIN answers: member, score)
      kept[j] = nil
    end
  elseif BUF and POOL_WANT > 1 then
    if not POOL then
      POOL, POOL_I = redis.call('ZPOPMIN', K_FREE, int(POOL_WANT)), 1
    end
    popped, i = POOL, POOL_I
    POOL_I = POOL_I + 2 * n
  elseif n == 1 then
    popped, i = redis.call('ZPOPMIN', K_FREE, '1'), 1
  else
    popped, i = redis.call('ZPOPMIN', K_FREE, int(n)), 1
  end
  -- (n = 1, the common case, without growing a table: with grant's the same, 3 % of a cycle's
  -- server instructions, scripts/lua-cost.sh)
  if n == 1 then
    local x = popped[i]
    if x then return { tonumber(x) }, { x }, 1 end
    if HW < limit then
      HW = HW + 1
      CFG_DIRTY = true
      return { HW - 1 }, { int(HW - 1) }, 0
    end
    return {}, {}, 0
  end
  local slots, strs = {}, {}
  for j = i, math.min(i + 2 * n - 1, #popped), 2 do
    local x = popped[j]
    slots[#slots + 1] = tonumber(x); strs[#strs + 1] = x
  end
  local listed = #slots
  while #slots < n and HW < limit do
    slots[#slots + 1] = HW; strs[#strs + 1] = int(HW)
    HW = HW + 1
    CFG_DIRTY = true
  end
  return slots, strs, listed
end

-- What only a key loss, a session's expiry: built on first use, so that a
-- call on the common path does not pay for creating these functions.
local RARE = nil
local function rare()
  flush()
  if RARE then return RARE end
  local R = {}

  -- Key loss (eviction, a DEL, a partial restore) is detected where a script relies on what
  -- was lost, and repaired from what survives, never granting beyond the limit
  -- (docs/PROTOCOL.md, "Lost keys"). Each repair counts in cfg.repairs, which stats report.
  function R.count_repair()
    counters()
    REPAIRS = REPAIRS + 1
    CFG_DIRTY = true
  end

  -- Frees the slots mapped to `id`, whose record is gone (a scan of the slot map: only after
  -- a loss of `meta`). Only drop_entry calls it, having counted the slots held (HELD).
  function R.free_slots_of(id, limit)
    local all = redis.call('HGETALL', K_SLOTS)
    local found = false
    for i = 1, #all, 2 do
      if all[i + 1] == id then
        found = true
        count_slots(-redis.call('HDEL', K_SLOTS, all[i]))
        return_slots({ tonumber(all[i]) }, limit)
      end
    end
    if found then R.count_repair() end
  end

  -- A slot mapped to `id` stays mapped while `id` has a holder record, or an entry in the
  -- index without a record (a live holder that lost its record learns it at its next
  -- renewal and releases the slot; a crashed one is reaped with its session).
  local function still_held(id, indexed)
    local m = get_meta(id)
    if m then return m.s ~= nil end
    return indexed[id] == true
  end

  local function indexed_ids()
    local set = {}
    for _, mem in ipairs(redis.call('ZRANGE', K_OWN, 0, -1)) do
      local bar = string.find(mem, '|', 1, true)
      if bar and string.sub(mem, bar + 1, bar + 1) ~= '!' then set[string.sub(mem, bar + 1)] = true end
    end
    return set
  end

  -- Rebuilds the slot map and the free slots from the entries' records: a slot mapped to an
  -- id without a holder record or index entry is freed; a holder record's slots are mapped to
  -- it again; the high-water mark goes just above the highest slot held, and every slot below
  -- it and the limit that nobody holds is listed free. O(entries + highest slot held), run
  -- only when a check found the keys inconsistent (not counted: see repair).
  function R.rebuild_slots(limit)
    local indexed = indexed_ids()
    local mapped = {}
    local all = redis.call('HGETALL', K_SLOTS)
    for i = 1, #all, 2 do
      local s, id = tonumber(all[i]), all[i + 1]
      if still_held(id, indexed) then mapped[s] = id else redis.call('HDEL', K_SLOTS, all[i]) end
    end
    local metas = redis.call('HGETALL', K_META)
    for i = 1, #metas, 2 do
      local id, m = metas[i], decode(metas[i + 1])
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
    local top = -1
    for s in pairs(mapped) do if s > top then top = s end end
    HW = top + 1
    CFG_DIRTY = true
    KEPT, FREE_EMPTY = nil, false -- (the slots kept are free: listed below)
    redis.call('DEL', K_FREE)
    local free = {}
    for s = 0, math.min(HW, limit) - 1 do
      if mapped[s] == nil then free[#free + 1] = s; free[#free + 1] = s end
    end
    call_in_chunks('ZADD', K_FREE, free)
    HELD = nil -- (counted again where needed)
  end

  -- A repair of the slot map and free slots (counted in cfg.repairs).
  function R.repair(limit)
    R.count_repair()
    R.rebuild_slots(limit)
  end

  -- The index lost its marker: it was lost (or never written). Every record goes back in,
  -- and the slots mapped to entries that have neither a record nor an index entry any more
  -- (lost with `meta`) are freed.
  function R.check_index()
    if redis.call('ZSCORE', K_OWN, '#') then return end
    R.count_repair()
    local metas = redis.call('HGETALL', K_META)
    for j = 1, #metas, 2 do
      redis.call('ZADD', K_OWN, 0, sess_of(decode(metas[j + 1])) .. '|' .. metas[j])
    end
    redis.call('ZADD', K_OWN, 0, '#')
    R.rebuild_slots(LIMIT)
  end

  local function lease_of(sid)
    return tonumber(string.match(sid, '~(%d+)$')) or 0
  end

  -- The lease set lost its marker: the `exp` key was lost (or was written before the marker
  -- existed: `quiet`, nothing is counted unless a session needed its lease back). Every
  -- session of the index gets a lease again (from now), so that the entries of crashed
  -- processes expire again. O(entries), once after a loss.
  function R.restore_sessions(now, quiet)
    check_all()
    R.check_index()
    local restored = false
    for _, mem in ipairs(redis.call('ZRANGE', K_OWN, 0, -1)) do
      local bar = string.find(mem, '|', 1, true)
      if bar then
        local sid = string.sub(mem, 1, bar - 1)
        if redis.call('ZADD', K_EXP, 'NX', now + lease_of(sid), sid) == 1 then restored = true end
      end
    end
    redis.call('ZADD', K_EXP, '+inf', '#')
    if restored or not quiet then R.count_repair() end
  end

  -- The queue is shorter than cfg.qlen says: the `queue` key was lost. Every waiter record
  -- goes back at its own place (score_of), so that the order holds. O(entries), once after a
  -- loss.
  function R.restore_queue()
    check_all()
    R.count_repair()
    local metas = redis.call('HGETALL', K_META)
    for j = 1, #metas, 2 do
      local m = decode(metas[j + 1])
      if not m.s then redis.call('ZADD', K_QUEUE, score_of(m), metas[j]) end
    end
    QLEN = redis.call('ZCARD', K_QUEUE)
    CFG_DIRTY = true
  end

  -- The highest ticket of the records and the queue (a configuration re-created while entries
  -- remain continues above it). O(entries).
  -- The highest ticket of the records and the queue; and, as a lost configuration's s0..s9
  -- must be restored, the highest granted in each class is noted in SERVED (finish() writes
  -- it): else a waiter granted just before the loss, whose notification was lost too, would
  -- not be in doubt for its client (see SERVED).
  function R.highest_ticket()
    local top = 0
    local metas = redis.call('HGETALL', K_META)
    for j = 2, #metas, 2 do
      local m = decode(metas[j])
      local t = m.t
      if t and t > top then top = t end
      if m.a then
        local c = m.p or 0
        SERVED = SERVED or {}
        if not SERVED[c] or t > SERVED[c] then SERVED[c] = t end
      end
    end
    local last = redis.call('ZRANGE', K_QUEUE, -1, -1, 'WITHSCORES')
    if #last > 0 and tonumber(last[2]) > top then top = tonumber(last[2]) end
    return top
  end

  -- Reaps the expired sessions `dead`: every entry of each (at most 512 per call; a session
  -- with more is finished by the next call).
  function R.reap_sessions(dead, now, limit)
    check_all()
    R.check_index()
    local n, budget = 0, 512
    for _, sid in ipairs(dead) do
      local lo, hi = '[' .. sid .. '|', '[' .. sid .. '|\255'
      local members = redis.call('ZRANGEBYLEX', K_OWN, lo, hi, 'LIMIT', 0, budget)
      for _, mem in ipairs(members) do
        local id = string.sub(mem, #sid + 2)
        if string.sub(id, 1, 1) ~= '!' then
          local m = get_meta(id)
          -- (an index entry of an entry that moved to another session is only removed below)
          if m == nil or sess_of(m) == sid then
            drop_entry(id, m, limit, false)
            n = n + 1
          end
        end
      end
      if #members > 0 then redis.call('ZREM', K_OWN, unpack(members)) end
      budget = budget - #members
      if budget <= 0 then break end -- maybe more: the next call goes on
      redis.call('ZREM', K_EXP, sid)
    end
    if n > 0 then
      counters()
      EXPIRED = EXPIRED + n
      CFG_DIRTY = true
    end
    return n
  end

  -- Moves a granted waiter from its waiter session to its holder session (their lease lengths
  -- differ). The holder session's lease is at least the waiter session's: a granted waiter
  -- keeps its lease until its client renews it as a holder.
  function R.move_to_holder(id, m, wait_sid)
    local hold_sid = sess_of(m)
    local until_ms = redis.call('ZSCORE', K_EXP, wait_sid)
    redis.call('ZREM', K_OWN, wait_sid .. '|' .. id)
    redis.call('ZADD', K_OWN, '0', hold_sid .. '|' .. id)
    if until_ms then redis.call('ZADD', K_EXP, 'GT', until_ms, hold_sid) end
  end

  -- The free slots were fewer than the capacity check promised (a lost `free` set, or a
  -- slot map that made the holders look fewer): put back what was popped, repair, and check
  -- the capacity again. Returns the slots to grant (numbers, and as strings), or nil when
  -- there is no capacity.
  -- (strs: the slots pop_free found, the first `listed` of them listed in `free`)
  function R.short_free(strs, listed, n, limit)
    list_kept()
    for i = 1, listed do redis.call('ZADD', K_FREE, strs[i], strs[i]) end
    R.repair(limit)
    if held_count() + n > limit then return nil end
    local slots, strs = pop_free(n, limit)
    if #slots ~= n then
      corrupt('semaphore free slots (key ' .. K_FREE .. ') do not match its holders (key '
        .. K_SLOTS .. ') after a repair')
    end
    return slots, strs
  end

  RARE = R
  return R
end

-- The slot map was lost (held_count): it is rebuilt from the holders' records.
check_all_then_repair = function()
  check_all()
  rare().repair(LIMIT)
end

-- Removes an entry (holder or waiter) entirely; a holder's slots go back to the free set.
-- `tomb`: removed by someone other than its client, which the client's next renewal of the
-- session learns from the index: TOMB_REMOVED (an operator's forced release) or
-- TOMB_REJECTED (a waiter that asked for more than the limit, after a shrink).
-- (A record lists exactly the slots its holder has in K_SLOTS: every script keeps them in step;
-- an entry without a record lost it, and the slots still mapped to it are freed.)
drop_entry = function(id, m, limit, tomb)
  if not HELD and (not m or m.s) then held_count() end -- (before a slot is freed: HELD)
  redis.call('HDEL', K_META, id)
  if m then
    local sid = sess_of(m)
    redis.call('ZREM', K_OWN, sid .. '|' .. id)
    if tomb then redis.call('ZADD', K_OWN, '0', sid .. '|' .. tomb .. id) end
    if m.s then
      local ss = slot_strs(m)
      count_slots(-call_in_chunks('HDEL', K_SLOTS, ss))
      return_slots(m.s, limit, ss)
    else
      queue_remove({ id })
    end
  else
    queue_remove({ id })
    rare().free_slots_of(id, limit)
  end
end

-- The records of `ids` (false where there is none), in order: one HMGET.
local function get_metas(ids, read)
  read = read or decode
  local out = {}
  in_chunks(ids, function(a)
    local raws = redis.call('HMGET', K_META, unpack(a))
    for j = 1, #a do
      local raw = raws[j]
      out[#out + 1] = raw and read(raw) or false
    end
  end)
  return out
end

-- Removes every entry of every session whose lease expired (holders and waiters alike).
local function reap(now, limit)
  local dead = redis.call('ZRANGEBYSCORE', K_EXP, '-inf', now == NOW_MS and NOW_MS_S or int(now),
    'LIMIT', '0', '64')
  if #dead == 0 then return 0 end
  return rare().reap_sessions(dead, now, limit)
end

-- Fails, changing nothing, unless the hash at K_CFG, whose `limit` and `ver` fields are
-- `limit` and `ver` (false when absent), is a redsem configuration: a limit that is a
-- positive integer and a `ver` (if any) that is one too, or no limit but a `ver` (a
-- configuration to re-create). Another program's hash under our key name (`limit banana`,
-- or other fields only) is not adopted, misread as another protocol version, or deleted.
local function positive_int(v)
  local n = tonumber(v)
  return n ~= nil and n >= 1 and n == math.floor(n)
end
local function check_ours(limit, ver)
  local int = positive_int
  local why = nil
  if limit and not int(limit) then
    why = 'its field limit is ' .. string.format('%q', string.sub(limit, 1, 40))
  elseif ver and not int(ver) then
    why = 'its field ver is ' .. string.format('%q', string.sub(ver, 1, 40))
  elseif not limit and not ver and redis.call('EXISTS', K_CFG) == 1 then
    why = 'it has neither a limit nor a ver field'
  end
  if why then
    error({ err = 'REDSEM_FOREIGN key ' .. K_CFG .. ' holds a hash that is not a redsem semaphore\'s'
      .. ' configuration (' .. why .. '): another program uses this key name' })
  end
end

-- Fails, changing nothing, unless `ver` (cfg's field, false when absent: version 1) is this
-- protocol's version.
local function check_version(ver)
  if tonumber(ver or '1') ~= PROTOCOL then
    error({ err = 'REDSEM_PROTOCOL semaphore uses redsem protocol version ' .. (ver or '1')
      .. ', this client speaks version ' .. PROTOCOL .. ': use a client that speaks it' })
  end
end

-- Key loss is detected by every script, in O(1) per call, where it must not go unnoticed
-- (docs/PROTOCOL.md, "Lost keys"): the index and the lease set carry a marker `#`, and the
-- queue's length is counted in cfg.qlen. Each repair runs once, after the loss.
-- (`own` first: the lease set is restored from the index.)
-- These three reads are also the type checks of `own`, `exp` and `queue` before the first
-- write (a key of another type fails them with WRONGTYPE, having written nothing): an EXISTS
-- would find a lost key for less, and miss a foreign one.
local function check_lost(quiet)
  local index = redis.call('ZSCORE', K_OWN, '#')
  local leases = redis.call('ZSCORE', K_EXP, '#')
  local queue = redis.call('ZCARD', K_QUEUE) == QLEN
  if index and leases and queue then return end
  check_all() -- (before the first write of a repair)
  if not index then rare().check_index() end
  if not leases then rare().restore_sessions(now_ms(), quiet) end
  if not queue then rare().restore_queue() end
end

-- The stored limit; (re)creates the configuration and the free-slot set when missing.
-- Every script calls it before its first write. With ONLY_EXISTING, returns nil instead of
-- re-creating a semaphore that delete.lua removed (its tombstone is in `own`).
local function load_limit()
  local cfg
  if READ_SERVED then
    cfg = redis.call('HMGET', K_CFG, 'limit', 'ver', 'seq', 'gen', 'grants', 'expired', 'repairs',
      'qlen', 'hw', 's0', 's1', 's2', 's3', 's4', 's5', 's6', 's7', 's8', 's9')
    LOADED_SERVED = {}
    for c = 0, 9 do LOADED_SERVED[c] = tonumber(cfg[10 + c] or '0') or 0 end
  else
    cfg = redis.call('HMGET', K_CFG, 'limit', 'ver', 'seq', 'gen', 'grants', 'expired', 'repairs',
      'qlen', 'hw')
  end
  -- (the common case, a configuration of this version, is checked with one parse)
  local l = cfg[1] and cfg[2] == PROTOCOL_S and tonumber(cfg[1])
  if not (l and l >= 1 and l == math.floor(l)) then
    l = nil
    check_ours(cfg[1], cfg[2])
  end
  if cfg[1] then
    if not l then
      check_version(cfg[2])
      l = tonumber(cfg[1])
    end
    LIMIT = l
    SEQ, HW = num(cfg[3]), num(cfg[9])
    GEN, COUNTERS = nil, cfg -- (counters())
    W = { seq = SEQ, hw = HW }
    -- (a semaphore created before cfg.qlen and the lease set's marker existed gets them now,
    -- without counting a repair)
    local before = cfg[8] == false
    if before then
      QLEN = redis.call('ZCARD', K_QUEUE)
      CFG_DIRTY = true
    else
      QLEN = tonumber(cfg[8])
      W.qlen = QLEN
    end
    check_lost(before)
    return LIMIT
  end
  check_all()
  if redis.call('ZSCORE', K_OWN, '!deleted') then
    -- deleted by delete.lua while entries were left: not a lost key
    if ONLY_EXISTING then return nil end
    redis.call('DEL', K_OWN) -- (the tombstone, and its TTL)
  end
  local l = tonumber(A[1])
  LIMIT = l
  CREATED = true
  redis.call('HSET', K_CFG, 'limit', l, 'ver', PROTOCOL)
  CFG_DIRTY = true
  -- (finish writes every counter, but the expiries and repairs only once there are some)
  W = { expired = 0, repairs = 0 }
  if redis.call('HLEN', K_META) > 0 or redis.call('HLEN', K_SLOTS) > 0 then
    -- A configuration lost while entries remain (eviction, a DEL): tickets go on above every
    -- ticket of the records and the queue, so that no new ticket jumps the queue (a lost
    -- queue too is rebuilt from the records, each waiter at its ticket); generations go on
    -- from Redis TIME (next_generation); the slot map and free set are rebuilt from the
    -- records (a repair); a lost lease set is restored by check_lost.
    SEQ = rare().highest_ticket()
    rare().check_index()
    rare().repair(l)
    rare().restore_queue()
    check_lost(false)
  else
    -- every slot is free, unlisted (HW = 0)
    redis.call('DEL', K_FREE)
    redis.call('ZADD', K_OWN, 0, '#')
    redis.call('ZADD', K_EXP, '+inf', '#')
    QLEN = redis.call('ZCARD', K_QUEUE)
  end
  return l
end

-- Makes an entry a holder: lowest free slots, the next generation for all of them. A queued
-- waiter keeps its current lease (a waiter that died just before its grant blocks the slot
-- no longer than its own lease; a live one renews it as a holder); a fresh entry (granted at
-- once) joins its holder session, whose lease reaches at least now + its lease.
--
-- Checks first that the free slots are as many as the capacity check promised: after a key
-- loss they may not be. Then the keys are repaired and the capacity checked again. Returns
-- whether it granted.
local function grant(id, m, now, fresh, limit)
  now = now or now_ms()
  local slots, strs, listed = pop_free(m.n, limit)
  if #slots ~= m.n then
    slots, strs = rare().short_free(strs, listed, m.n, limit)
    if not slots then return false end
  end
  local g = next_generation()
  local fences
  if m.n == 1 then
    fences = { g }
  else
    fences = {}
    for i = 1, #strs do fences[i] = g end
  end
  local wait_sid = not fresh and sess_of(m)
  m.s, m.ss, m.f, m.a, m.g = slots, strs, fences, now_ms_s(), GEN
  if fresh then
    write_entry(id, m, strs, nil, sess_of(m), m.l)
  else
    queue_remove({ id })
    if m.l ~= m.w then rare().move_to_holder(id, m, wait_sid) end
    write_entry(id, m, strs)
  end
  GRANTS = GRANTS + 1
  local c = m.p or 0
  SERVED = SERVED or {}
  if not SERVED[c] or m.t > SERVED[c] then SERVED[c] = m.t end
  return true
end

-- Grants the head of the queue while capacity allows (strict FIFO: a head that needs more
-- permits than are free blocks everyone behind it). Returns the grants and rejections made.
-- A semaphore with no permit free reads no head: every request needs one, and none asks for
-- more than the limit (resize.lua rejects them all when the limit shrinks; one at the head
-- after a lost configuration came back smaller is rejected by the next pump that finds a
-- permit free).
local function pump(now, limit)
  local out = {}
  local used = nil
  while QLEN > 0 do -- (nobody queued: QLEN counts the queue, see check_lost)
    used = used or held_count()
    if used >= limit then break end
    local head = redis.call('ZRANGE', K_QUEUE, '0', '0')[1]
    if not head then break end
    local m = get_meta(head)
    if not m then
      queue_remove({ head })
    elseif m.n > limit then
      -- can never be satisfied (the limit shrank below the request): reject it
      drop_entry(head, m, limit, TOMB_REJECTED)
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
        rec = 'g:' .. id .. ':' .. int(m.t) .. ':' .. table.concat(slot_strs(m), ',') .. ':'
          .. table.concat(m.f, ',')
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

-- Milliseconds until the nearest session lease expiry (the earliest moment reaping can free
-- capacity without a notification), or -1 when there is none.
local function next_expiry(now)
  local e = redis.call('ZRANGE', K_EXP, '0', '0', 'WITHSCORES')
  if #e == 0 or e[1] == '#' then return -1 end
  local d = tonumber(e[2]) - now
  if d < 0 then d = 0 end
  return d
end

-- Permits free now (the limit minus the slots held; 0 while the limit is below them).
local function free_now(limit)
  local f = limit - held_count()
  if f < 0 then return 0 end
  return f
end

-- A holder's reply: {1, slots, fences, ticket}
local function held_reply(m)
  local f = {}
  for i, g in ipairs(m.f or {}) do f[i] = tonumber(g) end -- integers in the reply
  return { 1, m.s or {}, f, m.t }
end

-- The state of a fresh call on the semaphore whose seven keys follow keys[offset] (in the
-- order of K_CFG ...) and whose arguments are `args` (laid out as ARGV): every value of the
-- prelude that belongs to one semaphore. begin() calls it, and renew_many.lua once per
-- semaphore (after a flush: only acquire.lua gathers a BUF); the time read stays the call's.
local function on_semaphore(keys, offset, args)
  K_CFG, K_QUEUE, K_EXP, K_META, K_SLOTS, K_FREE, K_OWN = keys[offset + 1], keys[offset + 2],
    keys[offset + 3], keys[offset + 4], keys[offset + 5], keys[offset + 6], keys[offset + 7]
  A = args
  CH_BASE, PUB = args[2], args[3]
  CREATED = false
  SEQ, GEN, GRANTS, EXPIRED, REPAIRS = 0, 0, 0, 0, 0
  W, COUNTERS = {}, nil
  CFG_DIRTY, QLEN, HW, LIMIT, SLOTS_FREED, ONLY_EXISTING = false, 0, 0, 0, false, false
  HELD = nil
  FREE_EMPTY, KEPT = false, nil
  POOL, POOL_I, POOL_WANT = nil, 1, 0
  SERVED, READ_SERVED, LOADED_SERVED = nil, false, nil
end

-- The state of a fresh call on the semaphore whose keys are `keys` (KEYS) and arguments
-- `args` (ARGV). Called first by every script and every function of the library, before
-- anything else: so a call never sees what an earlier one left (the library's values live
-- as long as the library).
local function begin(keys, args)
  if not redis then
    redis, string, table, math, tonumber, ipairs, pairs, next, unpack, error, type, tostring =
      real_globals()
  end
  NOW_MS, NOW_US, NOW_MS_S = nil, nil, nil
  BUF, RARE = nil, nil
  on_semaphore(keys, 0, args)
end
