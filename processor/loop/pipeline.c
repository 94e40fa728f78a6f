/* pipeline: the processing loop of `idemproc run`: consume batches, hand
 * them to the handler, dead-letter poison, commit finished prefixes,
 * survive rebalances and infrastructure outages (docs/design.md, "Module
 * map"). effects.c (effects.h) and the parts are the rest of the loop; the
 * composed struct below is this file's alone.
 *
 * One thread does everything (librdkafka's callbacks included), so no state
 * here needs a lock. Records wait in hand, in the order they were polled,
 * until they are finished; a partition's offset advances over its
 * contiguous finished prefix only (offsets.c). The handler works while the
 * loop fills the next batch; dead letters are acknowledged asynchronously.
 * While the infrastructure is down every partition is paused and the loop
 * keeps polling (group membership stays alive) and retries with backoff
 * (flow.c). */
#include "loop/effects.h"
#include "kafka/kafka.h"
#include "base/log.h"
#include "loop/fetchwatch.h"
#include "loop/flow.h"
#include "loop/loopkeys.h"
#include "loop/membound.h"
#include "loop/pipeline.h"
#include "loop/rebalance.h"
#include "loop/retryloop.h"
#include "loop/wake.h"
#include "redis/store.h"
#include "redis/rediskeys.h"
#include "obs/procstat.h"
#include "base/util.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <malloc.h>

/* How many batches may wait in memory (in flight, being filled, waiting
 * for a retry or an acknowledgement) before fetching pauses. */
#define BATCHES_IN_HAND 4

/* How often the Redis server's maxmemory-policy is checked again. */
#define POLICY_CHECK_INTERVAL_MS 30000
#define IDLE_CHECK_INTERVAL_MS   1000
#define TOUCH_CHECK_INTERVAL_MS  1000

/* How long collect may wait for an external effect's results when nothing
 * else is to be done (short: the consumer is not polled meanwhile). */
#define EXTERNAL_WAIT_MS 5

struct idem_pipeline_s {
    const idem_conf_t *conf;
    idem_metrics_t *m;
    idem_metrics_acc_t *acc; /* the finished records' figures, merged into
                                m once per turn of the loop (and before
                                anything reads m that must be complete) */
    idem_store_t *store;
    idem_dlq_t *dlq;
    rd_kafka_t *rk;               /* consumer */
    idem_wake_t wake;             /* its queue, the DLQ's and the Redis
                                     reply in one wait (batch_fill) */
    int wake_kafka, wake_dlq;     /* their bits in idem_wake_wait */
    idem_apply_t apply;           /* the handler, through the one effect
                                     protocol (apply.h) */
    idem_envelope_rules_t *rules; /* how records are read */
    idem_retrytopics_t *rt;       /* retry.topics; NULL: blocking retries */
    idem_fetchwatch_t *fw;        /* fetch.stall.ms; NULL: no watch */

    idem_records_t recs; /* rec_t *, in poll order */
    rec_t *spares;       /* released records, reused: no allocation
                            per record (at most the most ever in
                            hand) */
    size_t cnt;          /* records in hand (recs.live) */
    size_t cap;          /* BATCHES_IN_HAND batches: scratch size */
    idem_offsets_t offs; /* the partitions held and their positions */
    idem_flow_t flow;    /* backoff, outage state, pause decision */

    int paused; /* all partitions paused by us */
    int brokers_down;
    int joined;          /* a first assignment (maybe empty) arrived */
    int epoch;           /* bumped on every rebalance: lease fencing */
    char owner[320];     /* "lease:<member>:<epoch>" */
    int recommit;        /* an async commit failed: send all again */
    int collect_wait_ms; /* how long the next collect may wait (external
                            effect in flight, nothing fetched) */

    int64_t stop_by_ms;        /* shutting down: every wait ends by then */
    int close_abandoned;       /* the consumer's close outlived shutdown */
    char fatal[512];           /* a producer's fatal error: stop */
    void (*on_shutdown)(void); /* called once when shutdown begins */
    int64_t last_commit_ms;
    int64_t last_touch_ms;      /* cluster mode: idem_positions_touch in work */
    idem_progress_t progress;   /* the progress line (progress.c) */
    int refused;                /* the Redis server was refused: exit 2 */
    idem_positions_t positions; /* positions in Redis (positions.c) */
    idem_effects_t fx;          /* records to the handler and back, dead letters
                                   (effects.c); bound to the parts above */
    idem_membound_t mem;        /* member.memory.max (membound.c) */
    int64_t mem_read_ms;        /* when RSS was last read */
    int64_t (*rss_fn)(void *);  /* idem_pipeline_rss_source, or NULL */
    void *rss_opaque;
};

/* A consumer whose close was abandoned: its destroy would wait for the
 * same group work (with RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE too), so it
 * is left to the process's exit, which follows the pipeline's; kept
 * reachable here, not a leak. Nothing polls it any more, so none of its
 * callbacks runs. */
static rd_kafka_t *abandoned_rk;

/* The longest one wait in batch_fill: the loop's housekeeping (commits,
 * progress, the idle Redis check) runs at least this often. */
#define WAIT_MAX_MS 100

/* Lets go of a record: its message, and any write still in flight (the
 * delivery report frees that ticket). The record itself goes to the
 * spares. */
static void rec_release(idem_pipeline_t *p, rec_t *r)
{
    idem_envelope_term(&r->env);
    if (r->dlq) {
        p->fx.tickets--;
        idem_deadletter_release(r->dlq);
    }
    rd_kafka_message_destroy(r->msg);
    r->next_spare = p->spares;
    p->spares = r;
}

/* A cleared record: a spare when there is one. */
static rec_t *rec_new(idem_pipeline_t *p)
{
    rec_t *r = p->spares;
    if (!r)
        return idem_xcalloc(1, sizeof(*r));
    p->spares = r->next_spare;
    memset(r, 0, offsetof(rec_t, error));
    r->error[0] = '\0';
    return r;
}

static void owner_update(idem_pipeline_t *p)
{
    snprintf(p->owner, sizeof(p->owner), "lease:%s:%d", p->conf->member_id,
             p->epoch);
}

static idem_part_t *idem_loop_part_find(idem_pipeline_t *p, const char *topic,
                                        int32_t part)
{
    return idem_offsets_find(&p->offs, topic, part);
}

static idem_part_t *idem_loop_rec_part(idem_pipeline_t *p, const rec_t *r)
{
    return idem_loop_part_find(p, r->view.topic, r->view.partition);
}

/* A handler's request holds the store's connection: nothing else may
 * use it until its replies were read. */
static int idem_loop_store_busy(const idem_pipeline_t *p)
{
    return idem_store_busy(p->store);
}

static void set_ready(idem_pipeline_t *p)
{
    const char *why = idem_flow_not_ready(&p->flow, p->stop_by_ms != 0,
                                          p->joined, p->brokers_down);
    if (!why)
        why = idem_fetchwatch_not_ready(p->fw);
    if (!why)
        why = idem_positions_not_ready(&p->positions, &p->offs);
    idem_metrics_ready_set(p->m, why == NULL, why);
}

/* How long a blocking wait (an output flush) may take: half of
 * shutdown.timeout.ms normally, what is left of it while shutting down. */
static int idem_loop_wait_budget_ms(const idem_pipeline_t *p)
{
    if (!p->stop_by_ms)
        return (int)(p->conf->shutdown_timeout_ms / 2);
    int64_t left = p->stop_by_ms - idem_now_ms();
    return left > 0 ? (int)left : 0;
}

/* Commits finished offsets: asynchronously (the result arrives in
 * commit_cb) or synchronously (revoke, shutdown). */
static void commit_offsets(idem_pipeline_t *p,
                           const rd_kafka_topic_partition_list_t *subset,
                           int sync)
{
    /* A committed record is counted: its figures are shown first. */
    idem_metrics_acc_merge(p->acc);
    if (!idem_loop_store_busy(p) && !p->flow.down && !p->refused)
        idem_positions_save(&p->positions, &p->offs, &p->recs, subset);
    rd_kafka_topic_partition_list_t *l =
        idem_offsets_commit_list(&p->offs, subset, p->recommit);
    p->last_commit_ms = idem_now_ms();
    if (!l)
        return;
    for (int i = 0; i < l->cnt; i++) {
        idem_part_t *pt =
            idem_loop_part_find(p, l->elems[i].topic, l->elems[i].partition);
        pt->committed = pt->saved;
    }
    if (!subset)
        p->recommit = 0;
    /* commit_cb reports the result (synchronous commits included); only a
     * request that could not even be made is counted here. */
    rd_kafka_resp_err_t err = rd_kafka_commit(p->rk, l, sync ? 0 : 1);
    if (err) {
        p->recommit = 1;
        if (!sync)
            idem_metrics_commit_add(p->m, 0);
    }
    rd_kafka_topic_partition_list_destroy(l);
}

/* Offset commit result callback: fires inside rd_kafka_consumer_poll (or
 * rd_kafka_commit) on the processing thread. */
static void commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    (void)rk;
    (void)offsets;
    idem_pipeline_t *p = opaque;
    if (err == RD_KAFKA_RESP_ERR__NO_OFFSET)
        return;
    idem_metrics_commit_add(p->m, err == RD_KAFKA_RESP_ERR_NO_ERROR);
    if (err) {
        idem_log_kv(IDEM_LOG_WARN, "offset commit failed", "error",
                    rd_kafka_err2str(err), NULL);
        p->recommit = 1;
    } else if (p->brokers_down) {
        p->brokers_down = 0; /* the coordinator answered */
        set_ready(p);
    }
}

/* Releases the records for which drop(p, r, ctx) is true and closes the
 * gaps, keeping the poll order of the rest. */
typedef struct {
    idem_pipeline_t *p;
    int (*drop)(idem_pipeline_t *p, const rec_t *r, const void *ctx);
    const void *ctx;
} remove_ctx_t;

static int remove_one(void *rec, void *ctx)
{
    remove_ctx_t *c = ctx;
    if (!c->drop(c->p, rec, c->ctx))
        return 0;
    rec_release(c->p, rec);
    return 1;
}

static void idem_loop_batch_remove_if(idem_pipeline_t *p,
                                      int (*drop)(idem_pipeline_t *p,
                                                  const rec_t *r,
                                                  const void *ctx),
                                      const void *ctx)
{
    remove_ctx_t c = {p, drop, ctx};
    idem_records_remove_if(&p->recs, remove_one, &c);
    p->cnt = p->recs.live;
}

/* Moves its partition's next_offset over the record if the prefix before
 * it is finished; whether it is finished and below the prefix: done with
 * it. */
static int rec_committable(idem_pipeline_t *p, const rec_t *r, const void *ctx)
{
    (void)ctx;
    idem_part_t *pt = idem_loop_rec_part(p, r);
    int take =
        idem_offsets_advance_take(pt, r->view.offset, r->state == REC_DONE);
    /* Just below the prefix now: the next position vouches for it. */
    if (take && pt->next_offset == r->view.offset + 1)
        idem_posread_fingerprint(r->msg, &pt->fp);
    return take;
}

/* Moves each partition's next_offset over the contiguous prefix of
 * finished records and drops the records that are finished and below it,
 * in one walk over the records in hand (poll order: a partition's offsets
 * ascend). */
static void advance_offsets(idem_pipeline_t *p)
{
    idem_offsets_advance_begin(&p->offs);
    idem_loop_batch_remove_if(p, rec_committable, NULL);
    idem_metrics_inflight_set(p->m, (int64_t)p->cnt);
    idem_apply_table_gauges(&p->apply, p->m, p->conf->dedup_memory_max);
}

/* Drops the records of `parts` from the batch without finishing them
 * (the partitions moved to another member, which will read them again). */
static int rec_in_partitions(idem_pipeline_t *p, const rec_t *r,
                             const void *parts)
{
    (void)p;
    return rd_kafka_topic_partition_list_find(parts,
                                              rd_kafka_topic_name(r->msg->rkt),
                                              r->msg->partition) != NULL;
}

static void batch_drop_partitions(idem_pipeline_t *p,
                                  const rd_kafka_topic_partition_list_t *parts)
{
    idem_loop_batch_remove_if(p, rec_in_partitions, parts);
}

/* positions.c's hook before it seeks pt back to the position Redis
 * holds: what the handler holds is finished or abandoned, and pt's
 * records in hand are dropped (read again from the position). */
static int rec_in_part(idem_pipeline_t *p, const rec_t *r, const void *pt)
{
    return idem_loop_rec_part(p, r) == pt;
}

static void before_rewind(void *ctx, const idem_part_t *pt)
{
    idem_pipeline_t *p = ctx;
    idem_effects_settle(&p->fx, idem_now_ms() + idem_loop_wait_budget_ms(p));
    idem_loop_batch_remove_if(p, rec_in_part, pt);
    idem_metrics_inflight_set(p->m, (int64_t)p->cnt);
    /* dedup.scope=partition: its table is loaded again before its next
     * chunk (the position it goes back to may be behind the marks). */
    idem_apply_partition_reset(&p->apply, pt->topic, pt->partition);
}

/* Positions from Redis after a reconnect (positions.c), only with no
 * request on the store's connection. Returns 0 or -1 (errstr). */
static int positions_sync(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    if (idem_loop_store_busy(p))
        return 0;
    return idem_positions_sync(&p->positions, &p->offs, &p->recs, errstr,
                               errstr_size);
}

/* Positions for newly assigned partitions (positions.c); the replies of
 * a request in flight come first on the store's connection. */
static void assign_positions(idem_pipeline_t *p,
                             rd_kafka_topic_partition_list_t *parts)
{
    char errstr[512];
    if (idem_loop_store_busy(p))
        idem_effects_collect(&p->fx, 0, errstr, sizeof(errstr));
    if (p->flow.down || p->refused)
        return;
    idem_positions_assign(&p->positions, &p->offs, parts);
}

/* ----------------------------------------------------- pause and resume */

/* Whether a reason other than `except` keeps pt's fetch paused: the one
 * place that says what pauses a partition (all input paused, a retry
 * partition waiting for its head record, a position judged lost, its
 * records in hand all behind busy keys). A reason ending resumes the
 * partition only when no other holds it. */
enum { PAUSE_ANY = 0, PAUSE_ALL, PAUSE_RETRY, PAUSE_KEYS };
static int part_paused(const idem_pipeline_t *p, const idem_part_t *pt,
                       int except)
{
    return (except != PAUSE_ALL && p->paused) ||
           (except != PAUSE_RETRY && pt->hold_until_ms) || pt->lost ||
           (except != PAUSE_KEYS && pt->key_held);
}

static void pause_all(idem_pipeline_t *p, int pause)
{
    pause = pause || p->mem.over; /* member.memory.max (mem_watch) */
    if (p->paused == pause || p->offs.cnt == 0) {
        p->paused = pause;
        idem_metrics_paused_set(p->m, pause ? (int64_t)p->offs.cnt : 0);
        return;
    }
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new((int)p->offs.cnt);
    /* A partition another reason holds stays paused. */
    for (size_t i = 0; i < p->offs.cnt; i++)
        if (pause || !part_paused(p, &p->offs.v[i], PAUSE_ALL))
            rd_kafka_topic_partition_list_add(l, p->offs.v[i].topic,
                                              p->offs.v[i].partition);
    idem_rebalance_pause(p->rk, l, pause);
    rd_kafka_topic_partition_list_destroy(l);
    char held[24];
    snprintf(held, sizeof(held), "%zu", p->cnt);
    const char *why =
        p->mem.over ? "member.memory.max reached" : "records in hand";
    idem_log_kv(pause && p->flow.down ? IDEM_LOG_WARN : IDEM_LOG_DEBUG,
                pause ? "input paused" : "input resumed", "records_in_hand",
                held, "reason",
                pause ? (p->flow.down ? p->flow.reason : why) : "", NULL);
    p->paused = pause;
    idem_metrics_paused_set(p->m, pause ? (int64_t)p->offs.cnt : 0);
}

/* member.memory.max: RSS read every 100 ms; over the bound, the input
 * pauses (librdkafka drops the paused partitions' prefetched records) and
 * the heap's free pages go back to the system; it resumes once RSS is a
 * prefetch bound under it (membound.h). Marks are never dropped. */
#define MEM_READ_INTERVAL_MS 100
static void mem_watch(idem_pipeline_t *p, int64_t now)
{
    if (p->mem.max <= 0 || now - p->mem_read_ms < MEM_READ_INTERVAL_MS)
        return;
    p->mem_read_ms = now;
    int64_t rss =
        p->rss_fn ? p->rss_fn(p->rss_opaque) : idem_procstat_rss_bytes();
    int change = idem_membound_update(&p->mem, rss);
    if (!change)
        return;
    char rssb[24], max[24];
    snprintf(rssb, sizeof(rssb), "%" PRId64, p->mem.last_rss);
    snprintf(max, sizeof(max), "%" PRId64, p->mem.max);
    idem_log_kv(change > 0 ? IDEM_LOG_WARN : IDEM_LOG_INFO,
                change > 0 ? "member.memory.max reached: pausing input"
                           : "member memory under its bound again",
                "rss_bytes", rssb, "member_memory_max", max, NULL);
    idem_metrics_member_memory_set(p->m, p->mem.max, p->mem.over);
    if (change > 0) {
        pause_all(p, 1);
        malloc_trim(0);
    }
    /* Resumed by the next attempt or idle turn (pause_all asks mem.over),
     * which also knows whether another reason holds the input. */
}

void idem_pipeline_rss_source(idem_pipeline_t *p, int64_t (*fn)(void *opaque),
                              void *opaque)
{
    p->rss_fn = fn;
    p->rss_opaque = opaque;
}

/* ------------------------------------------------------ retry topics */

static void part_pause(idem_pipeline_t *p, const idem_part_t *pt, int pause)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition);
    idem_rebalance_pause(p->rk, l, pause);
    rd_kafka_topic_partition_list_destroy(l);
}

/* A record just polled from retry partition pt waits in hand until it is
 * due (retry_at_ms, which also holds back the later records of the
 * partition in hand) and the partition is paused so nothing more of it is
 * fetched; retry_release resumes it when due (retryloop.c). */
static void retry_arrived(idem_pipeline_t *p, rec_t *r, idem_part_t *pt)
{
    rd_kafka_headers_t *h;
    if (rd_kafka_message_headers(r->msg, &h))
        h = NULL;
    int hold =
        idem_retryloop_arrived(p->rt, r, pt, h, idem_now_ms(), idem_wall_ms());
    if (r->retry_at_ms)
        p->fx.retry_waiting = 1;
    if (!hold)
        return;
    if (!part_paused(p, pt, PAUSE_RETRY))
        part_pause(p, pt, 1);
    idem_metrics_retry_waiting_set(p->m,
                                   (int64_t)idem_retryloop_held(&p->offs));
}

/* Resumes the retry partitions whose records in hand are due at `now`
 * (while the whole input is paused, pause_all resumes them later). */
static void retry_release(idem_pipeline_t *p, int64_t now)
{
    if (!p->rt)
        return;
    int changed = 0;
    for (size_t i = 0; i < p->offs.cnt; i++) {
        if (!idem_retryloop_release(&p->offs.v[i], now))
            continue;
        changed = 1;
        if (!part_paused(p, &p->offs.v[i], PAUSE_RETRY))
            part_pause(p, &p->offs.v[i], 0);
    }
    if (changed)
        idem_metrics_retry_waiting_set(p->m,
                                       (int64_t)idem_retryloop_held(&p->offs));
}

/* One step of work on the records in hand: collect what the handler
 * finished, parse what is new, queue dead letters, give the handler what
 * is due, collect DLQ acknowledgements, advance offsets. Returns 0, or -1
 * on an infrastructure failure (errstr). */
static int work(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    if (p->cnt == 0 && !p->fx.inflight)
        return 0;
    idem_metrics_heartbeat(p->m);
    /* What the handler finished first: positions are only read (and
     * partitions rewound) with no in-Redis request in flight, before
     * anything is sent. */
    int rc =
        idem_effects_collect(&p->fx, p->collect_wait_ms, errstr, errstr_size);
    p->collect_wait_ms = 0;
    if (rc == 0)
        rc = positions_sync(p, errstr, errstr_size);
    /* The server's memory policy, again now and then: an operator may
     * change it while we run. */
    if (rc == 0 && !idem_loop_store_busy(p))
        rc = idem_store_check(p->store, POLICY_CHECK_INTERVAL_MS, errstr,
                              errstr_size);
    /* Cluster mode: the global path's buckets are touched here too, with
     * the store free between two requests: under constant load the commit
     * step seldom finds it free, and an untouched bucket would make a
     * rewind after a lost tail go back too far. */
    int64_t tnow = idem_now_ms();
    if (rc == 0 && !idem_loop_store_busy(p) && !p->flow.down &&
        tnow - p->last_touch_ms >= TOUCH_CHECK_INTERVAL_MS) {
        p->last_touch_ms = tnow;
        idem_positions_touch(&p->positions, &p->offs);
    }
    idem_effects_parse(&p->fx);
    if (rc == 0)
        rc = idem_effects_dlq_queue(&p->fx, errstr, errstr_size);
    if (rc == 0)
        rc = idem_effects_feed(&p->fx, errstr, errstr_size);
    /* Handler rejections found just now go out at once. */
    char e2[512];
    if (idem_effects_dlq_queue(&p->fx, e2, sizeof(e2)) && rc == 0) {
        snprintf(errstr, errstr_size, "%s", e2);
        rc = -1;
    }
    if (idem_effects_dlq_collect(&p->fx, e2, sizeof(e2)) && rc == 0) {
        snprintf(errstr, errstr_size, "%s", e2);
        rc = -1;
    }
    advance_offsets(p);
    return rc;
}

/* Whether BATCHES_IN_HAND - 1 batches wait: fetch no more (bounded
 * memory, and room for the batch being filled). */
static int batch_full(const idem_pipeline_t *p)
{
    return p->cnt >=
           (size_t)p->conf->batch_max_messages * (BATCHES_IN_HAND - 1);
}

/* After a failed Redis call: a server refused for its configuration stops
 * the member (exit 2) instead of waiting for it. */
static void check_refused(idem_pipeline_t *p)
{
    if (!p->refused && idem_store_refused(p->store, p->fatal, sizeof(p->fatal)))
        p->refused = 1;
}

/* An infrastructure failure (errstr): not ready with it as the reason,
 * back off; the caller pauses. */
static void infra_failed(idem_pipeline_t *p, const char *errstr, int64_t now)
{
    check_refused(p);
    if (idem_flow_failed(&p->flow, errstr, now))
        idem_log_kv(IDEM_LOG_ERROR, "infrastructure failure: pausing input",
                    "error", errstr, NULL);
}

/* Pauses the fetch of the partitions whose records in hand all wait
 * behind busy keys, resumes those that no longer do (effects.h), each
 * only when no other reason holds it. */
static void key_holds_apply(idem_pipeline_t *p)
{
    size_t held = 0;
    for (size_t i = 0; i < p->offs.cnt; i++) {
        idem_part_t *pt = &p->offs.v[i];
        if (pt->key_hold != pt->key_held) {
            pt->key_held = pt->key_hold;
            if (!part_paused(p, pt, PAUSE_KEYS))
                part_pause(p, pt, pt->key_held);
            idem_log_kv(IDEM_LOG_DEBUG,
                        pt->key_held ? "partition paused behind busy keys"
                                     : "partition resumed: a key may start",
                        "topic", pt->topic, NULL);
        }
        held += (size_t)pt->key_held;
    }
    idem_metrics_key_holds_set(p->m, (int64_t)held);
}

/* Runs work() and turns its result into backoff, readiness and pausing:
 * paused while the infrastructure is down or the hands stay full, fetching
 * otherwise. */
static void attempt(idem_pipeline_t *p)
{
    char errstr[512];
    p->fx.answered = 0;
    int rc = work(p, errstr, sizeof(errstr));
    int64_t now = idem_now_ms();
    if (rc) {
        infra_failed(p, errstr, now);
    } else if (p->flow.down && p->fx.inflight && !p->fx.answered) {
        /* Only sent: an error reply (OOM, READONLY, a short WAIT) comes
         * with the answer, so the outage is over once Redis answered; an
         * external effect's outage (a webhook service down) is over once
         * one of its results is not an outage. Until then the member stays
         * paused and not ready, and looks again at once. */
        p->flow.next_attempt_ms = now;
    } else if (idem_flow_ok(&p->flow, idem_effects_next_retry(&p->fx))) {
        idem_log_kv(IDEM_LOG_INFO, "infrastructure back: resuming", NULL);
    }
    set_ready(p);
    /* Full hands (records waiting for dead-letter acknowledgements or a
     * retry time) first just stop the fetching loop; only when that lasts
     * do we pause (idem_flow_should_pause). */
    pause_all(p, idem_flow_should_pause(&p->flow, batch_full(p), now));
    key_holds_apply(p);
}

/* Revoke and shutdown: lets what is with the handler finish before
 * `deadline_ms`, starting no new effect (a record not yet with the handler
 * stays unfinished: whoever owns its partition next reads it again), and
 * collects the DLQ acknowledgements. Afterwards nothing is with the
 * handler. */
static void drain(idem_pipeline_t *p, int64_t deadline_ms)
{
    char errstr[512];
    p->fx.draining = 1;
    while (idem_now_ms() < deadline_ms) {
        int rc = work(p, errstr, sizeof(errstr));
        idem_metrics_acc_merge(p->acc); /* a long drain stays visible */
        if (rc || !p->fx.inflight)
            break;
        int64_t left = deadline_ms - idem_now_ms();
        if (idem_effects_collect(&p->fx,
                                 left > 100 ? 100 : (int)(left > 0 ? left : 0),
                                 errstr, sizeof(errstr)))
            break;
    }
    p->fx.draining = 0;
    idem_effects_settle(&p->fx, deadline_ms);
    /* Rejections found last go out too (dead letters are no effect). */
    idem_effects_dlq_queue(&p->fx, errstr, sizeof(errstr));
    int64_t left = deadline_ms - idem_now_ms();
    idem_dlq_flush(p->dlq, left > 0 ? (int)left : 0);
    idem_effects_dlq_collect(&p->fx, errstr, sizeof(errstr));
    advance_offsets(p);
    idem_metrics_acc_merge(p->acc);
}

/* Rebalance callback: fires inside rd_kafka_consumer_poll (or close) on the
 * processing thread. Before partitions are given up, what is in hand is
 * finished if the infrastructure allows and their offsets are committed
 * synchronously; a lost assignment commits nothing. */
static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    idem_pipeline_t *p = opaque;
    int cooperative = idem_rebalance_cooperative(rk);
    char rerr[512];
    /* What the handler holds is finished and marked under the old epoch's
     * lease first (a lost assignment, or a broken infrastructure: abandoned
     * at once, its leases expire unmarked). */
    int gone = err != RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS &&
               rd_kafka_assignment_lost(rk);
    idem_effects_settle(&p->fx,
                        gone || p->flow.down || p->fatal[0] ? idem_now_ms()
                        : p->stop_by_ms
                            ? p->stop_by_ms
                            : idem_now_ms() + p->conf->shutdown_timeout_ms / 2);
    p->epoch++;
    owner_update(p);
    /* A stall or a partition left out by a repair was the old assignment's
     * (a partition revoked and given back at once must not inherit it). */
    idem_fetchwatch_forget(p->fw, parts);
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        idem_metrics_rebalance_add(p->m, "assign");
        p->joined = 1;
        p->brokers_down = 0; /* the coordinator just answered */
        set_ready(p);
        for (int i = 0; i < parts->cnt; i++)
            idem_offsets_add(&p->offs, parts->elems[i].topic,
                             parts->elems[i].partition)
                ->retry_tier =
                idem_retrytopics_tier(p->rt, parts->elems[i].topic);
        assign_positions(p, parts);
        /* Each new partition paused or fetching as the others are, set
         * explicitly: librdkafka keeps a partition's pause across unassign
         * and assign, so a partition paused before a rebalance took it
         * away would come back paused for good while we fetch. Set before
         * assign: a pause or resume after it can make librdkafka drop the
         * partition's fetch start (rebalance.h), one partition never
         * fetched. */
        rd_kafka_topic_partition_list_t *late =
            idem_rebalance_pause_preset(rk, parts, p->paused);
        /* A partition Redis lost stays paused, the member not ready. */
        idem_positions_preset_lost(&p->positions, &p->offs, parts, &late);
        set_ready(p);
        /* (A failed assign is logged; librdkafka then serves the
         * partitions to no one, and the coordinator reassigns them.) */
        idem_rebalance_assign(rk, parts, rerr, sizeof(rerr));
        if (late) {
            /* Not known to librdkafka before assign (a first assignment
             * during an outage): paused now, the race left open. */
            idem_rebalance_pause(rk, late, 1);
            rd_kafka_topic_partition_list_destroy(late);
        }
        idem_metrics_paused_set(p->m, p->paused ? (int64_t)p->offs.cnt : 0);
        char cnt[16];
        snprintf(cnt, sizeof(cnt), "%d", parts->cnt);
        idem_log_kv(IDEM_LOG_INFO, "partitions assigned", "count", cnt,
                    "protocol", cooperative ? "cooperative" : "eager", NULL);
    } else {
        int lost = rd_kafka_assignment_lost(rk);
        idem_metrics_rebalance_add(p->m, lost ? "lost" : "revoke");
        if (!lost) {
            if (!p->flow.down && !p->fatal[0])
                drain(p, p->stop_by_ms ? p->stop_by_ms
                                       : idem_now_ms() +
                                             p->conf->shutdown_timeout_ms / 2);
            commit_offsets(p, parts, 1);
        }
        idem_effects_settle(&p->fx, idem_now_ms());
        batch_drop_partitions(p, parts);
        for (int i = 0; i < parts->cnt; i++) {
            idem_apply_partition_drop(&p->apply, parts->elems[i].topic,
                                      parts->elems[i].partition);
            idem_offsets_remove(&p->offs, parts->elems[i].topic,
                                parts->elems[i].partition);
        }
        idem_rebalance_unassign(rk, parts, rerr, sizeof(rerr));
        char cnt[16];
        snprintf(cnt, sizeof(cnt), "%d", parts->cnt);
        idem_log_kv(IDEM_LOG_INFO,
                    lost ? "partitions lost" : "partitions revoked", "count",
                    cnt, NULL);
        if (p->offs.cnt == 0)
            p->paused = 0;
    }
    idem_metrics_assigned_set(p->m, (int64_t)p->offs.cnt);
    idem_metrics_inflight_set(p->m, (int64_t)p->cnt);
}

/* ---------------------------------------------------- librdkafka glue */

/* Error callback: fires in rd_kafka_consumer_poll, processing thread. */
static void consumer_error_cb(rd_kafka_t *rk, int err, const char *reason,
                              void *opaque)
{
    (void)rk;
    idem_pipeline_t *p = opaque;
    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
        p->brokers_down = 1;
        set_ready(p);
    }
    idem_log_kv(IDEM_LOG_WARN, "kafka error", "error",
                rd_kafka_err2str((rd_kafka_resp_err_t)err), "reason", reason,
                NULL);
}

/* The fetch watch's view of a partition (fetchwatch.h): held, paused by
 * us, and where its fetch must go on: after what is in hand, else after
 * what is finished, else at the Redis position it was assigned at
 * (positions.c; -1 when Redis had none: the committed offset). */
static void fetchwatch_member(void *opaque, const char *topic,
                              int32_t partition, idem_fetchwatch_member_t *out)
{
    idem_pipeline_t *p = opaque;
    idem_part_t *pt = idem_loop_part_find(p, topic, partition);
    out->held = pt != NULL;
    out->paused = p->paused || (pt && part_paused(p, pt, PAUSE_ANY));
    out->position = !pt                    ? -1
                    : pt->high_seen >= 0   ? pt->high_seen + 1
                    : pt->next_offset >= 0 ? pt->next_offset
                                           : pt->saved;
    out->checked = pt && pt->checked;
}

/* Statistics callback: fires in rd_kafka_consumer_poll every
 * statistics.interval.ms. The document is parsed once, for the lag
 * gauges and the fetch watch. Returns 0: librdkafka frees json. */
static int consumer_stats_cb(rd_kafka_t *rk, char *json, size_t len,
                             void *opaque)
{
    (void)rk;
    idem_pipeline_t *p = opaque;
    json_t *root = json_loadb(json, len, 0, NULL);
    idem_metrics_stats_doc(p->m, root);
    if (root && p->fw && idem_fetchwatch_stats(p->fw, root, idem_now_ms()))
        set_ready(p);
    json_decref(root);
    /* Brokers back (an idle member sees no message that would say so). */
    if (p->brokers_down && memmem(json, len, "\"state\":\"UP\"", 12)) {
        p->brokers_down = 0;
        set_ready(p);
    }
    return 0;
}

/* An input topic's partition count now (dedup.scope=partition checks it
 * against the one recorded in Redis before loading a partition's table). */
static int input_partitions(void *opaque, const char *topic, char *errstr,
                            size_t errstr_size)
{
    idem_pipeline_t *p = opaque;
    return idem_kafka_partition_count(p->rk, topic, 3000, errstr, errstr_size);
}

static rd_kafka_t *consumer_new(idem_pipeline_t *p, char *errstr,
                                size_t errstr_size)
{
    const idem_conf_t *c = p->conf;
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    char num[32];
    snprintf(num, sizeof(num), "%" PRId64, c->stats_interval_ms);
    /* Defaults first, then the user's kafka.* (which may override the
     * tuning ones), then what correctness requires. */
    if ((!idem_kafka_user_set(c, "statistics.interval.ms") &&
         idem_kafka_set(kc, "statistics.interval.ms", num, errstr,
                        errstr_size)) ||
        /* librdkafka prefetches up to 64 MiB by default, which made a
         * member's RSS 85-90 MiB at full rate; 12 MiB kept it near 50 MiB
         * at the same rate (docs/design.md, "Memory bounds"). */
        (!idem_kafka_user_set(c, "queued.max.messages.kbytes") &&
         idem_kafka_set(kc, "queued.max.messages.kbytes",
                        IDEM_PREFETCH_KBYTES_DEFAULT, errstr, errstr_size)) ||
        idem_kafka_set(kc, "client.id", c->member_id, errstr, errstr_size) ||
        idem_kafka_set(kc, "auto.offset.reset", "earliest", errstr,
                       errstr_size) ||
        idem_conf_apply_kafka(c, kc, errstr, errstr_size) ||
        idem_kafka_set(kc, "group.id", c->group_id, errstr, errstr_size) ||
        idem_kafka_set(kc, "enable.auto.commit", "false", errstr,
                       errstr_size) ||
        idem_kafka_set(kc, "enable.auto.offset.store", "false", errstr,
                       errstr_size) ||
        idem_kafka_set(kc, "enable.partition.eof", "false", errstr,
                       errstr_size) ||
        idem_kafka_set(kc, "log.queue", "true", errstr, errstr_size)) {
        rd_kafka_conf_destroy(kc);
        return NULL;
    }
    rd_kafka_conf_set_opaque(kc, p);
    rd_kafka_conf_set_rebalance_cb(kc, rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(kc, commit_cb);
    rd_kafka_conf_set_log_cb(kc, idem_log_rdkafka);
    rd_kafka_conf_set_error_cb(kc, consumer_error_cb);
    if (c->stats_interval_ms > 0 ||
        idem_kafka_user_set(c, "statistics.interval.ms"))
        rd_kafka_conf_set_stats_cb(kc, consumer_stats_cb);
    rd_kafka_t *rk = idem_kafka_new(RD_KAFKA_CONSUMER, kc, "kafka consumer",
                                    errstr, errstr_size);
    if (!rk)
        return NULL;
    /* Logs to the main queue, which consumer_poll serves: both need only
     * log.queue and group.id, set above, but a failure would leave logs
     * and callbacks unserved, so it stops the start. */
    rd_kafka_resp_err_t err = rd_kafka_set_log_queue(rk, NULL);
    if (!err)
        err = rd_kafka_poll_set_consumer(rk);
    if (err) {
        snprintf(errstr, errstr_size, "kafka consumer: %s",
                 rd_kafka_err2str(err));
        rd_kafka_destroy(rk);
        return NULL;
    }
    return rk;
}

static int subscribe(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    char *topics = idem_xstrdup(p->conf->input_topics);
    char *rest = topics;
    for (char *t = strsep(&rest, ","); t; t = strsep(&rest, ",")) {
        while (*t == ' ')
            t++;
        size_t tl = strlen(t);
        while (tl && t[tl - 1] == ' ')
            t[--tl] = '\0';
        rd_kafka_topic_partition_list_add(l, t, RD_KAFKA_PARTITION_UA);
    }
    free(topics);
    for (size_t i = 0; i < idem_retrytopics_count(p->rt); i++)
        rd_kafka_topic_partition_list_add(l, idem_retrytopics_at(p->rt, i),
                                          RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(p->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        snprintf(errstr, errstr_size, "input.topics: subscribe: %s",
                 rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

idem_pipeline_t *idem_pipeline_new(const idem_conf_t *conf, idem_metrics_t *m,
                                   char *errstr, size_t errstr_size)
{
    idem_pipeline_t *p = idem_xcalloc(1, sizeof(*p));
    p->conf = conf;
    p->wake.fd[0] = p->wake.fd[1] = -1;
    idem_offsets_init(&p->offs);
    idem_flow_init(&p->flow, conf->retry_backoff_initial_ms,
                   conf->retry_backoff_max_ms);
    p->m = m;
    p->acc = idem_metrics_acc_new(m);
    idem_membound_init(&p->mem, conf->member_memory_max,
                       idem_loop_prefetch_kbytes(conf));
    if (p->mem.max > 0)
        idem_metrics_member_memory_set(m, p->mem.max, 0);
    owner_update(p);
    /* Retry jitter must differ between members, or they retry in step. */
    srand((unsigned)(getpid() ^ idem_wall_ms()));
    p->cap = (size_t)conf->batch_max_messages * BATCHES_IN_HAND;
    idem_records_init(&p->recs, p->cap);
    p->store = idem_store_new(conf, m);
    idem_positions_init(&p->positions, conf, m, p->store);
    p->positions.before_rewind = before_rewind;
    p->positions.ctx = p;
    idem_store_guard_eviction(p->store);
    if (conf->redis_aof_rewrite)
        idem_store_guard_aof(p->store);
    const char *arg;
    const idem_handler_ops_t *hops =
        idem_handler_find(conf->handler, &arg, errstr, errstr_size);
    if (!hops)
        goto fail;
    if (conf->retry_tiers) {
        p->rt = idem_retrytopics_new(conf->input_topics, conf->retry_delays_ms,
                                     conf->retry_tiers);
        char labels[IDEM_RETRY_TIERS_MAX][32];
        const char *lp[IDEM_RETRY_TIERS_MAX];
        for (size_t i = 0; i < conf->retry_tiers; i++)
            lp[i] = idem_retrytopic_label(conf->retry_delays_ms[i], labels[i],
                                          sizeof(labels[i]));
        if (m)
            idem_metrics_retry_tiers_enable(m, lp, conf->retry_tiers);
    }
    if (!(p->rules = idem_envelope_rules_new(
              conf->envelope_format, conf->envelope_identity,
              conf->envelope_message_id, hops->needs_payment,
              (size_t)conf->message_max_bytes, errstr, errstr_size)))
        goto fail;
    if (hops->fields_key &&
        idem_envelope_rules_fields(p->rules, hops->fields_key,
                                   idem_conf_str(conf, hops->fields_key),
                                   errstr, errstr_size))
        goto fail;
    if (!(p->dlq =
              idem_dlq_new(conf, idem_deadletter_report, errstr, errstr_size)))
        goto fail;
    p->fx = (idem_effects_t){
        .conf = conf,
        .m = m,
        .acc = p->acc,
        .dlq = p->dlq,
        .rt = p->rt,
        .rules = p->rules,
        .apply = &p->apply,
        .recs = &p->recs,
        .offs = &p->offs,
        .positions = &p->positions,
        .progress = &p->progress,
        .owner = p->owner,
        .cap = p->cap,
        /* Half a batch of a partition behind busy keys pauses it (it
         * holds at most that and one poll's records). */
        .hold_bound = (size_t)(conf->batch_max_messages + 1) / 2,
    };
    idem_rejectguard_init(&p->fx.rejects,
                          conf->handler_max_consecutive_rejects);
    idem_handler_ctx_t ctx = {
        .conf = conf,
        .arg = arg,
        .store = p->store,
        .metrics = m,
        .member_id = conf->member_id,
    };
    if (idem_apply_start(&p->apply, hops, &ctx,
                         idem_lease_store_redis(p->store), conf->dedup_lease_ms,
                         errstr, errstr_size))
        goto fail;
    if (!(p->rk = consumer_new(p, errstr, errstr_size)))
        goto fail;
    p->positions.rk = p->rk;
    idem_apply_partition_counter(&p->apply, input_partitions, p);
    if (idem_retrytopics_check(p->rt, p->rk, 10000, errstr, errstr_size))
        goto fail;
    if (conf->fetch_stall_ms > 0 &&
        (conf->stats_interval_ms > 0 ||
         idem_kafka_user_set(conf, "statistics.interval.ms"))) {
        p->fw =
            idem_fetchwatch_new(conf->fetch_stall_ms, p->rk, m,
                                fetchwatch_member, p, conf->fault_fetch_pause);
        idem_fetchwatch_fault_assign(p->fw, (int)conf->fault_fetch_assign_fail);
    }
    if (idem_wake_init(&p->wake, errstr, errstr_size))
        goto fail;
    p->wake_kafka = idem_wake_add(&p->wake, rd_kafka_queue_get_consumer(p->rk));
    p->wake_dlq = idem_wake_add(&p->wake, idem_dlq_queue(p->dlq));
    if (!p->wake_kafka || !p->wake_dlq) {
        snprintf(errstr, errstr_size, "wake: cannot hook the kafka queues");
        goto fail;
    }
    if (subscribe(p, errstr, errstr_size))
        goto fail;
    idem_metrics_ready_set(m, 0, "starting");
    return p;
fail:
    idem_pipeline_destroy(p);
    return NULL;
}

void idem_pipeline_on_shutdown(idem_pipeline_t *p, void (*fn)(void))
{
    p->on_shutdown = fn;
}

void idem_pipeline_destroy(idem_pipeline_t *p)
{
    if (!p)
        return;
    /* The handler first: it may hold pointers to the records. Writes it
     * did not finish are not marked done; the next owner redoes them. */
    idem_apply_stop(&p->apply);
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(&p->recs, &i));)
        rec_release(p, r);
    while ((r = p->spares)) {
        p->spares = r->next_spare;
        free(r);
    }
    idem_wake_term(&p->wake); /* its queue reference first */
    /* The watch's thread stops before the consumer goes; the watch itself
     * after, as rd_kafka_destroy may still serve a statistics callback
     * (which skips a NULL watch). */
    idem_fetchwatch_t *fw = p->fw;
    idem_fetchwatch_stop(fw);
    p->fw = NULL;
    if (p->rk && p->close_abandoned)
        abandoned_rk = p->rk;
    else if (p->rk)
        rd_kafka_destroy(p->rk);
    idem_fetchwatch_destroy(fw);
    idem_envelope_rules_destroy(p->rules);
    idem_retrytopics_destroy(p->rt);
    idem_dlq_destroy(p->dlq); /* reports of orphaned tickets free them */
    idem_positions_term(&p->positions);
    idem_store_destroy(p->store);
    idem_offsets_term(&p->offs);
    idem_records_term(&p->recs);
    idem_effects_term(&p->fx);
    idem_metrics_acc_destroy(p->acc); /* merges what is left */
    free(p);
}

/* ------------------------------------------------------------ the loop */

/* Adds a polled message to the batch (taking ownership), or destroys it
 * when it is an error or a record we already have. */
static void batch_add(idem_pipeline_t *p, rd_kafka_message_t *msg)
{
    if (msg->err) {
        if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            idem_log_kv(IDEM_LOG_WARN, "consume error", "error",
                        rd_kafka_message_errstr(msg), NULL);
        rd_kafka_message_destroy(msg);
        return;
    }
    if (p->brokers_down) {
        p->brokers_down = 0;
        set_ready(p);
    }
    idem_part_t *pt =
        idem_loop_part_find(p, rd_kafka_topic_name(msg->rkt), msg->partition);
    if (!pt || pt->lost || msg->offset <= pt->high_seen ||
        (pt->next_offset >= 0 && msg->offset < pt->next_offset)) {
        rd_kafka_message_destroy(msg); /* not ours, or already in hand */
        return;
    }
    pt->high_seen = msg->offset;

    rec_t *r = rec_new(p);
    idem_records_push(&p->recs, r);
    p->cnt = p->recs.live;
    r->msg = msg;
    r->polled_us = p->fx.clock_us;
    idem_record_t *v = &r->view;
    v->topic = pt->topic;
    v->partition = msg->partition;
    v->offset = msg->offset;
    v->timestamp = rd_kafka_message_timestamp(msg, NULL);
    v->key = msg->key;
    v->key_len = msg->key ? msg->key_len : 0;
    v->value = msg->payload;
    v->value_len = msg->payload ? msg->len : 0;
    v->msg = msg;
    v->loop = r;
    if (pt->retry_tier)
        retry_arrived(p, r, pt);
}

/* Polls up to batch.max.messages new records, and waits for nothing but
 * events (wake.h), never a fixed sleep:
 * - with a Redis request in flight, fetches until its reply starts to
 *   arrive (at most WAIT_MAX_MS): meanwhile the next batch fills by itself,
 *   as large as what arrived during one request;
 * - with the handler free, sends what was fetched at once, or after
 *   batch.max.wait.ms for a fuller batch (0, the default: at once);
 * - with records in hand that are not due, until the earliest retry time,
 *   a dead letter's acknowledgement or a new record (at most WAIT_MAX_MS);
 * - idle, up to WAIT_MAX_MS for a record. */
static void batch_fill(idem_pipeline_t *p, volatile int *stop)
{
    size_t max = (size_t)p->conf->batch_max_messages;
    size_t added = 0, start = p->cnt;
    if (p->fx.inflight && !idem_loop_store_busy(p)) {
        /* An effect is in flight that no reply on the store's connection
         * ends: take what is already fetched, then let the next collect
         * wait for results instead of Kafka (a webhook's response, a
         * broker's acknowledgement). */
        rd_kafka_message_t *msg;
        p->fx.clock_us = idem_now_us();
        while (added < max && !*stop &&
               (msg = rd_kafka_consumer_poll(p->rk, 0))) {
            batch_add(p, msg);
            added = p->cnt > start ? p->cnt - start : 0;
        }
        if (!added)
            p->collect_wait_ms = EXTERNAL_WAIT_MS;
        return;
    }
    int64_t now0 = idem_now_ms();
    int64_t deadline = now0 + WAIT_MAX_MS;
    if (!p->fx.inflight && p->cnt && p->flow.next_attempt_ms > now0 &&
        p->flow.next_attempt_ms < deadline)
        deadline = p->flow.next_attempt_ms; /* a retry time */
    p->fx.clock_us = idem_now_us();
    while (added < max && !*stop) {
        /* What is fetched already comes without a clock read; the clock
         * is read only before a wait. */
        rd_kafka_message_t *msg = rd_kafka_consumer_poll(p->rk, 0);
        if (msg) {
            batch_add(p, msg);
            size_t was = added;
            added = p->cnt > start ? p->cnt - start : 0;
            if (!was && added && !p->fx.inflight) /* the handler is free */
                deadline = p->fx.clock_us / 1000 + p->conf->batch_max_wait_ms;
            continue;
        }
        int64_t now = idem_now_ms();
        if (now >= deadline)
            break;
        int fd = -1;
        if (p->fx.inflight && (fd = idem_store_reply_fd(p->store)) < 0)
            break; /* its reply is there already */
        int why = idem_wake_wait(&p->wake, fd, (int)(deadline - now));
        p->fx.clock_us = idem_now_us();
        if (why & IDEM_WAKE_FD)
            break; /* the reply: read late, it delays its records and the
                      next request */
        if ((why & p->wake_dlq) && !p->fx.inflight)
            break; /* acknowledgements that may finish records */
        if (!why && !p->fx.inflight && !p->cnt)
            break; /* idle: let the loop do its housekeeping */
    }
}

/* Leaves the group after the final commit, serving the revoke and commit
 * callbacks, until deadline at most: a close that waits for a rebalance
 * the coordinator runs without us (a member stopped while the group
 * changes) could outlive shutdown.timeout.ms, and its watchdog would end
 * the process with exit 1 although everything was committed. A close not
 * finished by then is abandoned (not destroyed either): the session
 * timeout ends our membership, and the partitions' next owners read from
 * the commit we made. A LeaveGroup refused is a warning, for the same
 * reason: it costs only that timeout. */
static void close_consumer(idem_pipeline_t *p, int64_t deadline)
{
    rd_kafka_queue_t *q = rd_kafka_queue_new(p->rk);
    rd_kafka_error_t *e = rd_kafka_consumer_close_queue(p->rk, q);
    if (e) {
        idem_log_kv(IDEM_LOG_WARN, "leaving the group", "error",
                    rd_kafka_error_string(e), NULL);
        rd_kafka_error_destroy(e);
    }
    /* As events: a queue served by callbacks asserts on an op that has
     * none (librdkafka's own close destroys those). The rebalance and
     * commit results go to the callbacks the loop uses. */
    while (!e && !rd_kafka_consumer_closed(p->rk) && idem_now_ms() < deadline) {
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 50);
        if (!ev)
            continue;
        if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_REBALANCE)
            rebalance_cb(p->rk, rd_kafka_event_error(ev),
                         rd_kafka_event_topic_partition_list(ev), p);
        else if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_OFFSET_COMMIT)
            commit_cb(p->rk, rd_kafka_event_error(ev),
                      rd_kafka_event_topic_partition_list(ev), p);
        rd_kafka_event_destroy(ev);
    }
    if (!rd_kafka_consumer_closed(p->rk)) {
        p->close_abandoned = 1;
        idem_log_kv(IDEM_LOG_WARN,
                    "leaving the group did not finish within "
                    "shutdown.timeout.ms: left to the session timeout",
                    NULL);
    }
    rd_kafka_queue_destroy(q);
}

int idem_pipeline_run(idem_pipeline_t *p, volatile int *stop, char *errstr,
                      size_t errstr_size)
{
    char cerr[512];
    if (idem_store_connect(p->store, cerr, sizeof(cerr))) {
        check_refused(p);
        if (p->refused) {
            snprintf(errstr, errstr_size, "%s", p->fatal);
            idem_fetchwatch_closing(p->fw);
            rd_kafka_consumer_close(p->rk);
            return IDEM_PIPELINE_REFUSED;
        }
        idem_log_kv(IDEM_LOG_WARN, "redis not reachable yet", "error", cerr,
                    NULL);
        idem_flow_failed(&p->flow, cerr, idem_now_ms());
    }
    set_ready(p);
    idem_progress_start(&p->progress, idem_now_ms());
    p->last_commit_ms = idem_now_ms();

    while (!*stop) {
        int64_t now = idem_now_ms();
        p->fx.wall_offset_us = idem_wall_us() - idem_now_us();
        idem_metrics_heartbeat(p->m);
        if (p->flow.down || p->paused) {
            /* Waiting: keep the membership alive, retry when due. Paused
             * with full hands while an external effect runs, wait for its
             * results instead (collect), not 50 ms for Kafka per turn:
             * that was ~40 ms per record at one request in flight. */
            int wait_ms = 50;
            if (!p->flow.down && p->fx.inflight && !idem_loop_store_busy(p)) {
                wait_ms = 0;
                p->collect_wait_ms = EXTERNAL_WAIT_MS;
            }
            rd_kafka_message_t *msg = rd_kafka_consumer_poll(p->rk, wait_ms);
            p->fx.clock_us = idem_now_us();
            if (msg)
                batch_add(p, msg);
            if (now >= p->flow.next_attempt_ms) {
                if (p->cnt || p->fx.inflight) {
                    attempt(p);
                } else if (positions_sync(p, cerr, sizeof(cerr)) == 0) {
                    if (idem_flow_ok(&p->flow, 0))
                        idem_log_kv(IDEM_LOG_INFO,
                                    "infrastructure back: resuming", NULL);
                    set_ready(p);
                    pause_all(p, 0);
                } else {
                    check_refused(p);
                    idem_flow_failed(&p->flow, cerr, now);
                    set_ready(p);
                }
            }
        } else {
            /* Fill the next batch while Redis runs the previous one; with
             * full hands wait a moment for acknowledgements instead. */
            if (batch_full(p) && p->fx.inflight && !idem_loop_store_busy(p))
                p->collect_wait_ms = EXTERNAL_WAIT_MS; /* its results */
            else if (batch_full(p))
                idem_dlq_wait(p->dlq, 5);
            else
                batch_fill(p, stop);
            if (p->cnt || p->fx.inflight)
                attempt(p);
        }
        retry_release(p, idem_now_ms());
        mem_watch(p, now);
        if (now - p->last_commit_ms >= p->conf->commit_interval_ms)
            commit_offsets(p, NULL, 0);
        /* While idle, the server (and its memory policy) every second:
         * this also notices a Redis that went away, and maybe lost writes,
         * while there was nothing to do (work() checks while busy). */
        if (!p->cnt && !p->fx.inflight && !p->flow.down && !p->refused &&
            idem_store_check(p->store, IDLE_CHECK_INTERVAL_MS, cerr,
                             sizeof(cerr))) {
            infra_failed(p, cerr, now);
            set_ready(p);
            pause_all(p, 1);
        }
        /* The turn's finished records, in one step: no lock per record. */
        idem_metrics_acc_merge(p->acc);
        idem_progress_log(&p->progress, p->m, p->offs.cnt,
                          p->conf->progress_interval_ms, now);
        if (!p->fatal[0] && !idem_dlq_fatal(p->dlq, p->fatal, sizeof(p->fatal)))
            idem_apply_fatal(&p->apply, p->fatal, sizeof(p->fatal));
        if (p->fatal[0]) {
            idem_log_kv(IDEM_LOG_ERROR,
                        p->refused ? "unsafe redis configuration: stopping"
                                   : "fatal producer error: stopping",
                        "error", p->fatal, NULL);
            break;
        }
    }

    /* Shutdown: finish what is in hand if the infrastructure allows, within
     * the time left, then commit synchronously and leave the group. */
    idem_log_kv(IDEM_LOG_INFO, "shutting down", NULL);
    if (p->on_shutdown)
        p->on_shutdown(); /* e.g. arm the watchdog, also after a fatal */
    /* Finishing what is in hand gets three quarters of shutdown.timeout.ms
     * less up to a second; the rest is for the commit and leaving the
     * group (the watchdog in cmd_run.c ends it all at the full timeout). */
    int64_t t = p->conf->shutdown_timeout_ms, shutdown_at = idem_now_ms();
    p->stop_by_ms = idem_now_ms() + t * 3 / 4 - (t / 4 < 1000 ? t / 4 : 1000);
    idem_fetchwatch_closing(p->fw); /* no repair from here on */
    set_ready(p);
    if (!p->flow.down && !p->fatal[0])
        drain(p, p->stop_by_ms);
    else
        idem_effects_settle(&p->fx, idem_now_ms());
    commit_offsets(p, NULL, 1);
    close_consumer(p, shutdown_at + t - (t / 10 < 1000 ? t / 10 : 1000));
    idem_metrics_acc_merge(p->acc); /* the final figures are complete */
    if (p->fatal[0]) {
        snprintf(errstr, errstr_size, "%s", p->fatal);
        return p->refused ? IDEM_PIPELINE_REFUSED : -1;
    }
    return 0;
}
