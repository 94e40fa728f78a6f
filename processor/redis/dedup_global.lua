-- dedup_global: the store's framing of an in-Redis effect for the global
-- layout (dedup.scope=global, and records that leave their partition
-- under dedup.scope=partition). The store prepends `local PER = <n>` and
-- the handler's effect function (handlers/ledger.lua is the model) at
-- registration. ARGV = prefix, group.id, dedup.ttl.seconds, the layout
-- the member runs ("global", or "partition" for the records that leave
-- their partition), then PER per record: identity, message_id, the
-- effect's own.
--
-- For each record a done or lease mark means "not applied" (the mark is
-- returned); else the effect and the done mark happen together inside
-- this script, so no crash can separate them. The marks are read with one
-- MGET, only new records get a SET. A record the effect refused is left
-- unmarked and returns "reject:<error>", as do the repeats of its identity
-- later in the chunk. A server error of the effect is the reply.
local group, ttl = ARGV[2], ARGV[3]
local FIRST = 4
-- Layout check (redis/layout.h): the group's layout key must say what
-- the member runs (absent: global), else nothing is written and the
-- member reads the key again and routes the records again.
local runs = redis.call('HMGET', ARGV[1] .. 'layout:' .. group, 'layout')[1]
if (runs or 'global') ~= ARGV[4] then
  return redis.error_reply('LAYOUT redis runs ' .. (runs or 'global') ..
                           ', the member ' .. ARGV[4])
end
local n = (#ARGV - FIRST) / PER
local keys = {}
for j = 1, n do
  keys[j] = ARGV[1] .. 'dedup:' .. group .. ':' .. ARGV[FIRST + (j - 1) * PER + 1]
end
local marks = redis.call('MGET', unpack(keys))
local out, seen, new, dups = {}, {}, {}, {}
for j = 1, n do
  local id = ARGV[FIRST + (j - 1) * PER + 1]
  local first = seen[id]
  if first then
    dups[#dups + 1] = {j, first}
  elseif marks[j] then
    out[j] = marks[j]
  else
    seen[id] = j
    new[#new + 1] = j
    out[j] = ''
  end
end
local refused, err = effect(FIRST + 2, PER, new) -- its own arguments
if not refused then
  return redis.error_reply(err)
end
for _, j in ipairs(new) do
  if refused[j] then
    out[j] = 'reject:' .. refused[j]
  else
    redis.call('SET', keys[j], 'done:' .. ARGV[FIRST + (j - 1) * PER + 2],
               'EX', ttl)
  end
end
for _, d in ipairs(dups) do
  local j, first = d[1], d[2]
  if out[first] == '' then
    out[j] = 'done:' .. ARGV[FIRST + (first - 1) * PER + 2]
  else
    out[j] = out[first]
  end
end
return out
