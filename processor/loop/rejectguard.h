/* rejectguard: stops a blast of dead letters from a broken effect. After
 * handler.max.consecutive.rejects handler-rejected results in a row, with
 * no success between, a reject is no longer dead-lettered: the loop treats
 * it as an outage (pause, not ready, retry with backoff) until a record
 * succeeds. No broker and no Redis here (tests/unit/test_rejectguard.c).
 */
#ifndef IDEM_REJECTGUARD_H
#define IDEM_REJECTGUARD_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t max; /* rejects in a row that trip it; 0: off */
    int64_t run; /* rejects in a row so far */
} idem_rejectguard_t;

void idem_rejectguard_init(idem_rejectguard_t *g, int64_t max);

/* A record was rejected by the handler. Returns 0 when it is to be
 * dead-lettered as usual, or 1 when the guard is tripped (this is the
 * max-th reject in a row, or a later one): the caller holds the record
 * back as in an outage, with idem_rejectguard_reason as the error. */
int idem_rejectguard_reject(idem_rejectguard_t *g);

/* A record took effect (or was a duplicate: the effect's path works):
 * the run starts again, a tripped guard lets rejects through again. */
void idem_rejectguard_ok(idem_rejectguard_t *g);

/* 1 while tripped. */
int idem_rejectguard_tripped(const idem_rejectguard_t *g);

/* The not-ready reason of a tripped guard, with the handler's last
 * reason (borrowed, may be NULL), into buf; returns buf. */
const char *idem_rejectguard_reason(const idem_rejectguard_t *g,
                                    const char *last, char *buf, size_t size);

#endif
