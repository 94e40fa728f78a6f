/* forward: handler=forward, each new record copied to output.topic by an
 * idempotent producer: byte-identical by default; forward.processed.at
 * adds processed_at as a header or into a JSON object. The loop holds the lease
 * while the write is in flight and marks the record done once the broker
 * acknowledged it (handler.h, IDEM_EFFECT_EXTERNAL). */
#include "input/envelope.h"
#include "effect/handler.h"
#include "kafka/kafka.h"
#include "kafka/produce.h"
#include "base/log.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fate of one write, owned by whoever is last: the handler frees it
 * once it read the result; a write abandoned by drain is marked orphan and
 * its delivery report frees it. */
typedef struct {
    int state; /* 0 in flight, 1 acknowledged, -1 failed */
    rd_kafka_resp_err_t err;
    int orphan;
} ticket_t;

typedef struct {
    idem_record_t *rec;
    ticket_t *t;             /* NULL: result already known (res) */
    idem_result_kind_t kind; /* when t is NULL */
    char detail[256];
} write_t;

typedef struct {
    const idem_conf_t *conf;
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    int processed_at; /* PROCESSED_AT_* */
    write_t *w;       /* in submit order */
    size_t n, cap;
} forward_t;

/* forward.processed.at, by its index in the key's enum. */
enum { PROCESSED_AT_OFF = 0, PROCESSED_AT_VALUE = 1, PROCESSED_AT_HEADER = 2 };

static const idem_conf_key_t forward_keys[] = {
    /* clang-format off */
    IDEM_CONF_STR("output.topic", output_topic, NULL, IDEM_KEY_REQUIRED | IDEM_KEY_WRITES_TOPIC, NULL,
        "topic the forward handler writes to"),
    /* clang-format on */
    {.name = "forward.processed.at",
     .type = IDEM_KEY_ENUM,
     .def = "false",
     .enums = {"false", "true", "header"},
     .doc = "false: the copy is byte-identical (key, value, headers); header: "
            "add a processed_at header (RFC 3339, UTC); true: add "
            "\"processed_at\" to a JSON-object value (changes its bytes)"},
    {.name = NULL},
};

static int forward_validate(const idem_conf_t *conf, const char *arg,
                            char *errstr, size_t errstr_size)
{
    (void)arg;
    if (!conf->output_topic || !*conf->output_topic) {
        snprintf(errstr, errstr_size,
                 "output.topic: required when handler=forward");
        return -1;
    }
    return 0;
}

/* Delivery report of the output producer: fires in rd_kafka_poll/flush of
 * that producer, on the processing thread. */
static void forward_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m,
                          void *opaque)
{
    (void)rk;
    (void)opaque;
    ticket_t *t = m->_private;
    if (m->err)
        idem_log_kv(IDEM_LOG_WARN, "output write failed", "error",
                    rd_kafka_err2str(m->err), NULL);
    if (t->orphan) {
        free(t);
        return;
    }
    t->err = m->err;
    t->state = m->err ? -1 : 1;
}

static void *forward_start(const idem_handler_ctx_t *ctx, char *errstr,
                           size_t errstr_size)
{
    const idem_conf_t *conf = ctx->conf;
    /* A valid record may be up to message.max.bytes (plus processed_at),
     * above librdkafka's default limit. */
    int64_t limit = conf->message_max_bytes + 65536;
    rd_kafka_conf_t *kc = idem_kafka_writer_conf(
        conf, limit > 1000000 ? limit : 1000000, errstr, errstr_size);
    if (!kc)
        return NULL;
    rd_kafka_conf_set_dr_msg_cb(kc, forward_dr_cb);
    rd_kafka_t *rk = idem_kafka_new(RD_KAFKA_PRODUCER, kc, "output producer",
                                    errstr, errstr_size);
    if (!rk)
        return NULL;
    forward_t *f = idem_xcalloc(1, sizeof(*f));
    f->conf = conf;
    f->rk = rk;
    f->rkt = rd_kafka_topic_new(rk, conf->output_topic, NULL);
    if (!f->rkt) {
        snprintf(errstr, errstr_size, "output.topic \"%s\": %s",
                 conf->output_topic, rd_kafka_err2str(rd_kafka_last_error()));
        rd_kafka_destroy(rk);
        free(f);
        return NULL;
    }
    f->processed_at = (int)idem_conf_int(conf, "forward.processed.at");
    return f;
}

/* How a failed write is classified: the same message can never be written
 * (REJECT), the cluster is unreachable or refuses (OUTAGE: pause, never
 * dead-letter), or this write failed for a reason that may pass (RETRY). */
static idem_result_kind_t forward_error_kind(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
        return IDEM_RESULT_REJECT;
    case RD_KAFKA_RESP_ERR_INVALID_MSG: /* CRC mismatch on the way: again */
        return IDEM_RESULT_RETRY;
    default:
        return IDEM_RESULT_OUTAGE;
    }
}

/* Queues rec's copy to output.topic; returns its ticket, or NULL with the
 * error in *err. */
static ticket_t *forward_write(forward_t *f, const idem_record_t *rec,
                               rd_kafka_resp_err_t *err)
{
    char *value;
    size_t value_len;
    char ts[40];
    if (f->processed_at)
        idem_rfc3339(idem_wall_ms(), ts, sizeof(ts));
    if (f->processed_at == PROCESSED_AT_VALUE && rec->value_is_object) {
        /* The value's own bytes plus processed_at: re-serialising it would
         * rewrite numbers (619.74 as 619.74000000000001). */
        char field[48];
        snprintf(field, sizeof(field), "\"%s\"", ts);
        value = idem_envelope_set_member(rec->value, rec->value_len,
                                         "processed_at", field, &value_len);
    } else {
        value_len = rec->value_len;
        value = rec->value ? idem_xmalloc(value_len ? value_len : 1) : NULL;
        if (value)
            memcpy(value, rec->value, value_len);
    }
    rd_kafka_headers_t *h =
        rec->headers ? rd_kafka_headers_copy(rec->headers) : NULL;
    if (f->processed_at == PROCESSED_AT_HEADER) {
        if (!h)
            h = rd_kafka_headers_new(1);
        rd_kafka_header_add(h, "processed_at", -1, ts, -1);
    }
    ticket_t *t = idem_xcalloc(1, sizeof(*t));
    idem_kafka_msg_t m = {.rkt = f->rkt,
                          .msgflags = RD_KAFKA_MSG_F_FREE,
                          .key = rec->key,
                          .key_len = rec->key_len,
                          .value = value,
                          .value_len = value_len,
                          .headers = h,
                          .opaque = t};
    *err = idem_kafka_produce(f->rk, &m, 100);
    if (*err) {
        free(value);
        free(t);
        if (h)
            rd_kafka_headers_destroy(h);
        return NULL;
    }
    return t;
}

static int forward_submit(void *h, idem_record_t *const *recs, size_t n,
                          const idem_store_pos_t *pos, size_t npos,
                          char *errstr, size_t errstr_size)
{
    (void)pos;
    (void)npos;
    (void)errstr;
    (void)errstr_size;
    forward_t *f = h;
    if (f->n + n > f->cap) {
        f->cap = (f->n + n) * 2;
        f->w = idem_xrealloc(f->w, f->cap * sizeof(*f->w));
    }
    for (size_t i = 0; i < n; i++) {
        write_t *w = &f->w[f->n++];
        memset(w, 0, sizeof(*w));
        w->rec = recs[i];
        rd_kafka_resp_err_t err;
        w->t = forward_write(f, recs[i], &err);
        if (!w->t) {
            w->kind = forward_error_kind(err);
            snprintf(w->detail, sizeof(w->detail), "output: %s",
                     rd_kafka_err2str(err));
        }
    }
    return 0;
}

static size_t forward_collect(void *h, idem_result_t *out, size_t max,
                              int timeout_ms)
{
    forward_t *f = h;
    rd_kafka_poll(f->rk, f->n ? timeout_ms : 0);
    size_t got = 0, keep = 0;
    for (size_t i = 0; i < f->n; i++) {
        write_t *w = &f->w[i];
        if (got == max || (w->t && w->t->state == 0)) {
            f->w[keep++] = *w;
            continue;
        }
        if (w->t) {
            if (w->t->state == 1) {
                w->kind = IDEM_RESULT_DONE;
            } else {
                w->kind = forward_error_kind(w->t->err);
                snprintf(w->detail, sizeof(w->detail), "output: %s",
                         rd_kafka_err2str(w->t->err));
            }
            free(w->t);
        }
        idem_result_set(&out[got++], w->rec, w->kind, "%s", w->detail);
    }
    f->n = keep;
    return got;
}

static size_t forward_inflight(void *h)
{
    return ((forward_t *)h)->n;
}

static void forward_drain(void *h, int64_t deadline_ms)
{
    forward_t *f = h;
    int64_t left = deadline_ms - idem_now_ms();
    if (f->n)
        rd_kafka_flush(f->rk, left > 0 ? (int)left : 0);
    /* What is still unacknowledged is abandoned: its lease expires
     * unmarked and the next owner writes it again. Finished writes stay
     * for collect. */
    for (size_t i = 0; i < f->n; i++) {
        write_t *w = &f->w[i];
        if (w->t && w->t->state == 0) {
            w->t->orphan = 1;
            w->t = NULL;
            w->kind = IDEM_RESULT_OUTAGE;
            snprintf(w->detail, sizeof(w->detail),
                     "output: writes to %s not acknowledged",
                     f->conf->output_topic);
        }
    }
}

static int forward_fatal(void *h, char *errstr, size_t errstr_size)
{
    forward_t *f = h;
    return idem_kafka_fatal(f->rk, "output producer", errstr, errstr_size);
}

static void forward_stop(void *h)
{
    forward_t *f = h;
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        if (f->w[i].t)
            f->w[i].t->orphan = 1;
    /* Unacknowledged writes are not marked done: the next owner of the
     * partition redoes them. Nothing to wait for here. */
    rd_kafka_purge(f->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_flush(f->rk, 100); /* reports free orphaned tickets */
    rd_kafka_topic_destroy(f->rkt);
    rd_kafka_destroy(f->rk);
    free(f->w);
    free(f);
}

static const char *forward_output(const idem_conf_t *conf, int *as_sent)
{
    *as_sent = idem_conf_int(conf, "forward.processed.at") != 1;
    return conf->output_topic;
}

const idem_handler_ops_t idem_handler_forward = {
    .api_version = IDEM_HANDLER_API_VERSION,
    .name = "forward",
    .effect = IDEM_EFFECT_EXTERNAL,
    .keeps_order = 1, /* one producer: each partition's output in order */
    .doc = "each new record copied to output.topic (key, value, headers) "
           "under a lease, marked done once the broker acknowledged it",
    .keys = forward_keys,
    .validate = forward_validate,
    .start = forward_start,
    .submit = forward_submit,
    .collect = forward_collect,
    .inflight = forward_inflight,
    .drain = forward_drain,
    .fatal = forward_fatal,
    .stop = forward_stop,
    .output = forward_output,
};
