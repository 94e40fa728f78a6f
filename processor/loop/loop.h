/* loop: what the files of the processing loop share (pipeline.c: the
 * loop itself, commits, rebalances; effects.c: records to the handler and
 * back, dead letters; positions.c: positions in Redis; retryloop.c: retry
 * topics). Internal: only
 * these files include it. */
#ifndef IDEM_LOOP_H
#define IDEM_LOOP_H

#include "kafka/dlq.h"
#include "input/envelope.h"
#include "loop/fetchwatch.h"
#include "loop/flow.h"
#include "effect/handler.h"
#include "loop/offsets.h"
#include "loop/pipeline.h"
#include "loop/posread.h"
#include "loop/records.h"
#include "loop/rejectguard.h"
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
 * retry topic waits there (retryloop.c). */
#define RETRY_COPY_RECHECK_MS 100

typedef enum { REC_PENDING = 0, REC_DONE } rec_state_t;

/* The fate of one asynchronous DLQ write, owned by whoever is last: the
 * record frees it once it read the result; a record dropped before the
 * report marks it orphan and the report frees it. */
typedef struct {
    int state; /* 0 in flight, 1 acknowledged, -1 failed */
    rd_kafka_resp_err_t err;
    int orphan;
} ticket_t;

/* One consumed record and what we know about it. Allocated one by one:
 * its address is stable while it is in hand (the handler keeps pointers
 * to view). */
typedef struct rec_s {
    idem_record_t view;      /* what the handler sees; view.loop = this */
    rd_kafka_message_t *msg; /* owned; destroyed when the record leaves */
    int64_t polled_us;
    rec_state_t state;
    int parsed;
    int poison; /* 1: goes to the DLQ with `reason` */
    idem_reason_t reason;
    int attempts;             /* handler attempts (retry.max.attempts) */
    int sent;                 /* with the handler, result not collected yet */
    int store_sent;           /* an in-Redis request that may have applied it
                                 failed: its done mark with its own message id
                                 then means processed, not a duplicate */
    int64_t retry_at_ms;      /* not before this (busy lease, backoff) */
    ticket_t *dlq;            /* DLQ (or retry topic) write in flight or
                                 just reported */
    int tier;                 /* 0: from an input topic; k: from retry tier k */
    int prior_attempts;       /* failed attempts before this copy
                                 (retry.attempt) */
    int to_tier;              /* > 0: goes to that retry tier (retry.topics) */
    int64_t retry_after_ms;   /* the handler's least delay for that copy */
    int dlq_drop_value;       /* the DLQ refused the value: send it without */
    struct rec_s *next_spare; /* in the pipeline's spares (released) */
    /* The large parts last: a reused record is cleared up to here (the
     * envelope is cleared when it is read, the error when it is set). */
    char error[IDEM_RESULT_DETAIL_MAX];
    idem_envelope_t env;
} rec_t;

struct idem_pipeline_s {
    const idem_conf_t *conf;
    idem_metrics_t *m;
    idem_metrics_acc_t *acc; /* the finished records' figures, merged into
                                m once per turn of the loop (and before
                                anything reads m that must be complete) */
    idem_store_t *store;
    idem_dlq_t *dlq;
    rd_kafka_t *rk;                 /* consumer */
    idem_wake_t wake;               /* its queue, the DLQ's and the Redis
                                       reply in one wait (batch_fill) */
    int wake_kafka, wake_dlq;       /* their bits in idem_wake_wait */
    const idem_handler_ops_t *hops; /* the effect (handler.h) */
    void *h;                        /* its state */
    int in_redis;                   /* hops->effect == IDEM_EFFECT_IN_REDIS */
    idem_envelope_rules_t *rules;   /* how records are read */
    idem_retrytopics_t *rt;         /* retry.topics; NULL: blocking retries */
    idem_fetchwatch_t *fw;          /* fetch.stall.ms; NULL: no watch */

    idem_records_t recs;          /* rec_t *, in poll order */
    rec_t *spares;                /* released records, reused: no allocation
                                     per record (at most the most ever in
                                     hand) */
    int64_t clock_us;             /* idem_now_us() of the current step: one
                                     clock read per step, not per record */
    int64_t wall_offset_us;       /* wall clock minus idem_now_us(), taken
                                     each turn of the loop (effect latency) */
    size_t cnt;                   /* records in hand (recs.live) */
    int dlq_due;                  /* a record may need a DLQ or retry-topic
                                     write: idem_loop_dlq_queue walks */
    size_t tickets;               /* records with a write in flight (r->dlq):
                                     idem_loop_dlq_collect walks */
    int retry_waiting;            /* a record may wait for its retry time:
                                     idem_loop_batch_next_retry walks */
    size_t cap;                   /* BATCHES_IN_HAND batches: scratch size */
    size_t inflight;              /* records with the handler */
    rec_t **rs;                   /* scratch: records handed to a handler */
    idem_record_t **views;        /* scratch: their views */
    const idem_envelope_t **envs; /* scratch: their envelopes */
    idem_store_result_t *res;     /* scratch: what the store said */
    idem_result_t *hres;          /* scratch: what the handler said */
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
    int64_t last_progress_ms;
    uint64_t progress_records;
    int refused;           /* the Redis server was refused: exit 2 */
    int answered;          /* work() read a Redis reply without error, or an
                              external effect result that is no outage */
    uint64_t store_conns;  /* store connections when positions were read */
    char run_id[48];       /* the Redis server's run_id at that time */
    idem_store_pos_t *pos; /* scratch: positions to save or load */
    size_t pos_cap;
    char cluster[IDEM_POSVAL_CLUSTER_MAX]; /* the Kafka cluster's id ("":
                                              not known yet) */
    idem_posread_t *posread; /* reads back what positions vouch for
                                (created at the first need) */
};

/* pipeline.c */
idem_part_t *idem_loop_part_find(idem_pipeline_t *p, const char *topic,
                                 int32_t part);
idem_part_t *idem_loop_rec_part(idem_pipeline_t *p, const rec_t *r);
int idem_loop_store_busy(const idem_pipeline_t *p);
int idem_loop_wait_budget_ms(const idem_pipeline_t *p);
void idem_loop_batch_remove_if(idem_pipeline_t *p,
                               int (*drop)(idem_pipeline_t *p, const rec_t *r,
                                           const void *ctx),
                               const void *ctx);

/* effects.c */
size_t idem_loop_due_records(idem_pipeline_t *p, int64_t now);
int idem_loop_handler_collect(idem_pipeline_t *p, int timeout_ms, char *errstr,
                              size_t errstr_size);
void idem_loop_handler_settle(idem_pipeline_t *p, int64_t deadline_ms);
int idem_loop_handler_feed(idem_pipeline_t *p, char *errstr,
                           size_t errstr_size);
void idem_loop_parse_records(idem_pipeline_t *p);
void idem_loop_dlq_report(void *opaque, rd_kafka_resp_err_t err);
int idem_loop_dlq_queue(idem_pipeline_t *p, char *errstr, size_t errstr_size);
int idem_loop_dlq_collect(idem_pipeline_t *p, char *errstr, size_t errstr_size);
int64_t idem_loop_batch_next_retry(idem_pipeline_t *p);

/* retryloop.c */
void idem_loop_retry_arrived(idem_pipeline_t *p, rec_t *r, idem_part_t *pt);
void idem_loop_retry_release(idem_pipeline_t *p, int64_t now);
int idem_loop_retry_send(idem_pipeline_t *p, rec_t *r, ticket_t *t,
                         char *errstr, size_t errstr_size);
void idem_loop_retry_sent(idem_pipeline_t *p, rec_t *r);

/* positions.c */
size_t idem_loop_positions_due(idem_pipeline_t *p,
                               const rd_kafka_topic_partition_list_t *subset);
void idem_loop_positions_save(idem_pipeline_t *p,
                              const rd_kafka_topic_partition_list_t *subset);
int idem_loop_positions_sync(idem_pipeline_t *p, char *errstr,
                             size_t errstr_size);
void idem_loop_assign_positions(idem_pipeline_t *p,
                                rd_kafka_topic_partition_list_t *parts);
int idem_loop_positions_first(idem_pipeline_t *p, size_t n, char *errstr,
                              size_t errstr_size);

#endif
