/* scriptkill: ends a script that does not finish (SCRIPT KILL) over a
 * connection of its own, opened before it is needed: while a script runs
 * past Redis's busy threshold, Redis reads nothing else from the member's
 * own connection. */
#ifndef IDEM_SCRIPTKILL_H
#define IDEM_SCRIPTKILL_H

#include <stddef.h>

#include "conf/conf.h"

typedef struct idem_scriptkill_s idem_scriptkill_t;

typedef enum {
    IDEM_SCRIPTKILL_KILLED = 0, /* the script was ended, its writes none */
    IDEM_SCRIPTKILL_NOT_BUSY,   /* no script was running (it just ended) */
    IDEM_SCRIPTKILL_UNKILLABLE, /* it has written: Redis refuses to end it
                                   (only SHUTDOWN NOSAVE, or its end) */
    IDEM_SCRIPTKILL_FAILED,     /* no connection or no answer (errstr) */
} idem_scriptkill_result_t;

/* A killer for conf's Redis (conf borrowed, must outlive it). Connects at
 * once (a failure is retried at the next _run). Never NULL. */
idem_scriptkill_t *idem_scriptkill_new(const idem_conf_t *conf);

/* Sends SCRIPT KILL and waits at most wait_ms for the answer (Redis reads
 * it only once the script ran past its busy threshold). errstr gets
 * Redis's words or the failure. */
idem_scriptkill_result_t idem_scriptkill_run(idem_scriptkill_t *k, int wait_ms,
                                             char *errstr, size_t errstr_size);

void idem_scriptkill_destroy(idem_scriptkill_t *k); /* NULL: no-op */

#endif
