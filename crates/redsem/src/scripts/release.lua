-- release: remove holders or queued waiters (a cancelled acquire), then grant what that frees.
-- ARGV (after the common header): 4 force ("1" for an operator's release, "0" otherwise;
--   the script treats both alike: the next grant of a slot carries a higher fence anyway,
--   see next_generation), 5.. ids
-- Reply: number of entries that existed and were removed. Idempotent.
local now = now_ms()
local limit = load_limit()
local removed, unknown = 0, false
for i = 5, #ARGV do
  local id = ARGV[i]
  local m = get_meta(id)
  if m then
    removed = removed + 1
    drop_entry(id, m, limit)
  else
    -- no record: never written by redsem, or its record was lost (then its slots are freed,
    -- and granted below)
    drop_entry(id, nil, limit)
    unknown = true
  end
end
settle(now, limit, removed > 0 or unknown)
return removed
