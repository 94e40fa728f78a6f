/* dlq: the dead-letter producer: poison records with their original key,
 * bytes and headers plus dlq.* headers that say why. */
#include "kafka/dlq.h"
#include "kafka/produce.h"
#include "kafka/kafka.h"
#include "base/log.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct idem_dlq_s {
    const idem_conf_t *conf;
    idem_dlq_report_cb *report;
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
};

/* Delivery report callback: fires on the thread that calls rd_kafka_poll or
 * rd_kafka_flush for this producer (the processing thread). */
static void dlq_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    idem_dlq_t *d = opaque;
    if (m->err)
        idem_log_kv(IDEM_LOG_WARN, "dlq write failed", "error",
                    rd_kafka_err2str(m->err), NULL);
    d->report(m->_private, m->err);
}

idem_dlq_t *idem_dlq_new(const idem_conf_t *conf, idem_dlq_report_cb *report,
                         char *errstr, size_t errstr_size)
{
    idem_dlq_t *d = idem_xcalloc(1, sizeof(*d));
    d->conf = conf;
    d->report = report;
    /* A dead letter carries the original value, which may be larger than
     * librdkafka's default limit (too-large records by definition are):
     * allow the protocol maximum unless kafka.message.max.bytes says
     * otherwise. */
    rd_kafka_conf_t *kc =
        idem_kafka_writer_conf(conf, 1000000000, errstr, errstr_size);
    if (!kc) {
        free(d);
        return NULL;
    }
    rd_kafka_conf_set_opaque(kc, d);
    rd_kafka_conf_set_dr_msg_cb(kc, dlq_dr_cb);
    rd_kafka_t *rk = idem_kafka_new(RD_KAFKA_PRODUCER, kc, "dlq producer",
                                    errstr, errstr_size);
    if (!rk) {
        free(d);
        return NULL;
    }
    d->rk = rk;
    /* Fails only for an invalid name or conflicting topic settings: a
     * member that cannot write dead letters must not start. */
    d->rkt = rd_kafka_topic_new(rk, conf->dlq_topic, NULL);
    if (!d->rkt) {
        snprintf(errstr, errstr_size, "dlq.topic \"%s\": %s", conf->dlq_topic,
                 rd_kafka_err2str(rd_kafka_last_error()));
        rd_kafka_destroy(rk);
        free(d);
        return NULL;
    }
    return d;
}

void idem_dlq_destroy(idem_dlq_t *d)
{
    if (!d)
        return;
    /* Unacknowledged dead letters are not finished, so their offsets were
     * not committed: the next owner writes them again. No need to wait. */
    rd_kafka_purge(d->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_flush(d->rk, 100); /* delivers the purge reports */
    rd_kafka_topic_destroy(d->rkt);
    rd_kafka_destroy(d->rk);
    free(d);
}

rd_kafka_queue_t *idem_dlq_queue(idem_dlq_t *d)
{
    return rd_kafka_queue_get_main(d->rk);
}

void idem_dlq_poll(idem_dlq_t *d)
{
    rd_kafka_poll(d->rk, 0);
}

void idem_dlq_wait(idem_dlq_t *d, int timeout_ms)
{
    rd_kafka_poll(d->rk, timeout_ms);
}

static void hdr_add(rd_kafka_headers_t *h, const char *name, const char *v)
{
    rd_kafka_header_add(h, name, -1, v, -1);
}

/* Headers a dead letter gets here. A record that already carries one (a
 * copy of a dead letter fed back by hand, a replay that failed again) has
 * it replaced, so each appears once; dlq.replayed.from and
 * dlq.replay.count are kept, so replays of one record are counted across
 * its trips through the DLQ. */
static const char *const own_headers[] = {"dlq.reason",
                                          "dlq.error",
                                          "dlq.original.topic",
                                          "dlq.original.partition",
                                          "dlq.original.offset",
                                          "dlq.original.timestamp",
                                          "dlq.group",
                                          "dlq.attempts",
                                          "dlq.failed.at",
                                          "dlq.value.dropped",
                                          "kafka_dlt-original-topic",
                                          "kafka_dlt-original-partition",
                                          "kafka_dlt-original-offset",
                                          "kafka_dlt-original-timestamp",
                                          "kafka_dlt-original-timestamp-type",
                                          "kafka_dlt-original-consumer-group",
                                          "kafka_dlt-exception-fqcn",
                                          "kafka_dlt-exception-cause-fqcn",
                                          "kafka_dlt-exception-message",
                                          "kafka_dlt-exception-stacktrace",
                                          NULL};

static void be_put(unsigned char *out, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, v >>= 8)
        out[i] = (unsigned char)(v & 0xff);
}

void idem_dlq_spring_headers(rd_kafka_headers_t *h, const char *topic,
                             int32_t partition, int64_t offset,
                             int64_t timestamp,
                             rd_kafka_timestamp_type_t tstype,
                             const char *group, const char *reason,
                             const char *error)
{
    unsigned char b[8];
    hdr_add(h, "kafka_dlt-original-topic", topic);
    be_put(b, (uint32_t)partition, 4);
    rd_kafka_header_add(h, "kafka_dlt-original-partition", -1, b, 4);
    be_put(b, (uint64_t)offset, 8);
    rd_kafka_header_add(h, "kafka_dlt-original-offset", -1, b, 8);
    be_put(b, (uint64_t)timestamp, 8);
    rd_kafka_header_add(h, "kafka_dlt-original-timestamp", -1, b, 8);
    /* The names of Kafka's TimestampType, as Spring writes them. */
    hdr_add(h, "kafka_dlt-original-timestamp-type",
            tstype == RD_KAFKA_TIMESTAMP_CREATE_TIME       ? "CreateTime"
            : tstype == RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME ? "LogAppendTime"
                                                           : "NoTimestampType");
    hdr_add(h, "kafka_dlt-original-consumer-group", group);
    char fqcn[64];
    snprintf(fqcn, sizeof(fqcn), "%s%s", IDEM_DLQ_SPRING_FQCN_PREFIX, reason);
    hdr_add(h, "kafka_dlt-exception-fqcn", fqcn);
    hdr_add(h, "kafka_dlt-exception-message", error);
    /* Spring always writes a stack trace; ours is its first line. */
    size_t n = strlen(fqcn) + strlen(error) + 3;
    char *trace = idem_xmalloc(n);
    snprintf(trace, n, "%s: %s", fqcn, error);
    hdr_add(h, "kafka_dlt-exception-stacktrace", trace);
    free(trace);
}

int idem_dlq_header_is_own(const char *name)
{
    for (int i = 0; own_headers[i]; i++)
        if (!strcmp(name, own_headers[i]))
            return 1;
    return 0;
}

rd_kafka_headers_t *idem_dlq_headers_new(const rd_kafka_headers_t *orig,
                                         const idem_dlq_origin_t *o,
                                         idem_reason_t reason,
                                         const char *error, int attempts)
{
    rd_kafka_headers_t *h;
    if (orig) {
        h = rd_kafka_headers_copy(orig);
        for (int i = 0; own_headers[i]; i++)
            rd_kafka_header_remove(h, own_headers[i]);
        idem_retrytopic_headers_strip(h);
    } else {
        h = rd_kafka_headers_new(12);
    }
    char num[32], ts[40];
    if (o->format != IDEM_DLQ_HEADERS_SPRING) {
        hdr_add(h, "dlq.reason", idem_reason2str(reason));
        hdr_add(h, "dlq.error", error);
        hdr_add(h, "dlq.original.topic", o->topic);
        snprintf(num, sizeof(num), "%" PRId32, o->partition);
        hdr_add(h, "dlq.original.partition", num);
        snprintf(num, sizeof(num), "%" PRId64, o->offset);
        hdr_add(h, "dlq.original.offset", num);
        snprintf(num, sizeof(num), "%" PRId64, o->timestamp);
        hdr_add(h, "dlq.original.timestamp", num);
        hdr_add(h, "dlq.group", o->group);
        snprintf(num, sizeof(num), "%d", attempts);
        hdr_add(h, "dlq.attempts", num);
        hdr_add(h, "dlq.failed.at",
                idem_rfc3339(o->failed_at_ms, ts, sizeof(ts)));
    }
    if (o->format != IDEM_DLQ_HEADERS_IDEMPROC)
        idem_dlq_spring_headers(h, o->topic, o->partition, o->offset,
                                o->timestamp, o->tstype, o->group,
                                idem_reason2str(reason), error);
    return h;
}

int idem_dlq_send(idem_dlq_t *d, const rd_kafka_message_t *msg,
                  const idem_retry_info_t *from, idem_reason_t reason,
                  const char *error, int attempts, int drop_value, void *opaque,
                  char *errstr, size_t errstr_size)
{
    rd_kafka_headers_t *orig = NULL;
    if (rd_kafka_message_headers(msg, &orig) != RD_KAFKA_RESP_ERR_NO_ERROR)
        orig = NULL;
    rd_kafka_timestamp_type_t tstype;
    idem_dlq_origin_t o = {
        .topic = rd_kafka_topic_name(msg->rkt),
        .partition = msg->partition,
        .offset = msg->offset,
        .timestamp = rd_kafka_message_timestamp(msg, &tstype),
        .group = d->conf->group_id,
        .failed_at_ms = idem_wall_ms(),
        .format = d->conf->dlq_headers_format,
    };
    o.tstype = tstype;
    if (from && from->topic[0]) {
        o.topic = from->topic;
        o.partition = from->partition;
        o.offset = from->offset;
        o.timestamp = from->timestamp;
        o.tstype = from->timestamp >= 0 ? RD_KAFKA_TIMESTAMP_CREATE_TIME
                                        : RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    }
    rd_kafka_headers_t *h =
        idem_dlq_headers_new(orig, &o, reason, error, attempts);
    char num[32];

    idem_kafka_msg_t m = {.rkt = d->rkt,
                          .msgflags = RD_KAFKA_MSG_F_COPY,
                          .key = msg->key,
                          .key_len = msg->key_len,
                          .value = drop_value ? NULL : msg->payload,
                          .value_len = drop_value ? 0 : msg->len,
                          .headers = h,
                          .opaque = opaque};
    snprintf(num, sizeof(num), "%zu", msg->len);
    if (drop_value)
        hdr_add(h, "dlq.value.dropped", num);
    rd_kafka_resp_err_t err = idem_kafka_produce(d->rk, &m, 100);
    if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE && !drop_value) {
        /* see idem_dlq_send's contract: refused at once, h is still ours */
        hdr_add(h, "dlq.value.dropped", num);
        m.value = NULL;
        m.value_len = 0;
        err = idem_kafka_produce(d->rk, &m, 100);
    }
    if (err) {
        rd_kafka_headers_destroy(h); /* not taken over on failure */
        snprintf(errstr, errstr_size, "dlq: %s", rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

int idem_dlq_send_to(idem_dlq_t *d, const char *topic, int32_t partition,
                     const rd_kafka_message_t *msg, rd_kafka_headers_t *h,
                     void *opaque, char *errstr, size_t errstr_size)
{
    idem_kafka_msg_t m = {.topic = topic,
                          .partitioned = partition != RD_KAFKA_PARTITION_UA,
                          .partition = partition,
                          .msgflags = RD_KAFKA_MSG_F_COPY,
                          .key = msg->key,
                          .key_len = msg->key_len,
                          .value = msg->payload,
                          .value_len = msg->len,
                          .headers = h,
                          .opaque = opaque};
    rd_kafka_resp_err_t err = idem_kafka_produce(d->rk, &m, 100);
    if (err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION && m.partitioned) {
        /* Refused at once: the topic is known to have fewer partitions
         * (the check at start could not be made, or the topic was created
         * again). Where the key hashes beats a partition that waits
         * forever; the copy still finds the first's mark (global marks). */
        char num[16];
        snprintf(num, sizeof(num), "%" PRId32, partition);
        idem_log_kv(IDEM_LOG_WARN,
                    "copy sent where its key hashes: no such partition",
                    "topic", topic, "partition", num, NULL);
        m.partitioned = 0;
        err = idem_kafka_produce(d->rk, &m, 100);
    }
    if (err) {
        rd_kafka_headers_destroy(h); /* not taken over on failure */
        snprintf(errstr, errstr_size, "%s: %s", topic, rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

int idem_dlq_flush(idem_dlq_t *d, int timeout_ms)
{
    rd_kafka_flush(d->rk, timeout_ms);
    return rd_kafka_outq_len(d->rk);
}

int idem_dlq_fatal(idem_dlq_t *d, char *buf, size_t size)
{
    return idem_kafka_fatal(d->rk, "dlq producer", buf, size);
}
