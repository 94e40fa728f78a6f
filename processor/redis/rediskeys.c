/* rediskeys: the configuration keys of the redis folder (the connection,
 * the dedup marks and leases, replication waits) and their checks
 * (conf.h). */
#include "redis/redisconn.h"
#include "redis/rediskeys.h"

#include <stdio.h>
#include <string.h>

/* The prefix goes into key names: glob characters would break the SCAN
 * MATCH that verify uses. */
static int prefix_check(const idem_conf_key_t *key, const char *value,
                        char *errstr, size_t errstr_size)
{
    (void)key;
    if (!strpbrk(value, "*?[]\\"))
        return 0;
    snprintf(errstr, errstr_size,
             "redis.prefix: \"%s\" may not contain * ? [ ] or \\", value);
    return -1;
}

/* clang-format off */
static const idem_conf_key_t redis_keys[] = {
    IDEM_CONF_STR("redis.url", redis_url, "redis://127.0.0.1:6379/0", 0, NULL,
        "redis[s]://[user[:password]@]host:port[/db] (rediss = TLS) or unix:///path.sock; with redis.sentinels only scheme, user, password and db are used"),
    IDEM_CONF_STR("redis.username", redis_username, NULL, 0, NULL,
        "Redis ACL user for AUTH user password (overrides one in redis.url)"),
    IDEM_CONF_STR("redis.password", redis_password, NULL, IDEM_KEY_SECRET, NULL,
        "Redis AUTH password (overrides one in redis.url)"),
    IDEM_CONF_STR("redis.tls.ca.file", redis_tls_ca_file, NULL, 0, NULL,
        "rediss://: PEM CA bundle that signs the server's certificate (default: the system's CAs)"),
    IDEM_CONF_STR("redis.tls.cert.file", redis_tls_cert_file, NULL, 0, NULL,
        "rediss://: client certificate (PEM chain), when the server asks for one"),
    IDEM_CONF_STR("redis.tls.key.file", redis_tls_key_file, NULL, 0, NULL,
        "rediss://: private key of redis.tls.cert.file (PEM; default: in the cert file)"),
    IDEM_CONF_STR("redis.tls.server.name", redis_tls_server_name, NULL, 0, NULL,
        "rediss://: name (or IP) the server's certificate must carry, and SNI (default: the host connected to)"),
    IDEM_CONF_BOOL("redis.tls.verify", redis_tls_verify, "true", 0,
        "rediss://: verify the server's certificate and name (false only for tests)"),
    IDEM_CONF_STR("redis.sentinels", redis_sentinels, NULL, 0, NULL,
        "Sentinel host:port[,host:port...]: the primary is asked from them at every connect (over TLS with rediss://)"),
    IDEM_CONF_STR("redis.sentinel.master", redis_sentinel_master, NULL, 0, NULL,
        "the master name the sentinels monitor (required with redis.sentinels)"),
    IDEM_CONF_STR("redis.sentinel.password", redis_sentinel_password, NULL, IDEM_KEY_SECRET, NULL,
        "AUTH password of the sentinels (when they require one)"),
    IDEM_CONF_STR("redis.cluster.nodes", redis_cluster_nodes, NULL, 0, NULL,
        "Redis Cluster seed nodes host:port[,host:port...] instead of redis.url's host (its scheme, user and password still apply); handler=ledger or script with dedup.scope=partition, or forward, webhook, plugin with dedup.scope=global"),
    IDEM_CONF_STR("redis.prefix", redis_prefix, "idemproc:", 0, prefix_check,
        "prefix of every Redis key"),
    IDEM_CONF_INT("redis.timeout.ms", redis_timeout_ms, "2000", 10, 600000, 0, NULL,
        "Redis connect and command timeout"),
    IDEM_CONF_BOOL("redis.allow.eviction", redis_allow_eviction, "false", 0,
        "run even if Redis's maxmemory-policy may evict keys (marks): effects can then be applied twice"),
    IDEM_CONF_BOOL("redis.aof.rewrite", redis_aof_rewrite, "true", 0,
        "before the first write to a restarted or new Redis server with AOF on, run BGREWRITEAOF and wait for it (a cut AOF may hold half a transaction that Redis 7.0 replays twice); false: skip"),
    IDEM_CONF_INT("redis.wait.replicas", redis_wait_replicas, "0", 0, 64, 0, NULL,
        "a chunk is finished only once WAIT confirms it reached this many replicas (0: no WAIT)"),
    IDEM_CONF_INT("redis.wait.timeout.ms", redis_wait_timeout_ms, "1000", 1, 600000, 0, NULL,
        "how long WAIT waits for redis.wait.replicas before the chunk is retried"),
    IDEM_CONF_INT("dedup.ttl.seconds", dedup_ttl_seconds, "86400", 1, 31536000, 0, NULL,
        "how long a done mark is kept (the dedup window)"),
    IDEM_CONF_INT("dedup.lease.ms", dedup_lease_ms, "30000", 100, 3600000, 0, NULL,
        "lease on a record while an external effect is in flight"),
    IDEM_CONF_ENUM("dedup.scope", dedup_scope, "global", 0,
        "the layout this member wants (the group runs the one its Redis layout key says: idemproc layout show): global: a mark key per identity; partition: each partition's marks held by its owner and written in chunks with the effect (handler=ledger or script; producers must key by business key: docs/guarantees.md)",
        "global", "partition"),
    IDEM_CONF_INT("dedup.memory.max", dedup_memory_max, "1073741824", 1048576, INT64_C(1099511627776), 0, NULL,
        "dedup.scope=partition: bytes all of a member's partition tables may hold; at the bound fetching pauses (never an eviction)"),
    IDEM_CONF_INT("dedup.window.key.max", dedup_window_key_max, "268435456", 16, 536870912, 0, NULL,
        "dedup.scope=partition: bytes of marks one key of a partition's time window holds (whole 16-byte marks); more go to its next part key. At most the server's proto-max-bulk-len (512 MB by default): a longer string cannot be written"),
    IDEM_CONF_INT("dev.layout.read.ms", dev_layout_read_ms, "1000", 1, 86400000, 0, NULL,
        "how often a member reads the dedup layout key again besides after a refusal (tests: a long interval makes the next request meet a switch)"),
    {.name = NULL},
};
/* clang-format on */

/* Whether handler h keeps its effect in Redis in the dedup script, which
 * the partition layout frames (ledger, script): the others' leases are
 * global marks. */
static int sharded_handler(const char *h)
{
    return !strcmp(h, "ledger") || !strcmp(h, "script");
}

/* Cluster mode (redis.cluster.nodes) runs the external handlers on their
 * per-identity marks and the in-Redis effects (ledger, script) sharded by
 * partition: every script of a chunk on one slot (docs/design.md, "Redis
 * Cluster mode"). */
static int cluster_check(const idem_conf_t *conf, char *errstr,
                         size_t errstr_size)
{
    const char *nodes = conf->redis_cluster_nodes;
    if (!nodes || !*nodes)
        return 0;
    if (conf->redis_sentinels && *conf->redis_sentinels) {
        snprintf(errstr, errstr_size,
                 "redis.cluster.nodes: set together with redis.sentinels "
                 "(a cluster fails over by itself: set one of them)");
        return -1;
    }
    if (strchr(conf->redis_prefix ? conf->redis_prefix : "", '{')) {
        snprintf(errstr, errstr_size,
                 "redis.cluster.nodes: redis.prefix \"%s\" contains '{' "
                 "(the partition's hash tag must be the first)",
                 conf->redis_prefix);
        return -1;
    }
    const char *h = conf->handler ? conf->handler : "";
    size_t hl = strcspn(h, ":");
    /* forward, webhook and plugins keep nothing in Redis but their marks
     * and leases, one key per identity, each on its own slot: every
     * claim and mark call carries one slot's keys (store.c,
     * cluster_marks). Their copies in retry topics find the first's mark
     * there too, and WAIT is sent to every primary after the marks. */
    int external = !strcmp(h, "forward") || !strcmp(h, "webhook") ||
                   (hl == 6 && !strncmp(h, "plugin", 6) && h[6] == ':');
    if (external) {
        if (conf->dedup_scope != IDEM_DEDUP_SCOPE_GLOBAL) {
            snprintf(errstr, errstr_size,
                     "redis.cluster.nodes: handler \"%s\" needs "
                     "dedup.scope=global (its marks are one key per "
                     "identity, each on its own slot)",
                     h);
            return -1;
        }
        return 0;
    }
    if (!sharded_handler(h)) {
        snprintf(errstr, errstr_size,
                 "redis.cluster.nodes: handler \"%s\" keeps Redis state that "
                 "is not sharded by partition yet (cluster mode runs "
                 "handler=ledger, script, forward, webhook or plugin:PATH)",
                 h);
        return -1;
    }
    if (conf->dedup_scope != IDEM_DEDUP_SCOPE_PARTITION) {
        snprintf(errstr, errstr_size,
                 "redis.cluster.nodes: handler=%s needs "
                 "dedup.scope=partition (the global marks are one key per "
                 "identity, not one slot per chunk)",
                 h);
        return -1;
    }
    /* retry.topics: a copy takes the global path, whose marks and
     * effects are sharded by bucket (store.c, cluster_global). */
    /* redis.wait.replicas: WAIT goes to each node a request's chunks
     * were written to (redis/partstate.c), and after the global path's
     * calls to every primary (store.c). */
    return 0;
}

static int redis_conf_check(const idem_conf_module_t *m, idem_conf_t *conf,
                            char *errstr, size_t errstr_size)
{
    (void)m;
    if (!conf->redis_url || !*conf->redis_url) {
        snprintf(errstr, errstr_size,
                 "redis.url: empty (leave it out for the default "
                 "redis://127.0.0.1:6379/0)");
        return -1;
    }
    if (conf->dedup_scope == IDEM_DEDUP_SCOPE_PARTITION) {
        const char *h = conf->handler ? conf->handler : "";
        if (!sharded_handler(h)) {
            snprintf(errstr, errstr_size,
                     "dedup.scope=partition: handler \"%s\" cannot use it "
                     "(its effect is outside Redis, claimed with a lease: "
                     "only handler=ledger and handler=script; use "
                     "dedup.scope=global)",
                     h);
            return -1;
        }
    }
    if (cluster_check(conf, errstr, errstr_size))
        return -1;
    return idem_redisconn_conf_check(conf, errstr, errstr_size);
}

/* check-config shows redis.url with its password hidden. */
static const char *redis_show(const idem_conf_key_t *key, const char *value,
                              char *buf, size_t size)
{
    if (strcmp(key->name, "redis.url"))
        return value;
    return idem_redisconn_url_redact(value, buf, size);
}

const idem_conf_module_t idem_redis_conf = {
    .name = "redis",
    .doc = "the store: connection, dedup marks and leases",
    .keys = redis_keys,
    .check = redis_conf_check,
    .show = redis_show,
};
