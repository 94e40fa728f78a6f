/* effects: the records in hand on their way to the handler and back:
 * reading them (envelope), what is due, claiming and submitting, results
 * into outcomes, retries, and dead letters. Its own state (what is with
 * the handler, the dead-letter and retry bookkeeping, the scratch, the
 * reject guard, the step's clock) lives here; the parts it shares with
 * the loop (records in hand, offsets, positions, the handler, progress)
 * are pointed to, owned and bound by pipeline.c. */
#ifndef IDEM_EFFECTS_H
#define IDEM_EFFECTS_H

#include "obs/metrics.h"
#include "conf/conf.h"
#include "input/envelope.h"
#include "kafka/dlq.h"
#include "kafka/retrytopic.h"
#include "loop/apply.h"
#include "loop/due.h"
#include "loop/offsets.h"
#include "loop/positions.h"
#include "loop/progress.h"
#include "loop/rec.h"
#include "loop/records.h"
#include "loop/rejectguard.h"

#include <stddef.h>
#include <stdint.h>

/* How often the loop looks at its hands at least while a copy from a
 * retry topic waits there. */
#define RETRY_COPY_RECHECK_MS 100

typedef struct {
    /* Bound by the loop (pipeline.c), which owns them. */
    const idem_conf_t *conf;
    idem_metrics_t *m;
    idem_metrics_acc_t *acc;      /* the finished records' figures */
    idem_dlq_t *dlq;              /* dead letters and retry-topic copies */
    idem_retrytopics_t *rt;       /* retry.topics; NULL: blocking retries */
    idem_envelope_rules_t *rules; /* how records are read */
    idem_apply_t *apply;          /* the handler (apply.h) */
    idem_records_t *recs;         /* rec_t *, in poll order */
    idem_offsets_t *offs;         /* the partitions held */
    idem_positions_t *positions;  /* positions in Redis */
    idem_progress_t *progress;    /* the progress line */
    const char *owner;            /* "lease:<member>:<epoch>" */
    size_t cap;                   /* the records in hand expected at most:
                                     the scratch's first size */
    size_t hold_bound;            /* a partition with this many records in
                                     hand all behind busy keys pauses its
                                     fetch (due.h; 0: never) */

    /* Its own. */
    int64_t clock_us;           /* idem_now_us() of the current step: one
                                   clock read per step, not per record (the
                                   loop sets it too) */
    int64_t wall_offset_us;     /* wall clock minus idem_now_us(), taken by the
                                   loop each turn (effect latency) */
    size_t inflight;            /* records with the handler */
    int answered;               /* a collect read a result that is no outage
                                   (the loop clears it) */
    int draining;               /* revoke or shutdown: no new effect starts */
    int dlq_due;                /* a record may need a DLQ or retry-topic
                                   write: idem_effects_dlq_queue walks */
    size_t tickets;             /* records with a write in flight (r->dlq):
                                   idem_effects_dlq_collect walks */
    int retry_waiting;          /* a record may wait for its retry time:
                                   idem_effects_next_retry walks */
    idem_rejectguard_t rejects; /* handler.max.consecutive.rejects */
    idem_due_t due;             /* what may start now, by `ordering` (set
                                   up at the first feed, from the handler) */
    int due_ready;
    int64_t census_us;       /* when the ordering gauges were last taken */
    int64_t holds_us;        /* when the key holds were last judged */
    size_t key_holds;        /* partitions whose key_hold is set */
    uint64_t parsed_n;       /* records read (idem_effects_parse) */
    uint64_t holds_parsed_n; /* parsed_n when the key holds were judged */
    rec_t **rs;              /* scratch: records handed to a handler */
    idem_record_t **views;   /* scratch: their views */
    idem_result_t *hres;     /* scratch: what the handler said */
    idem_part_t **parts;     /* scratch: the records' partitions */
    size_t scratch_cap;
} idem_effects_t;

/* Frees the scratch (the bound parts are the loop's). */
void idem_effects_term(idem_effects_t *fx);

/* Collects what the handler finished (waiting up to timeout_ms for the
 * first) and applies it. Returns 0 or -1 (outage: errstr). */
int idem_effects_collect(idem_effects_t *fx, int timeout_ms, char *errstr,
                         size_t errstr_size);

/* Finishes or abandons everything with the handler until deadline_ms:
 * afterwards no record is with it. */
void idem_effects_settle(idem_effects_t *fx, int64_t deadline_ms);

/* Gives the handler what is due, no more than it can start now; nothing
 * while draining. Then judges which partitions wait behind busy keys
 * (each partition's key_hold, fx->key_holds: the loop pauses their
 * fetch). Returns 0 or -1 (outage: errstr). */
int idem_effects_feed(idem_effects_t *fx, char *errstr, size_t errstr_size);

/* Reads new records by the envelope rules and fills their views. */
void idem_effects_parse(idem_effects_t *fx);

/* Queues the dead letters and retry-topic copies not written yet.
 * Returns 0, or -1 when the producer refused to queue. */
int idem_effects_dlq_queue(idem_effects_t *fx, char *errstr,
                           size_t errstr_size);

/* Finishes records whose write was acknowledged. Returns -1 when a write
 * failed. */
int idem_effects_dlq_collect(idem_effects_t *fx, char *errstr,
                             size_t errstr_size);

/* Earliest retry time of a waiting record, or 0 when none waits. */
int64_t idem_effects_next_retry(idem_effects_t *fx);

#endif
