-- open: check that the keys hold what redsem expects (a WRONGTYPE error otherwise), create the
-- configuration on first use (unless ARGV[4] is "0": then an absent configuration is answered
-- with an empty reply, and nothing is written), check the keys' consistency (a repair after a key loss, see
-- audit in the prelude), and report the stored limit.
-- Reply: {stored_limit, created (0|1), first key that carries a TTL or "", permits free} (a TTL
-- makes the key evictable under a volatile-* maxmemory-policy; redsem never sets one)
local existed = redis.call('EXISTS', K_CFG)
-- touch every key with a read of its expected type: raises WRONGTYPE for a foreign key
check_all()
if existed == 0 and A[4] == '0' then return {} end
local now = now_ms()
local limit = load_limit()
rare().audit(limit, now)
settle(now, limit, true)
finish()
local with_ttl = ''
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) > 0 then with_ttl = k; break end
end
return { limit, 1 - existed, with_ttl, free_now(limit) }
