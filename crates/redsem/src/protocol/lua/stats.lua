-- stats: a consistent snapshot (checks the keys' consistency, repairing a key loss, then reaps
-- and grants first, like every script).
-- Reply: {now_ms, limit, permits_in_use, grants, expired, holders_json, waiters_json, repairs}
-- holders_json: JSON array of {id, meta} in no particular order (with the lease expiry of its
-- session, "e");
-- waiters_json: JSON array of {id, meta} in queue (FIFO) order.
local now = now_ms()
check_all()
local limit = load_limit()
rare().audit(limit, now)
settle(now, limit, true)
finish()
local function entries(ids)
  local arr = {}
  for _, id in ipairs(ids) do
    local m = get_meta(id)
    if m then
      m.id = id
      m.e = tonumber(redis.call('ZSCORE', K_EXP, sess_of(m)))
      arr[#arr + 1] = m
    end
  end
  return arr
end
local holder_ids, seen = {}, {}
local sl = redis.call('HVALS', K_SLOTS)
for _, id in ipairs(sl) do
  if not seen[id] then seen[id] = true; holder_ids[#holder_ids + 1] = id end
end
local waiting = redis.call('ZRANGE', K_QUEUE, 0, -1)
local h, w = entries(holder_ids), entries(waiting)
local function enc(t) if #t == 0 then return '[]' end return cjson.encode(t) end
return { now, limit, redis.call('HLEN', K_SLOTS),
  tonumber(redis.call('HGET', K_CFG, 'grants') or '0'),
  tonumber(redis.call('HGET', K_CFG, 'expired') or '0'),
  enc(h), enc(w), tonumber(redis.call('HGET', K_CFG, 'repairs') or '0') }
