-- resize: change the stored limit live. Growing admits waiters at once; shrinking lets
-- holders finish and admits no one until the permits in use are below the new limit.
-- ARGV (after the common header): 4 new limit, or with ARGV 5 = "add": a change (+/-) of the
--   stored limit, applied atomically, refused when the result is outside 1..ARGV 6
-- Reply: the previous limit; with ARGV 5 = "set" (ARGV 4 the new limit) or "add":
--   {previous, new, rejected}, where rejected lists the queued waiters this change rejected
--   (they asked for more permits than the new limit), each {id, permits, label}, in queue
--   order; with "add", {previous, -1, {}} when refused
local now = now_ms()
check_all()
local old = load_limit()
local new = tonumber(ARGV[4])
local relative = ARGV[5] == 'add'
local report = relative or ARGV[5] == 'set'
if relative then
  new = old + new
  if new < 1 or new > tonumber(ARGV[6]) then finish(); return { old, -1, {} } end
end
-- `free` lists the free slots below both the limit and the high-water mark (prelude's HW):
-- a growth lists those between the old limit and the mark (the slots above the mark are free
-- without being listed); a shrink unlists those above the new limit (their holders, if any,
-- finish; their slots are then no longer held, and not listed).
if new > old then
  for s = old, math.min(HW, new) - 1 do
    if redis.call('HEXISTS', K_SLOTS, s) == 0 then redis.call('ZADD', K_FREE, s, s) end
  end
elseif new < old then
  redis.call('ZREMRANGEBYSCORE', K_FREE, new, '+inf')
end
LIMIT = new
redis.call('HSET', K_CFG, 'limit', new)
-- (settle, keeping what pump did: the rejections are reported)
reap(now, new)
local out = {}
if new < old then
  -- every queued request larger than the new limit is rejected now, not only the head: none
  -- of them can ever be granted (O(queue), as a shrink is rare)
  local queued = redis.call('ZRANGE', K_QUEUE, 0, -1)
  local ms = get_metas(queued)
  for i, id in ipairs(queued) do
    local m = ms[i]
    if m and m.n > new then
      drop_entry(id, m, new, TOMB_REJECTED)
      out[#out + 1] = { id, m, false }
    end
  end
end
for _, r in ipairs(pump(now, new)) do out[#out + 1] = r end
publish(out, nil)
finish()
if not report then return old end
local rejected = {}
for _, r in ipairs(out) do
  if not r[3] then rejected[#rejected + 1] = { r[1], r[2].n, label_of(r[2]) } end
end
return { old, new, rejected }
