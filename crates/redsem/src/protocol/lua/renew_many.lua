-- renew_many: renew.lua for several semaphores (of one client, on one Redis node; on a
-- cluster, in one hash slot) in one call. Its source is prelude.lua, then
-- 'local function renew_one()', renew.lua and 'end' (one line each), then this file
-- (scripts/mod.rs builds it): each semaphore runs exactly renew.lua's logic.
-- KEYS: the seven keys of each semaphore (as in the prelude), one semaphore after the other.
-- ARGV: 1 m (number of semaphores), then for each semaphore: c (how many arguments it has),
--   then its c arguments, laid out as renew.lua's ARGV (the common header, then k, the k
--   sessions, the ids).
-- Reply: one element per semaphore, in order: renew.lua's reply for it, or the error it failed
--   with, as an error reply inside the array (WRONGTYPE, REDSEM_PROTOCOL, REDSEM_CORRUPT, a
--   refusal by ACL, ...) followed, as Redis does for a script's error, by
--   ' script: renew_many, on @user_script:<line>.' (the line of this script's source).
--   A failing semaphore fails only its own element, and has written what renew.lua would
--   have written before the same error (nothing, see docs/PROTOCOL.md, "Errors", except for
--   REDSEM_CORRUPT); the others are renewed.

-- Makes the semaphore whose keys follow KEYS[offset] and whose arguments are `args` the one
-- the prelude's functions work on, with the state of a fresh call (the prelude's
-- on_semaphore; the time read by now_ms stays the call's), after writing what a batch
-- gathered in BUF (only acquire.lua gathers one).
local function use_semaphore(offset, args)
  flush()
  on_semaphore(KEYS, offset, args)
end

-- Redis's (and Valkey's) own error handler adds the failing line to the error; without it,
-- the error alone.
local on_error = rawget(_G, '__redis__err__handler') or function(e) return e end

local function failure(e)
  if type(e) ~= 'table' then return 'ERR ' .. tostring(e) end
  local text = tostring(e.err or 'ERR unknown error')
  if e.line then text = text .. ' script: renew_many, on @user_script:' .. e.line .. '.' end
  return text
end

local replies = {}
local at = 2
for i = 1, tonumber(ARGV[1]) do
  local c = tonumber(ARGV[at])
  local args = {}
  for j = 1, c do args[j] = ARGV[at + j] end
  at = at + c + 1
  use_semaphore(7 * (i - 1), args)
  local ok, reply = xpcall(renew_one, on_error)
  if ok then replies[i] = reply else replies[i] = { err = failure(reply) } end
end
return replies
