-- release: remove holders or queued waiters (a cancelled acquire), then grant what that frees.
-- ARGV (after the common header): 4 force ("1": an operator's release; the slots' fences
--   advance at once so that the evicted holder's writes are rejected), 5.. ids
-- Reply: number of entries that existed and were removed. Idempotent.
local now = now_ms()
local limit = load_limit()
local force = ARGV[4] == '1'
local removed = 0
for i = 5, #ARGV do
  local id = ARGV[i]
  local m = get_meta(id)
  if m then
    removed = removed + 1
    if force and m and m.s then
      for _, s in ipairs(m.s) do redis.call('HINCRBY', K_FENCE, s, 1) end
    end
    drop_entry(id, m, limit)
  else
    redis.call('ZREM', K_EXP, id) -- a lease without a record (never written by redsem)
  end
end
settle(now, limit, removed > 0)
return removed
