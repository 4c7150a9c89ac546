-- renew: the heartbeat of one client handle. Reaps, grants, then extends the lease of each
-- listed session (all its entries live on with it) and reports the state of each listed
-- entry. Never re-creates an entry that expired or was removed.
-- (This body reads its arguments through A, the prelude's ARGV: renew_many.lua runs it once per
-- semaphore, as a function, with A pointed at each semaphore's arguments.)
-- ARGV (after the common header): 4 k (number of sessions), then k pairs (session id, lease
--   ms), then the ids of entries to check (the client's holders, and those of its waiters it
--   has reason to doubt; see docs/PROTOCOL.md)
-- Reply: {next_expiry_ms, states, free, limit, sessions, head, removed, why, deleted, served,
--         issued}
--        states: one per id, in order:
--          {1, slots, fences, ticket} holds (a waiter listed here may have been granted meanwhile)
--          {-3}               holds, but in none of the listed sessions' owners (with k > 0):
--                             another client handle adopted it (a hand-off, lease.lua), or it
--                             was detached; these sessions no longer keep it alive
--          {0}                still queued
--          {-1}               gone: expired, released by someone else, or lost with Redis data
--        free: the permits free now; limit: the stored limit
--        sessions: one per session, in order: 1 it had a lease, 0 it had none (it expired and
--          its entries were reaped, or the client has not used it yet): its lease starts now
--        head: the place (score) of the head of the queue rounded down, or nil when nobody
--          waits (a waiter with a lower place was granted or removed: its notification may
--          have been lost; a place is the ticket for a waiter without a priority, see
--          prelude's score_of)
--        removed: the ids of the sessions' entries that someone else removed since their last
--          renewal (an operator's release, a rejection after a shrink)
--        why: one per removed id, in order: 1 an operator removed it (a forced release), 2 it
--          was rejected: it asked for more permits than the limit (after a shrink)
--        deleted: 1 when delete.lua removed the semaphore (every state is then {-1}, every
--          session flag 0, and nothing is written: the semaphore is not re-created), else 0
--        served: the highest ticket granted in each priority class 0..9 (0: none), from cfg's
--          s0..s9: a waiter whose ticket is at or below its class's was granted or removed
--        issued: the highest ticket issued (cfg.seq): a waiter whose ticket is above it was
--          queued before the configuration was lost and re-created without its entry (a
--          FLUSHALL, every key evicted): gone, however high the served tickets are
local now = now_ms()
ONLY_EXISTING = true
READ_SERVED = true
local limit = load_limit()
local k = tonumber(A[4])
if not limit then
  local states, sessions = {}, {}
  for i = 5 + 2 * k, #A do states[#states + 1] = { -1 } end
  for j = 1, k do sessions[j] = 0 end
  return { -1, states, 0, tonumber(A[1]), sessions, false, {}, {}, 1, {} }
end
settle(now, limit, false)
local sessions, removed, why = {}, {}, {}
local owners = {} -- the owner part of each listed session (`<owner>~<lease ms>`)
for j = 0, k - 1 do
  local sid, lease = A[5 + 2 * j], tonumber(A[6 + 2 * j])
  owners[string.match(sid, '^(.*)~') or sid] = true
  -- (an expired session not reaped yet, e.g. beyond what one call reaps, had no lease
  -- either: some of its entries may be gone)
  local until_ms = redis.call('ZSCORE', K_EXP, sid)
  sessions[j + 1] = (until_ms and tonumber(until_ms) > now) and 1 or 0
  redis.call('ZADD', K_EXP, 'GT', int(now + lease), sid)
  local tombs = redis.call('ZRANGEBYLEX', K_OWN, '[' .. sid .. '|!', '[' .. sid .. '|!\255',
    'LIMIT', 0, 512)
  if #tombs > 0 then
    redis.call('ZREM', K_OWN, unpack(tombs))
    for _, t in ipairs(tombs) do
      local id = string.sub(t, #sid + 3)
      if string.sub(id, 1, 1) == '!' then
        removed[#removed + 1] = string.sub(id, 2)
        why[#why + 1] = 2 -- rejected (TOMB_REJECTED)
      else
        removed[#removed + 1] = id
        why[#why + 1] = 1 -- an operator removed it (TOMB_REMOVED)
      end
    end
  end
end
local states = {}
local requeued = false
for i = 5 + 2 * k, #A do
  local id = A[i]
  local m = get_meta(id)
  if not m then
    states[#states + 1] = { -1 }
  elseif m.s and k > 0 and not owners[m.o or m.c] then
    states[#states + 1] = { -3 } -- adopted by another handle (or detached)
  elseif m.s then
    states[#states + 1] = held_reply(m)
  else
    if not redis.call('ZSCORE', K_QUEUE, id) then
      -- its place in the queue was lost with the `queue` key: back at its place
      check_all()
      rare().count_repair()
      queue_add(score_of(m), id)
      requeued = true
    end
    states[#states + 1] = { 0 }
  end
end
if requeued then publish(pump(now, limit), nil) end
local head = redis.call('ZRANGE', K_QUEUE, '0', '0', 'WITHSCORES')
finish()
local served = {}
for c = 0, 9 do served[c + 1] = LOADED_SERVED[c] end
return { next_expiry(now), states, free_now(limit), limit, sessions,
  #head > 0 and math.floor(tonumber(head[2])) or false, removed, why, 0, served, SEQ }
