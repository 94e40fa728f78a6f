/* posread: the records positions vouch for, read back (posread.h). */
#include "loop/posread.h"
#include "base/log.h"
#include "base/util.h"
#include "kafka/kafka.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

struct idem_posread_s {
    const idem_conf_t *conf;
    rd_kafka_t *rk;
    rd_kafka_queue_t *q;
};

idem_posread_t *idem_posread_new(const idem_conf_t *conf, char *errstr,
                                 size_t errstr_size)
{
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    if (idem_conf_apply_kafka(conf, kc, errstr, errstr_size) ||
        idem_kafka_set(kc, "enable.auto.commit", "false", errstr,
                       errstr_size) ||
        idem_kafka_set(kc, "enable.auto.offset.store", "false", errstr,
                       errstr_size) ||
        idem_kafka_set(kc, "enable.partition.eof", "true", errstr,
                       errstr_size)) {
        rd_kafka_conf_destroy(kc);
        return NULL;
    }
    rd_kafka_conf_set_log_cb(kc, idem_log_rdkafka);
    rd_kafka_t *rk = idem_kafka_new(RD_KAFKA_CONSUMER, kc, "position reader",
                                    errstr, errstr_size);
    if (!rk)
        return NULL;
    idem_posread_t *r = idem_xcalloc(1, sizeof(*r));
    r->conf = conf;
    r->rk = rk;
    r->q = rd_kafka_queue_new(rk);
    return r;
}

void idem_posread_destroy(idem_posread_t *r)
{
    if (!r)
        return;
    rd_kafka_queue_destroy(r->q);
    rd_kafka_destroy(r->rk);
    free(r);
}

void idem_posread_fingerprint(const rd_kafka_message_t *m,
                              idem_posval_rec_t *out)
{
    rd_kafka_timestamp_type_t tt;
    int64_t ts = rd_kafka_message_timestamp(m, &tt);
    out->offset = m->offset;
    out->timestamp = tt == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? -1 : ts;
    out->hash = idem_posval_hash(m->key, m->key_len, m->payload, m->len);
}

/* A topic handle of the legacy consumer API (no group, commits nothing;
 * an offset out of range is an error, never a reset). Caller destroys.
 * NULL with rd_kafka_last_error() set when librdkafka refuses it. */
static rd_kafka_topic_t *topic_handle(idem_posread_t *r, const char *topic)
{
    rd_kafka_topic_conf_t *tc = rd_kafka_topic_conf_new();
    char kerr[256];
    rd_kafka_topic_conf_set(tc, "auto.commit.enable", "false", kerr,
                            sizeof(kerr));
    rd_kafka_topic_conf_set(tc, "auto.offset.reset", "error", kerr,
                            sizeof(kerr));
    return rd_kafka_topic_new(r->rk, topic, tc);
}

/* The item of (topic, partition) among items[n] still waiting, or NULL. */
static idem_posread_item_t *waiting_item(idem_posread_item_t *items, size_t n,
                                         const int *wait, const char *topic,
                                         int32_t partition)
{
    for (size_t i = 0; i < n; i++)
        if (wait[i] && items[i].partition == partition &&
            !strcmp(items[i].topic, topic))
            return &items[i];
    return NULL;
}

int idem_posread_read(idem_posread_t *r, idem_posread_item_t *items, size_t n,
                      int timeout_ms, char *errstr, size_t errstr_size)
{
    int64_t deadline = idem_now_ms() + timeout_ms;
    int *wait = idem_xcalloc(n ? n : 1, sizeof(*wait));
    rd_kafka_topic_t **rkt = idem_xcalloc(n ? n : 1, sizeof(*rkt));
    size_t waiting = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        idem_posread_item_t *it = &items[i];
        it->now.low = it->now.high = -1;
        it->now.found = 0;
        int64_t left = deadline - idem_now_ms();
        rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
            r->rk, it->topic, it->partition, &it->now.low, &it->now.high,
            left > 0 ? (int)left : 1);
        if (err) {
            snprintf(errstr, errstr_size,
                     "kafka: watermarks of %s [%" PRId32 "]: %s", it->topic,
                     it->partition, rd_kafka_err2str(err));
            rc = -1;
            break;
        }
        if (it->rec_offset < 0 || it->rec_offset < it->now.low ||
            it->rec_offset >= it->now.high)
            continue; /* nothing to read there */
        rkt[i] = topic_handle(r, it->topic);
        if (!rkt[i] || rd_kafka_consume_start_queue(
                           rkt[i], it->partition, it->rec_offset, r->q) == -1) {
            snprintf(errstr, errstr_size, "kafka: read %s [%" PRId32 "]: %s",
                     it->topic, it->partition,
                     rd_kafka_err2str(rd_kafka_last_error()));
            if (rkt[i])
                rd_kafka_topic_destroy(rkt[i]);
            rkt[i] = NULL;
            rc = -1;
            break;
        }
        wait[i] = 1;
        waiting++;
    }
    while (rc == 0 && waiting) {
        int64_t left = deadline - idem_now_ms();
        if (left <= 0) {
            snprintf(errstr, errstr_size,
                     "kafka: the records positions vouch for: no answer "
                     "within %d ms",
                     timeout_ms);
            rc = -1;
            break;
        }
        rd_kafka_message_t *m =
            rd_kafka_consume_queue(r->q, left > 100 ? 100 : (int)left);
        if (!m)
            continue;
        idem_posread_item_t *it =
            m->rkt ? waiting_item(items, n, wait, rd_kafka_topic_name(m->rkt),
                                  m->partition)
                   : NULL;
        if (it && m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            wait[it - items] = 0; /* only control records up to the end */
            waiting--;
        } else if (it && m->err) {
            snprintf(errstr, errstr_size, "kafka: read %s [%" PRId32 "]: %s",
                     it->topic, it->partition, rd_kafka_message_errstr(m));
            rc = -1;
        } else if (it && m->offset >= it->rec_offset) {
            it->now.found = 1;
            idem_posread_fingerprint(m, &it->now.got);
            wait[it - items] = 0;
            waiting--;
        }
        rd_kafka_message_destroy(m);
    }
    for (size_t i = 0; i < n; i++)
        if (rkt[i]) {
            rd_kafka_consume_stop(rkt[i], items[i].partition);
            rd_kafka_topic_destroy(rkt[i]);
        }
    rd_kafka_message_t *m;
    while ((m = rd_kafka_consume_queue(r->q, 0)))
        rd_kafka_message_destroy(m); /* what came after the stop */
    free(rkt);
    free(wait);
    return rc;
}
