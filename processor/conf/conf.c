/* conf: the configuration table, its sources (file, environment, --set) and
 * the effective configuration every command reads. */
#include "conf/conf.h"
#include "loop/fetchwatch.h"
#include "input/envelope.h"
#include "effect/handler.h"
#include "kafka/kafka.h"
#include "outbox/outboxrow.h"
#include "redis/redisconn.h"
#include "kafka/retrytopic.h"
#include "base/util.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <regex.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { PROP_STR, PROP_INT, PROP_ENUM } prop_type_t;

/* One configuration key. Like librdkafka's rd_kafka_property table: parsing,
 * validation, help, check-config and the README all read this. */
typedef struct {
    const char *name;
    prop_type_t type;
    size_t offset;        /* of the field in idem_conf_t */
    const char *def;      /* default as text; NULL = unset */
    int64_t min, max;     /* PROP_INT range */
    const char *enums[6]; /* PROP_ENUM names, index = stored value */
    int secret;           /* never printed or logged */
    int required;         /* finalize fails when unset or empty */
    const char *doc;
} prop_t;

#define F(field) offsetof(idem_conf_t, field)

static const prop_t props[] = {
    {"kafka.bootstrap.servers",
     PROP_STR,
     F(bootstrap_servers),
     NULL,
     0,
     0,
     {0},
     0,
     1,
     "Kafka brokers, host:port[,host:port...]"},
    {"group.id",
     PROP_STR,
     F(group_id),
     NULL,
     0,
     0,
     {0},
     0,
     1,
     "consumer group; also scopes the dedup marks in Redis"},
    {"input.topics",
     PROP_STR,
     F(input_topics),
     NULL,
     0,
     0,
     {0},
     0,
     1,
     "comma list of topics to consume; a ^ prefix makes one a regex"},
    {"dlq.topic",
     PROP_STR,
     F(dlq_topic),
     NULL,
     0,
     0,
     {0},
     0,
     1,
     "dead-letter topic for poison records"},
    {"dlq.headers.format",
     PROP_ENUM,
     F(dlq_headers_format),
     "idemproc",
     0,
     0,
     {"idemproc", "spring", "both"},
     0,
     0,
     "headers of a dead letter: idemproc (dlq.*), spring (the kafka_dlt-* "
     "of Spring for Apache Kafka), or both"},
    {"dlq.replay.max",
     PROP_INT,
     F(dlq_replay_max),
     "3",
     0,
     1000000,
     {0},
     0,
     0,
     "dlq replay refuses a dead letter already replayed this many times"},
    {"output.topic",
     PROP_STR,
     F(output_topic),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "topic the forward handler writes to (required with handler=forward)"},
    {"member.id",
     PROP_STR,
     F(member_id),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "this member's name: client.id, lease owner, logs (default "
     "hostname-pid)"},
    {"handler",
     PROP_STR,
     F(handler),
     "ledger",
     0,
     0,
     {0},
     0,
     0,
     "the effect: a registered handler, NAME or NAME:ARG (see the handler "
     "keys below; ledger: payments into Redis; forward: copy to "
     "output.topic)"},
    {"envelope.format",
     PROP_ENUM,
     F(envelope_format),
     "json",
     0,
     0,
     {"json", "bytes"},
     0,
     0,
     "json: the value must be a JSON object; bytes: the value is not "
     "parsed (identity from headers or the key)"},
    {"envelope.identity",
     PROP_STR,
     F(envelope_identity),
     IDEM_ENVELOPE_IDENTITY_DEFAULT,
     0,
     0,
     {0},
     0,
     0,
     "where the dedup identity comes from: comma list of value:<JSON "
     "Pointer>, header:<name>, key; the first found wins"},
    {"envelope.message.id",
     PROP_STR,
     F(envelope_message_id),
     IDEM_ENVELOPE_MESSAGE_ID_DEFAULT,
     0,
     0,
     {0},
     0,
     0,
     "where the message id comes from (same syntax; empty: none): tells a "
     "redelivery from a resend"},
    {"redis.url",
     PROP_STR,
     F(redis_url),
     "redis://127.0.0.1:6379/0",
     0,
     0,
     {0},
     0,
     0,
     "redis[s]://[user[:password]@]host:port[/db] (rediss = TLS) or "
     "unix:///path.sock; with redis.sentinels only scheme, user, password "
     "and db are used"},
    {"redis.username",
     PROP_STR,
     F(redis_username),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "Redis ACL user for AUTH user password (overrides one in redis.url)"},
    {"redis.password",
     PROP_STR,
     F(redis_password),
     NULL,
     0,
     0,
     {0},
     1,
     0,
     "Redis AUTH password (overrides one in redis.url)"},
    {"redis.tls.ca.file",
     PROP_STR,
     F(redis_tls_ca_file),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "rediss://: PEM CA bundle that signs the server's certificate "
     "(default: the system's CAs)"},
    {"redis.tls.cert.file",
     PROP_STR,
     F(redis_tls_cert_file),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "rediss://: client certificate (PEM chain), when the server asks for "
     "one"},
    {"redis.tls.key.file",
     PROP_STR,
     F(redis_tls_key_file),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "rediss://: private key of redis.tls.cert.file (PEM; default: in the "
     "cert file)"},
    {"redis.tls.server.name",
     PROP_STR,
     F(redis_tls_server_name),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "rediss://: name (or IP) the server's certificate must carry, and SNI "
     "(default: the host connected to)"},
    {"redis.tls.verify",
     PROP_ENUM,
     F(redis_tls_verify),
     "true",
     0,
     0,
     {"false", "true"},
     0,
     0,
     "rediss://: verify the server's certificate and name (false only for "
     "tests)"},
    {"redis.sentinels",
     PROP_STR,
     F(redis_sentinels),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "Sentinel host:port[,host:port...]: the primary is asked from them at "
     "every connect (over TLS with rediss://)"},
    {"redis.sentinel.master",
     PROP_STR,
     F(redis_sentinel_master),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "the master name the sentinels monitor (required with redis.sentinels)"},
    {"redis.sentinel.password",
     PROP_STR,
     F(redis_sentinel_password),
     NULL,
     0,
     0,
     {0},
     1,
     0,
     "AUTH password of the sentinels (when they require one)"},
    {"redis.prefix",
     PROP_STR,
     F(redis_prefix),
     "idemproc:",
     0,
     0,
     {0},
     0,
     0,
     "prefix of every Redis key"},
    {"redis.timeout.ms",
     PROP_INT,
     F(redis_timeout_ms),
     "2000",
     10,
     600000,
     {0},
     0,
     0,
     "Redis connect and command timeout"},
    {"redis.allow.eviction",
     PROP_ENUM,
     F(redis_allow_eviction),
     "false",
     0,
     0,
     {"false", "true"},
     0,
     0,
     "run even if Redis's maxmemory-policy may evict keys (marks): "
     "effects can then be applied twice"},
    {"redis.aof.rewrite",
     PROP_ENUM,
     F(redis_aof_rewrite),
     "true",
     0,
     0,
     {"false", "true"},
     0,
     0,
     "before the first write to a restarted or new Redis server with AOF on, "
     "run BGREWRITEAOF and wait for it (a cut AOF may hold half a "
     "transaction that Redis 7.0 replays twice); false: skip"},
    {"redis.wait.replicas",
     PROP_INT,
     F(redis_wait_replicas),
     "0",
     0,
     64,
     {0},
     0,
     0,
     "a chunk is finished only once WAIT confirms it reached this many "
     "replicas (0: no WAIT)"},
    {"redis.wait.timeout.ms",
     PROP_INT,
     F(redis_wait_timeout_ms),
     "1000",
     1,
     600000,
     {0},
     0,
     0,
     "how long WAIT waits for redis.wait.replicas before the chunk is retried"},
    {"dedup.ttl.seconds",
     PROP_INT,
     F(dedup_ttl_seconds),
     "86400",
     1,
     31536000,
     {0},
     0,
     0,
     "how long a done mark is kept (the dedup window)"},
    {"dedup.lease.ms",
     PROP_INT,
     F(dedup_lease_ms),
     "30000",
     100,
     3600000,
     {0},
     0,
     0,
     "lease on a record while an external effect is in flight"},
    {"retry.max.attempts",
     PROP_INT,
     F(retry_max_attempts),
     "5",
     1,
     1000,
     {0},
     0,
     0,
     "attempts of a retriable handler error before max-retries"},
    {"handler.max.consecutive.rejects",
     PROP_INT,
     F(handler_max_consecutive_rejects),
     "100",
     0,
     100000000,
     {0},
     0,
     0,
     "after this many handler-rejected records in a row (no success "
     "between) the member pauses and turns not ready instead of "
     "dead-lettering more, until a record succeeds; 0 = off"},
    {"retry.backoff.initial.ms",
     PROP_INT,
     F(retry_backoff_initial_ms),
     "100",
     1,
     3600000,
     {0},
     0,
     0,
     "first retry delay (doubles, with jitter)"},
    {"retry.backoff.max.ms",
     PROP_INT,
     F(retry_backoff_max_ms),
     "10000",
     1,
     3600000,
     {0},
     0,
     0,
     "largest retry and reconnect delay"},
    {"retry.topics",
     PROP_STR,
     F(retry_topics),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "non-blocking retries: comma list of ascending delays (200ms, 5s, 1m, "
     "2h); a record failing retriably goes to INPUT.retry.DELAY, tier by "
     "tier, then to the DLQ as max-retries; unset: retry in place "
     "(blocking, retry.max.attempts)"},
    {"batch.max.messages",
     PROP_INT,
     F(batch_max_messages),
     "1000",
     1,
     100000,
     {0},
     0,
     0,
     "records per batch (one Redis round trip)"},
    {"batch.max.wait.ms",
     PROP_INT,
     F(batch_max_wait_ms),
     "0",
     0,
     60000,
     {0},
     0,
     0,
     "with the handler free, longest wait for a fuller batch (0: send what "
     "has arrived at once)"},
    {"commit.interval.ms",
     PROP_INT,
     F(commit_interval_ms),
     "1000",
     10,
     3600000,
     {0},
     0,
     0,
     "asynchronous offset commit period"},
    {"message.max.bytes",
     PROP_INT,
     F(message_max_bytes),
     "1048576",
     64,
     104857600,
     {0},
     0,
     0,
     "larger record values go to the DLQ as too-large"},
    {"http.listen",
     PROP_STR,
     F(http_listen),
     "127.0.0.1:9464",
     0,
     0,
     {0},
     0,
     0,
     "metrics and probes address host:port; empty disables HTTP"},
    {"health.stall.ms",
     PROP_INT,
     F(health_stall_ms),
     "30000",
     100,
     3600000,
     {0},
     0,
     0,
     "/healthz fails when the loop made no progress this long"},
    {"stats.interval.ms",
     PROP_INT,
     F(stats_interval_ms),
     "5000",
     0,
     3600000,
     {0},
     0,
     0,
     "librdkafka statistics period (consumer lag, fetch.stall.ms); 0 = "
     "off"},
    {"fetch.stall.ms",
     PROP_INT,
     F(fetch_stall_ms),
     "30000",
     0,
     3600000,
     {0},
     0,
     0,
     "an assigned partition, not paused by the member, behind its end and "
     "not fetched this long is logged, counted and resumed; still stalled "
     "as long after that, the member is not ready (needs "
     "stats.interval.ms); 0 = off"},
    {"fault.fetch.pause",
     PROP_STR,
     F(fault_fetch_pause),
     "",
     0,
     0,
     {0},
     0,
     0,
     "development only: TOPIC:PARTITION[:TIMES] pauses that partition "
     "inside librdkafka behind the member's back once its fetch started, "
     "and drops the first TIMES-1 repairs (exercises fetch.stall.ms)"},
    {"fault.fetch.assign.fail",
     PROP_INT,
     F(fault_fetch_assign_fail),
     "0",
     0,
     100,
     {0},
     0,
     0,
     "development only: the fetch watch's next N assigns of a stalled "
     "partition it took out of the assignment are refused, as librdkafka "
     "may refuse one (exercises fetch.stall.ms); 0 = off"},
    {"progress.interval.ms",
     PROP_INT,
     F(progress_interval_ms),
     "10000",
     0,
     3600000,
     {0},
     0,
     0,
     "period of the progress log line; 0 = off"},
    {"log.level",
     PROP_ENUM,
     F(log_level),
     "info",
     0,
     0,
     {"debug", "info", "warn", "error"},
     0,
     0,
     "least severe level logged"},
    {"log.format",
     PROP_ENUM,
     F(log_format),
     "json",
     0,
     0,
     {"json", "text"},
     0,
     0,
     "json: one object a line; text: for people"},
    {"shutdown.timeout.ms",
     PROP_INT,
     F(shutdown_timeout_ms),
     "10000",
     100,
     600000,
     {0},
     0,
     0,
     "SIGTERM: finish, flush, commit and leave within this"},
    {"outbox.dsn",
     PROP_STR,
     F(outbox_dsn),
     NULL,
     0,
     0,
     {0},
     1,
     0,
     "outbox: PostgreSQL connection string or URI (libpq); required by "
     "idemproc outbox"},
    {"outbox.table",
     PROP_STR,
     F(outbox_table),
     "idemproc_outbox",
     0,
     0,
     {0},
     0,
     0,
     "outbox: the outbox table, [schema.]name (config/sql/outbox.sql)"},
    {"outbox.topic",
     PROP_STR,
     F(outbox_topic),
     NULL,
     0,
     0,
     {0},
     0,
     0,
     "outbox: topic for rows whose topic column is NULL"},
    {"outbox.batch.max",
     PROP_INT,
     F(outbox_batch_max),
     "5000",
     1,
     100000,
     {0},
     0,
     0,
     "outbox: rows claimed, published and marked per transaction"},
    {"outbox.poll.ms",
     PROP_INT,
     F(outbox_poll_ms),
     "1000",
     10,
     3600000,
     {0},
     0,
     0,
     "outbox: look for rows this often when no NOTIFY arrives"},
    {"outbox.after",
     PROP_ENUM,
     F(outbox_after),
     "mark",
     0,
     0,
     {"mark", "delete"},
     0,
     0,
     "outbox: mark: set published_at; delete: delete published rows"},
};

#define PROP_CNT (sizeof(props) / sizeof(props[0]))

/* A handler's key (handler.h) as a table row: its value lives in
 * conf->hkeys as text, not in a field. */
#define PROP_HKEY ((size_t)-1)

static prop_t prop_from_key(const idem_conf_key_t *k)
{
    prop_t p = {k->name,   (prop_type_t)k->type,
                PROP_HKEY, k->def,
                k->min,    k->max,
                {0},       k->secret,
                0,         k->doc};
    for (int i = 0; i < 5 && k->enums[i]; i++)
        p.enums[i] = k->enums[i];
    return p;
}

/* A plugin's key (key_prefix): any text. */
static prop_t prop_prefixed(const char *name)
{
    prop_t p = {name, PROP_STR, PROP_HKEY, NULL, 0, 0, {0}, 0, 0, ""};
    return p;
}

static const prop_t *prop_find(const char *name)
{
    for (size_t i = 0; i < PROP_CNT; i++)
        if (!strcmp(props[i].name, name))
            return &props[i];
    return NULL;
}

/* The text a handler key holds in conf, or NULL when it was not set. */
static const char *hkey_get(const idem_conf_t *conf, const char *name)
{
    for (size_t i = conf->hkeys_cnt; i-- > 0;)
        if (!strcmp(conf->hkeys[i].name, name))
            return conf->hkeys[i].value;
    return NULL;
}

static void hkey_store(idem_conf_t *conf, const char *name, const char *value)
{
    for (size_t i = 0; i < conf->hkeys_cnt; i++)
        if (!strcmp(conf->hkeys[i].name, name)) {
            free(conf->hkeys[i].value);
            conf->hkeys[i].value = idem_xstrdup(value);
            return;
        }
    conf->hkeys = idem_xrealloc(conf->hkeys,
                                (conf->hkeys_cnt + 1) * sizeof(*conf->hkeys));
    conf->hkeys[conf->hkeys_cnt].name = idem_xstrdup(name);
    conf->hkeys[conf->hkeys_cnt].value = idem_xstrdup(value);
    conf->hkeys_cnt++;
}

const char *idem_conf_str(const idem_conf_t *conf, const char *key)
{
    const char *v = hkey_get(conf, key);
    if (v)
        return v;
    const idem_conf_key_t *decl = NULL;
    if (!idem_handler_key(key, &decl)) {
        fprintf(stderr, "idemproc: internal: no handler declares key %s\n",
                key);
        return NULL;
    }
    return decl ? decl->def : NULL;
}

int64_t idem_conf_int(const idem_conf_t *conf, const char *key)
{
    const char *v = idem_conf_str(conf, key);
    if (!v)
        return 0;
    const idem_conf_key_t *decl = NULL;
    idem_handler_key(key, &decl);
    if (decl && decl->type == IDEM_KEY_ENUM) {
        for (int i = 0; i < 6 && decl->enums[i]; i++)
            if (!strcmp(decl->enums[i], v))
                return i;
        return 0;
    }
    return strtoll(v, NULL, 10);
}

static void err_set(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void err_set(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* Levenshtein distance, for "did you mean" hints. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t *row = idem_xcalloc(lb + 1, sizeof(*row));
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diag + cost;
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    size_t d = row[lb];
    free(row);
    return d;
}

static const char *closest_key(const char *name)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < PROP_CNT; i++) {
        size_t d = edit_distance(name, props[i].name);
        if (d < best_d) {
            best_d = d;
            best = props[i].name;
        }
    }
    const idem_handler_ops_t *h;
    for (size_t i = 0; (h = idem_handler_at(i)); i++)
        for (const idem_conf_key_t *k = h->keys; k && k->name; k++) {
            size_t d = edit_distance(name, k->name);
            if (d < best_d) {
                best_d = d;
                best = k->name;
            }
        }
    /* Only suggest what is plausibly a typo. */
    return best_d <= 1 + strlen(name) / 4 ? best : NULL;
}

int idem_conf_kafka_prop_is_secret(const char *name)
{
    static const char *const patterns[] = {
        "password", "secret",  "sasl.jaas", "key.pem", "oauthbearer.config",
        "keystore", "ssl.key", "ssl_key",   "token",   "credential",
    };
    char low[256];
    size_t i;
    for (i = 0; name[i] && i < sizeof(low) - 1; i++)
        low[i] = (char)tolower((unsigned char)name[i]);
    low[i] = '\0';
    for (size_t j = 0; j < sizeof(patterns) / sizeof(patterns[0]); j++)
        if (strstr(low, patterns[j]))
            return 1;
    return 0;
}

/* Reads a whole small file (a mounted secret) into a new string, trailing
 * newlines removed. Returns NULL with errstr on failure. */
static char *read_secret_file(const char *key, const char *path, char *errstr,
                              size_t errstr_size)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        err_set(errstr, errstr_size, "%s: cannot read \"%s\": %s", key, path,
                strerror(errno));
        return NULL;
    }
    char *buf = idem_xmalloc(65537);
    size_t n = fread(buf, 1, 65536, fp);
    int toolong = !feof(fp);
    fclose(fp);
    if (toolong) {
        free(buf);
        err_set(errstr, errstr_size, "%s: \"%s\" is larger than 64 KiB", key,
                path);
        return NULL;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (memchr(buf, '\0', n)) {
        /* The secret would be cut at it without a word. */
        memset(buf, 0, n);
        free(buf);
        err_set(errstr, errstr_size,
                "%s: \"%s\" holds a NUL byte (a secret must be text)", key,
                path);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* Stores kafka.<prop>. Refuses a property idemproc sets itself, and lets
 * librdkafka judge the value now, so that the error carries the file and
 * line (or variable) it came from; cross-property checks happen later in
 * rd_kafka_new. */
static int kafka_set(idem_conf_t *conf, const char *prop, const char *value,
                     char *errstr, size_t errstr_size)
{
    const char *instead = idem_kafka_managed(prop);
    /* The outbox relay owns its producer: how long it lingers and how long
     * it waits for an acknowledgement are the user's (an undelivered row
     * is simply published again). */
    if (instead && conf->scope == IDEM_CONF_SCOPE_OUTBOX &&
        (!strcmp(prop, "linger.ms") || !strcmp(prop, "message.timeout.ms")))
        instead = NULL;
    if (instead) {
        err_set(errstr, errstr_size,
                "kafka.%s: set by idemproc itself, not configurable (%s)", prop,
                instead);
        return -1;
    }
    rd_kafka_conf_t *scratch = rd_kafka_conf_new();
    char kerr[512];
    rd_kafka_conf_res_t res =
        rd_kafka_conf_set(scratch, prop, value, kerr, sizeof(kerr));
    rd_kafka_conf_destroy(scratch);
    if (res != RD_KAFKA_CONF_OK) {
        err_set(errstr, errstr_size, "kafka.%s: %s", prop, kerr);
        return -1;
    }
    for (size_t i = 0; i < conf->kafka_cnt; i++) {
        if (!strcmp(conf->kafka[i].name, prop)) {
            free(conf->kafka[i].value);
            conf->kafka[i].value = idem_xstrdup(value);
            return 0;
        }
    }
    conf->kafka = idem_xrealloc(conf->kafka,
                                (conf->kafka_cnt + 1) * sizeof(*conf->kafka));
    conf->kafka[conf->kafka_cnt].name = idem_xstrdup(prop);
    conf->kafka[conf->kafka_cnt].value = idem_xstrdup(value);
    conf->kafka_cnt++;
    return 0;
}

/* Validates `value` against the property's type, range and enum: the
 * number in *num (PROP_INT) or the index in *idx (PROP_ENUM). */
static int prop_check(const prop_t *p, const char *value, int64_t *num,
                      int *idx, char *errstr, size_t errstr_size)
{
    switch (p->type) {
    case PROP_STR:
        return 0;
    case PROP_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (!*value || *end || errno) {
            err_set(errstr, errstr_size, "%s: \"%s\" is not an integer",
                    p->name, value);
            return -1;
        }
        if (v < p->min || v > p->max) {
            err_set(errstr, errstr_size,
                    "%s: %lld is out of range (%" PRId64 "..%" PRId64 ")",
                    p->name, v, p->min, p->max);
            return -1;
        }
        *num = v;
        return 0;
    }
    case PROP_ENUM: {
        char allowed[128] = "";
        for (int i = 0; p->enums[i]; i++) {
            if (!strcmp(p->enums[i], value)) {
                *idx = i;
                return 0;
            }
            if (i)
                strncat(allowed, ", ", sizeof(allowed) - strlen(allowed) - 1);
            strncat(allowed, p->enums[i],
                    sizeof(allowed) - strlen(allowed) - 1);
        }
        err_set(errstr, errstr_size, "%s: \"%s\" is not one of: %s", p->name,
                value, allowed);
        return -1;
    }
    }
    return -1;
}

/* The generic setter: validates `value` (prop_check), then stores it in
 * its field, or as text for a handler's key. */
static int prop_set(idem_conf_t *conf, const prop_t *p, const char *value,
                    char *errstr, size_t errstr_size)
{
    int64_t num = 0;
    int idx = 0;
    if (p->type != PROP_STR &&
        prop_check(p, value, &num, &idx, errstr, errstr_size))
        return -1;
    if (p->offset == PROP_HKEY) {
        hkey_store(conf, p->name, value ? value : "");
        return 0;
    }
    char *field = (char *)conf + p->offset;
    switch (p->type) {
    case PROP_STR: {
        char **str = (char **)field;
        free(*str);
        *str = value ? idem_xstrdup(value) : NULL;
        break;
    }
    case PROP_INT:
        *(int64_t *)field = num;
        break;
    case PROP_ENUM:
        *(int *)field = idx;
        break;
    }
    return 0;
}

int idem_conf_set(idem_conf_t *conf, const char *key, const char *value,
                  char *errstr, size_t errstr_size)
{
    /* An exact key first: some keys end in ".file" themselves
     * (redis.tls.ca.file); "<key>.file" means "read <key> from a file". */
    const prop_t *p = prop_find(key);
    if (p)
        return prop_set(conf, p, value, errstr, errstr_size);
    /* A key a handler declares, exactly (script.file ends in ".file"). */
    const idem_conf_key_t *decl = NULL;
    if (idem_handler_key(key, &decl) && decl) {
        prop_t hp = prop_from_key(decl);
        return prop_set(conf, &hp, value, errstr, errstr_size);
    }
    size_t klen = strlen(key);
    if (klen > 5 && !strcmp(key + klen - 5, ".file")) {
        char base[256];
        if (klen - 5 >= sizeof(base)) {
            err_set(errstr, errstr_size, "%s: key too long", key);
            return -1;
        }
        memcpy(base, key, klen - 5);
        base[klen - 5] = '\0';
        char *content = read_secret_file(key, value, errstr, errstr_size);
        if (!content)
            return -1;
        int r = idem_conf_set(conf, base, content, errstr, errstr_size);
        memset(content, 0, strlen(content));
        free(content);
        return r;
    }

    if (!strncmp(key, "kafka.", 6) && key[6])
        return kafka_set(conf, key + 6, value, errstr, errstr_size);

    if (idem_handler_key(key, &decl)) {
        prop_t hp = decl ? prop_from_key(decl) : prop_prefixed(key);
        return prop_set(conf, &hp, value, errstr, errstr_size);
    }

    const char *hint = closest_key(key);
    if (hint)
        err_set(errstr, errstr_size,
                "%s: unknown configuration key (did you mean \"%s\"?)", key,
                hint);
    else
        err_set(errstr, errstr_size,
                "%s: unknown configuration key (see 'idemproc help config')",
                key);
    return -1;
}

idem_conf_t *idem_conf_new(void)
{
    idem_conf_t *conf = idem_xcalloc(1, sizeof(*conf));
    char errstr[256];
    for (size_t i = 0; i < PROP_CNT; i++) {
        if (props[i].def &&
            prop_set(conf, &props[i], props[i].def, errstr, sizeof(errstr)))
            abort(); /* a bad default is a bug in the table */
    }
    return conf;
}

void idem_conf_destroy(idem_conf_t *conf)
{
    if (!conf)
        return;
    for (size_t i = 0; i < PROP_CNT; i++)
        if (props[i].type == PROP_STR)
            free(*(char **)((char *)conf + props[i].offset));
    for (size_t i = 0; i < conf->kafka_cnt; i++) {
        free(conf->kafka[i].name);
        free(conf->kafka[i].value);
    }
    free(conf->kafka);
    for (size_t i = 0; i < conf->hkeys_cnt; i++) {
        free(conf->hkeys[i].name);
        free(conf->hkeys[i].value);
    }
    free(conf->hkeys);
    free(conf);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

int idem_conf_load_file(idem_conf_t *conf, const char *path, char *errstr,
                        size_t errstr_size)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        err_set(errstr, errstr_size, "%s: cannot open: %s", path,
                strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    int lineno = 0;
    int r = 0;
    while ((len = getline(&line, &line_cap, fp)) >= 0) {
        lineno++;
        /* A NUL byte would end the value early, silently: a key, a URL or
         * a password cut short is worse than a refusal. */
        if (memchr(line, '\0', (size_t)len)) {
            err_set(errstr, errstr_size,
                    "%s:%d: a NUL byte in the line (a binary file, or a "
                    "value that cannot be a C string)",
                    path, lineno);
            r = -1;
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#' || *s == '!')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            err_set(errstr, errstr_size,
                    "%s:%d: expected key=value, got \"%s\"", path, lineno, s);
            r = -1;
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        char sub[512];
        if (idem_conf_set(conf, key, value, sub, sizeof(sub))) {
            err_set(errstr, errstr_size, "%s:%d: %s", path, lineno, sub);
            r = -1;
            break;
        }
    }
    free(line);
    fclose(fp);
    return r;
}

/* IDEMPROC_<KEY>: the key upper-cased with '.' and '-' as '_'. */
static void env_name(const char *key, char *out, size_t out_size)
{
    size_t n = (size_t)snprintf(out, out_size, "IDEMPROC_");
    for (; *key && n + 1 < out_size; key++)
        out[n++] = (*key == '.' || *key == '-')
                       ? '_'
                       : (char)toupper((unsigned char)*key);
    out[n] = '\0';
}

/* Maps an environment variable name to a key: a table key (with or without
 * a _FILE suffix) or KAFKA_<PROP> -> kafka.<prop> with '_' as '.'. */
static int env_key(const char *var, char *key, size_t key_size)
{
    char name[256];
    for (size_t i = 0; i < PROP_CNT; i++) {
        env_name(props[i].name, name, sizeof(name));
        size_t nl = strlen(name);
        if (!strcmp(var, name)) {
            snprintf(key, key_size, "%s", props[i].name);
            return 0;
        }
        if (!strncmp(var, name, nl) && !strcmp(var + nl, "_FILE")) {
            snprintf(key, key_size, "%s.file", props[i].name);
            return 0;
        }
    }
    if (!strncmp(var, "IDEMPROC_KAFKA_", 15) && var[15]) {
        size_t n = (size_t)snprintf(key, key_size, "kafka.");
        for (const char *c = var + 15; *c && n + 1 < key_size; c++)
            key[n++] = *c == '_' ? '.' : (char)tolower((unsigned char)*c);
        key[n] = '\0';
        return 0;
    }
    /* A handler's keys: declared ones by name (IDEMPROC_WEBHOOK_URL,
     * ..._FILE), and any key under a handler's prefix
     * (IDEMPROC_PLUGIN_<NAME> -> plugin.<name>, '_' -> '.'). */
    const idem_handler_ops_t *h;
    for (size_t i = 0; (h = idem_handler_at(i)); i++) {
        for (const idem_conf_key_t *k = h->keys; k && k->name; k++) {
            env_name(k->name, name, sizeof(name));
            size_t nl = strlen(name);
            if (!strcmp(var, name)) {
                snprintf(key, key_size, "%s", k->name);
                return 0;
            }
            if (!strncmp(var, name, nl) && !strcmp(var + nl, "_FILE")) {
                snprintf(key, key_size, "%s.file", k->name);
                return 0;
            }
        }
        if (!h->key_prefix)
            continue;
        env_name(h->key_prefix, name, sizeof(name)); /* "IDEMPROC_PLUGIN_" */
        size_t nl = strlen(name);
        if (!strncmp(var, name, nl) && var[nl]) {
            size_t n = (size_t)snprintf(key, key_size, "%s", h->key_prefix);
            for (const char *c = var + nl; *c && n + 1 < key_size; c++)
                key[n++] = *c == '_' ? '.' : (char)tolower((unsigned char)*c);
            key[n] = '\0';
            return 0;
        }
    }
    return -1;
}

/* The environment name of the table key closest to `var` (a typo such as
 * IDEMPROC_GROUPID), or NULL when none is plausibly meant. Returns a
 * static buffer. */
static const char *closest_env(const char *var)
{
    static char best[256];
    char name[256];
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < PROP_CNT; i++) {
        env_name(props[i].name, name, sizeof(name));
        size_t d = edit_distance(var, name);
        if (d < best_d) {
            best_d = d;
            snprintf(best, sizeof(best), "%s", name);
        }
    }
    size_t rest = strlen(var) > 9 ? strlen(var) - 9 : 0;
    return best_d <= 1 + rest / 4 ? best : NULL;
}

int idem_conf_load_env(idem_conf_t *conf, char **envp, char *errstr,
                       size_t errstr_size)
{
    for (char **e = envp; e && *e; e++) {
        if (strncmp(*e, "IDEMPROC_", 9))
            continue;
        const char *eq = strchr(*e, '=');
        if (!eq)
            continue;
        char var[256], key[256], sub[512];
        size_t vl = (size_t)(eq - *e);
        if (vl >= sizeof(var))
            continue;
        memcpy(var, *e, vl);
        var[vl] = '\0';
        if (!strcmp(var, "IDEMPROC_BIN") || !strcmp(var, "IDEMPROC_SRC"))
            continue; /* test harness variables, not configuration */
        if (env_key(var, key, sizeof(key))) {
            const char *hint = closest_env(var);
            if (hint)
                err_set(errstr, errstr_size,
                        "%s: environment variable names no configuration key "
                        "(did you mean %s?)",
                        var, hint);
            else
                err_set(errstr, errstr_size,
                        "%s: environment variable names no configuration key "
                        "(IDEMPROC_<KEY>: the key upper-cased, '.' and '-' "
                        "as '_')",
                        var);
            return -1;
        }
        if (idem_conf_set(conf, key, eq + 1, sub, sizeof(sub))) {
            err_set(errstr, errstr_size, "%s (from %s)", sub, var);
            return -1;
        }
    }
    return 0;
}

int idem_conf_apply_kafka(const idem_conf_t *conf, rd_kafka_conf_t *kconf,
                          char *errstr, size_t errstr_size)
{
    char kerr[512];
    if (conf->bootstrap_servers &&
        rd_kafka_conf_set(kconf, "bootstrap.servers", conf->bootstrap_servers,
                          kerr, sizeof(kerr)) != RD_KAFKA_CONF_OK) {
        err_set(errstr, errstr_size, "kafka.bootstrap.servers: %s", kerr);
        return -1;
    }
    for (size_t i = 0; i < conf->kafka_cnt; i++) {
        if (rd_kafka_conf_set(kconf, conf->kafka[i].name, conf->kafka[i].value,
                              kerr, sizeof(kerr)) != RD_KAFKA_CONF_OK) {
            err_set(errstr, errstr_size, "kafka.%s: %s", conf->kafka[i].name,
                    kerr);
            return -1;
        }
    }
    return 0;
}

#define REGEX_SIZE_MAX 1000 /* copies of a subexpression a regex may make */

/* An upper bound of how many copies of a subexpression compiling `re`
 * makes: glibc's regcomp copies the operand of '+' once and of {m,n} n
 * times, and nested or stacked repetitions multiply (`^a+++...` with 40
 * '+' asks for 2^40 copies: gigabytes and minutes). The product of every
 * repetition's factor bounds it whatever the nesting. */
static double regex_size_bound(const char *re)
{
    double bound = 1;
    for (const char *p = re; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
        } else if (*p == '[') { /* a bracket expression: no operators */
            const char *q = p + 1;
            if (*q == '^')
                q++;
            if (*q == ']')
                q++;
            while (*q && *q != ']')
                q++;
            if (!*q)
                break;
            p = q;
        } else if (*p == '+') {
            bound *= 2;
        } else if (*p == '{') {
            char *end;
            double m = strtod(p + 1, &end), n = m;
            if (*end == ',')
                n = end[1] == '}' ? m + 1 : strtod(end + 1, &end);
            double f = (n > m ? n : m) + 1;
            bound *= f >= 1 ? f : 1; /* (not a count: regcomp refuses it) */
        }
        if (bound > 1e12)
            return bound;
    }
    return bound;
}

/* Whether input entry `entry` (a name, or "^regex" as librdkafka takes
 * it) would consume `topic`. Returns 1, 0, or -1 with errstr for a regex
 * that does not compile. POSIX extended syntax is close enough to
 * librdkafka's for this safety check. */
static int topic_matches(const char *entry, const char *topic, char *errstr,
                         size_t errstr_size)
{
    if (*entry != '^')
        return !strcmp(entry, topic);
    if (regex_size_bound(entry) > REGEX_SIZE_MAX) {
        err_set(errstr, errstr_size,
                "input.topics: regex \"%s\" repeats too much (nested or "
                "stacked +, {m,n}: at most %d copies in all)",
                entry, REGEX_SIZE_MAX);
        return -1;
    }
    regex_t re;
    int rc = regcomp(&re, entry, REG_EXTENDED | REG_NOSUB);
    if (rc) {
        char msg[128];
        regerror(rc, &re, msg, sizeof(msg));
        err_set(errstr, errstr_size, "input.topics: bad regex \"%s\": %s",
                entry, msg);
        return -1;
    }
    int hit = regexec(&re, topic, 0, NULL, 0) == 0;
    regfree(&re);
    return hit;
}

/* Whether s is a SQL identifier we may put into a statement unquoted:
 * [schema.]name, letters, digits and '_', not starting with a digit. */
static int is_sql_name(const char *s)
{
    int parts = 0;
    for (;;) {
        if (!isalpha((unsigned char)*s) && *s != '_')
            return 0;
        while (isalnum((unsigned char)*s) || *s == '_')
            s++;
        parts++;
        if (!*s)
            return 1;
        if (*s != '.' || parts == 2)
            return 0;
        s++;
    }
}

/* The outbox relay's checks: it needs Kafka and PostgreSQL, no group,
 * topics or Redis. */
static int finalize_outbox(idem_conf_t *conf, char *errstr, size_t errstr_size)
{
    if (!conf->bootstrap_servers || !*conf->bootstrap_servers) {
        err_set(errstr, errstr_size,
                "kafka.bootstrap.servers: required but not set");
        return -1;
    }
    if (!conf->outbox_dsn || !*conf->outbox_dsn) {
        err_set(errstr, errstr_size, "outbox.dsn: required but not set");
        return -1;
    }
    if (!conf->outbox_table || strlen(conf->outbox_table) > 127 ||
        !is_sql_name(conf->outbox_table)) {
        err_set(errstr, errstr_size,
                "outbox.table: \"%s\" is not a [schema.]name of letters, "
                "digits and _",
                conf->outbox_table ? conf->outbox_table : "");
        return -1;
    }
    /* Checked here, not row by row: a bad default would fail every row
     * whose topic column is NULL. */
    if (conf->outbox_topic && *conf->outbox_topic &&
        idem_outboxrow_topic_check(conf->outbox_topic, errstr, errstr_size)) {
        char why[256];
        snprintf(why, sizeof(why), "%s", errstr);
        err_set(errstr, errstr_size, "outbox.%s", why);
        return -1;
    }
    if (!conf->member_id || !*conf->member_id) {
        char host[128] = "idemproc";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        char id[192];
        snprintf(id, sizeof(id), "%s-%ld", host, (long)getpid());
        free(conf->member_id);
        conf->member_id = idem_xstrdup(id);
    }
    rd_kafka_conf_t *kconf = rd_kafka_conf_new();
    int r = idem_conf_apply_kafka(conf, kconf, errstr, errstr_size);
    rd_kafka_conf_destroy(kconf);
    return r;
}

int idem_conf_finalize_scope(idem_conf_t *conf, idem_conf_scope_t scope,
                             char *errstr, size_t errstr_size)
{
    if (scope == IDEM_CONF_SCOPE_OUTBOX)
        return finalize_outbox(conf, errstr, errstr_size);
    return idem_conf_finalize(conf, errstr, errstr_size);
}

/* Whether `name` is one of the comma-listed topics of `list`. */
static int topic_listed(const char *list, const char *name)
{
    size_t nl = strlen(name);
    for (const char *t = list; *t;) {
        while (*t == ' ' || *t == ',')
            t++;
        const char *e = t;
        while (*e && *e != ',')
            e++;
        const char *te = e;
        while (te > t && te[-1] == ' ')
            te--;
        if ((size_t)(te - t) == nl && !memcmp(t, name, nl))
            return 1;
        t = e;
    }
    return 0;
}

/* retry.topics: the delays, and topic names that cannot clash with the
 * input, DLQ or output topics (a record would be consumed twice, or a
 * dead letter retried). */
static int finalize_retry_topics(idem_conf_t *conf,
                                 const idem_handler_ops_t *handler,
                                 char *errstr, size_t errstr_size)
{
    if (idem_retrytopic_parse(conf->retry_topics, conf->retry_delays_ms,
                              &conf->retry_tiers, errstr, errstr_size))
        return -1;
    if (!conf->retry_tiers)
        return 0;
    if (strchr(conf->input_topics, '^')) {
        err_set(errstr, errstr_size,
                "retry.topics: not possible with a regex in input.topics "
                "(\"%s\"): retry topics are named after each input topic",
                conf->input_topics);
        return -1;
    }
    const char *out =
        handler == &idem_handler_forward ? conf->output_topic : NULL;
    idem_retrytopics_t *rt = idem_retrytopics_new(
        conf->input_topics, conf->retry_delays_ms, conf->retry_tiers);
    int r = 0;
    for (size_t i = 0; !r && i < idem_retrytopics_count(rt); i++) {
        const char *name = idem_retrytopics_at(rt, i);
        const char *clash = NULL;
        if (strlen(name) > 249)
            clash = "longer than the 249 characters Kafka allows:";
        else if (!strcmp(name, conf->dlq_topic))
            clash = "the dlq.topic";
        else if (out && !strcmp(name, out))
            clash = "the output.topic";
        else if (topic_listed(conf->input_topics, name))
            clash = "also in input.topics";
        if (clash) {
            err_set(errstr, errstr_size,
                    "retry.topics: the retry topic \"%s\" is %s", name, clash);
            r = -1;
        }
    }
    idem_retrytopics_destroy(rt);
    return r;
}

int idem_conf_finalize(idem_conf_t *conf, char *errstr, size_t errstr_size)
{
    for (size_t i = 0; i < PROP_CNT; i++) {
        const prop_t *p = &props[i];
        if (p->required && p->type == PROP_STR) {
            char *v = *(char **)((char *)conf + p->offset);
            if (!v || !*v) {
                err_set(errstr, errstr_size, "%s: required but not set",
                        p->name);
                return -1;
            }
        }
    }
    if (!conf->redis_url || !*conf->redis_url) {
        err_set(errstr, errstr_size,
                "redis.url: empty (leave it out for the default "
                "redis://127.0.0.1:6379/0)");
        return -1;
    }
    if (idem_redisconn_conf_check(conf, errstr, errstr_size))
        return -1;
    /* Both go into Redis key names: a ':' in the group would make two
     * groups' dedup keys collide, glob characters in the prefix would
     * break the SCAN MATCH that verify uses. */
    if (strchr(conf->group_id, ':')) {
        err_set(errstr, errstr_size,
                "group.id: \"%s\" may not contain ':' (it is part of the "
                "Redis dedup keys)",
                conf->group_id);
        return -1;
    }
    if (strpbrk(conf->redis_prefix, "*?[]\\")) {
        err_set(errstr, errstr_size,
                "redis.prefix: \"%s\" may not contain * ? [ ] or \\",
                conf->redis_prefix);
        return -1;
    }
    if (conf->fetch_stall_ms > 0 && conf->stats_interval_ms > 0 &&
        conf->fetch_stall_ms < conf->stats_interval_ms) {
        err_set(errstr, errstr_size,
                "fetch.stall.ms: %" PRId64
                " is below stats.interval.ms %" PRId64
                " (a stall is judged from statistics: use at least "
                "stats.interval.ms, or 0 for no watch)",
                conf->fetch_stall_ms, conf->stats_interval_ms);
        return -1;
    }
    if (idem_fetchwatch_fault_check(conf->fault_fetch_pause, errstr,
                                    errstr_size))
        return -1;
    const char *harg;
    const idem_handler_ops_t *handler =
        idem_handler_find(conf->handler, &harg, errstr, errstr_size);
    if (!handler)
        return -1;
    for (const idem_conf_key_t *k = handler->keys; k && k->name; k++) {
        const char *v = idem_conf_str(conf, k->name);
        if (k->required && (!v || !*v)) {
            err_set(errstr, errstr_size, "%s: required when handler=%s",
                    k->name, handler->name);
            return -1;
        }
    }
    if (idem_envelope_sources_check("envelope.identity",
                                    conf->envelope_identity, 0, errstr,
                                    errstr_size) ||
        idem_envelope_sources_check("envelope.message.id",
                                    conf->envelope_message_id, 1, errstr,
                                    errstr_size))
        return -1;
    if (handler->needs_payment && conf->envelope_format != IDEM_ENVELOPE_JSON) {
        err_set(errstr, errstr_size,
                "envelope.format: handler=%s reads payment fields from a "
                "JSON value; bytes is not possible with it",
                handler->name);
        return -1;
    }
    if (handler->validate && handler->validate(conf, harg, errstr, errstr_size))
        return -1;
    if (conf->retry_backoff_initial_ms > conf->retry_backoff_max_ms) {
        err_set(errstr, errstr_size,
                "retry.backoff.initial.ms: %" PRId64
                " is above retry.backoff.max.ms (%" PRId64 ")",
                conf->retry_backoff_initial_ms, conf->retry_backoff_max_ms);
        return -1;
    }
    /* A topic may not feed itself: the DLQ or the output would be consumed
     * again as input. */
    char *topics = idem_xstrdup(conf->input_topics);
    char *rest = topics;
    int r = 0;
    for (char *t = strsep(&rest, ","); t; t = strsep(&rest, ",")) {
        t = trim(t);
        if (!*t) {
            err_set(errstr, errstr_size,
                    "input.topics: empty topic name in \"%s\"",
                    conf->input_topics);
            r = -1;
            break;
        }
        const char *out = handler == &idem_handler_forward &&
                                  conf->output_topic && *conf->output_topic
                              ? conf->output_topic
                              : NULL;
        int hit = topic_matches(t, conf->dlq_topic, errstr, errstr_size);
        const char *which = "dlq";
        if (hit == 0 && out) {
            hit = topic_matches(t, out, errstr, errstr_size);
            which = "output";
        }
        if (hit < 0) {
            r = -1;
            break;
        }
        if (hit) {
            err_set(errstr, errstr_size,
                    "input.topics: \"%s\" %s the %s topic \"%s\"", t,
                    *t == '^' ? "matches" : "is also", which,
                    !strcmp(which, "dlq") ? conf->dlq_topic : out);
            r = -1;
            break;
        }
    }
    free(topics);
    if (r || finalize_retry_topics(conf, handler, errstr, errstr_size))
        return -1;
    if (!conf->member_id || !*conf->member_id) {
        char host[128] = "idemproc";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        char id[192];
        snprintf(id, sizeof(id), "%s-%ld", host, (long)getpid());
        free(conf->member_id);
        conf->member_id = idem_xstrdup(id);
    }
    /* Let librdkafka judge every pass-through property now, so a typo is a
     * configuration error (exit 2) and not a runtime failure. */
    rd_kafka_conf_t *kconf = rd_kafka_conf_new();
    r = idem_conf_apply_kafka(conf, kconf, errstr, errstr_size);
    rd_kafka_conf_destroy(kconf);
    return r;
}

idem_conf_t *idem_conf_load(const char *path, char **envp, char **sets,
                            size_t set_cnt, char *errstr, size_t errstr_size)
{
    return idem_conf_load_scope(path, envp, sets, set_cnt,
                                IDEM_CONF_SCOPE_PROCESSOR, errstr, errstr_size);
}

idem_conf_t *idem_conf_load_scope(const char *path, char **envp, char **sets,
                                  size_t set_cnt, idem_conf_scope_t scope,
                                  char *errstr, size_t errstr_size)
{
    idem_conf_t *conf = idem_conf_new();
    conf->scope = scope;
    if (path && idem_conf_load_file(conf, path, errstr, errstr_size))
        goto fail;
    if (idem_conf_load_env(conf, envp, errstr, errstr_size))
        goto fail;
    for (size_t i = 0; i < set_cnt; i++) {
        char *eq = strchr(sets[i], '=');
        if (!eq) {
            err_set(errstr, errstr_size,
                    "--set: expected key=value, got \"%s\"", sets[i]);
            goto fail;
        }
        char key[256];
        size_t kl = (size_t)(eq - sets[i]);
        if (kl >= sizeof(key))
            kl = sizeof(key) - 1;
        memcpy(key, sets[i], kl);
        key[kl] = '\0';
        if (idem_conf_set(conf, key, eq + 1, errstr, errstr_size))
            goto fail;
    }
    if (idem_conf_finalize_scope(conf, scope, errstr, errstr_size))
        goto fail;
    return conf;
fail:
    idem_conf_destroy(conf);
    return NULL;
}

/* Formats the value of a property as text into `buf`; secrets masked. */
static const char *prop_value(const idem_conf_t *conf, const prop_t *p,
                              char *buf, size_t size)
{
    if (p->offset == PROP_HKEY) {
        const char *v = hkey_get(conf, p->name);
        if (!v)
            v = p->def;
        if (!v)
            return "";
        return p->secret && *v ? "[redacted]" : v;
    }
    const char *field = (const char *)conf + p->offset;
    switch (p->type) {
    case PROP_STR: {
        const char *s = *(char *const *)field;
        if (!s)
            return "";
        if (p->secret)
            return "[redacted]";
        if (!strcmp(p->name, "redis.url"))
            return idem_redisconn_url_redact(s, buf, size);
        return s;
    }
    case PROP_INT:
        snprintf(buf, size, "%" PRId64, *(const int64_t *)field);
        return buf;
    case PROP_ENUM:
        return p->enums[*(const int *)field];
    }
    return "";
}

void idem_conf_dump(const idem_conf_t *conf, FILE *out)
{
    char buf[1024];
    for (size_t i = 0; i < PROP_CNT; i++)
        fprintf(out, "%s=%s\n", props[i].name,
                prop_value(conf, &props[i], buf, sizeof(buf)));
    for (size_t i = 0; i < conf->kafka_cnt; i++)
        fprintf(out, "kafka.%s=%s\n", conf->kafka[i].name,
                idem_conf_kafka_prop_is_secret(conf->kafka[i].name)
                    ? "[redacted]"
                    : conf->kafka[i].value);
    /* The keys of the handler that runs, then any other handler key set. */
    const idem_handler_ops_t *run =
        idem_handler_find(conf->handler, NULL, buf, sizeof(buf));
    for (const idem_conf_key_t *k = run ? run->keys : NULL; k && k->name; k++) {
        prop_t hp = prop_from_key(k);
        fprintf(out, "%s=%s\n", k->name,
                prop_value(conf, &hp, buf, sizeof(buf)));
    }
    for (size_t i = 0; i < conf->hkeys_cnt; i++) {
        const idem_conf_key_t *decl = NULL;
        const idem_handler_ops_t *h =
            idem_handler_key(conf->hkeys[i].name, &decl);
        if (h == run && decl)
            continue; /* printed above */
        prop_t hp =
            decl ? prop_from_key(decl) : prop_prefixed(conf->hkeys[i].name);
        if (!decl)
            hp.secret = 1; /* a plugin's key: it may be a secret */
        fprintf(out, "%s=%s\n", conf->hkeys[i].name,
                prop_value(conf, &hp, buf, sizeof(buf)));
    }
}

static void prop_type_text(const prop_t *p, char *buf, size_t size)
{
    switch (p->type) {
    case PROP_STR:
        snprintf(buf, size, "string");
        break;
    case PROP_INT:
        snprintf(buf, size, "integer %" PRId64 "..%" PRId64, p->min, p->max);
        break;
    case PROP_ENUM: {
        size_t n = 0;
        buf[0] = '\0';
        for (int i = 0; p->enums[i] && n < size; i++)
            n += (size_t)snprintf(buf + n, size - n, "%s%s",
                                  i ? ", " : "one of: ", p->enums[i]);
        break;
    }
    }
}

void idem_conf_print_help(FILE *out)
{
    char type[128];
    fprintf(out, "Configuration keys (file key=value < IDEMPROC_<KEY> "
                 "environment < --set key=value):\n\n");
    for (size_t i = 0; i < PROP_CNT; i++) {
        const prop_t *p = &props[i];
        prop_type_text(p, type, sizeof(type));
        fprintf(out, "  %-26s %s%s%s\n", p->name, type,
                p->required ? ", required" : "", p->secret ? ", secret" : "");
        fprintf(out, "  %-26s default: %s\n", "", p->def ? p->def : "(none)");
        fprintf(out, "  %-26s %s\n\n", "", p->doc);
    }
    const idem_handler_ops_t *h;
    for (size_t i = 0; (h = idem_handler_at(i)); i++) {
        fprintf(out, "handler=%s%s: %s\n", h->name, h->takes_arg ? ":ARG" : "",
                h->doc);
        if (h->key_prefix)
            fprintf(out, "  %s<name>%*s passed to it as text\n", h->key_prefix,
                    (int)(20 - strlen(h->key_prefix)), "");
        for (const idem_conf_key_t *k = h->keys; k && k->name; k++) {
            prop_t hp = prop_from_key(k);
            prop_type_text(&hp, type, sizeof(type));
            fprintf(out, "  %-26s %s%s%s\n", k->name, type,
                    k->required ? ", required" : "",
                    k->secret ? ", secret" : "");
            fprintf(out, "  %-26s default: %s\n", "",
                    k->def ? k->def : "(none)");
            fprintf(out, "  %-26s %s\n", "", k->doc);
        }
        fprintf(out, "\n");
    }
    fprintf(out, "  kafka.<property>           passed to librdkafka unchanged "
                 "(see its CONFIGURATION.md),\n"
                 "                             except the ones idemproc sets "
                 "itself (an error says\n"
                 "                             what to use instead)\n"
                 "  <key>.file                 read <key>'s value from a file "
                 "(e.g. a mounted Secret)\n");
}

void idem_conf_print_markdown(FILE *out)
{
    char type[128];
    fprintf(out, "| key | type | default | description |\n");
    fprintf(out, "| --- | --- | --- | --- |\n");
    for (size_t i = 0; i < PROP_CNT; i++) {
        const prop_t *p = &props[i];
        prop_type_text(p, type, sizeof(type));
        fprintf(out, "| `%s` | %s%s%s | %s%s%s | %s |\n", p->name, type,
                p->required ? ", required" : "", p->secret ? ", secret" : "",
                p->def ? "`" : "", p->def ? p->def : "", p->def ? "`" : "",
                p->doc);
    }
    const idem_handler_ops_t *h;
    for (size_t i = 0; (h = idem_handler_at(i)); i++) {
        if (h->key_prefix)
            fprintf(out,
                    "| `%s<name>` | string | | with `handler=%s%s`: passed to "
                    "it as text |\n",
                    h->key_prefix, h->name, h->takes_arg ? ":ARG" : "");
        for (const idem_conf_key_t *k = h->keys; k && k->name; k++) {
            prop_t hp = prop_from_key(k);
            prop_type_text(&hp, type, sizeof(type));
            fprintf(out, "| `%s` | %s%s%s | %s%s%s | with `handler=%s`: %s |\n",
                    k->name, type, k->required ? ", required" : "",
                    k->secret ? ", secret" : "", k->def ? "`" : "",
                    k->def ? k->def : "", k->def ? "`" : "", h->name, k->doc);
        }
    }
    fprintf(out, "| `kafka.<property>` | string | | passed to librdkafka "
                 "unchanged (SASL, SSL, tuning), except the ones idemproc "
                 "sets itself |\n");
    fprintf(out, "| `<key>.file` | path | | read the key's value from a file "
                 "(mounted Secret) |\n");
}
