/* partstate: the partition layout of the dedup state in Redis: epochs,
 * chunks of marks, their index and the chunk script (partchunk.lua with
 * the handler's effect), on the store's connection. */
#include "redis/partstate.h"
#include "base/util.h"
#include "redis/layout.h"
#include "redis/storectx.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* redis/partchunk.lua, as the build embeds it (Makefile: LUA_SRCS). */
extern const char idem_partchunk_lua[];
extern const size_t idem_partchunk_lua_len;

#define PIECE_DEFAULT (1u << 20) /* bytes per GETRANGE */

struct idem_partstate_s {
    idem_store_t *store;
    const idem_conf_t *conf;
    char *src; /* the composed chunk script */
    size_t src_len;
    char sha[41]; /* "" until loaded */
    size_t per;   /* arguments per record */
    idem_store_args_fn args;
    void *opaque;
    int64_t window; /* seconds */
    char pos_key[512];
    const char **argv; /* scratch, reused across chunks */
    size_t *argvlen;
    size_t argv_cap;
    char layout_key[512]; /* the group's layout key (redis/layout.h) */
    int honour_global;    /* identities in the message-id slots */
};

idem_partstate_t *idem_partstate_new(idem_store_t *store,
                                     const idem_conf_t *conf, char *errstr,
                                     size_t errstr_size)
{
    size_t per = 0;
    idem_store_args_fn args = NULL;
    void *opaque = NULL;
    const char *effect = idem_store_effect(store, &per, &args, &opaque);
    if (!effect || per < 2) {
        snprintf(errstr, errstr_size,
                 "dedup.scope=partition: the handler has no effect the "
                 "partition layout can run (only handler=ledger for now)");
        return NULL;
    }
    idem_partstate_t *p = idem_xcalloc(1, sizeof(*p));
    p->store = store;
    p->conf = conf;
    p->per = per;
    p->args = args;
    p->opaque = opaque;
    p->window =
        conf->dedup_ttl_seconds / 8 > 0 ? conf->dedup_ttl_seconds / 8 : 1;
    snprintf(p->pos_key, sizeof(p->pos_key), "%spos:%s", conf->redis_prefix,
             conf->group_id ? conf->group_id : "");
    idem_layout_key(conf, p->layout_key, sizeof(p->layout_key));
    char head[48];
    int hl = snprintf(head, sizeof(head), "local PER = %zu\n", per);
    size_t el = strlen(effect);
    p->src_len = (size_t)hl + el + 1 + idem_partchunk_lua_len;
    p->src = idem_xmalloc(p->src_len + 1);
    memcpy(p->src, head, (size_t)hl);
    memcpy(p->src + hl, effect, el);
    p->src[hl + el] = '\n';
    memcpy(p->src + hl + el + 1, idem_partchunk_lua, idem_partchunk_lua_len);
    p->src[p->src_len] = '\0';
    return p;
}

void idem_partstate_destroy(idem_partstate_t *p)
{
    if (!p)
        return;
    free(p->src);
    free(p->argv);
    free(p->argvlen);
    free(p);
}

int64_t idem_partstate_window_seconds(const idem_partstate_t *p)
{
    return p->window;
}

int64_t idem_partstate_window_end(const idem_partstate_t *p, int64_t w)
{
    return (w + 1) * p->window + p->conf->dedup_ttl_seconds;
}

/* "<prefix>st{<group>:<topic>:<partition>}:" into buf. */
static void stem(const idem_partstate_t *p, const char *topic,
                 int32_t partition, char *buf, size_t size)
{
    snprintf(buf, size, "%sst{%s:%s:%" PRId32 "}:", p->conf->redis_prefix,
             p->conf->group_id ? p->conf->group_id : "", topic, partition);
}

/* Runs one command on the store's connection: the reply (caller frees with
 * freeReplyObject), or NULL with errstr (an error reply or a failed
 * connection; the connection is dropped). */
static redisReply *command(idem_partstate_t *p, int write, int argc,
                           const char **argv, const size_t *argvlen,
                           char *errstr, size_t errstr_size)
{
    redisContext *c = idem_store_ctx(p->store, write, errstr, errstr_size);
    if (!c)
        return NULL;
    redisReply *r = redisCommandArgv(c, argc, argv, argvlen);
    if (!r) {
        idem_store_ctx_fail(p->store, argv[0], NULL, errstr, errstr_size);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", r->str);
        freeReplyObject(r);
        idem_store_ctx_fail(p->store, argv[0], msg, errstr, errstr_size);
        return NULL;
    }
    return r;
}

static int unexpected(idem_partstate_t *p, redisReply *r, const char *what,
                      char *errstr, size_t errstr_size)
{
    freeReplyObject(r);
    return idem_store_ctx_fail(p->store, what, "unexpected reply", errstr,
                               errstr_size);
}

int idem_partstate_hashkey(idem_partstate_t *p, uint8_t key[16], char *errstr,
                           size_t errstr_size)
{
    uint8_t fresh[16];
    if (getrandom(fresh, sizeof(fresh), 0) != (ssize_t)sizeof(fresh)) {
        snprintf(errstr, errstr_size, "dedup key: getrandom: %s",
                 strerror(errno));
        return -1;
    }
    char k[512];
    snprintf(k, sizeof(k), "%sdedupkey:%s", p->conf->redis_prefix,
             p->conf->group_id ? p->conf->group_id : "");
    const char *sargv[] = {"SET", k, (const char *)fresh, "NX"};
    const size_t slen[] = {3, strlen(k), sizeof(fresh), 2};
    redisReply *r = command(p, 1, 4, sargv, slen, errstr, errstr_size);
    if (!r)
        return -1;
    freeReplyObject(r);
    const char *gargv[] = {"GET", k};
    r = command(p, 0, 2, gargv, NULL, errstr, errstr_size);
    if (!r)
        return -1;
    if (r->type != REDIS_REPLY_STRING || r->len != 16)
        return unexpected(p, r, "GET dedupkey", errstr, errstr_size);
    memcpy(key, r->str, 16);
    freeReplyObject(r);
    return 0;
}

int idem_partstate_now(idem_partstate_t *p, int64_t *now, char *errstr,
                       size_t errstr_size)
{
    const char *argv[] = {"TIME"};
    redisReply *r = command(p, 0, 1, argv, NULL, errstr, errstr_size);
    if (!r)
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return unexpected(p, r, "TIME", errstr, errstr_size);
    *now = strtoll(r->element[0]->str, NULL, 10);
    freeReplyObject(r);
    return 0;
}

int idem_partstate_epoch_bump(idem_partstate_t *p, const char *topic,
                              int32_t partition, int64_t *epoch, char *errstr,
                              size_t errstr_size)
{
    char k[640];
    stem(p, topic, partition, k, sizeof(k));
    strncat(k, "epoch", sizeof(k) - strlen(k) - 1);
    const char *argv[] = {"INCR", k};
    redisReply *r = command(p, 1, 2, argv, NULL, errstr, errstr_size);
    if (!r)
        return -1;
    if (r->type != REDIS_REPLY_INTEGER)
        return unexpected(p, r, "INCR epoch", errstr, errstr_size);
    *epoch = r->integer;
    freeReplyObject(r);
    return 0;
}

int idem_partstate_partitions(idem_partstate_t *p, const char *topic,
                              int64_t current, int64_t *recorded, char *errstr,
                              size_t errstr_size)
{
    char k[640], v[24];
    snprintf(k, sizeof(k), "%sst{%s:%s}:partitions", p->conf->redis_prefix,
             p->conf->group_id ? p->conf->group_id : "", topic);
    snprintf(v, sizeof(v), "%" PRId64, current);
    const char *sargv[] = {"SET", k, v, "NX"};
    redisReply *r = command(p, 1, 4, sargv, NULL, errstr, errstr_size);
    if (!r)
        return -1;
    freeReplyObject(r);
    const char *gargv[] = {"GET", k};
    r = command(p, 0, 2, gargv, NULL, errstr, errstr_size);
    if (!r)
        return -1;
    char *end = NULL;
    long long n = -1;
    if (r->type == REDIS_REPLY_STRING)
        n = strtoll(r->str, &end, 10);
    if (r->type != REDIS_REPLY_STRING || end == r->str || *end || n < 0)
        return unexpected(p, r, "GET partitions", errstr, errstr_size);
    *recorded = n;
    freeReplyObject(r);
    return 0;
}

/* The window of a chunk key "<stem>w<window>:<seq>", or -1. */
static int64_t key_window(const char *key, size_t len)
{
    const char *w = NULL;
    for (size_t i = len; i-- > 0;)
        if (key[i] == 'w' && i > 0 && key[i - 1] == ':') {
            w = key + i + 1;
            break;
        }
    if (!w)
        return -1;
    char *end;
    long long v = strtoll(w, &end, 10);
    return end != w && *end == ':' ? (int64_t)v : -1;
}

/* Reads one chunk key in pieces, calling cb for each. */
static int load_chunk(idem_partstate_t *p, const char *key, size_t keylen,
                      size_t piece, idem_partstate_marks_fn cb, void *opaque,
                      size_t *pieces, char *errstr, size_t errstr_size)
{
    int64_t w = key_window(key, keylen);
    if (w < 0) {
        snprintf(errstr, errstr_size, "redis: chunk key without a window: %.*s",
                 (int)keylen, key);
        return -1;
    }
    for (size_t off = 0;; off += piece) {
        char from[24], to[24];
        snprintf(from, sizeof(from), "%zu", off);
        snprintf(to, sizeof(to), "%zu", off + piece - 1);
        const char *argv[] = {"GETRANGE", key, from, to};
        const size_t len[] = {8, keylen, strlen(from), strlen(to)};
        redisReply *r = command(p, 0, 4, argv, len, errstr, errstr_size);
        if (!r)
            return -1;
        if (r->type != REDIS_REPLY_STRING)
            return unexpected(p, r, "GETRANGE", errstr, errstr_size);
        if (pieces)
            (*pieces)++;
        size_t got = r->len, n = got / IDEM_PARTSTATE_MARK;
        if (got % IDEM_PARTSTATE_MARK) {
            freeReplyObject(r);
            snprintf(errstr, errstr_size,
                     "redis: chunk %.*s is not whole marks (%zu bytes at %zu)",
                     (int)keylen, key, got, off);
            return -1;
        }
        int stop = n && cb((const uint8_t *)r->str, n, w, opaque);
        freeReplyObject(r);
        if (stop) {
            snprintf(errstr, errstr_size, "stopped by the caller");
            return -1;
        }
        if (got < piece)
            return 0;
    }
}

int idem_partstate_load(idem_partstate_t *p, const char *topic,
                        int32_t partition, size_t piece_bytes,
                        idem_partstate_marks_fn cb, void *opaque,
                        size_t *pieces, char *errstr, size_t errstr_size)
{
    size_t piece = piece_bytes ? piece_bytes : PIECE_DEFAULT;
    piece -= piece % IDEM_PARTSTATE_MARK;
    if (!piece)
        piece = IDEM_PARTSTATE_MARK;
    char k[640];
    stem(p, topic, partition, k, sizeof(k));
    strncat(k, "idx", sizeof(k) - strlen(k) - 1);
    const char *argv[] = {"LRANGE", k, "0", "-1"};
    redisReply *idx = command(p, 0, 4, argv, NULL, errstr, errstr_size);
    if (!idx)
        return -1;
    if (idx->type != REDIS_REPLY_ARRAY)
        return unexpected(p, idx, "LRANGE", errstr, errstr_size);
    int rc = 0;
    for (size_t i = 0; i < idx->elements && !rc; i++) {
        redisReply *e = idx->element[i];
        if (e->type != REDIS_REPLY_STRING)
            continue;
        rc = load_chunk(p, e->str, e->len, piece, cb, opaque, pieces, errstr,
                        errstr_size);
    }
    freeReplyObject(idx);
    return rc;
}

static void argv_reserve(idem_partstate_t *p, size_t n)
{
    if (n <= p->argv_cap)
        return;
    p->argv = idem_xrealloc(p->argv, n * sizeof(*p->argv));
    p->argvlen = idem_xrealloc(p->argvlen, n * sizeof(*p->argvlen));
    p->argv_cap = n;
}

/* SCRIPT LOAD of the chunk script into p->sha. 0, or -1 with errstr. */
static int script_load(idem_partstate_t *p, char *errstr, size_t errstr_size)
{
    const char *argv[] = {"SCRIPT", "LOAD", p->src};
    const size_t len[] = {6, 4, p->src_len};
    redisReply *r = command(p, 0, 3, argv, len, errstr, errstr_size);
    if (!r)
        return -1;
    if (r->type != REDIS_REPLY_STRING || r->len != 40)
        return unexpected(p, r, "SCRIPT LOAD", errstr, errstr_size);
    memcpy(p->sha, r->str, 41);
    freeReplyObject(r);
    return 0;
}

/* Reads the chunk script's reply r into results and *window, and frees
 * it. Returns 0, or -1 when its shape is not the script's. */
static int chunk_reply(redisReply *r, size_t n,
                       idem_partstate_result_t *results, int64_t *window)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n + 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER) {
        freeReplyObject(r);
        return -1;
    }
    *window = r->element[0]->integer;
    for (size_t i = 0; i < n; i++) {
        const redisReply *e = r->element[i + 1];
        idem_partstate_result_t *res = &results[i];
        res->detail[0] = '\0';
        res->outcome = IDEM_PARTSTATE_APPLIED;
        if (e->type != REDIS_REPLY_STRING || !e->len)
            continue;
        if (!strcmp(e->str, "moved")) {
            res->outcome = IDEM_PARTSTATE_MOVED_MARK;
        } else if (!strncmp(e->str, "global:", 7)) {
            res->outcome = IDEM_PARTSTATE_GLOBAL_DONE;
            snprintf(res->detail, sizeof(res->detail), "%s", e->str + 7);
        } else if (!strncmp(e->str, "reject:", 7)) {
            res->outcome = IDEM_PARTSTATE_REJECTED;
            snprintf(res->detail, sizeof(res->detail), "%s", e->str + 7);
        }
    }
    freeReplyObject(r);
    return 0;
}

/* The chunk's EVALSHA in RESP into *cmd (caller frees with
 * redisFreeCommand); its length, or -1 with errstr. */
static long long chunk_format(idem_partstate_t *p,
                              const idem_partstate_chunk_t *ch, char **cmd,
                              char *errstr, size_t errstr_size)
{
    char st[640], kepoch[656], kidx[656], kseq[656], field[320], epoch[24],
        expect[24], ttl[24], win[24], pos[160] = "";
    stem(p, ch->topic, ch->partition, st, sizeof(st));
    snprintf(kepoch, sizeof(kepoch), "%sepoch", st);
    snprintf(kidx, sizeof(kidx), "%sidx", st);
    snprintf(kseq, sizeof(kseq), "%sseq", st);
    snprintf(field, sizeof(field), "%s:%" PRId32, ch->topic, ch->partition);
    snprintf(epoch, sizeof(epoch), "%" PRId64, ch->epoch);
    snprintf(expect, sizeof(expect), "%" PRId64, ch->expect_offset);
    snprintf(ttl, sizeof(ttl), "%" PRId64, p->conf->dedup_ttl_seconds);
    snprintf(win, sizeof(win), "%" PRId64, p->window);
    if (ch->newpos && !idem_posval_format(pos, sizeof(pos), ch->newpos->offset,
                                          &ch->newpos->val))
        snprintf(pos, sizeof(pos), "%" PRId64, ch->newpos->offset);
    argv_reserve(p, 18 + ch->n * p->per);
    size_t a = 0;
    p->argv[a++] = "EVALSHA";
    p->argv[a++] = p->sha;
    p->argv[a++] = "5";
    p->argv[a++] = kepoch;
    p->argv[a++] = kidx;
    p->argv[a++] = kseq;
    p->argv[a++] = p->pos_key;
    p->argv[a++] = p->layout_key; /* the layout block's, last */
    p->argv[a++] = p->conf->redis_prefix;
    p->argv[a++] = p->conf->group_id ? p->conf->group_id : "";
    p->argv[a++] = ttl;
    p->argv[a++] = st;
    p->argv[a++] = epoch;
    p->argv[a++] = expect;
    p->argv[a++] = pos;
    p->argv[a++] = win;
    p->argv[a++] = field;
    p->argv[a++] = p->honour_global ? "1" : "0"; /* the layout block's */
    for (size_t i = 0; i < a; i++)
        p->argvlen[i] = strlen(p->argv[i]);
    for (size_t i = 0; i < ch->n; i++) {
        size_t got =
            p->args(ch->recs[i], p->argv + a, p->argvlen + a, p->opaque);
        if (got != p->per) {
            snprintf(errstr, errstr_size,
                     "partition chunk: %zu arguments for a record, not %zu",
                     got, p->per);
            return -1;
        }
        /* The chunk script reads no message id (the mark carries its
         * digest): bytes Redis need not parse. While a switch from the
         * global layout is honoured, the identity goes there instead. */
        p->argv[a + 1] = p->honour_global ? p->argv[a] : "";
        p->argvlen[a + 1] = p->honour_global ? p->argvlen[a] : 0;
        p->argv[a] = (const char *)ch->marks[i]; /* the mark, not identity */
        p->argvlen[a] = IDEM_PARTSTATE_MARK;
        a += got;
    }
    long long len = redisFormatCommandArgv(cmd, (int)a, p->argv, p->argvlen);
    if (len < 0)
        snprintf(errstr, errstr_size, "partition chunk: out of memory");
    return len;
}

int idem_partstate_chunks(idem_partstate_t *p, const idem_partstate_chunk_t *ch,
                          size_t k, idem_partstate_result_t *const *results,
                          int64_t *windows, int *rcs, char *errstr,
                          size_t errstr_size)
{
    if (!k)
        return 0;
    if (!p->sha[0] && script_load(p, errstr, errstr_size))
        return -1;
    redisContext *c = idem_store_ctx(p->store, 1, errstr, errstr_size);
    if (!c)
        return -1;
    for (size_t i = 0; i < k; i++) {
        char *cmd = NULL;
        long long len = chunk_format(p, &ch[i], &cmd, errstr, errstr_size);
        if (len < 0)
            return -1; /* nothing was written to the connection yet */
        int ok = redisAppendFormattedCommand(c, cmd, (size_t)len);
        redisFreeCommand(cmd);
        if (ok != REDIS_OK)
            return idem_store_ctx_fail(p->store, "EVALSHA", NULL, errstr,
                                       errstr_size);
    }
    int failed = 0, noscript = 0;
    char first[256] = "";
    for (size_t i = 0; i < k; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK || !r)
            return idem_store_ctx_fail(p->store, "EVALSHA", NULL, errstr,
                                       errstr_size);
        rcs[i] = 0;
        if (r->type != REDIS_REPLY_ERROR) {
            if (chunk_reply(r, ch[i].n, results[i], &windows[i]) && !failed) {
                failed = 1;
                snprintf(first, sizeof(first), "unexpected reply");
            }
            continue;
        }
        if (!strncmp(r->str, "FENCED ", 7))
            rcs[i] = IDEM_PARTSTATE_FENCED;
        else if (!strncmp(r->str, "POSITION ", 9))
            rcs[i] = IDEM_PARTSTATE_POSITION;
        else if (!strncmp(r->str, "LAYOUT ", 7))
            rcs[i] = IDEM_PARTSTATE_LAYOUT;
        else if (!strncmp(r->str, "NOSCRIPT", 8))
            noscript = 1;
        else if (!failed) {
            failed = 1;
            snprintf(first, sizeof(first), "%s", r->str);
        }
        if (rcs[i])
            snprintf(errstr, errstr_size, "redis: partition %s:%" PRId32 ": %s",
                     ch[i].topic, ch[i].partition, r->str);
        freeReplyObject(r);
    }
    if (noscript) {
        p->sha[0] = '\0'; /* loaded again by the next call */
        snprintf(errstr, errstr_size,
                 "redis: scripts were flushed; the chunks are sent again");
        return -1;
    }
    if (failed)
        return idem_store_ctx_fail(p->store, "EVALSHA partition chunk", first,
                                   errstr, errstr_size);
    return 0;
}

void idem_partstate_honour_global(idem_partstate_t *p, int on)
{
    p->honour_global = on;
}

int idem_partstate_chunk(idem_partstate_t *p, const idem_partstate_chunk_t *ch,
                         idem_partstate_result_t *results, int64_t *window,
                         char *errstr, size_t errstr_size)
{
    int rc = 0;
    /* A NOSCRIPT chunk wrote nothing: one chunk alone is sent again. */
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!idem_partstate_chunks(p, ch, 1, &results, window, &rc, errstr,
                                   errstr_size))
            return rc;
        if (p->sha[0])
            return -1;
    }
    return -1;
}
