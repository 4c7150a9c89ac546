-- acquire: for each request of a batch, take a ticket (or, in try mode, take capacity only if
-- it is free now). Requests are handled in order, as if sent one after the other: a batch is
-- what a client gathered while its previous call was in flight, so FIFO order is kept.
-- ARGV (after the common header): 4 k (number of requests), then 8 values per request:
--   id, n, holder lease ms, waiter lease ms, client channel id, label, mode ("wait"|"try"),
--   priority class (0..9, 0 the default; higher first: prelude's score_of)
-- A waiter joins the session '<channel id>~<waiter lease>', a holder '<channel id>~<holder lease>';
-- joining extends the session's lease to at least now + its lease.
-- Reply: one flat array of integers (a nested table costs Redis more to convert than the
-- whole request costs to handle): first the permits free once the whole batch was handled (a
-- snapshot for Semaphore::available_permits), then one reply per request, in order:
--        1, ticket, k, k slots, k fences   granted now (k = the permits, n)
--        0, ticket, next_expiry_ms         queued; the grant will be published to the client
--                                          channel (next_expiry_ms -1: no lease to wait for)
--        -1, why                           try mode: not granted; why = 1: fewer permits free
--                                          than n, 2: enough free, but others are queued ahead
--                                          (FIFO)
--        -2, limit                         n exceeds the limit
-- Idempotent per id: re-sending the same id returns the entry's current state.
local now = now_ms()
local limit = load_limit() -- (it reads `own` before any write: see check_lost)
settle(now, limit, false)
local used = held_count()
-- The place (score_of) of the head of the queue: nil until read, math.huge when nobody waits.
-- A request is granted at once only if it fits and nobody is queued ahead of it; one that
-- does not fit queues without reading it (`low`: the lowest place this call queued at, which
-- a read of the queue would miss while a batch's writes are gathered).
local head, low = nil, math.huge
local k = tonumber(ARGV[4])
-- A batch reads the records of its ids that exist already (a request sent again) with one
-- HMGET, and gathers its writes (below); a lone request reads and writes as it goes, which
-- costs it less.
local stored = nil
if k > 1 then
  stored = {}
  local ids = {}
  for j = 0, k - 1 do ids[j + 1] = ARGV[5 + 8 * j] end
  local found = get_metas(ids)
  for j, id in ipairs(ids) do
    if found[j] then stored[id] = found[j] end
  end
end

-- Handles one request; returns its reply's code and what the reply is made of: the record (1:
-- held), the ticket (0: queued), why (-1) or the limit (-2).
local function one(id, n, lease, wait_lease, channel, label, mode, priority)
  if n > limit then return -2, limit end
  local m
  if stored then m = (BUF and BUF.rec[id]) or stored[id] else m = get_meta(id) end
  if m then
    if m.s then return 1, m end
    return 0, m.t
  end
  -- (every field a grant sets is in the constructor: the table is sized once)
  m = { n = n, t = 0, c = channel, l = lease, w = wait_lease, lb = label, q = now_ms_s(),
    a = nil, s = nil, ss = nil, f = nil, g = nil }
  if priority > 0 then m.p = priority end
  -- (its place with the ticket it takes if it is granted or queued; a try that fails takes
  -- none)
  m.t = SEQ + 1
  local place = score_of(m)
  local fits = used + n <= limit
  -- Capacity goes to the queue first: a request is granted at once only if nobody is queued
  -- ahead of it. Without a priority everyone queued is ahead (their places are below any new
  -- ticket); with one, only those whose place is at or below its own.
  local queued = false
  if fits then
    if head == nil then
      if QLEN == 0 then
        head = math.huge
      else
        local h = redis.call('ZRANGE', K_QUEUE, '0', '0', 'WITHSCORES')
        head = #h > 0 and tonumber(h[2]) or math.huge
      end
      if low < head then head = low end
    end
    queued = head < place
  end
  if not queued and fits then
    m.t = next_ticket()
    if grant(id, m, now, true, limit) then
      used = used + n
      return 1, m
    end
    fits = false -- the holders were more than they looked (repaired)
    used = held_count()
  end
  if mode == 'try' then return -1, (queued and fits) and 2 or 1 end
  -- Queue at its place: behind a head that cannot be granted (see settle), or at the head
  -- itself when it does not fit; either way nobody can be granted yet.
  m.t = next_ticket()
  if head and place < head then head = place end
  if place < low then low = place end
  write_entry(id, m, nil, place, sess_of(m), m.w)
  return 0, m.t
end

-- A batch's writes are gathered and made at the end, one command per key (prelude's BUF).
if k > 1 then
  BUF = { meta = {}, rec = {}, slots = {}, own = {}, queue = {}, exp = {}, sids = {} }
  -- (with nobody queued, the permits its requests could take at once are popped ahead, in
  -- one call: the prelude's POOL)
  if QLEN == 0 then
    local want = 0
    for j = 0, k - 1 do
      local n = ARGV[6 + 8 * j]
      want = want + (n == '1' and 1 or tonumber(n) or 0)
    end
    POOL_WANT = math.min(want, limit - used)
  end
end
-- The reply is built as the requests are handled; what is known only once the batch is
-- written is filled in then: the free permits (out[1]) and the next expiry of the queued
-- (at the places `expiry_at`).
local out = { 0 }
local expiry_at = nil
for j = 0, k - 1 do
  local b = 5 + 8 * j
  -- (the leases stay the strings they came as: records store them, sessions are named by
  -- them; the common n = 1 and priority 0 are not parsed)
  local n, p = ARGV[b + 1], ARGV[b + 7]
  local code, part = one(ARGV[b], n == '1' and 1 or tonumber(n), ARGV[b + 2], ARGV[b + 3],
    ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], p == '0' and 0 or tonumber(p))
  out[#out + 1] = code
  if code == 1 then
    local m = part
    out[#out + 1] = m.t
    out[#out + 1] = #m.s
    for _, s in ipairs(m.s) do out[#out + 1] = s end
    for _, f in ipairs(m.f) do
      out[#out + 1] = m.g or tonumber(f) -- (granted by this call: each is its generation)
    end
  elseif code == 0 then
    out[#out + 1] = part
    out[#out + 1] = -1
    expiry_at = expiry_at or {}
    expiry_at[#expiry_at + 1] = #out
  else
    out[#out + 1] = part
  end
end
flush()
finish()
local free = limit - used
if free < 0 then free = 0 end
out[1] = free
if expiry_at then
  local expiry = next_expiry(now)
  for _, i in ipairs(expiry_at) do out[i] = expiry end
end
return out
