/* store: the Redis side of exactly-once: connection, the dedup/ledger/lease
 * Lua scripts (loaded once, called with EVALSHA, pipelined per batch) and
 * the reads verify needs. A redisReply never leaves this module. */
#include "store.h"
#include "log.h"
#include "util.h"

#include <hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records per EVALSHA: big enough to amortise the round trip, small enough
 * that one script never blocks Redis for long (~1 ms per 1000 records). */
#define CHUNK_RECORDS 1000

/* Ledger: for each record (identity, message_id, currency, user_id, minor):
 * a done or lease mark means "not applied" (the mark is returned); else the
 * increment and the done mark happen together inside this script, so no
 * crash can separate effect from mark. To keep Redis's work per record
 * small, the marks are read with one MGET, the increments are summed per
 * (currency, user) and applied with one HINCRBY each, and only new records
 * get a SET. An increment Redis refuses (overflow) leaves its records
 * unmarked and returns "reject:<error>" for them, and for the repeats of
 * their identity later in the chunk. */
static const char ledger_lua[] =
    "local prefix, group, ttl = ARGV[1], ARGV[2], ARGV[3]\n"
    "local n = (#ARGV - 3) / 5\n"
    "local keys = {}\n"
    "for j = 1, n do\n"
    "  keys[j] = prefix .. 'dedup:' .. group .. ':' .. ARGV[3 + (j - 1) * 5 + "
    "1]\n"
    "end\n"
    "local marks = redis.call('MGET', unpack(keys))\n"
    "local out, seen, sums, new, dups = {}, {}, {}, {}, {}\n"
    "for j = 1, n do\n"
    "  local b = 3 + (j - 1) * 5\n"
    "  local first = seen[ARGV[b + 1]]\n"
    "  if first then\n"
    "    dups[#dups + 1] = {j, first}\n"
    "  elseif marks[j] then\n"
    "    out[j] = marks[j]\n"
    "  else\n"
    "    local h = prefix .. 'ledger:' .. ARGV[b + 3]\n"
    "    local f = ARGV[b + 4]\n"
    "    sums[h] = sums[h] or {}\n"
    "    sums[h][f] = (sums[h][f] or 0) + tonumber(ARGV[b + 5])\n"
    "    seen[ARGV[b + 1]] = j\n"
    "    new[#new + 1] = j\n"
    "    out[j] = ''\n"
    "  end\n"
    "end\n"
    "local refused = {}\n"
    "for h, fields in pairs(sums) do\n"
    "  for f, x in pairs(fields) do\n"
    "    local r = redis.pcall('HINCRBY', h, f, string.format('%.0f', x))\n"
    "    if type(r) == 'table' and r.err then\n"
    "      refused[h .. '\\0' .. f] = r.err\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local applied = 0\n"
    "for _, j in ipairs(new) do\n"
    "  local b = 3 + (j - 1) * 5\n"
    "  local err = refused[prefix .. 'ledger:' .. ARGV[b + 3] .. '\\0' .. "
    "ARGV[b + 4]]\n"
    "  if err then\n"
    "    out[j] = 'reject:' .. err\n"
    "  else\n"
    "    redis.call('SET', keys[j], 'done:' .. ARGV[b + 2], 'EX', ttl)\n"
    "    applied = applied + 1\n"
    "  end\n"
    "end\n"
    "if applied > 0 then\n"
    "  redis.call('INCRBY', prefix .. 'ledger:applied', applied)\n"
    "end\n"
    "for _, d in ipairs(dups) do\n"
    "  local j, first = d[1], d[2]\n"
    "  if out[first] == '' then\n"
    "    out[j] = 'done:' .. ARGV[3 + (first - 1) * 5 + 2]\n"
    "  else\n"
    "    out[j] = out[first]\n"
    "  end\n"
    "end\n"
    "return out\n";

/* Claim: (identity, message_id) pairs. Free, or a lease of this member
 * from any rebalance epoch (records it still holds on partitions it kept)
 * -> lease for ARGV[3] ms under the current owner "lease:<member>:<epoch>";
 * a second record with an identity already claimed in this call is
 * "again": it is classified once the first one is finished. The mark
 * script still requires the exact current owner: a claim, its write and
 * its mark happen in one pass, without a rebalance in between. */
static const char claim_lua[] =
    "local prefix, group, ms, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]\n"
    "local mine = owner .. ':'\n"
    "local member = string.match(owner, '^(.*:)[^:]*$')\n"
    "local out, seen = {}, {}\n"
    "for i = 5, #ARGV, 2 do\n"
    "  local id = ARGV[i]\n"
    "  local k = prefix .. 'dedup:' .. group .. ':' .. id\n"
    "  if seen[id] then\n"
    "    out[#out + 1] = 'again'\n"
    "  else\n"
    "    local v = redis.call('GET', k)\n"
    "    local ours = v and string.sub(v, 1, #member) == member and\n"
    "                 string.match(string.sub(v, #member + 1), '^%d+:')\n"
    "    if (not v) or ours then\n"
    "      redis.call('SET', k, mine .. ARGV[i + 1], 'PX', ms)\n"
    "      seen[id] = true\n"
    "      out[#out + 1] = ''\n"
    "    else\n"
    "      out[#out + 1] = v\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return out\n";

/* Mark done: our lease (or an expired, unclaimed one) becomes the done mark;
 * an existing done mark stays; another owner's lease means we were fenced
 * ("lost"). */
static const char mark_lua[] =
    "local prefix, group, ttl, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]\n"
    "local out = {}\n"
    "for i = 5, #ARGV, 2 do\n"
    "  local k = prefix .. 'dedup:' .. group .. ':' .. ARGV[i]\n"
    "  local v = redis.call('GET', k)\n"
    "  if (not v) or v == owner .. ':' .. ARGV[i + 1] then\n"
    "    redis.call('SET', k, 'done:' .. ARGV[i + 1], 'EX', ttl)\n"
    "    out[#out + 1] = ''\n"
    "  elseif string.sub(v, 1, 5) == 'done:' then\n"
    "    out[#out + 1] = ''\n"
    "  else\n"
    "    out[#out + 1] = 'lost:' .. v\n"
    "  end\n"
    "end\n"
    "return out\n";

typedef enum { SCRIPT_LEDGER, SCRIPT_CLAIM, SCRIPT_MARK, SCRIPT_CNT } script_t;

static const char *const script_src[SCRIPT_CNT] = {ledger_lua, claim_lua,
                                                   mark_lua};

struct idem_store_s {
    const idem_conf_t *conf;
    idem_metrics_t *metrics;
    redisContext *c;
    char sha[SCRIPT_CNT][41];
    char ttl[24];      /* dedup.ttl.seconds as text */
    char lease_ms[24]; /* dedup.lease.ms as text */
    /* argv scratch, reused across calls */
    const char **argv;
    size_t *argvlen;
    size_t argv_cap;
    char (*nums)[24]; /* amounts as text for the ledger script */
    size_t nums_cap;
    size_t pending_chunks; /* replies store_recv still has to read */
    size_t pending_n;      /* records in that request */
    int64_t sent_at_us;
};

idem_store_t *idem_store_new(const idem_conf_t *conf, idem_metrics_t *m)
{
    idem_store_t *s = idem_xcalloc(1, sizeof(*s));
    s->conf = conf;
    s->metrics = m;
    snprintf(s->ttl, sizeof(s->ttl), "%" PRId64, conf->dedup_ttl_seconds);
    snprintf(s->lease_ms, sizeof(s->lease_ms), "%" PRId64,
             conf->dedup_lease_ms);
    return s;
}

void idem_store_disconnect(idem_store_t *s)
{
    if (s->c)
        redisFree(s->c);
    s->c = NULL;
    s->pending_chunks = 0; /* their replies died with the connection */
}

void idem_store_destroy(idem_store_t *s)
{
    if (!s)
        return;
    idem_store_disconnect(s);
    free(s->argv);
    free(s->argvlen);
    free(s->nums);
    free(s);
}

/* Records an infrastructure error: counts it, drops the connection. */
static int store_fail(idem_store_t *s, char *errstr, size_t errstr_size,
                      const char *what, const char *detail)
{
    snprintf(errstr, errstr_size, "redis: %s: %s", what,
             detail ? detail : "unknown error");
    if (s->metrics)
        idem_metrics_redis_error_add(s->metrics, 1);
    idem_store_disconnect(s);
    return -1;
}

/* Runs one command; returns the reply (caller frees) or NULL with errstr. */
static redisReply *store_command(idem_store_t *s, char *errstr,
                                 size_t errstr_size, int argc,
                                 const char **argv, const size_t *argvlen)
{
    redisReply *r = redisCommandArgv(s->c, argc, argv, argvlen);
    if (!r) {
        store_fail(s, errstr, errstr_size, argv[0], s->c->errstr);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", r->str);
        freeReplyObject(r);
        store_fail(s, errstr, errstr_size, argv[0], msg);
        return NULL;
    }
    return r;
}

static int store_load_scripts(idem_store_t *s, char *errstr, size_t errstr_size)
{
    for (int i = 0; i < SCRIPT_CNT; i++) {
        const char *argv[] = {"SCRIPT", "LOAD", script_src[i]};
        redisReply *r = store_command(s, errstr, errstr_size, 3, argv, NULL);
        if (!r)
            return -1;
        if (r->type != REDIS_REPLY_STRING || r->len != 40) {
            freeReplyObject(r);
            return store_fail(s, errstr, errstr_size, "SCRIPT LOAD",
                              "unexpected reply");
        }
        memcpy(s->sha[i], r->str, 41);
        freeReplyObject(r);
    }
    return 0;
}

int idem_store_connect(idem_store_t *s, char *errstr, size_t errstr_size)
{
    if (s->c)
        return 0;
    idem_redis_addr_t a;
    if (idem_redis_url_parse(s->conf->redis_url, &a, errstr, errstr_size))
        return -1;
    struct timeval tv = {.tv_sec = s->conf->redis_timeout_ms / 1000,
                         .tv_usec = (s->conf->redis_timeout_ms % 1000) * 1000};
    s->c = a.is_unix ? redisConnectUnixWithTimeout(a.path, tv)
                     : redisConnectWithTimeout(a.host, a.port, tv);
    if (!s->c)
        return store_fail(s, errstr, errstr_size, "connect", "out of memory");
    if (s->c->err)
        return store_fail(s, errstr, errstr_size, "connect", s->c->errstr);
    redisSetTimeout(s->c, tv);
    const char *pw = s->conf->redis_password && *s->conf->redis_password
                         ? s->conf->redis_password
                         : (a.password[0] ? a.password : NULL);
    if (pw) {
        const char *argv[] = {"AUTH", pw};
        redisReply *r = store_command(s, errstr, errstr_size, 2, argv, NULL);
        if (!r)
            return -1;
        freeReplyObject(r);
    }
    if (a.db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", a.db);
        const char *argv[] = {"SELECT", db};
        redisReply *r = store_command(s, errstr, errstr_size, 2, argv, NULL);
        if (!r)
            return -1;
        freeReplyObject(r);
    }
    return store_load_scripts(s, errstr, errstr_size);
}

static void argv_reserve(idem_store_t *s, size_t n)
{
    if (n <= s->argv_cap)
        return;
    s->argv = idem_xrealloc(s->argv, n * sizeof(*s->argv));
    s->argvlen = idem_xrealloc(s->argvlen, n * sizeof(*s->argvlen));
    s->argv_cap = n;
}

/* Turns one returned mark string into a result. */
static void result_from_string(idem_store_result_t *res, const char *str,
                               size_t len)
{
    memset(res, 0, sizeof(*res));
    if (len == 0) {
        res->mark = IDEM_MARK_NEW;
    } else if (len >= 5 && !memcmp(str, "done:", 5)) {
        res->mark = IDEM_MARK_DONE;
        size_t l =
            len - 5 < IDEM_ENVELOPE_ID_MAX ? len - 5 : IDEM_ENVELOPE_ID_MAX;
        memcpy(res->prior_mid, str + 5, l);
        res->prior_mid_len = l;
    } else if (len >= 7 && !memcmp(str, "reject:", 7)) {
        res->mark = IDEM_MARK_REJECT;
        snprintf(res->detail, sizeof(res->detail), "%.*s", (int)(len - 7),
                 str + 7);
    } else if (len == 5 && !memcmp(str, "again", 5)) {
        res->mark = IDEM_MARK_AGAIN;
    } else if (len >= 5 && !memcmp(str, "lost:", 5)) {
        res->mark = IDEM_MARK_LOST;
        snprintf(res->detail, sizeof(res->detail), "%.*s", (int)(len - 5),
                 str + 5);
    } else {
        res->mark = IDEM_MARK_BUSY; /* a lease, ours earlier or another's */
        snprintf(res->detail, sizeof(res->detail), "%.*s", (int)len, str);
    }
}

/* Fills the per-record arguments of record `env` for `script` at argv[at];
 * returns the number of arguments written. `numbuf` holds the amount text. */
static size_t record_args(script_t script, const idem_envelope_t *env,
                          const char **argv, size_t *argvlen, char *numbuf,
                          size_t numbuf_size)
{
    argv[0] = env->identity;
    argvlen[0] = env->identity_len; /* byte strings: NULs are data */
    argv[1] = env->message_id;
    argvlen[1] = env->message_id_len;
    if (script != SCRIPT_LEDGER)
        return 2;
    argv[2] = env->currency;
    argvlen[2] = strlen(env->currency);
    argv[3] = env->user_id;
    argvlen[3] = strlen(env->user_id);
    int l = snprintf(numbuf, numbuf_size, "%" PRId64, env->amount_minor);
    argv[4] = numbuf;
    argvlen[4] = (size_t)l;
    return 5;
}

/* Appends every chunk of the records as an EVALSHA call and writes them
 * all out (one pipeline, one round trip); the replies are read by
 * store_recv. Returns 0, or -1 (the connection is dropped). */
static int store_send(idem_store_t *s, script_t script, const char *arg3,
                      const char *owner, const idem_envelope_t *const *env,
                      size_t n, char *errstr, size_t errstr_size)
{
    size_t per = script == SCRIPT_LEDGER ? 5 : 2;
    size_t fixed = 3 /* EVALSHA sha numkeys */ + 3 + (owner ? 1 : 0);
    if (s->pending_chunks) {
        snprintf(errstr, errstr_size, "redis: a request is still in flight");
        return -1;
    }
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    if (script == SCRIPT_LEDGER && s->nums_cap < n) {
        s->nums = idem_xrealloc(s->nums, n * sizeof(*s->nums));
        s->nums_cap = n;
    }
    s->sent_at_us = idem_now_us();
    size_t chunks = 0;
    for (size_t off = 0; off < n; off += CHUNK_RECORDS, chunks++) {
        size_t cnt = n - off < CHUNK_RECORDS ? n - off : CHUNK_RECORDS;
        argv_reserve(s, fixed + cnt * per);
        size_t a = 0;
        s->argv[a++] = "EVALSHA";
        s->argv[a++] = s->sha[script];
        s->argv[a++] = "0";
        s->argv[a++] = s->conf->redis_prefix;
        s->argv[a++] = s->conf->group_id;
        s->argv[a++] = arg3;
        if (owner)
            s->argv[a++] = owner;
        for (size_t i = 0; i < a; i++)
            s->argvlen[i] = strlen(s->argv[i]);
        for (size_t i = 0; i < cnt; i++)
            a += record_args(script, env[off + i], s->argv + a, s->argvlen + a,
                             script == SCRIPT_LEDGER ? s->nums[off + i] : NULL,
                             24);
        if (redisAppendCommandArgv(s->c, (int)a, s->argv, s->argvlen) !=
            REDIS_OK)
            return store_fail(s, errstr, errstr_size, "EVALSHA", s->c->errstr);
    }
    int done = 0;
    while (!done)
        if (redisBufferWrite(s->c, &done) != REDIS_OK)
            return store_fail(s, errstr, errstr_size, "EVALSHA", s->c->errstr);
    s->pending_chunks = chunks;
    s->pending_n = n;
    return 0;
}

/* Reads the replies of the request store_send wrote into results[n].
 * NOSCRIPT (an operator flushed the script cache) reloads the scripts and
 * fails this request: the caller retries it, which the marks make safe.
 * Returns 0, or -1 (the connection is dropped). */
static int store_recv(idem_store_t *s, size_t n, idem_store_result_t *results,
                      char *errstr, size_t errstr_size)
{
    size_t chunks = s->pending_chunks;
    if (!chunks || n != s->pending_n) {
        snprintf(errstr, errstr_size, "redis: no request in flight for %zu", n);
        return -1;
    }
    s->pending_chunks = 0;
    int noscript = 0;
    char err[256] = "";
    for (size_t ch = 0, off = 0; ch < chunks; ch++, off += CHUNK_RECORDS) {
        redisReply *r = NULL;
        if (redisGetReply(s->c, (void **)&r) != REDIS_OK || !r)
            return store_fail(s, errstr, errstr_size, "EVALSHA", s->c->errstr);
        size_t cnt = n - off < CHUNK_RECORDS ? n - off : CHUNK_RECORDS;
        if (r->type == REDIS_REPLY_ERROR) {
            if (!strncmp(r->str, "NOSCRIPT", 8))
                noscript = 1;
            else if (!err[0])
                snprintf(err, sizeof(err), "%s", r->str);
        } else if (r->type != REDIS_REPLY_ARRAY || r->elements != cnt) {
            snprintf(err, sizeof(err), "unexpected reply to script");
        } else {
            for (size_t i = 0; i < cnt; i++)
                result_from_string(&results[off + i],
                                   r->element[i]->str ? r->element[i]->str : "",
                                   r->element[i]->len);
        }
        freeReplyObject(r);
    }
    if (s->metrics)
        idem_metrics_redis_observe(
            s->metrics, (double)(idem_now_us() - s->sent_at_us) / 1e6);
    if (noscript) {
        idem_log(IDEM_LOG_WARN, "redis lost its scripts; reloading");
        if (store_load_scripts(s, errstr, errstr_size) == 0)
            snprintf(errstr, errstr_size,
                     "redis: scripts were flushed; reloaded, will retry");
        if (s->metrics)
            idem_metrics_redis_error_add(s->metrics, 1);
        return -1;
    }
    if (err[0])
        return store_fail(s, errstr, errstr_size, "EVALSHA", err);
    return 0;
}

static int store_eval_batch(idem_store_t *s, script_t script, const char *arg3,
                            const char *owner,
                            const idem_envelope_t *const *env, size_t n,
                            idem_store_result_t *results, char *errstr,
                            size_t errstr_size)
{
    if (store_send(s, script, arg3, owner, env, n, errstr, errstr_size))
        return -1;
    return store_recv(s, n, results, errstr, errstr_size);
}

int idem_store_ledger_send(idem_store_t *s, const idem_envelope_t *const *env,
                           size_t n, char *errstr, size_t errstr_size)
{
    return store_send(s, SCRIPT_LEDGER, s->ttl, NULL, env, n, errstr,
                      errstr_size);
}

int idem_store_ledger_recv(idem_store_t *s, size_t n,
                           idem_store_result_t *results, char *errstr,
                           size_t errstr_size)
{
    return store_recv(s, n, results, errstr, errstr_size);
}

int idem_store_ledger_apply(idem_store_t *s, const idem_envelope_t *const *env,
                            size_t n, idem_store_result_t *results,
                            char *errstr, size_t errstr_size)
{
    return store_eval_batch(s, SCRIPT_LEDGER, s->ttl, NULL, env, n, results,
                            errstr, errstr_size);
}

int idem_store_claim(idem_store_t *s, const char *owner,
                     const idem_envelope_t *const *env, size_t n,
                     idem_store_result_t *results, char *errstr,
                     size_t errstr_size)
{
    return store_eval_batch(s, SCRIPT_CLAIM, s->lease_ms, owner, env, n,
                            results, errstr, errstr_size);
}

int idem_store_mark_done(idem_store_t *s, const char *owner,
                         const idem_envelope_t *const *env, size_t n,
                         idem_store_result_t *results, char *errstr,
                         size_t errstr_size)
{
    return store_eval_batch(s, SCRIPT_MARK, s->ttl, owner, env, n, results,
                            errstr, errstr_size);
}

int idem_store_ledger_scan(idem_store_t *s,
                           void (*cb)(const char *currency, const char *user_id,
                                      int64_t minor, void *opaque),
                           void *opaque, char *errstr, size_t errstr_size)
{
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    char pattern[512];
    snprintf(pattern, sizeof(pattern), "%sledger:*", s->conf->redis_prefix);
    size_t plen = strlen(s->conf->redis_prefix) + strlen("ledger:");
    char cursor[32] = "0";
    do {
        const char *argv[] = {"SCAN",  cursor,  "MATCH",
                              pattern, "COUNT", "1000"};
        redisReply *r = store_command(s, errstr, errstr_size, 6, argv, NULL);
        if (!r)
            return -1;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            return store_fail(s, errstr, errstr_size, "SCAN",
                              "unexpected reply");
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            const char *key = keys->element[i]->str;
            if (!strcmp(key + plen, "applied"))
                continue;
            const char *hargv[] = {"HGETALL", key};
            redisReply *h =
                store_command(s, errstr, errstr_size, 2, hargv, NULL);
            if (!h) {
                freeReplyObject(r);
                return -1;
            }
            for (size_t j = 0; j + 1 < h->elements; j += 2)
                cb(key + plen, h->element[j]->str,
                   strtoll(h->element[j + 1]->str, NULL, 10), opaque);
            freeReplyObject(h);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0"));
    return 0;
}

int idem_store_applied_get(idem_store_t *s, int64_t *applied, char *errstr,
                           size_t errstr_size)
{
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    char key[512];
    snprintf(key, sizeof(key), "%sledger:applied", s->conf->redis_prefix);
    const char *argv[] = {"GET", key};
    redisReply *r = store_command(s, errstr, errstr_size, 2, argv, NULL);
    if (!r)
        return -1;
    *applied = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
    freeReplyObject(r);
    return 0;
}
