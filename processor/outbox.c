/* outbox: the transactional outbox relay: claims committed rows of a
 * PostgreSQL outbox table, publishes them with the idempotent producer and
 * marks (or deletes) them in the transaction that claimed them. */
#include "outbox.h"
#include "kafka.h"
#include "log.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>

/* Rows of one key are claimed by one relay at a time: each claim takes a
 * transaction-scoped advisory lock on the key's bucket (hashtext(key) mod
 * this) and skips rows whose bucket another relay holds. Buckets rather
 * than keys keep a batch's locks well inside PostgreSQL's shared lock
 * table (max_locks_per_transaction x max_connections). */
#define KEY_BUCKETS 1024

#define WAIT_SLICE_MS  100 /* longest sleep between looks at *stop */
#define WAIT_BEHIND_MS 20  /* next look when rows waited behind others */

typedef enum {
    ROW_PENDING = 0, /* produced, no delivery report yet */
    ROW_DELIVERED,   /* acknowledged by the broker: mark it */
    ROW_FAILED,      /* the broker will never take it: error column */
    ROW_RETRY,       /* not delivered (outage): leave it for later */
    ROW_WAIT         /* an older row of its key is pending elsewhere */
} row_state_t;

typedef struct {
    int64_t id;
    int64_t created_ms; /* wall clock, from created_at */
    row_state_t state;
    char error[200]; /* ROW_FAILED / ROW_RETRY: why */
} row_t;

/* A fixed-bound histogram (seconds or rows); guarded by the relay's lock. */
typedef struct {
    const double *bounds;
    size_t nbounds;
    uint64_t buckets[20];
    uint64_t count;
    double sum;
} hist_t;

static const double latency_bounds[] = {0.001, 0.002, 0.005, 0.01,  0.015, 0.02,
                                        0.03,  0.04,  0.05,  0.075, 0.1,   0.25,
                                        0.5,   1,     2.5,   5,     10};
static const double batch_bounds[] = {1,   10,   50,   100,  250,
                                      500, 1000, 2500, 5000, 10000};

struct idem_outbox_s {
    const idem_conf_t *conf; /* borrowed */
    idem_metrics_t *m;       /* borrowed */
    rd_kafka_t *rk;
    PGconn *pg; /* NULL while disconnected */
    char channel[128];
    char sql_done[256]; /* mark or delete the delivered rows */
    char sql_fail[256]; /* set a row's error */
    int value_is_bytea;
    int64_t backoff_ms;
    int64_t next_lag_ms; /* idem_now_ms() of the next lag query */
    int kafka_down;      /* all brokers down: not ready until a probe works */
    int64_t next_probe_ms;

    row_t *rows; /* outbox.batch.max entries, reused every batch */
    size_t outstanding;

    _Atomic uint64_t published;
    _Atomic uint64_t failed;
    _Atomic uint64_t db_errors;
    _Atomic uint64_t kafka_errors;
    _Atomic int64_t lag_rows;
    _Atomic int64_t lag_ms; /* age of the oldest unpublished row */

    pthread_mutex_t lock; /* guards the histograms */
    hist_t batch;
    hist_t latency;
};

int idem_outbox_err_is_permanent(int err)
{
    switch ((rd_kafka_resp_err_t)err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
        return 1;
    default:
        return 0;
    }
}

static void hist_observe(hist_t *h, double v)
{
    size_t i = 0;
    while (i < h->nbounds && v > h->bounds[i])
        i++;
    h->buckets[i]++;
    h->count++;
    h->sum += v;
}

static void hist_render(FILE *out, const char *name, const char *help,
                        const hist_t *h)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i <= h->nbounds; i++) {
        cum += h->buckets[i];
        if (i < h->nbounds)
            fprintf(out, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name,
                    h->bounds[i], cum);
        else
            fprintf(out, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    }
    fprintf(out, "%s_sum %.6f\n%s_count %" PRIu64 "\n", name, h->sum, name,
            h->count);
}

/* idem_metrics_render_cb: the idemproc_outbox_* metrics. HTTP thread. */
static void outbox_render(void *opaque, FILE *out)
{
    idem_outbox_t *o = opaque;
    fprintf(out,
            "# HELP idemproc_outbox_published_total Outbox rows published "
            "and acknowledged by the broker.\n"
            "# TYPE idemproc_outbox_published_total counter\n"
            "idemproc_outbox_published_total %" PRIu64 "\n"
            "# HELP idemproc_outbox_failed_total Outbox rows the broker can "
            "never take, marked with an error.\n"
            "# TYPE idemproc_outbox_failed_total counter\n"
            "idemproc_outbox_failed_total %" PRIu64 "\n"
            "# HELP idemproc_outbox_errors_total Failed batches by cause "
            "(database or kafka); they are retried.\n"
            "# TYPE idemproc_outbox_errors_total counter\n"
            "idemproc_outbox_errors_total{cause=\"database\"} %" PRIu64 "\n"
            "idemproc_outbox_errors_total{cause=\"kafka\"} %" PRIu64 "\n"
            "# HELP idemproc_outbox_lag_rows Unpublished outbox rows.\n"
            "# TYPE idemproc_outbox_lag_rows gauge\n"
            "idemproc_outbox_lag_rows %" PRId64 "\n"
            "# HELP idemproc_outbox_lag_seconds Age of the oldest "
            "unpublished outbox row (0: none).\n"
            "# TYPE idemproc_outbox_lag_seconds gauge\n"
            "idemproc_outbox_lag_seconds %.3f\n",
            atomic_load(&o->published), atomic_load(&o->failed),
            atomic_load(&o->db_errors), atomic_load(&o->kafka_errors),
            atomic_load(&o->lag_rows), (double)atomic_load(&o->lag_ms) / 1e3);
    pthread_mutex_lock(&o->lock);
    hist_t batch = o->batch, latency = o->latency;
    pthread_mutex_unlock(&o->lock);
    hist_render(out, "idemproc_outbox_batch_size",
                "Rows claimed per outbox transaction.", &batch);
    hist_render(out, "idemproc_outbox_publish_latency_seconds",
                "From a row's created_at to its delivery report.", &latency);
}

/* dr_msg_cb: fires on the relay's thread inside rd_kafka_poll/flush, once
 * per produced record; the opaque is the record's row. */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg,
                        void *opaque)
{
    (void)rk;
    idem_outbox_t *o = opaque;
    row_t *row = msg->_private;
    if (o->outstanding > 0)
        o->outstanding--;
    if (!msg->err) {
        row->state = ROW_DELIVERED;
        return;
    }
    row->state =
        idem_outbox_err_is_permanent(msg->err) ? ROW_FAILED : ROW_RETRY;
    snprintf(row->error, sizeof(row->error), "%s", rd_kafka_err2str(msg->err));
}

/* error_cb: fires on the relay's thread inside rd_kafka_poll. With no
 * rows to publish the producer sends nothing, so "all brokers down" is the
 * only sign of an unreachable Kafka an idle relay gets. */
static void on_kafka_error(rd_kafka_t *rk, int err, const char *reason,
                           void *opaque)
{
    (void)rk;
    idem_outbox_t *o = opaque;
    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
        o->kafka_down = 1;
    idem_log_kv(IDEM_LOG_WARN, "outbox producer error", "error",
                rd_kafka_err2str((rd_kafka_resp_err_t)err), "reason", reason,
                NULL);
}

idem_outbox_t *idem_outbox_new(const idem_conf_t *conf, idem_metrics_t *m,
                               char *errstr, size_t errstr_size)
{
    idem_outbox_t *o = idem_xcalloc(1, sizeof(*o));
    o->conf = conf;
    o->m = m;
    o->backoff_ms = conf->retry_backoff_initial_ms;
    pthread_mutex_init(&o->lock, NULL);
    o->batch.bounds = batch_bounds;
    o->batch.nbounds = sizeof(batch_bounds) / sizeof(batch_bounds[0]);
    o->latency.bounds = latency_bounds;
    o->latency.nbounds = sizeof(latency_bounds) / sizeof(latency_bounds[0]);
    o->rows = idem_xcalloc((size_t)conf->outbox_batch_max, sizeof(*o->rows));
    /* The trigger notifies on TG_TABLE_NAME; the table name is used
     * unquoted in SQL, so PostgreSQL folds it to lower case. */
    const char *dot = strchr(conf->outbox_table, '.');
    snprintf(o->channel, sizeof(o->channel), "%s",
             dot ? dot + 1 : conf->outbox_table);
    for (char *c = o->channel; *c; c++)
        *c = (char)tolower((unsigned char)*c);

    rd_kafka_conf_t *kc = idem_kafka_writer_conf(conf, conf->message_max_bytes,
                                                 errstr, errstr_size);
    if (!kc)
        goto fail;
    /* The relay produces a whole batch and then waits for every
     * acknowledgement, so lingering only adds latency: 1 ms. An
     * undelivered row stays unmarked and is published again later, so the
     * relay may also wait less than the writers' message.timeout.ms. A
     * user's kafka.linger.ms / kafka.message.timeout.ms win here. */
    if (idem_kafka_set(kc, "linger.ms", "1", errstr, errstr_size)) {
        rd_kafka_conf_destroy(kc);
        goto fail;
    }
    for (size_t i = 0; i < conf->kafka_cnt; i++)
        if ((!strcmp(conf->kafka[i].name, "message.timeout.ms") ||
             !strcmp(conf->kafka[i].name, "linger.ms")) &&
            idem_kafka_set(kc, conf->kafka[i].name, conf->kafka[i].value,
                           errstr, errstr_size)) {
            rd_kafka_conf_destroy(kc);
            goto fail;
        }
    if (idem_kafka_set(kc, "client.id", conf->member_id, errstr, errstr_size)) {
        rd_kafka_conf_destroy(kc);
        goto fail;
    }
    rd_kafka_conf_set_dr_msg_cb(kc, on_delivery);
    rd_kafka_conf_set_error_cb(kc, on_kafka_error);
    rd_kafka_conf_set_opaque(kc, o);
    o->rk = idem_kafka_new(RD_KAFKA_PRODUCER, kc, "outbox producer", errstr,
                           errstr_size);
    if (!o->rk)
        goto fail;
    atomic_store(&o->lag_rows, -1);
    idem_metrics_set_extra(m, outbox_render, o);
    idem_metrics_ready_set(m, 0, "starting");
    return o;
fail:
    free(o->rows);
    pthread_mutex_destroy(&o->lock);
    free(o);
    return NULL;
}

void idem_outbox_destroy(idem_outbox_t *o)
{
    if (!o)
        return;
    idem_metrics_set_extra(o->m, NULL, NULL);
    if (o->rk) {
        rd_kafka_flush(o->rk, 5000);
        rd_kafka_destroy(o->rk);
    }
    if (o->pg)
        PQfinish(o->pg);
    free(o->rows);
    pthread_mutex_destroy(&o->lock);
    free(o);
}

uint64_t idem_outbox_published(idem_outbox_t *o)
{
    return atomic_load(&o->published);
}

uint64_t idem_outbox_failed(idem_outbox_t *o)
{
    return atomic_load(&o->failed);
}

/* ---- database ----------------------------------------------------------- */

/* The text of the last libpq error, one line. */
static void pg_err(PGconn *pg, const PGresult *res, const char *what,
                   char *errstr, size_t errstr_size)
{
    const char *msg = res ? PQresultErrorMessage(res) : "";
    if (!msg || !*msg)
        msg = PQerrorMessage(pg);
    snprintf(errstr, errstr_size, "%s: %s", what, msg);
    for (char *c = errstr; *c; c++)
        if (*c == '\n')
            *c = *(c + 1) ? ' ' : '\0';
}

/* Runs sql (no parameters) expecting `want`; 0 or -1 with errstr. */
static int pg_exec(idem_outbox_t *o, const char *sql, ExecStatusType want,
                   char *errstr, size_t errstr_size)
{
    PGresult *res = PQexec(o->pg, sql);
    int r = 0;
    if (PQresultStatus(res) != want) {
        pg_err(o->pg, res, sql, errstr, errstr_size);
        r = -1;
    }
    PQclear(res);
    return r;
}

static int pg_prepare(idem_outbox_t *o, const char *name, const char *sql,
                      char *errstr, size_t errstr_size)
{
    PGresult *res = PQprepare(o->pg, name, sql, 0, NULL);
    int r = 0;
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        pg_err(o->pg, res, name, errstr, errstr_size);
        r = -1;
    }
    PQclear(res);
    return r;
}

/* Connects, LISTENs on the table's channel, learns the value column's type
 * and prepares the statements. The DSN is never logged (it may hold the
 * password); the host and database are. 0 or -1 with errstr. */
static int db_connect(idem_outbox_t *o, char *errstr, size_t errstr_size)
{
    const idem_conf_t *c = o->conf;
    /* Later entries win, so the user's DSN overrides our defaults. */
    const char *keys[] = {"connect_timeout",
                          "tcp_user_timeout",
                          "keepalives_idle",
                          "keepalives_interval",
                          "application_name",
                          "dbname",
                          NULL};
    const char *vals[] = {"5",           "10000", "10", "5", "idemproc-outbox",
                          c->outbox_dsn, NULL};
    o->pg = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(o->pg) != CONNECTION_OK) {
        pg_err(o->pg, NULL, "outbox.dsn: cannot connect", errstr, errstr_size);
        goto fail;
    }
    /* The relay's marks need not wait for the WAL flush: a mark lost in a
     * database crash only publishes its rows again, with the same
     * message_id, which downstream dedup absorbs. The rows themselves are
     * the service's commits and keep their durability. */
    if (pg_exec(o, "SET synchronous_commit = off", PGRES_COMMAND_OK, errstr,
                errstr_size))
        goto fail;
    char sql[2048];
    snprintf(sql, sizeof(sql), "LISTEN \"%s\"", o->channel);
    if (pg_exec(o, sql, PGRES_COMMAND_OK, errstr, errstr_size))
        goto fail;

    const char *param[] = {c->outbox_table};
    PGresult *res = PQexecParams(
        o->pg,
        "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass($1) AND a.attname = 'value' AND NOT "
        "a.attisdropped",
        1, NULL, param, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        if (PQresultStatus(res) == PGRES_TUPLES_OK)
            snprintf(errstr, errstr_size,
                     "outbox.table: \"%s\" does not exist or has no value "
                     "column (create it with config/sql/outbox.sql)",
                     c->outbox_table);
        else
            pg_err(o->pg, res, "outbox.table", errstr, errstr_size);
        PQclear(res);
        goto fail;
    }
    o->value_is_bytea = !strcmp(PQgetvalue(res, 0, 0), "bytea");
    PQclear(res);

    const char *t = c->outbox_table;
    /* c: the claim. s: the first 2n unpublished rows, claimed or not, in
     * the same snapshot and the same index order as the claim (so the
     * same partial index serves it). firsts: per key bucket, the oldest of
     * them this claim did not get (locked by another relay, or skipped
     * while another relay held the bucket and let go of it during this
     * scan). A claimed row behind such a row, or beyond the rows s looked
     * at, must wait (keep = false): it is neither published nor marked. */
    snprintf(sql, sizeof(sql),
             "WITH c AS (SELECT id, topic, key, %s AS value, headers, "
             "message_id, idempotency_key, created_at, "
             "hashtext(coalesce(key, '')) & %d AS bucket FROM %s "
             "WHERE published_at IS NULL AND error IS NULL "
             "AND pg_try_advisory_xact_lock(hashtext('%s'), "
             "hashtext(coalesce(key, '')) & %d) "
             "ORDER BY id LIMIT $1::int4 FOR UPDATE SKIP LOCKED), "
             "s AS (SELECT id, hashtext(coalesce(key, '')) & %d AS bucket "
             "FROM %s WHERE published_at IS NULL AND error IS NULL "
             "ORDER BY id LIMIT 2 * $1::int4), "
             "horizon AS (SELECT CASE WHEN count(*) = 2 * $1::int4 THEN "
             "max(id) END AS last FROM s), "
             "firsts AS (SELECT bucket, min(id) AS first_id FROM s WHERE NOT "
             "EXISTS (SELECT 1 FROM c WHERE c.id = s.id) GROUP BY 1) "
             "SELECT c.id, c.topic, c.key, c.value, c.headers::text, "
             "c.message_id::text, c.idempotency_key, "
             "(extract(epoch FROM c.created_at) * 1000)::int8, "
             "(f.first_id IS NULL OR c.id < f.first_id) AND (h.last IS NULL "
             "OR c.id <= h.last) FROM c CROSS JOIN horizon h "
             "LEFT JOIN firsts f ON f.bucket = c.bucket ORDER BY c.id",
             o->value_is_bytea ? "value" : "value::text", KEY_BUCKETS - 1, t, t,
             KEY_BUCKETS - 1, KEY_BUCKETS - 1, t);
    if (pg_prepare(o, "claim", sql, errstr, errstr_size))
        goto fail;
    /* The writes are not prepared: preparing takes their ROW EXCLUSIVE
     * table lock at connect time, and a relay should wait for a lock
     * only when it has something to write (they run once per batch). */
    if (c->outbox_after == IDEM_OUTBOX_AFTER_DELETE)
        snprintf(o->sql_done, sizeof(o->sql_done),
                 "DELETE FROM %s WHERE id = ANY($1::int8[])", t);
    else
        snprintf(o->sql_done, sizeof(o->sql_done),
                 "UPDATE %s SET published_at = now() WHERE id = "
                 "ANY($1::int8[])",
                 t);
    snprintf(o->sql_fail, sizeof(o->sql_fail),
             "UPDATE %s SET error = $2 WHERE id = $1::int8", t);
    snprintf(sql, sizeof(sql),
             "SELECT count(*), coalesce((extract(epoch FROM now() - "
             "min(created_at)) * 1000)::int8, 0) FROM %s WHERE published_at "
             "IS NULL AND error IS NULL",
             t);
    if (pg_prepare(o, "lag", sql, errstr, errstr_size))
        goto fail;
    idem_log_kv(IDEM_LOG_INFO, "outbox database connected", "host",
                PQhost(o->pg), "database", PQdb(o->pg), "table", t, "value",
                o->value_is_bytea ? "bytea" : "text", NULL);
    return 0;
fail:
    PQfinish(o->pg);
    o->pg = NULL;
    return -1;
}

/* Refreshes the lag gauges at most every stats.interval.ms (every 5 s when
 * that is 0). A failure is left to the next batch to notice. */
static void lag_refresh(idem_outbox_t *o)
{
    int64_t now = idem_now_ms();
    if (now < o->next_lag_ms)
        return;
    int64_t every =
        o->conf->stats_interval_ms ? o->conf->stats_interval_ms : 5000;
    o->next_lag_ms = now + every;
    PGresult *res = PQexecPrepared(o->pg, "lag", 0, NULL, NULL, NULL, 0);
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
        atomic_store(&o->lag_rows, strtoll(PQgetvalue(res, 0, 0), NULL, 10));
        atomic_store(&o->lag_ms, strtoll(PQgetvalue(res, 0, 1), NULL, 10));
    }
    PQclear(res);
}

/* ---- one batch ---------------------------------------------------------- */

/* Builds the headers of a row: its own (a JSON object; string values as
 * they are, other values as JSON text), then message_id and
 * idempotency_key. Returns NULL with errstr when the headers column is
 * not an object. Caller owns the result. */
static rd_kafka_headers_t *row_headers(const char *json, const char *mid,
                                       const char *ikey, char *errstr,
                                       size_t errstr_size)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(4);
    if (json) {
        json_error_t jerr;
        json_t *root = json_loads(json, 0, &jerr);
        if (!json_is_object(root)) {
            snprintf(errstr, errstr_size,
                     "headers: not a JSON object of name: value");
            json_decref(root);
            rd_kafka_headers_destroy(h);
            return NULL;
        }
        const char *name;
        json_t *v;
        json_object_foreach(root, name, v)
        {
            if (json_is_string(v)) {
                rd_kafka_header_add(h, name, -1, json_string_value(v),
                                    (ssize_t)json_string_length(v));
            } else {
                char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
                rd_kafka_header_add(h, name, -1, text, -1);
                free(text);
            }
        }
        json_decref(root);
    }
    if (mid)
        rd_kafka_header_add(h, "message_id", -1, mid, -1);
    if (ikey)
        rd_kafka_header_add(h, "idempotency_key", -1, ikey, -1);
    return h;
}

/* Produces row i of res into o->rows[i]; a row that can never be
 * published is set ROW_FAILED with its reason. */
static void row_produce(idem_outbox_t *o, PGresult *res, int i)
{
    row_t *row = &o->rows[i];
    memset(row, 0, sizeof(*row));
    row->id = strtoll(PQgetvalue(res, i, 0), NULL, 10);
    row->created_ms = strtoll(PQgetvalue(res, i, 7), NULL, 10);
    if (strcmp(PQgetvalue(res, i, 8), "t")) {
        row->state = ROW_WAIT;
        return;
    }
    const char *topic =
        PQgetisnull(res, i, 1) ? o->conf->outbox_topic : PQgetvalue(res, i, 1);
    if (!topic || !*topic) {
        row->state = ROW_FAILED;
        snprintf(row->error, sizeof(row->error),
                 "no topic: the row's topic is NULL and outbox.topic is not "
                 "set");
        return;
    }
    rd_kafka_headers_t *h =
        row_headers(PQgetisnull(res, i, 4) ? NULL : PQgetvalue(res, i, 4),
                    PQgetisnull(res, i, 5) ? NULL : PQgetvalue(res, i, 5),
                    PQgetisnull(res, i, 6) ? NULL : PQgetvalue(res, i, 6),
                    row->error, sizeof(row->error));
    if (!h) {
        row->state = ROW_FAILED;
        return;
    }
    const char *key = PQgetisnull(res, i, 2) ? NULL : PQgetvalue(res, i, 2);
    void *value = NULL, *unescaped = NULL;
    size_t vlen = 0;
    if (!PQgetisnull(res, i, 3)) {
        value = PQgetvalue(res, i, 3);
        vlen = (size_t)PQgetlength(res, i, 3);
        if (o->value_is_bytea) {
            unescaped = PQunescapeBytea(value, &vlen);
            value = unescaped;
        }
    }
    rd_kafka_resp_err_t err;
    for (;;) {
        err = rd_kafka_producev(o->rk, RD_KAFKA_V_TOPIC(topic),
                                RD_KAFKA_V_KEY(key, key ? strlen(key) : 0),
                                RD_KAFKA_V_VALUE(value, vlen),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_OPAQUE(row),
                                RD_KAFKA_V_END);
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            break;
        rd_kafka_poll(o->rk, 10);
    }
    if (unescaped)
        PQfreemem(unescaped);
    if (err) {
        rd_kafka_headers_destroy(h); /* not taken on failure */
        row->state = idem_outbox_err_is_permanent(err) ? ROW_FAILED : ROW_RETRY;
        snprintf(row->error, sizeof(row->error), "%s", rd_kafka_err2str(err));
        return;
    }
    row->state = ROW_PENDING;
    o->outstanding++;
}

/* Appends ids of rows in `state` as a PostgreSQL array literal. Returns
 * how many. buf is grown as needed; caller frees. */
static size_t ids_literal(const row_t *rows, size_t n, row_state_t state,
                          char **buf)
{
    size_t cap = 32 + n * 21, len = 0, cnt = 0;
    *buf = idem_xrealloc(*buf, cap);
    (*buf)[len++] = '{';
    for (size_t i = 0; i < n; i++) {
        if (rows[i].state != state)
            continue;
        len += (size_t)snprintf(*buf + len, cap - len, "%s%" PRId64,
                                cnt ? "," : "", rows[i].id);
        cnt++;
    }
    (*buf)[len++] = '}';
    (*buf)[len] = '\0';
    return cnt;
}

typedef enum {
    BATCH_OK = 0,
    BATCH_DB_ERROR,    /* reconnect and retry */
    BATCH_KAFKA_ERROR, /* some rows were not delivered: retry later */
    BATCH_FATAL        /* the idempotent producer failed */
} batch_result_t;

/* Claims, publishes, waits, marks, commits. *claimed receives the number
 * of rows claimed, *waiting how many of them were left for later behind an
 * older row of their key (ROW_WAIT). */
static batch_result_t batch_run(idem_outbox_t *o, size_t *claimed,
                                size_t *waiting, char *errstr,
                                size_t errstr_size)
{
    *claimed = 0;
    *waiting = 0;
    int64_t t0 = idem_now_us();
    if (pg_exec(o, "BEGIN", PGRES_COMMAND_OK, errstr, errstr_size))
        return BATCH_DB_ERROR;
    char limit[24];
    snprintf(limit, sizeof(limit), "%" PRId64, o->conf->outbox_batch_max);
    const char *params[2] = {limit, NULL};
    PGresult *res = PQexecPrepared(o->pg, "claim", 1, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        pg_err(o->pg, res, "claim", errstr, errstr_size);
        PQclear(res);
        return BATCH_DB_ERROR;
    }
    size_t n = (size_t)PQntuples(res);
    int64_t t_claimed = idem_now_us();
    *claimed = n;
    if (n == 0) {
        PQclear(res);
        return pg_exec(o, "COMMIT", PGRES_COMMAND_OK, errstr, errstr_size)
                   ? BATCH_DB_ERROR
                   : BATCH_OK;
    }
    o->outstanding = 0;
    for (size_t i = 0; i < n; i++)
        row_produce(o, res, (int)i);
    PQclear(res);
    /* Every delivery report, even when asked to stop: the batch in hand
     * finishes. message.timeout.ms bounds this wait. */
    int64_t t_produced = idem_now_us();
    while (o->outstanding > 0) {
        rd_kafka_poll(o->rk, 5);
        idem_metrics_heartbeat(o->m);
    }
    int64_t t_acked = idem_now_us();

    char fatal[512];
    if (idem_kafka_fatal(o->rk, "outbox producer", fatal, sizeof(fatal))) {
        snprintf(errstr, errstr_size, "%s", fatal);
        return BATCH_FATAL; /* the transaction dies with the connection */
    }

    size_t delivered = 0, failed = 0, retry = 0;
    int64_t now_wall = idem_wall_ms();
    pthread_mutex_lock(&o->lock);
    hist_observe(&o->batch, (double)n);
    for (size_t i = 0; i < n; i++) {
        if (o->rows[i].state == ROW_DELIVERED) {
            delivered++;
            hist_observe(&o->latency,
                         (double)(now_wall - o->rows[i].created_ms) / 1e3);
        } else if (o->rows[i].state == ROW_FAILED) {
            failed++;
        } else if (o->rows[i].state == ROW_WAIT) {
            (*waiting)++;
        } else {
            retry++;
        }
    }
    pthread_mutex_unlock(&o->lock);
    idem_metrics_batch_observe(o->m, (double)n);

    for (size_t i = 0; i < n; i++) {
        if (o->rows[i].state != ROW_FAILED)
            continue;
        char id[24];
        snprintf(id, sizeof(id), "%" PRId64, o->rows[i].id);
        const char *fp[2] = {id, o->rows[i].error};
        PGresult *r =
            PQexecParams(o->pg, o->sql_fail, 2, NULL, fp, NULL, NULL, 0);
        int bad = PQresultStatus(r) != PGRES_COMMAND_OK;
        if (bad)
            pg_err(o->pg, r, "mark failed row", errstr, errstr_size);
        PQclear(r);
        if (bad)
            return BATCH_DB_ERROR;
        idem_log_kv(IDEM_LOG_WARN, "outbox row cannot be published", "id", id,
                    "error", o->rows[i].error, NULL);
    }
    if (delivered) {
        char *ids = NULL;
        ids_literal(o->rows, n, ROW_DELIVERED, &ids);
        const char *dp[1] = {ids};
        PGresult *r =
            PQexecParams(o->pg, o->sql_done, 1, NULL, dp, NULL, NULL, 0);
        free(ids);
        int bad = PQresultStatus(r) != PGRES_COMMAND_OK;
        if (bad)
            pg_err(o->pg, r, "mark published rows", errstr, errstr_size);
        PQclear(r);
        if (bad)
            return BATCH_DB_ERROR;
    }
    int64_t t_marked = idem_now_us();
    if (pg_exec(o, "COMMIT", PGRES_COMMAND_OK, errstr, errstr_size))
        return BATCH_DB_ERROR;
    if (idem_log_enabled(IDEM_LOG_DEBUG)) {
        int64_t t_end = idem_now_us();
        idem_log(IDEM_LOG_DEBUG,
                 "outbox batch: %zu rows (%zu wait); us: claim %" PRId64
                 " produce %" PRId64 " ack %" PRId64 " mark %" PRId64
                 " commit %" PRId64,
                 n, *waiting, t_claimed - t0, t_produced - t_claimed,
                 t_acked - t_produced, t_marked - t_acked, t_end - t_marked);
    }
    /* Counted only now: a row is published once its mark is durable. */
    atomic_fetch_add(&o->published, delivered);
    atomic_fetch_add(&o->failed, failed);
    if (retry) {
        for (size_t i = 0; i < n; i++)
            if (o->rows[i].state == ROW_RETRY) {
                snprintf(errstr, errstr_size,
                         "kafka: %zu of %zu rows not delivered: %s", retry, n,
                         o->rows[i].error);
                break;
            }
        return BATCH_KAFKA_ERROR;
    }
    return BATCH_OK;
}

/* Sleeps until a NOTIFY arrives on the connection, ms pass, or *stop is
 * set. Returns -1 when the connection broke. */
static int wait_notify(idem_outbox_t *o, int64_t ms, volatile int *stop)
{
    int64_t deadline = idem_now_ms() + ms;
    for (;;) {
        if (!PQconsumeInput(o->pg))
            return -1;
        PGnotify *n;
        int got = 0;
        while ((n = PQnotifies(o->pg))) {
            got = 1;
            PQfreemem(n);
        }
        int64_t left = deadline - idem_now_ms();
        if (got || left <= 0 || *stop)
            return 0;
        if (left > WAIT_SLICE_MS)
            left = WAIT_SLICE_MS;
        int fd = PQsocket(o->pg);
        if (fd < 0)
            return -1;
        fd_set rfds;
        FD_ZERO(&rfds);
        FD_SET(fd, &rfds);
        struct timeval tv = {.tv_sec = left / 1000,
                             .tv_usec = (left % 1000) * 1000};
        if (select(fd + 1, &rfds, NULL, NULL, &tv) < 0 && errno != EINTR)
            return -1;
        idem_metrics_heartbeat(o->m);
    }
}

static void set_not_ready(idem_outbox_t *o, const char *why)
{
    idem_metrics_ready_set(o->m, 0, why); /* copied, truncated */
}

/* Backs off after a failure: not ready, sleep, double the delay. */
static void backoff(idem_outbox_t *o, volatile int *stop)
{
    idem_sleep_ms(o->backoff_ms, stop);
    o->backoff_ms *= 2;
    if (o->backoff_ms > o->conf->retry_backoff_max_ms)
        o->backoff_ms = o->conf->retry_backoff_max_ms;
}

/* While all brokers are down: asks for metadata (up to 2 s) at most once
 * a second; an answer means Kafka is back. */
static void kafka_probe(idem_outbox_t *o)
{
    if (!o->kafka_down || idem_now_ms() < o->next_probe_ms)
        return;
    const struct rd_kafka_metadata *md;
    if (rd_kafka_metadata(o->rk, 0, NULL, &md, 2000) ==
        RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_metadata_destroy(md);
        o->kafka_down = 0;
        idem_log_kv(IDEM_LOG_INFO, "outbox: kafka reachable again", NULL);
    }
    o->next_probe_ms = idem_now_ms() + 1000;
}

int idem_outbox_run(idem_outbox_t *o, volatile int *stop, char *errstr,
                    size_t errstr_size)
{
    char err[512];
    int last_failed = 0; /* to log a failure once, not every retry */
    while (!*stop) {
        idem_metrics_heartbeat(o->m);
        rd_kafka_poll(o->rk, 0);
        if (idem_kafka_fatal(o->rk, "outbox producer", err, sizeof(err))) {
            snprintf(errstr, errstr_size, "%s", err);
            set_not_ready(o, err);
            return -1;
        }
        kafka_probe(o);
        if (!o->pg) {
            if (db_connect(o, err, sizeof(err))) {
                atomic_fetch_add(&o->db_errors, 1);
                set_not_ready(o, err);
                if (last_failed != 1)
                    idem_log_kv(IDEM_LOG_WARN, "outbox database unavailable",
                                "error", err, NULL);
                last_failed = 1;
                backoff(o, stop);
                continue;
            }
        }
        lag_refresh(o);
        size_t claimed, waiting;
        batch_result_t br = batch_run(o, &claimed, &waiting, err, sizeof(err));
        if (br == BATCH_FATAL) {
            snprintf(errstr, errstr_size, "%s", err);
            set_not_ready(o, err);
            return -1;
        }
        if (br == BATCH_DB_ERROR) {
            atomic_fetch_add(&o->db_errors, 1);
            set_not_ready(o, err);
            idem_log_kv(IDEM_LOG_WARN, "outbox database error", "error", err,
                        NULL);
            last_failed = 1;
            PQfinish(o->pg); /* rolls the claim back */
            o->pg = NULL;
            backoff(o, stop);
            continue;
        }
        if (br == BATCH_KAFKA_ERROR) {
            atomic_fetch_add(&o->kafka_errors, 1);
            set_not_ready(o, err);
            if (last_failed != 2)
                idem_log_kv(IDEM_LOG_WARN, "outbox publish failed", "error",
                            err, NULL);
            last_failed = 2;
            backoff(o, stop);
            continue;
        }
        if (last_failed)
            idem_log_kv(IDEM_LOG_INFO, "outbox relay resumed", NULL);
        last_failed = 0;
        o->backoff_ms = o->conf->retry_backoff_initial_ms;
        if (o->kafka_down)
            set_not_ready(o, "kafka: all brokers down");
        else
            idem_metrics_ready_set(o->m, 1, NULL);
        if (claimed == (size_t)o->conf->outbox_batch_max)
            continue; /* more rows are probably waiting */
        /* Rows left behind an older row that another relay holds become
         * claimable when it commits, which sends no NOTIFY: look again
         * soon. */
        int64_t wait_ms = o->conf->outbox_poll_ms;
        if (waiting && wait_ms > WAIT_BEHIND_MS)
            wait_ms = WAIT_BEHIND_MS;
        if (wait_notify(o, wait_ms, stop)) {
            atomic_fetch_add(&o->db_errors, 1);
            pg_err(o->pg, NULL, "outbox database", err, sizeof(err));
            set_not_ready(o, err);
            idem_log_kv(IDEM_LOG_WARN, "outbox database error", "error", err,
                        NULL);
            PQfinish(o->pg);
            o->pg = NULL;
        }
    }
    return 0;
}
