-- open: check that the keys hold what redsem expects (a WRONGTYPE error otherwise), create the
-- configuration on first use (unless ARGV[4] is "0": then an absent configuration is answered
-- with an empty reply, and nothing is written), repair a key loss (detected in O(1), as by every
-- script: load_limit), and report the stored limit. O(1) whatever the limit and the queue.
-- ARGV 5 "1": read the server's maxmemory-policy first (INFO memory), and refuse a policy that
--   evicts any key (allkeys-*) before anything is written or created.
-- Reply: {stored_limit, created (0|1), first key that carries a TTL or "", permits free,
--         maxmemory-policy ("" unless ARGV 5 is "1")} (a TTL makes the key evictable under a
--         volatile-* maxmemory-policy; redsem never sets one)
--        {-1, policy}: an allkeys-* policy, refused (ARGV 5 "1"); nothing was written
local policy = ''
if A[5] == '1' then
  policy = string.match(redis.call('INFO', 'memory'), 'maxmemory_policy:([%w%-]+)') or ''
  if string.sub(policy, 1, 8) == 'allkeys-' then return { -1, policy } end
end
local existed = redis.call('EXISTS', K_CFG)
-- touch every key with a read of its expected type: raises WRONGTYPE for a foreign key
check_all()
if existed == 0 and A[4] == '0' then return {} end
local now = now_ms()
local limit = load_limit()
settle(now, limit, true)
finish()
local with_ttl = ''
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) > 0 then with_ttl = k; break end
end
return { limit, 1 - existed, with_ttl, free_now(limit), policy }
