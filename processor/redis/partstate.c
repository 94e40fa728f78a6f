/* partstate: the partition layout of the dedup state in Redis: epochs,
 * window keys of marks and the chunk script (partchunk.lua with
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
#include <strings.h>
#include <sys/random.h>

/* redis/partchunk.lua, as the build embeds it (Makefile: LUA_SRCS). */
extern const char idem_partchunk_lua[];
extern const size_t idem_partchunk_lua_len;

#define PIECE_DEFAULT (1u << 20) /* bytes per GETRANGE */
/* Records of one script call at most (more chunks are pipelined calls):
 * Redis runs a call as one command, so this bounds how long it blocks. */
#define CALL_RECORDS 4096

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
    const char **argv; /* scratch: one record's arguments */
    size_t *argvlen;
    size_t argv_cap;
    char *cmd; /* scratch: the call being formatted (RESP) */
    size_t cmd_len, cmd_cap;
    char layout_key[512]; /* the group's layout key (redis/layout.h) */
    int honour_global;    /* identities sent with the records */
    const char *route;    /* cluster mode: the key whose slot a command
                             without a key (TIME, SCRIPT LOAD) goes to */
    int64_t part_max;     /* bytes of marks per window key part
                             (dedup.window.key.max) */
    uint8_t key[16];      /* the group's hash key, once read */
    int have_key;
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
        /* Decided by what the handler registered, not by its name: a
         * handler whose effect runs in Redis (IDEM_EFFECT_IN_REDIS,
         * effect/handler.h) registers one; redis/ does not know the
         * registry, so the text names the kind, not handlers. */
        snprintf(errstr, errstr_size,
                 "dedup.scope=partition: the handler registered no effect "
                 "that runs in Redis (an external effect, claimed and marked "
                 "by the loop, runs with dedup.scope=global)");
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
    p->part_max = conf->dedup_window_key_max;
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
    free(p->cmd);
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
    /* Cluster mode: to the primary of the key's slot (argv[1]). */
    int keyed = argc > 1 && strcmp(argv[0], "SCRIPT");
    const char *key = keyed ? argv[1] : p->route;
    size_t klen = keyed && argvlen ? argvlen[1] : key ? strlen(key) : 0;
    redisContext *c =
        idem_store_ctx_key(p->store, write, key, klen, errstr, errstr_size);
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
    /* A key already read is written back, not a new one: a Redis (a
     * cluster node) that lost it may still hold marks made with it
     * elsewhere, and a new key would make them unreadable. */
    const uint8_t *v = p->have_key ? p->key : fresh;
    const char *sargv[] = {"SET", k, (const char *)v, "NX"};
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
    if (p->have_key && memcmp(p->key, r->str, 16) &&
        idem_store_cluster(p->store)) {
        /* Lost, and another member wrote a new one before this one wrote
         * it back: the marks on the other nodes were made with the old
         * key and would not be found. An outage, never a double effect
         * (docs/guarantees.md, "Redis Cluster mode"). */
        freeReplyObject(r);
        snprintf(errstr, errstr_size,
                 "redis cluster: %s holds another key than the marks of "
                 "this member were made with (the node lost it): the "
                 "partition marks cannot be read; restore the key",
                 k);
        return -1;
    }
    memcpy(key, r->str, 16);
    memcpy(p->key, r->str, 16);
    p->have_key = 1;
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

/* Reads one window key (or part) of a partition in pieces, calling cb for
 * each piece that holds marks; an absent (or expired) key reads as empty,
 * and *empty (may be NULL) says whether it was. */
static int load_window(idem_partstate_t *p, const char *key, int64_t w,
                       size_t piece, idem_partstate_marks_fn cb, void *opaque,
                       size_t *pieces, int *empty, char *errstr,
                       size_t errstr_size)
{
    size_t keylen = strlen(key);
    if (empty)
        *empty = 1;
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
        size_t got = r->len, n = got / IDEM_PARTSTATE_MARK;
        if (got % IDEM_PARTSTATE_MARK) {
            freeReplyObject(r);
            snprintf(errstr, errstr_size,
                     "redis: %s is not whole marks (%zu bytes at %zu)", key,
                     got, off);
            return -1;
        }
        if (pieces && n)
            (*pieces)++;
        if (empty && n)
            *empty = 0;
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

/* Cluster mode: the group's hash key (an untagged key, on its own node)
 * is copied under the partition's tag the first time the partition is
 * loaded, and compared at every later load. The group's key may be lost
 * with its node while the partition's marks live on: a member that then
 * started made a new key, and the marks made with the old one would not be
 * found (an effect applied twice). A copy that differs is an outage for
 * the partition, naming both keys, never a load (docs/guarantees.md,
 * "Redis Cluster mode"). A partition whose state is gone has no copy and
 * takes the current key. */
static int key_copy_check(idem_partstate_t *p, const char *st, char *errstr,
                          size_t errstr_size)
{
    if (!idem_store_cluster(p->store) || !p->have_key)
        return 0;
    char k[704];
    snprintf(k, sizeof(k), "%shashkey", st);
    const char *sargv[] = {"SET", k, (const char *)p->key, "NX"};
    const size_t slen[] = {3, strlen(k), sizeof(p->key), 2};
    redisReply *r = command(p, 1, 4, sargv, slen, errstr, errstr_size);
    if (!r)
        return -1;
    freeReplyObject(r);
    const char *gargv[] = {"GET", k};
    r = command(p, 0, 2, gargv, NULL, errstr, errstr_size);
    if (!r)
        return -1;
    if (r->type != REDIS_REPLY_STRING || r->len != sizeof(p->key))
        return unexpected(p, r, "GET hashkey", errstr, errstr_size);
    int same = !memcmp(r->str, p->key, sizeof(p->key));
    freeReplyObject(r);
    if (same)
        return 0;
    snprintf(errstr, errstr_size,
             "redis cluster: %s holds another hash key than %sdedupkey:%s: "
             "the group's key was lost and made again, and this "
             "partition's marks were made with the old one; restore the "
             "group's key from this copy (docs/guarantees.md)",
             k, p->conf->redis_prefix,
             p->conf->group_id ? p->conf->group_id : "");
    return -1;
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
    int64_t now;
    char st[640], k[704];
    stem(p, topic, partition, st, sizeof(st));
    if (key_copy_check(p, st, errstr, errstr_size))
        return -1;
    p->route = st; /* cluster mode: the partition's node's clock */
    int trc = idem_partstate_now(p, &now, errstr, errstr_size);
    p->route = NULL;
    if (trc)
        return -1;
    /* Window w lives until (w + 1) * W + TTL: from the first that can
     * still live to the current one, plus one for a server whose clock is
     * behind the one that wrote (a failover). */
    int64_t W = p->window, ttl = p->conf->dedup_ttl_seconds;
    int64_t lo = (now - ttl) / W - 1, hi = now / W + 1;
    if (lo < 0)
        lo = 0;
    for (int64_t w = lo; w <= hi; w++) {
        /* The window's key, then its parts .1, .2, ... until one is
         * missing (partchunk.lua writes a part only once the one before
         * holds dedup.window.key.max bytes; parts are never empty). */
        for (int64_t part = 0;; part++) {
            int empty = 1;
            if (part)
                snprintf(k, sizeof(k), "%sw%" PRId64 ".%" PRId64, st, w, part);
            else
                snprintf(k, sizeof(k), "%sw%" PRId64, st, w);
            if (load_window(p, k, w, piece, cb, opaque, pieces, &empty, errstr,
                            errstr_size))
                return -1;
            if (empty)
                break;
        }
    }
    return 0;
}

/* Appends bytes to the RESP command being built in p->cmd. */
static void cmd_put(idem_partstate_t *p, const char *b, size_t n)
{
    if (p->cmd_len + n > p->cmd_cap) {
        size_t cap = p->cmd_cap ? p->cmd_cap : 4096;
        while (cap < p->cmd_len + n)
            cap *= 2;
        p->cmd = idem_xrealloc(p->cmd, cap);
        p->cmd_cap = cap;
    }
    memcpy(p->cmd + p->cmd_len, b, n);
    p->cmd_len += n;
}

/* Appends one bulk string ("$<len>\r\n<bytes>\r\n"). */
static void cmd_arg(idem_partstate_t *p, const char *b, size_t n)
{
    char head[32];
    int hl = snprintf(head, sizeof(head), "$%zu\r\n", n);
    cmd_put(p, head, (size_t)hl);
    cmd_put(p, b, n);
    cmd_put(p, "\r\n", 2);
}

static void cmd_str(idem_partstate_t *p, const char *str)
{
    cmd_arg(p, str, strlen(str));
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

/* Reads the reply r of the call of chunks ch[0..k) into results, windows
 * and rcs (a refused chunk's text into errstr), and frees it. Returns 0,
 * or -1 when its shape is not the script's. */
static int call_reply(redisReply *r, const idem_partstate_chunk_t *ch, size_t k,
                      idem_partstate_result_t *const *results, int64_t *windows,
                      int *rcs, char *errstr, size_t errstr_size)
{
    int ok = r->type == REDIS_REPLY_ARRAY && r->elements >= 1 + k &&
             (r->elements - 1 - k) % 2 == 0 &&
             r->element[0]->type == REDIS_REPLY_INTEGER;
    for (size_t c = 0; ok && c < k; c++)
        ok = r->element[1 + c]->type == REDIS_REPLY_STRING;
    if (!ok) {
        freeReplyObject(r);
        return -1;
    }
    for (size_t c = 0; c < k; c++) {
        const redisReply *st = r->element[1 + c];
        windows[c] = r->element[0]->integer;
        rcs[c] = 0;
        if (st->len) {
            rcs[c] = !strncmp(st->str, "FENCED ", 7) ? IDEM_PARTSTATE_FENCED
                                                     : IDEM_PARTSTATE_POSITION;
            snprintf(errstr, errstr_size, "redis: partition %s:%" PRId32 ": %s",
                     ch[c].topic, ch[c].partition, st->str);
            continue;
        }
        for (size_t i = 0; i < ch[c].n; i++) {
            results[c][i].outcome = IDEM_PARTSTATE_APPLIED;
            results[c][i].detail[0] = '\0';
        }
    }
    /* Records not simply applied: (number in the call from 1, text). */
    for (size_t e = 1 + k; e + 1 < r->elements; e += 2) {
        const redisReply *num = r->element[e], *txt = r->element[e + 1];
        if (num->type != REDIS_REPLY_INTEGER || txt->type != REDIS_REPLY_STRING)
            ok = 0;
        size_t c = 0, j = ok && num->integer > 0 ? (size_t)num->integer : 0;
        while (j && c < k && j > ch[c].n)
            j -= ch[c++].n;
        if (!j || c == k || rcs[c]) {
            ok = 0;
            continue;
        }
        idem_partstate_result_t *res = &results[c][j - 1];
        if (!strcmp(txt->str, "moved")) {
            res->outcome = IDEM_PARTSTATE_MOVED_MARK;
        } else if (!strncmp(txt->str, "global:", 7)) {
            res->outcome = IDEM_PARTSTATE_GLOBAL_DONE;
            snprintf(res->detail, sizeof(res->detail), "%s", txt->str + 7);
        } else if (!strncmp(txt->str, "reject:", 7)) {
            res->outcome = IDEM_PARTSTATE_REJECTED;
            snprintf(res->detail, sizeof(res->detail), "%s", txt->str + 7);
        } else {
            ok = 0;
        }
    }
    freeReplyObject(r);
    return ok ? 0 : -1;
}

/* The EVALSHA of chunks ch[0..k) as one script call, in RESP, into
 * p->cmd. 0, or -1 with errstr (a handler gave a record the wrong number
 * of arguments). */
static int call_format(idem_partstate_t *p, const idem_partstate_chunk_t *ch,
                       size_t k, char *errstr, size_t errstr_size)
{
    size_t nrec = 0;
    for (size_t c = 0; c < k; c++)
        nrec += ch[c].n;
    char num[32], st[640], key[672];
    p->cmd_len = 0;
    int hl = snprintf(num, sizeof(num), "*%zu\r\n",
                      3 + (k + 2) + 6 + 7 * k + 1 +
                          nrec * (p->per - 2 + (p->honour_global ? 1 : 0)));
    cmd_put(p, num, (size_t)hl);
    cmd_str(p, "EVALSHA");
    cmd_str(p, p->sha);
    snprintf(num, sizeof(num), "%zu", k + 2);
    cmd_str(p, num);
    for (size_t c = 0; c < k; c++) {
        stem(p, ch[c].topic, ch[c].partition, st, sizeof(st));
        snprintf(key, sizeof(key), "%sepoch", st);
        cmd_str(p, key);
    }
    if (idem_store_cluster(p->store)) {
        /* One partition's chunks, one slot: its own positions hash, and
         * in the layout key's place a key of the slot never read (the
         * flag "c" below: cluster mode runs the partition layout). */
        idem_store_pos_key(p->conf, ch[0].topic, ch[0].partition, key,
                           sizeof(key));
        cmd_str(p, key);
        stem(p, ch[0].topic, ch[0].partition, st, sizeof(st));
        snprintf(key, sizeof(key), "%slayout", st);
        cmd_str(p, key);
    } else {
        cmd_str(p, p->pos_key);
        cmd_str(p, p->layout_key); /* the layout block's, last */
    }
    cmd_str(p, p->conf->redis_prefix);
    cmd_str(p, p->conf->group_id ? p->conf->group_id : "");
    snprintf(num, sizeof(num), "%" PRId64, p->conf->dedup_ttl_seconds);
    cmd_str(p, num);
    snprintf(num, sizeof(num), "%" PRId64, p->window);
    cmd_str(p, num);
    snprintf(num, sizeof(num), "%zu", k);
    cmd_str(p, num);
    snprintf(num, sizeof(num), "%" PRId64, p->part_max);
    cmd_str(p, num);
    for (size_t c = 0; c < k; c++) {
        char pos[160] = "";
        stem(p, ch[c].topic, ch[c].partition, st, sizeof(st));
        cmd_str(p, st);
        snprintf(num, sizeof(num), "%" PRId64, ch[c].epoch);
        cmd_str(p, num);
        snprintf(num, sizeof(num), "%" PRId64, ch[c].expect_offset);
        cmd_str(p, num);
        const idem_store_pos_t *np = ch[c].newpos;
        if (np && !idem_posval_format(pos, sizeof(pos), np->offset, &np->val))
            snprintf(pos, sizeof(pos), "%" PRId64, np->offset);
        cmd_str(p, pos);
        snprintf(key, sizeof(key), "%s:%" PRId32, ch[c].topic, ch[c].partition);
        cmd_str(p, key);
        snprintf(num, sizeof(num), "%zu", ch[c].n);
        cmd_str(p, num);
        cmd_arg(p, ch[c].n ? (const char *)ch[c].marks[0] : "",
                ch[c].n * IDEM_PARTSTATE_MARK);
    }
    cmd_str(p, idem_store_cluster(p->store) ? "c"
               : p->honour_global           ? "1"
                                            : "0"); /* the layout block's */
    /* Each record's arguments go into the command at once: the handler's
     * texts for them need live only until its next records (the ledger
     * keeps them in a ring). */
    if (p->argv_cap < p->per) {
        p->argv = idem_xrealloc(p->argv, p->per * sizeof(*p->argv));
        p->argvlen = idem_xrealloc(p->argvlen, p->per * sizeof(*p->argvlen));
        p->argv_cap = p->per;
    }
    for (size_t c = 0; c < k; c++)
        for (size_t i = 0; i < ch[c].n; i++) {
            size_t got = p->args(ch[c].recs[i], p->argv, p->argvlen, p->opaque);
            if (got != p->per) {
                snprintf(errstr, errstr_size,
                         "partition chunk: %zu arguments for a record, not %zu",
                         got, p->per);
                return -1;
            }
            /* No identity, no message id: the chunk's marks carry them,
             * and arguments Redis need not parse are not sent. While a
             * switch from the global layout is honoured, the identity
             * goes, for the script to look its global mark up. */
            if (p->honour_global)
                cmd_arg(p, p->argv[0], p->argvlen[0]);
            for (size_t a = 2; a < got; a++)
                cmd_arg(p, p->argv[a], p->argvlen[a]);
        }
    return 0;
}

/* The chunks from ch[0] that go in one call: at least one, then as many
 * as keep the call within CALL_RECORDS records. */
static size_t call_span(const idem_partstate_chunk_t *ch, size_t k)
{
    size_t n = ch[0].n, m = 1;
    while (m < k && n + ch[m].n <= CALL_RECORDS)
        n += ch[m++].n;
    return m;
}

/* Cluster mode, redis.wait.replicas: WAIT on each node that applied
 * chunks of this request (keys[i] routes chunk i), on the connection that
 * carried them, each node counted on its own. A node short of the
 * replicas, or no longer the primary its chunks were applied on, fails
 * its applied chunks alone (IDEM_PARTSTATE_OUTAGE: their records go
 * again and the positions refuse the resend); *first (size bytes) gets
 * the first such error, naming the node, when it is still empty. */
static void chunks_cluster_wait(idem_partstate_t *p, const char (*keys)[672],
                                size_t k, int64_t *windows, int *rcs,
                                char *first, size_t size)
{
    char(*node)[300] = idem_xcalloc(k, sizeof(*node));
    int *waited = idem_xcalloc(k, sizeof(*waited));
    for (size_t i = 0; i < k; i++) {
        const char *a =
            rcs[i] ? NULL
                   : idem_store_key_node(p->store, keys[i], strlen(keys[i]));
        snprintf(node[i], sizeof(node[i]), "%s", a ? a : "");
    }
    for (size_t i = 0; i < k; i++) {
        if (rcs[i] || waited[i])
            continue;
        char e[512] = "";
        int bad = idem_store_ctx_wait(p->store, keys[i], strlen(keys[i]), e,
                                      sizeof(e));
        const char *now =
            bad ? NULL
                : idem_store_key_node(p->store, keys[i], strlen(keys[i]));
        if (!bad && (!now || strcmp(now, node[i]))) {
            bad = 1;
            snprintf(e, sizeof(e),
                     "redis cluster: WAIT: %s: its slots moved to %s before "
                     "WAIT",
                     node[i], now ? now : "no node");
        }
        if (bad && node[i][0] && !strstr(e, node[i])) {
            /* A lost connection's text names no node: say which. */
            char named[sizeof(e)];
            snprintf(named, sizeof(named), "redis cluster: %s: %s", node[i], e);
            snprintf(e, sizeof(e), "%s", named);
        }
        for (size_t q = i; q < k; q++) {
            if (rcs[q] || waited[q] || strcmp(node[q], node[i]))
                continue;
            waited[q] = 1;
            if (bad) {
                rcs[q] = IDEM_PARTSTATE_OUTAGE;
                windows[q] = -1;
            }
        }
        if (bad && !first[0])
            snprintf(first, size, "%s", e);
    }
    free(waited);
    free(node);
}

/* Cluster mode: each chunk alone, as one call to its partition's
 * primary, a request's calls pipelined per node (idem_store_ctx_calls:
 * one round trip per node, not per chunk; MOVED and TRYAGAIN followed,
 * ASK waited out, as the script touches keys it does not declare).
 * NOSCRIPT loads the script on that node and sends its chunks again. A
 * chunk whose call met an outage or an error reply fails alone
 * (IDEM_PARTSTATE_OUTAGE, errstr says why): the other chunks' answers
 * stand. Same contract as idem_partstate_chunks otherwise. */
static int chunks_cluster(idem_partstate_t *p, const idem_partstate_chunk_t *ch,
                          size_t k, idem_partstate_result_t *const *results,
                          int64_t *windows, int *rcs, char *errstr,
                          size_t errstr_size)
{
    char(*keys)[672] = idem_xmalloc(k * sizeof(*keys));
    size_t *lens = idem_xmalloc(k * 2 * sizeof(*lens));
    size_t *cmd_lens = lens, *off = lens + k;
    size_t *todo = idem_xmalloc(k * sizeof(*todo));
    redisReply **rep = idem_xcalloc(k, sizeof(*rep));
    char *buf = NULL;
    size_t buf_len = 0, buf_cap = 0;
    int rc = -1;
    for (size_t i = 0; i < k; i++) {
        char st[640];
        stem(p, ch[i].topic, ch[i].partition, st, sizeof(st));
        snprintf(keys[i], sizeof(keys[i]), "%sepoch", st);
        rcs[i] = IDEM_PARTSTATE_OUTAGE;
        windows[i] = -1;
    }
    /* The SHA from the first node that loads the script (it is the
     * same on every node; a node down fails only its own chunks). */
    for (size_t i = 0; i < k && !p->sha[0]; i++) {
        p->route = keys[i];
        int lrc = script_load(p, errstr, errstr_size);
        p->route = NULL;
        if (lrc && i + 1 == k)
            goto out;
    }
    /* Every call formatted first (the SHA is the script's, the same on
     * every node): nothing is sent when a record's arguments are wrong. */
    for (size_t i = 0; i < k; i++) {
        if (call_format(p, &ch[i], 1, errstr, errstr_size))
            goto out;
        if (buf_len + p->cmd_len > buf_cap) {
            buf_cap = (buf_len + p->cmd_len) * 2;
            buf = idem_xrealloc(buf, buf_cap);
        }
        memcpy(buf + buf_len, p->cmd, p->cmd_len);
        off[i] = buf_len;
        cmd_lens[i] = p->cmd_len;
        buf_len += p->cmd_len;
    }
    size_t nt = k;
    for (size_t i = 0; i < k; i++)
        todo[i] = i;
    char first[512] = "";
    for (int attempt = 0; attempt < 2 && nt; attempt++) {
        const char **tk = idem_xmalloc(nt * 2 * sizeof(*tk));
        const char **tc = tk + nt;
        size_t *tl = idem_xmalloc(nt * 2 * sizeof(*tl)), *tcl = tl + nt;
        redisReply **tr = idem_xcalloc(nt, sizeof(*tr));
        for (size_t j = 0; j < nt; j++) {
            tk[j] = keys[todo[j]];
            tl[j] = strlen(keys[todo[j]]);
            tc[j] = buf + off[todo[j]];
            tcl[j] = cmd_lens[todo[j]];
        }
        char e[512] = "";
        if (idem_store_ctx_calls(p->store, tk, tl, tc, tcl, nt, 1, tr, e,
                                 sizeof(e)) &&
            !first[0])
            snprintf(first, sizeof(first), "%s", e);
        size_t again = 0;
        for (size_t j = 0; j < nt; j++) {
            size_t i = todo[j];
            redisReply *r = tr[j];
            if (r && r->type == REDIS_REPLY_ERROR &&
                !strncmp(r->str, "NOSCRIPT", 8)) {
                freeReplyObject(r); /* not run on this node: load it there */
                todo[again++] = i;
            } else {
                rep[i] = r;
            }
        }
        free(tk);
        free(tl);
        free(tr);
        nt = again;
        /* The script on each node that said NOSCRIPT, once. */
        for (size_t j = 0; j < nt && attempt == 0; j++) {
            const char *node = idem_store_key_node(p->store, keys[todo[j]],
                                                   strlen(keys[todo[j]]));
            int seen = 0;
            for (size_t q = 0; q < j && node && !seen; q++) {
                const char *o = idem_store_key_node(p->store, keys[todo[q]],
                                                    strlen(keys[todo[q]]));
                seen = o && !strcmp(o, node);
            }
            if (seen)
                continue;
            p->route = keys[todo[j]];
            int lrc = script_load(p, e, sizeof(e));
            p->route = NULL;
            if (lrc && !first[0])
                snprintf(first, sizeof(first), "%s", e);
        }
    }
    if (nt && !first[0])
        snprintf(first, sizeof(first),
                 "redis: partition chunk: NOSCRIPT after SCRIPT LOAD");
    for (size_t i = 0; i < k; i++) {
        redisReply *r = rep[i];
        rep[i] = NULL;
        if (!r)
            continue; /* an outage: rcs[i] says so */
        if (r->type == REDIS_REPLY_ERROR) {
            char why[256], e[512];
            snprintf(why, sizeof(why), "%s", r->str);
            freeReplyObject(r);
            idem_store_ctx_fail(p->store, "EVALSHA partition chunk", why, e,
                                sizeof(e));
            if (!first[0])
                snprintf(first, sizeof(first), "%s", e);
            continue;
        }
        char e[512] = "";
        if (call_reply(r, &ch[i], 1, &results[i], &windows[i], &rcs[i], e,
                       sizeof(e))) {
            rcs[i] = IDEM_PARTSTATE_OUTAGE;
            windows[i] = -1;
            idem_store_ctx_fail(p->store, "EVALSHA partition chunk",
                                "unexpected reply", e, sizeof(e));
            if (!first[0])
                snprintf(first, sizeof(first), "%s", e);
        } else if (rcs[i]) {
            snprintf(errstr, errstr_size, "%s", e);
        }
    }
    if (p->conf->redis_wait_replicas > 0)
        chunks_cluster_wait(p, (const char(*)[672])keys, k, windows, rcs, first,
                            sizeof(first));
    if (first[0])
        snprintf(errstr, errstr_size, "%s", first);
    rc = 0;
out:
    for (size_t i = 0; i < k; i++)
        if (rep[i])
            freeReplyObject(rep[i]);
    free(rep);
    free(buf);
    free(todo);
    free(lens);
    free(keys);
    return rc;
}

int idem_partstate_chunks(idem_partstate_t *p, const idem_partstate_chunk_t *ch,
                          size_t k, idem_partstate_result_t *const *results,
                          int64_t *windows, int *rcs, char *errstr,
                          size_t errstr_size)
{
    if (!k)
        return 0;
    if (idem_store_cluster(p->store))
        return chunks_cluster(p, ch, k, results, windows, rcs, errstr,
                              errstr_size);
    if (!p->sha[0] && script_load(p, errstr, errstr_size))
        return -1;
    redisContext *c = idem_store_ctx(p->store, 1, errstr, errstr_size);
    if (!c)
        return -1;
    size_t calls = 0;
    for (size_t i = 0; i < k; calls++) {
        size_t m = call_span(&ch[i], k - i);
        if (call_format(p, &ch[i], m, errstr, errstr_size)) {
            if (!calls)
                return -1; /* nothing was written to the connection yet */
            /* Calls wait in the connection's buffer: dropped with it. */
            char why[256];
            snprintf(why, sizeof(why), "%s", errstr);
            return idem_store_ctx_fail(p->store, "EVALSHA", why, errstr,
                                       errstr_size);
        }
        if (redisAppendFormattedCommand(c, p->cmd, p->cmd_len) != REDIS_OK)
            return idem_store_ctx_fail(p->store, "EVALSHA", NULL, errstr,
                                       errstr_size);
        i += m;
    }
    int failed = 0, noscript = 0;
    char first[256] = "";
    for (size_t i = 0; i < k;) {
        size_t m = call_span(&ch[i], k - i);
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK || !r)
            return idem_store_ctx_fail(p->store, "EVALSHA", NULL, errstr,
                                       errstr_size);
        if (r->type != REDIS_REPLY_ERROR) {
            if (call_reply(r, &ch[i], m, &results[i], &windows[i], &rcs[i],
                           errstr, errstr_size) &&
                !failed) {
                failed = 1;
                snprintf(first, sizeof(first), "unexpected reply");
            }
        } else if (!strncmp(r->str, "LAYOUT ", 7)) {
            /* Nothing written: the layout is read again and the records
             * routed again (redis/layout.h). */
            for (size_t q = 0; q < m; q++) {
                rcs[i + q] = IDEM_PARTSTATE_LAYOUT;
                windows[i + q] = -1;
            }
            snprintf(errstr, errstr_size, "redis: partition chunk: %s", r->str);
            freeReplyObject(r);
        } else {
            if (!strncmp(r->str, "NOSCRIPT", 8))
                noscript = 1;
            else if (!failed) {
                failed = 1;
                snprintf(first, sizeof(first), "%s", r->str);
            }
            freeReplyObject(r);
        }
        i += m;
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
    /* redis.wait.replicas: a WAIT after the chunks, as after the global
     * layout's requests; short, the request is an outage (its applied
     * chunks' positions refuse the resend). */
    int applied = 0;
    for (size_t i = 0; i < k && !applied; i++)
        applied = !rcs[i];
    if (applied && idem_store_ctx_wait(p->store, NULL, 0, errstr, errstr_size))
        return -1;
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
            return rc == IDEM_PARTSTATE_OUTAGE ? -1 : rc;
        if (p->sha[0])
            return -1;
    }
    return -1;
}

/* The keys of one partition that a rights check names (rights[] below). */
typedef enum {
    RK_NONE = 0,
    RK_EPOCH,    /* <stem>epoch */
    RK_WINDOW,   /* <stem>w0 */
    RK_POS,      /* <prefix>pos{<tag>} (cluster mode's positions hash) */
    RK_LAYOUT,   /* the group's layout key */
    RK_DEDUPKEY, /* <prefix>dedupkey:<group> */
    RK_KEYCOPY,  /* <stem>hashkey */
    RK_EFFECT,   /* <stem>effect: an effect's keys depend on its records */
} rights_key_t;

#define RIGHT_ARGS 4 /* arguments after the command, at most */

/* One command as the check asks it: the command, its arguments ("$k":
 * the key, "$sha": a script digest), the key, why it is sent. Every
 * command is asked with whole arguments: Redis 7.0's acl_check_cmd finds
 * the keys by the command's key specs without checking its arity, and a
 * command cut short (EVALSHA alone) can crash the server. */
typedef struct {
    const char *cmd;
    const char *args[RIGHT_ARGS]; /* NULL-ended when shorter */
    rights_key_t key;
    const char *why;
} right_spec_t;

/* What a member in cluster mode sends for the partition layout: the chunk
 * script's commands (partchunk.lua), its loader's (this file), the
 * positions' and the layout key's (store.c) and the cluster client's
 * (cluster.c). Keep in step with them and with deploy/README.md's line. */
static const right_spec_t rights[] = {
    {"EVALSHA", {"$sha", "0"}, RK_NONE, "the chunk script"},
    {"TIME", {NULL}, RK_NONE, "the chunk's window and the loader's clock"},
    {"MGET", {"$k"}, RK_EPOCH, "the chunk reading its partition's epoch"},
    {"HMGET",
     {"$k", "f"},
     RK_POS,
     "the chunk reading its partition's position"},
    {"STRLEN",
     {"$k"},
     RK_WINDOW,
     "the chunk finding the open part of a window key"},
    {"APPEND", {"$k", "v"}, RK_WINDOW, "the chunk writing its marks"},
    {"EXPIREAT", {"$k", "0"}, RK_WINDOW, "the chunk's window key expiry"},
    {"HSET",
     {"$k", "f", "v"},
     RK_POS,
     "the chunk writing its partition's position"},
    {"INCR", {"$k"}, RK_EPOCH, "a new owner bumping the partition's epoch"},
    {"GETRANGE", {"$k", "0", "1"}, RK_WINDOW, "loading a partition's marks"},
    {"SET", {"$k", "v", "NX"}, RK_DEDUPKEY, "the group's hash key"},
    {"GET", {"$k"}, RK_DEDUPKEY, "reading the group's hash key"},
    {"SET",
     {"$k", "v", "NX"},
     RK_KEYCOPY,
     "the partition's copy of the hash key"},
    {"HGET", {"$k", "f"}, RK_POS, "reading a partition's position"},
    {"HSET", {"$k", "f", "v"}, RK_LAYOUT, "fixing the layout key"},
    {"HSETNX", {"$k", "f", "v"}, RK_LAYOUT, "the layout key's since field"},
    {"CLUSTER", {"SLOTS"}, RK_NONE, "reading the slot map"},
    {"ASKING", {NULL}, RK_NONE, "following ASK during a slot migration"},
};

static const right_spec_t right_wait = {
    "WAIT", {"1", "0"}, RK_NONE, "redis.wait.replicas"};

/* The commands an effect may call literally, with whole arguments (see
 * right_spec_t); effect_rights asks those of them the effect's source
 * calls. A command not here is not asked. */
static const right_spec_t effect_cmds[] = {
    {"EXISTS", {"$k"}, RK_EFFECT, NULL},
    {"GET", {"$k"}, RK_EFFECT, NULL},
    {"SET", {"$k", "v"}, RK_EFFECT, NULL},
    {"DEL", {"$k"}, RK_EFFECT, NULL},
    {"INCR", {"$k"}, RK_EFFECT, NULL},
    {"INCRBY", {"$k", "1"}, RK_EFFECT, NULL},
    {"DECRBY", {"$k", "1"}, RK_EFFECT, NULL},
    {"INCRBYFLOAT", {"$k", "1"}, RK_EFFECT, NULL},
    {"HGET", {"$k", "f"}, RK_EFFECT, NULL},
    {"HSET", {"$k", "f", "v"}, RK_EFFECT, NULL},
    {"HDEL", {"$k", "f"}, RK_EFFECT, NULL},
    {"HINCRBY", {"$k", "f", "1"}, RK_EFFECT, NULL},
    {"HINCRBYFLOAT", {"$k", "f", "1"}, RK_EFFECT, NULL},
    {"PTTL", {"$k"}, RK_EFFECT, NULL},
    {"PEXPIRE", {"$k", "1"}, RK_EFFECT, NULL},
    {"EXPIRE", {"$k", "1"}, RK_EFFECT, NULL},
};

/* The check: ARGV holds groups (the count of words, then the command and
 * its arguments), each asked of the caller's ACL with redis.acl_check_cmd
 * (it runs nothing); the numbers (from 1) of the groups refused. */
static const char rights_lua[] =
    "local out, i, g = {}, 1, 0\n"
    "while i <= #ARGV do\n"
    "  local n = tonumber(ARGV[i])\n"
    "  g = g + 1\n"
    "  local ok, yes = pcall(redis.acl_check_cmd, unpack(ARGV, i + 1, i + n))\n"
    "  if not ok or not yes then out[#out + 1] = g end\n"
    "  i = i + n + 1\n"
    "end\n"
    "return out\n";

#define RIGHTS_MAX 48 /* rights[], WAIT and the effect's commands */

/* The effect_cmds[] the effect calls, `redis.call('X'` or
 * `redis.pcall('X'` written literally (not the script handler's own
 * wrappers, which call through another name: an effect's idem.* keys are
 * the user's), each once, appended to out[*n]. */
static void effect_rights(const char *src, const right_spec_t **out, size_t *n)
{
    static const char *const pats[] = {"redis.call('", "redis.pcall('",
                                       "redis.call(\"", "redis.pcall(\""};
    for (size_t e = 0; e < sizeof(effect_cmds) / sizeof(effect_cmds[0]); e++) {
        size_t cl = strlen(effect_cmds[e].cmd);
        int found = 0;
        for (size_t k = 0; k < 4 && !found; k++) {
            size_t pl = strlen(pats[k]);
            for (const char *s = strstr(src, pats[k]); s && !found;
                 s = strstr(s + pl, pats[k])) {
                char c = s > src ? s[-1] : ' ';
                if (c == '_' || c == '.' || (c >= 'a' && c <= 'z') ||
                    (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
                    continue;
                found = !strncasecmp(s + pl, effect_cmds[e].cmd, cl) &&
                        (s[pl + cl] == '\'' || s[pl + cl] == '"');
            }
        }
        if (found && *n < RIGHTS_MAX)
            out[(*n)++] = &effect_cmds[e];
    }
}

/* "+strlen", "+cluster|slots": the ACL right of r. */
static void right_name(const right_spec_t *r, char *buf, size_t size)
{
    size_t o = 0;
    char sub[32] = "";
    if (!strcmp(r->cmd, "CLUSTER"))
        snprintf(sub, sizeof(sub), "|%s", r->args[0]);
    int w = snprintf(buf, size, "+%s%s", r->cmd, sub);
    for (o = 1; w > 0 && o < (size_t)w && o < size; o++)
        if (buf[o] >= 'A' && buf[o] <= 'Z')
            buf[o] = (char)(buf[o] + 32);
}

/* The key of kind k for partition 0 of topic into buf ("" for none). */
static void right_key(const idem_partstate_t *p, rights_key_t k,
                      const char *topic, char *buf, size_t size)
{
    char st[640];
    stem(p, topic, 0, st, sizeof(st));
    const char *g = p->conf->group_id ? p->conf->group_id : "";
    switch (k) {
    case RK_NONE:
        buf[0] = '\0';
        break;
    case RK_EPOCH:
        snprintf(buf, size, "%sepoch", st);
        break;
    case RK_WINDOW:
        snprintf(buf, size, "%sw0", st);
        break;
    case RK_POS:
        snprintf(buf, size, "%spos{%s:%s:0}", p->conf->redis_prefix, g, topic);
        break;
    case RK_LAYOUT:
        snprintf(buf, size, "%s", p->layout_key);
        break;
    case RK_DEDUPKEY:
        snprintf(buf, size, "%sdedupkey:%s", p->conf->redis_prefix, g);
        break;
    case RK_KEYCOPY:
        snprintf(buf, size, "%shashkey", st);
        break;
    case RK_EFFECT:
        snprintf(buf, size, "%seffect", st);
        break;
    }
}

/* Why a command of the check failed: the I/O error, the error reply or
 * an unexpected one (borrowed from c or r). */
static const char *reply_why(const redisContext *c, const redisReply *r)
{
    if (!r)
        return c->errstr;
    return r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply";
}

/* SCRIPT LOAD of src (len bytes) on c into sha. 0, or -1 with errstr
 * naming the node and `what`. */
static int node_load(redisContext *c, const char *node, const char *what,
                     const char *src, size_t len, char sha[41], char *errstr,
                     size_t errstr_size)
{
    const char *argv[] = {"SCRIPT", "LOAD", src};
    const size_t argvlen[] = {6, 4, len};
    redisReply *r = redisCommandArgv(c, 3, argv, argvlen);
    if (!r || r->type != REDIS_REPLY_STRING || r->len != 40) {
        snprintf(errstr, errstr_size,
                 "redis cluster: %s: SCRIPT LOAD of %s: %s", node, what,
                 reply_why(c, r));
        if (r)
            freeReplyObject(r);
        return -1;
    }
    memcpy(sha, r->str, 41);
    freeReplyObject(r);
    return 0;
}

int idem_partstate_node_check(idem_partstate_t *p, idem_redisconn_t *rc,
                              const char *topic, char *errstr,
                              size_t errstr_size)
{
    redisContext *c = idem_redisconn_context(rc);
    const char *node = idem_redisconn_addr(rc);
    char chunk_sha[41], check_sha[41];
    if (node_load(c, node, "the partition chunk script", p->src, p->src_len,
                  chunk_sha, errstr, errstr_size) ||
        node_load(c, node, "the ACL check", rights_lua, strlen(rights_lua),
                  check_sha, errstr, errstr_size))
        return -1;

    const right_spec_t *list[RIGHTS_MAX];
    size_t n = 0;
    for (size_t i = 0; i < sizeof(rights) / sizeof(rights[0]); i++)
        list[n++] = &rights[i];
    if (p->conf->redis_wait_replicas > 0)
        list[n++] = &right_wait;
    effect_rights(p->src, list, &n);

    /* EVALSHA check 0, then per command: its word count, the words. */
    char(*keys)[1300] = idem_xcalloc(n, sizeof(*keys));
    char(*counts)[4] = idem_xcalloc(n, sizeof(*counts));
    const char **argv = idem_xcalloc(3 + n * (2 + RIGHT_ARGS), sizeof(*argv));
    size_t a = 0;
    argv[a++] = "EVALSHA";
    argv[a++] = check_sha;
    argv[a++] = "0";
    for (size_t i = 0; i < n; i++) {
        right_key(p, list[i]->key, topic, keys[i], sizeof(keys[i]));
        size_t at = a++, w = 1;
        argv[a++] = list[i]->cmd;
        for (size_t j = 0; j < RIGHT_ARGS && list[i]->args[j]; j++, w++) {
            const char *x = list[i]->args[j];
            argv[a++] = !strcmp(x, "$k")     ? keys[i]
                        : !strcmp(x, "$sha") ? chunk_sha
                                             : x;
        }
        snprintf(counts[i], sizeof(counts[i]), "%zu", w);
        argv[at] = counts[i];
    }
    redisReply *r = redisCommandArgv(c, (int)a, argv, NULL);
    int rc_ = -1;
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        snprintf(errstr, errstr_size, "redis cluster: %s: the ACL check: %s",
                 node, reply_why(c, r));
    } else if (!r->elements) {
        rc_ = 0;
    } else {
        size_t o = (size_t)snprintf(
            errstr, errstr_size,
            "redis cluster: %s: the ACL user (redis.username) lacks", node);
        for (size_t i = 0; i < r->elements && o < errstr_size; i++) {
            long long k = r->element[i]->integer;
            if (r->element[i]->type != REDIS_REPLY_INTEGER || k < 1 ||
                (size_t)k > n)
                continue;
            const right_spec_t *x = list[k - 1];
            char name[48];
            right_name(x, name, sizeof(name));
            o += (size_t)snprintf(errstr + o, errstr_size - o, "%s %s (%s%s%s)",
                                  i ? "," : "", name,
                                  x->why ? x->why : "the handler's effect",
                                  keys[k - 1][0] ? ", key " : "", keys[k - 1]);
        }
    }
    if (r)
        freeReplyObject(r);
    free(argv);
    free(counts);
    free(keys);
    return rc_;
}
