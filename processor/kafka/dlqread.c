/* dlqread: reads the DLQ topic once, from each partition's earliest stored
 * offset (or a checkpoint) to its end as of the start. */
#include "kafka/dlqread.h"
#include "kafka/kafka.h"
#include "base/log.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct idem_dlqread_s {
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    rd_kafka_queue_t *q;
    const char *topic;
    int has_group;
    idem_dlqread_part_t *parts;
    size_t part_cnt;
    int64_t *next; /* per part: the next offset expected */
    int *started;  /* per part: consume_start was called */
};

/* The partition count of topic, or -1 with errstr. */
static int partition_count(rd_kafka_t *rk, rd_kafka_topic_t *rkt,
                           const char *topic, int timeout_ms, char *errstr,
                           size_t errstr_size)
{
    const rd_kafka_metadata_t *md;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms);
    if (err) {
        snprintf(errstr, errstr_size, "dlq.topic %s: metadata: %s", topic,
                 rd_kafka_err2str(err));
        return -1;
    }
    int n = -1;
    if (md->topic_cnt == 1 && !md->topics[0].err)
        n = md->topics[0].partition_cnt;
    else
        snprintf(errstr, errstr_size, "dlq.topic %s: %s", topic,
                 rd_kafka_err2str(md->topic_cnt
                                      ? md->topics[0].err
                                      : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
    rd_kafka_metadata_destroy(md);
    return n;
}

/* Reads the group's committed offsets into parts[].start (when set). */
static int committed_starts(idem_dlqread_t *r, int timeout_ms, char *errstr,
                            size_t errstr_size)
{
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new((int)r->part_cnt);
    for (size_t i = 0; i < r->part_cnt; i++)
        rd_kafka_topic_partition_list_add(l, r->topic, r->parts[i].partition);
    rd_kafka_resp_err_t err = rd_kafka_committed(r->rk, l, timeout_ms);
    if (err) {
        snprintf(errstr, errstr_size, "checkpoint: committed offsets: %s",
                 rd_kafka_err2str(err));
        rd_kafka_topic_partition_list_destroy(l);
        return -1;
    }
    for (int i = 0; i < l->cnt; i++)
        if (l->elems[i].offset >= 0)
            r->parts[i].start = l->elems[i].offset;
    rd_kafka_topic_partition_list_destroy(l);
    return 0;
}

idem_dlqread_t *idem_dlqread_new(const idem_conf_t *conf, const char *group,
                                 int64_t from_offset, int timeout_ms,
                                 char *errstr, size_t errstr_size)
{
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    if (idem_conf_apply_kafka(conf, kc, errstr, errstr_size) ||
        (group && idem_kafka_set(kc, "group.id", group, errstr, errstr_size)) ||
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
    rd_kafka_t *rk = idem_kafka_new(RD_KAFKA_CONSUMER, kc, "dlq reader", errstr,
                                    errstr_size);
    if (!rk)
        return NULL;
    idem_dlqread_t *r = idem_xcalloc(1, sizeof(*r));
    r->rk = rk;
    r->topic = conf->dlq_topic;
    r->has_group = group != NULL;
    /* The legacy (simple) consumer API: it needs no group, and with
     * auto.commit.enable=false it commits nothing on its own. */
    rd_kafka_topic_conf_t *tc = rd_kafka_topic_conf_new();
    char kerr[256];
    rd_kafka_topic_conf_set(tc, "auto.commit.enable", "false", kerr,
                            sizeof(kerr));
    /* Retention removing the start while we begin: go on at the new
     * earliest record, not at the end. */
    rd_kafka_topic_conf_set(tc, "auto.offset.reset", "smallest", kerr,
                            sizeof(kerr));
    r->rkt = rd_kafka_topic_new(rk, r->topic, tc); /* takes tc either way */
    if (!r->rkt) {
        snprintf(errstr, errstr_size, "dlq.topic \"%s\": %s", r->topic,
                 rd_kafka_err2str(rd_kafka_last_error()));
        idem_dlqread_destroy(r);
        return NULL;
    }
    r->q = rd_kafka_queue_new(rk);
    int n =
        partition_count(rk, r->rkt, r->topic, timeout_ms, errstr, errstr_size);
    if (n < 0) {
        idem_dlqread_destroy(r);
        return NULL;
    }
    r->part_cnt = (size_t)n;
    r->parts = idem_xcalloc((size_t)n + 1, sizeof(*r->parts));
    r->next = idem_xcalloc((size_t)n + 1, sizeof(*r->next));
    r->started = idem_xcalloc((size_t)n + 1, sizeof(*r->started));
    for (int i = 0; i < n; i++) {
        idem_dlqread_part_t *p = &r->parts[i];
        p->partition = i;
        rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
            rk, r->topic, i, &p->low, &p->high, timeout_ms);
        if (err) {
            snprintf(errstr, errstr_size,
                     "dlq.topic %s: partition %d: watermarks: %s", r->topic, i,
                     rd_kafka_err2str(err));
            idem_dlqread_destroy(r);
            return NULL;
        }
        p->start = p->low;
    }
    if (group && from_offset < 0 &&
        committed_starts(r, timeout_ms, errstr, errstr_size)) {
        idem_dlqread_destroy(r);
        return NULL;
    }
    for (size_t i = 0; i < r->part_cnt; i++) {
        idem_dlqread_part_t *p = &r->parts[i];
        if (from_offset >= 0)
            p->start = from_offset;
        if (p->start < p->low)
            p->start = p->low; /* retention removed the rest */
        if (p->start > p->high)
            p->start = p->high;
        r->next[i] = p->start;
        if (p->start >= p->high)
            continue;
        if (rd_kafka_consume_start_queue(r->rkt, p->partition, p->start,
                                         r->q) == -1) {
            snprintf(errstr, errstr_size,
                     "dlq.topic %s: partition %" PRId32 ": %s", r->topic,
                     p->partition, rd_kafka_err2str(rd_kafka_last_error()));
            idem_dlqread_destroy(r);
            return NULL;
        }
        r->started[i] = 1;
    }
    return r;
}

void idem_dlqread_destroy(idem_dlqread_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->part_cnt; i++)
        if (r->started[i])
            rd_kafka_consume_stop(r->rkt, r->parts[i].partition);
    if (r->q)
        rd_kafka_queue_destroy(r->q);
    if (r->rkt)
        rd_kafka_topic_destroy(r->rkt);
    rd_kafka_destroy(r->rk);
    free(r->parts);
    free(r->next);
    free(r->started);
    free(r);
}

const idem_dlqread_part_t *idem_dlqread_parts(const idem_dlqread_t *r,
                                              size_t *cnt)
{
    *cnt = r->part_cnt;
    return r->parts;
}

static int all_done(const idem_dlqread_t *r)
{
    for (size_t i = 0; i < r->part_cnt; i++)
        if (r->next[i] < r->parts[i].high)
            return 0;
    return 1;
}

int idem_dlqread_next(idem_dlqread_t *r, rd_kafka_message_t **msg,
                      int timeout_ms, char *errstr, size_t errstr_size)
{
    int64_t deadline = idem_now_ms() + timeout_ms;
    while (!all_done(r)) {
        int64_t left = deadline - idem_now_ms();
        if (left <= 0) {
            snprintf(errstr, errstr_size,
                     "dlq.topic %s: nothing read for %d ms before its end",
                     r->topic, timeout_ms);
            return -1;
        }
        rd_kafka_message_t *m =
            rd_kafka_consume_queue(r->q, left > 100 ? 100 : (int)left);
        if (!m)
            continue;
        int32_t pi = m->partition;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            /* Nothing more (e.g. control records at the end): done. */
            if (pi >= 0 && (size_t)pi < r->part_cnt && m->offset >= r->next[pi])
                r->next[pi] = r->parts[pi].high;
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->err) {
            /* The topic or partition is gone, or we may not read it: stop.
             * Anything else (a broker restarting, a connection reset) the
             * consumer recovers from: wait, up to the timeout. */
            int fatal = m->err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION ||
                        m->err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
                        m->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
                        m->err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
            snprintf(errstr, errstr_size,
                     "dlq.topic %s: partition %" PRId32 ": %s", r->topic, pi,
                     rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            if (fatal)
                return -1;
            idem_log_kv(IDEM_LOG_WARN, "dlq read", "error", errstr, NULL);
            continue;
        }
        if (pi < 0 || (size_t)pi >= r->part_cnt) {
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->offset >= r->parts[pi].high) { /* arrived after the start */
            r->next[pi] = r->parts[pi].high;
            rd_kafka_message_destroy(m);
            continue;
        }
        r->next[pi] = m->offset + 1;
        *msg = m;
        return 1;
    }
    return 0;
}

int idem_dlqread_commit(idem_dlqread_t *r, size_t i, int64_t next, char *errstr,
                        size_t errstr_size)
{
    if (!r->has_group || i >= r->part_cnt) {
        snprintf(errstr, errstr_size, "checkpoint: no group to commit for");
        return -1;
    }
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, r->topic, r->parts[i].partition)
        ->offset = next;
    rd_kafka_resp_err_t err = rd_kafka_commit(r->rk, l, 0);
    if (!err && l->elems[0].err)
        err = l->elems[0].err;
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        snprintf(errstr, errstr_size,
                 "checkpoint: commit of %s/%" PRId32 " at %" PRId64 ": %s",
                 r->topic, r->parts[i].partition, next, rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}
