-- ledger: handler=ledger's dedup script, run in Redis with EVALSHA (the
-- store loads it, idem_store_script_register). ARGV = prefix, group.id,
-- dedup.ttl.seconds, then 5 per record: identity, message_id, currency,
-- user_id, amount in minor units.
--
-- For each record a done or lease mark means "not applied" (the mark is
-- returned); else the increment and the done mark happen together inside
-- this script, so no crash can separate effect from mark. To keep Redis's
-- work per record small, the marks are read with one MGET, the increments
-- are summed per (currency, user) and applied with one HINCRBY each, and
-- only new records get a SET. An increment Redis refuses because of the
-- record (an overflow, a field or key that holds no integer) leaves its
-- records unmarked and returns "reject:<error>" for them, and for the
-- repeats of their identity later in the chunk. Any other refusal (OOM,
-- READONLY, MISCONF, NOREPLICAS, ...) is the server's state, not the
-- record's: the script returns that error as its reply and the caller
-- treats it as an outage. Redis checks those states only before a
-- script's first write, so a script that meets one has written nothing.
local prefix, group, ttl = ARGV[1], ARGV[2], ARGV[3]
local n = (#ARGV - 3) / 5
local keys = {}
for j = 1, n do
  keys[j] = prefix .. 'dedup:' .. group .. ':' .. ARGV[3 + (j - 1) * 5 + 1]
end
local marks = redis.call('MGET', unpack(keys))
local out, seen, sums, new, dups = {}, {}, {}, {}, {}
for j = 1, n do
  local b = 3 + (j - 1) * 5
  local first = seen[ARGV[b + 1]]
  if first then
    dups[#dups + 1] = {j, first}
  elseif marks[j] then
    out[j] = marks[j]
  else
    local h = prefix .. 'ledger:' .. ARGV[b + 3]
    local f = ARGV[b + 4]
    sums[h] = sums[h] or {}
    sums[h][f] = (sums[h][f] or 0) + tonumber(ARGV[b + 5])
    seen[ARGV[b + 1]] = j
    new[#new + 1] = j
    out[j] = ''
  end
end
local refused = {}
for h, fields in pairs(sums) do
  for f, x in pairs(fields) do
    local r = redis.pcall('HINCRBY', h, f, string.format('%.0f', x))
    if type(r) == 'table' and r.err then
      local e = r.err
      if string.find(e, '^ERR increment or decrement would overflow') or
         string.find(e, '^ERR hash value is not an integer') or
         string.find(e, '^WRONGTYPE') then
        refused[h .. '\0' .. f] = e
      else
        return redis.error_reply(e)
      end
    end
  end
end
local applied = 0
for _, j in ipairs(new) do
  local b = 3 + (j - 1) * 5
  local err = refused[prefix .. 'ledger:' .. ARGV[b + 3] .. '\0' .. ARGV[b + 4]]
  if err then
    out[j] = 'reject:' .. err
  else
    redis.call('SET', keys[j], 'done:' .. ARGV[b + 2], 'EX', ttl)
    applied = applied + 1
  end
end
if applied > 0 then
  redis.call('INCRBY', prefix .. 'ledger:applied', applied)
end
for _, d in ipairs(dups) do
  local j, first = d[1], d[2]
  if out[first] == '' then
    out[j] = 'done:' .. ARGV[3 + (first - 1) * 5 + 2]
  else
    out[j] = out[first]
  end
end
return out
