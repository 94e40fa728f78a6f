/* pipeline: the processing loop of `idemproc run`: consume batches, dedup
 * and apply them through Redis, dead-letter poison, commit finished
 * prefixes, survive rebalances and infrastructure outages.
 *
 * One thread does everything (librdkafka's callbacks included), so no state
 * here needs a lock. Records wait in one array, in the order they were
 * polled, until they are finished; a partition's offset advances over its
 * contiguous finished prefix only. The ledger handler keeps one Redis
 * request in flight and fills and parses the next batch while Redis runs
 * the script; dead letters are acknowledged asynchronously. While the
 * infrastructure is down every partition is paused and the loop keeps
 * polling (group membership stays alive) and retries with backoff. */
#include "pipeline.h"
#include "dlq.h"
#include "envelope.h"
#include "kafka.h"
#include "log.h"
#include "store.h"
#include "util.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How many batches may wait in memory (in flight, being filled, waiting
 * for a retry or an acknowledgement) before fetching pauses. */
#define BATCHES_IN_HAND 4

/* How often the Redis server's maxmemory-policy is checked again. */
#define POLICY_CHECK_INTERVAL_MS 30000
#define IDLE_CHECK_INTERVAL_MS   1000

typedef enum { REC_PENDING = 0, REC_DONE } rec_state_t;

/* The fate of one asynchronous write (DLQ or output), owned by whoever is
 * last: the record frees it once it read the result; a record dropped
 * before the report marks it orphan and the report frees it. Records move
 * inside the batch array, so librdkafka never gets a pointer to one. */
typedef struct {
    int state; /* 0 in flight, 1 acknowledged, -1 failed */
    rd_kafka_resp_err_t err;
    int orphan;
} ticket_t;

/* One consumed record and what we know about it. */
typedef struct {
    rd_kafka_message_t *msg; /* owned; destroyed when the record leaves */
    int64_t polled_us;
    rec_state_t state;
    int parsed;
    int poison; /* 1: goes to the DLQ with `reason` */
    idem_reason_t reason;
    char error[256];
    idem_envelope_t env;
    int attempts;        /* handler attempts (retry.max.attempts) */
    int sent;            /* in the Redis request in flight */
    int store_sent;      /* a store call that may have applied it failed */
    int64_t retry_at_ms; /* not before this (busy lease, backoff) */
    ticket_t *dlq;       /* DLQ write in flight or just reported */
    int dlq_drop_value;  /* the DLQ refused the value: send it without */
    ticket_t *out;       /* forward: output write */
} rec_t;

/* One assigned partition and its commit position. */
typedef struct {
    char *topic;
    int32_t partition;
    int64_t next_offset; /* everything below is finished; -1 unknown */
    int64_t committed;   /* last offset we asked to commit; -1 none */
    int64_t high_seen;   /* highest offset taken into a batch */
    int64_t saved;       /* position Redis acknowledged; -1 none */
    int64_t saving;      /* position in the Redis request in flight; -1 */
    int checked;         /* Redis's position was read since assignment */
    int behind_logged;   /* "redis behind kafka" said for this assignment */
    int blocked;         /* scratch for advance_offsets */
    int waiting;         /* scratch: an earlier record waits (keep order) */
} part_t;

struct idem_pipeline_s {
    const idem_conf_t *conf;
    idem_metrics_t *m;
    idem_store_t *store;
    idem_dlq_t *dlq;
    rd_kafka_t *rk;  /* consumer */
    rd_kafka_t *out; /* forward: output producer */
    rd_kafka_topic_t *out_rkt;

    rec_t *recs;
    size_t cnt, cap;
    size_t inflight;              /* records in the Redis request in flight */
    rec_t **rs;                   /* scratch: records handed to a handler */
    const idem_envelope_t **envs; /* scratch: their envelopes */
    idem_store_result_t *res;     /* scratch: what the store said */
    size_t scratch_cap;
    part_t *parts;
    size_t part_cnt, part_cap;

    int paused;     /* all partitions paused by us */
    int infra_down; /* last attempt failed on infrastructure */
    char infra_reason[512];
    int64_t backoff_ms;
    int64_t next_attempt_ms;
    int brokers_down;
    int joined;      /* a first assignment (maybe empty) arrived */
    int epoch;       /* bumped on every rebalance: lease fencing */
    char owner[320]; /* "lease:<member>:<epoch>" */
    int recommit;    /* an async commit failed: send all again */
    int again;       /* the handler deferred records to a next pass */

    int64_t stop_by_ms;        /* shutting down: every wait ends by then */
    int64_t full_since_ms;     /* hands full since (0: not full) */
    char fatal[512];           /* a producer's fatal error: stop */
    void (*on_shutdown)(void); /* called once when shutdown begins */
    int64_t last_commit_ms;
    int64_t last_progress_ms;
    uint64_t progress_records;
    int refused;           /* the Redis server was refused: exit 2 */
    int answered;          /* work() read a Redis reply without error */
    uint64_t store_conns;  /* store connections when positions were read */
    char run_id[48];       /* the Redis server's run_id at that time */
    idem_store_pos_t *pos; /* scratch: positions to save or load */
    size_t pos_cap;
};

/* ---------------------------------------------------------------- helpers */

/* Lets go of a record: its message, and any write still in flight (the
 * delivery report frees that ticket). */
static void rec_release(rec_t *r)
{
    if (r->dlq) {
        if (r->dlq->state == 0)
            r->dlq->orphan = 1;
        else
            free(r->dlq);
    }
    if (r->out) {
        if (r->out->state == 0)
            r->out->orphan = 1;
        else
            free(r->out);
    }
    rd_kafka_message_destroy(r->msg);
}

static void owner_update(idem_pipeline_t *p)
{
    snprintf(p->owner, sizeof(p->owner), "lease:%s:%d", p->conf->member_id,
             p->epoch);
}

static part_t *part_find(idem_pipeline_t *p, const char *topic, int32_t part)
{
    for (size_t i = 0; i < p->part_cnt; i++)
        if (p->parts[i].partition == part && !strcmp(p->parts[i].topic, topic))
            return &p->parts[i];
    return NULL;
}

static part_t *part_add(idem_pipeline_t *p, const char *topic, int32_t part)
{
    part_t *pt = part_find(p, topic, part);
    if (pt)
        return pt;
    if (p->part_cnt == p->part_cap) {
        p->part_cap = p->part_cap ? p->part_cap * 2 : 16;
        p->parts = idem_xrealloc(p->parts, p->part_cap * sizeof(*p->parts));
    }
    pt = &p->parts[p->part_cnt++];
    pt->topic = idem_xstrdup(topic);
    pt->partition = part;
    pt->next_offset = -1;
    pt->committed = -1;
    pt->high_seen = -1;
    pt->saved = -1;
    pt->saving = -1;
    pt->checked = 0;
    pt->behind_logged = 0;
    pt->blocked = 0;
    return pt;
}

static void part_remove(idem_pipeline_t *p, const char *topic, int32_t part)
{
    part_t *pt = part_find(p, topic, part);
    if (!pt)
        return;
    free(pt->topic);
    *pt = p->parts[--p->part_cnt];
}

static part_t *rec_part(idem_pipeline_t *p, const rec_t *r)
{
    return part_find(p, rd_kafka_topic_name(r->msg->rkt), r->msg->partition);
}

static void set_ready(idem_pipeline_t *p)
{
    if (p->stop_by_ms)
        idem_metrics_ready_set(p->m, 0, "shutting down");
    else if (!p->joined)
        idem_metrics_ready_set(p->m, 0, "joining the consumer group");
    else if (p->infra_down)
        idem_metrics_ready_set(p->m, 0, p->infra_reason);
    else if (p->brokers_down)
        idem_metrics_ready_set(p->m, 0, "kafka: all brokers are down");
    else
        idem_metrics_ready_set(p->m, 1, NULL);
}

/* How long a blocking wait (an output flush) may take: half of
 * shutdown.timeout.ms normally, what is left of it while shutting down. */
static int wait_budget_ms(const idem_pipeline_t *p)
{
    if (!p->stop_by_ms)
        return (int)(p->conf->shutdown_timeout_ms / 2);
    int64_t left = p->stop_by_ms - idem_now_ms();
    return left > 0 ? (int)left : 0;
}

/* ------------------------------------------------------------ commits */

/* Builds the list of partitions whose finished prefix moved past what we
 * last committed (only_revoked: just those in `subset`). NULL if none. */
static rd_kafka_topic_partition_list_t *
commit_list(idem_pipeline_t *p, const rd_kafka_topic_partition_list_t *subset)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    for (size_t i = 0; i < p->part_cnt; i++) {
        part_t *pt = &p->parts[i];
        if (pt->saved < 0 || (pt->saved == pt->committed && !p->recommit))
            continue;
        if (subset && !rd_kafka_topic_partition_list_find(subset, pt->topic,
                                                          pt->partition))
            continue;
        if (!l)
            l = rd_kafka_topic_partition_list_new(8);
        rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition)->offset =
            pt->saved;
    }
    return l;
}

static idem_store_pos_t *pos_reserve(idem_pipeline_t *p, size_t n)
{
    if (p->pos_cap < n) {
        p->pos_cap = n;
        p->pos = idem_xrealloc(p->pos, n * sizeof(*p->pos));
    }
    return p->pos;
}

/* Collects into p->pos the partitions (of subset, if not NULL) whose
 * finished prefix moved past the position Redis holds. Returns how many. */
static size_t positions_due(idem_pipeline_t *p,
                            const rd_kafka_topic_partition_list_t *subset)
{
    idem_store_pos_t *pos = pos_reserve(p, p->part_cnt ? p->part_cnt : 1);
    size_t n = 0;
    for (size_t i = 0; i < p->part_cnt; i++) {
        part_t *pt = &p->parts[i];
        if (pt->next_offset < 0 || pt->next_offset == pt->saved)
            continue;
        if (subset && !rd_kafka_topic_partition_list_find(subset, pt->topic,
                                                          pt->partition))
            continue;
        pos[n].topic = pt->topic;
        pos[n].partition = pt->partition;
        pos[n].offset = pt->next_offset;
        n++;
    }
    return n;
}

static int positions_sync(idem_pipeline_t *p, char *errstr, size_t errstr_size);

/* Writes the finished prefixes to Redis before they are committed to
 * Kafka (docs/design.md, "Positions in Redis"); only with no request in
 * flight (the ledger sends them along with its requests otherwise). A
 * failure leaves the Kafka commit behind; the next attempt catches up. */
static void positions_save(idem_pipeline_t *p,
                           const rd_kafka_topic_partition_list_t *subset)
{
    if (p->inflight || p->infra_down || p->refused ||
        positions_due(p, subset) == 0)
        return;
    char errstr[512];
    /* A new connection is compared first (which may rewind): never write
     * a position over one Redis lost together with the effects below. */
    if (positions_sync(p, errstr, sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "reading positions from redis failed",
                    "error", errstr, NULL);
        return;
    }
    size_t n = positions_due(p, subset);
    if (n && idem_store_positions_save(p->store, p->pos, n, errstr,
                                       sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "saving positions in redis failed", "error",
                    errstr, NULL);
        return;
    }
    for (size_t i = 0; i < n; i++)
        part_find(p, p->pos[i].topic, p->pos[i].partition)->saved =
            p->pos[i].offset;
}

/* Commits finished offsets: asynchronously (the result arrives in
 * commit_cb) or synchronously (revoke, shutdown). */
static void commit_offsets(idem_pipeline_t *p,
                           const rd_kafka_topic_partition_list_t *subset,
                           int sync)
{
    positions_save(p, subset);
    rd_kafka_topic_partition_list_t *l = commit_list(p, subset);
    p->last_commit_ms = idem_now_ms();
    if (!l)
        return;
    for (int i = 0; i < l->cnt; i++) {
        part_t *pt = part_find(p, l->elems[i].topic, l->elems[i].partition);
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
static void batch_remove_if(idem_pipeline_t *p,
                            int (*drop)(idem_pipeline_t *p, const rec_t *r,
                                        const void *ctx),
                            const void *ctx)
{
    size_t keep = 0;
    for (size_t i = 0; i < p->cnt; i++) {
        rec_t *r = &p->recs[i];
        if (drop(p, r, ctx)) {
            rec_release(r);
            continue;
        }
        if (keep != i)
            p->recs[keep] = *r;
        keep++;
    }
    p->cnt = keep;
}

/* Finished and below its partition's committable offset: done with it. */
static int rec_committable(idem_pipeline_t *p, const rec_t *r, const void *ctx)
{
    (void)ctx;
    part_t *pt = rec_part(p, r);
    return r->state == REC_DONE && pt && r->msg->offset < pt->next_offset;
}

/* Moves each partition's next_offset over the contiguous prefix of
 * finished records, then drops records that are finished and below it. */
static void advance_offsets(idem_pipeline_t *p)
{
    for (size_t i = 0; i < p->part_cnt; i++)
        p->parts[i].blocked = 0;
    for (size_t i = 0; i < p->cnt; i++) {
        rec_t *r = &p->recs[i];
        part_t *pt = rec_part(p, r);
        if (!pt || pt->blocked)
            continue;
        if (r->state == REC_DONE)
            pt->next_offset = r->msg->offset + 1;
        else
            pt->blocked = 1;
    }
    batch_remove_if(p, rec_committable, NULL);
    idem_metrics_inflight_set(p->m, (int64_t)p->cnt);
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
    batch_remove_if(p, rec_in_partitions, parts);
}

/* ----------------------------------------------------- pause and resume */

static void pause_all(idem_pipeline_t *p, int pause)
{
    if (p->paused == pause || p->part_cnt == 0) {
        p->paused = pause;
        idem_metrics_paused_set(p->m, pause ? (int64_t)p->part_cnt : 0);
        return;
    }
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new((int)p->part_cnt);
    for (size_t i = 0; i < p->part_cnt; i++)
        rd_kafka_topic_partition_list_add(l, p->parts[i].topic,
                                          p->parts[i].partition);
    if (pause)
        rd_kafka_pause_partitions(p->rk, l);
    else
        rd_kafka_resume_partitions(p->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    char held[24];
    snprintf(held, sizeof(held), "%zu", p->cnt);
    idem_log_kv(pause && p->infra_down ? IDEM_LOG_WARN : IDEM_LOG_DEBUG,
                pause ? "input paused" : "input resumed", "records_in_hand",
                held, "reason",
                pause ? (p->infra_down ? p->infra_reason : "records in hand")
                      : "",
                NULL);
    p->paused = pause;
    idem_metrics_paused_set(p->m, pause ? (int64_t)p->part_cnt : 0);
}

/* ------------------------------------------------------------ outcomes */

static void rec_finish(idem_pipeline_t *p, rec_t *r, idem_outcome_t o)
{
    r->state = REC_DONE;
    idem_metrics_outcome_add(p->m, o, 1);
    idem_metrics_latency_observe(p->m,
                                 (double)(idem_now_us() - r->polled_us) / 1e6);
    p->progress_records++;
}

static void rec_duplicate(idem_pipeline_t *p, rec_t *r,
                          const idem_store_result_t *res)
{
    /* The same message_id means Kafka (or the producer) delivered the very
     * same message again; a new message_id with a known idempotency key is
     * a client that sent the operation again. A record whose earlier store
     * call failed after it may have run counts as processed. */
    int same = res->prior_mid_len == r->env.message_id_len &&
               !memcmp(res->prior_mid, r->env.message_id, res->prior_mid_len);
    if (same && r->store_sent) {
        rec_finish(p, r, IDEM_OUTCOME_PROCESSED);
        return;
    }
    idem_metrics_duplicate_add(p->m,
                               same ? IDEM_DUP_REDELIVERY : IDEM_DUP_RESEND, 1);
    rec_finish(p, r, IDEM_OUTCOME_DUPLICATE);
    if (idem_log_enabled(IDEM_LOG_DEBUG)) {
        char off[24];
        snprintf(off, sizeof(off), "%" PRId64, r->msg->offset);
        idem_log_kv(IDEM_LOG_DEBUG, "duplicate", "topic",
                    rd_kafka_topic_name(r->msg->rkt), "offset", off,
                    "message_id", r->env.message_id, "kind",
                    same ? "redelivery" : "resend", NULL);
    }
}

static void rec_poison(rec_t *r, idem_reason_t reason, const char *error)
{
    r->poison = 1;
    r->reason = reason;
    snprintf(r->error, sizeof(r->error), "%s", error);
}

/* A retriable handler error: back off with jitter, or give up. */
static void rec_retry(idem_pipeline_t *p, rec_t *r, const char *error)
{
    r->attempts++;
    if (r->attempts >= p->conf->retry_max_attempts) {
        char e[256];
        snprintf(e, sizeof(e), "gave up after %d attempts: %s", r->attempts,
                 error);
        rec_poison(r, IDEM_REASON_MAX_RETRIES, e);
        return;
    }
    idem_metrics_retry_add(p->m, 1);
    int64_t d = p->conf->retry_backoff_initial_ms;
    for (int i = 1; i < r->attempts && d < p->conf->retry_backoff_max_ms; i++)
        d *= 2;
    if (d > p->conf->retry_backoff_max_ms)
        d = p->conf->retry_backoff_max_ms;
    d = d / 2 + (int64_t)(rand() % (int)(d / 2 + 1)); /* "equal jitter" */
    r->retry_at_ms = idem_now_ms() + d;
}

/* --------------------------------------------------------- the handlers */

static void scratch_reserve(idem_pipeline_t *p)
{
    if (p->scratch_cap >= p->cnt)
        return;
    /* Kept across batches: a fresh ~400 KiB allocation per batch would be
     * an mmap and page faults every time. */
    p->scratch_cap = p->cnt > p->cap ? p->cnt : p->cap;
    p->rs = idem_xrealloc(p->rs, p->scratch_cap * sizeof(*p->rs));
    p->envs = idem_xrealloc(p->envs, p->scratch_cap * sizeof(*p->envs));
    p->res = idem_xrealloc(p->res, p->scratch_cap * sizeof(*p->res));
}

/* Collects the valid, unfinished records that may go to the handler now,
 * in poll order, into p->rs/p->envs. A record waiting for its retry time
 * holds back the later records of its partition, so effects keep the
 * partition's order. */
static size_t due_records(idem_pipeline_t *p, int64_t now)
{
    scratch_reserve(p);
    for (size_t i = 0; i < p->part_cnt; i++)
        p->parts[i].waiting = 0;
    size_t n = 0;
    for (size_t i = 0; i < p->cnt; i++) {
        rec_t *r = &p->recs[i];
        if (r->state == REC_DONE || r->poison || r->sent)
            continue;
        part_t *pt = rec_part(p, r);
        if (pt && pt->waiting)
            continue;
        if (r->retry_at_ms > now) {
            if (pt)
                pt->waiting = 1;
            continue;
        }
        p->rs[n] = r;
        p->envs[n] = &r->env;
        n++;
    }
    return n;
}

/* Starts the ledger script for every due record (one pipelined request);
 * the results are read by ledger_recv. Returns 0 or -1 (infrastructure). */
static int ledger_send(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    if (p->inflight)
        return 0;
    size_t n = due_records(p, idem_now_ms());
    if (!n)
        return 0;
    /* The positions of what is finished ride along (after the scripts). */
    size_t npos = positions_due(p, NULL);
    if (idem_store_ledger_send(p->store, p->envs, n, p->pos, npos, errstr,
                               errstr_size)) {
        for (size_t i = 0; i < n; i++)
            p->rs[i]->store_sent = 1;
        return -1;
    }
    for (size_t i = 0; i < npos; i++)
        part_find(p, p->pos[i].topic, p->pos[i].partition)->saving =
            p->pos[i].offset;
    for (size_t i = 0; i < n; i++)
        p->rs[i]->sent = 1;
    p->inflight = n;
    idem_metrics_batch_observe(p->m, (double)n);
    return 0;
}

/* Reads the results of the request in flight and finishes its records. */
static int ledger_recv(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    if (!p->inflight)
        return 0;
    scratch_reserve(p);
    size_t n = 0;
    for (size_t i = 0; i < p->cnt; i++)
        if (p->recs[i].sent)
            p->rs[n++] = &p->recs[i];
    int rc = 0;
    if (n != p->inflight) { /* records were dropped by a rebalance */
        snprintf(errstr, errstr_size, "internal: %zu of %zu records in flight",
                 n, p->inflight);
        idem_store_disconnect(p->store); /* unread replies die with it */
        rc = -1;
    }
    idem_store_result_t *res = p->res;
    if (rc == 0)
        rc = idem_store_ledger_recv(p->store, p->inflight, res, errstr,
                                    errstr_size);
    p->inflight = 0;
    p->answered = rc == 0;
    for (size_t i = 0; i < p->part_cnt; i++) {
        part_t *pt = &p->parts[i];
        if (rc == 0 && pt->saving >= 0)
            pt->saved = pt->saving;
        pt->saving = -1;
    }
    for (size_t i = 0; i < n; i++) {
        rec_t *r = p->rs[i];
        r->sent = 0;
        if (rc) {
            r->store_sent = 1; /* its chunk may have run: marks will say */
            continue;
        }
        switch (res[i].mark) {
        case IDEM_MARK_NEW:
            rec_finish(p, r, IDEM_OUTCOME_PROCESSED);
            break;
        case IDEM_MARK_DONE:
            rec_duplicate(p, r, &res[i]);
            break;
        case IDEM_MARK_REJECT:
            rec_poison(r, IDEM_REASON_HANDLER_REJECTED, res[i].detail);
            break;
        case IDEM_MARK_BUSY: /* a forward-handler lease on this identity */
        case IDEM_MARK_LOST:
        case IDEM_MARK_AGAIN:
            r->retry_at_ms = idem_now_ms() + p->conf->dedup_lease_ms / 4;
            break;
        }
    }
    return rc;
}

/* Delivery report of the output producer: fires in rd_kafka_flush/poll of
 * that producer, on the processing thread. */
static void out_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
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

/* Classifies a failed output write: the same message can never be written
 * (poison: handler-rejected), the cluster is unreachable (infrastructure:
 * pause, never dead-letter), or this write failed for a reason that may
 * pass (a retriable handler error, counted against retry.max.attempts). */
typedef enum { OUT_PERMANENT, OUT_INFRA, OUT_RETRIABLE } out_error_kind_t;

static out_error_kind_t output_error_kind(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
        return OUT_PERMANENT;
    case RD_KAFKA_RESP_ERR_INVALID_MSG: /* CRC mismatch on the way: again */
        return OUT_RETRIABLE;
    default:
        /* Everything else (unreachable or refusing cluster, missing topic,
         * authorization, no report yet) is infrastructure: pause and
         * retry, never dead-letter. */
        return OUT_INFRA;
    }
}

/* Queues r's enriched copy (value + processed_at) to output.topic.
 * Returns 0 queued, 1 never writable (r is now poison: handler-rejected),
 * -1 infrastructure (errstr). */
static int forward_send(idem_pipeline_t *p, rec_t *r, char *errstr,
                        size_t errstr_size)
{
    /* The value's own bytes plus processed_at: re-serialising it would
     * rewrite numbers (619.74 as 619.74000000000001). */
    char ts[40], field[48];
    snprintf(field, sizeof(field), "\"%s\"",
             idem_rfc3339(idem_wall_ms(), ts, sizeof(ts)));
    size_t value_len;
    char *value = idem_envelope_set_member(r->msg->payload, r->msg->len,
                                           "processed_at", field, &value_len);
    rd_kafka_headers_t *orig = NULL, *h = NULL;
    if (rd_kafka_message_headers(r->msg, &orig) == 0 && orig)
        h = rd_kafka_headers_copy(orig);
    ticket_t *t = idem_xcalloc(1, sizeof(*t));
    rd_kafka_resp_err_t err;
    for (;;) {
        err = rd_kafka_producev(p->out, RD_KAFKA_V_RKT(p->out_rkt),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_FREE),
                                RD_KAFKA_V_KEY(r->msg->key, r->msg->key_len),
                                RD_KAFKA_V_VALUE(value, value_len),
                                RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_OPAQUE(t),
                                RD_KAFKA_V_END);
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            break;
        rd_kafka_poll(p->out, 100);
    }
    if (err) {
        free(value);
        free(t);
        if (h)
            rd_kafka_headers_destroy(h);
        if (output_error_kind(err) == OUT_PERMANENT) {
            rec_poison(r, IDEM_REASON_HANDLER_REJECTED, rd_kafka_err2str(err));
            return 1;
        }
        snprintf(errstr, errstr_size, "output: %s", rd_kafka_err2str(err));
        return -1;
    }
    r->out = t;
    return 0;
}

/* Forward: claim (lease) -> write to output.topic and wait for the broker's
 * acknowledgement -> turn the lease into the done mark. A crash anywhere
 * leaves at worst a lease that expires, never a done mark without output.
 * Records behind a deferred one of the same partition are not written in
 * this pass (their claim is ours and is taken again next pass), so the
 * output keeps each partition's order. */
static int handle_forward(idem_pipeline_t *p, size_t n, char *errstr,
                          size_t errstr_size)
{
    rec_t **rs = p->rs;
    const idem_envelope_t **envs = p->envs;
    idem_store_result_t *res = p->res;
    if (idem_store_claim(p->store, p->owner, envs, n, res, errstr, errstr_size))
        return -1;
    size_t claimed = 0;
    int64_t now = idem_now_ms();
    for (size_t i = 0; i < p->part_cnt; i++)
        p->parts[i].waiting = 0;
    for (size_t i = 0; i < n; i++) {
        rec_t *r = rs[i];
        part_t *pt = rec_part(p, r);
        if (pt && pt->waiting) {
            p->again = 1; /* behind a deferred record: next pass */
            continue;
        }
        switch (res[i].mark) {
        case IDEM_MARK_NEW:
            rs[claimed] = r;
            envs[claimed] = &r->env;
            claimed++;
            break;
        case IDEM_MARK_DONE:
            rec_duplicate(p, r, &res[i]);
            break;
        case IDEM_MARK_AGAIN: /* due again as soon as the first is done */
            p->again = 1;
            if (pt)
                pt->waiting = 1;
            break;
        default: /* leased elsewhere: wait, the lease expires if dead */
            r->retry_at_ms = now + p->conf->dedup_lease_ms / 4 + 50;
            if (pt)
                pt->waiting = 1;
            break;
        }
    }
    size_t queued = 0;
    for (size_t i = 0; i < claimed; i++) {
        int q = forward_send(p, rs[i], errstr, errstr_size);
        if (q < 0) {
            /* Writes already queued are left to finish; their records are
             * claimed again next time and their reports free the tickets. */
            for (size_t j = 0; j < queued; j++) {
                rs[j]->out->orphan = 1;
                rs[j]->out = NULL;
            }
            return -1;
        }
        if (q == 0)
            rs[queued++] = rs[i];
    }
    claimed = queued;
    rd_kafka_flush(p->out, wait_budget_ms(p));
    size_t acked = 0;
    int failed = 0;
    for (size_t i = 0; i < claimed; i++) {
        rec_t *r = rs[i];
        ticket_t *t = r->out;
        if (t->state == 0) { /* no report within the wait: let it go */
            t->orphan = 1;
            r->out = NULL;
            failed = 1;
            continue;
        }
        int state = t->state;
        rd_kafka_resp_err_t err = t->err;
        free(t);
        r->out = NULL;
        if (state == 1) {
            rs[acked] = r;
            envs[acked] = &r->env;
            acked++;
            continue;
        }
        switch (output_error_kind(err)) {
        case OUT_PERMANENT:
            rec_poison(r, IDEM_REASON_HANDLER_REJECTED, rd_kafka_err2str(err));
            break;
        case OUT_RETRIABLE:
            rec_retry(p, r, rd_kafka_err2str(err));
            break;
        case OUT_INFRA:
            failed = 1;
            break;
        }
    }
    if (acked && idem_store_mark_done(p->store, p->owner, envs, acked, res,
                                      errstr, errstr_size))
        return -1;
    for (size_t i = 0; i < acked; i++) {
        if (res[i].mark == IDEM_MARK_LOST)
            idem_log_kv(IDEM_LOG_WARN,
                        "lease taken over before mark; output may be "
                        "duplicated",
                        "message_id", rs[i]->env.message_id, "holder",
                        res[i].detail, NULL);
        rec_finish(p, rs[i], IDEM_OUTCOME_PROCESSED);
    }
    if (failed) {
        snprintf(errstr, errstr_size, "output: writes to %s not acknowledged",
                 p->conf->output_topic);
        return -1;
    }
    return 0;
}

/* The forward handler, synchronously, in passes: a record deferred behind
 * an earlier one of its identity or partition goes in the next pass. */
static int forward_passes(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    for (int pass = 0; pass < 16; pass++) {
        size_t n = due_records(p, idem_now_ms());
        if (!n)
            return 0;
        p->again = 0;
        idem_metrics_batch_observe(p->m, (double)n);
        if (handle_forward(p, n, errstr, errstr_size))
            return -1;
        if (!p->again)
            return 0;
    }
    return 0;
}

/* ------------------------------------------------------ the batch cycle */

static void parse_records(idem_pipeline_t *p)
{
    for (size_t i = 0; i < p->cnt; i++) {
        rec_t *r = &p->recs[i];
        if (r->parsed)
            continue;
        r->parsed = 1;
        rd_kafka_headers_t *h = NULL;
        rd_kafka_message_headers(r->msg, &h);
        idem_reason_t reason;
        char err[256];
        /* Both handlers carry payments (README.md, "The envelope"). */
        if (idem_envelope_parse(r->msg->payload, r->msg->len, h, 1,
                                (size_t)p->conf->message_max_bytes, &r->env,
                                &reason, err, sizeof(err)))
            rec_poison(r, reason, err);
    }
}

/* DLQ delivery report (see idem_dlq_report_cb): fires in idem_dlq_poll or
 * idem_dlq_flush on the processing thread. */
static void dlq_report(void *opaque, rd_kafka_resp_err_t err)
{
    ticket_t *t = opaque;
    if (t->orphan) {
        free(t);
        return;
    }
    t->err = err;
    t->state = err ? -1 : 1;
}

/* Queues every poison record that has no DLQ write yet. Returns 0, or -1
 * when the producer refused to queue (infrastructure). */
static int dlq_queue(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    for (size_t i = 0; i < p->cnt; i++) {
        rec_t *r = &p->recs[i];
        if (r->state == REC_DONE || !r->poison || r->dlq)
            continue;
        ticket_t *t = idem_xcalloc(1, sizeof(*t));
        if (idem_dlq_send(p->dlq, r->msg, r->reason, r->error,
                          r->attempts ? r->attempts : 1, r->dlq_drop_value, t,
                          errstr, errstr_size)) {
            free(t);
            return -1;
        }
        r->dlq = t;
    }
    return 0;
}

/* Finishes poison records whose DLQ write was acknowledged; a failed write
 * is queued again later (the DLQ is at-least-once: verify counts distinct
 * originals). Returns -1 when a write failed (infrastructure). */
static int dlq_collect(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    idem_dlq_poll(p->dlq);
    int failed = 0;
    for (size_t i = 0; i < p->cnt; i++) {
        rec_t *r = &p->recs[i];
        if (!r->dlq || r->dlq->state == 0)
            continue;
        ticket_t *t = r->dlq;
        r->dlq = NULL;
        if (t->state == 1) {
            idem_metrics_dlq_add(p->m, r->reason, 1);
            rec_finish(p, r, IDEM_OUTCOME_DLQ);
            if (idem_log_enabled(IDEM_LOG_INFO)) {
                char part[16], off[24];
                snprintf(part, sizeof(part), "%" PRId32, r->msg->partition);
                snprintf(off, sizeof(off), "%" PRId64, r->msg->offset);
                idem_log_kv(IDEM_LOG_INFO, "dead-lettered", "topic",
                            rd_kafka_topic_name(r->msg->rkt), "partition", part,
                            "offset", off, "reason", idem_reason2str(r->reason),
                            "error", r->error, NULL);
            }
        } else if (t->err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
                   t->err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE) {
            /* The broker will never take this value: send the dead letter
             * without it rather than hold the partition forever. */
            r->dlq_drop_value = 1;
        } else if (!failed) {
            failed = 1;
            snprintf(errstr, errstr_size, "dlq: write to %s failed: %s",
                     p->conf->dlq_topic, rd_kafka_err2str(t->err));
        }
        free(t);
    }
    return failed ? -1 : 0;
}

/* ------------------------------------------------ positions from Redis */

static int rec_in_part(idem_pipeline_t *p, const rec_t *r, const void *pt)
{
    return rec_part(p, r) == pt;
}

/* Drops what is in hand for pt and seeks it back to `offset`, the position
 * Redis holds: the records from there are read and applied again (their
 * marks, where Redis kept them, make them duplicates). No request may be
 * in flight. Returns 0, or -1 when the seek failed (errstr; the caller
 * tries again later). */
static int partition_rewind(idem_pipeline_t *p, part_t *pt, int64_t offset,
                            char *errstr, size_t errstr_size)
{
    batch_remove_if(p, rec_in_part, pt);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition)->offset =
        offset;
    rd_kafka_error_t *e = rd_kafka_seek_partitions(p->rk, l, 5000);
    char part[16], off[24], held[24];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(off, sizeof(off), "%" PRId64, offset);
    snprintf(held, sizeof(held), "%" PRId64,
             pt->next_offset >= 0 ? pt->next_offset : pt->high_seen + 1);
    int failed = e || l->elems[0].err;
    if (failed)
        snprintf(errstr, errstr_size,
                 "kafka: seek %s [%s] to the redis position %s: %s", pt->topic,
                 part, off,
                 e ? rd_kafka_error_string(e)
                   : rd_kafka_err2str(l->elems[0].err));
    else
        idem_log_kv(IDEM_LOG_WARN, "rewound to the position redis holds",
                    "topic", pt->topic, "partition", part, "offset", off,
                    "held", held, NULL);
    if (e)
        rd_kafka_error_destroy(e);
    rd_kafka_topic_partition_list_destroy(l);
    idem_metrics_inflight_set(p->m, (int64_t)p->cnt);
    if (failed)
        return -1;
    pt->next_offset = offset;
    pt->high_seen = offset - 1;
    pt->saved = offset;
    return 0;
}

/* Logs (once per partition and assignment) and counts a position in Redis
 * behind Kafka's committed offset: Redis went back in time. */
static void position_behind(idem_pipeline_t *p, part_t *pt, int64_t redis,
                            int64_t kafka)
{
    if (pt->behind_logged)
        return;
    pt->behind_logged = 1;
    idem_metrics_redis_behind_add(p->m, 1);
    char part[16], r[24], k[24];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(r, sizeof(r), "%" PRId64, redis);
    snprintf(k, sizeof(k), "%" PRId64, kafka);
    idem_log_kv(IDEM_LOG_WARN,
                redis < 0 ? "redis lost the position of a partition (it "
                            "lost its data: persistence off?)"
                          : "redis went back in time: its position is behind "
                            "kafka's committed offset; reading again from it",
                "topic", pt->topic, "partition", part, "redis_offset", r,
                "kafka_offset", k, NULL);
}

/* The lowest offset pt holds in hand (or has finished up to); -1 when it
 * has not consumed anything since it was assigned. */
static int64_t part_hold(idem_pipeline_t *p, const part_t *pt)
{
    if (pt->next_offset >= 0)
        return pt->next_offset;
    int64_t low = -1;
    for (size_t i = 0; i < p->cnt; i++)
        if (rec_part(p, &p->recs[i]) == pt &&
            (low < 0 || p->recs[i].msg->offset < low))
            low = p->recs[i].msg->offset;
    return low >= 0 ? low : pt->saved;
}

/* After every new connection to Redis (and for partitions assigned while
 * Redis could not be asked) reads the positions Redis holds and rewinds
 * every partition whose position is behind what the member holds: a
 * restarted Redis, or another server, may have lost its last writes while
 * the member kept running. A reconnect to the same server (same run_id,
 * nothing lost) rewinds only if Redis holds less than it acknowledged.
 * No request may be in flight. Returns 0, or -1 (infrastructure). */
static int positions_sync(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    if (p->inflight)
        return 0;
    if (idem_store_connect(p->store, errstr, errstr_size))
        return -1;
    uint64_t conns = idem_store_connections(p->store);
    int reconnected = conns != p->store_conns;
    const char *run_id = idem_store_run_id(p->store);
    int other_server = reconnected && p->run_id[0] && strcmp(p->run_id, run_id);
    int unchecked = 0;
    for (size_t i = 0; i < p->part_cnt; i++)
        unchecked |= !p->parts[i].checked;
    if (!reconnected && !unchecked)
        return 0;
    idem_store_pos_t *pos = pos_reserve(p, p->part_cnt ? p->part_cnt : 1);
    for (size_t i = 0; i < p->part_cnt; i++) {
        pos[i].topic = p->parts[i].topic;
        pos[i].partition = p->parts[i].partition;
        pos[i].offset = -1; /* filled in by the load */
    }
    if (idem_store_positions_load(p->store, pos, p->part_cnt, errstr,
                                  errstr_size))
        return -1;
    for (size_t i = 0; i < p->part_cnt; i++) {
        part_t *pt = &p->parts[i];
        int64_t r = pos[i].offset;
        if (r < 0) {
            if (other_server && pt->saved >= 0)
                position_behind(p, pt, -1, pt->saved);
            pt->checked = 1;
            continue;
        }
        if (pt->committed >= 0 && r < pt->committed)
            position_behind(p, pt, r, pt->committed);
        int64_t hold = part_hold(p, pt);
        int rewind = pt->checked ? (other_server || r < pt->saved) &&
                                       hold >= 0 && r < hold
                                 : hold < 0 || r < hold;
        if (rewind && partition_rewind(p, pt, r, errstr, errstr_size))
            return -1; /* again next time: p->store_conns not updated */
        pt->checked = 1;
    }
    p->store_conns = conns;
    snprintf(p->run_id, sizeof(p->run_id), "%s", run_id);
    return 0;
}

/* One step of work on the records in hand: parse what is new, queue dead
 * letters, run the handler (ledger: finish the request in flight, start
 * the next), collect acknowledgements, advance offsets. Returns 0, or -1
 * on an infrastructure failure (errstr). */
static int work(idem_pipeline_t *p, char *errstr, size_t errstr_size)
{
    if (p->cnt == 0 && !p->inflight)
        return 0;
    idem_metrics_heartbeat(p->m);
    /* The request in flight first: positions are only read (and
     * partitions rewound) with none in flight, before anything is sent. */
    int rc = ledger_recv(p, errstr, errstr_size);
    if (rc == 0)
        rc = positions_sync(p, errstr, errstr_size);
    /* The server's memory policy, again now and then: an operator may
     * change it while we run. */
    if (rc == 0)
        rc = idem_store_check(p->store, POLICY_CHECK_INTERVAL_MS, errstr,
                              errstr_size);
    parse_records(p);
    if (rc == 0)
        rc = dlq_queue(p, errstr, errstr_size);
    if (rc == 0) {
        if (p->conf->handler == IDEM_HANDLER_FORWARD)
            rc = forward_passes(p, errstr, errstr_size);
        else
            rc = ledger_send(p, errstr, errstr_size);
    }
    /* Handler rejections found just now go out at once. */
    char e2[512];
    if (dlq_queue(p, e2, sizeof(e2)) && rc == 0) {
        snprintf(errstr, errstr_size, "%s", e2);
        rc = -1;
    }
    if (dlq_collect(p, e2, sizeof(e2)) && rc == 0) {
        snprintf(errstr, errstr_size, "%s", e2);
        rc = -1;
    }
    advance_offsets(p);
    return rc;
}

/* Earliest retry time of a waiting record, or 0 when none waits. */
static int64_t batch_next_retry(idem_pipeline_t *p)
{
    int64_t t = 0;
    for (size_t i = 0; i < p->cnt; i++) {
        rec_t *r = &p->recs[i];
        if (r->state != REC_DONE && r->retry_at_ms &&
            (t == 0 || r->retry_at_ms < t))
            t = r->retry_at_ms;
    }
    return t;
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
    if (!p->infra_down)
        idem_log_kv(IDEM_LOG_ERROR, "infrastructure failure: pausing input",
                    "error", errstr, NULL);
    p->infra_down = 1;
    snprintf(p->infra_reason, sizeof(p->infra_reason), "%s", errstr);
    p->backoff_ms = p->backoff_ms
                        ? (p->backoff_ms * 2 > p->conf->retry_backoff_max_ms
                               ? p->conf->retry_backoff_max_ms
                               : p->backoff_ms * 2)
                        : p->conf->retry_backoff_initial_ms;
    p->next_attempt_ms = now + p->backoff_ms;
}

/* Runs work() and turns its result into backoff, readiness and pausing:
 * paused while the infrastructure is down or the hands stay full, fetching
 * otherwise. */
static void attempt(idem_pipeline_t *p)
{
    char errstr[512];
    p->answered = 0;
    int rc = work(p, errstr, sizeof(errstr));
    int64_t now = idem_now_ms();
    if (rc) {
        infra_failed(p, errstr, now);
    } else if (p->infra_down && p->inflight && !p->answered) {
        /* Only sent: an error reply (OOM, READONLY, a short WAIT) comes
         * with the answer, so the outage is over once Redis answered. */
        p->next_attempt_ms = now;
    } else {
        if (p->infra_down)
            idem_log_kv(IDEM_LOG_INFO, "infrastructure back: resuming", NULL);
        p->infra_down = 0;
        p->backoff_ms = 0;
        p->next_attempt_ms = batch_next_retry(p);
    }
    set_ready(p);
    /* Full hands (records waiting for dead-letter acknowledgements or a
     * retry time) first just stop the fetching loop; only when that lasts
     * do we pause, since pausing drops librdkafka's prefetched records and
     * they must be fetched again. */
    if (batch_full(p)) {
        if (!p->full_since_ms)
            p->full_since_ms = now;
    } else {
        p->full_since_ms = 0;
    }
    pause_all(p, p->infra_down ||
                     (p->full_since_ms && now - p->full_since_ms > 1000));
}

/* Finishes as much of what is in hand as the infrastructure allows before
 * `deadline_ms` (revoke, shutdown): the request in flight, what is due,
 * and the DLQ acknowledgements. */
static void drain(idem_pipeline_t *p, int64_t deadline_ms)
{
    char errstr[512];
    for (int i = 0; i < 8 && idem_now_ms() < deadline_ms; i++) {
        if (work(p, errstr, sizeof(errstr)))
            break;
        if (!p->inflight && (p->conf->handler == IDEM_HANDLER_FORWARD ||
                             due_records(p, idem_now_ms()) == 0))
            break;
    }
    if (p->inflight)
        ledger_recv(p, errstr, sizeof(errstr));
    int64_t left = deadline_ms - idem_now_ms();
    idem_dlq_flush(p->dlq, left > 0 ? (int)left : 0);
    dlq_collect(p, errstr, sizeof(errstr));
    advance_offsets(p);
}

/* ------------------------------------------------------------ rebalance */

/* Sets each newly assigned partition of `parts` to start at the position
 * Redis holds for it, when it holds one (else Kafka's committed offset
 * applies), and compares it with Kafka's committed offset. When Redis
 * cannot be asked now, positions_sync does it once it can (the member is
 * paused until then). */
static void assign_positions(idem_pipeline_t *p,
                             rd_kafka_topic_partition_list_t *parts)
{
    char errstr[512];
    if (p->inflight) /* its replies come first on the connection */
        ledger_recv(p, errstr, sizeof(errstr));
    if (p->infra_down || p->refused || parts->cnt == 0)
        return;
    idem_store_pos_t *pos = pos_reserve(p, (size_t)parts->cnt);
    for (int i = 0; i < parts->cnt; i++) {
        pos[i].topic = parts->elems[i].topic;
        pos[i].partition = parts->elems[i].partition;
        pos[i].offset = -1; /* filled in by the load */
    }
    if (idem_store_positions_load(p->store, pos, (size_t)parts->cnt, errstr,
                                  sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "reading positions from redis failed",
                    "error", errstr, NULL);
        return; /* positions_sync asks again before anything is applied */
    }
    rd_kafka_topic_partition_list_t *committed =
        rd_kafka_topic_partition_list_copy(parts);
    if (rd_kafka_committed(p->rk, committed, 5000))
        for (int i = 0; i < committed->cnt; i++)
            committed->elems[i].offset = RD_KAFKA_OFFSET_INVALID;
    for (int i = 0; i < parts->cnt; i++) {
        part_t *pt =
            part_find(p, parts->elems[i].topic, parts->elems[i].partition);
        int64_t kafka = committed->elems[i].err ? RD_KAFKA_OFFSET_INVALID
                                                : committed->elems[i].offset;
        if (kafka >= 0)
            pt->committed = kafka;
        if (pos[i].offset >= 0) {
            parts->elems[i].offset = pos[i].offset;
            pt->saved = pos[i].offset;
            if (kafka >= 0 && pos[i].offset < kafka)
                position_behind(p, pt, pos[i].offset, kafka);
        }
        pt->checked = 1;
    }
    rd_kafka_topic_partition_list_destroy(committed);
}

/* Rebalance callback: fires inside rd_kafka_consumer_poll (or close) on the
 * processing thread. Before partitions are given up, what is in hand is
 * finished if the infrastructure allows and their offsets are committed
 * synchronously; a lost assignment commits nothing. */
static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    idem_pipeline_t *p = opaque;
    int cooperative = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    p->epoch++;
    owner_update(p);
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        idem_metrics_rebalance_add(p->m, "assign");
        p->joined = 1;
        p->brokers_down = 0; /* the coordinator just answered */
        set_ready(p);
        for (int i = 0; i < parts->cnt; i++)
            part_add(p, parts->elems[i].topic, parts->elems[i].partition);
        assign_positions(p, parts);
        if (cooperative)
            rd_kafka_error_destroy(rd_kafka_incremental_assign(rk, parts));
        else
            rd_kafka_assign(rk, parts);
        if (p->paused) { /* keep new partitions quiet while we wait */
            p->paused = 0;
            pause_all(p, 1);
        }
        char cnt[16];
        snprintf(cnt, sizeof(cnt), "%d", parts->cnt);
        idem_log_kv(IDEM_LOG_INFO, "partitions assigned", "count", cnt,
                    "protocol", cooperative ? "cooperative" : "eager", NULL);
    } else {
        int lost = rd_kafka_assignment_lost(rk);
        idem_metrics_rebalance_add(p->m, lost ? "lost" : "revoke");
        char errstr[512];
        if (p->inflight) /* its replies must be read either way */
            ledger_recv(p, errstr, sizeof(errstr));
        if (!lost) {
            if (!p->infra_down && !p->fatal[0])
                drain(p, p->stop_by_ms ? p->stop_by_ms
                                       : idem_now_ms() +
                                             p->conf->shutdown_timeout_ms / 2);
            commit_offsets(p, parts, 1);
        }
        batch_drop_partitions(p, parts);
        for (int i = 0; i < parts->cnt; i++)
            part_remove(p, parts->elems[i].topic, parts->elems[i].partition);
        if (cooperative)
            rd_kafka_error_destroy(rd_kafka_incremental_unassign(rk, parts));
        else
            rd_kafka_assign(rk, NULL);
        char cnt[16];
        snprintf(cnt, sizeof(cnt), "%d", parts->cnt);
        idem_log_kv(IDEM_LOG_INFO,
                    lost ? "partitions lost" : "partitions revoked", "count",
                    cnt, NULL);
        if (p->part_cnt == 0)
            p->paused = 0;
    }
    idem_metrics_assigned_set(p->m, (int64_t)p->part_cnt);
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

/* Statistics callback: fires in rd_kafka_consumer_poll every
 * statistics.interval.ms. Returns 0: librdkafka frees json. */
static int consumer_stats_cb(rd_kafka_t *rk, char *json, size_t len,
                             void *opaque)
{
    (void)rk;
    idem_pipeline_t *p = opaque;
    idem_metrics_stats_json(p->m, json, len);
    /* Brokers back (an idle member sees no message that would say so). */
    if (p->brokers_down && memmem(json, len, "\"state\":\"UP\"", 12)) {
        p->brokers_down = 0;
        set_ready(p);
    }
    return 0;
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
    rd_kafka_set_log_queue(rk, NULL); /* logs to the main queue ... */
    rd_kafka_poll_set_consumer(rk);   /* ... served by consumer_poll */
    return rk;
}

/* The forward handler's idempotent output producer: a valid record may be
 * up to message.max.bytes (plus processed_at), above librdkafka's default
 * limit. Returns NULL with errstr. */
static rd_kafka_t *output_new(idem_pipeline_t *p, char *errstr,
                              size_t errstr_size)
{
    int64_t limit = p->conf->message_max_bytes + 65536;
    rd_kafka_conf_t *kc = idem_kafka_writer_conf(
        p->conf, limit > 1000000 ? limit : 1000000, errstr, errstr_size);
    if (!kc)
        return NULL;
    rd_kafka_conf_set_opaque(kc, p);
    rd_kafka_conf_set_dr_msg_cb(kc, out_dr_cb);
    return idem_kafka_new(RD_KAFKA_PRODUCER, kc, "output producer", errstr,
                          errstr_size);
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
    p->m = m;
    owner_update(p);
    /* Retry jitter must differ between members, or they retry in step. */
    srand((unsigned)(getpid() ^ idem_wall_ms()));
    p->cap = (size_t)conf->batch_max_messages * BATCHES_IN_HAND;
    p->recs = idem_xcalloc(p->cap, sizeof(*p->recs));
    p->store = idem_store_new(conf, m);
    idem_store_guard_eviction(p->store);
    if (!(p->dlq = idem_dlq_new(conf, dlq_report, errstr, errstr_size)))
        goto fail;
    if (conf->handler == IDEM_HANDLER_FORWARD) {
        if (!(p->out = output_new(p, errstr, errstr_size)))
            goto fail;
        p->out_rkt = rd_kafka_topic_new(p->out, conf->output_topic, NULL);
    }
    if (!(p->rk = consumer_new(p, errstr, errstr_size)))
        goto fail;
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
    for (size_t i = 0; i < p->cnt; i++)
        rec_release(&p->recs[i]);
    if (p->rk)
        rd_kafka_destroy(p->rk);
    if (p->out_rkt)
        rd_kafka_topic_destroy(p->out_rkt);
    if (p->out) {
        /* Unacknowledged writes are not marked done: the next owner of
         * the partition redoes them. Nothing to wait for here. */
        rd_kafka_purge(p->out,
                       RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(p->out, 100); /* reports free orphaned tickets */
        rd_kafka_destroy(p->out);
    }
    idem_dlq_destroy(p->dlq); /* reports of orphaned tickets free them */
    idem_store_destroy(p->store);
    for (size_t i = 0; i < p->part_cnt; i++)
        free(p->parts[i].topic);
    free(p->parts);
    free(p->recs);
    free(p->rs);
    free(p->envs);
    free(p->res);
    free(p->pos);
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
    part_t *pt = part_find(p, rd_kafka_topic_name(msg->rkt), msg->partition);
    if (!pt || msg->offset <= pt->high_seen ||
        (pt->next_offset >= 0 && msg->offset < pt->next_offset)) {
        rd_kafka_message_destroy(msg); /* not ours, or already in hand */
        return;
    }
    pt->high_seen = msg->offset;
    if (p->cnt == p->cap) { /* only while pausing takes effect */
        p->cap *= 2;
        p->recs = idem_xrealloc(p->recs, p->cap * sizeof(*p->recs));
    }
    rec_t *r = &p->recs[p->cnt++];
    memset(r, 0, sizeof(*r));
    r->msg = msg;
    r->polled_us = idem_now_us();
}

/* Polls up to batch.max.messages new records, waiting at most
 * batch.max.wait.ms once there is something to work on (a record, or a
 * Redis request in flight), and up to 100 ms when idle. */
static void batch_fill(idem_pipeline_t *p, volatile int *stop)
{
    size_t max = (size_t)p->conf->batch_max_messages;
    size_t added = 0, start = p->cnt;
    int64_t now0 = idem_now_ms();
    int64_t deadline = 0; /* 0: idle, wait up to 100 ms for a record */
    if (p->inflight) {
        deadline = now0 + p->conf->batch_max_wait_ms;
    } else if (p->cnt) {
        /* Records wait for a retry time: sleep in poll until then (at most
         * 100 ms), never spin, even with batch.max.wait.ms=0. */
        int64_t until = p->next_attempt_ms > now0 ? p->next_attempt_ms : now0;
        if (until > now0 + 100)
            until = now0 + 100;
        deadline = until > now0 + p->conf->batch_max_wait_ms
                       ? until
                       : now0 + p->conf->batch_max_wait_ms;
        if (deadline == now0)
            deadline = now0 + 1;
    }
    while (added < max && !*stop) {
        int64_t now = idem_now_ms();
        int timeout = 100;
        if (deadline) {
            if (now >= deadline)
                break;
            timeout = (int)(deadline - now);
        }
        rd_kafka_message_t *msg = rd_kafka_consumer_poll(p->rk, timeout);
        if (!msg) {
            if (!deadline)
                break; /* idle: let the loop do its housekeeping */
            continue;
        }
        batch_add(p, msg);
        added = p->cnt > start ? p->cnt - start : 0;
        if (added && !deadline)
            deadline = now + p->conf->batch_max_wait_ms;
    }
}

static void progress_log(idem_pipeline_t *p, int64_t now)
{
    if (p->conf->progress_interval_ms <= 0 ||
        now - p->last_progress_ms < p->conf->progress_interval_ms)
        return;
    double secs = (double)(now - p->last_progress_ms) / 1000.0;
    char rate[32], lag[32], proc[32], dup[32], dlq[32];
    snprintf(rate, sizeof(rate), "%.0f",
             p->last_progress_ms ? (double)p->progress_records / secs : 0.0);
    /* -1 until the first librdkafka statistics: unknown, not negative. */
    int64_t lag_total = idem_metrics_lag_total(p->m);
    if (lag_total < 0)
        snprintf(lag, sizeof(lag), "?");
    else
        snprintf(lag, sizeof(lag), "%" PRId64, lag_total);
    snprintf(proc, sizeof(proc), "%" PRIu64,
             idem_metrics_outcome_get(p->m, IDEM_OUTCOME_PROCESSED));
    snprintf(dup, sizeof(dup), "%" PRIu64,
             idem_metrics_outcome_get(p->m, IDEM_OUTCOME_DUPLICATE));
    snprintf(dlq, sizeof(dlq), "%" PRIu64,
             idem_metrics_outcome_get(p->m, IDEM_OUTCOME_DLQ));
    if (p->last_progress_ms)
        idem_log_kv(IDEM_LOG_INFO, "progress", "rate", rate, "lag", lag,
                    "processed", proc, "duplicate", dup, "dlq", dlq, NULL);
    p->last_progress_ms = now;
    p->progress_records = 0;
}

int idem_pipeline_run(idem_pipeline_t *p, volatile int *stop, char *errstr,
                      size_t errstr_size)
{
    char cerr[512];
    if (idem_store_connect(p->store, cerr, sizeof(cerr))) {
        check_refused(p);
        if (p->refused) {
            snprintf(errstr, errstr_size, "%s", p->fatal);
            rd_kafka_consumer_close(p->rk);
            return IDEM_PIPELINE_REFUSED;
        }
        idem_log_kv(IDEM_LOG_WARN, "redis not reachable yet", "error", cerr,
                    NULL);
        p->infra_down = 1;
        snprintf(p->infra_reason, sizeof(p->infra_reason), "%s", cerr);
        p->backoff_ms = p->conf->retry_backoff_initial_ms;
        p->next_attempt_ms = idem_now_ms() + p->backoff_ms;
    }
    set_ready(p);
    p->last_progress_ms = idem_now_ms();
    p->last_commit_ms = idem_now_ms();

    while (!*stop) {
        int64_t now = idem_now_ms();
        idem_metrics_heartbeat(p->m);
        if (p->infra_down || p->paused) {
            /* Waiting: keep the membership alive, retry when due. */
            rd_kafka_message_t *msg = rd_kafka_consumer_poll(p->rk, 50);
            if (msg)
                batch_add(p, msg);
            if (now >= p->next_attempt_ms) {
                if (p->cnt || p->inflight) {
                    attempt(p);
                } else if (positions_sync(p, cerr, sizeof(cerr)) == 0) {
                    if (p->infra_down)
                        idem_log_kv(IDEM_LOG_INFO,
                                    "infrastructure back: resuming", NULL);
                    p->infra_down = 0;
                    p->backoff_ms = 0;
                    set_ready(p);
                    pause_all(p, 0);
                } else {
                    check_refused(p);
                    p->backoff_ms =
                        p->backoff_ms * 2 > p->conf->retry_backoff_max_ms
                            ? p->conf->retry_backoff_max_ms
                            : (p->backoff_ms
                                   ? p->backoff_ms * 2
                                   : p->conf->retry_backoff_initial_ms);
                    p->next_attempt_ms = now + p->backoff_ms;
                    snprintf(p->infra_reason, sizeof(p->infra_reason), "%s",
                             cerr);
                    set_ready(p);
                }
            }
        } else {
            /* Fill the next batch while Redis runs the previous one; with
             * full hands wait a moment for acknowledgements instead. */
            if (batch_full(p))
                idem_dlq_wait(p->dlq, 5);
            else
                batch_fill(p, stop);
            if (p->cnt || p->inflight)
                attempt(p);
        }
        if (now - p->last_commit_ms >= p->conf->commit_interval_ms)
            commit_offsets(p, NULL, 0);
        /* While idle, the server (and its memory policy) every second:
         * this also notices a Redis that went away, and maybe lost writes,
         * while there was nothing to do (work() checks while busy). */
        if (!p->cnt && !p->inflight && !p->infra_down && !p->refused &&
            idem_store_check(p->store, IDLE_CHECK_INTERVAL_MS, cerr,
                             sizeof(cerr))) {
            infra_failed(p, cerr, now);
            set_ready(p);
            pause_all(p, 1);
        }
        progress_log(p, now);
        if (p->out)
            rd_kafka_poll(p->out, 0);
        if (!p->fatal[0] &&
            !idem_dlq_fatal(p->dlq, p->fatal, sizeof(p->fatal)) && p->out)
            idem_kafka_fatal(p->out, "output producer", p->fatal,
                             sizeof(p->fatal));
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
    int64_t t = p->conf->shutdown_timeout_ms;
    p->stop_by_ms = idem_now_ms() + t * 3 / 4 - (t / 4 < 1000 ? t / 4 : 1000);
    set_ready(p);
    if (!p->infra_down && !p->fatal[0])
        drain(p, p->stop_by_ms);
    else if (p->inflight)
        ledger_recv(p, cerr, sizeof(cerr));
    commit_offsets(p, NULL, 1);
    rd_kafka_resp_err_t err = rd_kafka_consumer_close(p->rk);
    if (p->fatal[0]) {
        snprintf(errstr, errstr_size, "%s", p->fatal);
        return p->refused ? IDEM_PIPELINE_REFUSED : -1;
    }
    if (err) {
        snprintf(errstr, errstr_size, "leaving the group: %s",
                 rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}
