/* rejectguard: stops a blast of dead letters from a broken effect (see
 * rejectguard.h). */
#include "loop/rejectguard.h"

#include <inttypes.h>
#include <stdio.h>

void idem_rejectguard_init(idem_rejectguard_t *g, int64_t max)
{
    g->max = max > 0 ? max : 0;
    g->run = 0;
}

int idem_rejectguard_reject(idem_rejectguard_t *g)
{
    if (!g->max)
        return 0;
    if (g->run < g->max)
        g->run++;
    return g->run >= g->max;
}

void idem_rejectguard_ok(idem_rejectguard_t *g)
{
    g->run = 0;
}

int idem_rejectguard_tripped(const idem_rejectguard_t *g)
{
    return g->max && g->run >= g->max;
}

const char *idem_rejectguard_reason(const idem_rejectguard_t *g,
                                    const char *last, char *buf, size_t size)
{
    snprintf(buf, size,
             "handler rejected %" PRId64 " records in a row "
             "(handler.max.consecutive.rejects): input paused, nothing more "
             "dead-lettered until a record succeeds; last: %.300s",
             g->max, last && *last ? last : "(no reason)");
    return buf;
}
