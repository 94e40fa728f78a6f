-- dedup_global: the store's framing of an in-Redis effect for the global
-- layout (dedup.scope=global, and records that leave their partition
-- under dedup.scope=partition). The store prepends `local PER = <n>` and
-- the handler's effect function (handlers/ledger.lua is the model) at
-- registration. ARGV = prefix, group.id, dedup.ttl.seconds, the layout
-- the member runs ("global", or "partition" for the records that leave
-- their partition), then PER per record: identity, message_id, the
-- effect's own.
--
-- Redis Cluster mode (the store's global path, store.c cluster_global):
-- ARGV[4] is the bucket's hash tag "{<group>::<NN>}" instead of a layout
-- (no layout check: a cluster runs the partition layout, and the layout
-- key is on another slot); ARGV[5] = G, then G quadruples (field
-- "<topic>:<partition>", the highest offset of that partition in this
-- call, its lowest, and the last the member saw this bucket acknowledge
-- for it or "-"), then the records. KEYS = the records' mark keys
-- <prefix>dedup{<group>::<NN>}:<identity>, then the bucket's positions
-- hash <prefix>gpos{<group>::<NN>}: all of one slot. Before any write, a
-- field below what the member saw acknowledged (the bucket's node lost
-- writes: a failover to a replica that missed them) refuses the call
-- with an error GPOS, nothing written. The effect gets the tag as its key
-- suffix (ksuf), so its writes stay in the slot. After the marks, per
-- partition: field = max(field, highest), field .. ':at' = lowest and
-- field .. ':ts' = when (Redis's TIME, ms: how old a rewind to `at`
-- would reach) (docs/design.md, "Redis Cluster mode", "The global path").
--
-- For each record a done or lease mark means "not applied" (the mark is
-- returned); else the effect and the done mark happen together inside
-- this script, so no crash can separate them. The marks are read with one
-- MGET, only new records get a SET. A record the effect refused is left
-- unmarked and returns "reject:<error>", as do the repeats of its identity
-- later in the chunk. A server error of the effect is the reply.
local group, ttl = ARGV[2], ARGV[3]
local FIRST = 4
local ksuf, G = nil, 0
if string.sub(ARGV[4], 1, 1) == '{' then
  ksuf, G = ARGV[4], tonumber(ARGV[5])
  FIRST = 5 + 4 * G
else
  -- Layout check (redis/layout.h): the group's layout key must say what
  -- the member runs (absent: global), else nothing is written and the
  -- member reads the key again and routes the records again.
  local runs = redis.call('HMGET', ARGV[1] .. 'layout:' .. group, 'layout')[1]
  if (runs or 'global') ~= ARGV[4] then
    return redis.error_reply('LAYOUT redis runs ' .. (runs or 'global') ..
                             ', the member ' .. ARGV[4])
  end
end
local n = (#ARGV - FIRST) / PER
local gfields, ghad = {}, nil
if G > 0 then
  for p = 0, G - 1 do
    gfields[p + 1] = ARGV[6 + 4 * p]
  end
  ghad = redis.call('HMGET', KEYS[n + 1], unpack(gfields))
  for p = 0, G - 1 do
    local want = ARGV[9 + 4 * p]
    if want ~= '-' and tonumber(ghad[p + 1] or '-1') < tonumber(want) then
      return redis.error_reply('GPOS ' .. KEYS[n + 1] .. ' ' .. gfields[p + 1] ..
                               ': redis holds ' .. (ghad[p + 1] or 'none') ..
                               ', the member saw ' .. want ..
                               ' acknowledged')
    end
  end
end
local keys = {}
for j = 1, n do
  keys[j] = KEYS[j] or
            (ARGV[1] .. 'dedup:' .. group .. ':' .. ARGV[FIRST + (j - 1) * PER + 1])
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
local refused, err = effect(FIRST + 2, PER, new, ksuf) -- its own arguments
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
if G > 0 then
  local tm = redis.call('TIME')
  local ms = string.format('%.0f', tonumber(tm[1]) * 1000 +
                                   math.floor(tonumber(tm[2]) / 1000))
  local set = {}
  for p = 0, G - 1 do
    local f, hi = gfields[p + 1], ARGV[7 + 4 * p]
    if not ghad[p + 1] or tonumber(ghad[p + 1]) < tonumber(hi) then
      set[#set + 1] = f
      set[#set + 1] = hi
    end
    set[#set + 1] = f .. ':at'
    set[#set + 1] = ARGV[8 + 4 * p]
    set[#set + 1] = f .. ':ts'
    set[#set + 1] = ms
  end
  redis.call('HSET', KEYS[n + 1], unpack(set))
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
