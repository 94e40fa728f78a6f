/* retryloop: the loop's side of retry topics (retry.topics, retrytopic.h):
 * a record arriving from a retry topic waits until it is due, with its
 * partition paused meanwhile (no more records of it are fetched, none is
 * polled for in a loop); a record failing retriably is copied to the next
 * tier. Part of the loop (loop.h). */
#include "loop/loop.h"
#include "base/log.h"
#include "loop/rebalance.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The longest Retry-After honoured (the webhook's own cap): a plugin's
 * far-off retry_after_ms must not park a record for days. */
#define RETRY_AFTER_MAX_MS 300000

static void part_pause(idem_pipeline_t *p, const idem_part_t *pt, int pause)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition);
    idem_rebalance_pause(p->rk, l, pause);
    rd_kafka_topic_partition_list_destroy(l);
}

static void waiting_update(idem_pipeline_t *p)
{
    int64_t n = 0;
    for (size_t i = 0; i < p->offs.cnt; i++)
        if (p->offs.v[i].hold_until_ms)
            n++;
    idem_metrics_retry_waiting_set(p->m, n);
}

/* A record just polled from retry partition pt (tier pt->retry_tier):
 * when retry.due.at is ahead, it waits in hand until then (retry_at_ms,
 * which also holds back the later records of the partition in hand) and
 * the partition is paused so nothing more of it is fetched; the main loop
 * resumes it when due (idem_loop_retry_release). Without a readable
 * retry.due.at the record is due its tier's delay after its timestamp. */
void idem_loop_retry_arrived(idem_pipeline_t *p, rec_t *r, idem_part_t *pt)
{
    r->tier = pt->retry_tier;
    rd_kafka_headers_t *h;
    if (rd_kafka_message_headers(r->msg, &h))
        h = NULL;
    idem_retry_info_t info;
    idem_retrytopic_info_read(h, &info);
    r->prior_attempts = info.attempts > 0 ? info.attempts : r->tier;
    int64_t delay = idem_retrytopics_delay(p->rt, r->tier);
    int64_t wall = idem_wall_ms();
    int64_t due = info.due_ms;
    if (due < 0)
        due = (r->view.timestamp >= 0 ? r->view.timestamp : wall) + delay;
    int64_t wait = due - wall;
    if (wait <= 0)
        return;
    /* A due time further than the tier's delay and the longest
     * Retry-After (another member's clock ahead, a hand-written header)
     * waits that long, not longer. */
    if (delay > 0 && wait > delay + RETRY_AFTER_MAX_MS)
        wait = delay + RETRY_AFTER_MAX_MS;
    r->retry_at_ms = idem_now_ms() + wait;
    p->retry_waiting = 1;
    if (!pt->hold_until_ms && !p->paused)
        part_pause(p, pt, 1);
    if (r->retry_at_ms > pt->hold_until_ms)
        pt->hold_until_ms = r->retry_at_ms;
    waiting_update(p);
}

/* Resumes the retry partitions whose records in hand are due at `now`
 * (while the whole input is paused, pause_all resumes them later). */
void idem_loop_retry_release(idem_pipeline_t *p, int64_t now)
{
    if (!p->rt)
        return;
    int changed = 0;
    for (size_t i = 0; i < p->offs.cnt; i++) {
        idem_part_t *pt = &p->offs.v[i];
        if (!pt->hold_until_ms || now < pt->hold_until_ms)
            continue;
        pt->hold_until_ms = 0;
        changed = 1;
        if (!p->paused)
            part_pause(p, pt, 0);
    }
    if (changed)
        waiting_update(p);
}

/* Queues the copy of r for its next tier (r->to_tier) with ticket t.
 * Its headers keep where the record first came from. Returns 0, or -1
 * when the producer refused to queue it (infrastructure: errstr). */
int idem_loop_retry_send(idem_pipeline_t *p, rec_t *r, ticket_t *t,
                         char *errstr, size_t errstr_size)
{
    const char *topic = idem_retrytopics_next(p->rt, r->view.topic);
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
    int64_t delay = idem_retrytopics_delay(p->rt, r->to_tier);
    int64_t after = r->retry_after_ms < RETRY_AFTER_MAX_MS ? r->retry_after_ms
                                                           : RETRY_AFTER_MAX_MS;
    if (after > delay)
        delay = after;
    rd_kafka_headers_t *h = idem_retrytopic_headers_new(
        orig, &origin, r->prior_attempts + r->attempts, idem_wall_ms() + delay,
        r->error);
    char e[400];
    if (idem_dlq_send_to(p->dlq, topic, r->msg, h, t, e, sizeof(e))) {
        snprintf(errstr, errstr_size, "retry: %s", e);
        return -1;
    }
    return 0;
}

/* The copy of r is acknowledged in its retry topic: r is finished here
 * (no outcome: the copy gets one when it is processed). */
void idem_loop_retry_sent(idem_pipeline_t *p, rec_t *r)
{
    r->state = REC_DONE;
    idem_progress_count(&p->progress, 1);
    idem_metrics_retry_topic_add(p->m, r->to_tier, 1);
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
