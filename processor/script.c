/* script: the user's Lua effect of handler=script: reading and checking
 * script.file, composing it into the dedup script, one record's arguments
 * and the script's answer per record (docs/design.md, "The script
 * handler"). */
#include "script.h"

#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

/* The dedup script's first part; the user's file follows it unchanged and
 * DRIVER_TAIL ends it, so `function effect(rec)` assigns the local
 * `effect` declared here (Redis forbids creating globals) and `redis`
 * inside the user's file is a local proxy of the real one.
 *
 * The proxy runs every command with the real redis.pcall and remembers
 * the first error about the server's state (OOM, READONLY, MISCONF, ...,
 * the classes of idem_store_error_class). Such an error is an outage, not
 * the record's fault: even if the effect catches it, the script ends
 * with that error reply, and the store treats it as an outage. Every
 * other error of a command is raised in the effect (redis.call) or
 * returned to it (redis.pcall), as Redis does.
 *
 * ARGV: prefix, group, dedup.ttl.seconds, then per record the arguments of
 * idem_script_rec_args. Per record, in order: a done mark (from before
 * this call or set earlier in it) or a lease is returned as found;
 * otherwise effect(rec) runs and, when it accepts, the done mark
 * "done:<message_id>" is set with the TTL and "" returned. A rejection is
 * "reject:<reason>", a runtime error "error:<message>"; neither sets a
 * mark, and writes the effect made before stay (Redis has no rollback). */
static const char driver_head[] =
    "local idemproc_redis, idemproc_argv, idemproc_outage = redis, ARGV\n"
    "local idemproc_server = {OOM = 1, READONLY = 1, MISCONF = 1,\n"
    "  NOREPLICAS = 1, LOADING = 1, BUSY = 1, MASTERDOWN = 1, NOAUTH = 1,\n"
    "  WRONGPASS = 1, NOPERM = 1, NOSCRIPT = 1}\n"
    "local function idemproc_failed(r)\n"
    "  if type(r) ~= 'table' or type(r.err) ~= 'string' then return false end\n"
    "  local code = string.match(r.err, '^(%S+)')\n"
    "  if code and idemproc_server[code] and not idemproc_outage then\n"
    "    idemproc_outage = r.err\n"
    "  end\n"
    "  return true\n"
    "end\n"
    "local redis = setmetatable({\n"
    "  call = function(...)\n"
    "    local r = idemproc_redis.pcall(...)\n"
    "    if idemproc_failed(r) then error(r.err, 2) end\n"
    "    return r\n"
    "  end,\n"
    "  pcall = function(...)\n"
    "    local r = idemproc_redis.pcall(...)\n"
    "    idemproc_failed(r)\n"
    "    return r\n"
    "  end}, {__index = idemproc_redis})\n"
    "local ARGV, KEYS, effect\n"
    "local function idemproc_text(x, default)\n"
    "  if type(x) == 'table' and type(x.err) == 'string' then x = x.err end\n"
    "  if x == nil then x = default end\n"
    "  return string.sub(tostring(x), 1, 1000)\n"
    "end\n"
    "local function idemproc_rec(argv, b)\n"
    "  local flags = argv[b + 6]\n"
    "  local rec = {identity = argv[b], topic = argv[b + 2],\n"
    "    partition = tonumber(argv[b + 3]), offset = tonumber(argv[b + 4]),\n"
    "    headers = {}}\n"
    "  if argv[b + 1] ~= '' then rec.message_id = argv[b + 1] end\n"
    "  local ts = tonumber(argv[b + 5])\n"
    "  if ts >= 0 then rec.timestamp = ts end\n"
    "  if string.byte(flags, 1) == 49 then rec.key = argv[b + 7] end\n"
    "  if string.byte(flags, 2) == 49 then rec.value = argv[b + 8] end\n"
    "  for h = 1, #flags - 2 do\n"
    "    local v = false\n"
    "    if string.byte(flags, h + 2) == 49 then v = argv[b + 8 + 2 * h] end\n"
    "    rec.headers[argv[b + 7 + 2 * h]] = v\n"
    "  end\n"
    "  return rec\n"
    "end\n"
    "local function idemproc_run(eff)\n"
    "  local argv = idemproc_argv\n"
    "  if type(eff) ~= 'function' then\n"
    "    return idemproc_redis.error_reply(\n"
    "      'ERR script.file defines no function effect(rec)')\n"
    "  end\n"
    "  local prefix, group, ttl = argv[1], argv[2], argv[3]\n"
    "  local starts, keys, n = {}, {}, #argv\n"
    "  local b = 4\n"
    "  while b <= n do\n"
    "    starts[#starts + 1] = b\n"
    "    keys[#keys + 1] = prefix .. 'dedup:' .. group .. ':' .. argv[b]\n"
    "    b = b + 9 + 2 * (#argv[b + 6] - 2)\n"
    "  end\n"
    "  local out = {}\n"
    "  if #keys == 0 then return out end\n"
    "  local marks = idemproc_redis.call('MGET', unpack(keys))\n"
    "  local set = {}\n"
    "  for j, s in ipairs(starts) do\n"
    "    local id = argv[s]\n"
    "    local mark = set[id] or marks[j]\n"
    "    if mark then\n"
    "      out[j] = mark\n"
    "    else\n"
    "      local ok, r1, r2 = pcall(eff, idemproc_rec(argv, s))\n"
    "      if idemproc_outage then\n"
    "        return idemproc_redis.error_reply(idemproc_outage)\n"
    "      end\n"
    "      if not ok then\n"
    "        out[j] = 'error:' .. idemproc_text(r1, 'error')\n"
    "      elseif r1 == false or (r1 == nil and r2 ~= nil) then\n"
    "        out[j] = 'reject:' .. idemproc_text(r2, 'effect returned false')\n"
    "      elseif type(r1) == 'table' and type(r1.err) == 'string' then\n"
    "        out[j] = 'reject:' .. idemproc_text(r1)\n"
    "      else\n"
    "        local m = 'done:' .. argv[s + 1]\n"
    "        idemproc_redis.call('SET', keys[j], m, 'EX', ttl)\n"
    "        set[id] = m\n"
    "        out[j] = ''\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  return out\n"
    "end\n";

static const char driver_tail[] = "\nreturn idemproc_run(effect)\n";

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

struct idem_script_s {
    char *path;
    char *source; /* driver_head + file + driver_tail */
    int head_lines;
    int file_lines;
};

static int count_lines(const char *s, size_t len)
{
    int n = 0;
    for (size_t i = 0; i < len; i++)
        n += s[i] == '\n';
    return n;
}

void idem_script_where(const idem_script_t *sc, const char *msg, size_t len,
                       char *out, size_t out_size)
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
static int check_chunk(idem_script_t *sc, lua_State *L, const char *code,
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
    idem_script_where(sc, what, wlen, where, sizeof(where));
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
static int check(idem_script_t *sc, const char *file, size_t file_len,
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
    char *buf = idem_xmalloc(IDEM_SCRIPT_FILE_MAX + 1);
    size_t n = fread(buf, 1, IDEM_SCRIPT_FILE_MAX + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err || n > IDEM_SCRIPT_FILE_MAX) {
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

idem_script_t *idem_script_load(const char *path, char *errstr,
                                size_t errstr_size)
{
    size_t len;
    char *file = read_file(path, &len, errstr, errstr_size);
    if (!file)
        return NULL;
    idem_script_t *sc = idem_xcalloc(1, sizeof(*sc));
    sc->path = idem_xstrdup(path);
    size_t hl = strlen(driver_head), tl = strlen(driver_tail);
    sc->source = idem_xmalloc(hl + len + tl + 1);
    memcpy(sc->source, driver_head, hl);
    memcpy(sc->source + hl, file, len);
    memcpy(sc->source + hl + len, driver_tail, tl + 1);
    sc->head_lines = count_lines(driver_head, hl);
    sc->file_lines = count_lines(file, len) + (len && file[len - 1] != '\n');
    int rc = check(sc, file, len, errstr, errstr_size);
    free(file);
    if (rc) {
        idem_script_destroy(sc);
        return NULL;
    }
    return sc;
}

void idem_script_destroy(idem_script_t *sc)
{
    if (!sc)
        return;
    free(sc->path);
    free(sc->source);
    free(sc);
}

const char *idem_script_source(const idem_script_t *sc)
{
    return sc->source;
}

const char *idem_script_path(const idem_script_t *sc)
{
    return sc->path;
}

void idem_script_scratch_term(idem_script_scratch_t *sb)
{
    free(sb->flags);
    memset(sb, 0, sizeof(*sb));
}

size_t idem_script_rec_args(const idem_script_rec_t *rec,
                            idem_script_scratch_t *sb, const char **argv,
                            size_t *argvlen)
{
    if (sb->flags_cap < rec->header_cnt + 3) {
        sb->flags_cap = rec->header_cnt + 3;
        sb->flags = idem_xrealloc(sb->flags, sb->flags_cap);
    }
    snprintf(sb->partition, sizeof(sb->partition), "%" PRId32, rec->partition);
    snprintf(sb->offset, sizeof(sb->offset), "%" PRId64, rec->offset);
    snprintf(sb->timestamp, sizeof(sb->timestamp), "%" PRId64,
             rec->timestamp < 0 ? (int64_t)-1 : rec->timestamp);
    sb->flags[0] = rec->key ? '1' : '0';
    sb->flags[1] = rec->value ? '1' : '0';
    for (size_t h = 0; h < rec->header_cnt; h++)
        sb->flags[2 + h] = rec->header_values[h] ? '1' : '0';
    sb->flags[2 + rec->header_cnt] = '\0';
    size_t a = 0;
#define ARG(p, l) (argv[a] = (p), argvlen[a] = (l), a++)
    ARG(rec->identity, rec->identity_len);
    ARG(rec->message_id ? rec->message_id : "",
        rec->message_id ? rec->message_id_len : 0);
    ARG(rec->topic, strlen(rec->topic));
    ARG(sb->partition, strlen(sb->partition));
    ARG(sb->offset, strlen(sb->offset));
    ARG(sb->timestamp, strlen(sb->timestamp));
    ARG(sb->flags, 2 + rec->header_cnt);
    ARG(rec->key ? (const char *)rec->key : "", rec->key ? rec->key_len : 0);
    ARG(rec->value ? (const char *)rec->value : "",
        rec->value ? rec->value_len : 0);
    for (size_t h = 0; h < rec->header_cnt; h++) {
        ARG(rec->header_names[h], strlen(rec->header_names[h]));
        ARG(rec->header_values[h] ? (const char *)rec->header_values[h] : "",
            rec->header_values[h] ? rec->header_lens[h] : 0);
    }
#undef ARG
    return a;
}

idem_script_verdict_t idem_script_verdict(const char *str, size_t len,
                                          const char **detail,
                                          size_t *detail_len)
{
    static const struct {
        const char *prefix;
        idem_script_verdict_t v;
    } map[] = {{"done:", IDEM_SCRIPT_DUPLICATE},
               {"reject:", IDEM_SCRIPT_REJECTED},
               {"error:", IDEM_SCRIPT_FAILED}};
    *detail = str;
    *detail_len = len;
    if (!len)
        return IDEM_SCRIPT_APPLIED;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        size_t pl = strlen(map[i].prefix);
        if (len >= pl && !memcmp(str, map[i].prefix, pl)) {
            *detail = str + pl;
            *detail_len = len - pl;
            return map[i].v;
        }
    }
    return IDEM_SCRIPT_BUSY;
}
