/* outbox: the transactional outbox relay: claims committed rows of a
 * PostgreSQL outbox table, publishes them with the idempotent producer and
 * marks (or deletes) them in the transaction that claimed them. */
#include "outbox/outbox.h"
#include "kafka/kafka.h"
#include "kafka/produce.h"
#include "outbox/outboxrow.h"
#include "base/log.h"
#include "base/util.h"

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
#include <endian.h>
#include <sys/select.h>
#include <time.h>

/* Rows of one key are claimed by one relay at a time: each claim takes a
 * transaction-scoped advisory lock on the key's bucket (hashtext(key) mod
 * this) and claims rows of the buckets it holds only. Buckets rather than
 * keys keep a batch's locks well inside PostgreSQL's shared lock table
 * (max_locks_per_transaction x max_connections). */
#define KEY_BUCKETS 1024

#define WAIT_SLICE_MS   100 /* longest sleep between looks at *stop */
#define WAIT_BLOCKED_MS 20  /* next look when another relay held buckets */

typedef enum {
    ROW_PENDING = 0, /* produced, no delivery report yet */
    ROW_DELIVERED,   /* acknowledged by the broker: mark it */
    ROW_FAILED,      /* the broker will never take it: error column */
    ROW_RETRY        /* not delivered (outage): leave it for later */
} row_state_t;

typedef struct {
    int64_t id;
    int64_t created_us; /* wall clock, from created_at */
    int64_t commit_us;  /* its transaction's commit; 0: not tracked */
    row_state_t state;
    char error[200]; /* ROW_FAILED / ROW_RETRY: why */
} row_t;

/* A fixed-bound histogram (seconds or rows); guarded by the relay's lock. */
typedef struct {
    const double *bounds;
    size_t nbounds;
    uint64_t buckets[24];
    uint64_t count;
    double sum;
} hist_t;

static const double latency_bounds[] = {0.001, 0.002, 0.005, 0.01,  0.015, 0.02,
                                        0.03,  0.04,  0.05,  0.075, 0.1,   0.25,
                                        0.5,   1,     2.5,   5,     10};
/* Finer, for the commit -> acknowledgement latency the relay controls. */
static const double commit_bounds[] = {
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03,
    0.04,  0.05,  0.075, 0.1,   0.25,   0.5,  1,     2.5,  5,     10};
static const double batch_bounds[] = {1,   10,   50,   100,  250,
                                      500, 1000, 2500, 5000, 10000};

struct idem_outbox_s {
    const idem_conf_t *conf; /* borrowed */
    idem_metrics_t *m;       /* borrowed */
    rd_kafka_t *rk;
    PGconn *pg; /* NULL while disconnected */
    char channel[128];
    char sql_done[256]; /* mark or delete the delivered rows */
    char sql_fail[320]; /* set a row's error */
    int value_is_bytea;
    char error_type[64]; /* the error column's type, for the fail's cast */
    int commit_ts;       /* the server tracks commit timestamps */
    int64_t backoff_ms;
    int64_t next_lag_ms; /* idem_now_ms() of the next lag query */
    int kafka_down;      /* all brokers down: not ready until a probe works */
    int64_t next_probe_ms;

    row_t *rows;        /* outbox.batch.max entries, reused every batch */
    size_t nrows;       /* rows of the batch in hand (claimed, produced) */
    int in_tx;          /* a claim's transaction is open (no Sync yet) */
    size_t outstanding; /* produced, delivery report not yet in */
    char *ids;          /* the mark's binary int8[] parameter */
    size_t ids_cap;

    _Atomic uint64_t published;
    _Atomic uint64_t failed;
    _Atomic uint64_t db_errors;
    _Atomic uint64_t kafka_errors;
    _Atomic int64_t lag_rows;
    _Atomic int64_t lag_ms; /* age of the oldest unpublished row */

    pthread_mutex_t lock; /* guards the histograms */
    hist_t batch;
    hist_t latency; /* created_at -> acknowledgement */
    hist_t commit;  /* commit -> acknowledgement (commit_ts only) */
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
    /* Not _UNKNOWN_TOPIC: librdkafka concludes it from one metadata answer
     * that lacks the topic, which a restarting broker also gives, and a
     * topic being created gives for a while. An outage is never a reason
     * to fail a row: the relay turns not ready naming the topic and
     * retries, and goes on by itself once the topic is there. */
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
    hist_t batch = o->batch, latency = o->latency, commit = o->commit;
    pthread_mutex_unlock(&o->lock);
    hist_render(out, "idemproc_outbox_batch_size",
                "Rows claimed per outbox transaction.", &batch);
    hist_render(out, "idemproc_outbox_publish_latency_seconds",
                "From a row's created_at to its delivery report.", &latency);
    hist_render(out, "idemproc_outbox_commit_latency_seconds",
                "From the commit that made a row visible to its delivery "
                "report (PostgreSQL track_commit_timestamp=on only).",
                &commit);
}

/* Sets row's state and error for a produce or delivery error on topic. */
static void row_fail(row_t *row, rd_kafka_resp_err_t err, const char *topic)
{
    row->state = idem_outbox_err_is_permanent(err) ? ROW_FAILED : ROW_RETRY;
    if (err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC)
        snprintf(row->error, sizeof(row->error),
                 "topic \"%.60s\" is unknown to the broker (create it; "
                 "the relay retries until it can publish)",
                 topic);
    else
        snprintf(row->error, sizeof(row->error), "%s", rd_kafka_err2str(err));
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
    row_fail(row, msg->err, rd_kafka_topic_name(msg->rkt));
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
    o->commit.bounds = commit_bounds;
    o->commit.nbounds = sizeof(commit_bounds) / sizeof(commit_bounds[0]);
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
    free(o->ids);
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

/* The claim, one statement. s: the key buckets of the first n
 * unpublished rows. g: each of them tried once, all before the claim
 * scan starts (pg_try_advisory_xact_lock: another relay's buckets are
 * skipped, never waited for). c: the first n unpublished rows of the
 * buckets now held, locked FOR UPDATE. Rows of a held bucket can be
 * row-locked only by a transaction that is not a relay (a relay locks
 * rows only in buckets it holds), so c waits for such a lock instead of
 * skipping the row: it claims, for every bucket it holds, a prefix in
 * id order of the bucket's unpublished rows, which is per-key order
 * by construction. FOR UPDATE also re-reads a row that a relay which
 * held the bucket before us published after our snapshot (and skips
 * it). blocked: buckets another relay held (look again soon; its
 * commit sends no NOTIFY). One row of NULLs after blocked when
 * nothing was claimed. The bucket test is `<> 0`, not `= 1`: the
 * planner gives an equality on a function's result a selectivity of
 * 0.5%, so with the LIMIT known (the first five executions of a
 * prepared statement are planned for their values) it expected fewer
 * rows than the LIMIT, chose a sequential scan and sorted the whole
 * backlog on disk: 0.4-1.3 s a claim over 200,000 rows instead of
 * 30-40 ms. With `<> 0` it expects 99.5% and walks the index. */
int idem_outbox_sql_claim(char *buf, size_t size, const char *table,
                          int value_is_bytea, int commit_ts)
{
    int n = snprintf(
        buf, size,
        "WITH s AS MATERIALIZED (SELECT DISTINCT hashtext(coalesce(key, "
        "'')) & %d AS b FROM (SELECT key FROM %s WHERE published_at IS NULL "
        "AND error IS NULL ORDER BY id LIMIT $1::int4) f), "
        "g AS MATERIALIZED (SELECT b, pg_try_advisory_xact_lock("
        "hashtext('%s'), b) AS mine FROM s), "
        "o AS (SELECT coalesce(bit_or(B'1'::bit(%d) >> b) FILTER (WHERE "
        "mine), B'0'::bit(%d)) AS bits, count(*) FILTER (WHERE NOT mine) "
        "AS blocked FROM g) "
        "SELECT o.blocked, c.* FROM o LEFT JOIN LATERAL (SELECT id, topic, "
        "key, %s, headers::text, message_id::text, idempotency_key, "
        "(extract(epoch FROM created_at) * 1e6)::int8, %s FROM %s WHERE "
        "published_at IS NULL AND error IS NULL AND get_bit(o.bits, "
        "hashtext(coalesce(key, '')) & %d) <> 0 ORDER BY id LIMIT $1::int4 "
        "FOR UPDATE) c ON true",
        KEY_BUCKETS - 1, table, table, KEY_BUCKETS, KEY_BUCKETS,
        value_is_bytea ? "value" : "value::text",
        commit_ts ? "(extract(epoch FROM pg_xact_commit_timestamp(xmin)) "
                    "* 1e6)::int8"
                  : "NULL::int8",
        table, KEY_BUCKETS - 1);
    return n < 0 || (size_t)n >= size ? -1 : 0;
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

/* The columns the relay reads and writes, with their definition in
 * config/sql/outbox.sql (for the fix an error suggests). */
static const struct {
    const char *name;
    const char *ddl;
} table_columns[] = {
    {"id", "bigserial PRIMARY KEY"},
    {"created_at", "timestamptz NOT NULL DEFAULT clock_timestamp()"},
    {"topic", "text"},
    {"key", "text"},
    {"value", "jsonb"},
    {"headers", "jsonb"},
    {"message_id", "uuid NOT NULL DEFAULT gen_random_uuid()"},
    {"idempotency_key", "text"},
    {"published_at", "timestamptz"},
    {"error", "text"},
};

/* Checks that outbox.table exists with every column the relay uses and
 * learns the value column's type. A table that is not there or lacks a
 * column (an older schema) does not mend itself while the relay waits:
 * -2 with errstr naming what is missing and the fix (the relay stops).
 * -1 with errstr for a database error (retried); 0 when it is fine. */
static int table_check(idem_outbox_t *o, char *errstr, size_t errstr_size)
{
    const char *t = o->conf->outbox_table;
    const char *param[] = {t};
    PGresult *res = PQexecParams(
        o->pg,
        "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM "
        "pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 "
        "AND NOT a.attisdropped",
        1, NULL, param, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        pg_err(o->pg, res, "outbox.table", errstr, errstr_size);
        PQclear(res);
        return -1;
    }
    int n = PQntuples(res);
    if (n == 0) {
        snprintf(errstr, errstr_size,
                 "outbox.table: \"%s\" does not exist (create it with "
                 "config/sql/outbox.sql, or name the table you have)",
                 t);
        PQclear(res);
        return -2;
    }
    const char *value_type = NULL, *key_type = NULL;
    for (size_t c = 0; c < sizeof(table_columns) / sizeof(table_columns[0]);
         c++) {
        int found = -1;
        for (int i = 0; i < n && found < 0; i++)
            if (!strcmp(PQgetvalue(res, i, 0), table_columns[c].name))
                found = i;
        if (found < 0) {
            snprintf(errstr, errstr_size,
                     "outbox.table: \"%s\" has no column %s (an older "
                     "schema? ALTER TABLE %s ADD COLUMN %s %s; see "
                     "config/sql/outbox.sql)",
                     t, table_columns[c].name, t, table_columns[c].name,
                     table_columns[c].ddl);
            PQclear(res);
            return -2;
        }
        if (!strcmp(table_columns[c].name, "value"))
            value_type = PQgetvalue(res, found, 1);
        else if (!strcmp(table_columns[c].name, "key"))
            key_type = PQgetvalue(res, found, 1);
        else if (!strcmp(table_columns[c].name, "error"))
            snprintf(o->error_type, sizeof(o->error_type), "%s",
                     PQgetvalue(res, found, 1));
    }
    /* The key is hashed as text for its bucket and sent as text; a bytea
     * key would be sent as its escaped text. */
    if (!strcmp(key_type, "bytea")) {
        snprintf(errstr, errstr_size,
                 "outbox.table: \"%s\": column key is bytea; the relay "
                 "takes a text key (ALTER TABLE %s ALTER COLUMN key TYPE "
                 "text USING encode(key, 'escape'))",
                 t, t);
        PQclear(res);
        return -2;
    }
    o->value_is_bytea = !strcmp(value_type, "bytea");
    PQclear(res);
    return 0;
}

int idem_outbox_check(const idem_conf_t *conf, int timeout_ms, FILE *out,
                      char *errstr, size_t errstr_size)
{
    char tmo[16];
    snprintf(tmo, sizeof(tmo), "%d", (timeout_ms + 999) / 1000);
    const char *keys[] = {"connect_timeout", "application_name", "dbname",
                          NULL};
    const char *vals[] = {tmo, "idemproc-check-config", conf->outbox_dsn, NULL};
    idem_outbox_t o = {.conf = conf};
    o.pg = PQconnectdbParams(keys, vals, 1);
    int rc = -1;
    if (PQstatus(o.pg) != CONNECTION_OK) {
        pg_err(o.pg, NULL, "outbox.dsn: cannot connect", errstr, errstr_size);
        goto out;
    }
    fprintf(out, "check-config: postgresql: connected to %s, database %s\n",
            PQhost(o.pg), PQdb(o.pg));
    if (table_check(&o, errstr, errstr_size))
        goto out;
    fprintf(out,
            "check-config: postgresql: table %s has the outbox columns "
            "(value %s)\n",
            conf->outbox_table, o.value_is_bytea ? "bytea" : "text");
    rc = 0;
out:
    PQfinish(o.pg);
    return rc;
}

/* Connects, LISTENs on the table's channel, checks the table's columns,
 * learns the value column's type and prepares the statements. The DSN is
 * never logged (it may hold the password); the host and database are. 0,
 * -1 with errstr (retried), or -2 when the table can never work (see
 * table_check). */
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
    char sql[4096];
    snprintf(sql, sizeof(sql), "LISTEN \"%s\"", o->channel);
    if (pg_exec(o, sql, PGRES_COMMAND_OK, errstr, errstr_size))
        goto fail;

    int r = table_check(o, errstr, errstr_size);
    if (r) {
        PQfinish(o->pg);
        o->pg = NULL;
        return r;
    }

    /* The commit -> acknowledgement latency needs the commit time of each
     * row's transaction (track_commit_timestamp, a server setting). */
    PGresult *res =
        PQexec(o->pg, "SELECT current_setting('track_commit_timestamp') = "
                      "'on' AND has_function_privilege("
                      "'pg_xact_commit_timestamp(xid)', 'execute')");
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        pg_err(o->pg, res, "track_commit_timestamp", errstr, errstr_size);
        PQclear(res);
        goto fail;
    }
    o->commit_ts = !strcmp(PQgetvalue(res, 0, 0), "t");
    PQclear(res);

    const char *t = c->outbox_table;
    if (idem_outbox_sql_claim(sql, sizeof(sql), t, o->value_is_bytea,
                              o->commit_ts)) {
        snprintf(errstr, errstr_size, "outbox.table: \"%s\" too long", t);
        goto fail;
    }
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
    /* An explicit cast cuts a text longer than a varchar(n) error column
     * (an older schema of the user's); a plain assignment would fail, and
     * with it the batch, for good. */
    snprintf(o->sql_fail, sizeof(o->sql_fail),
             "UPDATE %s SET error = $2::%s WHERE id = $1::int8", t,
             o->error_type);
    snprintf(sql, sizeof(sql),
             "SELECT count(*), coalesce((extract(epoch FROM now() - "
             "min(created_at)) * 1000)::int8, 0) FROM %s WHERE published_at "
             "IS NULL AND error IS NULL",
             t);
    if (pg_prepare(o, "lag", sql, errstr, errstr_size))
        goto fail;
    /* From here on every statement goes through the pipeline: a batch's
     * mark, its commit and the next claim leave in one write. */
    if (!PQenterPipelineMode(o->pg)) {
        pg_err(o->pg, NULL, "pipeline mode", errstr, errstr_size);
        goto fail;
    }
    o->in_tx = 0;
    idem_log_kv(IDEM_LOG_INFO, "outbox database connected", "host",
                PQhost(o->pg), "database", PQdb(o->pg), "table", t, "value",
                o->value_is_bytea ? "bytea" : "text", "commit_timestamps",
                o->commit_ts ? "on" : "off", NULL);
    return 0;
fail:
    PQfinish(o->pg);
    o->pg = NULL;
    return -1;
}

/* ---- one batch ---------------------------------------------------------- */

/* Produces row i of res (the claim's columns: blocked, id, topic, key,
 * value, headers, message_id, idempotency_key, created and commit in µs)
 * into o->rows[i]; a row that can never be published is set ROW_FAILED
 * with its reason. */
static void row_produce(idem_outbox_t *o, PGresult *res, int i)
{
    row_t *row = &o->rows[i];
    memset(row, 0, sizeof(*row));
    row->id = strtoll(PQgetvalue(res, i, 1), NULL, 10);
    row->created_us = strtoll(PQgetvalue(res, i, 8), NULL, 10);
    if (!PQgetisnull(res, i, 9))
        row->commit_us = strtoll(PQgetvalue(res, i, 9), NULL, 10);
    const char *topic =
        PQgetisnull(res, i, 2) ? o->conf->outbox_topic : PQgetvalue(res, i, 2);
    if (!topic || (!*topic && PQgetisnull(res, i, 2))) {
        row->state = ROW_FAILED;
        snprintf(row->error, sizeof(row->error),
                 "no topic: the row's topic is NULL and outbox.topic is not "
                 "set");
        return;
    }
    if (idem_outboxrow_topic_check(topic, row->error, sizeof(row->error))) {
        row->state = ROW_FAILED;
        return;
    }
    rd_kafka_headers_t *h = idem_outboxrow_headers(
        PQgetisnull(res, i, 5) ? NULL : PQgetvalue(res, i, 5),
        PQgetisnull(res, i, 6) ? NULL : PQgetvalue(res, i, 6),
        PQgetisnull(res, i, 7) ? NULL : PQgetvalue(res, i, 7), row->error,
        sizeof(row->error));
    if (!h) {
        row->state = ROW_FAILED;
        return;
    }
    const char *key = PQgetisnull(res, i, 3) ? NULL : PQgetvalue(res, i, 3);
    void *value = NULL, *unescaped = NULL;
    size_t vlen = 0;
    if (!PQgetisnull(res, i, 4)) {
        value = PQgetvalue(res, i, 4);
        vlen = (size_t)PQgetlength(res, i, 4);
        if (o->value_is_bytea) {
            unescaped = PQunescapeBytea(value, &vlen);
            value = unescaped;
        }
    }
    idem_kafka_msg_t m = {
        .topic = topic,
        .msgflags = RD_KAFKA_MSG_F_COPY,
        .key = key,
        .key_len = key ? strlen(key) : 0,
        .value = value,
        .value_len = vlen,
        .headers = h,
        .opaque = row,
    };
    rd_kafka_resp_err_t err = idem_kafka_produce(o->rk, &m, 10);
    if (unescaped)
        PQfreemem(unescaped);
    if (err) {
        rd_kafka_headers_destroy(h); /* not taken on failure */
        row_fail(row, err, topic);
        return;
    }
    row->state = ROW_PENDING;
    o->outstanding++;
}

/* Fills o->ids with the ids of the batch's rows in `state` as a binary
 * int8[] parameter (array_recv's format: dimensions, has-nulls flag,
 * element type, length and lower bound of the one dimension, then each
 * element as its length and big-endian value), which the server takes
 * without parsing text. Returns the byte length; *cnt gets how many ids. */
static size_t ids_binary(idem_outbox_t *o, row_state_t state, size_t *cnt)
{
    size_t need = 20 + o->nrows * 12;
    if (need > o->ids_cap) {
        o->ids = idem_xrealloc(o->ids, need);
        o->ids_cap = need;
    }
    char *p = o->ids + 20;
    uint32_t n = 0;
    for (size_t i = 0; i < o->nrows; i++) {
        if (o->rows[i].state != state)
            continue;
        uint32_t len = htobe32(8);
        uint64_t v = htobe64((uint64_t)o->rows[i].id);
        memcpy(p, &len, 4);
        memcpy(p + 4, &v, 8);
        p += 12;
        n++;
    }
    uint32_t head[5] = {htobe32(1), htobe32(0), htobe32(20 /* int8 */),
                        htobe32(n), htobe32(1)};
    memcpy(o->ids, head, sizeof(head));
    *cnt = n;
    return (size_t)(p - o->ids);
}

/* The next result of the pipeline, which must have status `want` (what
 * names the statement in errstr); for a statement also the NULL that ends
 * its results (a Sync has none). *out, when given, takes the result
 * (caller clears it). 0 or -1 with errstr. */
static int pipe_result(idem_outbox_t *o, ExecStatusType want, const char *what,
                       PGresult **out, char *errstr, size_t errstr_size)
{
    PGresult *res = PQgetResult(o->pg);
    if (PQresultStatus(res) != want) {
        pg_err(o->pg, res, what, errstr, errstr_size);
        PQclear(res);
        return -1;
    }
    if (want != PGRES_PIPELINE_SYNC) {
        PGresult *end = PQgetResult(o->pg);
        if (end) {
            PQclear(end);
            PQclear(res);
            snprintf(errstr, errstr_size, "%s: more than one result", what);
            return -1;
        }
    }
    if (out)
        *out = res;
    else
        PQclear(res);
    return 0;
}

/* Sends a Sync (the end of the claim's transaction: its commit), flushes
 * and reads the Sync's result. 0 or -1 with errstr. */
static int pipe_commit(idem_outbox_t *o, char *errstr, size_t errstr_size)
{
    if (!PQpipelineSync(o->pg)) {
        pg_err(o->pg, NULL, "commit", errstr, errstr_size);
        return -1;
    }
    o->in_tx = 0;
    return pipe_result(o, PGRES_PIPELINE_SYNC, "commit", NULL, errstr,
                       errstr_size);
}

/* Queues the end of the batch in hand: the error of each refused row, one
 * mark (or delete) of the delivered rows, and the Sync that commits the
 * claim's transaction. *delivered and *failed get the counts. 0 or -1. */
static int send_finish(idem_outbox_t *o, size_t *delivered, size_t *failed,
                       char *errstr, size_t errstr_size)
{
    *failed = 0;
    for (size_t i = 0; i < o->nrows; i++) {
        if (o->rows[i].state != ROW_FAILED)
            continue;
        char id[24];
        snprintf(id, sizeof(id), "%" PRId64, o->rows[i].id);
        const char *fp[2] = {id, idem_outboxrow_utf8_clean(o->rows[i].error)};
        if (!PQsendQueryParams(o->pg, o->sql_fail, 2, NULL, fp, NULL, NULL,
                               0)) {
            pg_err(o->pg, NULL, "mark failed row", errstr, errstr_size);
            return -1;
        }
        (*failed)++;
    }
    size_t len = ids_binary(o, ROW_DELIVERED, delivered);
    if (*delivered) {
        const char *dp[1] = {o->ids};
        int dl[1] = {(int)len}, df[1] = {1};
        if (!PQsendQueryParams(o->pg, o->sql_done, 1, NULL, dp, dl, df, 0)) {
            pg_err(o->pg, NULL, "mark published rows", errstr, errstr_size);
            return -1;
        }
    }
    if (!PQpipelineSync(o->pg)) {
        pg_err(o->pg, NULL, "commit", errstr, errstr_size);
        return -1;
    }
    return 0;
}

/* Reads the results send_finish queued; once the commit is in, counts
 * the rows and logs the refused ones. 0 or -1 with errstr (the commit's
 * fate is then unknown: nothing is counted, the rows may be published
 * again). */
static int read_finish(idem_outbox_t *o, size_t delivered, size_t failed,
                       char *errstr, size_t errstr_size)
{
    for (size_t i = 0; i < failed; i++)
        if (pipe_result(o, PGRES_COMMAND_OK, "mark failed row", NULL, errstr,
                        errstr_size))
            return -1;
    if (delivered && pipe_result(o, PGRES_COMMAND_OK, "mark published rows",
                                 NULL, errstr, errstr_size))
        return -1;
    if (pipe_result(o, PGRES_PIPELINE_SYNC, "commit", NULL, errstr,
                    errstr_size))
        return -1;
    o->in_tx = 0;
    /* Counted only now: a row is published once its mark is committed. */
    atomic_fetch_add(&o->published, delivered);
    atomic_fetch_add(&o->failed, failed);
    for (size_t i = 0; failed && i < o->nrows; i++)
        if (o->rows[i].state == ROW_FAILED) {
            char id[24];
            snprintf(id, sizeof(id), "%" PRId64, o->rows[i].id);
            idem_log_kv(IDEM_LOG_WARN, "outbox row cannot be published", "id",
                        id, "error", o->rows[i].error, NULL);
        }
    o->nrows = 0;
    return 0;
}

/* Whether the lag gauges are due (every stats.interval.ms, 5 s when 0). */
static int lag_due(idem_outbox_t *o)
{
    int64_t now = idem_now_ms();
    if (now < o->next_lag_ms)
        return 0;
    int64_t every =
        o->conf->stats_interval_ms ? o->conf->stats_interval_ms : 5000;
    o->next_lag_ms = now + every;
    return 1;
}

static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Publishes the claimed rows of res and waits for every delivery report,
 * even when asked to stop (message.timeout.ms bounds the wait); observes
 * the latencies. Returns how many rows were not delivered (ROW_RETRY). */
static size_t publish(idem_outbox_t *o, PGresult *res, size_t n)
{
    o->outstanding = 0;
    for (size_t i = 0; i < n; i++)
        row_produce(o, res, (int)i);
    o->nrows = n;
    while (o->outstanding > 0) {
        rd_kafka_poll(o->rk, 5);
        idem_metrics_heartbeat(o->m);
    }
    size_t retry = 0;
    int64_t now = wall_us();
    pthread_mutex_lock(&o->lock);
    hist_observe(&o->batch, (double)n);
    for (size_t i = 0; i < n; i++) {
        const row_t *row = &o->rows[i];
        if (row->state == ROW_DELIVERED) {
            hist_observe(&o->latency, (double)(now - row->created_us) / 1e6);
            if (row->commit_us)
                hist_observe(&o->commit, (double)(now - row->commit_us) / 1e6);
        } else if (row->state == ROW_RETRY) {
            retry++;
        }
    }
    pthread_mutex_unlock(&o->lock);
    idem_metrics_batch_observe(o->m, (double)n);
    return retry;
}

typedef enum {
    BATCH_OK = 0,
    BATCH_DB_ERROR,    /* reconnect and retry */
    BATCH_KAFKA_ERROR, /* some rows were not delivered: retry later */
    BATCH_FATAL        /* the idempotent producer failed */
} batch_result_t;

/* One turn of the relay. Finishes the batch in hand (marks, errors and
 * the commit of its transaction) and, when `claim`, claims the next batch
 * in a new transaction, publishes it and waits for its acknowledgements;
 * its marks go out with the next turn. The finish and the claim leave in
 * one write (libpq pipeline mode; a transaction is the statements between
 * two Syncs), so a busy relay pays one database round trip per batch.
 * *claimed gets the rows claimed, *blocked the key buckets another relay
 * held. BATCH_KAFKA_ERROR leaves the batch in hand: finish it with
 * claim = 0 before backing off. */
static batch_result_t batch_turn(idem_outbox_t *o, int claim, size_t *claimed,
                                 int64_t *blocked, char *errstr,
                                 size_t errstr_size)
{
    *claimed = 0;
    *blocked = 0;
    int64_t t0 = idem_now_us();
    int finishing = o->in_tx;
    size_t delivered = 0, failed = 0;
    if (finishing && send_finish(o, &delivered, &failed, errstr, errstr_size))
        return BATCH_DB_ERROR;
    int with_lag = 0;
    if (claim) {
        with_lag = lag_due(o);
        char limit[24];
        snprintf(limit, sizeof(limit), "%" PRId64, o->conf->outbox_batch_max);
        const char *params[1] = {limit};
        if ((with_lag &&
             !PQsendQueryPrepared(o->pg, "lag", 0, NULL, NULL, NULL, 0)) ||
            !PQsendQueryPrepared(o->pg, "claim", 1, params, NULL, NULL, 0) ||
            !PQsendFlushRequest(o->pg)) {
            pg_err(o->pg, NULL, "claim", errstr, errstr_size);
            return BATCH_DB_ERROR;
        }
    }
    if (PQflush(o->pg)) {
        pg_err(o->pg, NULL, "send", errstr, errstr_size);
        return BATCH_DB_ERROR;
    }
    if (finishing && read_finish(o, delivered, failed, errstr, errstr_size))
        return BATCH_DB_ERROR;
    if (!claim)
        return BATCH_OK;
    PGresult *res;
    if (with_lag) {
        if (pipe_result(o, PGRES_TUPLES_OK, "lag", &res, errstr, errstr_size))
            return BATCH_DB_ERROR;
        if (PQntuples(res) == 1) {
            atomic_store(&o->lag_rows,
                         strtoll(PQgetvalue(res, 0, 0), NULL, 10));
            atomic_store(&o->lag_ms, strtoll(PQgetvalue(res, 0, 1), NULL, 10));
        }
        PQclear(res);
    }
    if (pipe_result(o, PGRES_TUPLES_OK, "claim", &res, errstr, errstr_size))
        return BATCH_DB_ERROR;
    o->in_tx = 1;
    int64_t t_claimed = idem_now_us();
    size_t n = (size_t)PQntuples(res);
    if (n >= 1)
        *blocked = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    if (n == 1 && PQgetisnull(res, 0, 1))
        n = 0; /* the one row of blocked alone: nothing claimed */
    for (size_t i = 1; i < n; i++)
        if (strtoll(PQgetvalue(res, (int)i, 1), NULL, 10) <=
            strtoll(PQgetvalue(res, (int)i - 1, 1), NULL, 10)) {
            /* The plan (a nested loop over the one row of o) keeps the
             * claim's id order; publishing out of order is not an
             * option, so a plan that changes it is an error. */
            snprintf(errstr, errstr_size,
                     "claim: rows not in id order (row %zu)", i);
            PQclear(res);
            return BATCH_DB_ERROR;
        }
    *claimed = n;
    if (n == 0) {
        PQclear(res);
        return pipe_commit(o, errstr, errstr_size) ? BATCH_DB_ERROR : BATCH_OK;
    }
    size_t retry = publish(o, res, n);
    PQclear(res);
    int64_t t_acked = idem_now_us();

    char fatal[512];
    if (idem_kafka_fatal(o->rk, "outbox producer", fatal, sizeof(fatal))) {
        snprintf(errstr, errstr_size, "%s", fatal);
        return BATCH_FATAL; /* the transaction dies with the connection */
    }
    if (idem_log_enabled(IDEM_LOG_DEBUG))
        idem_log(IDEM_LOG_DEBUG,
                 "outbox batch: %zu rows (%" PRId64
                 " buckets blocked); us: finish+claim %" PRId64
                 " publish+ack %" PRId64,
                 n, *blocked, t_claimed - t0, t_acked - t_claimed);
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

/* Drops the connection after a database error: the open transaction
 * rolls back with it, so the batch in hand (published, not marked) is
 * claimed and published again later, with the same message_ids. */
static void db_drop(idem_outbox_t *o, const char *err)
{
    atomic_fetch_add(&o->db_errors, 1);
    set_not_ready(o, err);
    idem_log_kv(IDEM_LOG_WARN, "outbox database error", "error", err, NULL);
    PQfinish(o->pg);
    o->pg = NULL;
    o->in_tx = 0;
    o->nrows = 0;
}

int idem_outbox_run(idem_outbox_t *o, volatile int *stop, char *errstr,
                    size_t errstr_size)
{
    char err[512];
    int last_failed = 0; /* to log a failure once, not every retry */
    int connected_once = 0;
    size_t claimed;
    int64_t blocked;
    for (;;) {
        idem_metrics_heartbeat(o->m);
        rd_kafka_poll(o->rk, 0);
        if (idem_kafka_fatal(o->rk, "outbox producer", err, sizeof(err))) {
            snprintf(errstr, errstr_size, "%s", err);
            set_not_ready(o, err);
            return -1;
        }
        if (*stop) {
            /* The batch in hand is acknowledged: mark it and commit. */
            if (o->pg && o->in_tx &&
                batch_turn(o, 0, &claimed, &blocked, err, sizeof(err)) !=
                    BATCH_OK)
                db_drop(o, err);
            return 0;
        }
        kafka_probe(o);
        if (!o->pg) {
            int c = db_connect(o, err, sizeof(err));
            /* A table that does not fit stops a relay that starts (the
             * operator is there to read why); after that, a migration
             * may be under way: wait, not ready, as for an outage. */
            if (c == -2 && !connected_once) {
                snprintf(errstr, errstr_size, "%s", err);
                set_not_ready(o, err);
                return -1;
            }
            if (c) {
                atomic_fetch_add(&o->db_errors, 1);
                set_not_ready(o, err);
                if (last_failed != 1)
                    idem_log_kv(IDEM_LOG_WARN, "outbox database unavailable",
                                "error", err, NULL);
                last_failed = 1;
                backoff(o, stop);
                continue;
            }
            connected_once = 1;
        }
        batch_result_t br =
            batch_turn(o, 1, &claimed, &blocked, err, sizeof(err));
        if (br == BATCH_FATAL) {
            snprintf(errstr, errstr_size, "%s", err);
            set_not_ready(o, err);
            return -1;
        }
        if (br == BATCH_KAFKA_ERROR) {
            atomic_fetch_add(&o->kafka_errors, 1);
            set_not_ready(o, err);
            if (last_failed != 2)
                idem_log_kv(IDEM_LOG_WARN, "outbox publish failed", "error",
                            err, NULL);
            last_failed = 2;
            /* Mark what was delivered now, not after the backoff: the
             * transaction should not stay open while we sleep. */
            if (batch_turn(o, 0, &claimed, &blocked, err, sizeof(err)) !=
                BATCH_OK)
                db_drop(o, err);
            backoff(o, stop);
            continue;
        }
        if (br == BATCH_DB_ERROR) {
            db_drop(o, err);
            last_failed = 1;
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
        if (claimed)
            continue; /* its marks go out with the next claim */
        /* Nothing to claim, the transaction is closed: sleep on NOTIFY.
         * Rows in buckets another relay held become claimable at its
         * commit, which sends no NOTIFY: look again soon. */
        int64_t wait_ms = o->conf->outbox_poll_ms;
        if (blocked && wait_ms > WAIT_BLOCKED_MS)
            wait_ms = WAIT_BLOCKED_MS;
        if (wait_notify(o, wait_ms, stop)) {
            pg_err(o->pg, NULL, "outbox database", err, sizeof(err));
            db_drop(o, err);
        }
    }
}
