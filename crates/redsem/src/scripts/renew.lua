-- renew: the batched heartbeat of one process. Reaps, grants, then extends the lease of every
-- listed entry that still exists. Never re-creates an entry that expired or was removed.
-- ARGV (after the common header): 4.. ids
-- Reply: {next_expiry_ms, states, free, limit} with one state per id, in order (free: the
--        permits free now; limit: the stored limit):
--        {1, slots, fences, ticket} holds (a waiter listed here may have been granted meanwhile)
--        {0}                still queued
--        {-1}               gone: expired, released by someone else, or lost with Redis data
local now = now_ms()
local limit = load_limit()
settle(now, limit, false)
local states = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local m = get_meta(id)
  if not m then
    states[#states + 1] = { -1 }
  else
    restore_leases(id, now)
    if m.s then
      redis.call('ZADD', K_EXP, 'XX', now + m.l, id)
      states[#states + 1] = held_reply(m)
    else
      redis.call('ZADD', K_EXP, 'XX', now + m.w, id)
      if not redis.call('ZSCORE', K_QUEUE, id) then
        -- its place in the queue was lost with the `queue` key: back at its ticket
        count_repair()
        redis.call('ZADD', K_QUEUE, m.t, id)
        publish(pump(now, limit), nil)
      end
      states[#states + 1] = { 0 }
    end
  end
end
return { next_expiry(now), states, free_now(limit), limit }
