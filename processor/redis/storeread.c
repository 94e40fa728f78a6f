/* storeread: verify's reads of dedup marks and effect values (storeread.h). */
#include "redis/storeread.h"

#include "redis/cluster.h"
#include "redis/redisconn.h"
#include "base/util.h"

#include <hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct idem_storeread_s {
    const idem_conf_t *conf;
    idem_redisconn_t *rc;
    redisContext *node; /* cluster mode: the primary being scanned */
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
        snprintf(errstr, errstr_size, "redis %s: %s", argv[0],
                 c->errstr[0] ? c->errstr : "connection lost");
        idem_redisconn_close(r->rc);
        r->rc = NULL;
        return NULL;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(errstr, errstr_size, "redis %s: %s", argv[0], rep->str);
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

/* Cluster mode: the values of keys (a SCAN's, all on node c, each on a
 * slot of its own) by one GET each, pipelined: MGET takes one slot's
 * keys only. An array reply as MGET's (a key whose GET failed, moved
 * since the SCAN, reads as nil), or NULL with errstr. */
static redisReply *node_gets(redisContext *c, const redisReply *keys,
                             char *errstr, size_t errstr_size)
{
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
            snprintf(errstr, errstr_size, "redis GET: %s",
                     c->errstr[0] ? c->errstr : "connection lost");
            freeReplyObject(out);
            return NULL;
        }
        out->element[out->elements++] = v;
    }
    return out;
}

static int marks_scan(idem_storeread_t *r, const char *group,
                      void (*cb)(const idem_storeread_mark_t *mark,
                                 void *opaque),
                      void *opaque, char *errstr, size_t errstr_size);

/* Cluster mode (redis.cluster.nodes): the marks are one key per identity
 * on its own slot, so every primary of the slot map is scanned. */
int idem_storeread_marks(idem_storeread_t *r, const char *group,
                         void (*cb)(const idem_storeread_mark_t *mark,
                                    void *opaque),
                         void *opaque, char *errstr, size_t errstr_size)
{
    const char *nodes = r->conf->redis_cluster_nodes;
    if (!nodes || !*nodes)
        return marks_scan(r, group, cb, opaque, errstr, errstr_size);
    idem_cluster_err_t e;
    idem_cluster_t *cl = idem_cluster_new(r->conf, nodes, &e);
    if (!cl) {
        snprintf(errstr, errstr_size, "%s", e.str);
        return -1;
    }
    int rc = 0;
    for (size_t k = 0; !rc; k++) {
        r->node = idem_cluster_primary_context(cl, k, NULL, &e);
        if (!r->node) {
            if (e.cls != IDEM_CLUSTER_ERR_NONE) {
                snprintf(errstr, errstr_size, "%s", e.str);
                rc = -1;
            }
            break;
        }
        rc = marks_scan(r, group, cb, opaque, errstr, errstr_size);
    }
    r->node = NULL;
    idem_cluster_destroy(cl);
    return rc;
}

static int marks_scan(idem_storeread_t *r, const char *group,
                      void (*cb)(const idem_storeread_mark_t *mark,
                                 void *opaque),
                      void *opaque, char *errstr, size_t errstr_size)
{
    /* SCAN MATCH takes a glob: the prefix and group are escaped. */
    char head[1024], pattern[2100];
    int hn = snprintf(head, sizeof(head),
                      "%s" MARK_SEGMENT "%s:", r->conf->redis_prefix, group);
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
        const char *argv[] = {"SCAN",  cursor,  "MATCH",
                              pattern, "COUNT", "1000"};
        redisReply *rep = reader_command(r, 6, argv, NULL, errstr, errstr_size);
        if (!rep)
            return -1;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(rep);
            snprintf(errstr, errstr_size, "redis SCAN: unexpected reply");
            return -1;
        }
        snprintf(cursor, sizeof(cursor), "%s", rep->element[0]->str);
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
            redisReply *vals =
                r->node ? node_gets(r->node, keys, errstr, errstr_size)
                        : reader_command(r, (int)n, margv, mlen, errstr,
                                         errstr_size);
            free(margv);
            free(mlen);
            if (!vals) {
                freeReplyObject(rep);
                return -1;
            }
            for (size_t i = 0; i < keys->elements && i < vals->elements; i++) {
                redisReply *k = keys->element[i], *v = vals->element[i];
                if (v->type != REDIS_REPLY_STRING || k->len < (size_t)hn)
                    continue; /* expired since the SCAN */
                idem_storeread_mark_t m = {
                    .identity = k->str + hn,
                    .identity_len = k->len - (size_t)hn,
                    .done = v->len >= 5 && !memcmp(v->str, "done:", 5),
                };
                if (m.done) {
                    m.message_id = v->str + 5;
                    m.message_id_len = v->len - 5;
                }
                cb(&m, opaque);
            }
            freeReplyObject(vals);
        }
        freeReplyObject(rep);
    } while (strcmp(cursor, "0"));
    return 0;
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
