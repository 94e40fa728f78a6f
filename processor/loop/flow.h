/* flow: when the loop works, waits and fetches. One backoff function (for
 * the infrastructure and for a record's retries), the infrastructure-down
 * state machine, readiness, and the pause decision. No broker and no
 * Redis here: the loop reports what happened and asks what to do
 * (tests/unit/test_flow.c). */
#ifndef IDEM_FLOW_H
#define IDEM_FLOW_H

#include <stdint.h>

/* The delay before attempt number `attempt` (1: the first retry):
 * initial_ms doubled per attempt, at most max_ms. */
int64_t idem_backoff_ms(int attempt, int64_t initial_ms, int64_t max_ms);

/* "Equal jitter" of a delay d: d/2 + a random part of d/2, from `rnd`
 * (any non-negative number, e.g. rand()). */
int64_t idem_backoff_jitter(int64_t d, int64_t rnd);

/* How long hands may stay full before input is paused. */
#define IDEM_FLOW_FULL_PAUSE_MS 1000

typedef struct {
    int64_t initial_ms, max_ms; /* retry.backoff.initial.ms / .max.ms */
    int down;                   /* the last attempt failed on infrastructure */
    int failures;               /* consecutive failed attempts */
    char reason[512];           /* why down (the last failure) */
    int64_t next_attempt_ms;    /* 0: now */
    int64_t full_since_ms;      /* hands full since (0: not full) */
} idem_flow_t;

void idem_flow_init(idem_flow_t *f, int64_t initial_ms, int64_t max_ms);

/* An attempt failed on the infrastructure at `now` (reason: one line):
 * down, next attempt after the backoff. Returns 1 when this starts an
 * outage (the loop logs it once), else 0. */
int idem_flow_failed(idem_flow_t *f, const char *reason, int64_t now);

/* An attempt succeeded: up, the backoff restarts; the next attempt at
 * `next_ms` (a record's retry time, 0: none). Returns 1 when this ends an
 * outage, else 0. */
int idem_flow_ok(idem_flow_t *f, int64_t next_ms);

/* Whether an attempt is due at `now`. */
int idem_flow_due(const idem_flow_t *f, int64_t now);

/* Whether input must be paused at `now`, given whether the hands are
 * full: while down, or while full for more than IDEM_FLOW_FULL_PAUSE_MS
 * (pausing drops librdkafka's prefetched records, so a short full spell
 * only stops fetching). */
int idem_flow_should_pause(idem_flow_t *f, int full, int64_t now);

/* Why the member is not ready (static or f->reason), or NULL when ready;
 * in this order: shutting down, not joined, infrastructure down, all
 * brokers down. */
const char *idem_flow_not_ready(const idem_flow_t *f, int stopping, int joined,
                                int brokers_down);

#endif
