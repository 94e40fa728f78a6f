/* progress: the loop's progress line (progress.h). */
#include "loop/progress.h"
#include "base/log.h"
#include "base/outcome.h"

#include <inttypes.h>
#include <stdio.h>

void idem_progress_start(idem_progress_t *pr, int64_t now)
{
    pr->last_ms = now;
    pr->records = 0;
}

void idem_progress_log(idem_progress_t *pr, idem_metrics_t *m, size_t assigned,
                       int64_t interval_ms, int64_t now)
{
    if (interval_ms <= 0 || now - pr->last_ms < interval_ms)
        return;
    double secs = (double)(now - pr->last_ms) / 1000.0;
    char rate[32], lag[32], proc[32], dup[32], dlq[32], held[32];
    snprintf(rate, sizeof(rate), "%.0f",
             pr->last_ms ? (double)pr->records / secs : 0.0);
    /* -1 until the first librdkafka statistics: unknown, not negative. */
    int64_t lag_total = idem_metrics_lag_total(m);
    if (lag_total < 0)
        snprintf(lag, sizeof(lag), "?");
    else
        snprintf(lag, sizeof(lag), "%" PRId64, lag_total);
    snprintf(proc, sizeof(proc), "%" PRIu64,
             idem_metrics_outcome_get(m, IDEM_OUTCOME_PROCESSED));
    snprintf(dup, sizeof(dup), "%" PRIu64,
             idem_metrics_outcome_get(m, IDEM_OUTCOME_DUPLICATE));
    snprintf(dlq, sizeof(dlq), "%" PRIu64,
             idem_metrics_outcome_get(m, IDEM_OUTCOME_DLQ));
    /* lag=0 with assigned=0 is a member waiting for partitions. */
    snprintf(held, sizeof(held), "%zu", assigned);
    if (pr->last_ms)
        idem_log_kv(IDEM_LOG_INFO, "progress", "rate", rate, "lag", lag,
                    "assigned", held, "processed", proc, "duplicate", dup,
                    "dlq", dlq, NULL);
    pr->last_ms = now;
    pr->records = 0;
}
