/* loop: the composed loop's struct, shared by pipeline.c (the loop itself,
 * commits, rebalances) and effects.c (records to the handler and back, dead
 * letters), which pipeline.c calls and which calls nothing of pipeline.c.
 * The parts (due.c, lease.c, deadletter.c, positions.c, retryloop.c,
 * progress.c, offsets.c, records.c, flow.c) own their state and never see
 * this. Internal: only these two files include it. */
#ifndef IDEM_LOOP_H
#define IDEM_LOOP_H

#include "kafka/dlq.h"
#include "input/envelope.h"
#include "loop/fetchwatch.h"
#include "loop/flow.h"
#include "loop/apply.h"
#include "loop/lease.h"
#include "effect/handler.h"
#include "loop/offsets.h"
#include "loop/pipeline.h"
#include "loop/positions.h"
#include "loop/progress.h"
#include "loop/rec.h"
#include "loop/records.h"
#include "loop/rejectguard.h"
#include "loop/retryloop.h"
#include "kafka/retrytopic.h"
#include "redis/store.h"
#include "loop/wake.h"

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

/* How many batches may wait in memory (in flight, being filled, waiting
 * for a retry or an acknowledgement) before fetching pauses. */
#define BATCHES_IN_HAND 4

/* How often the Redis server's maxmemory-policy is checked again. */
#define POLICY_CHECK_INTERVAL_MS 30000
#define IDLE_CHECK_INTERVAL_MS   1000

/* How long collect may wait for an external effect's results when nothing
 * else is to be done (short: the consumer is not polled meanwhile). */
#define EXTERNAL_WAIT_MS 5

/* How often the loop looks at its hands at least while a copy from a
 * retry topic waits there. */
#define RETRY_COPY_RECHECK_MS 100

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

    idem_records_t recs;    /* rec_t *, in poll order */
    rec_t *spares;          /* released records, reused: no allocation
                               per record (at most the most ever in
                               hand) */
    int64_t clock_us;       /* idem_now_us() of the current step: one
                               clock read per step, not per record */
    int64_t wall_offset_us; /* wall clock minus idem_now_us(), taken
                               each turn of the loop (effect latency) */
    size_t cnt;             /* records in hand (recs.live) */
    int dlq_due;            /* a record may need a DLQ or retry-topic
                               write: idem_loop_dlq_queue walks */
    size_t tickets;         /* records with a write in flight (r->dlq):
                               idem_loop_dlq_collect walks */
    int retry_waiting;      /* a record may wait for its retry time:
                               idem_loop_batch_next_retry walks */
    size_t cap;             /* BATCHES_IN_HAND batches: scratch size */
    size_t inflight;        /* records with the handler */
    rec_t **rs;             /* scratch: records handed to a handler */
    idem_record_t **views;  /* scratch: their views */
    idem_result_t *hres;    /* scratch: what the handler said */
    idem_part_t **parts;    /* scratch: the records' partitions */
    size_t scratch_cap;
    idem_offsets_t offs;        /* the partitions held and their positions */
    idem_flow_t flow;           /* backoff, outage state, pause decision */
    idem_rejectguard_t rejects; /* handler.max.consecutive.rejects */

    int paused; /* all partitions paused by us */
    int brokers_down;
    int joined;          /* a first assignment (maybe empty) arrived */
    int epoch;           /* bumped on every rebalance: lease fencing */
    char owner[320];     /* "lease:<member>:<epoch>" */
    int recommit;        /* an async commit failed: send all again */
    int collect_wait_ms; /* how long the next collect may wait (external
                            effect in flight, nothing fetched) */
    int draining;        /* revoke or shutdown: no new effect starts, only
                            what is with the handler finishes */

    int64_t stop_by_ms;        /* shutting down: every wait ends by then */
    char fatal[512];           /* a producer's fatal error: stop */
    void (*on_shutdown)(void); /* called once when shutdown begins */
    int64_t last_commit_ms;
    idem_progress_t progress; /* the progress line (progress.c) */
    int refused;              /* the Redis server was refused: exit 2 */
    int answered;             /* work() read a Redis reply without error, or an
                                 external effect result that is no outage */
    idem_positions_t positions; /* positions in Redis (positions.c) */
};

/* effects.c */
int idem_loop_handler_collect(idem_pipeline_t *p, int timeout_ms, char *errstr,
                              size_t errstr_size);
void idem_loop_handler_settle(idem_pipeline_t *p, int64_t deadline_ms);
int idem_loop_handler_feed(idem_pipeline_t *p, char *errstr,
                           size_t errstr_size);
void idem_loop_parse_records(idem_pipeline_t *p);
int idem_loop_dlq_queue(idem_pipeline_t *p, char *errstr, size_t errstr_size);
int idem_loop_dlq_collect(idem_pipeline_t *p, char *errstr, size_t errstr_size);
int64_t idem_loop_batch_next_retry(idem_pipeline_t *p);

#endif
