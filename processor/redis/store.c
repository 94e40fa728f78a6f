/* store: the Redis side of exactly-once: connection, the lease scripts,
 * the in-Redis handlers' dedup scripts (registered by them) (loaded once,
 * called with EVALSHA, pipelined per batch) and the reads verify needs. A
 * redisReply never leaves this module. */
#include "redis/store.h"
#include "redis/storectx.h"
#include "base/log.h"
#include "redis/aofgate.h"
#include "redis/cluster.h"
#include "redis/gpos.h"
#include "redis/layout.h"
#include "redis/redisconn.h"
#include "base/util.h"

#include <errno.h>
#include <hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records per EVALSHA: big enough to amortise the round trip, small enough
 * that one script never blocks Redis for long (~1 ms per 1000 records). */
#define CHUNK_RECORDS 1000

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
    "  local k = KEYS[(i - 3) / 2] or\n"
    "            (prefix .. 'dedup:' .. group .. ':' .. id)\n"
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
 * ("lost"). Our own done mark (a mark sent again after its reply was lost)
 * is written again unchanged, so a WAIT after it covers it on this
 * connection too. Both scripts take the mark keys in KEYS when given (one
 * per record pair, cluster mode: declared, one slot per call), else build
 * them from the prefix and group. */
static const char mark_lua[] =
    "local prefix, group, ttl, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]\n"
    "local out = {}\n"
    "for i = 5, #ARGV, 2 do\n"
    "  local k = KEYS[(i - 3) / 2] or\n"
    "            (prefix .. 'dedup:' .. group .. ':' .. ARGV[i])\n"
    "  local v = redis.call('GET', k)\n"
    "  if (not v) or v == owner .. ':' .. ARGV[i + 1] then\n"
    "    redis.call('SET', k, 'done:' .. ARGV[i + 1], 'EX', ttl)\n"
    "    out[#out + 1] = ''\n"
    "  elseif v == 'done:' .. ARGV[i + 1] then\n"
    "    redis.call('SET', k, v, 'KEEPTTL')\n"
    "    out[#out + 1] = ''\n"
    "  elseif string.sub(v, 1, 5) == 'done:' then\n"
    "    out[#out + 1] = ''\n"
    "  else\n"
    "    out[#out + 1] = 'lost:' .. v\n"
    "  end\n"
    "end\n"
    "return out\n";

typedef enum { SCRIPT_CLAIM, SCRIPT_MARK, SCRIPT_CNT } script_t;

static const char *const script_src[SCRIPT_CNT] = {claim_lua, mark_lua};

/* A dedup script a handler registered (idem_store_script_register). */
#define USER_SCRIPTS_MAX 4

typedef struct {
    char *src;
    size_t len;
    size_t per_record;
    idem_store_args_fn args;
    void *opaque;
    char sha[41];
} user_script_t;

/* One server the AOF gate and the eviction guard judge: the single
 * Redis, or one primary of the cluster (each its own gate: a node
 * restarted or promoted is a new server of its own). */
typedef struct {
    char addr[300];          /* "host:port" in cluster mode, "" single */
    char run_id[48];         /* from INFO at its last connect */
    idem_aofgate_t gate;     /* which of its servers writes are allowed on */
    idem_aofgate_info_t aof; /* its INFO persistence, last read */
    char aof_said[48];       /* the run_id the gate's wait was logged for */
    char policy[64];         /* maxmemory-policy seen last */
} store_node_t;

struct idem_store_s {
    const idem_conf_t *conf;
    user_script_t user[USER_SCRIPTS_MAX];
    size_t user_cnt;
    char *effect; /* idem_store_effect_register's function, or NULL */
    size_t effect_per;
    idem_store_args_fn effect_args;
    void *effect_opaque;
    int effect_script;         /* its script number (-1 none) */
    const char *effect_layout; /* the layout its framing is told (static) */
    idem_metrics_t *metrics;
    idem_redisconn_t *conn; /* owns c */
    redisContext *c;
    char sha[SCRIPT_CNT][41];
    char ttl[24];      /* dedup.ttl.seconds as text */
    char lease_ms[24]; /* dedup.lease.ms as text */
    /* argv scratch, reused across calls */
    const char **argv;
    size_t *argvlen;
    size_t argv_cap;
    char *req; /* a request's commands in RESP, reused across calls */
    size_t req_len, req_cap;
    size_t pending_chunks; /* replies store_recv still has to read */
    size_t pending_n;      /* records in that request */
    int pending_hset;      /* positions appended to it (one HSET reply) */
    int pending_wait;      /* WAIT appended to it (one reply) */
    int64_t sent_at_us;
    char pos_key[512];   /* <prefix>pos:<group.id> */
    char (*fields)[320]; /* "<topic>:<partition>" scratch */
    char (*offs)[160];   /* values (posval.h) as text scratch */
    size_t fields_cap;
    char wait_replicas[24]; /* redis.wait.replicas as text */
    char wait_timeout[24];  /* redis.wait.timeout.ms as text */
    char run_id[48];        /* the server's, from INFO at connect */
    uint64_t connections;   /* successful connects so far */
    int64_t checked_ms;     /* last maxmemory-policy check */
    char refused[640];      /* the server's configuration is unsafe */
    int guard;              /* refuse an evicting maxmemory-policy */
    int guard_aof;          /* no write before an AOF rewrite on a new
                               server (idem_store_guard_aof) */
    store_node_t single;    /* the single Redis's gate (not cluster) */
    store_node_t *nodes;    /* cluster mode: each primary met, by addr */
    size_t nnodes;
    int replica_ok; /* a reader: a replica will do */
    /* Cluster mode (redis.cluster.nodes; docs/design.md, "Redis Cluster
     * mode"): c is the connection of the primary of `slot`, routed again
     * before every command (the client may have closed the last one). */
    idem_cluster_t *cl;
    int slot;               /* the slot c serves; -1 none */
    int home_slot;          /* the layout key's: INFO, scripts, the layout */
    uint64_t home_connects; /* the client's connects at the last INFO */
    int64_t cluster_exported_ms; /* idem_now_ms() of the last metrics copy */
    char layout_key[512];
    /* Cluster mode's global path (cluster_global): */
    idem_store_where_fn effect_where;
    idem_store_result_t *gres; /* a send's results, until its _recv */
    size_t gres_n, gres_cap;
    int gres_pending;        /* a send's results wait for _recv */
    struct gacked_s *gacked; /* per partition and bucket: the last offset
                                the bucket acknowledged */
    size_t ngacked, gacked_cap;
    uint64_t gpos_losses; /* losses found: counted as connections */
};

/* A bucket's acknowledged last offset of one partition, as this member saw
 * it (a call's reply, or the bucket's field read at a load): what the next
 * call expects the bucket still to hold (GPOS otherwise). */
struct gacked_s {
    char *topic;
    int32_t partition;
    int bucket;
    int64_t acked;
    int64_t touched;    /* the last `at` this member's touch wrote (-1) */
    int64_t touched_ms; /* idem_now_ms() of that touch (-1: never) */
};

static void store_cluster_export(idem_store_t *s, int now);
static void store_cluster_fail(idem_store_t *s, const idem_cluster_err_t *e,
                               char *errstr, size_t errstr_size);

static int cluster_positions(idem_store_t *s, idem_store_pos_t *load,
                             const idem_store_pos_t *save, size_t n,
                             char *errstr, size_t errstr_size);

static int store_route_key(idem_store_t *s, const char *key, size_t len,
                           char *errstr, size_t errstr_size);

static int cluster_global(idem_store_t *s, int script, const void *const *recs,
                          size_t n, const idem_store_pos_t *pos, size_t npos,
                          char *errstr, size_t errstr_size);
static int gpos_check(idem_store_t *s, idem_store_pos_t *load,
                      char (*const raw)[160], const int64_t *records, size_t n,
                      char *errstr, size_t errstr_size);

idem_store_t *idem_store_new(const idem_conf_t *conf, idem_metrics_t *m)
{
    idem_store_t *s = idem_xcalloc(1, sizeof(*s));
    s->conf = conf;
    s->metrics = m;
    snprintf(s->ttl, sizeof(s->ttl), "%" PRId64, conf->dedup_ttl_seconds);
    snprintf(s->lease_ms, sizeof(s->lease_ms), "%" PRId64,
             conf->dedup_lease_ms);
    snprintf(s->pos_key, sizeof(s->pos_key), "%spos:%s", conf->redis_prefix,
             conf->group_id ? conf->group_id : "");
    snprintf(s->wait_replicas, sizeof(s->wait_replicas), "%" PRId64,
             conf->redis_wait_replicas);
    snprintf(s->wait_timeout, sizeof(s->wait_timeout), "%" PRId64,
             conf->redis_wait_timeout_ms);
    s->slot = -1;
    idem_layout_key(conf, s->layout_key, sizeof(s->layout_key));
    s->home_slot = idem_cluster_keyslot(s->layout_key, strlen(s->layout_key));
    return s;
}

int idem_store_cluster(const idem_store_t *s)
{
    return s->conf->redis_cluster_nodes && *s->conf->redis_cluster_nodes;
}

void idem_store_disconnect(idem_store_t *s)
{
    if (s->cl) { /* the client keeps its connections; the map is read again */
        idem_cluster_failed(s->cl, -1, "");
        s->c = NULL;
        s->pending_chunks = 0;
        return;
    }
    idem_redisconn_close(s->conn);
    s->conn = NULL;
    s->c = NULL;
    s->pending_chunks = 0; /* their replies died with the connection */
}

void idem_store_destroy(idem_store_t *s)
{
    if (!s)
        return;
    idem_store_disconnect(s);
    idem_cluster_destroy(s->cl);
    free(s->nodes);
    free(s->argv);
    free(s->argvlen);
    free(s->req);
    free(s->fields);
    free(s->offs);
    for (size_t i = 0; i < s->user_cnt; i++)
        free(s->user[i].src);
    free(s->effect);
    free(s->gres);
    for (size_t i = 0; i < s->ngacked; i++)
        free(s->gacked[i].topic);
    free(s->gacked);
    free(s);
}

/* The class of a Redis error reply (docs/design.md, "Error classes"): its
 * first word, as Redis sends it. Every class is an outage of the store;
 * the errors a record owns never get here (a handler's script turns them
 * into "reject:"). */
static const char *reply_class(const char *err)
{
    static const struct {
        const char *code, *cls;
    } map[] = {{"OOM", "oom"},
               {"READONLY", "readonly"},
               {"MISCONF", "misconf"},
               {"NOREPLICAS", "noreplicas"},
               {"LOADING", "loading"},
               {"BUSY", "busy"},
               {"MASTERDOWN", "masterdown"},
               {"NOAUTH", "auth"},
               {"WRONGPASS", "auth"},
               {"NOPERM", "auth"},
               {"NOSCRIPT", "noscript"}};
    size_t len = strcspn(err, " ");
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strlen(map[i].code) == len && !strncmp(err, map[i].code, len))
            return map[i].cls;
    /* An ACL refusal met inside a script comes as ERR (Redis 7), with no
     * code of its own: the text is all there is. */
    if (!strncmp(err, "ERR ", 4) &&
        strstr(err, "The user executing the script can't"))
        return "auth";
    return "other";
}

const char *idem_store_error_class(const char *redis_error)
{
    return reply_class(redis_error ? redis_error : "");
}

/* The metric class of a failed connect (idem_redisconn_open_err's class):
 * a timeout, a replica that ROLE refused, an error reply by its code
 * (WRONGPASS, LOADING, ...), else the connection itself. */
static const char *connect_class(const idem_redisconn_err_t *err)
{
    switch (err->cls) {
    case IDEM_REDISCONN_ERR_TIMEOUT:
        return "timeout";
    case IDEM_REDISCONN_ERR_NOT_PRIMARY:
        return "readonly";
    case IDEM_REDISCONN_ERR_REPLY: {
        const char *cls = reply_class(err->code);
        return strcmp(cls, "other") ? cls : "connection";
    }
    default:
        return "connection";
    }
}

/* Cluster mode: a live node refusing with CLUSTERDOWN (a slot has no
 * primary) is not the node that is down: the text says that the cluster
 * is, and which node said so. */
static void clusterdown_text(char *errstr, size_t errstr_size, const char *node,
                             const char *reply)
{
    snprintf(errstr, errstr_size,
             "redis cluster: the cluster is down: the live node %s answers %s",
             node, reply);
}

/* Records an infrastructure error of class cls: counts it, drops the
 * connection. */
static int store_fail_class(idem_store_t *s, char *errstr, size_t errstr_size,
                            const char *what, const char *detail,
                            const char *cls)
{
    const char *node = s->cl ? idem_cluster_slot_node(s->cl, s->slot) : NULL;
    if (node && detail && !strncmp(detail, "CLUSTERDOWN", 11))
        clusterdown_text(errstr, errstr_size, node, detail);
    else
        snprintf(errstr, errstr_size, "redis: %s: %s", what,
                 detail ? detail : "unknown error");
    if (s->metrics)
        idem_metrics_redis_error_add(s->metrics, cls, 1);
    if (s->cl) {
        int io = !strcmp(cls, "timeout") || !strcmp(cls, "connection");
        idem_cluster_failed(s->cl, s->slot, io ? NULL : (detail ? detail : ""));
        s->c = NULL;
        s->pending_chunks = 0;
        return -1;
    }
    idem_store_disconnect(s);
    return -1;
}

/* An error reply: classified by its code. */
static int store_fail(idem_store_t *s, char *errstr, size_t errstr_size,
                      const char *what, const char *detail)
{
    return store_fail_class(s, errstr, errstr_size, what, detail,
                            reply_class(detail ? detail : ""));
}

/* The context failed (I/O, protocol, a closed connection): a read or
 * connect that ran into redis.timeout.ms is reported as such, not as the
 * system's "Resource temporarily unavailable". */
static int store_io_fail(idem_store_t *s, char *errstr, size_t errstr_size,
                         const char *what)
{
    const char *e = s->c ? s->c->errstr : "out of memory";
    if (s->c && s->c->err == REDIS_ERR_IO &&
        (!strcmp(e, strerror(EAGAIN)) || !strcmp(e, strerror(EWOULDBLOCK)) ||
         !strcmp(e, strerror(ETIMEDOUT)) ||
         !strcmp(e, strerror(EINPROGRESS)))) {
        char d[64];
        snprintf(d, sizeof(d), "timeout after %" PRId64 " ms",
                 s->conf->redis_timeout_ms);
        return store_fail_class(s, errstr, errstr_size, what, d, "timeout");
    }
    char d[256];
    snprintf(d, sizeof(d), "%s", e);
    return store_fail_class(s, errstr, errstr_size, what, d, "connection");
}

/* Runs one command; returns the reply (caller frees) or NULL with errstr. */
static redisReply *store_command(idem_store_t *s, char *errstr,
                                 size_t errstr_size, int argc,
                                 const char **argv, const size_t *argvlen)
{
    redisReply *r = redisCommandArgv(s->c, argc, argv, argvlen);
    if (!r) {
        store_io_fail(s, errstr, errstr_size, argv[0]);
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

/* The eviction guard on server nd (its INFO's maxmemory_policy): an
 * evicting policy refuses the server (s->refused and errstr name it and
 * the node, -1) unless redis.allow.eviction=true, which warns once per
 * policy seen. *unsafe: whether the policy evicts. */
static int policy_judge(idem_store_t *s, store_node_t *nd, const char *policy,
                        int *unsafe, char *errstr, size_t errstr_size)
{
    *unsafe = s->guard && policy[0] && strcmp(policy, "noeviction");
    if (*unsafe && !s->conf->redis_allow_eviction) {
        snprintf(s->refused, sizeof(s->refused),
                 "redis%s%s: maxmemory-policy is %s: evicting keys drops "
                 "dedup marks and their records are applied twice. Fix: set "
                 "maxmemory-policy noeviction on the Redis server (redis.conf, "
                 "or CONFIG SET maxmemory-policy noeviction)%s, or set "
                 "redis.allow.eviction=true to accept double effects",
                 nd->addr[0] ? " " : "", nd->addr, policy,
                 nd->addr[0] ? " on every primary of the cluster" : "");
        snprintf(errstr, errstr_size, "%s", s->refused);
        return -1;
    }
    if (*unsafe && strcmp(policy, nd->policy))
        idem_log_kv(IDEM_LOG_WARN,
                    "redis may evict dedup marks (redis.allow.eviction=true): "
                    "records can be applied twice",
                    "maxmemory_policy", policy, nd->addr[0] ? "node" : NULL,
                    nd->addr, NULL);
    snprintf(nd->policy, sizeof(nd->policy), "%s", policy);
    return 0;
}

/* Reads INFO (it works where CONFIG is disabled): the server's run_id, and
 * its maxmemory-policy, which must be noeviction: an evicting policy drops
 * dedup marks (every volatile-* policy evicts exactly the marks, the only
 * keys with a TTL) and their records are then applied twice. Refuses such
 * a server (s->refused, -1) unless redis.allow.eviction=true. */
static int store_check_server(idem_store_t *s, char *errstr, size_t errstr_size)
{
    const char *argv[] = {"INFO"};
    redisReply *r = store_command(s, errstr, errstr_size, 1, argv, NULL);
    if (!r)
        return -1;
    if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS) {
        freeReplyObject(r);
        return store_fail(s, errstr, errstr_size, "INFO", "unexpected reply");
    }
    char policy[64];
    idem_aofgate_info_field(r->str, "run_id", s->run_id, sizeof(s->run_id));
    idem_aofgate_info_field(r->str, "maxmemory_policy", policy, sizeof(policy));
    idem_aofgate_info_parse(r->str, &s->single.aof);
    freeReplyObject(r);
    s->checked_ms = idem_now_ms();
    int unsafe = 0;
    if (policy_judge(s, &s->single, policy, &unsafe, errstr, errstr_size)) {
        idem_store_disconnect(s);
        return -1;
    }
    if (s->metrics)
        idem_metrics_redis_eviction_set(s->metrics, unsafe);
    return 0;
}

void idem_store_guard_eviction(idem_store_t *s)
{
    s->guard = 1;
}

void idem_store_guard_aof(idem_store_t *s)
{
    s->guard_aof = 1;
}

/* Why gate_pass failed on the connection (not the gate's own verdict). */
typedef struct {
    const char *what; /* the command */
    char detail[256]; /* an error reply's text */
    int io;           /* the context failed: c->errstr */
} gate_fail_t;

/* Sends one command on c; a reply that is no error, or NULL with *f. */
static redisReply *gate_command(redisContext *c, int argc, const char **argv,
                                gate_fail_t *f)
{
    f->what = argv[0];
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    if (!r) {
        f->io = 1;
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR && strcmp(argv[0], "BGREWRITEAOF")) {
        snprintf(f->detail, sizeof(f->detail), "%s", r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

/* Reads INFO persistence of node nd on c. 0, or -1 with *f. */
static int aof_info_read(redisContext *c, store_node_t *nd, gate_fail_t *f)
{
    const char *argv[] = {"INFO", "persistence"};
    redisReply *r = gate_command(c, 2, argv, f);
    if (!r)
        return -1;
    if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS) {
        freeReplyObject(r);
        snprintf(f->detail, sizeof(f->detail), "unexpected reply");
        return -1;
    }
    idem_aofgate_info_parse(r->str, &nd->aof);
    freeReplyObject(r);
    return 0;
}

/* Sends BGREWRITEAOF and gives its answer to nd's gate. Returns the gate's
 * verdict, -2 when the connection failed (*f), or -1 refused (errstr). */
static int aof_rewrite_ask(idem_store_t *s, redisContext *c, store_node_t *nd,
                           gate_fail_t *f, char *errstr, size_t errstr_size)
{
    const char *argv[] = {"BGREWRITEAOF"};
    redisReply *r = gate_command(c, 1, argv, f);
    if (!r)
        return -2;
    char said[256] = "";
    if (r->str)
        snprintf(said, sizeof(said), "%s", r->str);
    int is_error = r->type == REDIS_REPLY_ERROR;
    freeReplyObject(r);
    idem_aofgate_action_t a = idem_aofgate_reply(&nd->gate, said, is_error);
    if (a == IDEM_AOFGATE_REFUSED) {
        if (s->metrics)
            idem_metrics_redis_aof_rewrite_add(s->metrics, "refused");
        idem_log_kv(IDEM_LOG_ERROR,
                    "redis refused BGREWRITEAOF: no write before the AOF is "
                    "rewritten (a cut AOF may hold half a transaction that "
                    "Redis would replay twice). Fix: allow +bgrewriteaof "
                    "+info (ACL), or set redis.aof.rewrite=false to accept "
                    "that risk",
                    "run_id", nd->run_id, "error", said,
                    nd->addr[0] ? "node" : NULL, nd->addr, NULL);
        snprintf(errstr, errstr_size,
                 "redis%s%s: BGREWRITEAOF refused (%s): writes wait for an "
                 "AOF rewrite (redis.aof.rewrite)",
                 nd->addr[0] ? " " : "", nd->addr, said);
        return -1;
    }
    return (int)a;
}

/* How long one call may wait for a rewrite to end before it reports the
 * wait as an outage (the loop backs off and asks again). */
#define AOF_WAIT_STEP_MS 20
#define AOF_WAIT_CALL_MS 500

/* Whether the member may write to server nd on c: with redis.aof.rewrite
 * (run), only once an AOF rewrite that began after the server's load has
 * ended ok (aofgate.h). Asks for the rewrite and waits up to
 * AOF_WAIT_CALL_MS for it. Returns 0; -1 with errstr (retriable: class
 * "aofrewrite", counted; the connection is fine); or -2 when the
 * connection failed or refused INFO (*f; the caller reports it). */
static int gate_pass(idem_store_t *s, redisContext *c, store_node_t *nd,
                     gate_fail_t *f, char *errstr, size_t errstr_size)
{
    const char *node = nd->addr[0] ? "node" : NULL;
    if (!s->guard_aof) {
        if (s->guard && nd->aof.aof_enabled &&
            strcmp(nd->aof_said, nd->run_id)) {
            snprintf(nd->aof_said, sizeof(nd->aof_said), "%s", nd->run_id);
            idem_log_kv(IDEM_LOG_WARN,
                        "redis.aof.rewrite=false: writing to a new redis "
                        "server with AOF on without rewriting its AOF first "
                        "(a cut AOF may hold half a transaction that Redis "
                        "7.0 replays twice at a later load)",
                        "run_id", nd->run_id, node, nd->addr, NULL);
        }
        return 0;
    }
    if (idem_aofgate_open(&nd->gate, nd->run_id))
        return 0;
    int64_t until = idem_now_ms() + AOF_WAIT_CALL_MS;
    int asked = 0; /* one BGREWRITEAOF per call: a rewrite that fails at
                      once is asked again after the loop's backoff */
    for (;;) {
        idem_aofgate_action_t a =
            idem_aofgate_step(&nd->gate, nd->run_id, &nd->aof);
        if (a == IDEM_AOFGATE_OPEN) {
            if (nd->gate.requested) {
                if (s->metrics)
                    idem_metrics_redis_aof_rewrite_add(s->metrics, "ok");
                idem_log_kv(IDEM_LOG_INFO,
                            "redis AOF rewritten: writing to this server",
                            "run_id", nd->run_id, node, nd->addr, NULL);
            }
            return 0;
        }
        if (a == IDEM_AOFGATE_REWRITE && asked)
            break;
        if (a == IDEM_AOFGATE_REWRITE) {
            asked = 1;
            /* asked again after a rewrite it started: that one failed */
            if (nd->gate.rewrites > 0 && s->metrics)
                idem_metrics_redis_aof_rewrite_add(s->metrics, "failed");
            if (strcmp(nd->aof_said, nd->run_id)) {
                snprintf(nd->aof_said, sizeof(nd->aof_said), "%s", nd->run_id);
                idem_log_kv(IDEM_LOG_WARN,
                            "new redis server with AOF on: rewriting its AOF "
                            "(BGREWRITEAOF) before the first write",
                            "run_id", nd->run_id, node, nd->addr, NULL);
            }
            int v = aof_rewrite_ask(s, c, nd, f, errstr, errstr_size);
            if (v == -2)
                return -2;
            if (v < 0) {
                if (s->metrics)
                    idem_metrics_redis_error_add(s->metrics, "aofrewrite", 1);
                return -1;
            }
        }
        if (idem_now_ms() >= until)
            break;
        idem_sleep_ms(AOF_WAIT_STEP_MS, NULL);
        if (aof_info_read(c, nd, f))
            return -2;
    }
    if (s->metrics)
        idem_metrics_redis_error_add(s->metrics, "aofrewrite", 1);
    snprintf(errstr, errstr_size,
             "redis%s%s: waiting for the AOF rewrite (BGREWRITEAOF) before "
             "the first write to this server (run_id %s)",
             nd->addr[0] ? " " : "", nd->addr, nd->run_id);
    return -1;
}

/* The single Redis's gate: gate_pass on the store's connection, whose
 * failure is the store's (counted, the connection dropped). */
static int store_writable(idem_store_t *s, char *errstr, size_t errstr_size)
{
    store_node_t *nd = &s->single;
    snprintf(nd->run_id, sizeof(nd->run_id), "%s", s->run_id);
    gate_fail_t f = {0};
    int rc = gate_pass(s, s->c, nd, &f, errstr, errstr_size);
    if (rc != -2)
        return rc;
    if (f.io)
        return store_io_fail(s, errstr, errstr_size, f.what);
    return store_fail(s, errstr, errstr_size, f.what, f.detail);
}

/* Cluster mode: the primary addr's record in s->nodes, added when new
 * (a node once met is kept: its gate remembers its server). */
static store_node_t *store_node(idem_store_t *s, const char *addr)
{
    for (size_t i = 0; i < s->nnodes; i++)
        if (!strcmp(s->nodes[i].addr, addr))
            return &s->nodes[i];
    s->nodes = idem_xrealloc(s->nodes, (s->nnodes + 1) * sizeof(*s->nodes));
    store_node_t *nd = &s->nodes[s->nnodes++];
    memset(nd, 0, sizeof(*nd));
    idem_aofgate_init(&nd->gate);
    snprintf(nd->addr, sizeof(nd->addr), "%s", addr);
    return nd;
}

/* A primary's INFO on c into nd (run_id, persistence) and its
 * maxmemory-policy judged. 0; or -1 with why (s->refused set when the
 * policy is refused, else the command failed). */
static int node_info(idem_store_t *s, redisContext *c, store_node_t *nd,
                     int *unsafe, char *why, size_t why_size)
{
    const char *argv[] = {"INFO"};
    gate_fail_t f = {0};
    redisReply *r = gate_command(c, 1, argv, &f);
    if (!r) {
        snprintf(why, why_size, "redis cluster: %s: INFO: %s", nd->addr,
                 f.io ? c->errstr : f.detail);
        return -1;
    }
    if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS) {
        freeReplyObject(r);
        snprintf(why, why_size, "redis cluster: %s: INFO: unexpected reply",
                 nd->addr);
        return -1;
    }
    char policy[64];
    idem_aofgate_info_field(r->str, "run_id", nd->run_id, sizeof(nd->run_id));
    idem_aofgate_info_field(r->str, "maxmemory_policy", policy, sizeof(policy));
    idem_aofgate_info_parse(r->str, &nd->aof);
    freeReplyObject(r);
    return policy_judge(s, nd, policy, unsafe, why, why_size);
}

/* idem_cluster_check_fn of a member's store: every new connection to a
 * primary passes the eviction guard and, for a writer, that node's AOF
 * gate (the rewrite before the first write to a server it has not
 * written to: a restarted node, a promoted replica) before any command of
 * the member goes there. */
static int store_node_check(void *opaque, const char *addr, redisContext *c,
                            char *why, size_t why_size)
{
    idem_store_t *s = opaque;
    if (!s->guard && !s->guard_aof)
        return 0;
    store_node_t *nd = store_node(s, addr);
    int unsafe = 0;
    if (node_info(s, c, nd, &unsafe, why, why_size))
        return -1;
    if (s->replica_ok)
        return 0; /* a reader: it writes nothing */
    gate_fail_t f = {0};
    int rc = gate_pass(s, c, nd, &f, why, why_size);
    if (rc == -2)
        snprintf(why, why_size, "redis cluster: %s: %s: %s", addr, f.what,
                 f.io ? c->errstr : f.detail);
    return rc ? -1 : 0;
}

/* Cluster mode's idem_store_check: the eviction guard on every primary
 * of the map (an operator may change a node's policy while we run). 0,
 * or -1 with errstr (refused: s->refused names the node; or an outage). */
static int cluster_check_all(idem_store_t *s, char *errstr, size_t errstr_size)
{
    s->checked_ms = idem_now_ms();
    int any_unsafe = 0;
    for (size_t k = 0;; k++) {
        const char *addr = NULL;
        idem_cluster_err_t e;
        redisContext *c = idem_cluster_primary_context(s->cl, k, &addr, &e);
        if (!c) {
            if (e.cls == IDEM_CLUSTER_ERR_NONE)
                break;
            store_cluster_export(s, 1);
            store_cluster_fail(s, &e, errstr, errstr_size);
            return -1;
        }
        int unsafe = 0;
        if (node_info(s, c, store_node(s, addr), &unsafe, errstr,
                      errstr_size)) {
            if (!s->refused[0])
                idem_cluster_failed(s->cl, -1, NULL);
            return -1;
        }
        any_unsafe |= unsafe;
    }
    if (s->metrics)
        idem_metrics_redis_eviction_set(s->metrics, any_unsafe);
    return 0;
}

redisContext *idem_store_ctx(idem_store_t *s, int write, char *errstr,
                             size_t errstr_size)
{
    if (s->pending_chunks) {
        snprintf(errstr, errstr_size, "redis: a request is still in flight");
        return NULL;
    }
    if (idem_store_connect(s, errstr, errstr_size) ||
        (write && !s->cl && store_writable(s, errstr, errstr_size)))
        return NULL;
    return s->c;
}

redisContext *idem_store_ctx_key(idem_store_t *s, int write, const char *key,
                                 size_t len, char *errstr, size_t errstr_size)
{
    redisContext *c = idem_store_ctx(s, write, errstr, errstr_size);
    if (!c || !s->cl || !key)
        return c;
    return store_route_key(s, key, len, errstr, errstr_size) ? NULL : s->c;
}

int idem_store_ctx_call(idem_store_t *s, const char *key, size_t len,
                        const char *cmd, size_t cmd_len, int ask_waits,
                        redisReply **reply, char *errstr, size_t errstr_size)
{
    *reply = NULL;
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    if (!s->cl) {
        if (redisAppendFormattedCommand(s->c, cmd, cmd_len) != REDIS_OK ||
            redisGetReply(s->c, (void **)reply) != REDIS_OK || !*reply)
            return store_io_fail(s, errstr, errstr_size, "command");
        return 0;
    }
    idem_cluster_cmd_t one = {
        .formatted = cmd, .formatted_len = cmd_len, .ask_waits = ask_waits};
    idem_cluster_err_t e;
    int failed = idem_cluster_pipeline(s->cl, key, len, &one, 1, reply, &e);
    store_cluster_export(s, failed);
    if (failed) {
        store_cluster_fail(s, &e, errstr, errstr_size);
        s->c = NULL;
        return -1;
    }
    s->c = NULL; /* the client may have moved connections: routed again */
    return 0;
}

int idem_store_ctx_calls(idem_store_t *s, const char *const *keys,
                         const size_t *lens, const char *const *cmds,
                         const size_t *cmd_lens, size_t n, int ask_waits,
                         redisReply **replies, char *errstr, size_t errstr_size)
{
    for (size_t i = 0; i < n; i++)
        replies[i] = NULL;
    if (!n)
        return 0;
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    if (!s->cl) {
        for (size_t i = 0; i < n; i++)
            if (redisAppendFormattedCommand(s->c, cmds[i], cmd_lens[i]) !=
                REDIS_OK)
                return store_io_fail(s, errstr, errstr_size, "command");
        for (size_t i = 0; i < n; i++)
            if (redisGetReply(s->c, (void **)&replies[i]) != REDIS_OK ||
                !replies[i]) {
                replies[i] = NULL;
                return store_io_fail(s, errstr, errstr_size, "command");
            }
        return 0;
    }
    idem_cluster_cmd_t *cc = idem_xcalloc(n, sizeof(*cc));
    int *slots = idem_xmalloc(n * sizeof(*slots));
    idem_cluster_err_t *errs = idem_xmalloc(n * sizeof(*errs));
    for (size_t i = 0; i < n; i++) {
        cc[i] = (idem_cluster_cmd_t){.formatted = cmds[i],
                                     .formatted_len = cmd_lens[i],
                                     .ask_waits = ask_waits};
        slots[i] = idem_cluster_keyslot(keys[i], lens[i]);
    }
    idem_cluster_err_t first;
    int failed =
        idem_cluster_pipeline_slots(s->cl, cc, slots, n, replies, errs, &first);
    store_cluster_export(s, failed);
    if (failed)
        store_cluster_fail(s, &first, errstr, errstr_size);
    s->c = NULL; /* the client may have moved connections: routed again */
    free(cc);
    free(slots);
    free(errs);
    return failed ? -1 : 0;
}

const char *idem_store_key_node(idem_store_t *s, const char *key, size_t len)
{
    if (!s->cl)
        return NULL;
    return idem_cluster_slot_node(s->cl, idem_cluster_keyslot(key, len));
}

/* A cluster outage: its text for the caller, its class counted. */
static void store_cluster_fail(idem_store_t *s, const idem_cluster_err_t *e,
                               char *errstr, size_t errstr_size)
{
    const char *said = strstr(e->str, "CLUSTERDOWN");
    if (e->cls == IDEM_CLUSTER_ERR_CLUSTERDOWN && e->node[0] && said)
        clusterdown_text(errstr, errstr_size, e->node, said);
    else
        snprintf(errstr, errstr_size, "%s", e->str);
    if (s->metrics)
        idem_metrics_redis_error_add(
            s->metrics,
            e->cls == IDEM_CLUSTER_ERR_TIMEOUT       ? "timeout"
            : e->cls == IDEM_CLUSTER_ERR_CLUSTERDOWN ? "clusterdown"
                                                     : "connection",
            1);
}

int idem_store_ctx_fail(idem_store_t *s, const char *what, const char *detail,
                        char *errstr, size_t errstr_size)
{
    if (!detail)
        return store_io_fail(s, errstr, errstr_size, what);
    return store_fail(s, errstr, errstr_size, what, detail);
}

int idem_store_ctx_wait(idem_store_t *s, const char *key, size_t len,
                        char *errstr, size_t errstr_size)
{
    if (s->conf->redis_wait_replicas <= 0)
        return 0;
    uint64_t connects = idem_store_connections(s);
    redisContext *c = idem_store_ctx_key(s, 0, key, len, errstr, errstr_size);
    if (!c)
        return -1;
    /* In cluster mode each detail names the node: "host:port: ". */
    char node[300] = "";
    const char *addr = s->cl ? idem_cluster_slot_node(s->cl, s->slot) : NULL;
    if (addr)
        snprintf(node, sizeof(node), "%s: ", addr);
    char d[512] = "";
    if (idem_store_connections(s) != connects) {
        /* A new connection's WAIT would count none of the writes. */
        snprintf(d, sizeof(d), "%sthe connection was replaced after the writes",
                 node);
        return store_fail_class(s, errstr, errstr_size, "WAIT", d, "wait");
    }
    const char *argv[] = {"WAIT", s->wait_replicas, s->wait_timeout};
    redisReply *r = redisCommandArgv(c, 3, argv, NULL);
    if (!r)
        return store_io_fail(s, errstr, errstr_size, "WAIT");
    const char *cls = "wait";
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(d, sizeof(d), "%s%s", node, r->str);
        cls = reply_class(r->str);
    } else if (r->type != REDIS_REPLY_INTEGER) {
        snprintf(d, sizeof(d), "%sunexpected reply", node);
    } else if (r->integer < s->conf->redis_wait_replicas) {
        snprintf(d, sizeof(d),
                 "%s%lld of %" PRId64 " replicas acknowledged within "
                 "%" PRId64 " ms (redis.wait.replicas)",
                 node, r->integer, s->conf->redis_wait_replicas,
                 s->conf->redis_wait_timeout_ms);
    }
    freeReplyObject(r);
    if (!d[0])
        return 0;
    return store_fail_class(s, errstr, errstr_size, "WAIT", d, cls);
}

int idem_store_refused(const idem_store_t *s, char *errstr, size_t errstr_size)
{
    if (!s->refused[0])
        return 0;
    snprintf(errstr, errstr_size, "%s", s->refused);
    return 1;
}

int idem_store_check(idem_store_t *s, int64_t interval_ms, char *errstr,
                     size_t errstr_size)
{
    if (s->cl && s->guard && !s->pending_chunks &&
        idem_now_ms() - s->checked_ms >= interval_ms)
        return cluster_check_all(s, errstr, errstr_size);
    if (!s->c || s->pending_chunks ||
        idem_now_ms() - s->checked_ms < interval_ms)
        return 0;
    return store_check_server(s, errstr, errstr_size);
}

void idem_store_allow_replica(idem_store_t *s)
{
    s->replica_ok = 1;
}

uint64_t idem_store_connections(const idem_store_t *s)
{
    /* Cluster mode: any new connection may be to a server that lost
     * writes (a promoted replica), so each one counts. */
    return s->cl ? idem_cluster_connects(s->cl) + s->gpos_losses
                 : s->connections;
}

const char *idem_store_run_id(const idem_store_t *s)
{
    return s->run_id;
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
    for (size_t i = 0; i < s->user_cnt; i++) {
        const char *argv[] = {"SCRIPT", "LOAD", s->user[i].src};
        size_t argvlen[] = {6, 4, s->user[i].len};
        redisReply *r = store_command(s, errstr, errstr_size, 3, argv, argvlen);
        if (!r)
            return -1;
        if (r->type != REDIS_REPLY_STRING || r->len != 40) {
            freeReplyObject(r);
            return store_fail(s, errstr, errstr_size, "SCRIPT LOAD",
                              "unexpected reply (handler script)");
        }
        memcpy(s->user[i].sha, r->str, 41);
        freeReplyObject(r);
    }
    return 0;
}

/* What every new connection does once it is authenticated: load the
 * scripts and check the server. */
static int store_after_connect(idem_store_t *s, char *errstr,
                               size_t errstr_size)
{
    if (store_load_scripts(s, errstr, errstr_size) ||
        store_check_server(s, errstr, errstr_size))
        return -1;
    s->connections++;
    return 0;
}

/* Cluster mode: copies the client's counters per node into the metrics
 * (at most every 200 ms; always when `now`, after an outage). */
static void store_cluster_export(idem_store_t *s, int now)
{
    int64_t t = idem_now_ms();
    if (!s->metrics || !s->cl || (!now && t - s->cluster_exported_ms < 200))
        return;
    s->cluster_exported_ms = t;
    size_t n = idem_cluster_node_count(s->cl);
    idem_metrics_cluster_node_t *v = idem_xcalloc(n ? n : 1, sizeof(*v));
    for (size_t i = 0; i < n; i++) {
        idem_cluster_node_stats_t st;
        v[i].node = idem_cluster_node_stats(s->cl, i, &st);
        v[i].requests = st.requests;
        v[i].moved = st.moved;
        v[i].ask = st.ask;
        v[i].tryagain = st.tryagain;
        v[i].clusterdown = st.clusterdown;
        v[i].conn_errors = st.conn_errors;
        v[i].timeouts = st.timeouts;
    }
    idem_metrics_cluster_set(s->metrics, v, n, idem_cluster_refreshes(s->cl));
    free(v);
}

/* Cluster mode: points s->c at the primary of `slot` (reading the slot
 * map first when it is stale). 0, or -1 with errstr (an outage naming the
 * node, counted by its class). */
static int store_route(idem_store_t *s, int slot, char *errstr,
                       size_t errstr_size)
{
    idem_cluster_err_t e;
    s->c = idem_cluster_context(s->cl, slot, &e);
    s->slot = s->c ? slot : -1;
    store_cluster_export(s, !s->c);
    if (s->c)
        return 0;
    store_cluster_fail(s, &e, errstr, errstr_size);
    return -1;
}

static int store_route_key(idem_store_t *s, const char *key, size_t len,
                           char *errstr, size_t errstr_size)
{
    return store_route(s, idem_cluster_keyslot(key, len), errstr, errstr_size);
}

/* Cluster mode's connect: the client (slot map from the seeds), then the
 * home node (the layout key's slot) as s->c; when the client opened a
 * connection since the last time (a new node, a promoted replica), the
 * home node's INFO (run_id, maxmemory-policy) and the layout key, fixed
 * to partition: a cluster is a new deployment, and the chunk script does
 * not read that key (it lives in another slot). */
static int store_cluster_connect(idem_store_t *s, char *errstr,
                                 size_t errstr_size)
{
    if (!s->cl) {
        idem_cluster_err_t e;
        s->cl = idem_cluster_new(s->conf, s->conf->redis_cluster_nodes, &e);
        if (!s->cl) {
            snprintf(errstr, errstr_size, "%s", e.str);
            if (s->metrics)
                idem_metrics_redis_error_add(s->metrics, "connection", 1);
            return -1;
        }
        idem_cluster_set_check(s->cl, store_node_check, s);
    }
    if (store_route(s, s->home_slot, errstr, errstr_size))
        return -1;
    if (s->home_connects == idem_cluster_connects(s->cl))
        return 0;
    if (store_load_scripts(s, errstr, errstr_size) ||
        store_check_server(s, errstr, errstr_size))
        return -1;
    if (!s->replica_ok) {
        const char *argv[] = {"HSET",      s->layout_key, "layout",
                              "partition", "from",        "partition"};
        redisReply *r = store_command(s, errstr, errstr_size, 6, argv, NULL);
        if (!r)
            return -1;
        freeReplyObject(r);
        const char *nargv[] = {"HSETNX", s->layout_key, "since", "0"};
        if (!(r = store_command(s, errstr, errstr_size, 4, nargv, NULL)))
            return -1;
        freeReplyObject(r);
    }
    if (store_route(s, s->home_slot, errstr, errstr_size))
        return -1;
    s->home_connects = idem_cluster_connects(s->cl);
    return 0;
}

int idem_store_connect(idem_store_t *s, char *errstr, size_t errstr_size)
{
    if (idem_store_cluster(s))
        return store_cluster_connect(s, errstr, errstr_size);
    if (s->c)
        return 0;
    idem_redisconn_err_t err;
    s->conn = idem_redisconn_open_err(s->conf, s->replica_ok, &err);
    if (!s->conn) {
        snprintf(errstr, errstr_size, "%s", err.str);
        if (s->metrics)
            idem_metrics_redis_error_add(s->metrics, connect_class(&err), 1);
        return -1;
    }
    s->c = idem_redisconn_context(s->conn);
    return store_after_connect(s, errstr, errstr_size);
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
    /* Only what a reader looks at is cleared: the result is ~800 bytes,
     * and this runs for every record. */
    res->prior_mid[0] = '\0';
    res->prior_mid_len = 0;
    res->detail[0] = '\0';
    if (len == 0) {
        res->mark = IDEM_MARK_NEW;
    } else if (len >= 5 && !memcmp(str, "done:", 5)) {
        res->mark = IDEM_MARK_DONE;
        size_t l =
            len - 5 < IDEM_ENVELOPE_ID_MAX ? len - 5 : IDEM_ENVELOPE_ID_MAX;
        memcpy(res->prior_mid, str + 5, l);
        res->prior_mid[l] = '\0';
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

/* Fills the per-record arguments of record `env` for the claim and mark
 * scripts (identity, message_id) at argv; returns their number. */
static size_t record_args(const idem_envelope_t *env, const char **argv,
                          size_t *argvlen)
{
    argv[0] = env->identity;
    argvlen[0] = env->identity_len; /* byte strings: NULs are data */
    argv[1] = env->message_id;
    argvlen[1] = env->message_id_len;
    return 2;
}

/* Room for `more` bytes after the request's bytes. */
static void req_reserve(idem_store_t *s, size_t more)
{
    if (s->req_len + more <= s->req_cap)
        return;
    size_t cap = s->req_cap ? s->req_cap : 65536;
    while (cap < s->req_len + more)
        cap *= 2;
    s->req = idem_xrealloc(s->req, cap);
    s->req_cap = cap;
}

/* Appends one command, argv[argc] with their lengths, to the request in
 * RESP, byte for byte what redisFormatCommandArgv writes: formatted here
 * into one buffer that is reused, instead of one sds grown argument by
 * argument with a format string (the request of a 1000-record chunk has
 * 5000 arguments). */
static void req_command(idem_store_t *s, size_t argc, const char *const *argv,
                        const size_t *argvlen)
{
    size_t need = 3 + 20 + 2;
    for (size_t i = 0; i < argc; i++)
        need += 1 + 20 + 2 + argvlen[i] + 2;
    req_reserve(s, need);
    char *p = s->req + s->req_len;
    *p++ = '*';
    p = idem_put_u64(p, argc);
    *p++ = '\r';
    *p++ = '\n';
    for (size_t i = 0; i < argc; i++) {
        *p++ = '$';
        p = idem_put_u64(p, argvlen[i]);
        *p++ = '\r';
        *p++ = '\n';
        memcpy(p, argv[i], argvlen[i]);
        p += argvlen[i];
        *p++ = '\r';
        *p++ = '\n';
    }
    s->req_len = (size_t)(p - s->req);
}

/* Appends every chunk of the records as an EVALSHA call and writes them
 * all out (one pipeline, one round trip); the replies are read by
 * store_recv. Returns 0, or -1 (the connection is dropped). */
/* Fills the scratch fields of pos[n] ("<topic>:<partition>") and, with
 * values (a save), their values as text (posval.h); a load reads only the
 * fields (its values are what it fills in). */
static void pos_text(idem_store_t *s, const idem_store_pos_t *pos, size_t n,
                     int values)
{
    if (s->fields_cap < n) {
        s->fields = idem_xrealloc(s->fields, n * sizeof(*s->fields));
        s->offs = idem_xrealloc(s->offs, n * sizeof(*s->offs));
        s->fields_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(s->fields[i], sizeof(s->fields[i]), "%s:%" PRId32,
                 pos[i].topic, pos[i].partition);
        if (values && !idem_posval_format(s->offs[i], sizeof(s->offs[i]),
                                          pos[i].offset, &pos[i].val))
            snprintf(s->offs[i], sizeof(s->offs[i]), "%" PRId64, pos[i].offset);
    }
}

/* Appends HSET <prefix>pos:<group> <topic>:<partition> <offset>... */
static void append_positions(idem_store_t *s, const idem_store_pos_t *pos,
                             size_t n)
{
    pos_text(s, pos, n, 1);
    argv_reserve(s, 2 + 2 * n);
    size_t a = 0;
    s->argv[a++] = "HSET";
    s->argv[a++] = s->pos_key;
    for (size_t i = 0; i < n; i++) {
        s->argv[a++] = s->fields[i];
        s->argv[a++] = s->offs[i];
    }
    for (size_t i = 0; i < a; i++)
        s->argvlen[i] = strlen(s->argv[i]);
    req_command(s, a, s->argv, s->argvlen);
}

/* Reads WAIT's reply: 0 when redis.wait.replicas acknowledged in time,
 * else -1 with a "wait" class error (the connection is dropped). */
static int read_wait_reply(idem_store_t *s, char *errstr, size_t errstr_size)
{
    redisReply *r = NULL;
    if (redisGetReply(s->c, (void **)&r) != REDIS_OK || !r)
        return store_io_fail(s, errstr, errstr_size, "WAIT");
    char d[160] = "";
    if (r->type == REDIS_REPLY_ERROR)
        snprintf(d, sizeof(d), "%s", r->str);
    else if (r->type != REDIS_REPLY_INTEGER)
        snprintf(d, sizeof(d), "unexpected reply");
    else if (r->integer < s->conf->redis_wait_replicas)
        snprintf(d, sizeof(d),
                 "%lld of %" PRId64 " replicas acknowledged within %" PRId64
                 " ms (redis.wait.replicas)",
                 r->integer, s->conf->redis_wait_replicas,
                 s->conf->redis_wait_timeout_ms);
    int is_error = r->type == REDIS_REPLY_ERROR;
    freeReplyObject(r);
    if (!d[0])
        return 0;
    return is_error
               ? store_fail(s, errstr, errstr_size, "WAIT", d)
               : store_fail_class(s, errstr, errstr_size, "WAIT", d, "wait");
}

/* script: a script_t, or SCRIPT_CNT + i for user script i (its records
 * in recs, env unused). */
static int store_send(idem_store_t *s, int script, const char *arg3,
                      const char *owner, const idem_envelope_t *const *env,
                      const void *const *recs, size_t n,
                      const idem_store_pos_t *pos, size_t npos, char *errstr,
                      size_t errstr_size)
{
    const user_script_t *u =
        script >= SCRIPT_CNT ? &s->user[script - SCRIPT_CNT] : NULL;
    size_t per = u ? u->per_record : 2;
    /* The effect's global framing also gets the layout the member runs
     * (redis/dedup_global.lua; redis/layout.h). */
    int layout = s->effect && script == s->effect_script;
    size_t fixed = 3 /* EVALSHA sha numkeys */ + 3 + (owner ? 1 : 0) + layout;
    if (s->pending_chunks) {
        snprintf(errstr, errstr_size, "redis: a request is still in flight");
        return -1;
    }
    if (idem_store_connect(s, errstr, errstr_size) ||
        store_writable(s, errstr, errstr_size))
        return -1;
    s->sent_at_us = idem_now_us();
    s->req_len = 0;
    size_t chunks = 0;
    for (size_t off = 0; off < n; off += CHUNK_RECORDS, chunks++) {
        size_t cnt = n - off < CHUNK_RECORDS ? n - off : CHUNK_RECORDS;
        argv_reserve(s, fixed + cnt * per);
        size_t a = 0;
        s->argv[a++] = "EVALSHA";
        s->argv[a++] = u ? u->sha : s->sha[script];
        s->argv[a++] = "0";
        s->argv[a++] = s->conf->redis_prefix;
        s->argv[a++] = s->conf->group_id;
        s->argv[a++] = arg3;
        if (owner)
            s->argv[a++] = owner;
        if (layout)
            s->argv[a++] = s->effect_layout;
        for (size_t i = 0; i < a; i++)
            s->argvlen[i] = strlen(s->argv[i]);
        for (size_t i = 0; i < cnt; i++)
            a += u ? u->args(recs[off + i], s->argv + a, s->argvlen + a,
                             u->opaque)
                   : record_args(env[off + i], s->argv + a, s->argvlen + a);
        req_command(s, a, s->argv, s->argvlen);
    }
    /* Positions go after the scripts of this request, but they only cover
     * records whose replies were read before it was sent. */
    if (npos)
        append_positions(s, pos, npos);
    int wait = script != SCRIPT_CLAIM && s->conf->redis_wait_replicas > 0;
    if (wait) {
        const char *wargv[] = {"WAIT", s->wait_replicas, s->wait_timeout};
        const size_t wlen[] = {4, strlen(s->wait_replicas),
                               strlen(s->wait_timeout)};
        req_command(s, 3, wargv, wlen);
    }
    /* hiredis gets the whole request at once (one copy into its output
     * buffer). */
    if (redisAppendFormattedCommand(s->c, s->req, s->req_len) != REDIS_OK)
        return store_io_fail(s, errstr, errstr_size, "EVALSHA");
    int done = 0;
    while (!done)
        if (redisBufferWrite(s->c, &done) != REDIS_OK)
            return store_io_fail(s, errstr, errstr_size, "EVALSHA");
    s->pending_chunks = chunks;
    s->pending_n = n;
    s->pending_hset = npos > 0;
    s->pending_wait = wait;
    return 0;
}

/* A script's reply read straight into results: while store_recv reads a
 * chunk's reply, the reader's object functions are these, so no
 * redisReply is allocated (nor freed) per record. The reader hands every
 * task the reader's privdata: this chunk's state. */
typedef struct {
    idem_store_result_t *res; /* the chunk's results */
    size_t cnt;               /* its records */
    int type;                 /* the reply's type; 0 before it came */
    long long elements;       /* an array reply's size */
    char err[256];            /* an error reply's text */
} chunk_read_t;

static char chunk_obj; /* what the functions return: any non-NULL */

/* The reply itself (no parent), or one of its elements: an element goes
 * into its record's result, as result_from_string reads it; one that is
 * not a string (a nil, an integer, an array) reads as "". */
static void *chunk_value(const redisReadTask *t, const char *str, size_t len)
{
    chunk_read_t *c = t->privdata;
    if (!t->parent) {
        c->type = t->type;
        if (t->type == REDIS_REPLY_ERROR)
            snprintf(c->err, sizeof(c->err), "%.*s", (int)len, str);
    } else if (!t->parent->parent && c->type == REDIS_REPLY_ARRAY &&
               c->elements == (long long)c->cnt && t->idx >= 0 &&
               (size_t)t->idx < c->cnt) {
        result_from_string(&c->res[t->idx], str, len);
    }
    return &chunk_obj;
}

static void *chunk_string(const redisReadTask *t, char *str, size_t len)
{
    return chunk_value(t, str, len);
}

static void *chunk_array(const redisReadTask *t, int elements)
{
    if (!t->parent)
        ((chunk_read_t *)t->privdata)->elements = elements;
    return chunk_value(t, "", 0);
}

static void *chunk_integer(const redisReadTask *t, long long v)
{
    (void)v;
    return chunk_value(t, "", 0);
}

static void *chunk_nil(const redisReadTask *t)
{
    return chunk_value(t, "", 0);
}

static void chunk_free(void *obj)
{
    (void)obj; /* nothing was allocated */
}

static redisReplyObjectFunctions chunk_fns = {
    chunk_string, chunk_array, chunk_integer, chunk_nil, chunk_free,
};

/* Reads one chunk's reply into c (c->res, c->cnt set). Returns 0, or -1
 * when the connection failed (its error is in s->c). */
static int chunk_read(idem_store_t *s, chunk_read_t *c)
{
    redisReader *rd = s->c->reader;
    redisReplyObjectFunctions *fn = rd->fn;
    void *priv = rd->privdata;
    rd->fn = &chunk_fns;
    rd->privdata = c;
    void *r = NULL;
    int rc = redisGetReply(s->c, &r);
    rd->fn = fn;
    rd->privdata = priv;
    return rc == REDIS_OK && r ? 0 : -1;
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
        size_t cnt = n - off < CHUNK_RECORDS ? n - off : CHUNK_RECORDS;
        chunk_read_t c = {.res = results + off, .cnt = cnt};
        if (chunk_read(s, &c))
            return store_io_fail(s, errstr, errstr_size, "EVALSHA");
        if (c.type == REDIS_REPLY_ERROR) {
            if (!strncmp(c.err, "NOSCRIPT", 8))
                noscript = 1;
            else if (!err[0])
                snprintf(err, sizeof(err), "%s", c.err);
        } else if (c.type != REDIS_REPLY_ARRAY ||
                   c.elements != (long long)cnt) {
            snprintf(err, sizeof(err), "unexpected reply to script");
        }
    }
    if (s->pending_hset) {
        redisReply *r = NULL;
        if (redisGetReply(s->c, (void **)&r) != REDIS_OK || !r)
            return store_io_fail(s, errstr, errstr_size, "HSET");
        if (r->type == REDIS_REPLY_ERROR && !err[0])
            snprintf(err, sizeof(err), "%s", r->str);
        freeReplyObject(r);
    }
    if (s->pending_wait && read_wait_reply(s, errstr, errstr_size))
        return -1;
    if (s->metrics)
        idem_metrics_redis_observe(
            s->metrics, (double)(idem_now_us() - s->sent_at_us) / 1e6);
    if (noscript) {
        idem_log(IDEM_LOG_WARN, "redis lost its scripts; reloading");
        if (store_load_scripts(s, errstr, errstr_size) == 0)
            snprintf(errstr, errstr_size,
                     "redis: scripts were flushed; reloaded, will retry");
        if (s->metrics)
            idem_metrics_redis_error_add(s->metrics, "noscript", 1);
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
    if (store_send(s, script, arg3, owner, env, NULL, n, NULL, 0, errstr,
                   errstr_size))
        return -1;
    return store_recv(s, n, results, errstr, errstr_size);
}

int idem_store_busy(const idem_store_t *s)
{
    return s->pending_chunks > 0 || s->gres_pending;
}

int idem_store_reply_fd(const idem_store_t *s)
{
    if (!s->c || !s->pending_chunks || s->c->fd < 0)
        return -1;
    const redisReader *r = s->c->reader;
    if (r && r->pos < r->len)
        return -1; /* a reply (part) is buffered already */
    return s->c->fd;
}

int idem_store_script_register(idem_store_t *s, const char *lua, size_t len,
                               size_t per_record, idem_store_args_fn args,
                               void *opaque, char *errstr, size_t errstr_size)
{
    if (s->user_cnt == USER_SCRIPTS_MAX) {
        snprintf(errstr, errstr_size, "redis: too many handler scripts");
        return -1;
    }
    if (s->c) {
        snprintf(errstr, errstr_size,
                 "redis: handler scripts are registered before connecting");
        return -1;
    }
    user_script_t *u = &s->user[s->user_cnt];
    u->src = idem_xmalloc(len + 1);
    memcpy(u->src, lua, len);
    u->src[len] = '\0';
    u->len = len;
    u->per_record = per_record;
    u->args = args;
    u->opaque = opaque;
    return SCRIPT_CNT + (int)s->user_cnt++;
}

/* redis/dedup_global.lua, as the build embeds it (Makefile: LUA_SRCS). */
extern const char idem_dedup_global_lua[];
extern const size_t idem_dedup_global_lua_len;

int idem_store_effect_register(idem_store_t *s, const char *effect, size_t len,
                               size_t per_record, idem_store_args_fn args,
                               void *opaque, char *errstr, size_t errstr_size)
{
    if (s->effect) {
        snprintf(errstr, errstr_size, "redis: an effect is registered already");
        return -1;
    }
    char head[48];
    int hl = snprintf(head, sizeof(head), "local PER = %zu\n", per_record);
    size_t total = (size_t)hl + len + 1 + idem_dedup_global_lua_len;
    char *src = idem_xmalloc(total + 1);
    memcpy(src, head, (size_t)hl);
    memcpy(src + hl, effect, len);
    src[hl + len] = '\n';
    memcpy(src + hl + len + 1, idem_dedup_global_lua,
           idem_dedup_global_lua_len);
    src[total] = '\0';
    int n = idem_store_script_register(s, src, total, per_record, args, opaque,
                                       errstr, errstr_size);
    free(src);
    if (n < 0)
        return -1;
    s->effect = idem_xmalloc(len + 1);
    memcpy(s->effect, effect, len);
    s->effect[len] = '\0';
    s->effect_per = per_record;
    s->effect_args = args;
    s->effect_opaque = opaque;
    s->effect_script = n;
    s->effect_layout = "global";
    return n;
}

void idem_store_effect_where(idem_store_t *s, idem_store_where_fn where)
{
    s->effect_where = where;
}

void idem_store_effect_layout(idem_store_t *s, const char *layout)
{
    s->effect_layout = layout;
}

const char *idem_store_effect(const idem_store_t *s, size_t *per_record,
                              idem_store_args_fn *args, void **opaque)
{
    if (per_record)
        *per_record = s->effect_per;
    if (args)
        *args = s->effect_args;
    if (opaque)
        *opaque = s->effect_opaque;
    return s->effect;
}

int idem_store_script_send(idem_store_t *s, int script, const void *const *recs,
                           size_t n, const idem_store_pos_t *pos, size_t npos,
                           char *errstr, size_t errstr_size)
{
    if (script < SCRIPT_CNT || script >= SCRIPT_CNT + (int)s->user_cnt) {
        snprintf(errstr, errstr_size, "redis: no handler script %d", script);
        return -1;
    }
    if (idem_store_cluster(s))
        return cluster_global(s, script, recs, n, pos, npos, errstr,
                              errstr_size);
    return store_send(s, script, s->ttl, NULL, NULL, recs, n, pos, npos, errstr,
                      errstr_size);
}

int idem_store_script_recv(idem_store_t *s, size_t n,
                           idem_store_result_t *results, char *errstr,
                           size_t errstr_size)
{
    if (idem_store_cluster(s)) {
        if (!s->gres_pending || n != s->gres_n) {
            snprintf(errstr, errstr_size, "redis: no request in flight for %zu",
                     n);
            return -1;
        }
        memcpy(results, s->gres, n * sizeof(*results));
        s->gres_pending = 0;
        return 0;
    }
    return store_recv(s, n, results, errstr, errstr_size);
}

void idem_store_pos_key(const idem_conf_t *conf, const char *topic,
                        int32_t partition, char *buf, size_t size)
{
    const char *g = conf->group_id ? conf->group_id : "";
    if (conf->redis_cluster_nodes && *conf->redis_cluster_nodes)
        snprintf(buf, size, "%spos{%s:%s:%" PRId32 "}", conf->redis_prefix, g,
                 topic, partition);
    else
        snprintf(buf, size, "%spos:%s", conf->redis_prefix, g);
}

int idem_store_gbucket(const char *identity, size_t len)
{
    return (int)(idem_cluster_crc16(identity, len) % IDEM_GBUCKETS);
}

void idem_store_gbucket_tag(const idem_conf_t *conf, int bucket, char *buf,
                            size_t size)
{
    snprintf(buf, size, "{%s::%02d}", conf->group_id ? conf->group_id : "",
             bucket);
}

int idem_store_gmark_key(const idem_conf_t *conf, const char *identity,
                         size_t len, char *buf, size_t size)
{
    char tag[300];
    idem_store_gbucket_tag(conf, idem_store_gbucket(identity, len), tag,
                           sizeof(tag));
    int hl = snprintf(buf, size, "%sdedup%s:", conf->redis_prefix, tag);
    if (hl < 0)
        return hl;
    /* The identity byte for byte: NULs are data. */
    if ((size_t)hl < size) {
        size_t room = size - (size_t)hl - 1;
        size_t cp = len < room ? len : room;
        memcpy(buf + hl, identity, cp);
        buf[(size_t)hl + cp] = '\0';
    }
    return hl + (int)len;
}

/* Cluster mode's positions: one hash per partition under its tag, one
 * command each on the partition's primary; save (HSET) or load (HGETALL:
 * the position and the global path's records of the buckets the partition
 * used, "<topic>:<partition>:g<NN>", judged by gpos_check). */
static int cluster_positions(idem_store_t *s, idem_store_pos_t *load,
                             const idem_store_pos_t *save, size_t n,
                             char *errstr, size_t errstr_size)
{
    pos_text(s, load ? load : save, n, save != NULL);
    char(*raw)[160] = load ? idem_xcalloc(n ? n : 1, sizeof(*raw)) : NULL;
    int64_t *records =
        load ? idem_xmalloc((n ? n : 1) * IDEM_GBUCKETS * sizeof(*records))
             : NULL;
    int any = 0, rc = -1;
    for (size_t i = 0; i < n; i++) {
        const idem_store_pos_t *p = load ? &load[i] : &save[i];
        char key[640];
        idem_store_pos_key(s->conf, p->topic, p->partition, key, sizeof(key));
        if (store_route_key(s, key, strlen(key), errstr, errstr_size))
            goto out;
        const char *argv[] = {save ? "HSET" : "HGETALL", key, s->fields[i],
                              s->offs[i]};
        redisReply *r =
            store_command(s, errstr, errstr_size, save ? 4 : 2, argv, NULL);
        if (!r)
            goto out;
        if (load) {
            load[i].offset = -1;
            idem_posval_init(&load[i].val, NULL);
            for (int b = 0; b < IDEM_GBUCKETS; b++)
                records[i * IDEM_GBUCKETS + b] = -1;
            size_t flen = strlen(s->fields[i]);
            for (size_t j = 0;
                 r->type == REDIS_REPLY_ARRAY && j + 1 < r->elements; j += 2) {
                const redisReply *f = r->element[j], *v = r->element[j + 1];
                if (f->type != REDIS_REPLY_STRING ||
                    v->type != REDIS_REPLY_STRING)
                    continue;
                int b =
                    idem_gpos_record_bucket(f->str, f->len, s->fields[i], flen);
                if (b >= 0) {
                    records[i * IDEM_GBUCKETS + b] = strtoll(v->str, NULL, 10);
                    any = 1;
                    continue;
                }
                if (f->len != flen || memcmp(f->str, s->fields[i], flen))
                    continue;
                snprintf(raw[i], sizeof(raw[i]), "%.*s", (int)v->len, v->str);
                if (idem_posval_parse(v->str, v->len, &load[i].offset,
                                      &load[i].val)) {
                    load[i].offset = -1;
                    idem_log_kv(IDEM_LOG_WARN,
                                "unreadable position in redis: not used", "key",
                                key, "value", v->str, NULL);
                }
            }
        }
        freeReplyObject(r);
    }
    rc = any ? gpos_check(s, load, raw, records, n, errstr, errstr_size) : 0;
out:
    free(raw);
    free(records);
    return rc;
}

int idem_store_positions_save(idem_store_t *s, const idem_store_pos_t *pos,
                              size_t n, char *errstr, size_t errstr_size)
{
    if (!n)
        return 0;
    if (s->cl && !s->pending_chunks)
        return idem_store_connect(s, errstr, errstr_size)
                   ? -1
                   : cluster_positions(s, NULL, pos, n, errstr, errstr_size);
    if (s->pending_chunks) {
        snprintf(errstr, errstr_size, "redis: a request is still in flight");
        return -1;
    }
    if (idem_store_connect(s, errstr, errstr_size) ||
        store_writable(s, errstr, errstr_size))
        return -1;
    s->req_len = 0;
    append_positions(s, pos, n);
    if (redisAppendFormattedCommand(s->c, s->req, s->req_len) != REDIS_OK)
        return store_io_fail(s, errstr, errstr_size, "HSET");
    redisReply *r = NULL;
    if (redisGetReply(s->c, (void **)&r) != REDIS_OK || !r)
        return store_io_fail(s, errstr, errstr_size, "HSET");
    if (r->type == REDIS_REPLY_ERROR) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", r->str);
        freeReplyObject(r);
        return store_fail(s, errstr, errstr_size, "HSET", msg);
    }
    freeReplyObject(r);
    return 0;
}

int idem_store_positions_load(idem_store_t *s, idem_store_pos_t *pos, size_t n,
                              char *errstr, size_t errstr_size)
{
    if (!n)
        return 0;
    if (s->pending_chunks) {
        snprintf(errstr, errstr_size, "redis: a request is still in flight");
        return -1;
    }
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    if (s->cl)
        return cluster_positions(s, pos, NULL, n, errstr, errstr_size);
    pos_text(s, pos, n, 0);
    argv_reserve(s, 2 + n);
    s->argv[0] = "HMGET";
    s->argv[1] = s->pos_key;
    for (size_t i = 0; i < n; i++)
        s->argv[2 + i] = s->fields[i];
    redisReply *r =
        store_command(s, errstr, errstr_size, (int)(2 + n), s->argv, NULL);
    if (!r)
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
        freeReplyObject(r);
        return store_fail(s, errstr, errstr_size, "HMGET", "unexpected reply");
    }
    for (size_t i = 0; i < n; i++) {
        redisReply *e = r->element[i];
        pos[i].offset = -1;
        idem_posval_init(&pos[i].val, NULL);
        if (e->type != REDIS_REPLY_STRING)
            continue;
        if (idem_posval_parse(e->str, e->len, &pos[i].offset, &pos[i].val)) {
            pos[i].offset = -1;
            idem_log_kv(IDEM_LOG_WARN, "unreadable position in redis: not used",
                        "field", s->fields[i], "value", e->str, NULL);
        }
    }
    freeReplyObject(r);
    return 0;
}

/* ---- cluster mode: the lease scripts routed by slot ------------------ */

/* One record of a cluster claim or mark: its mark key's slot and bytes. */
typedef struct {
    int slot;
    size_t i;   /* the record's index in the caller's arrays */
    size_t off; /* its key in the key buffer */
    size_t len;
} mark_ref_t;

static const char *mark_keys_buf; /* the key buffer, for mark_ref_cmp */

/* By slot, then key bytes (one identity's records stay in one call, so
 * the claim script sees them together), then the caller's order. */
static int mark_ref_cmp(const void *a, const void *b)
{
    const mark_ref_t *x = a, *y = b;
    if (x->slot != y->slot)
        return x->slot < y->slot ? -1 : 1;
    size_t l = x->len < y->len ? x->len : y->len;
    int c = memcmp(mark_keys_buf + x->off, mark_keys_buf + y->off, l);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* One call of a cluster claim or mark: refs[start, start + cnt) of one
 * slot, formatted at req[off, off + len). */
typedef struct {
    size_t start, cnt, off, len;
    int slot;
} mark_call_t;

/* Appends call k as EVALSHA (or EVAL with the script's source, after
 * NOSCRIPT: it loads the script on that node as it runs) to s->req, the
 * mark keys declared in KEYS. */
static void mark_call_format(idem_store_t *s, script_t script, int eval,
                             const char *arg3, const char *owner,
                             const idem_envelope_t *const *env,
                             const mark_ref_t *refs, const char *keys,
                             mark_call_t *k)
{
    char nk[24];
    snprintf(nk, sizeof(nk), "%zu", k->cnt);
    argv_reserve(s, 7 + 3 * k->cnt);
    size_t a = 0;
    s->argv[a++] = eval ? "EVAL" : "EVALSHA";
    s->argv[a++] = eval ? script_src[script] : s->sha[script];
    s->argv[a++] = nk;
    for (size_t a0 = 0; a0 < a; a0++)
        s->argvlen[a0] = strlen(s->argv[a0]);
    for (size_t j = 0; j < k->cnt; j++) {
        s->argv[a] = keys + refs[k->start + j].off;
        s->argvlen[a++] = refs[k->start + j].len;
    }
    const char *fixed[] = {s->conf->redis_prefix, s->conf->group_id, arg3,
                           owner};
    for (size_t f = 0; f < 4; f++) {
        s->argv[a] = fixed[f];
        s->argvlen[a++] = strlen(fixed[f]);
    }
    for (size_t j = 0; j < k->cnt; j++)
        a +=
            record_args(env[refs[k->start + j].i], s->argv + a, s->argvlen + a);
    k->off = s->req_len;
    req_command(s, a, s->argv, s->argvlen);
    k->len = s->req_len - k->off;
}

/* Cluster mode, after a mark: WAIT redis.wait.replicas on the connection
 * of every primary of the map (the nodes written in this call are among
 * them, an ASK's importing node too), each counted on its own. 0, or -1
 * with errstr (class "wait" when a node's replicas did not acknowledge in
 * time, naming the node). */
static int cluster_wait(idem_store_t *s, char *errstr, size_t errstr_size)
{
    for (size_t k = 0;; k++) {
        const char *addr = NULL;
        idem_cluster_err_t e;
        redisContext *c = idem_cluster_primary_context(s->cl, k, &addr, &e);
        if (!c) {
            if (e.cls == IDEM_CLUSTER_ERR_NONE)
                return 0;
            store_cluster_export(s, 1);
            store_cluster_fail(s, &e, errstr, errstr_size);
            return -1;
        }
        const char *argv[] = {"WAIT", s->wait_replicas, s->wait_timeout};
        redisReply *r = redisCommandArgv(c, 3, argv, NULL);
        char d[400] = "";
        const char *cls = "wait";
        if (!r) {
            snprintf(d, sizeof(d), "%s: %s", addr, c->errstr);
            cls = "connection";
        } else if (r->type == REDIS_REPLY_ERROR) {
            snprintf(d, sizeof(d), "%s: %s", addr, r->str);
            cls = reply_class(r->str);
        } else if (r->type != REDIS_REPLY_INTEGER) {
            snprintf(d, sizeof(d), "%s: unexpected reply", addr);
        } else if (r->integer < s->conf->redis_wait_replicas) {
            snprintf(d, sizeof(d),
                     "%s: %lld of %" PRId64 " replicas acknowledged within "
                     "%" PRId64 " ms (redis.wait.replicas)",
                     addr, r->integer, s->conf->redis_wait_replicas,
                     s->conf->redis_wait_timeout_ms);
        }
        if (r)
            freeReplyObject(r);
        if (!d[0])
            continue;
        snprintf(errstr, errstr_size, "redis cluster: WAIT: %s", d);
        if (s->metrics)
            idem_metrics_redis_error_add(s->metrics, cls, 1);
        idem_cluster_failed(s->cl, -1, !strcmp(cls, "connection") ? NULL : "");
        s->c = NULL;
        return -1;
    }
}

/* Cluster mode's claim and mark (docs/design.md, "Redis Cluster mode",
 * "External handlers"): each record's mark key <prefix>dedup:<group>:
 * <identity> stays where it is on a single Redis, on its own slot; the
 * records of one slot go as one script call with their keys declared,
 * the calls of one node pipelined, every node's pipeline written before
 * any reply is read (idem_cluster_pipeline_slots: MOVED, ASK with ASKING,
 * TRYAGAIN followed per call). A call that met an outage (a node down,
 * CLUSTERDOWN) fails the whole claim or mark, as a lost connection does
 * on a single Redis: what the other calls did is harmless to do again (a
 * lease of ours is claimed again, a done mark stays done). With
 * redis.wait.replicas a mark ends with cluster_wait. Same contract as
 * idem_store_claim / idem_store_mark_done. */
static int cluster_marks(idem_store_t *s, script_t script, const char *arg3,
                         const char *owner, const idem_envelope_t *const *env,
                         size_t n, idem_store_result_t *results, char *errstr,
                         size_t errstr_size)
{
    if (s->pending_chunks) {
        snprintf(errstr, errstr_size, "redis: a request is still in flight");
        return -1;
    }
    if (!n)
        return 0;
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    uint64_t connects = idem_cluster_connects(s->cl);
    int64_t t0 = idem_now_us();
    /* The keys, then their order by slot. */
    size_t plen = strlen(s->conf->redis_prefix),
           glen = strlen(s->conf->group_id), klen = 0;
    for (size_t i = 0; i < n; i++)
        klen += plen + 6 + glen + 1 + env[i]->identity_len;
    char *keys = idem_xmalloc(klen ? klen : 1);
    mark_ref_t *refs = idem_xmalloc(n * sizeof(*refs));
    for (size_t i = 0, o = 0; i < n; i++) {
        refs[i].i = i;
        refs[i].off = o;
        memcpy(keys + o, s->conf->redis_prefix, plen);
        memcpy(keys + o + plen, "dedup:", 6);
        memcpy(keys + o + plen + 6, s->conf->group_id, glen);
        keys[o + plen + 6 + glen] = ':';
        memcpy(keys + o + plen + 7 + glen, env[i]->identity,
               env[i]->identity_len);
        refs[i].len = plen + 7 + glen + env[i]->identity_len;
        refs[i].slot = idem_cluster_keyslot(keys + o, refs[i].len);
        o += refs[i].len;
    }
    mark_keys_buf = keys;
    qsort(refs, n, sizeof(*refs), mark_ref_cmp);
    mark_keys_buf = NULL;
    /* The calls: a slot's records, at most CHUNK_RECORDS a call unless
     * one identity's records would be cut apart. */
    mark_call_t *calls = idem_xmalloc(n * sizeof(*calls));
    size_t ncalls = 0;
    for (size_t j = 0; j < n; j++) {
        mark_call_t *last = ncalls ? &calls[ncalls - 1] : NULL;
        const mark_ref_t *prev = j ? &refs[j - 1] : NULL;
        int same_key =
            prev && prev->len == refs[j].len &&
            !memcmp(keys + prev->off, keys + refs[j].off, refs[j].len);
        if (last && last->slot == refs[j].slot &&
            (last->cnt < CHUNK_RECORDS || same_key)) {
            last->cnt++;
            continue;
        }
        calls[ncalls++] =
            (mark_call_t){.start = j, .cnt = 1, .slot = refs[j].slot};
    }
    s->req_len = 0;
    for (size_t k = 0; k < ncalls; k++)
        mark_call_format(s, script, 0, arg3, owner, env, refs, keys, &calls[k]);
    idem_cluster_cmd_t *cc = idem_xcalloc(ncalls, sizeof(*cc));
    int *slots = idem_xmalloc(ncalls * sizeof(*slots));
    redisReply **rep = idem_xcalloc(ncalls, sizeof(*rep));
    idem_cluster_err_t *errs = idem_xmalloc(ncalls * sizeof(*errs));
    idem_cluster_err_t first;
    int rc = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        for (size_t k = 0; k < ncalls; k++) {
            cc[k] = (idem_cluster_cmd_t){.formatted = s->req + calls[k].off,
                                         .formatted_len = calls[k].len};
            slots[k] = calls[k].slot;
        }
        int failed = idem_cluster_pipeline_slots(s->cl, cc, slots, ncalls, rep,
                                                 errs, &first);
        store_cluster_export(s, failed);
        if (failed) {
            store_cluster_fail(s, &first, errstr, errstr_size);
            goto out;
        }
        /* A node that has not loaded the script ran nothing: those calls
         * again as EVAL, which loads it there. */
        size_t noscript = 0;
        for (size_t k = 0; k < ncalls; k++)
            if (rep[k]->type == REDIS_REPLY_ERROR &&
                !strncmp(rep[k]->str, "NOSCRIPT", 8) && attempt == 0) {
                freeReplyObject(rep[k]);
                rep[k] = NULL;
                mark_call_format(s, script, 1, arg3, owner, env, refs, keys,
                                 &calls[k]);
                noscript++;
            }
        if (!noscript)
            break;
    }
    for (size_t k = 0; k < ncalls; k++) {
        const redisReply *r = rep[k];
        const mark_call_t *call = &calls[k];
        if (r->type == REDIS_REPLY_ERROR) {
            char msg[256];
            snprintf(msg, sizeof(msg), "%s", r->str);
            s->slot = call->slot;
            store_fail(s, errstr, errstr_size, "EVALSHA", msg);
            goto out;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != call->cnt) {
            s->slot = call->slot;
            store_fail(s, errstr, errstr_size, "EVALSHA",
                       "unexpected reply to script");
            goto out;
        }
        for (size_t j = 0; j < call->cnt; j++) {
            const redisReply *e = r->element[j];
            int str =
                e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS;
            result_from_string(&results[refs[call->start + j].i],
                               str ? e->str : "", str ? e->len : 0);
        }
    }
    if (script == SCRIPT_MARK && s->conf->redis_wait_replicas > 0) {
        if (cluster_wait(s, errstr, errstr_size))
            goto out;
        /* WAIT on a connection opened after the writes counts none of
         * them: the mark goes again (it writes our done mark again). */
        if (idem_cluster_connects(s->cl) != connects) {
            snprintf(errstr, errstr_size,
                     "redis cluster: a node's connection was replaced "
                     "between the marks and WAIT; marking again");
            if (s->metrics)
                idem_metrics_redis_error_add(s->metrics, "wait", 1);
            goto out;
        }
    }
    if (s->metrics)
        idem_metrics_redis_observe(s->metrics,
                                   (double)(idem_now_us() - t0) / 1e6);
    rc = 0;
out:
    for (size_t k = 0; k < ncalls; k++)
        if (rep[k])
            freeReplyObject(rep[k]);
    s->c = NULL; /* the client may have moved connections: routed again */
    free(rep);
    free(errs);
    free(slots);
    free(cc);
    free(calls);
    free(refs);
    free(keys);
    return rc;
}

/* ---- cluster mode: the global path of in-Redis effects ---------------- */

/* The bucket's acknowledged last offset of topic/partition as this member
 * saw it, or NULL (create: a new entry at -1). */
static struct gacked_s *gacked_find(idem_store_t *s, const char *topic,
                                    int32_t partition, int bucket, int create)
{
    for (size_t i = 0; i < s->ngacked; i++)
        if (s->gacked[i].partition == partition &&
            s->gacked[i].bucket == bucket && !strcmp(s->gacked[i].topic, topic))
            return &s->gacked[i];
    if (!create)
        return NULL;
    if (s->ngacked == s->gacked_cap) {
        s->gacked_cap = s->gacked_cap ? 2 * s->gacked_cap : 64;
        s->gacked =
            idem_xrealloc(s->gacked, s->gacked_cap * sizeof(*s->gacked));
    }
    struct gacked_s *g = &s->gacked[s->ngacked++];
    g->topic = idem_xstrdup(topic);
    g->partition = partition;
    g->bucket = bucket;
    g->acked = -1;
    g->touched = -1;
    g->touched_ms = -1;
    return g;
}

/* One record of a global request: its index in the caller's order, its
 * bucket and where it was read. */
typedef struct {
    size_t i;
    int bucket;
    const char *topic; /* NULL: not known (no where function) */
    int32_t partition;
    int64_t offset;
} grec_t;

static int grec_cmp(const void *a, const void *b)
{
    const grec_t *x = a, *y = b;
    if (x->bucket != y->bucket)
        return x->bucket < y->bucket ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* One partition of one call: its field and offsets as text. */
typedef struct {
    const char *topic;
    int32_t partition;
    int64_t hi, lo;
    char field[320], hi_s[24], lo_s[24], want_s[24];
} gpart_t;

/* One call: grecs[start, start + cnt) of one bucket, its partitions
 * gparts[pstart, pstart + pcnt), formatted at req[off, off + len). */
typedef struct {
    size_t start, cnt, pstart, pcnt, off, len;
    int bucket, slot;
    char tag[300], gpos_key[640];
} gcall_t;

/* Appends call k as EVALSHA (or EVAL with the script's source, after
 * NOSCRIPT) to s->req: the mark keys and the bucket's gpos hash in KEYS,
 * ARGV as redis/dedup_global.lua's cluster mode reads it. av/al hold every
 * record's arguments (per_record each, in the caller's order). */
static void gcall_format(idem_store_t *s, const user_script_t *u, int eval,
                         const grec_t *g, const gpart_t *gp, const char *keys,
                         const size_t *koff, const size_t *klen,
                         const char *const *av, const size_t *al, gcall_t *k)
{
    char nk[24], np[24];
    snprintf(nk, sizeof(nk), "%zu", k->cnt + 1);
    snprintf(np, sizeof(np), "%zu", k->pcnt);
    size_t per = u->per_record;
    argv_reserve(s, 10 + k->cnt * (1 + per) + 4 * k->pcnt);
    size_t a = 0;
    s->argv[a++] = eval ? "EVAL" : "EVALSHA";
    s->argv[a++] = eval ? u->src : u->sha;
    s->argv[a++] = nk;
    for (size_t a0 = 0; a0 < a; a0++)
        s->argvlen[a0] = strlen(s->argv[a0]);
    for (size_t j = 0; j < k->cnt; j++) {
        s->argv[a] = keys + koff[k->start + j];
        s->argvlen[a++] = klen[k->start + j];
    }
    const char *fixed[] = {
        k->gpos_key, s->conf->redis_prefix, s->conf->group_id, s->ttl, k->tag,
        np};
    for (size_t f = 0; f < 6; f++) {
        s->argv[a] = fixed[f];
        s->argvlen[a++] = strlen(fixed[f]);
    }
    for (size_t q = 0; q < k->pcnt; q++) {
        const gpart_t *p = &gp[k->pstart + q];
        const char *four[] = {p->field, p->hi_s, p->lo_s, p->want_s};
        for (size_t f = 0; f < 4; f++) {
            s->argv[a] = four[f];
            s->argvlen[a++] = strlen(four[f]);
        }
    }
    for (size_t j = 0; j < k->cnt; j++) {
        size_t i = g[k->start + j].i;
        for (size_t x = 0; x < per; x++) {
            s->argv[a] = av[i * per + x];
            s->argvlen[a++] = al[i * per + x];
        }
    }
    k->off = s->req_len;
    req_command(s, a, s->argv, s->argvlen);
    k->len = s->req_len - k->off;
}

/* Max-merges the partition's records of the buckets it used (fields
 * "<topic>:<partition>:g<NN>" of its position hash): a record only grows. */
static const char grecord_lua[] =
    "for i = 1, #ARGV, 2 do\n"
    "  local v = redis.call('HGET', KEYS[1], ARGV[i])\n"
    "  if not v or tonumber(v) < tonumber(ARGV[i + 1]) then\n"
    "    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])\n"
    "  end\n"
    "end\n"
    "return 0\n";

/* After a global request's calls were answered: each partition they
 * carried records, in its own position hash, the last offset each bucket
 * acknowledged (s->gacked), one call per partition, pipelined. A position
 * that passes those records is saved later (they are finished only now),
 * so on the partition's node the record comes before it. 0, or -1. */
static int grecords_write(idem_store_t *s, const gpart_t *gp,
                          const gcall_t *calls, size_t ncalls, char *errstr,
                          size_t errstr_size)
{
    size_t total = 0;
    for (size_t k = 0; k < ncalls; k++)
        total += calls[k].pcnt;
    if (!total)
        return 0;
    char(*pkey)[640] = idem_xmalloc(total * sizeof(*pkey));
    const char **keys = idem_xmalloc(total * sizeof(*keys));
    size_t *klens = idem_xmalloc(total * sizeof(*klens));
    char **cmds = idem_xcalloc(total, sizeof(*cmds));
    size_t *clens = idem_xmalloc(total * sizeof(*clens));
    redisReply **rep = idem_xcalloc(total, sizeof(*rep));
    const char **argv = idem_xmalloc((4 + 2 * total) * sizeof(*argv));
    char(*fld)[340] = idem_xmalloc(total * sizeof(*fld));
    char(*val)[24] = idem_xmalloc(total * sizeof(*val));
    size_t np = 0;
    for (size_t k = 0; k < ncalls; k++)
        for (size_t q = 0; q < calls[k].pcnt; q++) {
            const gpart_t *p = &gp[calls[k].pstart + q];
            idem_store_pos_key(s->conf, p->topic, p->partition, pkey[np],
                               sizeof(pkey[np]));
            int seen = 0;
            for (size_t x = 0; x < np && !seen; x++)
                seen = !strcmp(pkey[x], pkey[np]);
            if (seen)
                continue;
            /* Every bucket this partition used in this request. */
            size_t a = 0, nf = 0;
            argv[a++] = "EVAL";
            argv[a++] = grecord_lua;
            argv[a++] = "1";
            argv[a++] = pkey[np];
            for (size_t k2 = 0; k2 < ncalls; k2++)
                for (size_t q2 = 0; q2 < calls[k2].pcnt; q2++) {
                    const gpart_t *p2 = &gp[calls[k2].pstart + q2];
                    if (p2->partition != p->partition ||
                        strcmp(p2->topic, p->topic))
                        continue;
                    const struct gacked_s *ga = gacked_find(
                        s, p->topic, p->partition, calls[k2].bucket, 0);
                    snprintf(fld[nf], sizeof(fld[nf]), "%s:g%02d", p->field,
                             calls[k2].bucket);
                    snprintf(val[nf], sizeof(val[nf]), "%" PRId64,
                             ga ? ga->acked : p2->hi);
                    argv[a++] = fld[nf];
                    argv[a++] = val[nf++];
                }
            int len = redisFormatCommandArgv(&cmds[np], (int)a, argv, NULL);
            clens[np] = len > 0 ? (size_t)len : 0;
            keys[np] = pkey[np];
            klens[np] = strlen(pkey[np]);
            np++;
        }
    int rc = idem_store_ctx_calls(s, keys, klens, (const char *const *)cmds,
                                  clens, np, 0, rep, errstr, errstr_size);
    for (size_t x = 0; x < np && rc == 0; x++)
        if (!rep[x] || rep[x]->type == REDIS_REPLY_ERROR) {
            char msg[300];
            snprintf(msg, sizeof(msg), "%s: %s", pkey[x],
                     rep[x] ? rep[x]->str : "no reply");
            s->slot = idem_cluster_keyslot(pkey[x], strlen(pkey[x]));
            rc = store_fail(s, errstr, errstr_size, "EVAL", msg);
        }
    for (size_t x = 0; x < np; x++) {
        if (rep[x])
            freeReplyObject(rep[x]);
        redisFreeCommand(cmds[x]);
    }
    free(pkey);
    free(keys);
    free(klens);
    free(cmds);
    free(clens);
    free(rep);
    free(argv);
    free(fld);
    free(val);
    return rc;
}

/* Cluster mode's global path (docs/design.md, "Redis Cluster mode", "The
 * global path"): the records are grouped by the bucket of their identity
 * (idem_store_gbucket), one script call per bucket (at most CHUNK_RECORDS
 * records) on the bucket's slot with the mark keys and the bucket's gpos
 * hash declared, the calls of one node pipelined (idem_cluster_pipeline_
 * slots; MOVED, TRYAGAIN per call, ASK waited out as for the partition
 * chunks: the effect's keys are not declared). NOSCRIPT: those calls go
 * again as EVAL. A call refused GPOS (its bucket's node lost writes) or any
 * outage fails the request, nothing answered; the calls that did run are
 * harmless to send again (their marks). Then the partitions' records of
 * the buckets (grecords_write), the positions pos[npos] and, with
 * redis.wait.replicas, WAIT on every primary. The results wait in s->gres
 * for idem_store_script_recv. Returns 0, or -1 with errstr (retriable). */
static int cluster_global(idem_store_t *s, int script, const void *const *recs,
                          size_t n, const idem_store_pos_t *pos, size_t npos,
                          char *errstr, size_t errstr_size)
{
    if (s->pending_chunks || s->gres_pending) {
        snprintf(errstr, errstr_size, "redis: a request is still in flight");
        return -1;
    }
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    const user_script_t *u = &s->user[script - SCRIPT_CNT];
    size_t per = u->per_record;
    uint64_t connects = idem_cluster_connects(s->cl);
    int64_t t0 = idem_now_us();
    if (s->gres_cap < n) {
        s->gres_cap = n;
        s->gres = idem_xrealloc(s->gres, n * sizeof(*s->gres));
    }
    /* Every record's arguments, in the caller's order (the handler's args
     * function may count its calls), then its bucket and place. */
    const char **av = idem_xmalloc((n ? n : 1) * per * sizeof(*av));
    size_t *al = idem_xmalloc((n ? n : 1) * per * sizeof(*al));
    grec_t *g = idem_xmalloc((n ? n : 1) * sizeof(*g));
    size_t klen = 0;
    for (size_t i = 0; i < n; i++) {
        u->args(recs[i], av + i * per, al + i * per, u->opaque);
        g[i] = (grec_t){.i = i,
                        .bucket = idem_store_gbucket(av[i * per], al[i * per]),
                        .offset = -1};
        if (s->effect_where && script == s->effect_script)
            s->effect_where(recs[i], &g[i].topic, &g[i].partition,
                            &g[i].offset);
        klen += strlen(s->conf->redis_prefix) + strlen(s->conf->group_id) + 16 +
                al[i * per];
    }
    qsort(g, n, sizeof(*g), grec_cmp);
    /* The mark keys <prefix>dedup{<group>::<NN>}:<identity>, in g's order
     * (identities are bytes: NULs are data). */
    char *keys = idem_xmalloc(klen ? klen : 1);
    size_t *koff = idem_xmalloc((n ? n : 1) * sizeof(*koff));
    size_t *kl = idem_xmalloc((n ? n : 1) * sizeof(*kl));
    for (size_t j = 0, o = 0; j < n; j++) {
        int len = idem_store_gmark_key(s->conf, av[g[j].i * per],
                                       al[g[j].i * per], keys + o, klen - o);
        koff[j] = o;
        kl[j] = (size_t)len;
        o += kl[j];
    }
    /* The calls, and each call's partitions with their offsets. */
    gcall_t *calls = idem_xmalloc((n ? n : 1) * sizeof(*calls));
    gpart_t *gp = idem_xmalloc((n ? n : 1) * sizeof(*gp));
    size_t ncalls = 0, ngp = 0;
    for (size_t j = 0; j < n; j++) {
        gcall_t *k = ncalls ? &calls[ncalls - 1] : NULL;
        if (!k || k->bucket != g[j].bucket || k->cnt == CHUNK_RECORDS) {
            k = &calls[ncalls++];
            memset(k, 0, sizeof(*k));
            k->start = j;
            k->bucket = g[j].bucket;
            k->pstart = ngp;
            idem_store_gbucket_tag(s->conf, k->bucket, k->tag, sizeof(k->tag));
            snprintf(k->gpos_key, sizeof(k->gpos_key), "%sgpos%s",
                     s->conf->redis_prefix, k->tag);
            k->slot = idem_cluster_keyslot(k->gpos_key, strlen(k->gpos_key));
        }
        k->cnt++;
        if (!g[j].topic)
            continue;
        gpart_t *p = NULL;
        for (size_t q = k->pstart; q < ngp && !p; q++)
            if (gp[q].partition == g[j].partition &&
                !strcmp(gp[q].topic, g[j].topic))
                p = &gp[q];
        if (!p) {
            p = &gp[ngp++];
            k->pcnt++;
            p->topic = g[j].topic;
            p->partition = g[j].partition;
            p->hi = p->lo = g[j].offset;
            snprintf(p->field, sizeof(p->field), "%s:%" PRId32, p->topic,
                     p->partition);
            const struct gacked_s *ga =
                gacked_find(s, p->topic, p->partition, k->bucket, 0);
            if (ga && ga->acked >= 0)
                snprintf(p->want_s, sizeof(p->want_s), "%" PRId64, ga->acked);
            else
                snprintf(p->want_s, sizeof(p->want_s), "-");
        }
        if (g[j].offset > p->hi)
            p->hi = g[j].offset;
        if (g[j].offset < p->lo)
            p->lo = g[j].offset;
    }
    for (size_t q = 0; q < ngp; q++) {
        snprintf(gp[q].hi_s, sizeof(gp[q].hi_s), "%" PRId64, gp[q].hi);
        snprintf(gp[q].lo_s, sizeof(gp[q].lo_s), "%" PRId64, gp[q].lo);
    }
    s->req_len = 0;
    for (size_t k = 0; k < ncalls; k++)
        gcall_format(s, u, 0, g, gp, keys, koff, kl, av, al, &calls[k]);
    idem_cluster_cmd_t *cc = idem_xcalloc(ncalls ? ncalls : 1, sizeof(*cc));
    int *slots = idem_xmalloc((ncalls ? ncalls : 1) * sizeof(*slots));
    redisReply **rep = idem_xcalloc(ncalls ? ncalls : 1, sizeof(*rep));
    idem_cluster_err_t *errs =
        idem_xmalloc((ncalls ? ncalls : 1) * sizeof(*errs));
    idem_cluster_err_t first;
    int rc = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        for (size_t k = 0; k < ncalls; k++) {
            cc[k] = (idem_cluster_cmd_t){.formatted = s->req + calls[k].off,
                                         .formatted_len = calls[k].len,
                                         .ask_waits = 1};
            slots[k] = calls[k].slot;
        }
        int failed = idem_cluster_pipeline_slots(s->cl, cc, slots, ncalls, rep,
                                                 errs, &first);
        store_cluster_export(s, failed);
        if (failed) {
            store_cluster_fail(s, &first, errstr, errstr_size);
            goto out;
        }
        size_t noscript = 0;
        for (size_t k = 0; k < ncalls; k++)
            if (rep[k]->type == REDIS_REPLY_ERROR &&
                !strncmp(rep[k]->str, "NOSCRIPT", 8) && attempt == 0) {
                freeReplyObject(rep[k]);
                rep[k] = NULL;
                gcall_format(s, u, 1, g, gp, keys, koff, kl, av, al, &calls[k]);
                noscript++;
            }
        if (!noscript)
            break;
    }
    for (size_t k = 0; k < ncalls; k++) {
        const redisReply *r = rep[k];
        const gcall_t *call = &calls[k];
        if (r->type == REDIS_REPLY_ERROR) {
            char msg[512];
            snprintf(msg, sizeof(msg), "%s", r->str);
            s->slot = call->slot;
            if (!strncmp(msg, "GPOS", 4)) {
                /* The bucket's node holds less than it acknowledged: the
                 * loop reads the positions again (a new connection for it)
                 * and rewinds before anything more goes there. */
                s->gpos_losses++;
                idem_log_kv(IDEM_LOG_WARN,
                            "redis went back in time: a global bucket's node "
                            "lost writes it acknowledged; the positions are "
                            "read again",
                            "node", idem_cluster_slot_node(s->cl, call->slot),
                            "detail", msg, NULL);
            }
            store_fail(s, errstr, errstr_size, "EVALSHA", msg);
            goto out;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != call->cnt) {
            s->slot = call->slot;
            store_fail(s, errstr, errstr_size, "EVALSHA",
                       "unexpected reply to script");
            goto out;
        }
        for (size_t j = 0; j < call->cnt; j++) {
            const redisReply *e = r->element[j];
            int str =
                e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS;
            result_from_string(&s->gres[g[call->start + j].i],
                               str ? e->str : "", str ? e->len : 0);
        }
    }
    for (size_t k = 0; k < ncalls; k++)
        for (size_t q = 0; q < calls[k].pcnt; q++) {
            const gpart_t *p = &gp[calls[k].pstart + q];
            struct gacked_s *ga =
                gacked_find(s, p->topic, p->partition, calls[k].bucket, 1);
            if (p->hi > ga->acked)
                ga->acked = p->hi;
        }
    if (grecords_write(s, gp, calls, ncalls, errstr, errstr_size) ||
        (npos && cluster_positions(s, NULL, pos, npos, errstr, errstr_size)))
        goto out;
    if (s->conf->redis_wait_replicas > 0) {
        if (cluster_wait(s, errstr, errstr_size))
            goto out;
        if (idem_cluster_connects(s->cl) != connects) {
            snprintf(errstr, errstr_size,
                     "redis cluster: a node's connection was replaced "
                     "between the global path's writes and WAIT; sending "
                     "again");
            if (s->metrics)
                idem_metrics_redis_error_add(s->metrics, "wait", 1);
            goto out;
        }
    }
    if (s->metrics)
        idem_metrics_redis_observe(s->metrics,
                                   (double)(idem_now_us() - t0) / 1e6);
    s->gres_n = n;
    s->gres_pending = 1;
    rc = 0;
out:
    for (size_t k = 0; k < ncalls; k++)
        if (rep[k])
            freeReplyObject(rep[k]);
    s->c = NULL; /* the client may have moved connections: routed again */
    free(rep);
    free(errs);
    free(slots);
    free(cc);
    free(calls);
    free(gp);
    free(keys);
    free(koff);
    free(kl);
    free(g);
    free(av);
    free(al);
    return rc;
}

/* Sets a partition's position back (value ARGV[3], "" deletes it) when it
 * still is what the load read (ARGV[2], "" none), and its buckets' records
 * (pairs after: field, value, "" deletes). 1 done, 0 changed meanwhile. */
static const char gposback_lua[] =
    "local cur = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "if (cur or '') ~= ARGV[2] then return 0 end\n"
    "local function put(f, v)\n"
    "  if v == '' then redis.call('HDEL', KEYS[1], f)\n"
    "  else redis.call('HSET', KEYS[1], f, v) end\n"
    "end\n"
    "put(ARGV[1], ARGV[3])\n"
    "for i = 4, #ARGV, 2 do put(ARGV[i], ARGV[i + 1]) end\n"
    "return 1\n";

/* One bucket record of a loaded partition, and what its bucket holds. */
typedef struct {
    size_t i; /* the partition's index in the load */
    int bucket;
    int64_t recorded, last, at;
    int64_t at_ms; /* when `at` was written (Redis's clock, ms; -1) */
    idem_gpos_verdict_t verdict;
} gcheck_t;

/* Reads the bucket fields of a load's records (records[i * IDEM_GBUCKETS +
 * b] >= 0: partition i recorded bucket b), one HMGET each, pipelined. 0,
 * or -1 with errstr. */
static int gcheck_read(idem_store_t *s, gcheck_t *gc, size_t ng, char *errstr,
                       size_t errstr_size)
{
    char(*key)[640] = idem_xmalloc(ng * sizeof(*key));
    char(*fat)[340] = idem_xmalloc(ng * sizeof(*fat));
    char(*fts)[340] = idem_xmalloc(ng * sizeof(*fts));
    const char **keys = idem_xmalloc(ng * sizeof(*keys));
    size_t *klens = idem_xmalloc(ng * sizeof(*klens));
    char **cmds = idem_xcalloc(ng, sizeof(*cmds));
    size_t *clens = idem_xmalloc(ng * sizeof(*clens));
    redisReply **rep = idem_xcalloc(ng, sizeof(*rep));
    for (size_t x = 0; x < ng; x++) {
        char tag[300];
        idem_store_gbucket_tag(s->conf, gc[x].bucket, tag, sizeof(tag));
        snprintf(key[x], sizeof(key[x]), "%sgpos%s", s->conf->redis_prefix,
                 tag);
        const char *field = s->fields[gc[x].i];
        snprintf(fat[x], sizeof(fat[x]), "%s:at", field);
        snprintf(fts[x], sizeof(fts[x]), "%s:ts", field);
        const char *argv[] = {"HMGET", key[x], field, fat[x], fts[x]};
        int len = redisFormatCommandArgv(&cmds[x], 5, argv, NULL);
        clens[x] = len > 0 ? (size_t)len : 0;
        keys[x] = key[x];
        klens[x] = strlen(key[x]);
    }
    int rc = idem_store_ctx_calls(s, keys, klens, (const char *const *)cmds,
                                  clens, ng, 0, rep, errstr, errstr_size);
    for (size_t x = 0; x < ng && rc == 0; x++) {
        const redisReply *r = rep[x];
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 3) {
            char msg[700];
            snprintf(msg, sizeof(msg), "%s: %s", key[x],
                     r && r->type == REDIS_REPLY_ERROR ? r->str
                                                       : "unexpected reply");
            s->slot = idem_cluster_keyslot(key[x], klens[x]);
            rc = store_fail(s, errstr, errstr_size, "HMGET", msg);
            break;
        }
        gc[x].last = r->element[0]->type == REDIS_REPLY_STRING
                         ? strtoll(r->element[0]->str, NULL, 10)
                         : -1;
        gc[x].at = r->element[1]->type == REDIS_REPLY_STRING
                       ? strtoll(r->element[1]->str, NULL, 10)
                       : -1;
        gc[x].at_ms = r->element[2]->type == REDIS_REPLY_STRING
                          ? strtoll(r->element[2]->str, NULL, 10)
                          : -1;
    }
    for (size_t x = 0; x < ng; x++) {
        if (rep[x])
            freeReplyObject(rep[x]);
        redisFreeCommand(cmds[x]);
    }
    free(key);
    free(fat);
    free(fts);
    free(keys);
    free(klens);
    free(cmds);
    free(clens);
    free(rep);
    return rc;
}

/* Partition i of a load lost global-path records on buckets gc[] (those of
 * it judged BEHIND or GONE): logged with the node, its position set back
 * in its hash (compare-and-set on raw, what the load read) to `rewind`
 * (-1: deleted, a GONE bucket) and the lost buckets' records to what they
 * hold (deleted when GONE), so the next load finds them kept. load[i]
 * becomes the position set. 0, or -1 with errstr (the position changed
 * meanwhile, or an outage). */
static int gpos_setback(idem_store_t *s, idem_store_pos_t *load, size_t i,
                        const char *raw, const gcheck_t *gc, size_t ng,
                        int64_t rewind, char *errstr, size_t errstr_size)
{
    char key[640], val[160] = "";
    idem_store_pos_key(s->conf, load[i].topic, load[i].partition, key,
                       sizeof(key));
    idem_posval_t v;
    idem_posval_init(&v, load[i].val.cluster);
    if (rewind >= 0 && !idem_posval_format(val, sizeof(val), rewind, &v))
        snprintf(val, sizeof(val), "%" PRId64, rewind);
    const char **argv = idem_xmalloc((7 + 2 * ng) * sizeof(*argv));
    char(*fld)[340] = idem_xmalloc((ng ? ng : 1) * sizeof(*fld));
    char(*fv)[24] = idem_xmalloc((ng ? ng : 1) * sizeof(*fv));
    size_t a = 0;
    argv[a++] = "EVAL";
    argv[a++] = gposback_lua;
    argv[a++] = "1";
    argv[a++] = key;
    argv[a++] = s->fields[i];
    argv[a++] = raw;
    argv[a++] = val;
    for (size_t x = 0; x < ng; x++) {
        if (gc[x].i != i || gc[x].verdict == IDEM_GPOS_KEPT)
            continue;
        char node[300], b[8], rec[24], last[24], at[24], rw[24], part[16];
        snprintf(part, sizeof(part), "%" PRId32, load[i].partition);
        char tag[300], gkey[640];
        idem_store_gbucket_tag(s->conf, gc[x].bucket, tag, sizeof(tag));
        snprintf(gkey, sizeof(gkey), "%sgpos%s", s->conf->redis_prefix, tag);
        const char *nd = idem_store_key_node(s, gkey, strlen(gkey));
        snprintf(node, sizeof(node), "%s", nd ? nd : "-");
        snprintf(b, sizeof(b), "%02d", gc[x].bucket);
        snprintf(rec, sizeof(rec), "%" PRId64, gc[x].recorded);
        snprintf(last, sizeof(last), "%" PRId64, gc[x].last);
        snprintf(at, sizeof(at), "%" PRId64, gc[x].at);
        snprintf(rw, sizeof(rw), "%" PRId64, rewind);
        idem_log_kv(IDEM_LOG_WARN,
                    gc[x].verdict == IDEM_GPOS_GONE
                        ? "redis went back in time: a global bucket's node "
                          "holds nothing of a partition it acknowledged "
                          "records of; the partition's position is dropped "
                          "(the rules of a lost position apply)"
                        : "redis went back in time: a global bucket's node "
                          "lost records of a partition it acknowledged; "
                          "reading again from the bucket's last kept call",
                    "topic", load[i].topic, "partition", part, "node", node,
                    "bucket", b, "recorded", rec, "bucket_last", last,
                    "bucket_at", at, "rewind", rw, NULL);
        if (gc[x].verdict == IDEM_GPOS_BEHIND &&
            idem_gpos_stale(gc[x].at_ms, idem_wall_ms(),
                            s->conf->dedup_ttl_seconds)) {
            char age[24];
            snprintf(age, sizeof(age), "%" PRId64,
                     (idem_wall_ms() - gc[x].at_ms) / 1000);
            idem_log_kv(IDEM_LOG_WARN,
                        "the rewind after a global bucket's loss reaches "
                        "back further than dedup.ttl.seconds: records read "
                        "again from it whose marks expired may be applied "
                        "again (the bucket's at was written that long ago "
                        "and not touched since: the member was down, could "
                        "not reach it, or the partition was idle; records "
                        "finished after that time are not at risk)",
                        "topic", load[i].topic, "partition", part, "node", node,
                        "bucket", b, "rewind", rw, "at_age_seconds", age, NULL);
        }
        snprintf(fld[x], sizeof(fld[x]), "%s:g%02d", s->fields[i],
                 gc[x].bucket);
        if (gc[x].verdict == IDEM_GPOS_GONE)
            fv[x][0] = '\0';
        else
            snprintf(fv[x], sizeof(fv[x]), "%" PRId64, gc[x].last);
        argv[a++] = fld[x];
        argv[a++] = fv[x];
        struct gacked_s *ga =
            gacked_find(s, load[i].topic, load[i].partition, gc[x].bucket, 1);
        ga->acked = gc[x].verdict == IDEM_GPOS_GONE ? -1 : gc[x].last;
    }
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, (int)a, argv, NULL);
    redisReply *r = NULL;
    int rc =
        idem_store_ctx_call(s, key, strlen(key), cmd, len > 0 ? (size_t)len : 0,
                            0, &r, errstr, errstr_size);
    redisFreeCommand(cmd);
    free(argv);
    free(fld);
    free(fv);
    if (rc)
        return -1;
    int done = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    char msg[700] = "";
    if (!done)
        snprintf(msg, sizeof(msg), "%s %s: %s", key, s->fields[i],
                 r && r->type == REDIS_REPLY_ERROR
                     ? r->str
                     : "the position changed while it was set back; read "
                       "again");
    if (r)
        freeReplyObject(r);
    if (!done) {
        s->slot = idem_cluster_keyslot(key, strlen(key));
        return store_fail(s, errstr, errstr_size, "EVAL", msg);
    }
    s->gpos_losses++;
    load[i].offset = rewind;
    load[i].val = v;
    return 0;
}

/* A cluster load's check of the global path (store.h, idem_store_
 * positions_load): each bucket a partition recorded is judged against what
 * it holds (redis/gpos.h); a partition with a bucket behind is set back to
 * the lowest rewind, one with a bucket gone loses its position; a bucket
 * kept is what the next call expects (s->gacked). raw[i] is the position
 * value as read ("" none). 0, or -1 with errstr. */
static int gpos_check(idem_store_t *s, idem_store_pos_t *load,
                      char (*const raw)[160], const int64_t *records, size_t n,
                      char *errstr, size_t errstr_size)
{
    size_t ng = 0;
    for (size_t x = 0; x < n * IDEM_GBUCKETS; x++)
        ng += records[x] >= 0;
    if (!ng)
        return 0;
    gcheck_t *gc = idem_xcalloc(ng, sizeof(*gc));
    for (size_t i = 0, k = 0; i < n; i++)
        for (int b = 0; b < IDEM_GBUCKETS; b++)
            if (records[i * IDEM_GBUCKETS + b] >= 0)
                gc[k++] =
                    (gcheck_t){.i = i,
                               .bucket = b,
                               .recorded = records[i * IDEM_GBUCKETS + b]};
    int rc = gcheck_read(s, gc, ng, errstr, errstr_size);
    for (size_t i = 0; i < n && rc == 0; i++) {
        int64_t rewind = -1;
        int lost = 0, gone = 0;
        for (size_t x = 0; x < ng; x++) {
            if (gc[x].i != i)
                continue;
            int64_t rw;
            gc[x].verdict = idem_gpos_judge(gc[x].recorded, gc[x].last,
                                            gc[x].at, load[i].offset, &rw);
            if (gc[x].verdict == IDEM_GPOS_KEPT) {
                struct gacked_s *ga = gacked_find(
                    s, load[i].topic, load[i].partition, gc[x].bucket, 1);
                ga->acked = gc[x].last;
                continue;
            }
            lost = 1;
            gone |= gc[x].verdict == IDEM_GPOS_GONE;
            if (rw >= 0 && (rewind < 0 || rw < rewind))
                rewind = rw;
        }
        if (lost)
            rc = gpos_setback(s, load, i, raw[i], gc, ng, gone ? -1 : rewind,
                              errstr, errstr_size);
    }
    free(gc);
    return rc;
}

/* The touch's script on a bucket's gpos hash: per partition (triples of
 * field, finished prefix, the last offset the member saw the bucket
 * acknowledge), `at` = the prefix (never lowered) and `ts` = now, only
 * while the bucket still holds what the member saw acknowledged: a bucket
 * that lost it is left for the next load to judge. Returns how many
 * partitions it refused. */
static const char gtouch_lua[] =
    "local tm = redis.call('TIME')\n"
    "local ms = string.format('%.0f', tonumber(tm[1]) * 1000 +\n"
    "                         math.floor(tonumber(tm[2]) / 1000))\n"
    "local refused = 0\n"
    "for i = 1, #ARGV, 3 do\n"
    "  local f = ARGV[i]\n"
    "  local last = tonumber(redis.call('HGET', KEYS[1], f) or '-1')\n"
    "  if last < tonumber(ARGV[i + 2]) then\n"
    "    refused = refused + 1\n"
    "  else\n"
    "    local at = tonumber(redis.call('HGET', KEYS[1], f .. ':at') or '-1')\n"
    "    if at < tonumber(ARGV[i + 1]) then\n"
    "      redis.call('HSET', KEYS[1], f .. ':at', ARGV[i + 1], f .. ':ts', "
    "ms)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return refused\n";

int idem_store_gpos_touch(idem_store_t *s, const idem_store_pos_t *fin,
                          size_t n, int force, char *errstr, size_t errstr_size)
{
    if (!s->cl || !n || !s->ngacked)
        return 0;
    if (s->pending_chunks || s->gres_pending) {
        snprintf(errstr, errstr_size, "redis: a request is still in flight");
        return -1;
    }
    int64_t now = idem_now_ms();
    /* Per bucket, the entries (s->gacked indexes) due and their prefix. */
    size_t *due = idem_xmalloc(s->ngacked * sizeof(*due));
    int64_t *pre = idem_xmalloc(s->ngacked * sizeof(*pre));
    size_t nd = 0;
    int used[IDEM_GBUCKETS] = {0};
    for (size_t i = 0; i < n; i++)
        for (size_t x = 0; x < s->ngacked; x++) {
            const struct gacked_s *g = &s->gacked[x];
            if (g->partition != fin[i].partition ||
                strcmp(g->topic, fin[i].topic) ||
                !idem_gpos_touch_due(fin[i].offset, g->touched, g->touched_ms,
                                     g->acked, now, force))
                continue;
            due[nd] = x;
            pre[nd++] = fin[i].offset;
            used[g->bucket] = 1;
        }
    int rc = 0;
    if (nd && idem_store_connect(s, errstr, errstr_size))
        rc = -1;
    size_t nb = 0;
    for (int b = 0; b < IDEM_GBUCKETS; b++)
        nb += used[b];
    if (!nd || rc) {
        free(due);
        free(pre);
        return rc;
    }
    char(*key)[640] = idem_xmalloc(nb * sizeof(*key));
    const char **keys = idem_xmalloc(nb * sizeof(*keys));
    size_t *klens = idem_xmalloc(nb * sizeof(*klens));
    char **cmds = idem_xcalloc(nb, sizeof(*cmds));
    size_t *clens = idem_xmalloc(nb * sizeof(*clens));
    redisReply **rep = idem_xcalloc(nb, sizeof(*rep));
    const char **argv = idem_xmalloc((4 + 3 * nd) * sizeof(*argv));
    char(*fld)[340] = idem_xmalloc(nd * sizeof(*fld));
    char(*num)[2][24] = idem_xmalloc(nd * sizeof(*num));
    size_t k = 0;
    for (int b = 0; b < IDEM_GBUCKETS; b++) {
        if (!used[b])
            continue;
        char tag[300];
        idem_store_gbucket_tag(s->conf, b, tag, sizeof(tag));
        snprintf(key[k], sizeof(key[k]), "%sgpos%s", s->conf->redis_prefix,
                 tag);
        size_t a = 0;
        argv[a++] = "EVAL";
        argv[a++] = gtouch_lua;
        argv[a++] = "1";
        argv[a++] = key[k];
        for (size_t d = 0; d < nd; d++) {
            const struct gacked_s *g = &s->gacked[due[d]];
            if (g->bucket != b)
                continue;
            snprintf(fld[d], sizeof(fld[d]), "%s:%" PRId32, g->topic,
                     g->partition);
            snprintf(num[d][0], sizeof(num[d][0]), "%" PRId64, pre[d]);
            snprintf(num[d][1], sizeof(num[d][1]), "%" PRId64, g->acked);
            argv[a++] = fld[d];
            argv[a++] = num[d][0];
            argv[a++] = num[d][1];
        }
        int len = redisFormatCommandArgv(&cmds[k], (int)a, argv, NULL);
        clens[k] = len > 0 ? (size_t)len : 0;
        keys[k] = key[k];
        klens[k] = strlen(key[k]);
        k++;
    }
    rc = idem_store_ctx_calls(s, keys, klens, (const char *const *)cmds, clens,
                              nb, 0, rep, errstr, errstr_size);
    int refused = 0, lost[IDEM_GBUCKETS] = {0};
    for (size_t x = 0; x < nb && rc == 0; x++) {
        if (!rep[x] || rep[x]->type != REDIS_REPLY_INTEGER) {
            char msg[700];
            snprintf(msg, sizeof(msg), "%s: %s", key[x],
                     rep[x] && rep[x]->type == REDIS_REPLY_ERROR
                         ? rep[x]->str
                         : "unexpected reply");
            s->slot = idem_cluster_keyslot(key[x], klens[x]);
            rc = store_fail(s, errstr, errstr_size, "EVAL", msg);
            break;
        }
        if (rep[x]->integer > 0) {
            refused = 1;
            for (int b = 0, j = 0; b < IDEM_GBUCKETS; b++)
                if (used[b] && (size_t)j++ == x)
                    lost[b] = 1;
        }
    }
    if (rc == 0) {
        /* A refused partition's bucket lost what it acknowledged: counted
         * as a new connection, so the positions are read again (and the
         * loss judged) before anything more. The others are touched. */
        if (refused)
            s->gpos_losses++;
        for (size_t d = 0; d < nd; d++) {
            struct gacked_s *g = &s->gacked[due[d]];
            if (lost[g->bucket])
                continue;
            if (g->touched < pre[d])
                g->touched = pre[d];
            g->touched_ms = now;
        }
    }
    for (size_t x = 0; x < nb; x++) {
        if (rep[x])
            freeReplyObject(rep[x]);
        redisFreeCommand(cmds[x]);
    }
    free(key);
    free(keys);
    free(klens);
    free(cmds);
    free(clens);
    free(rep);
    free(argv);
    free(fld);
    free(num);
    free(due);
    free(pre);
    return rc;
}

int idem_store_claim(idem_store_t *s, const char *owner,
                     const idem_envelope_t *const *env, size_t n,
                     idem_store_result_t *results, char *errstr,
                     size_t errstr_size)
{
    if (idem_store_cluster(s))
        return cluster_marks(s, SCRIPT_CLAIM, s->lease_ms, owner, env, n,
                             results, errstr, errstr_size);
    return store_eval_batch(s, SCRIPT_CLAIM, s->lease_ms, owner, env, n,
                            results, errstr, errstr_size);
}

int idem_store_mark_done(idem_store_t *s, const char *owner,
                         const idem_envelope_t *const *env, size_t n,
                         idem_store_result_t *results, char *errstr,
                         size_t errstr_size)
{
    if (idem_store_cluster(s))
        return cluster_marks(s, SCRIPT_MARK, s->ttl, owner, env, n, results,
                             errstr, errstr_size);
    return store_eval_batch(s, SCRIPT_MARK, s->ttl, owner, env, n, results,
                            errstr, errstr_size);
}

/* Calls each(s, key, len of the currency part, ...) for every key that
 * matches <prefix>ledger:* on s->c (SCAN), on the node s->c is. */
typedef int (*ledger_key_fn)(idem_store_t *s, const char *key, size_t plen,
                             void *arg, char *errstr, size_t errstr_size);

static int ledger_keys(idem_store_t *s, ledger_key_fn each, void *arg,
                       char *errstr, size_t errstr_size)
{
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
        for (size_t i = 0; i < keys->elements; i++)
            if (each(s, keys->element[i]->str, plen, arg, errstr,
                     errstr_size)) {
                freeReplyObject(r);
                return -1;
            }
        freeReplyObject(r);
    } while (strcmp(cursor, "0"));
    return 0;
}

/* Runs ledger_keys on the one Redis, or on every primary of the cluster:
 * a sharded key lives on exactly one primary, so the sum over them is
 * exact (while no slot is migrating: verify runs after the traffic). */
static int ledger_keys_all(idem_store_t *s, ledger_key_fn each, void *arg,
                           char *errstr, size_t errstr_size)
{
    if (idem_store_connect(s, errstr, errstr_size))
        return -1;
    if (!s->cl)
        return ledger_keys(s, each, arg, errstr, errstr_size);
    for (size_t k = 0;; k++) {
        idem_cluster_err_t e;
        const char *addr = NULL;
        redisContext *c = idem_cluster_primary_context(s->cl, k, &addr, &e);
        if (!c && e.cls == IDEM_CLUSTER_ERR_NONE)
            return 0;
        if (!c) {
            snprintf(errstr, errstr_size, "%s", e.str);
            return -1;
        }
        s->c = c;
        s->slot = -1;
        if (ledger_keys(s, each, arg, errstr, errstr_size))
            return -1;
    }
}

/* The currency of a ledger key: what follows "ledger:", without the
 * partition's tag of cluster mode ("EUR{g:t:3}" -> "EUR"). */
static size_t ledger_currency(const char *key, size_t plen, char *cur,
                              size_t size)
{
    size_t n = strcspn(key + plen, "{");
    snprintf(cur, size, "%.*s", (int)n, key + plen);
    return n;
}

typedef struct {
    void (*cb)(const char *, const char *, int64_t, void *);
    void *opaque;
} scan_cb_t;

static int ledger_hash(idem_store_t *s, const char *key, size_t plen, void *arg,
                       char *errstr, size_t errstr_size)
{
    scan_cb_t *x = arg;
    char cur[256];
    ledger_currency(key, plen, cur, sizeof(cur));
    if (!strcmp(cur, "applied"))
        return 0;
    const char *hargv[] = {"HGETALL", key};
    redisReply *h = store_command(s, errstr, errstr_size, 2, hargv, NULL);
    if (!h)
        return -1;
    for (size_t j = 0; j + 1 < h->elements; j += 2)
        x->cb(cur, h->element[j]->str,
              strtoll(h->element[j + 1]->str, NULL, 10), x->opaque);
    freeReplyObject(h);
    return 0;
}

int idem_store_ledger_scan(idem_store_t *s,
                           void (*cb)(const char *currency, const char *user_id,
                                      int64_t minor, void *opaque),
                           void *opaque, char *errstr, size_t errstr_size)
{
    scan_cb_t x = {cb, opaque};
    return ledger_keys_all(s, ledger_hash, &x, errstr, errstr_size);
}

static int ledger_applied(idem_store_t *s, const char *key, size_t plen,
                          void *arg, char *errstr, size_t errstr_size)
{
    char cur[256];
    ledger_currency(key, plen, cur, sizeof(cur));
    if (strcmp(cur, "applied"))
        return 0;
    const char *argv[] = {"GET", key};
    redisReply *r = store_command(s, errstr, errstr_size, 2, argv, NULL);
    if (!r)
        return -1;
    if (r->type == REDIS_REPLY_STRING)
        *(int64_t *)arg += strtoll(r->str, NULL, 10);
    freeReplyObject(r);
    return 0;
}

int idem_store_applied_get(idem_store_t *s, int64_t *applied, char *errstr,
                           size_t errstr_size)
{
    *applied = 0;
    if (idem_store_cluster(s))
        return ledger_keys_all(s, ledger_applied, applied, errstr, errstr_size);
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

int idem_store_cluster_check(idem_store_t *s, idem_store_node_check_fn each,
                             void *opaque, size_t *uncovered, char *errstr,
                             size_t errstr_size)
{
    *uncovered = 0;
    if (!idem_store_cluster(s)) {
        snprintf(errstr, errstr_size, "redis: not in cluster mode");
        return -1;
    }
    if (!s->cl) { /* not through store_cluster_connect: its home node may be
                     the one that is down */
        idem_cluster_err_t e;
        s->cl = idem_cluster_new(s->conf, s->conf->redis_cluster_nodes, &e);
        if (!s->cl) {
            snprintf(errstr, errstr_size, "%s", e.str);
            return -1;
        }
    }
    for (int slot = 0; slot < IDEM_CLUSTER_SLOTS; slot++)
        *uncovered += !idem_cluster_slot_node(s->cl, slot);
    int failed = 0;
    for (size_t k = 0;; k++) {
        idem_cluster_err_t e;
        const char *addr = NULL;
        redisContext *c = idem_cluster_primary_context(s->cl, k, &addr, &e);
        if (!c && e.cls == IDEM_CLUSTER_ERR_NONE)
            break;
        char node[300], err[512] = "";
        snprintf(node, sizeof(node), "%s", addr ? addr : e.node);
        size_t slots = 0;
        for (int slot = 0; slot < IDEM_CLUSTER_SLOTS; slot++) {
            const char *a = idem_cluster_slot_node(s->cl, slot);
            slots += a && !strcmp(a, node);
        }
        if (!c) {
            snprintf(err, sizeof(err), "%s", e.str);
        } else {
            /* What a member's connect does on a single Redis (scripts,
             * INFO and its maxmemory-policy), then the node's own view of
             * the cluster (CLUSTERDOWN comes from a node in state fail). */
            s->c = c;
            s->slot = -1;
            s->refused[0] = '\0';
            if (!store_load_scripts(s, err, sizeof(err)) &&
                !store_check_server(s, err, sizeof(err))) {
                const char *argv[] = {"CLUSTER", "INFO"};
                redisReply *r =
                    store_command(s, err, sizeof(err), 2, argv, NULL);
                char state[32] = "";
                if (r && (r->type == REDIS_REPLY_STRING ||
                          r->type == REDIS_REPLY_STATUS))
                    idem_aofgate_info_field(r->str, "cluster_state", state,
                                            sizeof(state));
                if (r && strcmp(state, "ok"))
                    snprintf(err, sizeof(err),
                             "redis cluster: %s: cluster_state is %s (the "
                             "node answers CLUSTERDOWN)",
                             node, state[0] ? state : "unknown");
                if (r)
                    freeReplyObject(r);
            }
            s->c = NULL;
        }
        failed += err[0] != '\0';
        each(node, slots, err[0] ? err : NULL, opaque);
    }
    return failed;
}

typedef struct {
    const char *cur, *user;
    int64_t sum;
    size_t shards; /* hashes that hold the field */
} ledger_get_t;

static int ledger_field(idem_store_t *s, const char *key, size_t plen,
                        void *arg, char *errstr, size_t errstr_size)
{
    ledger_get_t *x = arg;
    char cur[256];
    ledger_currency(key, plen, cur, sizeof(cur));
    if (strcmp(cur, x->cur))
        return 0;
    const char *argv[] = {"HGET", key, x->user};
    redisReply *r = store_command(s, errstr, errstr_size, 3, argv, NULL);
    if (!r)
        return -1;
    if (r->type == REDIS_REPLY_STRING) {
        x->sum += strtoll(r->str, NULL, 10);
        x->shards++;
    }
    freeReplyObject(r);
    return 0;
}

int idem_store_ledger_get(idem_store_t *s, const char *currency,
                          const char *user_id, int64_t *minor, size_t *shards,
                          char *errstr, size_t errstr_size)
{
    ledger_get_t x = {.cur = currency, .user = user_id};
    *minor = 0;
    *shards = 0;
    if (idem_store_cluster(s)) {
        if (ledger_keys_all(s, ledger_field, &x, errstr, errstr_size))
            return -1;
    } else {
        if (idem_store_connect(s, errstr, errstr_size))
            return -1;
        char key[512];
        snprintf(key, sizeof(key), "%sledger:%s", s->conf->redis_prefix,
                 currency);
        size_t plen = strlen(s->conf->redis_prefix) + strlen("ledger:");
        if (ledger_field(s, key, plen, &x, errstr, errstr_size))
            return -1;
    }
    *minor = x.sum;
    *shards = x.shards;
    return 0;
}
