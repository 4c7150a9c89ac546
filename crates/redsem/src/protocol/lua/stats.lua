-- stats: a snapshot, bounded whatever the queue and the limit: the counts, the first waiters of
-- the queue and some holders (reaps and grants first, like every script).
-- ARGV (after the common header): 4 (optional) how many holders and waiters to list at most
--   (default 100), 5 (optional) the position in the queue the list of waiters starts at
--   (default 0, the head)
-- Reply: {now_ms, limit, permits_in_use, grants, expired, holders_json, waiters_json, repairs,
--         holders, waiters}
-- holders_json: JSON array of up to ARGV 4 holders' records, each with its id ("id") and the
-- lease expiry of its session ("e"), in no particular order (all of them when there are no
-- more); waiters_json: the same for the waiters from position ARGV 5 on, in queue (FIFO) order;
-- holders, waiters: how many there are in all.
local now = now_ms()
check_all()
local limit = load_limit()
settle(now, limit, true)
finish()
local max = tonumber(A[4] or '100')
local from = tonumber(A[5] or '0')
local expiry = {} -- session -> lease expiry (ms), read once each
local function entries(ids)
  local arr = {}
  local ms = get_metas(ids)
  for i, id in ipairs(ids) do
    local m = ms[i]
    if m then
      m.id = id
      local sid = sess_of(m)
      if expiry[sid] == nil then
        expiry[sid] = tonumber(redis.call('ZSCORE', K_EXP, sid)) or false
      end
      m.e = expiry[sid] or nil
      arr[#arr + 1] = m
    end
  end
  return arr
end
-- some holders: the slot map's first fields (all of them while it is small)
local holder_ids, seen = {}, {}
local cursor = '0'
for _ = 1, (max > 0 and 8 or 0) do
  local page = redis.call('HSCAN', K_SLOTS, cursor, 'COUNT', max)
  cursor = page[1]
  local fields = page[2]
  for i = 1, #fields, 2 do
    local id = fields[i + 1]
    if not seen[id] and #holder_ids < max then
      seen[id] = true
      holder_ids[#holder_ids + 1] = id
    end
  end
  if cursor == '0' or #holder_ids >= max then break end
end
local waiting = max > 0 and redis.call('ZRANGE', K_QUEUE, from, from + max - 1) or {}
local h, w = entries(holder_ids), entries(waiting)
local function enc(t) if #t == 0 then return '[]' end return cjson.encode(t) end
local waiters = redis.call('ZCARD', K_QUEUE)
local holders = redis.call('HLEN', K_META) - waiters
if holders < 0 then holders = 0 end
return { now, limit, held_count(),
  tonumber(redis.call('HGET', K_CFG, 'grants') or '0'),
  tonumber(redis.call('HGET', K_CFG, 'expired') or '0'),
  enc(h), enc(w), tonumber(redis.call('HGET', K_CFG, 'repairs') or '0'), holders, waiters }
