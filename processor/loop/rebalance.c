/* rebalance: assignment changes and pausing, every return value checked
 * (rebalance.h). */
#include "loop/rebalance.h"
#include "base/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int idem_rebalance_cooperative(rd_kafka_t *rk)
{
    const char *proto = rd_kafka_rebalance_protocol(rk);
    return proto && !strcmp(proto, "COOPERATIVE");
}

/* Logs and reports a failed assignment call. */
static int failed(const char *what, const char *why, char *errstr,
                  size_t errstr_size)
{
    snprintf(errstr, errstr_size, "kafka: %s: %s", what, why);
    idem_log_kv(IDEM_LOG_ERROR, "rebalance failed", "call", what, "error", why,
                NULL);
    return -1;
}

int idem_rebalance_assign(rd_kafka_t *rk,
                          const rd_kafka_topic_partition_list_t *parts,
                          char *errstr, size_t errstr_size)
{
    if (idem_rebalance_cooperative(rk)) {
        rd_kafka_error_t *e = rd_kafka_incremental_assign(rk, parts);
        if (e) {
            failed("incremental_assign", rd_kafka_error_string(e), errstr,
                   errstr_size);
            rd_kafka_error_destroy(e);
            return -1;
        }
        return 0;
    }
    rd_kafka_resp_err_t err = rd_kafka_assign(rk, parts);
    return err ? failed("assign", rd_kafka_err2str(err), errstr, errstr_size)
               : 0;
}

/* The partitions of parts (borrowed) that librdkafka holds, in a new list
 * the caller destroys; NULL when its assignment cannot be read (parts are
 * then used as they are). One the fetch watch took out of the assignment
 * and could not assign back is still the member's, but librdkafka refuses
 * an incremental unassign that names it: the whole call, so the others
 * would stay assigned. Such a partition is logged and left out. */
static rd_kafka_topic_partition_list_t *
held_only(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *parts)
{
    rd_kafka_topic_partition_list_t *now = NULL;
    if (rd_kafka_assignment(rk, &now))
        return NULL;
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(parts->cnt);
    for (int i = 0; i < parts->cnt; i++) {
        const rd_kafka_topic_partition_t *p = &parts->elems[i];
        if (rd_kafka_topic_partition_list_find(now, p->topic, p->partition)) {
            rd_kafka_topic_partition_list_add(l, p->topic, p->partition)
                ->offset = p->offset;
            continue;
        }
        char part[16];
        snprintf(part, sizeof(part), "%" PRId32, p->partition);
        idem_log_kv(IDEM_LOG_INFO,
                    "unassign: partition not in the assignment, left out",
                    "topic", p->topic, "partition", part, NULL);
    }
    rd_kafka_topic_partition_list_destroy(now);
    return l;
}

int idem_rebalance_unassign(rd_kafka_t *rk,
                            const rd_kafka_topic_partition_list_t *parts,
                            char *errstr, size_t errstr_size)
{
    if (idem_rebalance_cooperative(rk)) {
        rd_kafka_topic_partition_list_t *held = held_only(rk, parts);
        /* Called also with an empty list: in a rebalance callback
         * librdkafka waits for the call. */
        rd_kafka_error_t *e =
            rd_kafka_incremental_unassign(rk, held ? held : parts);
        if (held)
            rd_kafka_topic_partition_list_destroy(held);
        if (e) {
            failed("incremental_unassign", rd_kafka_error_string(e), errstr,
                   errstr_size);
            rd_kafka_error_destroy(e);
            return -1;
        }
        return 0;
    }
    rd_kafka_resp_err_t err = rd_kafka_assign(rk, NULL);
    return err ? failed("assign(NULL)", rd_kafka_err2str(err), errstr,
                        errstr_size)
               : 0;
}

int idem_rebalance_pause(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts,
                         int pause)
{
    rd_kafka_resp_err_t err = pause ? rd_kafka_pause_partitions(rk, parts)
                                    : rd_kafka_resume_partitions(rk, parts);
    int bad = 0;
    if (err) {
        idem_log_kv(IDEM_LOG_WARN, pause ? "pause failed" : "resume failed",
                    "error", rd_kafka_err2str(err), NULL);
        return parts->cnt;
    }
    for (int i = 0; i < parts->cnt; i++) {
        if (!parts->elems[i].err)
            continue;
        char part[16];
        snprintf(part, sizeof(part), "%" PRId32, parts->elems[i].partition);
        idem_log_kv(IDEM_LOG_WARN, pause ? "pause failed" : "resume failed",
                    "topic", parts->elems[i].topic, "partition", part, "error",
                    rd_kafka_err2str(parts->elems[i].err), NULL);
        bad++;
    }
    return bad;
}

rd_kafka_topic_partition_list_t *idem_rebalance_pause_preset(
    rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *parts, int pause)
{
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_copy(parts);
    rd_kafka_resp_err_t err = pause ? rd_kafka_pause_partitions(rk, l)
                                    : rd_kafka_resume_partitions(rk, l);
    rd_kafka_topic_partition_list_t *late = NULL;
    for (int i = 0; i < l->cnt; i++) {
        if (!err && !l->elems[i].err)
            continue;
        /* Unknown to librdkafka yet: it has no pause state to carry. */
        if (!pause)
            continue;
        if (!late)
            late = rd_kafka_topic_partition_list_new(l->cnt);
        rd_kafka_topic_partition_list_add(late, l->elems[i].topic,
                                          l->elems[i].partition);
    }
    rd_kafka_topic_partition_list_destroy(l);
    return late;
}
