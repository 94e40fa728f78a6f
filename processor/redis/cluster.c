/* cluster: a Redis Cluster client on blocking hiredis 0.14: slot map,
 * connections per primary, MOVED/ASK/TRYAGAIN followed, outages classed. */
#include "redis/cluster.h"
#include "base/log.h"
#include "base/util.h"
#include "redis/redisconn.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Rounds of one call: each sends what has no reply yet; a redirection or
 * a lost connection costs one. */
#define CLUSTER_MAX_ROUNDS 16
/* MOVED replies after which the whole map is read again rather than
 * patched slot by slot (a resharding moves many slots at once). */
#define CLUSTER_MOVED_REFRESH 4
/* TRYAGAIN's backoff: from 5 ms, doubling, at most 200 ms a wait. */
#define CLUSTER_TRYAGAIN_MIN_MS 5
#define CLUSTER_TRYAGAIN_MAX_MS 200

typedef struct {
    char host[256];
    int port;
    char addr[300];       /* host:port */
    idem_redisconn_t *rc; /* open to a primary; NULL until needed */
    idem_cluster_node_stats_t st;
} node_t;

struct idem_cluster_s {
    const idem_conf_t *conf; /* borrowed */
    node_t *nodes;
    size_t nnodes, cap;
    size_t nseeds;                         /* nodes[0..nseeds) are the seeds */
    int16_t slot_node[IDEM_CLUSTER_SLOTS]; /* index in nodes, -1 none */
    int need_refresh;     /* a connection was lost or CLUSTERDOWN seen */
    unsigned moved_count; /* MOVED since the last whole read */
    uint64_t refreshes;
    uint64_t connects;           /* connections to primaries opened */
    idem_cluster_check_fn check; /* of each new connection; NULL none */
    void *check_opaque;
};

/* ---- key slots ------------------------------------------------------- */

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), bitwise: the slot
 * of a key is computed once per chunk, not per byte of traffic. */
static uint16_t crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((uint8_t)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021)
                                 : (uint16_t)(crc << 1);
    }
    return crc;
}

int idem_cluster_keyslot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) &
                   (IDEM_CLUSTER_SLOTS - 1);
    }
    return crc16(key, len) & (IDEM_CLUSTER_SLOTS - 1);
}

unsigned idem_cluster_crc16(const char *buf, size_t len)
{
    return crc16(buf, len);
}

const char *idem_cluster_errclass2str(idem_cluster_errclass_t cls)
{
    switch (cls) {
    case IDEM_CLUSTER_ERR_NONE:
        return "none";
    case IDEM_CLUSTER_ERR_CONNECTION:
        return "connection";
    case IDEM_CLUSTER_ERR_TIMEOUT:
        return "timeout";
    case IDEM_CLUSTER_ERR_CLUSTERDOWN:
        return "clusterdown";
    case IDEM_CLUSTER_ERR_REDIRECTS:
        return "redirects";
    case IDEM_CLUSTER_ERR_SLOTS:
        return "slots";
    case IDEM_CLUSTER_ERR_REFUSED:
        return "refused";
    }
    return "?";
}

static void err_set(idem_cluster_err_t *err, idem_cluster_errclass_t cls,
                    const char *node, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void err_set(idem_cluster_err_t *err, idem_cluster_errclass_t cls,
                    const char *node, const char *code, const char *fmt, ...)
{
    err->cls = cls;
    snprintf(err->node, sizeof(err->node), "%s", node ? node : "");
    snprintf(err->code, sizeof(err->code), "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->str, sizeof(err->str), fmt, ap);
    va_end(ap);
}

/* ---- nodes ----------------------------------------------------------- */

/* "host:port" (or "[v6]:port") of length len into host/port. 0 or -1. */
static int addr_parse(const char *s, size_t len, char *host, size_t host_size,
                      int *port)
{
    char hp[300];
    if (len == 0 || len >= sizeof(hp))
        return -1;
    memcpy(hp, s, len);
    hp[len] = '\0';
    char *colon = strrchr(hp, ':');
    if (!colon || !colon[1])
        return -1;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 1 || p > 65535)
        return -1;
    *colon = '\0';
    char *h = hp;
    size_t hl = strlen(h);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h[hl - 1] = '\0';
        h++;
    }
    if (!h[0] || strlen(h) >= host_size)
        return -1;
    snprintf(host, host_size, "%s", h);
    *port = (int)p;
    return 0;
}

/* The index of node host:port, added when new. */
static int node_index(idem_cluster_t *cl, const char *host, int port)
{
    for (size_t i = 0; i < cl->nnodes; i++)
        if (cl->nodes[i].port == port && !strcmp(cl->nodes[i].host, host))
            return (int)i;
    if (cl->nnodes == cl->cap) {
        cl->cap = cl->cap ? cl->cap * 2 : 8;
        cl->nodes = idem_xrealloc(cl->nodes, cl->cap * sizeof(*cl->nodes));
    }
    node_t *n = &cl->nodes[cl->nnodes];
    memset(n, 0, sizeof(*n));
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    snprintf(n->addr, sizeof(n->addr), "%s%s%s:%d",
             strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
             port);
    return (int)cl->nnodes++;
}

static void node_drop(node_t *n)
{
    idem_redisconn_close(n->rc);
    n->rc = NULL;
}

/* redisconn's failure as the cluster's class, counted on the node. */
static idem_cluster_errclass_t conn_class(node_t *n,
                                          const idem_redisconn_err_t *e)
{
    if (e->cls == IDEM_REDISCONN_ERR_TIMEOUT) {
        n->st.timeouts++;
        return IDEM_CLUSTER_ERR_TIMEOUT;
    }
    n->st.conn_errors++;
    return IDEM_CLUSTER_ERR_CONNECTION;
}

/* A hiredis context that failed (NULL reply): a timeout or a lost
 * connection, counted on the node, the node's connection dropped. hiredis
 * 0.14 reports a read timeout only as the system's text for EAGAIN. */
static void conn_lost(node_t *n, idem_cluster_err_t *err)
{
    redisContext *c = idem_redisconn_context(n->rc);
    const char *e = c->errstr[0] ? c->errstr : "connection lost";
    int timeout =
        c->err == REDIS_ERR_IO &&
        (!strcmp(e, strerror(EAGAIN)) || !strcmp(e, strerror(EWOULDBLOCK)) ||
         !strcmp(e, strerror(ETIMEDOUT)));
    if (timeout) {
        n->st.timeouts++;
        err_set(err, IDEM_CLUSTER_ERR_TIMEOUT, n->addr, NULL,
                "redis cluster: %s: no reply within the timeout", n->addr);
    } else {
        n->st.conn_errors++;
        err_set(err, IDEM_CLUSTER_ERR_CONNECTION, n->addr, NULL,
                "redis cluster: %s: %s", n->addr, e);
    }
    node_drop(n);
}

/* The node's connection to a primary, opened when needed. NULL with *err;
 * *not_primary is set when the node answered ROLE as a replica (the map
 * is stale). */
static redisContext *node_conn(idem_cluster_t *cl, node_t *n, int *not_primary,
                               idem_cluster_err_t *err)
{
    *not_primary = 0;
    if (n->rc)
        return idem_redisconn_context(n->rc);
    idem_redisconn_err_t e;
    n->rc = idem_redisconn_open_node(cl->conf, n->host, n->port, 0, &e);
    if (n->rc) {
        char why[512] = "";
        /* The check may send commands: n stays valid (no node added). */
        if (cl->check &&
            cl->check(cl->check_opaque, n->addr, idem_redisconn_context(n->rc),
                      why, sizeof(why))) {
            node_drop(n);
            err_set(err, IDEM_CLUSTER_ERR_REFUSED, n->addr, NULL, "%s",
                    why[0] ? why : "redis cluster: node refused");
            return NULL;
        }
        cl->connects++;
        return idem_redisconn_context(n->rc);
    }
    *not_primary = e.cls == IDEM_REDISCONN_ERR_NOT_PRIMARY;
    err_set(err, conn_class(n, &e), n->addr, e.code, "redis cluster: %s",
            e.str);
    return NULL;
}

/* ---- the slot map ---------------------------------------------------- */

static int reply_int(const redisReply *r, long long *v)
{
    if (r->type == REDIS_REPLY_INTEGER) {
        *v = r->integer;
        return 0;
    }
    if (r->type == REDIS_REPLY_STRING) {
        char *end;
        *v = strtoll(r->str, &end, 10);
        return *end ? -1 : 0;
    }
    return -1;
}

/* Fills map from a CLUSTER SLOTS reply asked of node `asked` (an empty
 * host means that node's). 0, or -1 for a reply of another shape. */
static int slots_parse(idem_cluster_t *cl, const redisReply *r,
                       const char *asked_host, int16_t *map)
{
    if (r->type != REDIS_REPLY_ARRAY)
        return -1;
    for (int s = 0; s < IDEM_CLUSTER_SLOTS; s++)
        map[s] = -1;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        long long from, to, port;
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            reply_int(e->element[0], &from) || reply_int(e->element[1], &to) ||
            from < 0 || to >= IDEM_CLUSTER_SLOTS || from > to)
            return -1;
        const redisReply *p = e->element[2];
        if (p->type != REDIS_REPLY_ARRAY || p->elements < 2 ||
            p->element[0]->type != REDIS_REPLY_STRING ||
            reply_int(p->element[1], &port) || port < 1 || port > 65535)
            return -1;
        const char *host = p->element[0]->str;
        if (!host[0] || !strcmp(host, "?"))
            host = asked_host;
        int idx = node_index(cl, host, (int)port);
        for (long long s = from; s <= to; s++)
            map[s] = (int16_t)idx;
    }
    return 0;
}

/* Asks node i for CLUSTER SLOTS (on its connection when open, else on a
 * connection of its own that may be to a replica) into map. 0 or -1. */
static int slots_ask(idem_cluster_t *cl, size_t i, int16_t *map,
                     idem_cluster_err_t *err)
{
    idem_redisconn_t *tmp = NULL;
    node_t *n = &cl->nodes[i];
    if (!n->rc) {
        idem_redisconn_err_t e;
        tmp = idem_redisconn_open_node(cl->conf, n->host, n->port, 1, &e);
        if (!tmp) {
            n = &cl->nodes[i];
            err_set(err, conn_class(n, &e), n->addr, e.code,
                    "redis cluster: %s", e.str);
            return -1;
        }
    }
    redisContext *c = idem_redisconn_context(tmp ? tmp : n->rc);
    const char *argv[] = {"CLUSTER", "SLOTS"};
    redisReply *r = redisCommandArgv(c, 2, argv, NULL);
    n->st.requests++;
    int rc = -1;
    if (!r) {
        if (tmp) {
            n->st.conn_errors++;
            err_set(err, IDEM_CLUSTER_ERR_CONNECTION, n->addr, NULL,
                    "redis cluster: %s: CLUSTER SLOTS: %s", n->addr,
                    c->errstr[0] ? c->errstr : "connection lost");
        } else {
            conn_lost(n, err);
        }
    } else if (r->type == REDIS_REPLY_ERROR) {
        err_set(err, IDEM_CLUSTER_ERR_SLOTS, n->addr, NULL,
                "redis cluster: %s: CLUSTER SLOTS: %s", n->addr, r->str);
    } else {
        char host[256];
        snprintf(host, sizeof(host), "%s", n->host);
        /* node_index may move the nodes: n is not used after this. */
        rc = slots_parse(cl, r, host, map);
        if (rc)
            err_set(err, IDEM_CLUSTER_ERR_SLOTS, host, NULL,
                    "redis cluster: %s: CLUSTER SLOTS: a reply of another "
                    "shape",
                    cl->nodes[i].addr);
    }
    if (r)
        freeReplyObject(r);
    idem_redisconn_close(tmp);
    return rc;
}

int idem_cluster_refresh(idem_cluster_t *cl, idem_cluster_err_t *err)
{
    int16_t *map = idem_xcalloc(IDEM_CLUSTER_SLOTS, sizeof(*map));
    idem_cluster_err_t last = {0};
    int ok = 0;
    /* The primaries with a connection first (no connect needed), then
     * every other node the client knows, the seeds included. */
    for (int pass = 0; pass < 2 && !ok; pass++) {
        for (size_t i = 0; i < cl->nnodes && !ok; i++) {
            if ((cl->nodes[i].rc != NULL) != (pass == 0))
                continue;
            ok = slots_ask(cl, i, map, &last) == 0;
        }
    }
    if (!ok) {
        free(map);
        if (last.cls == IDEM_CLUSTER_ERR_NONE)
            err_set(&last, IDEM_CLUSTER_ERR_SLOTS, NULL, NULL,
                    "redis cluster: no node known");
        *err = last;
        err->cls = IDEM_CLUSTER_ERR_SLOTS;
        if (!strstr(err->str, "slot map")) {
            size_t l = strlen(err->str);
            snprintf(err->str + l, sizeof(err->str) - l,
                     " (no node gave the slot map)");
        }
        return -1;
    }
    memcpy(cl->slot_node, map, sizeof(cl->slot_node));
    free(map);
    /* One connection per primary: a node that serves no slot now (a
     * primary demoted by a failover) loses its connection. */
    for (size_t i = 0; i < cl->nnodes; i++) {
        if (!cl->nodes[i].rc)
            continue;
        int serves = 0;
        for (int s = 0; s < IDEM_CLUSTER_SLOTS && !serves; s++)
            serves = cl->slot_node[s] == (int16_t)i;
        if (!serves)
            node_drop(&cl->nodes[i]);
    }
    cl->need_refresh = 0;
    cl->moved_count = 0;
    cl->refreshes++;
    return 0;
}

idem_cluster_t *idem_cluster_new(const idem_conf_t *conf, const char *seeds,
                                 idem_cluster_err_t *err)
{
    memset(err, 0, sizeof(*err));
    idem_cluster_t *cl = idem_xcalloc(1, sizeof(*cl));
    cl->conf = conf;
    for (int s = 0; s < IDEM_CLUSTER_SLOTS; s++)
        cl->slot_node[s] = -1;
    const char *p = seeds ? seeds : "";
    for (;;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, ", ");
        char host[256];
        int port;
        if (addr_parse(p, len, host, sizeof(host), &port)) {
            err_set(err, IDEM_CLUSTER_ERR_SLOTS, NULL, NULL,
                    "redis cluster: seed \"%.*s\" is not host:port",
                    len > 64 ? 64 : (int)len, p);
            idem_cluster_destroy(cl);
            return NULL;
        }
        node_index(cl, host, port);
        p += len;
    }
    cl->nseeds = cl->nnodes;
    if (!cl->nseeds) {
        err_set(err, IDEM_CLUSTER_ERR_SLOTS, NULL, NULL,
                "redis cluster: no seed node (host:port,...)");
        idem_cluster_destroy(cl);
        return NULL;
    }
    if (idem_cluster_refresh(cl, err)) {
        idem_cluster_destroy(cl);
        return NULL;
    }
    return cl;
}

void idem_cluster_set_check(idem_cluster_t *cl, idem_cluster_check_fn fn,
                            void *opaque)
{
    cl->check = fn;
    cl->check_opaque = opaque;
}

void idem_cluster_destroy(idem_cluster_t *cl)
{
    if (!cl)
        return;
    for (size_t i = 0; i < cl->nnodes; i++)
        node_drop(&cl->nodes[i]);
    free(cl->nodes);
    free(cl);
}

/* ---- commands -------------------------------------------------------- */

/* What a reply asks of the client. */
typedef enum {
    REPLY_FINAL = 0,  /* the command's answer */
    REPLY_MOVED,      /* MOVED slot host:port */
    REPLY_ASK,        /* ASK slot host:port */
    REPLY_TRYAGAIN,   /* TRYAGAIN */
    REPLY_CLUSTERDOWN /* CLUSTERDOWN */
} reply_kind_t;

/* Reads a redirection's target: "MOVED 3999 127.0.0.1:6381" (an empty
 * host, ":6381", means the node that answered). */
static reply_kind_t reply_kind(const redisReply *r, const node_t *from,
                               char *host, size_t host_size, int *port)
{
    if (r->type != REDIS_REPLY_ERROR)
        return REPLY_FINAL;
    if (!strncmp(r->str, "TRYAGAIN", 8))
        return REPLY_TRYAGAIN;
    if (!strncmp(r->str, "CLUSTERDOWN", 11))
        return REPLY_CLUSTERDOWN;
    reply_kind_t k;
    if (!strncmp(r->str, "MOVED ", 6))
        k = REPLY_MOVED;
    else if (!strncmp(r->str, "ASK ", 4))
        k = REPLY_ASK;
    else
        return REPLY_FINAL;
    const char *sp = strchr(r->str, ' ');
    sp = sp ? strchr(sp + 1, ' ') : NULL;
    if (!sp)
        return REPLY_FINAL; /* not a redirection we can read: the caller's */
    const char *a = sp + 1;
    size_t len = strcspn(a, " ");
    if (a[0] == ':') {
        char hp[300];
        snprintf(hp, sizeof(hp), "%s%.*s", from->host, (int)len, a);
        return addr_parse(hp, strlen(hp), host, host_size, port) ? REPLY_FINAL
                                                                 : k;
    }
    return addr_parse(a, len, host, host_size, port) ? REPLY_FINAL : k;
}

static int redirect_slot(const redisReply *r)
{
    const char *sp = strchr(r->str, ' ');
    return sp ? atoi(sp + 1) : -1;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Writes what a context has buffered (hiredis writes only when a reply
 * is read): every node's pipeline is on the wire before any reply is
 * read. 0, or -1 when the connection failed. */
static int conn_flush(redisContext *c)
{
    int done = 0;
    while (!done)
        if (redisBufferWrite(c, &done) != REDIS_OK)
            return -1;
    return 0;
}

/* The state of one idem_cluster_pipeline_slots call. */
typedef struct {
    const idem_cluster_cmd_t *cmds;
    const int *slots;
    size_t n;
    redisReply **replies;
    idem_cluster_err_t *errs;
    int *dest;       /* node the command goes to this round; -1 not sent */
    int *ask_node;   /* node an ASK sent it to; -1 none */
    int *conn_tries; /* rounds that met its node's connection failing */
    char *failed;    /* an outage answered it for good (errs[i]) */
    int tryagain;    /* a TRYAGAIN (or a waited ASK) this round */
} slots_call_t;

/* Command i met node d's connection failing (*e): resent next round to
 * the slot's primary then known (the map is read again), given up on
 * after two such rounds unless the node said it is no primary (a
 * failover in progress: bounded by the rounds). */
static void call_conn_failed(idem_cluster_t *cl, slots_call_t *k, size_t i,
                             int not_primary, const idem_cluster_err_t *e)
{
    k->errs[i] = *e;
    k->ask_node[i] = -1;
    k->dest[i] = -1;
    cl->need_refresh = 1;
    if (e->cls == IDEM_CLUSTER_ERR_REFUSED ||
        (!not_primary && ++k->conn_tries[i] >= 2))
        k->failed[i] = 1;
}

/* Reads node d's replies to the commands sent to it this round, in the
 * order they were sent, and acts on each: the answer kept, a redirection
 * noted for the next round, CLUSTERDOWN an outage of that command. A
 * connection that fails fails the commands not read yet. */
static void node_read(idem_cluster_t *cl, slots_call_t *k, int d)
{
    redisContext *c = idem_redisconn_context(cl->nodes[d].rc);
    for (size_t i = 0; i < k->n; i++) {
        if (k->dest[i] != d)
            continue;
        void *rv = NULL;
        int asked = k->ask_node[i] >= 0;
        if (asked) {
            if (redisGetReply(c, &rv) != REDIS_OK)
                goto lost;
            freeReplyObject(rv); /* ASKING's OK: the command says the rest */
            rv = NULL;
        }
        if (redisGetReply(c, &rv) != REDIS_OK)
            goto lost;
        k->dest[i] = -1;
        redisReply *r = rv;
        int slot = k->slots[i];
        char host[256];
        int port;
        node_t *node = &cl->nodes[d];
        reply_kind_t kind = reply_kind(r, node, host, sizeof(host), &port);
        /* A redirection for another slot: the command's key is not in the
         * slot the caller named, a caller's error, its answer. */
        if ((kind == REPLY_MOVED || kind == REPLY_ASK) &&
            redirect_slot(r) != slot)
            kind = REPLY_FINAL;
        switch (kind) {
        case REPLY_FINAL:
            k->replies[i] = r;
            k->ask_node[i] = -1;
            memset(&k->errs[i], 0, sizeof(k->errs[i]));
            continue;
        case REPLY_MOVED:
            node->st.moved++;
            /* node_index may move cl->nodes: node is not used after it. */
            cl->slot_node[slot] = (int16_t)node_index(cl, host, port);
            cl->moved_count++;
            k->ask_node[i] = -1;
            break;
        case REPLY_ASK:
            node->st.ask++;
            if (k->cmds[i].ask_waits) {
                k->tryagain = 1; /* resent here once the slot has moved */
                k->ask_node[i] = -1;
            } else {
                k->ask_node[i] = node_index(cl, host, port);
            }
            break;
        case REPLY_TRYAGAIN:
            node->st.tryagain++;
            k->tryagain = 1;
            break;
        case REPLY_CLUSTERDOWN:
            node->st.clusterdown++;
            err_set(&k->errs[i], IDEM_CLUSTER_ERR_CLUSTERDOWN, node->addr,
                    "CLUSTERDOWN", "redis cluster: %s: %s", node->addr, r->str);
            k->failed[i] = 1;
            k->ask_node[i] = -1;
            cl->need_refresh = 1;
            break;
        }
        freeReplyObject(r);
    }
    return;
lost:;
    idem_cluster_err_t e;
    conn_lost(&cl->nodes[d], &e);
    for (size_t i = 0; i < k->n; i++)
        if (k->dest[i] == d)
            call_conn_failed(cl, k, i, 0, &e);
}

/* One round: every pending command to its node (the slot's primary, or
 * the node an ASK named, with ASKING before it), the commands of one
 * node as one pipeline, every pipeline written before any reply is read;
 * then each node's replies. 0, or -1 when the slot map could not be read
 * (every pending command failed with it). */
static int slots_round(idem_cluster_t *cl, slots_call_t *k)
{
    int unmapped = 0;
    for (size_t i = 0; i < k->n && !unmapped; i++)
        unmapped = !k->replies[i] && !k->failed[i] && k->ask_node[i] < 0 &&
                   cl->slot_node[k->slots[i]] < 0;
    if (cl->need_refresh || cl->moved_count >= CLUSTER_MOVED_REFRESH ||
        unmapped) {
        idem_cluster_err_t e;
        if (idem_cluster_refresh(cl, &e)) {
            for (size_t i = 0; i < k->n; i++)
                if (!k->replies[i] && !k->failed[i]) {
                    k->errs[i] = e;
                    k->failed[i] = 1;
                }
            return -1;
        }
    }
    size_t nn = cl->nnodes;
    char *sent = idem_xcalloc(nn ? nn : 1, 1);
    for (size_t i = 0; i < k->n; i++) {
        k->dest[i] = -1;
        if (k->replies[i] || k->failed[i])
            continue;
        int d =
            k->ask_node[i] >= 0 ? k->ask_node[i] : cl->slot_node[k->slots[i]];
        if (d < 0) {
            err_set(&k->errs[i], IDEM_CLUSTER_ERR_SLOTS, NULL, NULL,
                    "redis cluster: slot %d has no primary in the slot map",
                    k->slots[i]);
            k->failed[i] = 1;
            cl->need_refresh = 1;
            continue;
        }
        k->dest[i] = d;
    }
    /* Write: node by node, each node's commands in the caller's order. */
    for (size_t d = 0; d < nn; d++) {
        int any = 0;
        for (size_t i = 0; i < k->n && !any; i++)
            any = k->dest[i] == (int)d;
        if (!any)
            continue;
        node_t *node = &cl->nodes[d];
        int not_primary = 0;
        idem_cluster_err_t e;
        redisContext *c = node_conn(cl, node, &not_primary, &e);
        if (c) {
            for (size_t i = 0; i < k->n; i++) {
                if (k->dest[i] != (int)d)
                    continue;
                if (k->ask_node[i] >= 0)
                    redisAppendCommand(c, "ASKING");
                if (k->cmds[i].formatted)
                    redisAppendFormattedCommand(c, k->cmds[i].formatted,
                                                k->cmds[i].formatted_len);
                else
                    redisAppendCommandArgv(c, k->cmds[i].argc, k->cmds[i].argv,
                                           k->cmds[i].argvlen);
                node->st.requests++;
            }
            if (!conn_flush(c)) {
                sent[d] = 1;
                continue;
            }
            conn_lost(node, &e);
        }
        for (size_t i = 0; i < k->n; i++)
            if (k->dest[i] == (int)d)
                call_conn_failed(cl, k, i, not_primary, &e);
    }
    /* Read: node by node; the other nodes' replies wait in their
     * sockets meanwhile. */
    for (size_t d = 0; d < nn; d++)
        if (sent[d])
            node_read(cl, k, (int)d);
    free(sent);
    return 0;
}

int idem_cluster_pipeline_slots(idem_cluster_t *cl,
                                const idem_cluster_cmd_t *cmds,
                                const int *slots, size_t n,
                                redisReply **replies, idem_cluster_err_t *errs,
                                idem_cluster_err_t *first)
{
    memset(first, 0, sizeof(*first));
    size_t m = n ? n : 1;
    slots_call_t k = {.cmds = cmds,
                      .slots = slots,
                      .n = n,
                      .replies = replies,
                      .errs = errs,
                      .dest = idem_xmalloc(m * sizeof(int)),
                      .ask_node = idem_xmalloc(m * sizeof(int)),
                      .conn_tries = idem_xcalloc(m, sizeof(int)),
                      .failed = idem_xcalloc(m, 1)};
    for (size_t i = 0; i < n; i++) {
        k.ask_node[i] = -1;
        memset(&errs[i], 0, sizeof(errs[i]));
    }
    int backoff = CLUSTER_TRYAGAIN_MIN_MS;
    for (int round = 0;; round++) {
        size_t pending = 0;
        for (size_t i = 0; i < n; i++)
            pending += !replies[i] && !k.failed[i];
        if (!pending)
            break;
        if (round == CLUSTER_MAX_ROUNDS) {
            for (size_t i = 0; i < n; i++) {
                if (replies[i] || k.failed[i])
                    continue;
                if (errs[i].cls == IDEM_CLUSTER_ERR_NONE)
                    err_set(&errs[i], IDEM_CLUSTER_ERR_REDIRECTS,
                            idem_cluster_slot_node(cl, slots[i]), NULL,
                            "redis cluster: slot %d: still redirected after "
                            "%d rounds",
                            slots[i], CLUSTER_MAX_ROUNDS);
                k.failed[i] = 1;
            }
            break;
        }
        k.tryagain = 0;
        if (slots_round(cl, &k))
            break;
        if (k.tryagain) {
            sleep_ms(backoff);
            backoff = backoff * 2 > CLUSTER_TRYAGAIN_MAX_MS
                          ? CLUSTER_TRYAGAIN_MAX_MS
                          : backoff * 2;
        }
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (replies[i]) {
            memset(&errs[i], 0, sizeof(errs[i]));
            continue;
        }
        if (!rc)
            *first = errs[i];
        rc = -1;
    }
    free(k.dest);
    free(k.ask_node);
    free(k.conn_tries);
    free(k.failed);
    return rc;
}

int idem_cluster_pipeline(idem_cluster_t *cl, const char *key, size_t key_len,
                          const idem_cluster_cmd_t *cmds, size_t n,
                          redisReply **replies, idem_cluster_err_t *err)
{
    size_t m = n ? n : 1;
    int slot = idem_cluster_keyslot(key, key_len);
    int *slots = idem_xmalloc(m * sizeof(*slots));
    idem_cluster_err_t *errs = idem_xmalloc(m * sizeof(*errs));
    for (size_t i = 0; i < n; i++)
        slots[i] = slot;
    int rc =
        idem_cluster_pipeline_slots(cl, cmds, slots, n, replies, errs, err);
    free(slots);
    free(errs);
    return rc;
}

redisReply *idem_cluster_command(idem_cluster_t *cl, const char *key,
                                 size_t key_len, int argc, const char **argv,
                                 const size_t *argvlen, idem_cluster_err_t *err)
{
    idem_cluster_cmd_t cmd = {.argc = argc, .argv = argv, .argvlen = argvlen};
    redisReply *r = NULL;
    if (idem_cluster_pipeline(cl, key, key_len, &cmd, 1, &r, err))
        return NULL;
    return r;
}

redisContext *idem_cluster_context(idem_cluster_t *cl, int slot,
                                   idem_cluster_err_t *err)
{
    memset(err, 0, sizeof(*err));
    for (int attempt = 0; attempt < 2; attempt++) {
        if ((cl->need_refresh || cl->moved_count >= CLUSTER_MOVED_REFRESH ||
             cl->slot_node[slot] < 0) &&
            idem_cluster_refresh(cl, err))
            return NULL;
        if (cl->slot_node[slot] < 0) {
            err_set(err, IDEM_CLUSTER_ERR_SLOTS, NULL, NULL,
                    "redis cluster: slot %d has no primary in the slot map",
                    slot);
            return NULL;
        }
        int not_primary = 0;
        redisContext *c =
            node_conn(cl, &cl->nodes[cl->slot_node[slot]], &not_primary, err);
        if (c)
            return c;
        cl->need_refresh = 1;
        if (!not_primary)
            return NULL;
    }
    return NULL;
}

redisContext *idem_cluster_primary_context(idem_cluster_t *cl, size_t k,
                                           const char **addr,
                                           idem_cluster_err_t *err)
{
    memset(err, 0, sizeof(*err));
    if (cl->need_refresh && idem_cluster_refresh(cl, err))
        return NULL;
    size_t seen = 0;
    char *met = idem_xcalloc(cl->nnodes ? cl->nnodes : 1, 1);
    for (int s = 0; s < IDEM_CLUSTER_SLOTS; s++) {
        int d = cl->slot_node[s];
        if (d < 0 || met[d])
            continue;
        met[d] = 1;
        if (seen++ != k)
            continue;
        free(met);
        if (addr)
            *addr = cl->nodes[d].addr;
        int not_primary = 0;
        redisContext *c = node_conn(cl, &cl->nodes[d], &not_primary, err);
        if (!c)
            cl->need_refresh = 1;
        return c;
    }
    free(met);
    return NULL;
}

void idem_cluster_failed(idem_cluster_t *cl, int slot, const char *reply)
{
    cl->need_refresh = 1;
    if (slot < 0 || slot >= IDEM_CLUSTER_SLOTS || cl->slot_node[slot] < 0)
        return;
    node_t *n = &cl->nodes[cl->slot_node[slot]];
    if (!reply) {
        n->st.conn_errors++;
        node_drop(n);
    } else if (!strncmp(reply, "MOVED ", 6)) {
        n->st.moved++;
    } else if (!strncmp(reply, "ASK ", 4)) {
        n->st.ask++;
    } else if (!strncmp(reply, "TRYAGAIN", 8)) {
        n->st.tryagain++;
    } else if (!strncmp(reply, "CLUSTERDOWN", 11)) {
        n->st.clusterdown++;
    }
}

uint64_t idem_cluster_connects(const idem_cluster_t *cl)
{
    return cl->connects;
}

/* ---- what the client knows ------------------------------------------- */

const char *idem_cluster_slot_node(const idem_cluster_t *cl, int slot)
{
    if (slot < 0 || slot >= IDEM_CLUSTER_SLOTS || cl->slot_node[slot] < 0)
        return NULL;
    return cl->nodes[cl->slot_node[slot]].addr;
}

size_t idem_cluster_node_count(const idem_cluster_t *cl)
{
    return cl->nnodes;
}

const char *idem_cluster_node_stats(const idem_cluster_t *cl, size_t i,
                                    idem_cluster_node_stats_t *out)
{
    if (i >= cl->nnodes)
        return NULL;
    if (out)
        *out = cl->nodes[i].st;
    return cl->nodes[i].addr;
}

uint64_t idem_cluster_refreshes(const idem_cluster_t *cl)
{
    return cl->refreshes;
}
