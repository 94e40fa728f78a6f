/* storeread: verify's reads of dedup marks and effect values (storeread.h). */
#include "redis/storeread.h"

#include "redis/cluster.h"
#include "redis/redisconn.h"
#include "base/util.h"

#include <hiredis.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct idem_storeread_s {
    const idem_conf_t *conf;
    idem_redisconn_t *rc;
    redisContext *node; /* cluster mode: the primary being scanned */
    const char *addr;   /* its "host:port" (the cluster client's) */
};

idem_storeread_t *idem_storeread_new(const idem_conf_t *conf)
{
    idem_storeread_t *r = idem_xcalloc(1, sizeof(*r));
    r->conf = conf;
    return r;
}

void idem_storeread_destroy(idem_storeread_t *r)
{
    if (!r)
        return;
    idem_redisconn_close(r->rc);
    free(r);
}

/* The connection, opened on first use. NULL with errstr. */
static redisContext *reader_ctx(idem_storeread_t *r, char *errstr,
                                size_t errstr_size)
{
    if (r->node)
        return r->node;
    if (!r->rc)
        r->rc = idem_redisconn_open(r->conf, 1, errstr, errstr_size);
    return r->rc ? idem_redisconn_context(r->rc) : NULL;
}

/* The failure of `what` (a command and its key) with `detail` (the
 * reply's error or the I/O error) into errstr. In cluster mode it names
 * the node scanned ("redis cluster: <host:port>: ..."), and a CLUSTERDOWN
 * from that live node says that the cluster is down, as readiness does:
 * the node that said it is not the one that is down. */
static void node_fail(const idem_storeread_t *r, const char *what,
                      const char *detail, char *errstr, size_t errstr_size)
{
    if (!r->node)
        snprintf(errstr, errstr_size, "redis %s: %s", what, detail);
    else if (!strncmp(detail, "CLUSTERDOWN", 11))
        snprintf(errstr, errstr_size,
                 "redis cluster: the cluster is down: the live node %s "
                 "answers %s (%s)",
                 r->addr, detail, what);
    else
        snprintf(errstr, errstr_size, "redis cluster: %s: %s: %s", r->addr,
                 what, detail);
}

/* Sends argv[argc] (lengths argvlen, NULL: strlen) and returns the reply
 * (caller frees), or NULL with errstr: a lost connection (dropped, the next
 * call reconnects) or an error reply. */
static redisReply *reader_command(idem_storeread_t *r, int argc,
                                  const char **argv, const size_t *argvlen,
                                  char *errstr, size_t errstr_size)
{
    redisContext *c = reader_ctx(r, errstr, errstr_size);
    if (!c)
        return NULL;
    redisReply *rep = redisCommandArgv(c, argc, argv, argvlen);
    if (!rep) {
        node_fail(r, argv[0], c->errstr[0] ? c->errstr : "connection lost",
                  errstr, errstr_size);
        idem_redisconn_close(r->rc);
        r->rc = NULL;
        return NULL;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        node_fail(r, argv[0], rep->str, errstr, errstr_size);
        freeReplyObject(rep);
        return NULL;
    }
    return rep;
}

/* The layout of the marks, as the store's scripts write them (store.h,
 * idem_store_script_register): one string key per identity,
 * <prefix>dedup:<group.id>:<identity>, value "done:<message_id>" or
 * "lease:<owner>:<message_id>". */
#define MARK_SEGMENT "dedup:"

/* Cluster mode: the values of keys (a SCAN's, all on node r->node, each
 * on a slot of its own) by one GET each, pipelined: MGET takes one slot's
 * keys only. An array reply as MGET's (a key moved since the SCAN,
 * answered MOVED or ASK, reads as nil), or NULL with errstr naming the
 * node (a lost connection, CLUSTERDOWN or another error reply). */
static redisReply *node_gets(idem_storeread_t *r, const redisReply *keys,
                             char *errstr, size_t errstr_size)
{
    redisContext *c = r->node;
    for (size_t i = 0; i < keys->elements; i++) {
        const char *argv[] = {"GET", keys->element[i]->str};
        const size_t len[] = {3, keys->element[i]->len};
        redisAppendCommandArgv(c, 2, argv, len);
    }
    redisReply *out = idem_xcalloc(1, sizeof(*out));
    out->type = REDIS_REPLY_ARRAY;
    out->element = idem_xcalloc(keys->elements ? keys->elements : 1,
                                sizeof(*out->element));
    for (size_t i = 0; i < keys->elements; i++) {
        void *v = NULL;
        if (redisGetReply(c, &v) != REDIS_OK || !v) {
            node_fail(r, "GET", c->errstr[0] ? c->errstr : "connection lost",
                      errstr, errstr_size);
            freeReplyObject(out);
            return NULL;
        }
        out->element[out->elements++] = v;
        const redisReply *e = v;
        if (e->type == REDIS_REPLY_ERROR && strncmp(e->str, "MOVED ", 6) &&
            strncmp(e->str, "ASK ", 4)) {
            char what[300];
            snprintf(what, sizeof(what), "GET %.*s",
                     (int)(keys->element[i]->len > 256 ? 256
                                                       : keys->element[i]->len),
                     keys->element[i]->str);
            node_fail(r, what, e->str, errstr, errstr_size);
            freeReplyObject(out);
            return NULL;
        }
    }
    return out;
}

/* Runs fn(r, arg) on the one Redis, or once per primary of the slot map
 * in cluster mode (redis.cluster.nodes) with r->node that primary's
 * connection: a key lives on exactly one primary, so a SCAN of each sees
 * every key once (while no slot migrates: verify runs after the traffic).
 * Returns fn's first failure, or -1 with errstr when a primary cannot be
 * reached, else 0. */
typedef int (*node_fn)(idem_storeread_t *r, void *arg, char *errstr,
                       size_t errstr_size);

static int each_node(idem_storeread_t *r, node_fn fn, void *arg, char *errstr,
                     size_t errstr_size)
{
    const char *nodes = r->conf->redis_cluster_nodes;
    if (!nodes || !*nodes)
        return fn(r, arg, errstr, errstr_size);
    idem_cluster_err_t e;
    idem_cluster_t *cl = idem_cluster_new(r->conf, nodes, &e);
    if (!cl) {
        snprintf(errstr, errstr_size, "%s", e.str);
        return -1;
    }
    int rc = 0;
    for (size_t k = 0; !rc; k++) {
        r->node = idem_cluster_primary_context(cl, k, &r->addr, &e);
        if (!r->node) {
            if (e.cls != IDEM_CLUSTER_ERR_NONE) {
                snprintf(errstr, errstr_size, "%s", e.str);
                rc = -1;
            }
            break;
        }
        rc = fn(r, arg, errstr, errstr_size);
    }
    r->node = NULL;
    r->addr = NULL;
    idem_cluster_destroy(cl);
    return rc;
}

typedef struct {
    const char *group;
    void (*cb)(const idem_storeread_mark_t *mark, void *opaque);
    void *opaque;
    int bucket; /* cluster mode's global path: <prefix>dedup{<group>::<NN>}:
                   <identity> (store.h, idem_store_gmark_key) */
} marks_arg_t;

static int marks_scan(idem_storeread_t *r, void *arg, char *errstr,
                      size_t errstr_size);

/* One SCAN step of pattern from cursor (updated in place): the reply,
 * its keys in element[1], or NULL with errstr. */
static redisReply *scan_step(idem_storeread_t *r, char *cursor,
                             size_t cursor_size, const char *pattern,
                             char *errstr, size_t errstr_size)
{
    const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
    redisReply *rep = reader_command(r, 6, argv, NULL, errstr, errstr_size);
    if (!rep)
        return NULL;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING ||
        rep->element[1]->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(rep);
        snprintf(errstr, errstr_size, "redis SCAN: unexpected reply");
        return NULL;
    }
    snprintf(cursor, cursor_size, "%s", rep->element[0]->str);
    return rep;
}

/* Cluster mode (redis.cluster.nodes): the marks are one key per identity
 * on its own slot, so every primary of the slot map is scanned. */
int idem_storeread_marks(idem_storeread_t *r, const char *group,
                         void (*cb)(const idem_storeread_mark_t *mark,
                                    void *opaque),
                         void *opaque, char *errstr, size_t errstr_size)
{
    marks_arg_t a = {group, cb, opaque, 0};
    if (each_node(r, marks_scan, &a, errstr, errstr_size))
        return -1;
    if (!r->conf->redis_cluster_nodes || !*r->conf->redis_cluster_nodes)
        return 0;
    a.bucket = 1;
    return each_node(r, marks_scan, &a, errstr, errstr_size);
}

static int marks_scan(idem_storeread_t *r, void *arg, char *errstr,
                      size_t errstr_size)
{
    const marks_arg_t *a = arg;
    const char *group = a->group;
    /* SCAN MATCH takes a glob: the prefix and group are escaped. */
    char head[1024], pattern[2100];
    int hn = snprintf(head, sizeof(head),
                      a->bucket ? "%sdedup{%s::" : "%s" MARK_SEGMENT "%s:",
                      r->conf->redis_prefix, group);
    int skip = a->bucket ? 4 : 0; /* "<NN>}:" after the bucket's head */
    if (hn < 0 || (size_t)hn >= sizeof(head)) {
        snprintf(errstr, errstr_size, "redis.prefix and group.id: too long");
        return -1;
    }
    size_t pn = 0;
    for (const char *p = head; *p; p++) {
        if (strchr("*?[]\\", *p))
            pattern[pn++] = '\\';
        pattern[pn++] = *p;
    }
    pattern[pn++] = '*';
    pattern[pn] = '\0';
    char cursor[32] = "0";
    do {
        redisReply *rep =
            scan_step(r, cursor, sizeof(cursor), pattern, errstr, errstr_size);
        if (!rep)
            return -1;
        redisReply *keys = rep->element[1];
        if (keys->elements > 0) {
            size_t n = keys->elements + 1;
            const char **margv = idem_xcalloc(n, sizeof(*margv));
            size_t *mlen = idem_xcalloc(n, sizeof(*mlen));
            margv[0] = "MGET";
            mlen[0] = 4;
            for (size_t i = 0; i < keys->elements; i++) {
                margv[i + 1] = keys->element[i]->str;
                mlen[i + 1] = keys->element[i]->len;
            }
            redisReply *vals = r->node ? node_gets(r, keys, errstr, errstr_size)
                                       : reader_command(r, (int)n, margv, mlen,
                                                        errstr, errstr_size);
            free(margv);
            free(mlen);
            if (!vals) {
                freeReplyObject(rep);
                return -1;
            }
            for (size_t i = 0; i < keys->elements && i < vals->elements; i++) {
                redisReply *k = keys->element[i], *v = vals->element[i];
                if (v->type != REDIS_REPLY_STRING ||
                    k->len < (size_t)(hn + skip) ||
                    (skip && memcmp(k->str + hn + 2, "}:", 2)))
                    continue; /* expired since the SCAN, or another key */
                idem_storeread_mark_t m = {
                    .identity = k->str + hn + skip,
                    .identity_len = k->len - (size_t)(hn + skip),
                    .done = v->len >= 5 && !memcmp(v->str, "done:", 5),
                };
                if (m.done) {
                    m.message_id = v->str + 5;
                    m.message_id_len = v->len - 5;
                }
                a->cb(&m, a->opaque);
            }
            freeReplyObject(vals);
        }
        freeReplyObject(rep);
    } while (strcmp(cursor, "0"));
    return 0;
}

/* pattern: head with the glob's special characters escaped, then "*".
 * -1 when it does not fit in size. */
static int glob_prefix(const char *head, char *pattern, size_t size)
{
    size_t pn = 0;
    for (const char *p = head; *p; p++) {
        if (pn + 3 >= size)
            return -1;
        if (strchr("*?[]\\", *p))
            pattern[pn++] = '\\';
        pattern[pn++] = *p;
    }
    pattern[pn++] = '*';
    pattern[pn] = '\0';
    return 0;
}

/* The length of "<topic>:<partition>}" at the start of s (a Kafka topic
 * name has no ':' and no '}'), with the partition in *partition; 0 when s
 * does not start so. An empty topic is the tag of a global bucket of
 * cluster mode, "{<group>::<NN>}", read as partition NN. */
static size_t tag_tail(const char *s, size_t len, size_t *topic_len,
                       int32_t *partition)
{
    size_t t = 0;
    while (t < len && s[t] != ':' && s[t] != '}')
        t++;
    if (t >= len || s[t] != ':')
        return 0;
    size_t i = t + 1;
    int64_t p = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9' && p < INT32_MAX)
        p = p * 10 + (s[i++] - '0');
    if (i == t + 1 || i >= len || s[i] != '}' || p > INT32_MAX)
        return 0;
    *topic_len = t;
    *partition = (int32_t)p;
    return i + 1;
}

/* Called by scan_values with a key the SCAN found and its value (GET, or
 * HGET of the field; borrowed for the call; an error reply for a key of
 * another type). Returns 0 to go on, else -1 with errstr. */
typedef int (*value_fn)(const redisReply *key, const redisReply *val, void *arg,
                        char *errstr, size_t errstr_size);

/* SCANs the keys of `pattern` on the current node (the one Redis, or
 * r->node) and reads each one's value (field NULL: GET, else HGET of the
 * field) pipelined, one command a key (cluster mode: each on a slot of
 * its own). A key gone since the SCAN reads as nil. 0, or -1 with errstr. */
static int scan_values(idem_storeread_t *r, const char *pattern,
                       const char *field, value_fn each, void *arg,
                       char *errstr, size_t errstr_size)
{
    char cursor[32] = "0";
    do {
        redisReply *rep =
            scan_step(r, cursor, sizeof(cursor), pattern, errstr, errstr_size);
        if (!rep)
            return -1;
        redisReply *keys = rep->element[1];
        redisContext *c = reader_ctx(r, errstr, errstr_size);
        if (!c) {
            freeReplyObject(rep);
            return -1;
        }
        for (size_t i = 0; i < keys->elements; i++) {
            const char *gargv[] = {field ? "HGET" : "GET",
                                   keys->element[i]->str, field};
            const size_t glen[] = {field ? 4 : 3, keys->element[i]->len,
                                   field ? strlen(field) : 0};
            redisAppendCommandArgv(c, field ? 3 : 2, gargv, glen);
        }
        int rc = 0;
        for (size_t i = 0; i < keys->elements; i++) {
            void *v = NULL;
            if (redisGetReply(c, &v) != REDIS_OK || !v) {
                node_fail(r, field ? "HGET" : "GET",
                          c->errstr[0] ? c->errstr : "connection lost", errstr,
                          errstr_size);
                if (!r->node) {
                    idem_redisconn_close(r->rc);
                    r->rc = NULL;
                }
                freeReplyObject(rep);
                return -1;
            }
            const redisReply *val = v;
            if (!rc && val->type == REDIS_REPLY_ERROR &&
                !strncmp(val->str, "CLUSTERDOWN", 11)) {
                char what[300];
                snprintf(what, sizeof(what), "%s %.*s", field ? "HGET" : "GET",
                         (int)(keys->element[i]->len > 256
                                   ? 256
                                   : keys->element[i]->len),
                         keys->element[i]->str);
                node_fail(r, what, val->str, errstr, errstr_size);
                rc = -1;
            }
            if (!rc)
                rc = each(keys->element[i], v, arg, errstr, errstr_size);
            freeReplyObject(v);
        }
        freeReplyObject(rep);
        if (rc)
            return -1;
    } while (strcmp(cursor, "0"));
    return 0;
}

typedef struct {
    size_t head_len; /* bytes of "<prefix>st{<group>:" */
    void (*cb)(const idem_storeread_partmarks_t *pm, void *opaque);
    void *opaque;
} partmarks_arg_t;

/* A window key <prefix>st{<group>:<topic>:<partition>}:w<window>[.<part>]
 * and its marks. Other keys of the partition's stem are skipped. */
static int partmarks_value(const redisReply *key, const redisReply *val,
                           void *arg, char *errstr, size_t errstr_size)
{
    const partmarks_arg_t *a = arg;
    if (val->type == REDIS_REPLY_NIL || key->len <= a->head_len)
        return 0;
    const char *rest = key->str + a->head_len;
    size_t rlen = key->len - a->head_len, topic_len;
    int32_t partition;
    size_t t = tag_tail(rest, rlen, &topic_len, &partition);
    if (!t || rlen < t + 3 || memcmp(rest + t, ":w", 2))
        return 0;
    size_t i = t + 2, digits = 0;
    while (i < rlen && ((rest[i] >= '0' && rest[i] <= '9') || rest[i] == '.'))
        i++, digits++;
    if (!digits || i != rlen)
        return 0;
    if (val->type != REDIS_REPLY_STRING || val->len % IDEM_STOREREAD_MARK) {
        snprintf(errstr, errstr_size,
                 "redis %.*s: not a window of %d-byte marks (%s of %zu bytes)",
                 (int)key->len, key->str, IDEM_STOREREAD_MARK,
                 val->type == REDIS_REPLY_STRING ? "a string" : "another type",
                 val->type == REDIS_REPLY_STRING ? val->len : 0);
        return -1;
    }
    idem_storeread_partmarks_t pm = {
        .topic = rest,
        .topic_len = topic_len,
        .partition = partition,
        .marks = (const uint8_t *)val->str,
        .n = val->len / IDEM_STOREREAD_MARK,
    };
    a->cb(&pm, a->opaque);
    return 0;
}

typedef struct {
    partmarks_arg_t a;
    char pattern[2100];
} partmarks_scan_t;

static int partmarks_node(idem_storeread_t *r, void *arg, char *errstr,
                          size_t errstr_size)
{
    partmarks_scan_t *x = arg;
    return scan_values(r, x->pattern, NULL, partmarks_value, &x->a, errstr,
                       errstr_size);
}

int idem_storeread_partition_marks(
    idem_storeread_t *r, const char *group,
    void (*cb)(const idem_storeread_partmarks_t *pm, void *opaque),
    void *opaque, char *errstr, size_t errstr_size)
{
    char head[1024];
    int hn =
        snprintf(head, sizeof(head), "%sst{%s:", r->conf->redis_prefix, group);
    partmarks_scan_t x = {
        .a = {.head_len = (size_t)hn, .cb = cb, .opaque = opaque}};
    if (hn < 0 || (size_t)hn >= sizeof(head) ||
        glob_prefix(head, x.pattern, sizeof(x.pattern))) {
        snprintf(errstr, errstr_size, "redis.prefix and group.id: too long");
        return -1;
    }
    return each_node(r, partmarks_node, &x, errstr, errstr_size);
}

typedef struct {
    uint8_t *key;
    int found;
    char name[1024];
} hashkey_arg_t;

/* GET of the group's hash key on the current node; in cluster mode the
 * nodes that do not serve its slot answer MOVED, which is no error. */
static int hashkey_node(idem_storeread_t *r, void *arg, char *errstr,
                        size_t errstr_size)
{
    hashkey_arg_t *x = arg;
    redisContext *c = reader_ctx(r, errstr, errstr_size);
    if (!c)
        return -1;
    const char *argv[] = {"GET", x->name};
    redisReply *rep = redisCommandArgv(c, 2, argv, NULL);
    char what[1100];
    snprintf(what, sizeof(what), "GET %s", x->name);
    if (!rep) {
        node_fail(r, what, c->errstr[0] ? c->errstr : "connection lost", errstr,
                  errstr_size);
        if (!r->node) {
            idem_redisconn_close(r->rc);
            r->rc = NULL;
        }
        return -1;
    }
    int rc = 0;
    if (rep->type == REDIS_REPLY_STRING && rep->len == 16) {
        memcpy(x->key, rep->str, 16);
        x->found = 1;
    } else if (rep->type == REDIS_REPLY_ERROR) {
        if (!r->node ||
            (strncmp(rep->str, "MOVED ", 6) && strncmp(rep->str, "ASK ", 4))) {
            node_fail(r, what, rep->str, errstr, errstr_size);
            rc = -1;
        }
    } else if (rep->type != REDIS_REPLY_NIL) {
        snprintf(errstr, errstr_size, "redis GET %s: not a 16-byte hash key",
                 x->name);
        rc = -1;
    }
    freeReplyObject(rep);
    return rc;
}

int idem_storeread_hashkey(idem_storeread_t *r, const char *group,
                           uint8_t key[16], int *found, char *errstr,
                           size_t errstr_size)
{
    hashkey_arg_t x = {.key = key};
    snprintf(x.name, sizeof(x.name), "%sdedupkey:%s", r->conf->redis_prefix,
             group);
    *found = 0;
    if (each_node(r, hashkey_node, &x, errstr, errstr_size))
        return -1;
    *found = x.found;
    return 0;
}

typedef struct {
    size_t head_len;   /* bytes of "<key>{<group>:" */
    const char *field; /* NULL: string shards */
    void (*cb)(const char *shard, size_t shard_len, const char *value,
               size_t value_len, void *opaque);
    void *opaque;
    char pattern[2100];
} shards_arg_t;

/* A shard <key>{<group>:<topic>:<partition>} and its value; a key that
 * only starts the same is skipped. */
static int shard_value(const redisReply *key, const redisReply *val, void *arg,
                       char *errstr, size_t errstr_size)
{
    shards_arg_t *a = arg;
    size_t topic_len;
    int32_t partition;
    if (key->len <= a->head_len ||
        tag_tail(key->str + a->head_len, key->len - a->head_len, &topic_len,
                 &partition) != key->len - a->head_len)
        return 0;
    if (val->type == REDIS_REPLY_ERROR) {
        snprintf(errstr, errstr_size, "redis %.*s: %s", (int)key->len, key->str,
                 val->str);
        return -1;
    }
    if (val->type == REDIS_REPLY_STRING)
        a->cb(key->str, key->len, val->str, val->len, a->opaque);
    return 0;
}

static int shards_node(idem_storeread_t *r, void *arg, char *errstr,
                       size_t errstr_size)
{
    shards_arg_t *a = arg;
    return scan_values(r, a->pattern, a->field, shard_value, a, errstr,
                       errstr_size);
}

int idem_storeread_shards(idem_storeread_t *r, const char *key,
                          const char *field, const char *group,
                          void (*cb)(const char *shard, size_t shard_len,
                                     const char *value, size_t value_len,
                                     void *opaque),
                          void *opaque, char *errstr, size_t errstr_size)
{
    char head[1024];
    int hn = snprintf(head, sizeof(head), "%s{%s:", key, group);
    shards_arg_t a = {
        .head_len = (size_t)hn, .field = field, .cb = cb, .opaque = opaque};
    if (hn < 0 || (size_t)hn >= sizeof(head) ||
        glob_prefix(head, a.pattern, sizeof(a.pattern))) {
        snprintf(errstr, errstr_size, "redis %s: key and group.id too long",
                 key);
        return -1;
    }
    return each_node(r, shards_node, &a, errstr, errstr_size);
}

int idem_storeread_value(idem_storeread_t *r, const char *key,
                         const char *field, char **out, size_t *out_len,
                         char *errstr, size_t errstr_size)
{
    *out = NULL;
    *out_len = 0;
    const char *argv[] = {field ? "HGET" : "GET", key, field};
    redisReply *rep =
        reader_command(r, field ? 3 : 2, argv, NULL, errstr, errstr_size);
    if (!rep)
        return -1;
    if (rep->type == REDIS_REPLY_STRING) {
        *out = idem_xmalloc(rep->len + 1);
        memcpy(*out, rep->str, rep->len);
        (*out)[rep->len] = '\0';
        *out_len = rep->len;
    }
    freeReplyObject(rep);
    return 0;
}
