/* producer: an idempotent librdkafka producer (acks=all,
 * enable.idempotence=true) that counts delivery reports. */
#include "dev/producer.h"

#include "conf/conf.h"
#include "kafka/produce.h"
#include "base/log.h"
#include "base/util.h"

#include <ctype.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

struct idem_producer_s {
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    idem_producer_stats_t stats;
    int64_t dr_failed; /* failures reported by delivery reports */
    int ack_latency;   /* idem_producer_ack_latency_on() was called */
    /* Acknowledged messages by whole milliseconds from CreateTime to the
     * delivery report; the last slot holds everything at or past the
     * bound (and a clock step backwards counts as 0). */
    int64_t ack_ms[IDEM_PRODUCER_ACK_MS_MAX + 1];
};

/* Delivery report callback: fires once per message from rd_kafka_poll() or
 * rd_kafka_flush() on the caller's thread. */
static void producer_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *msg,
                           void *opaque)
{
    (void)rk;
    idem_producer_t *p = opaque;
    if (!msg->err) {
        p->stats.acked++;
        /* The enqueue time rides in the message's opaque: the timestamp a
         * delivery report carries is the broker's LogAppendTime when it
         * returns one (the mock cluster returns a constant 1234). */
        int64_t ts = (int64_t)(intptr_t)msg->_private;
        if (ts > 0) {
            int64_t ms = idem_wall_ms() - ts;
            p->ack_ms[ms < 0                          ? 0
                      : ms > IDEM_PRODUCER_ACK_MS_MAX ? IDEM_PRODUCER_ACK_MS_MAX
                                                      : ms]++;
        }
        return;
    }
    p->stats.failed++;
    p->dr_failed++;
    if (!p->stats.first_error[0])
        snprintf(p->stats.first_error, sizeof(p->stats.first_error), "%s",
                 rd_kafka_err2str(msg->err));
}

/* Error callback: fires from rd_kafka_poll()/rd_kafka_flush() on the
 * caller's thread. Transient errors (broker down, ...) are already logged by
 * librdkafka's log; only fatal ones (the idempotent producer gave up) are
 * worth a line of their own. */
static void producer_error_cb(rd_kafka_t *rk, int err, const char *reason,
                              void *opaque)
{
    (void)opaque;
    if (err != RD_KAFKA_RESP_ERR__FATAL)
        return;
    char fatal[256];
    rd_kafka_fatal_error(rk, fatal, sizeof(fatal));
    idem_log_kv(IDEM_LOG_ERROR, "fatal producer error", "component", "producer",
                "error", fatal[0] ? fatal : reason, NULL);
}

static void conf_dump(rd_kafka_conf_t *conf, FILE *out)
{
    size_t cnt;
    const char **kv = rd_kafka_conf_dump(conf, &cnt);
    fprintf(out, "# effective librdkafka producer configuration\n");
    for (size_t i = 0; i + 1 < cnt; i += 2)
        fprintf(out, "%s=%s\n", kv[i],
                idem_conf_kafka_prop_is_secret(kv[i]) ? "[redacted]"
                                                      : kv[i + 1]);
    rd_kafka_conf_dump_free(kv, cnt);
    rd_kafka_topic_conf_t *tconf = rd_kafka_conf_get_default_topic_conf(conf);
    if (!tconf)
        return;
    kv = rd_kafka_topic_conf_dump(tconf, &cnt);
    for (size_t i = 0; i + 1 < cnt; i += 2)
        fprintf(out, "%s=%s\n", kv[i],
                idem_conf_kafka_prop_is_secret(kv[i]) ? "[redacted]"
                                                      : kv[i + 1]);
    rd_kafka_conf_dump_free(kv, cnt);
}

static int conf_set(rd_kafka_conf_t *conf, const char *name, const char *value,
                    char *errstr, size_t errstr_size)
{
    char kerr[512];
    if (rd_kafka_conf_set(conf, name, value, kerr, sizeof(kerr)) !=
        RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "-X %s: %s", name, kerr);
        return -1;
    }
    return 0;
}

idem_producer_t *idem_producer_new(const char *bootstrap, const char *topic,
                                   char *const *props, size_t prop_cnt,
                                   size_t max_value_bytes, FILE *dump,
                                   char *errstr, size_t errstr_size)
{
    /* No fastbins in this process: each message's header memory (the
     * rd_kafka_headers_t, its list and the two headers, all under 128 bytes)
     * then comes from chunks that free() has merged with their neighbours,
     * next to the message librdkafka allocates for it, instead of from
     * fastbin chunks freed by an earlier delivery report, scattered and out
     * of cache when librdkafka's broker thread reads them to write the
     * batch. Measured: 2.0-3.3 -> 2.0-2.2 µs of CPU a record with the two
     * envelope headers (docs/design.md, the producing path). Nothing else
     * in `produce` depends on fastbins. */
#ifdef M_MXFAST
    mallopt(M_MXFAST, 0);
#endif
    idem_producer_t *p = idem_xcalloc(1, sizeof(*p));
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    int max_bytes_set = 0;
    rd_kafka_conf_set_opaque(conf, p);
    rd_kafka_conf_set_dr_msg_cb(conf, producer_dr_cb);
    rd_kafka_conf_set_log_cb(conf, idem_log_rdkafka);
    rd_kafka_conf_set_error_cb(conf, producer_error_cb);
    if (conf_set(conf, "bootstrap.servers", bootstrap, errstr, errstr_size) ||
        conf_set(conf, "log.queue", "true", errstr, errstr_size) ||
        conf_set(conf, "client.id", "idemproc-produce", errstr, errstr_size))
        goto fail;
    for (size_t i = 0; i < prop_cnt; i++) {
        const char *eq = strchr(props[i], '=');
        if (!eq || eq == props[i]) {
            snprintf(errstr, errstr_size, "-X: \"%s\" is not property=value",
                     props[i]);
            goto fail;
        }
        char name[256];
        size_t nl = (size_t)(eq - props[i]);
        if (nl >= sizeof(name))
            nl = sizeof(name) - 1;
        memcpy(name, props[i], nl);
        name[nl] = '\0';
        if (!strcmp(name, "message.max.bytes"))
            max_bytes_set = 1;
        if (conf_set(conf, name, eq + 1, errstr, errstr_size))
            goto fail;
    }
    /* The promise of this command: no duplicates from producer retries and
     * nothing acknowledged before every in-sync replica has it. */
    if (conf_set(conf, "enable.idempotence", "true", errstr, errstr_size) ||
        conf_set(conf, "acks", "all", errstr, errstr_size))
        goto fail;
    if (!max_bytes_set && max_value_bytes + 65536 > 1000000) {
        char v[32];
        snprintf(v, sizeof(v), "%zu", max_value_bytes + 65536);
        if (conf_set(conf, "message.max.bytes", v, errstr, errstr_size))
            goto fail;
    }
    if (dump)
        conf_dump(conf, dump);
    char kerr[512];
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, kerr, sizeof(kerr));
    if (!p->rk) {
        snprintf(errstr, errstr_size, "producer: %s", kerr);
        goto fail;
    }
    conf = NULL; /* owned by rk now */
    /* Logs served by rd_kafka_poll (log.queue is set above). */
    rd_kafka_resp_err_t lerr = rd_kafka_set_log_queue(p->rk, NULL);
    if (lerr) {
        snprintf(errstr, errstr_size, "producer: %s", rd_kafka_err2str(lerr));
        goto fail;
    }
    p->rkt = rd_kafka_topic_new(p->rk, topic, NULL);
    if (!p->rkt) {
        snprintf(errstr, errstr_size, "-t %s: %s", topic,
                 rd_kafka_err2str(rd_kafka_last_error()));
        goto fail;
    }
    return p;
fail:
    if (conf)
        rd_kafka_conf_destroy(conf);
    idem_producer_destroy(p);
    return NULL;
}

int idem_producer_wait_broker(idem_producer_t *p, int timeout_ms, char *errstr,
                              size_t errstr_size)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err =
        rd_kafka_metadata(p->rk, 0, NULL, &md, timeout_ms);
    if (md)
        rd_kafka_metadata_destroy(md);
    if (err) {
        snprintf(errstr, errstr_size, "%s", rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

/* Sends with msgflags RD_KAFKA_MSG_F_COPY or 0 (the value read in place). */
static int producer_send(idem_producer_t *p, int msgflags, const void *key,
                         size_t key_len, const void *value, size_t value_len,
                         const char *hdr_message_id,
                         const char *hdr_idempotency_key, char *errstr,
                         size_t errstr_size)
{
    idem_kafka_msg_t m = {
        .rkt = p->rkt,
        .msgflags = msgflags,
        .key = key,
        .key_len = key_len,
        .value = (void *)value,
        .value_len = value_len,
        .headers =
            idem_kafka_envelope_headers(hdr_message_id, hdr_idempotency_key),
        .opaque = (void *)(intptr_t)(p->ack_latency ? idem_wall_ms() : 0),
    };
    rd_kafka_resp_err_t err = idem_kafka_produce(p->rk, &m, 100);
    if (!err) { /* the headers belong to the message now */
        p->stats.enqueued++;
        return 0;
    }
    if (m.headers)
        rd_kafka_headers_destroy(m.headers);
    p->stats.failed++;
    snprintf(errstr, errstr_size, "%s", rd_kafka_err2str(err));
    if (!p->stats.first_error[0])
        snprintf(p->stats.first_error, sizeof(p->stats.first_error), "%s",
                 rd_kafka_err2str(err));
    return -1;
}

int idem_producer_send(idem_producer_t *p, const void *key, size_t key_len,
                       const void *value, size_t value_len,
                       const char *hdr_message_id,
                       const char *hdr_idempotency_key, char *errstr,
                       size_t errstr_size)
{
    return producer_send(p, RD_KAFKA_MSG_F_COPY, key, key_len, value, value_len,
                         hdr_message_id, hdr_idempotency_key, errstr,
                         errstr_size);
}

int idem_producer_send_kept(idem_producer_t *p, const void *key, size_t key_len,
                            const void *value, size_t value_len,
                            const char *hdr_message_id,
                            const char *hdr_idempotency_key, char *errstr,
                            size_t errstr_size)
{
    return producer_send(p, 0, key, key_len, value, value_len, hdr_message_id,
                         hdr_idempotency_key, errstr, errstr_size);
}

void idem_producer_ack_latency_on(idem_producer_t *p)
{
    p->ack_latency = 1;
}

void idem_producer_poll(idem_producer_t *p, int timeout_ms)
{
    rd_kafka_poll(p->rk, timeout_ms);
}

int idem_producer_flush(idem_producer_t *p, volatile int *abort)
{
    int purged = 0;
    while (rd_kafka_outq_len(p->rk) > 0) {
        if (abort && *abort && !purged) {
            rd_kafka_purge(p->rk,
                           RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
            purged = 1;
        }
        rd_kafka_flush(p->rk, 100);
    }
    rd_kafka_poll(p->rk, 0); /* serve the last reports */
    return (int)idem_producer_inflight(p);
}

void idem_producer_stats(const idem_producer_t *p, idem_producer_stats_t *stats)
{
    *stats = p->stats;
}

int64_t idem_producer_ack_quantile_ms(const idem_producer_t *p, double q)
{
    int64_t total = 0, cum = 0;
    for (int i = 0; i <= IDEM_PRODUCER_ACK_MS_MAX; i++)
        total += p->ack_ms[i];
    if (total == 0)
        return -1;
    for (int i = 0; i <= IDEM_PRODUCER_ACK_MS_MAX; i++) {
        cum += p->ack_ms[i];
        if ((double)cum >= q * (double)total)
            return i;
    }
    return IDEM_PRODUCER_ACK_MS_MAX;
}

int64_t idem_producer_inflight(const idem_producer_t *p)
{
    return p->stats.enqueued - p->stats.acked - p->dr_failed;
}

void idem_producer_destroy(idem_producer_t *p)
{
    if (!p)
        return;
    if (p->rkt)
        rd_kafka_topic_destroy(p->rkt);
    if (p->rk)
        rd_kafka_destroy(p->rk);
    free(p);
}
