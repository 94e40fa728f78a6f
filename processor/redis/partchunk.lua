-- partchunk: the chunk script of the partition layout (dedup.scope=
-- partition; docs/design.md, "Dedup state layout"). The store prepends
-- `local PER = <n>` and the handler's effect function (handlers/ledger.lua)
-- when redis/partstate.c composes it. One call = one chunk of one
-- partition, whose member has already looked every record up in its table
-- of the partition's marks and sends only records it does not hold.
--
-- KEYS = the partition's epoch, index and sequence (under the partition's
-- hash tag) and the positions hash <prefix>pos:<group>; LAST, the layout
-- key <prefix>layout:<group> (the layout block below).
-- ARGV = prefix, group.id, dedup.ttl.seconds, the chunk keys' name stem
-- "<prefix>st{<group>:<topic>:<partition>}:", the owner epoch, the offset
-- the stored position must hold, the new position value ("" to leave it),
-- the window length in seconds, the position's field "<topic>:<partition>";
-- LAST of the fixed ones, "1" when the message-id slots carry identities
-- (the layout block); then PER per record: its 16-byte mark (12 B keyed hash of the identity,
-- 4 B digest of the message id; top bit of byte 13 set: "moved", the
-- record left the partition and only the mark is written), the message id
-- (sent empty: the mark carries its digest; the identity while a switch
-- from the global layout is younger than the TTL), the effect's own
-- arguments.
--
-- Before any write: the stored epoch must equal the chunk's (else error
-- FENCED: another member owns the partition now) and the stored position's
-- offset the chunk's (else error POSITION: Redis lost a tail, or another
-- writer moved it). Then the effect; a record whose effect Redis refused
-- gets a "moved" mark instead of its own, so that a later copy of it (a
-- replay) goes through the global marks. The chunk's marks are one string
-- key <stem>w<window>:<seq> (window = floor(TIME / window length)),
-- expiring at the window's end plus the TTL, appended to the index (whose
-- expired head is trimmed), and the new position is written. Reply: the
-- window, then one string per record: "" applied, "moved" (a moved mark
-- written), "reject:<error>" (refused; a moved mark written),
-- "global:<mark>" (applied under the global layout: not applied again,
-- its mark written).
local ttl, stem, epoch = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local expect, newpos, W, field = ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9]
local FIRST = 10
local cur = redis.call('GET', KEYS[1])
if cur ~= epoch then
  return redis.error_reply('FENCED owner epoch ' .. (cur or 'none') ..
                           ', chunk of epoch ' .. epoch)
end
local p = redis.call('HGET', KEYS[4], field)
local off = p and string.match(p, '^%-?%d+')
if off ~= expect then
  return redis.error_reply('POSITION redis holds ' .. (off or 'none') ..
                           ', chunk starts at ' .. expect)
end
local n = (#ARGV - FIRST) / PER
-- Layout block (redis/layout.h): chunks only under the partition layout
-- (error LAYOUT otherwise, nothing written: the member reads the key again
-- and routes the records again). For one TTL after a switch from global,
-- a record whose global mark <prefix>dedup:<group>:<identity> exists was
-- applied under the global layout: it is answered "global:<mark>", not
-- applied, and still gets its partition mark. The member must then send
-- the identities (ARGV[FIRST] = "1"), else LAYOUT.
local lay = redis.call('HMGET', KEYS[#KEYS], 'layout', 'since', 'from')
if lay[1] ~= 'partition' then
  return redis.error_reply('LAYOUT redis runs ' .. (lay[1] or 'global') ..
                           ', the chunk partition')
end
local gdone = {}
if (lay[3] or 'global') ~= 'partition' and n > 0 and
    tonumber(redis.call('TIME')[1]) < (tonumber(lay[2]) or 0) + ttl then
  if ARGV[FIRST] ~= '1' then
    return redis.error_reply('LAYOUT switched from global within the TTL, ' ..
                             'the chunk carries no identities')
  end
  local gk = {}
  for j = 1, n do
    gk[j] = ARGV[1] .. 'dedup:' .. ARGV[2] .. ':' ..
            ARGV[FIRST + (j - 1) * PER + 2]
  end
  gdone = redis.call('MGET', unpack(gk))
end
local out, js = {}, {}
for j = 1, n do
  if string.byte(ARGV[FIRST + (j - 1) * PER + 1], 13) >= 128 then
    out[j] = 'moved'
  elseif gdone[j] then
    out[j] = 'global:' .. gdone[j]
  else
    js[#js + 1] = j
    out[j] = ''
  end
end
local refused, err = effect(FIRST, js)
if not refused then
  return redis.error_reply(err)
end
local now = tonumber(redis.call('TIME')[1])
local w = math.floor(now / W)
if n > 0 then
  local marks = {}
  for j = 1, n do
    local m = ARGV[FIRST + (j - 1) * PER + 1]
    if refused[j] then
      out[j] = 'reject:' .. refused[j]
      m = string.sub(m, 1, 12) .. '\128\0\0\0'
    end
    marks[j] = m
  end
  local k = stem .. 'w' .. w .. ':' .. redis.call('INCR', KEYS[3])
  redis.call('SET', k, table.concat(marks), 'EXAT', (w + 1) * W + ttl)
  redis.call('RPUSH', KEYS[2], k)
end
while true do
  local h = redis.call('LINDEX', KEYS[2], 0)
  local hw = h and tonumber(string.match(h, ':w(%d+):%d+$'))
  if not hw or (hw + 1) * W + ttl > now then
    break
  end
  redis.call('LPOP', KEYS[2])
end
if newpos ~= '' then
  redis.call('HSET', KEYS[4], field, newpos)
end
table.insert(out, 1, w)
return out
