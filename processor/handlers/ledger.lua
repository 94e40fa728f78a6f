-- ledger: handler=ledger's effect, run in Redis inside a dedup script.
-- This file holds only the effect function; the store puts it together
-- with its dedup framing at registration (idem_store_effect_register):
-- the global framing (redis/dedup_global.lua: a mark key per identity) or
-- the partition framing (redis/partchunk.lua: dedup.scope=partition), so
-- both apply the same effect. The handler gives PER = 5 arguments a
-- record: identity, message_id, then the effect's own three: currency,
-- user_id, amount in minor units. The global framing sends all five; the
-- partition framing only the effect's own (the chunk's marks carry the
-- identity and message id), with the identity before them while a switch
-- from the global layout is honoured.
--
-- effect(base, stride, js, ksuf): applies the records js (a list of record
-- numbers; record j's currency, user and amount are ARGV[base + (j - 1) *
-- stride + 1 .. + 3]). To keep Redis's work per record small, the
-- increments are summed per (currency, user) and applied with one HINCRBY
-- each. An increment Redis refuses because of the record (an overflow, a
-- field or key that holds no integer) applies none of its records: they
-- are returned in `refused` (record number -> error text; the records are
-- looked at again only when some increment was refused). Any other
-- refusal (OOM, READONLY, MISCONF, NOREPLICAS, ...) is the server's state,
-- not the record's: the function returns nil and that error, and the
-- framing returns it as the script's reply (an outage). Redis checks those
-- states only before a script's first write, so a script that meets one
-- has written nothing. <prefix>ledger:applied counts the records applied.
--
-- ksuf: nil on a single Redis; in Redis Cluster mode the partition
-- chunk's hash tag "{<group>:<topic>:<partition>}", which the partition
-- framing passes, so every balance is sharded by partition:
-- <prefix>ledger:<CURRENCY>{...} (and <prefix>ledger:applied{...}); a
-- balance is the sum over its shards (verify sums them). In cluster mode
-- every key is read (EXISTS) before the first write: see partchunk.lua.
local function effect(base, stride, js, ksuf)
  local KSUF = ksuf or ''
  local A = ARGV -- a local: no global lookup per argument
  local prefix = A[1]
  local sums = {} -- currency -> user -> sum
  for i = 1, #js do
    local b = base + (js[i] - 1) * stride
    local cur, f = A[b + 1], A[b + 2]
    local s = sums[cur]
    if not s then
      s = {}
      sums[cur] = s
    end
    s[f] = (s[f] or 0) + tonumber(A[b + 3])
  end
  if KSUF ~= '' then
    for cur in pairs(sums) do
      redis.call('EXISTS', prefix .. 'ledger:' .. cur .. KSUF)
    end
    redis.call('EXISTS', prefix .. 'ledger:applied' .. KSUF)
  end
  local bad
  for cur, fields in pairs(sums) do
    local h = prefix .. 'ledger:' .. cur .. KSUF
    for f, x in pairs(fields) do
      local r = redis.pcall('HINCRBY', h, f, string.format('%.0f', x))
      if type(r) == 'table' and r.err then
        local e = r.err
        if string.find(e, '^ERR increment or decrement would overflow') or
           string.find(e, '^ERR hash value is not an integer') or
           string.find(e, '^WRONGTYPE') then
          bad = bad or {}
          bad[cur .. '\0' .. f] = e
        else
          return nil, e
        end
      end
    end
  end
  local refused, applied = {}, #js
  if bad then
    applied = 0
    for i = 1, #js do
      local j = js[i]
      local b = base + (j - 1) * stride
      local e = bad[A[b + 1] .. '\0' .. A[b + 2]]
      if e then
        refused[j] = e
      else
        applied = applied + 1
      end
    end
  end
  if applied > 0 then
    redis.call('INCRBY', prefix .. 'ledger:applied' .. KSUF, applied)
  end
  return refused
end
