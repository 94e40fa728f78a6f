/* retryloop: the loop's side of retry topics (retryloop.h). */
#include "loop/retryloop.h"
#include "base/log.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int idem_retryloop_arrived(const idem_retrytopics_t *rt, rec_t *r,
                           idem_part_t *pt, const rd_kafka_headers_t *h,
                           int64_t now_ms, int64_t wall_ms)
{
    r->tier = pt->retry_tier;
    idem_retry_info_t info;
    idem_retrytopic_info_read(h, &info);
    r->prior_attempts = info.attempts > 0 ? info.attempts : r->tier;
    int64_t delay = idem_retrytopics_delay(rt, r->tier);
    int64_t due = info.due_ms;
    if (due < 0)
        due = (r->view.timestamp >= 0 ? r->view.timestamp : wall_ms) + delay;
    int64_t wait = due - wall_ms;
    if (wait <= 0)
        return 0;
    /* A due time further than the tier's delay and the longest
     * Retry-After (another member's clock ahead, a hand-written header)
     * waits that long, not longer. */
    if (delay > 0 && wait > delay + IDEM_RETRY_AFTER_MAX_MS)
        wait = delay + IDEM_RETRY_AFTER_MAX_MS;
    r->retry_at_ms = now_ms + wait;
    int pause = !pt->hold_until_ms;
    if (r->retry_at_ms > pt->hold_until_ms)
        pt->hold_until_ms = r->retry_at_ms;
    return pause;
}

int idem_retryloop_release(idem_part_t *pt, int64_t now)
{
    if (!pt->hold_until_ms || now < pt->hold_until_ms)
        return 0;
    pt->hold_until_ms = 0;
    return 1;
}

size_t idem_retryloop_held(const idem_offsets_t *offs)
{
    size_t n = 0;
    for (size_t i = 0; i < offs->cnt; i++)
        if (offs->v[i].hold_until_ms)
            n++;
    return n;
}

int idem_retryloop_send(const idem_retrytopics_t *rt, idem_dlq_t *dlq, rec_t *r,
                        ticket_t *t, char *errstr, size_t errstr_size)
{
    const char *topic = idem_retrytopics_next(rt, r->view.topic);
    if (!topic) { /* not an input or retry topic of ours: cannot happen */
        snprintf(errstr, errstr_size, "retry: no tier after topic %s",
                 r->view.topic);
        return -1;
    }
    rd_kafka_headers_t *orig;
    if (rd_kafka_message_headers(r->msg, &orig))
        orig = NULL;
    idem_retry_info_t origin;
    memset(&origin, 0, sizeof(origin));
    if (r->tier == 0 || idem_retrytopic_info_read(orig, &origin)) {
        snprintf(origin.topic, sizeof(origin.topic), "%s", r->view.topic);
        origin.partition = r->view.partition;
        origin.offset = r->view.offset;
        origin.timestamp = r->view.timestamp;
    }
    int64_t delay = idem_retrytopics_delay(rt, r->to_tier);
    int64_t after = r->retry_after_ms < IDEM_RETRY_AFTER_MAX_MS
                        ? r->retry_after_ms
                        : IDEM_RETRY_AFTER_MAX_MS;
    if (after > delay)
        delay = after;
    rd_kafka_headers_t *h = idem_retrytopic_headers_new(
        orig, &origin, r->prior_attempts + r->attempts, idem_wall_ms() + delay,
        r->error);
    /* The partition number the record first came from, whatever its key
     * hashes to: what the record's dedup state is kept under stays the
     * same through every tier (the start checks that every retry topic
     * has that partition: idem_retrytopics_check). */
    char e[400];
    if (idem_dlq_send_to(dlq, topic, origin.partition, r->msg, h, t, e,
                         sizeof(e))) {
        snprintf(errstr, errstr_size, "retry: %s", e);
        return -1;
    }
    return 0;
}

void idem_retryloop_sent(rec_t *r, idem_metrics_t *m)
{
    r->state = REC_DONE;
    idem_metrics_retry_topic_add(m, r->to_tier, 1);
    if (idem_log_enabled(IDEM_LOG_DEBUG)) {
        char part[16], off[24], tier[16];
        snprintf(part, sizeof(part), "%" PRId32, r->view.partition);
        snprintf(off, sizeof(off), "%" PRId64, r->view.offset);
        snprintf(tier, sizeof(tier), "%d", r->to_tier);
        idem_log_kv(IDEM_LOG_DEBUG, "sent to retry topic", "topic",
                    r->view.topic, "partition", part, "offset", off, "tier",
                    tier, "error", r->error, NULL);
    }
}
