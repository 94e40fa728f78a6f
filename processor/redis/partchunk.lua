-- partchunk: the chunk script of the partition layout (dedup.scope=
-- partition; docs/design.md, "Dedup state layout"). The store prepends
-- `local PER = <n>` and the handler's effect function (handlers/ledger.lua)
-- when redis/partstate.c composes it. One call = the chunks of one or more
-- partitions (a whole request on a single Redis; one partition's, one
-- slot, on Redis Cluster), whose member has already looked every record up
-- in its table of the partition's marks and sends only records it does not
-- hold.
--
-- KEYS = each chunk's partition epoch key (under the partition's hash
-- tag), in chunk order, then the positions hash <prefix>pos:<group>, then
-- LAST the layout key <prefix>layout:<group> (the layout block below).
-- ARGV = prefix, group.id, dedup.ttl.seconds, the window length in
-- seconds, C the number of chunks, the bytes of marks a window key part
-- may hold (dedup.window.key.max); then FIX = 7 per chunk: its partition's
-- key stem "<prefix>st{<group>:<topic>:<partition>}:", the owner epoch,
-- the offset the stored position must hold, the new position value ("" to
-- leave it), the position's field "<topic>:<partition>", its record count
-- n, its n marks as one string (16 B each: 12 B keyed hash of the
-- identity, 4 B digest of the message id; top bit of byte 13 set: "moved",
-- the record left the partition and only its mark is written); then per
-- record, chunk after chunk, the effect's own arguments (PER - 2: the
-- handler's identity and message id are not sent, the marks carry them),
-- preceded by the identity while a switch from the global layout is
-- honoured (see the layout block). The last fixed ARGV, right before the
-- per-record ones, is the layout block's: "1" when the identities are
-- sent.
--
-- Before any write, per chunk: the stored epoch must equal the chunk's
-- (else "FENCED ...": another member owns the partition now) and the stored
-- position's offset the chunk's (else "POSITION ...": Redis lost a tail,
-- or another writer moved it). A refused chunk writes nothing (no effect,
-- no mark, no position); the others go on. Then one effect over the
-- records of every accepted chunk; a record whose effect Redis refused
-- gets a "moved" mark instead of its own, so that a later copy of it (a
-- replay) goes through the global marks. Each chunk's marks are APPENDed
-- to its partition's window key <stem>w<window> (window = floor(TIME /
-- window length), one TIME per call), which expires at the window's end
-- plus the TTL (EXPIREAT set when the APPEND created it), and the new
-- positions are written with one HSET. A window key holds at most the
-- cap's whole marks (Redis cannot write a string past proto-max-bulk-len,
-- 512 MB, and a failed APPEND after the effect would leave the effect
-- without its marks): the marks past it go to the part keys
-- <stem>w<window>.1, .2, ... (same tag, same EXPIREAT), which the loader
-- reads until one is missing. Where each chunk's marks go is decided
-- before any write, from STRLEN of the parts (a part key that cannot take
-- an APPEND, of another type, fails the call there, with nothing
-- written). Reply: the window, then per chunk
-- its status ("" accepted, else the refusal's text), then a pair per
-- record of an accepted chunk that was not simply applied: its number in
-- the call (from 1) and "moved" (a moved mark written, no effect) or
-- "reject:<error>" (the effect refused it; a moved mark written) or
-- "global:<mark>" (applied under the global layout: not applied again,
-- its partition mark written).
--
-- Layout block (redis/layout.h): chunks run only under the partition
-- layout (else error "LAYOUT ...", nothing written: the member reads the
-- key again and routes the records again). For one TTL after a switch from
-- global, a record whose global mark <prefix>dedup:<group>:<identity>
-- exists was applied under the global layout: it is answered
-- "global:<mark>", not applied, and still gets its partition mark; the
-- member must then send the identities, else LAYOUT.
--
-- Redis Cluster mode (flag "c"; docs/design.md, "Redis Cluster mode"): a
-- call carries one partition's chunk, and every key it touches is under
-- that partition's tag: the positions hash is <prefix>pos{<tag>}, the
-- layout key's place holds a key of the slot that is never read (cluster
-- mode runs the partition layout, fixed), and the ledger's keys get the
-- tag as a suffix (the effect's ksuf, handlers/ledger.lua). The window key's parts and
-- the ledger's keys are not declared in KEYS, so they are read before the
-- first write (the parts' STRLEN that finds the open one, the ledger's
-- EXISTS): on a node whose slot is being migrated away a key
-- already moved fails that read, and the script stops with nothing
-- written (the member's client waits out ASK rather than following it,
-- so a script never runs on the importing node while keys of its slot
-- are still on the old one).
local ttl, W, C = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local CAP = tonumber(ARGV[6])
CAP = CAP - CAP % 16 -- whole marks per part
local HEAD, FIX = 6, 7
local FIRST = HEAD + C * FIX + 1 -- ARGV[FIRST]: the layout block's flag
-- Arguments per record: the effect's own, after the identity if sent.
local IDS = ARGV[FIRST] == '1' and 1 or 0
local CL = ARGV[FIRST] == 'c' -- Redis Cluster mode: see the header
local RPER = PER - 2 + IDS
local SLICE = 512 -- keys per MGET/HMGET, values per HSET (Lua's stack)

-- The replies of cmd (MGET, HMGET: one value per x) over the list xs in
-- slices, as one table; key, if any, goes first in each.
local function sliced(cmd, key, xs)
  local out = {}
  for i = 1, #xs, SLICE do
    local part
    if key then
      part = redis.call(cmd, key, unpack(xs, i, math.min(i + SLICE - 1, #xs)))
    else
      part = redis.call(cmd, unpack(xs, i, math.min(i + SLICE - 1, #xs)))
    end
    for q = 1, #part do
      out[#out + 1] = part[q]
    end
  end
  return out
end

local now = tonumber(redis.call('TIME')[1])
-- Layout block: see the header.
local honour = false
if not CL then
  local lay = redis.call('HMGET', KEYS[C + 2], 'layout', 'since', 'from')
  if lay[1] ~= 'partition' then
    return redis.error_reply('LAYOUT redis runs ' .. (lay[1] or 'global') ..
                             ', the chunk partition')
  end
  honour = (lay[3] or 'global') ~= 'partition' and
           now < (tonumber(lay[2]) or 0) + ttl
end
if honour and ARGV[FIRST] ~= '1' then
  return redis.error_reply('LAYOUT switched from global within the TTL, ' ..
                           'the chunk carries no identities')
end

local keys, fields = {}, {}
for c = 1, C do
  keys[c] = KEYS[c]
  fields[c] = ARGV[HEAD + (c - 1) * FIX + 5]
end
local epochs = sliced('MGET', nil, keys)
local posv = sliced('HMGET', KEYS[C + 1], fields)
local status, js, notes = {}, {}, {}
local j, nj, byte = 0, 0, string.byte
local w = math.floor(now / W)
local at = (w + 1) * W + ttl
-- The open part of each partition's window key: fill[stem] = {part, its
-- length}, from STRLEN before any write (see the header): the last part
-- (parts are never empty, so the first missing one ends them), or the
-- next when the last is full. No part follows the open one, so the parts
-- a call creates start empty, even after dedup.window.key.max changed.
local fill = {}
local function part_key(st, k)
  return st .. 'w' .. w .. (k > 0 and ('.' .. k) or '')
end
local function open_part(st)
  if not fill[st] then
    local k = 0
    local len = redis.call('STRLEN', part_key(st, 0))
    while len > 0 do
      local nxt = redis.call('STRLEN', part_key(st, k + 1))
      if nxt == 0 then
        break
      end
      k, len = k + 1, nxt
    end
    if len >= CAP then
      k, len = k + 1, 0
    end
    fill[st] = {k, len}
  end
end
for c = 1, C do
  local a = HEAD + (c - 1) * FIX
  local epoch, expect, n = ARGV[a + 2], ARGV[a + 3], tonumber(ARGV[a + 6])
  local marks = ARGV[a + 7]
  if #marks ~= 16 * n then
    return redis.error_reply('ERR partition chunk ' .. c .. ': ' .. #marks ..
                             ' bytes of marks for ' .. n .. ' records')
  end
  local cur, p = epochs[c], posv[c]
  local off = p and string.match(p, '^%-?%d+')
  if cur ~= epoch then
    status[c] = 'FENCED owner epoch ' .. (cur or 'none') ..
                ', chunk of epoch ' .. epoch
  elseif off ~= expect then
    status[c] = 'POSITION redis holds ' .. (off or 'none') ..
                ', chunk starts at ' .. expect
  else
    status[c] = ''
    if n > 0 then
      open_part(ARGV[a + 1])
    end
    for q = 1, n do
      if byte(marks, q * 16 - 3) >= 128 then
        notes[#notes + 1] = j + q
        notes[#notes + 1] = 'moved'
      else
        nj = nj + 1
        js[nj] = j + q
      end
    end
  end
  j = j + n
end
if honour and #js > 0 then -- layout block: marks of the global layout
  local gk = {}
  for i = 1, #js do
    gk[i] = ARGV[1] .. 'dedup:' .. ARGV[2] .. ':' ..
            ARGV[FIRST + (js[i] - 1) * RPER + 1]
  end
  local gdone, rest = sliced('MGET', nil, gk), {}
  for i = 1, #js do
    if gdone[i] then
      notes[#notes + 1] = js[i]
      notes[#notes + 1] = 'global:' .. gdone[i]
    else
      rest[#rest + 1] = js[i]
    end
  end
  js = rest
end
-- Cluster mode: the effect's keys under the partition's tag.
local refused, err = effect(FIRST + IDS, RPER, js,
                            CL and string.match(ARGV[HEAD + 1], '{.*}') or nil)
if not refused then
  return redis.error_reply(err)
end
local any_refused = next(refused) ~= nil
-- Appends blob to stem st's window parts from the open one on, each part
-- taking at most CAP bytes; EXPIREAT on the parts it creates.
local function append(st, blob)
  local f, from = fill[st], 1
  while from <= #blob do
    if f[2] >= CAP then
      f[1], f[2] = f[1] + 1, 0
    end
    local piece = string.sub(blob, from, from + CAP - f[2] - 1)
    local k = part_key(st, f[1])
    if redis.call('APPEND', k, piece) == #piece then
      redis.call('EXPIREAT', k, at)
    end
    f[2] = f[2] + #piece
    from = from + #piece
  end
end
local pos = {}
j = 0
for c = 1, C do
  local a = HEAD + (c - 1) * FIX
  local n = tonumber(ARGV[a + 6])
  if status[c] == '' then
    local blob = ARGV[a + 7]
    if any_refused then
      local marks = {}
      for q = 1, n do
        local m = string.sub(blob, q * 16 - 15, q * 16)
        if refused[j + q] then
          notes[#notes + 1] = j + q
          notes[#notes + 1] = 'reject:' .. refused[j + q]
          m = string.sub(m, 1, 12) .. '\128\0\0\0'
        end
        marks[q] = m
      end
      blob = table.concat(marks)
    end
    if n > 0 then
      append(ARGV[a + 1], blob)
    end
    if ARGV[a + 4] ~= '' then
      pos[#pos + 1] = fields[c]
      pos[#pos + 1] = ARGV[a + 4]
    end
  end
  j = j + n
end
for i = 1, #pos, SLICE do -- SLICE is even: field and value stay together
  redis.call('HSET', KEYS[C + 1], unpack(pos, i, math.min(i + SLICE - 1, #pos)))
end
local reply = {w}
for c = 1, C do
  reply[c + 1] = status[c]
end
for i = 1, #notes do
  reply[C + 1 + i] = notes[i]
end
return reply
