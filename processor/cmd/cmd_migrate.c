/* cmd_migrate: `idemproc migrate --from URL -c FILE`: one group's state
 * copied, with the group stopped, from a single Redis to the Redis Cluster
 * of the configuration (README, "Redis Cluster"; docs/guarantees.md,
 * "Moving from one Redis to a cluster"). */
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "base/util.h"
#include "conf/conf.h"
#include "effect/handler.h"
#include "redis/cluster.h"
#include "redis/layout.h"
#include "redis/liveness.h"
#include "redis/redisconn.h"
#include "redis/store.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis.h>

void idem_cmd_migrate_usage(FILE *out)
{
    fprintf(
        out,
        "usage: idemproc migrate --from URL -c FILE [--force] [--no-ledger]\n"
        "                        [--script-keys PATTERN[,PATTERN...]]\n"
        "  Copies group.id's state from the single Redis at URL "
        "(redis[s]://...) to\n"
        "  the Redis Cluster of FILE (redis.cluster.nodes), with the group "
        "stopped:\n"
        "  each partition's dedup state (epoch, window keys and their parts, "
        "with\n"
        "  their remaining TTL), the group's dedup hash key, its layout key, "
        "the\n"
        "  positions (one hash per partition on the cluster), the global "
        "path's\n"
        "  marks (<prefix>dedup:<group>:<identity> to their cluster name "
        "under\n"
        "  their bucket's tag), the ledger (each <prefix>ledger:<CUR> and\n"
        "  ledger:applied into the shard of the group's first partition) and "
        "a\n"
        "  script effect's keys (--script-keys: each key whole into the same\n"
        "  shard, <name>{<group>:<topic>:<partition>}); then checks that the\n"
        "  cluster's balances grew by the source's, that no member started "
        "meanwhile,\n"
        "  and writes <prefix>migrated{<group>}.\n"
        "  Refused while the group has live members (on either side), when "
        "the\n"
        "  source does not run the partition layout, and when the cluster "
        "already\n"
        "  holds state of the group or ledger keys (--force: copy over it, "
        "replacing\n"
        "  what it copies). Run again after it ended: nothing to do.\n"
        "  --no-ledger: leave the ledger (already moved by another group "
        "sharing\n"
        "  redis.prefix).\n"
        "  --script-keys PATTERN,...: the keys a script handler's effect "
        "writes on the\n"
        "  source (SCAN patterns, e.g. 'bal:*,applied'); required with "
        "script.file.\n"
        "  Strings and hashes only (a cluster reads them as the sum of the "
        "shards).\n"
        "  Exit 0 copied (or nothing to do), 1 a failure or a refusal, 2 "
        "usage.\n");
}

typedef struct {
    const char *from;
    int force;
    int no_ledger;
    const char *script_keys; /* --script-keys, or NULL */
} migrate_opts_t;

static const struct option migrate_options[] = {
    {"from", required_argument, NULL, 'F'},
    {"force", no_argument, NULL, 'f'},
    {"no-ledger", no_argument, NULL, 'L'},
    {"script-keys", required_argument, NULL, 'S'},
    {NULL, 0, NULL, 0}};

static int migrate_opt(int opt, const char *arg, void *opaque)
{
    migrate_opts_t *o = opaque;
    if (opt == 'F')
        o->from = arg;
    else if (opt == 'f')
        o->force = 1;
    else if (opt == 'L')
        o->no_ledger = 1;
    else if (opt == 'S')
        o->script_keys = arg;
    else
        return -1;
    return 0;
}

/* A list of key names (SCAN's harvest). */
typedef struct {
    char **v;
    size_t n, cap;
} keys_t;

static void keys_add(keys_t *k, const char *s, size_t len)
{
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 64;
        k->v = idem_xrealloc(k->v, k->cap * sizeof(*k->v));
    }
    k->v[k->n] = idem_xmalloc(len + 1);
    memcpy(k->v[k->n], s, len);
    k->v[k->n++][len] = '\0';
}

static void keys_free(keys_t *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i]);
    free(k->v);
    memset(k, 0, sizeof(*k));
}

/* One currency's balances summed over every user (uint64: the check
 * compares sums that may wrap). */
typedef struct {
    char cur[64];
    uint64_t src, before, replaced, after;
    size_t fields;
} cursum_t;

typedef struct {
    const idem_conf_t *conf; /* cluster mode; borrowed */
    idem_conf_t src_conf;    /* conf with redis.url = --from, no cluster */
    idem_redisconn_t *src_rc;
    redisContext *src; /* src_rc's */
    idem_cluster_t *cl;
    const migrate_opts_t *o;
    char tag[600]; /* the ledger's shard: "{<group>:<topic>:<partition>}" */
    cursum_t sums[64];
    size_t nsums;
    size_t state_keys, state_gone, positions, ledger_keys;
    size_t gmarks, gmarks_gone, script_copied, script_gone, script_own;
    size_t pieced; /* keys copied in pieces (longer than PIECE_BYTES) */
    uint64_t state_bytes, gmark_bytes, script_bytes;
    keys_t script; /* the script effect's keys on the source, sorted */
} migrate_t;

/* A string longer than this is copied in pieces of this size (GETRANGE
 * on the source, SET then APPEND on the cluster) instead of one DUMP and
 * RESTORE, so neither side holds a reply of the whole value (a window key
 * may reach 256 MiB). */
#define PIECE_BYTES (1024 * 1024)

/* s with Redis glob characters escaped, into buf. */
static const char *glob_escape(const char *s, char *buf, size_t size)
{
    size_t j = 0;
    for (; *s && j + 2 < size; s++) {
        if (strchr("*?[]\\", *s))
            buf[j++] = '\\';
        buf[j++] = *s;
    }
    buf[j] = '\0';
    return buf;
}

/* SCAN MATCH pattern on c, every key appended to out. 0, or -1. */
static int scan_into(redisContext *c, const char *where, const char *pattern,
                     keys_t *out, char *errstr, size_t errstr_size)
{
    char cursor[32] = "0";
    do {
        redisReply *r =
            redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            snprintf(errstr, errstr_size, "%s: SCAN %s: %s", where, pattern,
                     !r                             ? c->errstr
                     : r->type == REDIS_REPLY_ERROR ? r->str
                                                    : "unexpected reply");
            if (r)
                freeReplyObject(r);
            return -1;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        for (size_t i = 0; i < r->element[1]->elements; i++)
            keys_add(out, r->element[1]->element[i]->str,
                     r->element[1]->element[i]->len);
        freeReplyObject(r);
    } while (strcmp(cursor, "0"));
    return 0;
}

/* SCAN MATCH pattern on every primary of the cluster. 0, or -1. */
static int scan_cluster(migrate_t *m, const char *pattern, keys_t *out,
                        char *errstr, size_t errstr_size)
{
    for (size_t k = 0;; k++) {
        idem_cluster_err_t e;
        const char *addr = NULL;
        redisContext *c = idem_cluster_primary_context(m->cl, k, &addr, &e);
        if (!c && e.cls == IDEM_CLUSTER_ERR_NONE)
            return 0;
        if (!c) {
            snprintf(errstr, errstr_size, "cluster: %s", e.str);
            return -1;
        }
        if (scan_into(c, addr, pattern, out, errstr, errstr_size))
            return -1;
    }
}

/* A command on the cluster, to the primary of key's slot. The reply
 * (caller frees), or NULL with errstr (an outage). */
static redisReply *dst_command(migrate_t *m, const char *key, int argc,
                               const char **argv, const size_t *argvlen,
                               char *errstr, size_t errstr_size)
{
    idem_cluster_err_t e;
    redisReply *r =
        idem_cluster_command(m->cl, key, strlen(key), argc, argv, argvlen, &e);
    if (!r)
        snprintf(errstr, errstr_size, "cluster: %s %s: %s", argv[0], key,
                 e.str);
    return r;
}

/* A reply that must not be an error: 0, or -1 with errstr (frees r). */
static int reply_ok(redisReply *r, const char *what, const char *key,
                    char *errstr, size_t errstr_size)
{
    if (r && r->type != REDIS_REPLY_ERROR)
        return 0;
    if (r) {
        snprintf(errstr, errstr_size, "%s %s: %s", what, key, r->str);
        freeReplyObject(r);
    }
    return -1;
}

/* The string src_key (len bytes, ttl as PTTL said) copied to dst_key in
 * pieces of PIECE_BYTES: the first SET (NX unless replace; PX ttl), the
 * others APPENDed, each reply checked against the length so far. 1
 * copied, 0 the key was gone or shorter meanwhile (expired; dst_key
 * deleted again), -1 with errstr. */
static int copy_pieces(migrate_t *m, const char *src_key, const char *dst_key,
                       int replace, long long ttl, long long len,
                       uint64_t *bytes, char *errstr, size_t errstr_size)
{
    char ttl_s[32];
    snprintf(ttl_s, sizeof(ttl_s), "%lld", ttl);
    for (long long off = 0; off < len; off += PIECE_BYTES) {
        long long want = len - off < PIECE_BYTES ? len - off : PIECE_BYTES;
        redisReply *g = redisCommand(m->src, "GETRANGE %s %lld %lld", src_key,
                                     off, off + want - 1);
        if (!g || g->type != REDIS_REPLY_STRING) {
            snprintf(errstr, errstr_size, "source: GETRANGE %s: %s", src_key,
                     !g       ? m->src->errstr
                     : g->str ? g->str
                              : "unexpected reply");
            if (g)
                freeReplyObject(g);
            return -1;
        }
        if ((long long)g->len != want) { /* expired (or cut) meanwhile */
            freeReplyObject(g);
            const char *argv[] = {"DEL", dst_key};
            redisReply *r =
                dst_command(m, dst_key, 2, argv, NULL, errstr, errstr_size);
            if (reply_ok(r, "cluster: DEL", dst_key, errstr, errstr_size))
                return -1;
            freeReplyObject(r);
            return 0;
        }
        redisReply *r;
        if (!off) {
            const char *argv[] = {"SET", dst_key, g->str, "PX", ttl_s, "NX"};
            size_t argvlen[] = {3, strlen(dst_key), g->len,
                                2, strlen(ttl_s),   2};
            size_t argc = ttl > 0 ? 5 : 3;
            if (!replace) { /* NX last */
                argv[argc] = "NX";
                argvlen[argc++] = 2;
            }
            r = dst_command(m, dst_key, (int)argc, argv, argvlen, errstr,
                            errstr_size);
        } else {
            const char *argv[] = {"APPEND", dst_key, g->str};
            size_t argvlen[] = {6, strlen(dst_key), g->len};
            r = dst_command(m, dst_key, 3, argv, argvlen, errstr, errstr_size);
        }
        freeReplyObject(g);
        if (reply_ok(r, off ? "cluster: APPEND" : "cluster: SET", dst_key,
                     errstr, errstr_size))
            return -1;
        int bad =
            off ? r->type != REDIS_REPLY_INTEGER || r->integer != off + want
                : r->type != REDIS_REPLY_STATUS;
        freeReplyObject(r);
        if (bad) {
            snprintf(errstr, errstr_size, "cluster: %s %s: %s",
                     off ? "APPEND" : "SET", dst_key,
                     off ? "the key's length is not what was copied so far "
                           "(written by someone else meanwhile?)"
                         : "the key exists (BUSYKEY; --force replaces it)");
            return -1;
        }
        *bytes += (uint64_t)want;
    }
    m->pieced++;
    return 1;
}

/* Copies the source's key src_key to the cluster's dst_key with DUMP and
 * RESTORE, keeping its remaining time to live (read first, so the copy
 * never outlives the original by less). 1 copied (its bytes added to
 * *bytes), 0 the key was gone meanwhile (expired), -1 with errstr. With
 * replace, an existing dst_key is overwritten (else BUSYKEY fails). */
static int copy_key(migrate_t *m, const char *src_key, const char *dst_key,
                    int replace, uint64_t *bytes, char *errstr,
                    size_t errstr_size)
{
    redisReply *t = redisCommand(m->src, "PTTL %s", src_key);
    if (!t || t->type != REDIS_REPLY_INTEGER) {
        snprintf(errstr, errstr_size, "source: PTTL %s: %s", src_key,
                 !t       ? m->src->errstr
                 : t->str ? t->str
                          : "unexpected reply");
        if (t)
            freeReplyObject(t);
        return -1;
    }
    long long ttl = t->integer;
    freeReplyObject(t);
    if (ttl == -2)
        return 0;
    redisReply *l = redisCommand(m->src, "STRLEN %s", src_key);
    long long len = l && l->type == REDIS_REPLY_INTEGER ? l->integer : 0;
    if (l)
        freeReplyObject(l);
    else {
        snprintf(errstr, errstr_size, "source: STRLEN %s: %s", src_key,
                 m->src->errstr);
        return -1;
    }
    if (len > PIECE_BYTES) /* a string (else WRONGTYPE: len 0) */
        return copy_pieces(m, src_key, dst_key, replace, ttl, len, bytes,
                           errstr, errstr_size);
    redisReply *d = redisCommand(m->src, "DUMP %s", src_key);
    if (!d || (d->type != REDIS_REPLY_STRING && d->type != REDIS_REPLY_NIL)) {
        snprintf(errstr, errstr_size, "source: DUMP %s: %s", src_key,
                 !d       ? m->src->errstr
                 : d->str ? d->str
                          : "unexpected reply");
        if (d)
            freeReplyObject(d);
        return -1;
    }
    if (d->type == REDIS_REPLY_NIL) {
        freeReplyObject(d);
        return 0;
    }
    char ttl_s[32];
    snprintf(ttl_s, sizeof(ttl_s), "%lld", ttl < 0 ? 0LL : ttl);
    const char *argv[] = {"RESTORE", dst_key, ttl_s, d->str, "REPLACE"};
    size_t argvlen[] = {7, strlen(dst_key), strlen(ttl_s), d->len, 7};
    *bytes += d->len;
    redisReply *r = dst_command(m, dst_key, replace ? 5 : 4, argv, argvlen,
                                errstr, errstr_size);
    freeReplyObject(d);
    if (reply_ok(r, "cluster: RESTORE", dst_key, errstr, errstr_size))
        return -1;
    freeReplyObject(r);
    return 1;
}

/* Refuses while a member of the group beats on either side: before the
 * copy (after: 0), and again after it (after: 1), for a member started
 * while it ran (its writes may be missing from the copy, or its beat
 * says it runs on the cluster already). */
static int no_live_members(migrate_t *m, int after, char *errstr,
                           size_t errstr_size)
{
    const idem_conf_t *side[2] = {&m->src_conf, m->conf};
    const char *name[2] = {"the source", "the cluster"};
    for (int i = 0; i < 2; i++) {
        idem_liveness_member_t *v = NULL;
        size_t n = 0;
        if (idem_liveness_list(side[i], &v, &n, errstr, errstr_size))
            return -1;
        if (n && !after)
            snprintf(errstr, errstr_size,
                     "refused: member %s of group %s is live on %s (stop "
                     "every member first; nothing copied)",
                     v[0].member, m->conf->group_id, name[i]);
        else if (n)
            snprintf(errstr, errstr_size,
                     "failed: member %s of group %s started on %s during "
                     "the copy: what it wrote may be missing from the copy "
                     "(marker not written; stop every member, then migrate "
                     "again with --force)",
                     v[0].member, m->conf->group_id, name[i]);
        idem_liveness_list_free(v, n);
        if (n)
            return -1;
    }
    return 0;
}

/* The source must run the partition layout, and no longer honour the
 * global marks of a switch (cluster mode never reads them). */
static int source_layout_ok(migrate_t *m, char *errstr, size_t errstr_size)
{
    idem_layout_t l;
    if (idem_layout_read(m->src, &m->src_conf, &l, errstr, errstr_size))
        return -1;
    if (l.layout != IDEM_LAYOUT_PARTITION) {
        snprintf(errstr, errstr_size,
                 "refused: the source runs the %s dedup layout (cluster "
                 "mode needs partition: run the group with "
                 "dedup.scope=partition first; nothing copied)",
                 idem_layout_kind2str(l.layout));
        return -1;
    }
    if (idem_layout_honours(&l, m->conf->dedup_ttl_seconds, l.now) &&
        !m->o->force) {
        snprintf(errstr, errstr_size,
                 "refused: the source switched from %s %" PRId64
                 " s ago and still honours its marks for %" PRId64
                 " s, which cluster mode does not read (wait, or --force; "
                 "nothing copied)",
                 idem_layout_kind2str(l.from), l.now - l.since,
                 l.since + m->conf->dedup_ttl_seconds - l.now);
        return -1;
    }
    return 0;
}

/* The marker written last: 1 when the cluster says this group was
 * migrated (its text printed), 0 when not, -1 with errstr. */
static int already_migrated(migrate_t *m, char *errstr, size_t errstr_size)
{
    char key[512];
    snprintf(key, sizeof(key), "%smigrated{%s}", m->conf->redis_prefix,
             m->conf->group_id);
    const char *argv[] = {"GET", key};
    redisReply *r = dst_command(m, key, 2, argv, NULL, errstr, errstr_size);
    if (reply_ok(r, "cluster: GET", key, errstr, errstr_size))
        return -1;
    int done = r->type == REDIS_REPLY_STRING;
    if (done)
        printf("group %s: already migrated (%s holds \"%s\"): nothing to "
               "do\n",
               m->conf->group_id, key, r->str);
    freeReplyObject(r);
    return done;
}

/* Refuses (without --force) when the cluster holds anything of the group,
 * or any ledger key (the ledger of one Redis is not per group). */
static int target_empty(migrate_t *m, char *errstr, size_t errstr_size)
{
    if (m->o->force)
        return 0;
    char g[256], p[256], pat[20][600];
    glob_escape(m->conf->group_id, g, sizeof(g));
    glob_escape(m->conf->redis_prefix, p, sizeof(p));
    snprintf(pat[0], sizeof(pat[0]), "%sst{%s:*", p, g);
    snprintf(pat[1], sizeof(pat[1]), "%spos{%s:*", p, g);
    snprintf(pat[2], sizeof(pat[2]), "%sdedupkey:%s", p, g);
    snprintf(pat[3], sizeof(pat[3]), "%sdedup{%s::*", p, g);
    size_t npat = 4;
    if (m->o->script_keys) { /* each pattern's shards of this group */
        char *pats = idem_xstrdup(m->o->script_keys), *save = NULL;
        for (char *pt = strtok_r(pats, ",", &save);
             pt && npat < sizeof(pat) / sizeof(pat[0]);
             pt = strtok_r(NULL, ",", &save))
            if (*pt)
                snprintf(pat[npat++], sizeof(pat[0]), "%s{%s:*", pt, g);
        free(pats);
    }
    char ledger[600];
    snprintf(ledger, sizeof(ledger), "%sledger:*", p);
    keys_t found = {0};
    int rc = 0;
    for (size_t i = 0; i <= npat && !rc && !found.n; i++) {
        if (i == npat && m->o->no_ledger)
            break;
        rc = scan_cluster(m, i < npat ? pat[i] : ledger, &found, errstr,
                          errstr_size);
    }
    if (!rc && found.n) {
        snprintf(errstr, errstr_size,
                 "refused: the cluster already holds %s (%zu key%s like it): "
                 "state of group %s or a ledger (--force copies over it; "
                 "nothing copied)",
                 found.v[0], found.n, found.n == 1 ? "" : "s",
                 m->conf->group_id);
        rc = -1;
    }
    keys_free(&found);
    return rc;
}

/* topic and partition of a position field "<topic>:<partition>" (a
 * topic has no ':'). 0, or -1. */
static int field_split(const char *field, char *topic, size_t size,
                       int32_t *partition)
{
    const char *c = strrchr(field, ':');
    char *end;
    if (!c || c == field || (size_t)(c - field) >= size)
        return -1;
    long p = strtol(c + 1, &end, 10);
    if (*end || end == c + 1 || p < 0 || p > INT32_MAX)
        return -1;
    snprintf(topic, size, "%.*s", (int)(c - field), field);
    *partition = (int32_t)p;
    return 0;
}

/* Positions: the source's hash <prefix>pos:<group>, field by field into
 * each partition's own hash. The ledger's shard tag is the first
 * partition (topic name order, then number). 0, or -1. */
static int copy_positions(migrate_t *m, char *errstr, size_t errstr_size)
{
    redisReply *h = redisCommand(m->src, "HGETALL %spos:%s",
                                 m->conf->redis_prefix, m->conf->group_id);
    if (!h || h->type != REDIS_REPLY_ARRAY) {
        snprintf(errstr, errstr_size, "source: HGETALL %spos:%s: %s",
                 m->conf->redis_prefix, m->conf->group_id,
                 !h       ? m->src->errstr
                 : h->str ? h->str
                          : "unexpected reply");
        if (h)
            freeReplyObject(h);
        return -1;
    }
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
        const char *field = h->element[i]->str, *val = h->element[i + 1]->str;
        char topic[256], key[600];
        int32_t p;
        if (field_split(field, topic, sizeof(topic), &p)) {
            fprintf(stderr,
                    "idemproc migrate: position field \"%s\" is no "
                    "<topic>:<partition>: left out\n",
                    field);
            continue;
        }
        idem_store_pos_key(m->conf, topic, p, key, sizeof(key));
        const char *argv[] = {"HSET", key, field, val};
        redisReply *r = dst_command(m, key, 4, argv, NULL, errstr, errstr_size);
        if (reply_ok(r, "cluster: HSET", key, errstr, errstr_size)) {
            freeReplyObject(h);
            return -1;
        }
        freeReplyObject(r);
        m->positions++;
    }
    freeReplyObject(h);
    return 0;
}

/* The shard that takes the ledger and the script effect's keys whole:
 * the group's first partition with a position on the source (topic name
 * order, then number), so a partition the group reads; the first input
 * topic's partition 0 when none. Read before anything is written. */
static int pick_tag(migrate_t *m, char *errstr, size_t errstr_size)
{
    redisReply *h = redisCommand(m->src, "HKEYS %spos:%s",
                                 m->conf->redis_prefix, m->conf->group_id);
    if (!h || h->type != REDIS_REPLY_ARRAY) {
        snprintf(errstr, errstr_size, "source: HKEYS %spos:%s: %s",
                 m->conf->redis_prefix, m->conf->group_id,
                 !h       ? m->src->errstr
                 : h->str ? h->str
                          : "unexpected reply");
        if (h)
            freeReplyObject(h);
        return -1;
    }
    char best_topic[256] = "";
    int32_t best_p = -1;
    for (size_t i = 0; i < h->elements; i++) {
        char topic[256];
        int32_t p;
        if (field_split(h->element[i]->str, topic, sizeof(topic), &p))
            continue;
        int c = strcmp(topic, best_topic);
        if (best_p < 0 || c < 0 || (!c && p < best_p)) {
            snprintf(best_topic, sizeof(best_topic), "%s", topic);
            best_p = p;
        }
    }
    freeReplyObject(h);
    if (best_p < 0) /* never ran: the first input topic's partition 0 */
        snprintf(best_topic, sizeof(best_topic), "%s", m->conf->input_topic[0]);
    snprintf(m->tag, sizeof(m->tag), "{%s:%s:%" PRId32 "}", m->conf->group_id,
             best_topic, best_p < 0 ? 0 : best_p);
    return 0;
}

/* The global path's marks: each <prefix>dedup:<group>:<identity> of the
 * source (a record without a key, a dead-letter replay or a retry copy
 * applied there) to its cluster name idem_store_gmark_key (under its
 * bucket's tag), with its remaining TTL, so the same record taking the
 * global path on the cluster is a duplicate. 0, or -1. */
static int copy_gmarks(migrate_t *m, char *errstr, size_t errstr_size)
{
    char g[256], p[256], pat[600], stem[600];
    glob_escape(m->conf->group_id, g, sizeof(g));
    glob_escape(m->conf->redis_prefix, p, sizeof(p));
    snprintf(pat, sizeof(pat), "%sdedup:%s:*", p, g);
    size_t stem_len = (size_t)snprintf(stem, sizeof(stem),
                                       "%sdedup:%s:", m->conf->redis_prefix,
                                       m->conf->group_id);
    keys_t k = {0};
    int rc = scan_into(m->src, "source", pat, &k, errstr, errstr_size);
    for (size_t i = 0; i < k.n && rc >= 0; i++) {
        const char *id = k.v[i] + stem_len;
        char dst[1024];
        if ((size_t)idem_store_gmark_key(m->conf, id, strlen(id), dst,
                                         sizeof(dst)) >= sizeof(dst)) {
            snprintf(errstr, errstr_size, "source: %s: name too long", k.v[i]);
            rc = -1;
            break;
        }
        rc = copy_key(m, k.v[i], dst, m->o->force, &m->gmark_bytes, errstr,
                      errstr_size);
        if (rc == 1)
            m->gmarks++;
        else if (rc == 0)
            m->gmarks_gone++;
    }
    keys_free(&k);
    return rc < 0 ? -1 : 0;
}

static int keys_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The script effect's keys: every key of the source matching a pattern of
 * --script-keys (idemproc's own, under redis.prefix, left out), sorted,
 * each checked before anything is written: a string or a hash (what
 * verify and `state get script` read over the shards), no '{' of its own
 * (Redis would hash that tag, not the partition's appended). 0, or -1
 * with errstr naming the key (a refusal). */
static int collect_script(migrate_t *m, char *errstr, size_t errstr_size)
{
    char *pats = idem_xstrdup(m->o->script_keys), *save = NULL;
    keys_t all = {0};
    int rc = 0;
    for (char *pt = strtok_r(pats, ",", &save); pt && !rc;
         pt = strtok_r(NULL, ",", &save))
        if (*pt)
            rc = scan_into(m->src, "source", pt, &all, errstr, errstr_size);
    free(pats);
    if (all.n)
        qsort(all.v, all.n, sizeof(*all.v), keys_cmp);
    size_t plen = strlen(m->conf->redis_prefix);
    for (size_t i = 0; i < all.n && !rc; i++) {
        const char *key = all.v[i];
        if (i && !strcmp(key, all.v[i - 1]))
            continue; /* matched by two patterns */
        if (plen && !strncmp(key, m->conf->redis_prefix, plen)) {
            m->script_own++;
            continue;
        }
        redisReply *t = redisCommand(m->src, "TYPE %s", key);
        if (!t || t->type != REDIS_REPLY_STATUS) {
            snprintf(errstr, errstr_size, "source: TYPE %s: %s", key,
                     !t       ? m->src->errstr
                     : t->str ? t->str
                              : "unexpected reply");
            if (t)
                freeReplyObject(t);
            rc = -1;
            break;
        }
        if (strcmp(t->str, "none") && strcmp(t->str, "string") &&
            strcmp(t->str, "hash")) {
            snprintf(errstr, errstr_size,
                     "refused: script key %s is a %s: cluster mode reads a "
                     "script effect's key as the sum of its shards (a "
                     "string holding an integer, a hash's fields) or as the "
                     "one value all its shards hold, which a %s has not "
                     "(convert or delete it, or leave it out of "
                     "--script-keys; nothing copied)",
                     key, t->str, t->str);
            rc = -1;
        } else if (strchr(key, '{')) {
            snprintf(errstr, errstr_size,
                     "refused: script key %s holds a '{': in cluster mode "
                     "Redis hashes a key by its first {...}, so the "
                     "partition's tag appended would not place it (rename "
                     "it, or leave it out of --script-keys; nothing copied)",
                     key);
            rc = -1;
        } else if (strcmp(t->str, "none"))
            keys_add(&m->script, key, strlen(key));
        freeReplyObject(t);
    }
    keys_free(&all);
    return rc;
}

/* The script effect's keys, each whole into its shard <name><tag>, with
 * its remaining TTL; then each shard's size compared with the source's
 * (STRLEN, HLEN). 0, or -1. */
static int copy_script(migrate_t *m, char *errstr, size_t errstr_size)
{
    for (size_t i = 0; i < m->script.n; i++) {
        const char *key = m->script.v[i];
        char dst[1024];
        snprintf(dst, sizeof(dst), "%s%s", key, m->tag);
        int rc = copy_key(m, key, dst, m->o->force, &m->script_bytes, errstr,
                          errstr_size);
        if (rc < 0)
            return -1;
        if (!rc) {
            m->script_gone++;
            continue;
        }
        m->script_copied++;
        redisReply *t = redisCommand(m->src, "TYPE %s", key);
        int hash =
            t && t->type == REDIS_REPLY_STATUS && !strcmp(t->str, "hash");
        if (t)
            freeReplyObject(t);
        const char *cmd = hash ? "HLEN" : "STRLEN";
        redisReply *a = redisCommand(m->src, "%s %s", cmd, key);
        const char *argv[] = {cmd, dst};
        redisReply *b = dst_command(m, dst, 2, argv, NULL, errstr, errstr_size);
        int same = a && b && a->type == REDIS_REPLY_INTEGER &&
                   b->type == REDIS_REPLY_INTEGER && a->integer == b->integer;
        if (!same && b)
            snprintf(errstr, errstr_size,
                     "check failed: %s %s on the source is %lld, %s on the "
                     "cluster %lld (marker not written)",
                     cmd, key,
                     a && a->type == REDIS_REPLY_INTEGER ? a->integer : -1LL,
                     dst, b->type == REDIS_REPLY_INTEGER ? b->integer : -1LL);
        if (a)
            freeReplyObject(a);
        if (b)
            freeReplyObject(b);
        if (!same)
            return -1;
    }
    return 0;
}

/* The dedup state: every <prefix>st{<group>:...} key (epochs, window keys
 * and their parts, the recorded partition counts), the group's dedup hash
 * key and its layout key, under the same names (their hash tags already
 * place them on the cluster). 0, or -1. */
static int copy_state(migrate_t *m, char *errstr, size_t errstr_size)
{
    char g[256], p[256], pat[600];
    glob_escape(m->conf->group_id, g, sizeof(g));
    glob_escape(m->conf->redis_prefix, p, sizeof(p));
    snprintf(pat, sizeof(pat), "%sst{%s:*", p, g);
    keys_t k = {0};
    if (scan_into(m->src, "source", pat, &k, errstr, errstr_size)) {
        keys_free(&k);
        return -1;
    }
    char hk[512], lk[512];
    snprintf(hk, sizeof(hk), "%sdedupkey:%s", m->conf->redis_prefix,
             m->conf->group_id);
    idem_layout_key(m->conf, lk, sizeof(lk));
    keys_add(&k, hk, strlen(hk));
    keys_add(&k, lk, strlen(lk));
    int rc = 0;
    for (size_t i = 0; i < k.n && rc >= 0; i++) {
        rc = copy_key(m, k.v[i], k.v[i], m->o->force, &m->state_bytes, errstr,
                      errstr_size);
        if (rc == 1)
            m->state_keys++;
        else if (rc == 0 && k.v[i] == k.v[k.n - 2]) {
            snprintf(errstr, errstr_size,
                     "source: %s is absent: the group never ran there (or "
                     "--from names another Redis); nothing to migrate",
                     hk);
            rc = -1;
        } else if (rc == 0)
            m->state_gone++;
    }
    keys_free(&k);
    return rc < 0 ? -1 : 0;
}

static cursum_t *cursum(migrate_t *m, const char *cur)
{
    for (size_t i = 0; i < m->nsums; i++)
        if (!strcmp(m->sums[i].cur, cur))
            return &m->sums[i];
    if (m->nsums == sizeof(m->sums) / sizeof(m->sums[0]))
        return NULL;
    cursum_t *s = &m->sums[m->nsums++];
    memset(s, 0, sizeof(*s));
    snprintf(s->cur, sizeof(s->cur), "%s", cur);
    return s;
}

/* Adds the fields of hash key (on c) to the `which` sum of its currency
 * (the text after "ledger:" up to a '{'). 0, or -1. */
static int sum_hash(migrate_t *m, redisContext *c, const char *key, size_t plen,
                    size_t which, char *errstr, size_t errstr_size)
{
    char cur[64];
    snprintf(cur, sizeof(cur), "%.*s", (int)strcspn(key + plen, "{"),
             key + plen);
    if (!strcmp(cur, "applied"))
        return 0;
    cursum_t *s = cursum(m, cur);
    redisReply *h = redisCommand(c, "HGETALL %s", key);
    if (!s || !h || h->type != REDIS_REPLY_ARRAY) {
        snprintf(errstr, errstr_size, "HGETALL %s: %s", key,
                 !s   ? "more than 64 currencies"
                 : !h ? c->errstr
                      : "not a hash");
        if (h)
            freeReplyObject(h);
        return -1;
    }
    uint64_t *to[] = {&s->src, &s->before, &s->replaced, &s->after};
    for (size_t j = 0; j + 1 < h->elements; j += 2)
        *to[which] += (uint64_t)strtoll(h->element[j + 1]->str, NULL, 10);
    if (which == 0)
        s->fields += h->elements / 2;
    freeReplyObject(h);
    return 0;
}

/* The cluster's ledger summed per currency into sum `which` (1 before,
 * 3 after), every primary. 0, or -1. */
static int sum_cluster(migrate_t *m, size_t which, char *errstr,
                       size_t errstr_size)
{
    char p[256], pat[600];
    glob_escape(m->conf->redis_prefix, p, sizeof(p));
    snprintf(pat, sizeof(pat), "%sledger:*", p);
    size_t plen = strlen(m->conf->redis_prefix) + strlen("ledger:");
    for (size_t k = 0;; k++) {
        idem_cluster_err_t e;
        const char *addr = NULL;
        redisContext *c = idem_cluster_primary_context(m->cl, k, &addr, &e);
        if (!c && e.cls == IDEM_CLUSTER_ERR_NONE)
            return 0;
        keys_t keys = {0};
        int rc = c ? scan_into(c, addr, pat, &keys, errstr, errstr_size) : -1;
        if (!c)
            snprintf(errstr, errstr_size, "cluster: %s", e.str);
        for (size_t i = 0; i < keys.n && !rc; i++)
            rc = sum_hash(m, c, keys.v[i], plen, which, errstr, errstr_size);
        keys_free(&keys);
        if (rc)
            return -1;
    }
}

/* The ledger: each source key <prefix>ledger:<CUR> (and ledger:applied)
 * into <prefix>ledger:<CUR><tag>, the shard of one partition, so the sum
 * over the shards (what verify reads) grows by exactly the source's. */
static int copy_ledger(migrate_t *m, char *errstr, size_t errstr_size)
{
    char p[256], pat[600];
    glob_escape(m->conf->redis_prefix, p, sizeof(p));
    snprintf(pat, sizeof(pat), "%sledger:*", p);
    size_t plen = strlen(m->conf->redis_prefix) + strlen("ledger:");
    keys_t k = {0};
    int rc = scan_into(m->src, "source", pat, &k, errstr, errstr_size);
    if (!rc)
        rc = sum_cluster(m, 1, errstr, errstr_size);
    for (size_t i = 0; i < k.n && !rc; i++) {
        if (strchr(k.v[i], '{'))
            continue; /* not a single Redis's ledger key */
        char dst[1024];
        snprintf(dst, sizeof(dst), "%s%s", k.v[i], m->tag);
        rc = sum_hash(m, m->src, k.v[i], plen, 0, errstr, errstr_size);
        if (!rc) { /* what the copy replaces (--force), on its node */
            idem_cluster_err_t e;
            redisContext *c = idem_cluster_context(
                m->cl, idem_cluster_keyslot(dst, strlen(dst)), &e);
            rc = c ? sum_hash(m, c, dst, plen, 2, errstr, errstr_size) : -1;
            if (!c)
                snprintf(errstr, errstr_size, "cluster: %s", e.str);
        }
        uint64_t bytes = 0;
        if (!rc && copy_key(m, k.v[i], dst, m->o->force, &bytes, errstr,
                            errstr_size) < 0)
            rc = -1;
        m->ledger_keys += !rc;
    }
    keys_free(&k);
    if (!rc)
        rc = sum_cluster(m, 3, errstr, errstr_size);
    return rc;
}

/* Prints the balances check: after = before - replaced + source, per
 * currency. 0 when every currency agrees, else -1 with errstr. */
static int ledger_check(migrate_t *m, char *errstr, size_t errstr_size)
{
    int bad = 0;
    for (size_t i = 0; i < m->nsums; i++) {
        cursum_t *s = &m->sums[i];
        uint64_t want = s->before - s->replaced + s->src;
        printf("  ledger:%s  source %" PRId64 " (%zu users)  cluster before "
               "%" PRId64 ", after %" PRId64 "  %s\n",
               s->cur, (int64_t)s->src, s->fields, (int64_t)s->before,
               (int64_t)s->after, want == s->after ? "ok" : "MISMATCH");
        bad += want != s->after;
    }
    if (bad)
        snprintf(errstr, errstr_size,
                 "check failed: %d currenc%s on the cluster do not sum to "
                 "the source's balances (marker not written)",
                 bad, bad == 1 ? "y" : "ies");
    return bad ? -1 : 0;
}

static int write_marker(migrate_t *m, char *errstr, size_t errstr_size)
{
    char key[512], val[1024], url[512];
    snprintf(key, sizeof(key), "%smigrated{%s}", m->conf->redis_prefix,
             m->conf->group_id);
    snprintf(val, sizeof(val),
             "from %s at %lld: %zu state keys, %zu positions, %zu global "
             "marks, %zu ledger keys and %zu script keys into %s",
             idem_redisconn_url_redact(m->o->from, url, sizeof(url)),
             (long long)time(NULL), m->state_keys, m->positions, m->gmarks,
             m->ledger_keys, m->script_copied, m->tag);
    const char *argv[] = {"SET", key, val};
    redisReply *r = dst_command(m, key, 3, argv, NULL, errstr, errstr_size);
    if (reply_ok(r, "cluster: SET", key, errstr, errstr_size))
        return -1;
    freeReplyObject(r);
    return 0;
}

static int migrate(migrate_t *m, char *errstr, size_t errstr_size)
{
    idem_cluster_err_t e;
    if (!(m->src_rc =
              idem_redisconn_open(&m->src_conf, 0, errstr, errstr_size)))
        return -1;
    m->src = idem_redisconn_context(m->src_rc);
    if (!(m->cl =
              idem_cluster_new(m->conf, m->conf->redis_cluster_nodes, &e))) {
        snprintf(errstr, errstr_size, "cluster: %s", e.str);
        return -1;
    }
    int done = already_migrated(m, errstr, errstr_size);
    if (done)
        return done < 0 ? -1 : 0;
    if (no_live_members(m, 0, errstr, errstr_size) ||
        source_layout_ok(m, errstr, errstr_size) ||
        pick_tag(m, errstr, errstr_size) ||
        (m->o->script_keys && collect_script(m, errstr, errstr_size)) ||
        target_empty(m, errstr, errstr_size) ||
        copy_state(m, errstr, errstr_size) ||
        copy_positions(m, errstr, errstr_size) ||
        copy_gmarks(m, errstr, errstr_size))
        return -1;
    printf("group %s: %zu dedup state keys copied (%" PRIu64
           " bytes; %zu expired meanwhile), %zu positions, %zu global "
           "marks (%zu expired meanwhile)\n",
           m->conf->group_id, m->state_keys, m->state_bytes, m->state_gone,
           m->positions, m->gmarks, m->gmarks_gone);
    if (m->o->script_keys) {
        if (copy_script(m, errstr, errstr_size))
            return -1;
        printf("script: %zu keys into the shard %s (%" PRIu64
               " bytes; %zu expired meanwhile; %zu under redis.prefix left "
               "out)\n",
               m->script_copied, m->tag, m->script_bytes, m->script_gone,
               m->script_own);
    }
    if (!m->o->no_ledger) {
        if (copy_ledger(m, errstr, errstr_size))
            return -1;
        printf("ledger: %zu keys into the shard %s\n", m->ledger_keys, m->tag);
        if (ledger_check(m, errstr, errstr_size))
            return -1;
    }
    if (m->pieced)
        printf("%zu keys longer than %d bytes copied in pieces\n", m->pieced,
               PIECE_BYTES);
    if (no_live_members(m, 1, errstr, errstr_size))
        return -1;
    return write_marker(m, errstr, errstr_size);
}

int idem_cmd_migrate(int argc, char **argv, char **envp)
{
    migrate_opts_t o = {0};
    idem_conf_t *conf = NULL;
    int rc = idem_cmdline_conf(argc, argv, envp, idem_cmd_migrate_usage,
                               migrate_options, "", migrate_opt, &o, &conf);
    if (rc >= 0) {
        idem_conf_destroy(conf);
        return rc;
    }
    if (!o.from || !conf->redis_cluster_nodes || !*conf->redis_cluster_nodes) {
        fprintf(stderr, "idemproc migrate: %s\n",
                !o.from ? "--from URL (the single Redis) is required"
                        : "redis.cluster.nodes is not set (the cluster to "
                          "migrate to)");
        idem_conf_destroy(conf);
        return IDEM_EXIT_USAGE;
    }
    const char *harg = NULL;
    char herr[512];
    const idem_handler_ops_t *h = idem_handler_find(
        conf->handler ? conf->handler : "", &harg, herr, sizeof(herr));
    const char *why = NULL;
    if (!h)
        why = herr;
    else if (h->effect != IDEM_EFFECT_IN_REDIS)
        /* Their marks are per identity (dedup.scope=global) under the
         * same names in cluster mode: not the partition layout's state. */
        why = "its effect is outside Redis (an external effect: forward, "
              "webhook, plugins); migrate moves the state of an effect "
              "applied in Redis (ledger, script) with dedup.scope=partition";
    else if (idem_handler_key("script.file", NULL) == h && !o.script_keys)
        /* The effect's keys are named by the user's file. */
        why = "its effect writes keys of its own names: list them with "
              "--script-keys PATTERN,... (the source's keys it writes), else "
              "they would start over on the cluster";
    if (why) {
        fprintf(stderr, "idemproc migrate: handler=%s: %s; nothing copied\n",
                conf->handler ? conf->handler : "", why);
        idem_conf_destroy(conf);
        return IDEM_EXIT_FAIL;
    }
    migrate_t m = {.conf = conf, .o = &o};
    /* The source: a view of conf for one Redis at --from, its user and
     * password from that URL (conf's belong to the cluster). */
    m.src_conf = *conf;
    m.src_conf.redis_url = (char *)o.from;
    m.src_conf.redis_cluster_nodes = NULL;
    m.src_conf.redis_sentinels = NULL;
    m.src_conf.redis_username = NULL;
    m.src_conf.redis_password = NULL;
    char errstr[1024] = "";
    rc = migrate(&m, errstr, sizeof(errstr)) ? IDEM_EXIT_FAIL : IDEM_EXIT_OK;
    if (rc)
        fprintf(stderr, "idemproc migrate: %s\n", errstr);
    else if (m.state_keys)
        printf("group %s: migrated; start its members with "
               "redis.cluster.nodes\n",
               conf->group_id);
    fflush(stdout);
    keys_free(&m.script);
    idem_redisconn_close(m.src_rc);
    idem_cluster_destroy(m.cl);
    idem_conf_destroy(conf);
    return rc;
}
