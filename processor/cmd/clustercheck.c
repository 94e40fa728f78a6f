/* clustercheck: check-config --connect in cluster mode: every seed reached,
 * every primary of the slot map checked as a single Redis is, with the
 * partition chunk script loaded and its ACL rights asked, every slot
 * covered; one line per node. */
#include "cmd/cmd.h"
#include "effect/handler.h"
#include "redis/cluster.h"
#include "redis/partstate.h"
#include "redis/rediskeys.h"
#include "redis/redisconn.h"
#include "redis/store.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const idem_conf_t *conf;
    FILE *out;
    size_t primaries;
    idem_partstate_t *part; /* the chunk script's check, or NULL */
    int failed;             /* primaries the chunk's check failed */
} check_ctx_t;

/* "host:port" or "[v6]:port" (len bytes) into host and port. 0 or -1. */
static int seed_parse(const char *s, size_t len, char *host, size_t size,
                      int *port)
{
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':')
            colon = s + i;
    if (!colon || colon == s)
        return -1;
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (hl == 0 || hl >= size || end != s + len || p < 1 || p > 65535)
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

/* One line per seed: reached (a replica will do: a seed only gives the
 * slot map) or not. A seed that is down is no failure by itself: a
 * member skips it too; the primaries decide. */
static void seeds_check(const idem_conf_t *conf, FILE *out)
{
    const char *p = conf->redis_cluster_nodes;
    for (;;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            return;
        size_t len = strcspn(p, ", ");
        char host[256];
        int port;
        if (seed_parse(p, len, host, sizeof(host), &port)) {
            fprintf(out,
                    "check-config: redis cluster: seed %.*s: not host:port\n",
                    (int)(len > 64 ? 64 : len), p);
        } else {
            idem_redisconn_err_t e;
            idem_redisconn_t *rc =
                idem_redisconn_open_node(conf, host, port, 1, &e);
            if (rc)
                fprintf(out,
                        "check-config: redis cluster: seed %.*s: reached\n",
                        (int)len, p);
            else
                fprintf(out,
                        "check-config: redis cluster: seed %.*s: not reached "
                        "(%s)\n",
                        (int)len, p, e.str);
            idem_redisconn_close(rc);
        }
        p += len;
    }
}

/* The partition chunk's check on the primary `node` (a connection of its
 * own, as a member's: redis.url's user, password and TLS): the script
 * loaded and its ACL rights (idem_partstate_node_check). 0, or -1 with
 * err naming the node. */
static int chunk_check(check_ctx_t *x, const char *node, char *err,
                       size_t err_size)
{
    char host[256];
    int port;
    if (seed_parse(node, strlen(node), host, sizeof(host), &port)) {
        snprintf(err, err_size, "redis cluster: %s: not host:port", node);
        return -1;
    }
    idem_redisconn_err_t e;
    idem_redisconn_t *rc = idem_redisconn_open_node(x->conf, host, port, 0, &e);
    if (!rc) {
        snprintf(err, err_size, "redis cluster: %s", e.str);
        return -1;
    }
    int rc_ = idem_partstate_node_check(x->part, rc, x->conf->input_topic[0],
                                        err, err_size);
    idem_redisconn_close(rc);
    return rc_;
}

/* idem_store_node_check_fn: the primary's line (after the chunk's check,
 * when it runs); a failure also on stderr, naming the node. */
static void primary_line(const char *node, size_t slots, const char *err,
                         void *opaque)
{
    check_ctx_t *x = opaque;
    x->primaries++;
    char chunk_err[1024];
    if (!err && x->part && chunk_check(x, node, chunk_err, sizeof(chunk_err))) {
        err = chunk_err;
        x->failed++;
    }
    if (!err) {
        fprintf(x->out,
                "check-config: redis cluster: primary %s: ok (%zu slots)\n",
                node, slots);
        return;
    }
    fprintf(x->out,
            "check-config: redis cluster: primary %s: FAILED (%zu "
            "slots): %s\n",
            node, slots, err);
    fflush(x->out);
    fprintf(stderr, "idemproc check-config: redis cluster: primary %s: %s\n",
            node, err);
}

/* An effect in Redis under dedup.scope=partition (ledger, script): its
 * handler started on store, as `run` starts it, so that the effect is
 * registered (the store loads its framing on every primary) and the
 * partition chunk script composed from it into *part. The handler's state
 * (stop it with *ops), or NULL: nothing to check, or an error said on
 * stderr (*failed set). */
static void *chunk_prepare(const idem_conf_t *conf, idem_store_t *store,
                           const idem_handler_ops_t **ops,
                           idem_partstate_t **part, int *failed)
{
    const char *arg = "";
    char errstr[512];
    *ops = idem_handler_find(conf->handler, &arg, errstr, sizeof(errstr));
    if (!*ops || (*ops)->effect != IDEM_EFFECT_IN_REDIS ||
        conf->dedup_scope != IDEM_DEDUP_SCOPE_PARTITION ||
        !conf->input_topic_cnt)
        return NULL;
    idem_handler_ctx_t ctx = {
        .conf = conf, .arg = arg, .store = store, .member_id = conf->member_id};
    void *h = (*ops)->start(&ctx, errstr, sizeof(errstr));
    if (h)
        *part = idem_partstate_new(store, conf, errstr, sizeof(errstr));
    if (!h || !*part) {
        fprintf(stderr, "idemproc check-config: redis cluster: %s\n", errstr);
        *failed = 1;
    }
    return h;
}

int idem_cmd_cluster_check(const idem_conf_t *conf, FILE *out)
{
    seeds_check(conf, out);
    idem_store_t *store = idem_store_new(conf, NULL);
    /* As `run` does: an evicting maxmemory-policy is refused (unless
     * redis.allow.eviction=true). */
    idem_store_guard_eviction(store);
    check_ctx_t x = {.conf = conf, .out = out};
    const idem_handler_ops_t *ops = NULL;
    int prep_failed = 0;
    void *h = chunk_prepare(conf, store, &ops, &x.part, &prep_failed);
    size_t uncovered = 0;
    char errstr[512];
    int failed = idem_store_cluster_check(store, primary_line, &x, &uncovered,
                                          errstr, sizeof(errstr));
    if (failed >= 0)
        failed += x.failed + prep_failed;
    idem_partstate_destroy(x.part);
    if (h)
        ops->stop(h);
    idem_store_destroy(store);
    if (failed < 0) {
        fflush(out);
        fprintf(stderr, "idemproc check-config: %s\n", errstr);
        return IDEM_EXIT_FAIL;
    }
    if (uncovered) {
        fprintf(out,
                "check-config: redis cluster: %zu of %d slots have no "
                "primary\n",
                uncovered, IDEM_CLUSTER_SLOTS);
        fflush(out);
        fprintf(stderr,
                "idemproc check-config: redis cluster: %zu of %d slots have "
                "no primary in the slot map (the cluster refuses their keys)\n",
                uncovered, IDEM_CLUSTER_SLOTS);
    } else {
        fprintf(out,
                "check-config: redis cluster: all %d slots covered by %zu "
                "primar%s%s\n",
                IDEM_CLUSTER_SLOTS, x.primaries, x.primaries == 1 ? "y" : "ies",
                failed ? "" : ", every one ok");
    }
    if (failed) {
        fflush(out);
        fprintf(stderr,
                "idemproc check-config: redis cluster: %d of %zu primar%s "
                "failed\n",
                failed, x.primaries, x.primaries == 1 ? "y" : "ies");
    }
    return failed || uncovered ? IDEM_EXIT_FAIL : IDEM_EXIT_OK;
}
