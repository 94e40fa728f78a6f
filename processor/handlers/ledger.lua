-- ledger: handler=ledger's effect, run in Redis inside a dedup script.
-- This file holds only the effect function; the store puts it together
-- with its dedup framing at registration (idem_store_effect_register):
-- the global framing (redis/dedup_global.lua: a mark key per identity) or
-- the partition framing (redis/partchunk.lua: dedup.scope=partition), so
-- both apply the same effect. Per record, PER = 5 arguments: identity (the
-- partition framing sends it empty: the chunk's marks carry it; or the identity while a switch from the global layout is honoured), message_id,
-- currency, user_id, amount in minor units.
--
-- effect(first, js): applies the records js (a list of record numbers;
-- record j's arguments are ARGV[first + (j - 1) * PER + 1 ..]). To keep
-- Redis's work per record small, the increments are summed per (currency,
-- user) and applied with one HINCRBY each. An increment Redis refuses
-- because of the record (an overflow, a field or key that holds no
-- integer) applies none of its records: they are returned in `refused`
-- (record number -> error text). Any other refusal (OOM, READONLY,
-- MISCONF, NOREPLICAS, ...) is the server's state, not the record's: the
-- function returns nil and that error, and the framing returns it as the
-- script's reply (an outage). Redis checks those states only before a
-- script's first write, so a script that meets one has written nothing.
-- <prefix>ledger:applied counts the records applied.
local function effect(first, js)
  local prefix = ARGV[1]
  local sums = {}
  for _, j in ipairs(js) do
    local b = first + (j - 1) * PER
    local h = prefix .. 'ledger:' .. ARGV[b + 3]
    local f = ARGV[b + 4]
    sums[h] = sums[h] or {}
    sums[h][f] = (sums[h][f] or 0) + tonumber(ARGV[b + 5])
  end
  local bad = {}
  for h, fields in pairs(sums) do
    for f, x in pairs(fields) do
      local r = redis.pcall('HINCRBY', h, f, string.format('%.0f', x))
      if type(r) == 'table' and r.err then
        local e = r.err
        if string.find(e, '^ERR increment or decrement would overflow') or
           string.find(e, '^ERR hash value is not an integer') or
           string.find(e, '^WRONGTYPE') then
          bad[h .. '\0' .. f] = e
        else
          return nil, e
        end
      end
    end
  end
  local refused, applied = {}, 0
  for _, j in ipairs(js) do
    local b = first + (j - 1) * PER
    local e = bad[prefix .. 'ledger:' .. ARGV[b + 3] .. '\0' .. ARGV[b + 4]]
    if e then
      refused[j] = e
    else
      applied = applied + 1
    end
  end
  if applied > 0 then
    redis.call('INCRBY', prefix .. 'ledger:applied', applied)
  end
  return refused
end
