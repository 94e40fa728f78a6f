/* luascript: the user's Lua effect of handler=script: reading and
 * checking script.file, composing it into the dedup script, and one
 * record's arguments (docs/design.md, "The script handler"). */
#include "handlers/luascript.h"

#include "input/envelope.h"
#include "base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

/* The dedup script is: one line naming the file and how many lines come
 * before it (for error messages), DRIVER_HEAD, the user's file unchanged,
 * DRIVER_TAIL. So `function effect(rec)` assigns the local `effect`
 * declared here (Redis forbids creating globals), and `redis` inside the
 * user's file is a local proxy of the real one.
 *
 * The proxy runs every command with the real redis.pcall and remembers
 * the first error about the server's state (OOM, READONLY, MISCONF, ...,
 * the classes of idem_store_error_class). Such an error is an outage, not
 * the record's fault: even if the effect catches it, the script ends
 * with that error reply, which the store treats as an outage. Every other
 * error of a command is raised in the effect (redis.call) or returned to
 * it (redis.pcall), as Redis does. A reply is looked at only when it is
 * an error table: a successful call costs one type() more than Redis's.
 *
 * ARGV: prefix, group, dedup.ttl.seconds, then idemproc_stride arguments
 * per record (idem_luascript_args: IDEM_LUASCRIPT_REC_ARGS, i.e.
 * identity, message id, topic, "<key?><value?><partition>:<offset>:
 * <timestamp>", key, value, headers; then with script.fields the fields'
 * types and one argument per field). Per
 * record, in order: a done mark from before this call or a lease is
 * returned as found, a repeat of an identity accepted earlier in the call
 * is its duplicate; otherwise effect(rec) runs. A rejection is
 * "reject:<reason>", a runtime error "reject:lua error: FILE:LINE: ...";
 * neither gets a mark, plain redis.call writes the effect made before
 * stay (Redis has no rollback), and its staged idem.* increments are
 * dropped. After the last record, the chunk's idem.* sums are written
 * (one command per counter), then the done mark "done:<message_id>" of
 * each accepted record with the TTL, and "" is returned for it: marks
 * and increments together, or on an outage neither (docs/design.md,
 * "Aggregated writes"). Texts are cut at 500 bytes.
 *
 * A plain write (a redis.call/redis.pcall of a command not in
 * idemproc_ro) makes the rest of the chunk eager (idemproc_enter): before
 * the first one, the earlier records' sums and marks are written (the
 * current record's staged increments are taken out and staged again
 * after), and from then on each accepted record's sums and mark are
 * written right after its effect (idemproc_commit). So an outage in a
 * later record never makes the retry repeat an earlier record's plain
 * writes (docs/design.md, "Plain writes make the chunk eager").
 *
 * `rec` is built lazily: an empty table whose metatable reads a member
 * from the record's arguments on first use and keeps it (rawset), so an
 * effect pays only for what it reads (headers are unpacked, numbers
 * converted, fields built only then). Measured in Redis (valgrind
 * instruction counts, 1000-record calls): building every member eagerly
 * cost about as much as the ledger's whole script per record. The record
 * a table stands for is in idemproc_base (per call; the script's locals
 * live one EVALSHA). The exception is rec.fields, built with rec when
 * script.fields is set (whoever lists fields reads them), as one table
 * constructor generated for the list (idemproc_fields_new, on the first
 * line), so neither table grows member by member. */
static const char driver_head[] =
    "local idemproc_redis, idemproc_argv, idemproc_outage = redis, ARGV\n"
    "local idemproc_j, idemproc_eager, idemproc_enter, idemproc_ksuf\n"
    "local idemproc_ro = {}\n"
    "for _, c in ipairs({'GET', 'MGET', 'STRLEN', 'GETRANGE', 'SUBSTR', "
    "'GETBIT',\n"
    "  'BITCOUNT', 'BITPOS', 'BITFIELD_RO', 'LCS', 'HGET', 'HMGET', "
    "'HGETALL',\n"
    "  'HKEYS', 'HVALS', 'HEXISTS', 'HLEN', 'HSTRLEN', 'HRANDFIELD', 'HSCAN',\n"
    "  'EXISTS', 'TYPE', 'TTL', 'PTTL', 'EXPIRETIME', 'PEXPIRETIME', "
    "'SISMEMBER',\n"
    "  'SMISMEMBER', 'SMEMBERS', 'SCARD', 'SRANDMEMBER', 'SSCAN', 'SINTER',\n"
    "  'SUNION', 'SDIFF', 'SINTERCARD', 'ZSCORE', 'ZMSCORE', 'ZCARD', "
    "'ZCOUNT',\n"
    "  'ZLEXCOUNT', 'ZRANK', 'ZREVRANK', 'ZRANGE', 'ZRANGEBYSCORE', "
    "'ZREVRANGE',\n"
    "  'ZREVRANGEBYSCORE', 'ZRANGEBYLEX', 'ZREVRANGEBYLEX', 'ZRANDMEMBER',\n"
    "  'ZSCAN', 'ZINTER', 'ZUNION', 'ZDIFF', 'ZINTERCARD', 'LRANGE', "
    "'LINDEX',\n"
    "  'LLEN', 'LPOS', 'XRANGE', 'XREVRANGE', 'XLEN', 'GEOPOS', 'GEODIST',\n"
    "  'GEOHASH', 'GEOSEARCH', 'GEORADIUS_RO', 'GEORADIUSBYMEMBER_RO', "
    "'SORT_RO',\n"
    "  'PING', 'ECHO', 'TIME'}) do\n"
    "  idemproc_ro[c] = true\n"
    "  idemproc_ro[string.lower(c)] = true\n"
    "end\n"
    "local idemproc_server = {OOM = 1, READONLY = 1, MISCONF = 1,\n"
    "  NOREPLICAS = 1, LOADING = 1, BUSY = 1, MASTERDOWN = 1, NOAUTH = 1,\n"
    "  WRONGPASS = 1, NOPERM = 1, NOSCRIPT = 1}\n"
    "local function idemproc_failed(r, key)\n"
    "  if type(r.err) ~= 'string' then return false end\n"
    "  local code = string.match(r.err, '^(%S+)')\n"
    "  if string.find(r.err, \"^ERR The user executing the script can't\") "
    "then\n"
    "    code = 'NOPERM'\n"
    "  end\n"
    "  if idemproc_ksuf and (string.find(r.err, 'non local key', 1, true) or\n"
    "    string.find(r.err, 'same slot', 1, true) or\n"
    "    string.find(r.err, 'cluster is down', 1, true)) then\n"
    "    if string.find(r.err, 'cluster is down', 1, true) or\n"
    "      (type(key) == 'string' and string.find(key, idemproc_ksuf, 1, "
    "true)) then\n"
    "      code = 'CLUSTERDOWN'\n"
    "    else\n"
    "      r.err = r.err .. ': key ' .. string.format('%q', tostring(key))\n"
    "        .. ' is not under the partition\\'s hash tag ' .. idemproc_ksuf\n"
    "        .. ' (Redis Cluster mode: name it idem.key(name))'\n"
    "    end\n"
    "  end\n"
    "  if code and (idemproc_server[code] or code == 'CLUSTERDOWN') and\n"
    "    not idemproc_outage then\n"
    "    idemproc_outage = r.err\n"
    "  end\n"
    "  return true\n"
    "end\n"
    "local redis = setmetatable({\n"
    "  call = function(c, ...)\n"
    "    if idemproc_j and not idemproc_eager and not idemproc_ro[c] and\n"
    "      not (type(c) == 'string' and idemproc_ro[string.upper(c)]) then\n"
    "      idemproc_enter()\n"
    "    end\n"
    "    local r = idemproc_redis.pcall(c, ...)\n"
    "    if type(r) == 'table' and r.err and idemproc_failed(r, (...)) then\n"
    "      error(r.err, 2)\n"
    "    end\n"
    "    return r\n"
    "  end,\n"
    "  pcall = function(c, ...)\n"
    "    if idemproc_j and not idemproc_eager and not idemproc_ro[c] and\n"
    "      not (type(c) == 'string' and idemproc_ro[string.upper(c)]) then\n"
    "      idemproc_enter()\n"
    "    end\n"
    "    local r = idemproc_redis.pcall(c, ...)\n"
    "    if type(r) == 'table' and r.err then idemproc_failed(r, (...)) end\n"
    "    return r\n"
    "  end}, {__index = idemproc_redis})\n"
    "local ARGV, KEYS, effect\n"
    "local function idemproc_text(x, default, what)\n"
    "  if type(x) == 'table' and type(x.err) == 'string' then x = x.err end\n"
    "  if x == nil then x = default end\n"
    "  if what and type(x) ~= 'string' and type(x) ~= 'number' then\n"
    "    return what .. ' (' .. type(x) .. ')'\n"
    "  end\n"
    "  x = string.gsub(tostring(x), 'user_script:(%d+):', function(n)\n"
    "    n = tonumber(n) - idemproc_head\n"
    "    if n < 1 then return 'user_script:' .. (n + idemproc_head) .. ':' "
    "end\n"
    "    return idemproc_file .. ':' .. n .. ':'\n"
    "  end)\n"
    "  return x\n"
    "end\n"
    "local function idemproc_headers(s)\n"
    "  local h, i = {}, 1\n"
    "  while i <= #s do\n"
    "    local c = string.find(s, ':', i, true)\n"
    "    local name = string.sub(s, c + 1, c + tonumber(string.sub(s, i, c - "
    "1)))\n"
    "    i = c + #name + 1\n"
    "    c = string.find(s, ':', i, true)\n"
    "    local vl = string.sub(s, i, c - 1)\n"
    "    if vl == '-' then\n"
    "      h[name] = false\n"
    "      i = c + 1\n"
    "    else\n"
    "      h[name] = string.sub(s, c + 1, c + tonumber(vl))\n"
    "      i = c + tonumber(vl) + 1\n"
    "    end\n"
    "  end\n"
    "  return h\n"
    "end\n"
    "local idemproc_nfields, idemproc_declared = #idemproc_fields, {}\n"
    "local idemproc_stride = idemproc_nfields > 0 and 8 + idemproc_nfields\n"
    "  or 7\n"
    "for _, p in ipairs(idemproc_fields) do idemproc_declared[p] = true end\n"
    "local idemproc_fieldmeta = {__index = function(_, k)\n"
    "  if idemproc_declared[k] then return nil end\n"
    "  error(string.format('rec.fields[%q]: not in script.fields (%s)',\n"
    "    tostring(k), table.concat(idemproc_fields, ',')), 2)\n"
    "end}\n"
    "local function idemproc_conv(t, x)\n"
    "  if t == 115 then return x end\n"
    "  if t == 110 then return tonumber(x) end\n"
    "  if t == 116 then return true end\n"
    "  if t == 102 then return false end\n"
    "  if t == 122 then return cjson.null end\n"
    "  if t == 106 then return cjson.decode(x) end\n"
    "end\n"
    "local idemproc_get = {\n"
    "  identity = function(a, b) return a[b] end,\n"
    "  message_id = function(a, b)\n"
    "    local m = a[b + 1]\n"
    "    if m ~= '' then return m end\n"
    "  end,\n"
    "  topic = function(a, b) return a[b + 2] end,\n"
    "  partition = function(a, b)\n"
    "    return tonumber(string.match(a[b + 3], '^..([^:]*)'))\n"
    "  end,\n"
    "  offset = function(a, b)\n"
    "    return tonumber(string.match(a[b + 3], '^..[^:]*:([^:]*)'))\n"
    "  end,\n"
    "  timestamp = function(a, b)\n"
    "    local t = string.match(a[b + 3], '([^:]*)$')\n"
    "    if t ~= '-1' then return tonumber(t) end\n"
    "  end,\n"
    "  key = function(a, b)\n"
    "    if string.byte(a[b + 3], 1) == 49 then return a[b + 4] end\n"
    "  end,\n"
    "  value = function(a, b)\n"
    "    if string.byte(a[b + 3], 2) == 49 then return a[b + 5] end\n"
    "  end,\n"
    "  headers = function(a, b)\n"
    "    local s = a[b + 6]\n"
    "    if s == '' then return {} end\n"
    "    return idemproc_headers(s)\n"
    "  end,\n"
    "  fields = function(a, b)\n"
    "    return setmetatable(idemproc_fields_new(a, b, idemproc_conv),\n"
    "      idemproc_fieldmeta)\n"
    "  end}\n"
    "local idemproc_base = {}\n"
    "local idemproc_recmeta = {__index = function(t, k)\n"
    "  local get, b = idemproc_get[k], idemproc_base[t]\n"
    "  if not get or not b then return nil end\n"
    "  local v = get(idemproc_argv, b)\n"
    "  rawset(t, k, v)\n"
    "  return v\n"
    "end}\n"
    "local function idemproc_rec(b)\n"
    "  local t\n"
    "  if idemproc_nfields > 0 then\n"
    "    t = setmetatable({fields = setmetatable(\n"
    "      idemproc_fields_new(idemproc_argv, b, idemproc_conv),\n"
    "      idemproc_fieldmeta)}, idemproc_recmeta)\n"
    "  else\n"
    "    t = setmetatable({}, idemproc_recmeta)\n"
    "  end\n"
    "  idemproc_base[t] = b\n"
    "  return t\n"
    "end\n"
    "local idemproc_log, idemproc_logn, idemproc_from = {}, 0, 0\n"
    "local idemproc_acc, idemproc_rb = {{}, {}, {}, {}}, {{}, {}}\n"
    "local idemproc_max = 9007199254740991\n"
    "local idemproc_cmd = {'HINCRBY', 'INCRBY', 'HINCRBYFLOAT', "
    "'INCRBYFLOAT'}\n"
    "local function idemproc_show(x)\n"
    "  if type(x) == 'string' then return string.format('%q', string.sub(x, 1, "
    "40)) end\n"
    "  return tostring(x)\n"
    "end\n"
    "local function idemproc_where(kind, key, field)\n"
    "  if kind % 2 == 1 then return key .. ' ' .. field end\n"
    "  return key\n"
    "end\n"
    "local function idemproc_check(name, key, field)\n"
    "  if not idemproc_j then\n"
    "    error(name .. ' at the top level of the file: only effect(rec) may '\n"
    "      .. 'use idem', 3)\n"
    "  end\n"
    "  local t = type(key)\n"
    "  if t == 'number' then key = tostring(key)\n"
    "  elseif t ~= 'string' then\n"
    "    error(name .. ': key must be a string, not ' .. t, 3)\n"
    "  end\n"
    "  if idemproc_ksuf then\n"
    "    if string.find(key, '{', 1, true) then\n"
    "      error(name .. ': key ' .. string.format('%q', key) .. ' contains '\n"
    "        .. '\"{\": in Redis Cluster mode the partition\\'s hash tag '\n"
    "        .. idemproc_ksuf .. ' is appended to every key, and Redis '\n"
    "        .. 'would hash this one by its own {...}: another slot', 3)\n"
    "    end\n"
    "    key = key .. idemproc_ksuf\n"
    "  end\n"
    "  t = type(field)\n"
    "  if t == 'number' then field = tostring(field)\n"
    "  elseif t ~= 'string' then\n"
    "    error(name .. ': field must be a string, not ' .. t, 3)\n"
    "  end\n"
    "  return key, field\n"
    "end\n"
    "local function idemproc_int(name, n)\n"
    "  if type(n) == 'string' and (n == '0' or string.find(n, "
    "'^%-?[1-9]%d*$'))\n"
    "  then\n"
    "    n = tonumber(n)\n"
    "  end\n"
    "  if type(n) ~= 'number' or n % 1 ~= 0 then\n"
    "    error(name .. ': increment ' .. idemproc_show(n) .. ' is not an "
    "integer',\n"
    "      3)\n"
    "  end\n"
    "  if n > idemproc_max or n < -idemproc_max then\n"
    "    error(name .. ': increment ' .. string.format('%.0f', n) .. ' is "
    "beyond '\n"
    "      .. '2^53 - 1 (Lua numbers are exact only up to there)', 3)\n"
    "  end\n"
    "  return n\n"
    "end\n"
    "local function idemproc_float(name, x)\n"
    "  if type(x) == 'string' then x = tonumber(x) or x end\n"
    "  if type(x) ~= 'number' or x ~= x or x == math.huge or x == -math.huge "
    "then\n"
    "    error(name .. ': increment ' .. idemproc_show(x) .. ' is not a finite "
    "'\n"
    "      .. 'number', 3)\n"
    "  end\n"
    "  return x\n"
    "end\n"
    "local function idemproc_read(name, g, key, field, lv)\n"
    "  local c = idemproc_rb[g][key]\n"
    "  if not c then c = {}; idemproc_rb[g][key] = c end\n"
    "  local v = c[field]\n"
    "  if v == nil then\n"
    "    local r\n"
    "    if g == 1 then r = idemproc_redis.pcall('HGET', key, field)\n"
    "    else r = idemproc_redis.pcall('GET', key) end\n"
    "    if type(r) == 'table' and r.err then\n"
    "      idemproc_failed(r, key)\n"
    "      error(r.err, lv or 3)\n"
    "    end\n"
    "    v = r\n"
    "    c[field] = v\n"
    "  end\n"
    "  if not v then return nil end\n"
    "  local x = tonumber(v)\n"
    "  if not x then\n"
    "    error(name .. ': ' .. idemproc_where(g, key, field) .. ' holds '\n"
    "      .. idemproc_show(v) .. ', not a number', lv or 3)\n"
    "  end\n"
    "  return x\n"
    "end\n"
    "local function idemproc_stage(name, kind, key, field, n, base, lv)\n"
    "  local byk = idemproc_acc[kind]\n"
    "  local t = byk[key]\n"
    "  if not t then t = {}; byk[key] = t end\n"
    "  local old = t[field]\n"
    "  if old == nil then\n"
    "    local o = idemproc_acc[kind < 3 and kind + 2 or kind - 2][key]\n"
    "    if o and o[field] ~= nil then\n"
    "      error(name .. ': ' .. idemproc_where(kind, key, field) .. ' has '\n"
    "        .. (kind < 3 and 'float' or 'integer') .. ' increments pending in "
    "'\n"
    "        .. 'this chunk: use one kind per counter', lv or 3)\n"
    "    end\n"
    "  end\n"
    "  local v = (old or 0) + n\n"
    "  if kind < 3 then\n"
    "    if v > idemproc_max or v < -idemproc_max then\n"
    "      error(name .. ': the pending increments of ' .. "
    "idemproc_where(kind,\n"
    "        key, field) .. ' add up beyond 2^53 - 1', lv or 3)\n"
    "    end\n"
    "  else\n"
    "    local s = (base or 0) + v\n"
    "    if s ~= s or s == math.huge or s == -math.huge then\n"
    "      error(name .. ': ' .. idemproc_where(kind, key, field) .. ' would "
    "'\n"
    "        .. 'become NaN or infinity', lv or 3)\n"
    "    end\n"
    "  end\n"
    "  t[field] = v\n"
    "  if old == nil then old = false end\n"
    "  local L, i = idemproc_log, idemproc_logn\n"
    "  L[i + 1], L[i + 2], L[i + 3], L[i + 4], L[i + 5], L[i + 6] =\n"
    "    idemproc_j, kind, key, field, n, old\n"
    "  idemproc_logn = i + 6\n"
    "end\n"
    "local function idemproc_pending(g, key, field)\n"
    "  local t = idemproc_acc[g][key]\n"
    "  local d = t and t[field]\n"
    "  if d == nil then\n"
    "    t = idemproc_acc[g + 2][key]\n"
    "    d = t and t[field]\n"
    "  end\n"
    "  return d\n"
    "end\n"
    "local idem = {\n"
    "  hincrby = function(key, field, n)\n"
    "    key, field = idemproc_check('idem.hincrby', key, field)\n"
    "    if type(n) ~= 'number' or n % 1 ~= 0 or n > idemproc_max or\n"
    "      n < -idemproc_max then\n"
    "      n = idemproc_int('idem.hincrby', n)\n"
    "    end\n"
    "    idemproc_stage('idem.hincrby', 1, key, field, n)\n"
    "  end,\n"
    "  incrby = function(key, n)\n"
    "    key = idemproc_check('idem.incrby', key, '')\n"
    "    if type(n) ~= 'number' or n % 1 ~= 0 or n > idemproc_max or\n"
    "      n < -idemproc_max then\n"
    "      n = idemproc_int('idem.incrby', n)\n"
    "    end\n"
    "    idemproc_stage('idem.incrby', 2, key, true, n)\n"
    "  end,\n"
    "  hincrbyfloat = function(key, field, x)\n"
    "    key, field = idemproc_check('idem.hincrbyfloat', key, field)\n"
    "    x = idemproc_float('idem.hincrbyfloat', x)\n"
    "    idemproc_stage('idem.hincrbyfloat', 3, key, field, x,\n"
    "      idemproc_read('idem.hincrbyfloat', 1, key, field))\n"
    "  end,\n"
    "  incrbyfloat = function(key, x)\n"
    "    key = idemproc_check('idem.incrbyfloat', key, '')\n"
    "    x = idemproc_float('idem.incrbyfloat', x)\n"
    "    idemproc_stage('idem.incrbyfloat', 4, key, true, x,\n"
    "      idemproc_read('idem.incrbyfloat', 2, key, true))\n"
    "  end,\n"
    "  hget = function(key, field)\n"
    "    key, field = idemproc_check('idem.hget', key, field)\n"
    "    local b = idemproc_read('idem.hget', 1, key, field)\n"
    "    local d = idemproc_pending(1, key, field)\n"
    "    if b == nil and d == nil then return nil end\n"
    "    return (b or 0) + (d or 0)\n"
    "  end,\n"
    "  get = function(key)\n"
    "    key = idemproc_check('idem.get', key, '')\n"
    "    local b = idemproc_read('idem.get', 2, key, true)\n"
    "    local d = idemproc_pending(2, key, true)\n"
    "    if b == nil and d == nil then return nil end\n"
    "    return (b or 0) + (d or 0)\n"
    "  end,\n"
    "  key = function(name)\n"
    "    return (idemproc_check('idem.key', name, ''))\n"
    "  end}\n"
    "local function idemproc_drop(from)\n"
    "  local L, acc = idemproc_log, idemproc_acc\n"
    "  for i = idemproc_logn - 6, from, -6 do\n"
    "    local old = L[i + 6]\n"
    "    if old == false then old = nil end\n"
    "    acc[L[i + 2]][L[i + 3]][L[i + 4]] = old\n"
    "  end\n"
    "  idemproc_logn = from\n"
    "end\n"
    "local function idemproc_write(kind, key, field, d)\n"
    "  local x = string.format(kind < 3 and '%.0f' or '%.17g', d)\n"
    "  if kind % 2 == 1 then\n"
    "    return idemproc_redis.pcall(idemproc_cmd[kind], key, field, x)\n"
    "  end\n"
    "  return idemproc_redis.pcall(idemproc_cmd[kind], key, x)\n"
    "end\n"
    "local function idemproc_undo(done, nd)\n"
    "  local pcall_ = idemproc_redis.pcall\n"
    "  for i = nd - 3, 1, -4 do\n"
    "    local kind, key, field, d = done[i], done[i + 1], done[i + 2], done[i "
    "+ 3]\n"
    "    if kind < 3 then\n"
    "      idemproc_write(kind, key, field, -d)\n"
    "    else\n"
    "      local b = idemproc_rb[kind - 2][key][field]\n"
    "      if kind == 3 and b then pcall_('HSET', key, field, b)\n"
    "      elseif kind == 3 then pcall_('HDEL', key, field)\n"
    "      elseif b then\n"
    "        local ttl = pcall_('PTTL', key)\n"
    "        pcall_('SET', key, b)\n"
    "        if type(ttl) == 'number' and ttl > 0 then\n"
    "          pcall_('PEXPIRE', key, ttl)\n"
    "        end\n"
    "      else pcall_('DEL', key) end\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local function idemproc_flush(out)\n"
    "  while true do\n"
    "    local done, nd, refused = {}, 0, nil\n"
    "    for kind = 1, 4 do\n"
    "      for key, t in pairs(idemproc_acc[kind]) do\n"
    "        for field, d in pairs(t) do\n"
    "          local r = idemproc_write(kind, key, field, d)\n"
    "          if type(r) == 'table' and r.err then\n"
    "            idemproc_failed(r, key)\n"
    "            if idemproc_outage then\n"
    "              idemproc_undo(done, nd)\n"
    "              return idemproc_redis.error_reply(idemproc_outage)\n"
    "            end\n"
    "            refused = refused or {}\n"
    "            refused[#refused + 1] = {kind, key, field, r.err}\n"
    "          else\n"
    "            done[nd + 1], done[nd + 2], done[nd + 3], done[nd + 4] =\n"
    "              kind, key, field, d\n"
    "            nd = nd + 4\n"
    "          end\n"
    "        end\n"
    "      end\n"
    "    end\n"
    "    if not refused then return nil, done, nd end\n"
    "    idemproc_undo(done, nd)\n"
    "    local L, bad = idemproc_log, {}\n"
    "    for _, x in ipairs(refused) do\n"
    "      local why = 'reject:' .. string.sub(idemproc_cmd[x[1]] .. ' ' ..\n"
    "        idemproc_where(x[1], x[2], x[3]) .. ': ' .. x[4], 1, 500)\n"
    "      for i = 0, idemproc_logn - 6, 6 do\n"
    "        if L[i + 2] == x[1] and L[i + 3] == x[2] and L[i + 4] == x[3] "
    "and\n"
    "          not bad[L[i + 1]] then\n"
    "          bad[L[i + 1]] = true\n"
    "          out[L[i + 1]] = why\n"
    "        end\n"
    "      end\n"
    "    end\n"
    "    idemproc_acc = {{}, {}, {}, {}}\n"
    "    local n = 0\n"
    "    for i = 0, idemproc_logn - 6, 6 do\n"
    "      if not bad[L[i + 1]] then\n"
    "        local kind, key, field = L[i + 2], L[i + 3], L[i + 4]\n"
    "        local t = idemproc_acc[kind][key]\n"
    "        if not t then t = {}; idemproc_acc[kind][key] = t end\n"
    "        t[field] = (t[field] or 0) + L[i + 5]\n"
    "        for k = 1, 6 do L[n + k] = L[i + k] end\n"
    "        n = n + 6\n"
    "      end\n"
    "    end\n"
    "    idemproc_logn = n\n"
    "  end\n"
    "end\n"
    "local idemproc_keys, idemproc_out, idemproc_pend, idemproc_npend =\n"
    "  nil, nil, {}, 0\n"
    "local function idemproc_commit()\n"
    "  local out = idemproc_out\n"
    "  local failed, done, ndone = idemproc_flush(out)\n"
    "  if failed then return true end\n"
    "  local argv, P, keys = idemproc_argv, idemproc_pend, idemproc_keys\n"
    "  for k = 1, idemproc_npend do\n"
    "    local j = P[k]\n"
    "    if out[j] == '' then\n"
    "      local r = idemproc_redis.pcall('SET', keys[j], 'done:' ..\n"
    "        argv[4 + (j - 1) * idemproc_stride + 1], 'EX', argv[3])\n"
    "      if type(r) == 'table' and r.err then\n"
    "        idemproc_failed(r)\n"
    "        idemproc_undo(done, ndone)\n"
    "        for m = 1, k - 1 do\n"
    "          if out[P[m]] == '' then\n"
    "            idemproc_redis.pcall('DEL', keys[P[m]])\n"
    "          end\n"
    "        end\n"
    "        idemproc_outage = idemproc_outage or r.err\n"
    "        return true\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  idemproc_npend = 0\n"
    "  if ndone > 0 or idemproc_logn > 0 then\n"
    "    idemproc_acc, idemproc_rb = {{}, {}, {}, {}}, {{}, {}}\n"
    "    idemproc_logn = 0\n"
    "  end\n"
    "  return false\n"
    "end\n"
    "local idemproc_names = {'idem.hincrby', 'idem.incrby', "
    "'idem.hincrbyfloat',\n"
    "  'idem.incrbyfloat'}\n"
    "idemproc_enter = function()\n"
    "  idemproc_eager = true\n"
    "  local L, from, saved, ns = idemproc_log, idemproc_from, {}, 0\n"
    "  for i = from + 1, idemproc_logn do ns = ns + 1; saved[ns] = L[i] end\n"
    "  idemproc_drop(from)\n"
    "  if idemproc_commit() then error(idemproc_outage, 3) end\n"
    "  idemproc_from = 0\n"
    "  for i = 0, ns - 6, 6 do\n"
    "    local kind, key, field = saved[i + 2], saved[i + 3], saved[i + 4]\n"
    "    local base\n"
    "    if kind > 2 then\n"
    "      base = idemproc_read(idemproc_names[kind], kind - 2, key, field, "
    "4)\n"
    "    end\n"
    "    idemproc_stage(idemproc_names[kind], kind, key, field, saved[i + 5],\n"
    "      base, 4)\n"
    "  end\n"
    "end\n"
    "local function idemproc_run(eff)\n"
    "  local argv = idemproc_argv\n"
    "  if type(eff) ~= 'function' then\n"
    "    return idemproc_redis.error_reply(\n"
    "      'ERR script.file defines no function effect(rec)')\n"
    "  end\n"
    "  local prefix, group = argv[1], argv[2]\n"
    "  local keys, n = {}, 0\n"
    "  for b = 4, #argv, idemproc_stride do\n"
    "    n = n + 1\n"
    "    keys[n] = prefix .. 'dedup:' .. group .. ':' .. argv[b]\n"
    "  end\n"
    "  local out = {}\n"
    "  if n == 0 then return out end\n"
    "  idemproc_keys, idemproc_out = keys, out\n"
    "  local marks = idemproc_redis.call('MGET', unpack(keys))\n"
    "  local first, dups, nd = {}, {}, 0\n"
    "  for j = 1, n do\n"
    "    local b = 4 + (j - 1) * idemproc_stride\n"
    "    local id = argv[b]\n"
    "    local f = first[id]\n"
    "    if f then\n"
    "      dups[nd + 1], dups[nd + 2] = j, f\n"
    "      nd = nd + 2\n"
    "    elseif marks[j] then\n"
    "      out[j] = marks[j]\n"
    "    else\n"
    "      idemproc_from = idemproc_logn\n"
    "      idemproc_j = j\n"
    "      local ok, r1, r2 = pcall(eff, idemproc_rec(b))\n"
    "      if idemproc_outage then\n"
    "        return idemproc_redis.error_reply(idemproc_outage)\n"
    "      end\n"
    "      local why\n"
    "      if not ok then\n"
    "        why = 'lua error: ' .. idemproc_text(r1, 'error',\n"
    "          'a non-string error')\n"
    "      elseif r1 == false or (r1 == nil and r2 ~= nil) then\n"
    "        why = idemproc_text(r2, 'effect returned false',\n"
    "          'effect returned a non-string reason')\n"
    "      elseif type(r1) == 'table' and type(r1.err) == 'string' then\n"
    "        why = idemproc_text(r1)\n"
    "      end\n"
    "      if why then\n"
    "        idemproc_drop(idemproc_from)\n"
    "        out[j] = 'reject:' .. string.sub(why, 1, 500)\n"
    "      else\n"
    "        out[j] = ''\n"
    "        idemproc_npend = idemproc_npend + 1\n"
    "        idemproc_pend[idemproc_npend] = j\n"
    "        if idemproc_eager and idemproc_commit() then\n"
    "          return idemproc_redis.error_reply(idemproc_outage)\n"
    "        end\n"
    "        if out[j] == '' then first[id] = j end\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  idemproc_j = nil\n"
    "  if idemproc_commit() then\n"
    "    return idemproc_redis.error_reply(idemproc_outage)\n"
    "  end\n"
    "  for k = 1, nd, 2 do\n"
    "    local j, f = dups[k], dups[k + 1]\n"
    "    if out[f] == '' then\n"
    "      out[j] = 'done:' .. argv[4 + (f - 1) * idemproc_stride + 1]\n"
    "    else\n"
    "      out[j] = out[f]\n"
    "    end\n"
    "  end\n"
    "  return out\n"
    "end\n";

static const char driver_tail[] = "\nreturn idemproc_run(effect)\n";

/* The effect the store frames under dedup.scope=partition
 * (idem_store_effect_register; redis/partchunk.lua, redis/dedup_global.lua,
 * handlers/ledger.lua is the model): the first line and driver_head as
 * above, then the user's file inside a `do ... end` block (its top-level
 * locals stay there: the framing after it reads PER, ARGV, redis, string,
 * ... as its own), then effect_tail, which gives the framing back the real
 * ARGV, KEYS and redis and defines `effect(base, stride, js, ksuf)`.
 * Record j's arguments are ARGV[base + (j - 1) * stride + 1 ..]: identity,
 * message id and the rest as idem_luascript_args (the handler sends the
 * identity and message id twice: the framings take the first two for the
 * marks, or drop them). Per record of js, in order: pcall(effect, rec);
 * a rejection or runtime error takes back the record's staged idem.*
 * increments and returns it in `refused` (record number -> reason, cut at
 * 500 bytes). Then the chunk's sums are written (refused sums reject
 * their records as in the global driver). The framing writes the marks:
 * no mark is written here, so plain writes never make the chunk eager
 * (docs/design.md, "The script handler under dedup.scope=partition").
 * An outage-class error returns nil and the error, with the sums written
 * so far taken back. ksuf (Redis Cluster mode: the partition's tag) is
 * appended to every idem.* key; every such key is read (EXISTS) before
 * the first sum is written, so on a slot half migrated away the call
 * stops with nothing written (partchunk.lua's rule). */
static const char effect_tail[] =
    "\nidemproc_eff = effect\n"
    "end\n"
    "local ARGV, KEYS, redis = idemproc_argv, idemproc_KEYS, idemproc_redis\n"
    "local function effect(base, stride, js, ksuf)\n"
    "  local eff = idemproc_eff\n"
    "  if type(eff) ~= 'function' then\n"
    "    return nil, 'ERR script.file defines no function effect(rec)'\n"
    "  end\n"
    "  idemproc_ksuf, idemproc_eager, idemproc_outage = ksuf, true, nil\n"
    "  idemproc_acc, idemproc_rb, idemproc_logn = {{}, {}, {}, {}}, {{}, {}}, "
    "0\n"
    "  local out = {}\n"
    "  for i = 1, #js do\n"
    "    local j = js[i]\n"
    "    idemproc_from, idemproc_j = idemproc_logn, j\n"
    "    local ok, r1, r2 = pcall(eff, idemproc_rec(base + (j - 1) * stride "
    "+ 1))\n"
    "    if idemproc_outage then return nil, idemproc_outage end\n"
    "    local why\n"
    "    if not ok then\n"
    "      why = 'lua error: ' .. idemproc_text(r1, 'error',\n"
    "        'a non-string error')\n"
    "    elseif r1 == false or (r1 == nil and r2 ~= nil) then\n"
    "      why = idemproc_text(r2, 'effect returned false',\n"
    "        'effect returned a non-string reason')\n"
    "    elseif type(r1) == 'table' and type(r1.err) == 'string' then\n"
    "      why = idemproc_text(r1)\n"
    "    end\n"
    "    if why then\n"
    "      idemproc_drop(idemproc_from)\n"
    "      out[j] = 'reject:' .. string.sub(why, 1, 500)\n"
    "    end\n"
    "  end\n"
    "  idemproc_j = nil\n"
    "  if ksuf then\n"
    "    for kind = 1, 4 do\n"
    "      for key in pairs(idemproc_acc[kind]) do\n"
    "        local r = idemproc_redis.pcall('EXISTS', key)\n"
    "        if type(r) == 'table' and r.err then\n"
    "          idemproc_failed(r, key)\n"
    "          return nil, idemproc_outage or r.err\n"
    "        end\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  if idemproc_flush(out) then return nil, idemproc_outage end\n"
    "  local refused = {}\n"
    "  for j, why in pairs(out) do refused[j] = string.sub(why, 8) end\n"
    "  return refused\n"
    "end\n";

/* What the local check runs before the composed script: the globals of
 * Redis 7's script sandbox (base without print/dofile/loadfile/setfenv/
 * getfenv, string, table, math, stand-ins for bit, cjson, cmsgpack,
 * struct), a `redis` whose commands refuse to run (the top level of the
 * file runs here, the effect never does; level 3 of the error is the
 * user's line, past the driver's proxy), ARGV without records, and a
 * global table that refuses new globals and unknown names as Redis does. */
static const char sandbox_lua[] =
    "print, dofile, loadfile, setfenv, getfenv, newproxy = nil\n"
    "module, require, package = nil\n"
    "local function refuse()\n"
    "  error('redis.call/redis.pcall at the top level of the file: only '\n"
    "    .. 'effect(rec) may call Redis', 3)\n"
    "end\n"
    "redis = {call = refuse, pcall = refuse, acl_check_cmd = refuse,\n"
    "  error_reply = function(m) return {err = m} end,\n"
    "  status_reply = function(m) return {ok = m} end,\n"
    "  log = function() end, sha1hex = function() return '' end,\n"
    "  setresp = function() end, set_repl = function() end,\n"
    "  replicate_commands = function() return true end,\n"
    "  breakpoint = function() return false end, debug = function() end,\n"
    "  LOG_DEBUG = 0, LOG_VERBOSE = 1, LOG_NOTICE = 2, LOG_WARNING = 3,\n"
    "  REPL_NONE = 0, REPL_AOF = 1, REPL_SLAVE = 2, REPL_REPLICA = 2,\n"
    "  REPL_ALL = 3, REDIS_VERSION = '7.0.0', REDIS_VERSION_NUM = 458752}\n"
    "bit, cjson, cmsgpack, struct = {}, {}, {}, {}\n"
    "ARGV, KEYS = {'idemproc:', 'check', '60'}, {}\n"
    "setmetatable(_G, {\n"
    "  __newindex = function(_, k)\n"
    "    error('global variable ' .. tostring(k) .. ': Redis forbids '\n"
    "      .. 'creating globals in scripts; declare it local', 2)\n"
    "  end,\n"
    "  __index = function(_, k)\n"
    "    error('Script attempted to access nonexistent global variable '\n"
    "      .. tostring(k), 2)\n"
    "  end})\n";

/* Instructions the top level of the file may run in the check. */
#define CHECK_INSTRUCTIONS_MAX 50000000

struct idem_luascript_s {
    char *path;
    size_t nfields; /* script.fields: how many */
    char *source;   /* first line + driver_head + file + driver_tail */
    char *effect;   /* first line + driver_head + do file effect_tail */
    int head_lines; /* lines before the file's first */
    int file_lines;
};

static int count_lines(const char *s, size_t len)
{
    int n = 0;
    for (size_t i = 0; i < len; i++)
        n += s[i] == '\n';
    return n;
}

void idem_luascript_where(const idem_luascript_t *sc, const char *msg,
                          size_t len, char *out, size_t out_size)
{
    static const char tag[] = "user_script:";
    size_t taglen = sizeof(tag) - 1, o = 0;
    if (!out_size)
        return;
    for (size_t i = 0; i < len && o + 1 < out_size;) {
        char *end = NULL;
        long line = 0;
        if (len - i > taglen && !memcmp(msg + i, tag, taglen) &&
            msg[i + taglen] >= '0' && msg[i + taglen] <= '9') {
            errno = 0;
            line = strtol(msg + i + taglen, &end, 10);
        }
        if (end && (size_t)(end - msg) < len && *end == ':' && !errno) {
            long user = line - sc->head_lines;
            int w;
            if (user >= 1 && user <= sc->file_lines + 2)
                w = snprintf(out + o, out_size - o, "%s:%ld:", sc->path,
                             user > sc->file_lines ? (long)sc->file_lines
                                                   : user);
            else
                w = snprintf(out + o, out_size - o,
                             "(idemproc driver):%ld:", line);
            o += w < 0 ? 0 : (size_t)w;
            if (o >= out_size)
                o = out_size - 1;
            i = (size_t)(end - msg) + 1;
        } else {
            out[o++] = msg[i++];
        }
    }
    out[o] = '\0';
}

static void check_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    luaL_error(L,
               "the top level of the file ran more than %d instructions "
               "(only define functions there)",
               CHECK_INSTRUCTIONS_MAX);
}

/* Runs `code` (len bytes, chunk name "=user_script") in L; on failure puts
 * the mapped message into errstr and returns -1. */
static int check_chunk(idem_luascript_t *sc, lua_State *L, const char *code,
                       size_t len, int run, const char *hint, char *errstr,
                       size_t errstr_size)
{
    int rc = luaL_loadbuffer(L, code, len, "=user_script");
    if (rc != LUA_ERRSYNTAX)
        hint = ""; /* the hints are about syntax */
    if (!rc && run)
        rc = lua_pcall(L, 0, 1, 0);
    const char *what = NULL;
    size_t wlen = 0;
    if (rc) {
        what = lua_tolstring(L, -1, &wlen);
        if (!what)
            what = "error object is not a string", wlen = strlen(what);
    } else if (run && lua_istable(L, -1)) {
        lua_getfield(L, -1, "err");
        if (lua_isstring(L, -1))
            what = lua_tolstring(L, -1, &wlen);
    }
    if (!what) {
        lua_settop(L, 0);
        return 0;
    }
    char where[1024];
    idem_luascript_where(sc, what, wlen, where, sizeof(where));
    if (strstr(where, "defines no function effect"))
        snprintf(errstr, errstr_size,
                 "script.file: %s defines no function effect(rec)", sc->path);
    else
        snprintf(errstr, errstr_size, "script.file: %s%s", where, hint);
    lua_settop(L, 0);
    return -1;
}

/* Compiles the file alone (syntax errors with the file's own lines), then
 * the composed script, and runs the composed script's top level with no
 * records in a sandbox like Redis's. */
static int check(idem_luascript_t *sc, const char *file, size_t file_len,
                 char *errstr, size_t errstr_size)
{
    lua_State *L = luaL_newstate();
    if (!L) {
        snprintf(errstr, errstr_size, "script.file: %s: out of memory",
                 sc->path);
        return -1;
    }
    static const luaL_Reg libs[] = {{"", luaopen_base},
                                    {LUA_TABLIBNAME, luaopen_table},
                                    {LUA_STRLIBNAME, luaopen_string},
                                    {LUA_MATHLIBNAME, luaopen_math}};
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
        lua_pushcfunction(L, libs[i].func);
        lua_pushstring(L, libs[i].name);
        lua_call(L, 1, 0);
    }
    lua_settop(L, 0);
    int head = sc->head_lines;
    sc->head_lines = 0; /* the file alone: its own line numbers */
    int rc = check_chunk(sc, L, file, file_len, 0,
                         file_len && file[0] == '#'
                             ? " (a #! line is not allowed: idemproc "
                               "composes the script)"
                             : "",
                         errstr, errstr_size);
    sc->head_lines = head;
    if (!rc &&
        (luaL_loadbuffer(L, sandbox_lua, sizeof(sandbox_lua) - 1, "=sandbox") ||
         lua_pcall(L, 0, 0, 0))) {
        snprintf(errstr, errstr_size, "script.file: sandbox: %s",
                 lua_tostring(L, -1));
        rc = -1;
    }
    if (!rc) {
        lua_sethook(L, check_hook, LUA_MASKCOUNT, CHECK_INSTRUCTIONS_MAX);
        rc = check_chunk(sc, L, sc->source, strlen(sc->source), 1,
                         " (the file must not end in a top-level return: "
                         "idemproc runs code after it)",
                         errstr, errstr_size);
    }
    lua_close(L);
    return rc;
}

/* Reads the whole file; caller frees. NULL with errstr. */
static char *read_file(const char *path, size_t *len, char *errstr,
                       size_t errstr_size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(errstr, errstr_size, "script.file: %s: %s", path,
                 strerror(errno));
        return NULL;
    }
    char *buf = idem_xmalloc(IDEM_LUASCRIPT_FILE_MAX + 1);
    size_t n = fread(buf, 1, IDEM_LUASCRIPT_FILE_MAX + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err || n > IDEM_LUASCRIPT_FILE_MAX) {
        snprintf(errstr, errstr_size, "script.file: %s: %s", path,
                 err ? "read error" : "larger than 1 MiB");
        free(buf);
        return NULL;
    }
    if (memchr(buf, '\0', n)) {
        snprintf(errstr, errstr_size,
                 "script.file: %s: holds a NUL byte (not a Lua source file?)",
                 path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Appends `text` as a Lua string literal ("...", every byte outside
 * printable ASCII, '"' and '\\' as \ddd) to out; returns the new length. */
static size_t lua_quote(char *out, const char *text)
{
    size_t o = 0;
    out[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        if (*p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\')
            out[o++] = (char)*p;
        else
            o += (size_t)sprintf(out + o, "\\%03u", *p);
    out[o++] = '"';
    out[o] = '\0';
    return o;
}

/* ---- literal rec.fields["/x"] pointers, checked at load ---- */

/* The level of a long bracket opening at s[i] ("[[", "[=[", ...): the
 * number of '=', or -1 when none opens there. */
static int long_open(const char *s, size_t len, size_t i)
{
    if (i >= len || s[i] != '[')
        return -1;
    size_t j = i + 1;
    while (j < len && s[j] == '=')
        j++;
    return j < len && s[j] == '[' ? (int)(j - i - 1) : -1;
}

/* The end of a long bracket of `level` whose text starts at s[i]: the
 * index just past its closing bracket (len when unclosed); *text_end gets
 * where the text ends. */
static size_t long_close(const char *s, size_t len, size_t i, int level,
                         size_t *text_end)
{
    for (; i < len; i++) {
        if (s[i] != ']')
            continue;
        size_t j = i + 1;
        while (j < len && s[j] == '=')
            j++;
        if (j < len && s[j] == ']' && (int)(j - i - 1) == level) {
            *text_end = i;
            return j + 1;
        }
    }
    *text_end = len;
    return len;
}

/* Skips a short string (quote at s[i]); decodes it into out (NUL-ended,
 * cut at out_size) when out is not NULL, with Lua 5.1's escapes. Returns
 * the index past the closing quote (len when unclosed). */
static size_t short_string(const char *s, size_t len, size_t i, char *out,
                           size_t out_size)
{
    char q = s[i++];
    size_t o = 0;
    while (i < len && s[i] != q && s[i] != '\n') {
        unsigned char c = (unsigned char)s[i++];
        if (c == '\\' && i < len) {
            c = (unsigned char)s[i++];
            const char *from = "abfnrtv", *to = "\a\b\f\n\r\t\v";
            const char *e = strchr(from, c);
            if (c && e) {
                c = (unsigned char)to[e - from];
            } else if (c >= '0' && c <= '9') {
                unsigned v = c - '0';
                for (int k = 0; k < 2 && i < len && s[i] >= '0' && s[i] <= '9';
                     k++)
                    v = v * 10 + (unsigned)(s[i++] - '0');
                c = (unsigned char)v;
            } /* else: the character itself (\\, \", \', a newline) */
        }
        if (out && o + 1 < out_size)
            out[o++] = (char)c;
    }
    if (out && out_size)
        out[o] = '\0';
    return i < len ? i + 1 : len;
}

static size_t skip_space(const char *s, size_t len, size_t i)
{
    while (i < len && strchr(" \t\r\n\f\v", s[i]) && s[i])
        i++;
    return i;
}

static int ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_';
}

/* If `name.fields[<string literal>]` starts at s[i], decodes the literal
 * into key and returns 1. */
static int fields_literal_at(const char *s, size_t len, size_t i,
                             const char *name, char *key, size_t key_size)
{
    size_t nl = strlen(name);
    if (i + nl > len || memcmp(s + i, name, nl) ||
        (i > 0 && (ident_char(s[i - 1]) || s[i - 1] == '.' || s[i - 1] == ':')))
        return 0;
    size_t j = skip_space(s, len, i + nl);
    if (j >= len || s[j] != '.')
        return 0;
    j = skip_space(s, len, j + 1);
    if (len - j < 6 || memcmp(s + j, "fields", 6) ||
        (j + 6 < len && ident_char(s[j + 6])))
        return 0;
    j = skip_space(s, len, j + 6);
    if (j >= len || s[j] != '[' || long_open(s, len, j) >= 0)
        return 0;
    j = skip_space(s, len, j + 1);
    size_t end;
    int level = long_open(s, len, j);
    if (j < len && (s[j] == '"' || s[j] == '\'')) {
        end = short_string(s, len, j, key, key_size);
    } else if (level >= 0) {
        size_t from = j + (size_t)level + 2, text_end;
        if (from < len && s[from] == '\n')
            from++; /* Lua drops a newline right after the bracket */
        end = long_close(s, len, from, level, &text_end);
        size_t n =
            text_end - from < key_size - 1 ? text_end - from : key_size - 1;
        memcpy(key, s + from, n);
        key[n] = '\0';
    } else {
        return 0; /* a variable or an expression: known only at run time */
    }
    end = skip_space(s, len, end);
    return end < len && s[end] == ']';
}

/* The name of effect's parameter ("function effect(NAME"), else "rec". */
static void effect_param(const char *file, size_t len, char *name, size_t size)
{
    snprintf(name, size, "rec");
    const char *p = file;
    while ((p = memmem(p, len - (size_t)(p - file), "function", 8))) {
        size_t i = skip_space(file, len, (size_t)(p - file) + 8);
        p += 8;
        if (len - i < 6 || memcmp(file + i, "effect", 6))
            continue;
        i = skip_space(file, len, i + 6);
        if (i >= len || file[i] != '(')
            continue;
        i = skip_space(file, len, i + 1);
        size_t n = 0;
        while (i + n < len && ident_char(file[i + n]) && n + 1 < size)
            n++;
        if (n) {
            memcpy(name, file + i, n);
            name[n] = '\0';
        }
        return;
    }
}

/* The end of the comment or string starting at file[i] (Lua's `--` to
 * the line's end, `--[[ ]]`, `"..."`, `'...'`, `[[ ]]`), or 0 when none
 * starts there: the static checks below skip them. */
static size_t skip_comment_or_string(const char *file, size_t len, size_t i)
{
    size_t text_end;
    if (file[i] == '-' && i + 1 < len && file[i + 1] == '-') {
        int level = long_open(file, len, i + 2);
        if (level >= 0)
            return long_close(file, len, i + 4 + (size_t)level, level,
                              &text_end);
        size_t next = i;
        while (next < len && file[next] != '\n')
            next++;
        return next;
    }
    if (file[i] == '"' || file[i] == '\'')
        return short_string(file, len, i, NULL, 0);
    int level = file[i] == '[' ? long_open(file, len, i) : -1;
    if (level >= 0)
        return long_close(file, len, i + 2 + (size_t)level, level, &text_end);
    return 0;
}

/* Every literal pointer the file reads as rec.fields["/x"] (code, not
 * comments or strings) must be one of script.fields: at run time each
 * such read is an error, so every record would be dead-lettered. Returns
 * 0, or -1 with errstr naming the pointer and the file's line. */
static int literal_fields_check(const char *path, const char *file, size_t len,
                                char *const *ptrs, size_t nptrs, char *errstr,
                                size_t errstr_size)
{
    char name[64], key[512];
    effect_param(file, len, name, sizeof(name));
    int line = 1;
    for (size_t i = 0; i < len;) {
        size_t skip = skip_comment_or_string(file, len, i);
        size_t next = skip ? skip : i + 1;
        if (!skip && fields_literal_at(file, len, i, name, key, sizeof(key))) {
            size_t k = 0;
            while (k < nptrs && strcmp(ptrs[k], key))
                k++;
            if (k == nptrs) {
                char list[512] = "";
                size_t at = 0;
                for (size_t m = 0; m < nptrs && at < sizeof(list); m++)
                    at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s",
                                           m ? "," : "", ptrs[m]);
                snprintf(errstr, errstr_size,
                         "script.file: %s:%d: %s.fields[\"%s\"]: not in "
                         "script.fields (%s): every record would be "
                         "dead-lettered; add it to script.fields",
                         path, line, name, key, nptrs ? list : "not set");
                return -1;
            }
        }
        for (size_t k = i; k < next && k < len; k++)
            line += file[k] == '\n';
        i = next > i ? next : i + 1;
    }
    return 0;
}

/* The composed script's first line into out (sized by the caller): the
 * file's name, the lines before the file (head), the fields and their
 * constructor; with effect, also the effect's slot and the real KEYS.
 * Returns its length. */
static size_t first_line(char *out, const char *path, int head,
                         char *const *ptrs, size_t nptrs, int effect)
{
    size_t o = (size_t)sprintf(out, "local idemproc_file = ");
    o += lua_quote(out + o, path);
    o += (size_t)sprintf(
        out + o, " local idemproc_head = %d local idemproc_fields = {", head);
    for (size_t i = 0; i < nptrs; i++) {
        o += lua_quote(out + o, ptrs[i]);
        out[o++] = ',';
    }
    /* rec.fields as one constructor, the types read with one string.byte
     * and strings and numbers converted inline (the common cases):
     * local t1, t2 = string.byte(a[b + 7], 1, 2)
     * return {[P1] = t1 == 115 and a[b + 8] or t1 == 110 and
     * tonumber(a[b + 8]) or c(t1, a[b + 8]), ...} */
    o += (size_t)sprintf(out + o,
                         "} local function idemproc_fields_new(a, b, c) ");
    if (nptrs) {
        memcpy(out + o, "local ", 6);
        o += 6;
        for (size_t i = 0; i < nptrs; i++)
            o += (size_t)sprintf(out + o, "%st%zu", i ? ", " : "", i + 1);
        o += (size_t)sprintf(out + o, " = string.byte(a[b + 7], 1, %zu) ",
                             nptrs);
    }
    memcpy(out + o, "return {", 8);
    o += 8;
    for (size_t i = 0; i < nptrs; i++) {
        out[o++] = '[';
        o += lua_quote(out + o, ptrs[i]);
        o +=
            (size_t)sprintf(out + o,
                            "] = t%zu == 115 and a[b + %zu] or t%zu == 110 "
                            "and tonumber(a[b + %zu]) or c(t%zu, a[b + %zu]), ",
                            i + 1, 8 + i, i + 1, 8 + i, i + 1, 8 + i);
    }
    o += (size_t)sprintf(out + o, "} end%s\n",
                         effect ? " local idemproc_eff, idemproc_KEYS = nil, "
                                  "KEYS"
                                : "");
    return o;
}

idem_luascript_t *idem_luascript_load(const char *path, const char *fields,
                                      char *errstr, size_t errstr_size)
{
    char **ptrs;
    size_t nptrs;
    if (idem_envelope_pointers_parse("script.fields", fields, &ptrs, &nptrs,
                                     errstr, errstr_size))
        return NULL;
    size_t len;
    char *file = read_file(path, &len, errstr, errstr_size);
    if (!file) {
        idem_envelope_pointers_free(ptrs, nptrs);
        return NULL;
    }
    idem_luascript_t *sc = idem_xcalloc(1, sizeof(*sc));
    sc->path = idem_xstrdup(path);
    sc->nfields = nptrs;
    size_t hl = strlen(driver_head), tl = strlen(driver_tail), fl = 0;
    size_t el = strlen(effect_tail);
    for (size_t i = 0; i < nptrs; i++)
        fl += 2 * (4 * strlen(ptrs[i]) + 3) + 160;
    sc->head_lines = 1 + count_lines(driver_head, hl);
    sc->file_lines = count_lines(file, len) + (len && file[len - 1] != '\n');
    sc->source = idem_xmalloc(128 + 4 * strlen(path) + fl + hl + len + tl + 1);
    size_t o = first_line(sc->source, path, sc->head_lines, ptrs, nptrs, 0);
    memcpy(sc->source + o, driver_head, hl);
    memcpy(sc->source + o + hl, file, len);
    memcpy(sc->source + o + hl + len, driver_tail, tl + 1);
    /* The effect: the store puts one line (local PER = n) before it, and
     * "do" takes one more before the file. */
    sc->effect =
        idem_xmalloc(192 + 4 * strlen(path) + fl + hl + 3 + len + el + 1);
    o = first_line(sc->effect, path, sc->head_lines + 2, ptrs, nptrs, 1);
    memcpy(sc->effect + o, driver_head, hl);
    memcpy(sc->effect + o + hl, "do\n", 3);
    memcpy(sc->effect + o + hl + 3, file, len);
    memcpy(sc->effect + o + hl + 3 + len, effect_tail, el + 1);
    int rc = check(sc, file, len, errstr, errstr_size);
    /* After the syntax check: its errors come first. */
    if (!rc)
        rc = literal_fields_check(path, file, len, ptrs, nptrs, errstr,
                                  errstr_size);
    idem_envelope_pointers_free(ptrs, nptrs);
    free(file);
    if (rc) {
        idem_luascript_destroy(sc);
        return NULL;
    }
    return sc;
}

/* If a string literal (short or long bracket) starts at s[i], decodes it
 * into out and returns the index past it; else 0. */
static size_t literal_at(const char *s, size_t len, size_t i, char *out,
                         size_t out_size)
{
    if (i < len && (s[i] == '"' || s[i] == '\''))
        return short_string(s, len, i, out, out_size);
    int level = long_open(s, len, i);
    if (level < 0)
        return 0;
    size_t from = i + (size_t)level + 2, text_end;
    if (from < len && s[from] == '\n')
        from++;
    size_t end = long_close(s, len, from, level, &text_end);
    size_t n = text_end - from < out_size - 1 ? text_end - from : out_size - 1;
    memcpy(out, s + from, n);
    out[n] = '\0';
    return end;
}

/* If `word` (then optional space and a '.', ':' or '(' as expected by the
 * caller) starts at s[i] as a whole name, the index past it; else 0. */
static size_t name_at(const char *s, size_t len, size_t i, const char *word)
{
    size_t n = strlen(word);
    if (i + n > len || memcmp(s + i, word, n) ||
        (i > 0 && (ident_char(s[i - 1]) || s[i - 1] == '.')) ||
        (i + n < len && ident_char(s[i + n])))
        return 0;
    return i + n;
}

/* One place of the file where a key is named literally and cannot be
 * under the partition's tag in Redis Cluster mode: idem.F("...{...")
 * (the tag appended after a '{' of the key's own is not the one Redis
 * hashes), or redis.call/pcall(CMD, "key") (a plain call's literal key
 * has no tag at all). Writes errstr and returns -1 when one starts at
 * s[i]. */
static int cluster_key_at(const char *path, const char *s, size_t len, size_t i,
                          int line, char *errstr, size_t errstr_size)
{
    static const char *const idem_fns[] = {
        "hincrby", "incrby", "hincrbyfloat", "incrbyfloat",
        "hget",    "get",    "key"};
    static const char *const no_key[] = {"ECHO", "PING", "PUBLISH", "INFO",
                                         "TIME"};
    char fn[32] = "", lit[512], cmd[64];
    size_t j;
    int plain = 0;
    if ((j = name_at(s, len, i, "idem"))) {
        j = skip_space(s, len, j);
        if (j >= len || s[j] != '.')
            return 0;
        j = skip_space(s, len, j + 1);
        size_t k = 0;
        while (j < len && ident_char(s[j]) && k + 1 < sizeof(fn))
            fn[k++] = s[j++];
        fn[k] = '\0';
        size_t f = 0;
        while (f < sizeof(idem_fns) / sizeof(idem_fns[0]) &&
               strcmp(fn, idem_fns[f]))
            f++;
        if (f == sizeof(idem_fns) / sizeof(idem_fns[0]))
            return 0;
    } else if ((j = name_at(s, len, i, "redis"))) {
        j = skip_space(s, len, j);
        if (j >= len || s[j] != '.')
            return 0;
        j = skip_space(s, len, j + 1);
        size_t e = 0;
        if (len - j > 4 && !memcmp(s + j, "call", 4) && !ident_char(s[j + 4]))
            e = j + 4;
        else if (len - j > 5 && !memcmp(s + j, "pcall", 5) &&
                 !ident_char(s[j + 5]))
            e = j + 5;
        if (!e)
            return 0;
        snprintf(fn, sizeof(fn), "%s", s[j] == 'c' ? "call" : "pcall");
        j = e;
        plain = 1;
    } else {
        return 0;
    }
    j = skip_space(s, len, j);
    if (j >= len || s[j] != '(')
        return 0;
    j = skip_space(s, len, j + 1);
    if (plain) {
        size_t e = literal_at(s, len, j, cmd, sizeof(cmd));
        if (!e)
            return 0;
        for (char *c = cmd; *c; c++)
            if (*c >= 'a' && *c <= 'z')
                *c = (char)(*c - 'a' + 'A');
        for (size_t k = 0; k < sizeof(no_key) / sizeof(no_key[0]); k++)
            if (!strcmp(cmd, no_key[k]))
                return 0;
        j = skip_space(s, len, e);
        if (j >= len || s[j] != ',')
            return 0;
        j = skip_space(s, len, j + 1);
    }
    size_t e = literal_at(s, len, j, lit, sizeof(lit));
    if (!e)
        return 0;
    e = skip_space(s, len, e);
    if (e >= len || (s[e] != ',' && s[e] != ')'))
        return 0; /* part of an expression: known at run time only */
    if (plain) {
        snprintf(errstr, errstr_size,
                 "script.file: %s:%d: redis.%s('%s', \"%s\"): in Redis "
                 "Cluster mode every key of a chunk must be under its "
                 "partition's hash tag, and a literal key has none: name it "
                 "idem.key(\"%s\") (the name with the tag appended)",
                 path, line, fn, cmd, lit, lit);
        return -1;
    }
    if (!strchr(lit, '{'))
        return 0;
    snprintf(errstr, errstr_size,
             "script.file: %s:%d: idem.%s(\"%s\"): the key contains \"{\": in "
             "Redis Cluster mode the partition's hash tag is appended to every "
             "key, and Redis would hash this one by its own {...}: another "
             "slot than the chunk's (every such record would be "
             "dead-lettered)",
             path, line, fn, lit);
    return -1;
}

int idem_luascript_cluster_check(const char *path, char *errstr,
                                 size_t errstr_size)
{
    size_t len;
    char *file = read_file(path, &len, errstr, errstr_size);
    if (!file)
        return -1;
    int line = 1, rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t skip = skip_comment_or_string(file, len, i);
        size_t next = skip ? skip : i + 1;
        if (!skip)
            rc = cluster_key_at(path, file, len, i, line, errstr, errstr_size);
        for (size_t k = i; k < next && k < len; k++)
            line += file[k] == '\n';
        i = next > i ? next : i + 1;
    }
    free(file);
    return rc;
}

void idem_luascript_destroy(idem_luascript_t *sc)
{
    if (!sc)
        return;
    free(sc->path);
    free(sc->source);
    free(sc->effect);
    free(sc);
}

const char *idem_luascript_source(const idem_luascript_t *sc)
{
    return sc->source;
}

const char *idem_luascript_effect(const idem_luascript_t *sc)
{
    return sc->effect;
}

const char *idem_luascript_path(const idem_luascript_t *sc)
{
    return sc->path;
}

size_t idem_luascript_rec_args(const idem_luascript_t *sc)
{
    return IDEM_LUASCRIPT_REC_ARGS + (sc->nfields ? 1 + sc->nfields : 0);
}

/* A block of scratch: never moved, so what was written in it stays put. */
struct idem_luascript_block_s {
    idem_luascript_block_t *next;
    size_t used, cap;
    char data[];
};

#define BLOCK_SIZE (64 * 1024)

/* n bytes of scratch that stay valid until the next reset. */
static char *scratch_alloc(idem_luascript_scratch_t *sb, size_t n)
{
    idem_luascript_block_t *b = sb->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > BLOCK_SIZE ? n : BLOCK_SIZE;
        b = idem_xmalloc(sizeof(*b) + cap);
        b->used = 0;
        b->cap = cap;
        b->next = sb->head;
        sb->head = b;
    }
    char *p = b->data + b->used;
    b->used += n;
    return p;
}

void idem_luascript_scratch_reset(idem_luascript_scratch_t *sb)
{
    /* Keep one block (the newest) for the next batch. */
    idem_luascript_block_t *keep = sb->head;
    if (!keep)
        return;
    idem_luascript_block_t *b = keep->next;
    while (b) {
        idem_luascript_block_t *next = b->next;
        free(b);
        b = next;
    }
    keep->next = NULL;
    keep->used = 0;
}

void idem_luascript_scratch_term(idem_luascript_scratch_t *sb)
{
    idem_luascript_scratch_reset(sb);
    free(sb->head);
    sb->head = NULL;
}

/* The headers packed in one argument for the driver's idemproc_headers:
 * per header "<name length>:<name><value length>:<value>", or
 * "<name length>:<name>-:" for a header without a value. */
static void pack_headers(const rd_kafka_headers_t *hdrs,
                         idem_luascript_scratch_t *sb, const char **out,
                         size_t *out_len)
{
    const char *name;
    const void *val;
    size_t vlen, need = 0;
    for (size_t i = 0;
         hdrs && !rd_kafka_header_get_all(hdrs, i, &name, &val, &vlen); i++)
        need += strlen(name) + (val ? vlen : 0) + 2 * 21 + 2;
    char *p = scratch_alloc(sb, need + 1), *o = p;
    for (size_t i = 0;
         hdrs && !rd_kafka_header_get_all(hdrs, i, &name, &val, &vlen); i++) {
        size_t nl = strlen(name);
        o += sprintf(o, "%zu:", nl);
        memcpy(o, name, nl);
        o += nl;
        if (!val) {
            memcpy(o, "-:", 2);
            o += 2;
            continue;
        }
        o += sprintf(o, "%zu:", vlen);
        memcpy(o, val, vlen);
        o += vlen;
    }
    *out = p;
    *out_len = (size_t)(o - p);
}

size_t idem_luascript_args(const idem_luascript_t *sc, const idem_record_t *rec,
                           idem_luascript_scratch_t *sb, const char **argv,
                           size_t *argvlen)
{
    /* The small members in one argument: each argument costs Redis an
     * object and Lua a string, whether the effect reads it or not. */
    char *meta = scratch_alloc(sb, 2 + 3 * 21 + 1);
    int ml = snprintf(
        meta, 2 + 3 * 21 + 1, "%c%c%" PRId32 ":%" PRId64 ":%" PRId64,
        rec->key ? '1' : '0', rec->value ? '1' : '0', rec->partition,
        rec->offset, rec->timestamp < 0 ? (int64_t)-1 : rec->timestamp);
    size_t a = 0;
#define ARG(p, l) (argv[a] = (p), argvlen[a] = (l), a++)
    ARG(rec->identity, rec->identity_len);
    ARG(rec->message_id_len ? rec->message_id : "", rec->message_id_len);
    ARG(rec->topic, strlen(rec->topic));
    ARG(meta, (size_t)ml);
    ARG(rec->key ? (const char *)rec->key : "", rec->key ? rec->key_len : 0);
    ARG(rec->value ? (const char *)rec->value : "",
        rec->value ? rec->value_len : 0);
    pack_headers(rec->headers, sb, &argv[a], &argvlen[a]);
    a++;
    if (!sc->nfields)
        return a;
    /* The fields the loop extracted (envelope.h): their types in one
     * argument, then one each. A record read without them (it cannot
     * happen with the loop's rules) has them all absent. */
    const idem_envelope_t *env = rec->env;
    size_t have = env && env->nfields == sc->nfields ? sc->nfields : 0;
    char *types = scratch_alloc(sb, sc->nfields);
    for (size_t i = 0; i < sc->nfields; i++)
        types[i] = (char)(i < have ? env->fields[i].type : IDEM_FIELD_ABSENT);
    ARG(types, sc->nfields);
    for (size_t i = 0; i < sc->nfields; i++)
        if (i < have)
            ARG(env->fields[i].text, env->fields[i].len);
        else
            ARG("", 0);
#undef ARG
    return a;
}
