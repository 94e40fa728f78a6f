/* progress: the loop's progress line (progress.interval.ms): records
 * finished since the last line, and the line itself. */
#ifndef IDEM_PROGRESS_H
#define IDEM_PROGRESS_H

#include <stdint.h>

#include "obs/metrics.h"

typedef struct {
    int64_t last_ms;  /* the last line (or the start), idem_now_ms */
    uint64_t records; /* finished since */
} idem_progress_t;

/* Starts counting at `now`. */
void idem_progress_start(idem_progress_t *pr, int64_t now);

/* n more records finished here (an outcome, or a copy sent on). */
static inline void idem_progress_count(idem_progress_t *pr, uint64_t n)
{
    pr->records += n;
}

/* Logs the line when interval_ms (> 0) passed since the last one: the rate
 * since, the lag and the outcome totals from m (borrowed); a count started
 * at 0 only starts at the first call. */
void idem_progress_log(idem_progress_t *pr, idem_metrics_t *m, size_t assigned,
                       int64_t interval_ms, int64_t now);

#endif
