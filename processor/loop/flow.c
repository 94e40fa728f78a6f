/* flow: backoff, the infrastructure-down state machine, readiness and the
 * pause decision (flow.h). */
#include "loop/flow.h"

#include <stdio.h>
#include <string.h>

int64_t idem_backoff_ms(int attempt, int64_t initial_ms, int64_t max_ms)
{
    int64_t d = initial_ms;
    for (int i = 1; i < attempt && d < max_ms; i++)
        d *= 2;
    return d > max_ms ? max_ms : d;
}

int64_t idem_backoff_jitter(int64_t d, int64_t rnd)
{
    if (d <= 0)
        return 0;
    return d / 2 + (rnd < 0 ? -rnd : rnd) % (d / 2 + 1);
}

void idem_flow_init(idem_flow_t *f, int64_t initial_ms, int64_t max_ms)
{
    memset(f, 0, sizeof(*f));
    f->initial_ms = initial_ms;
    f->max_ms = max_ms;
}

int idem_flow_failed(idem_flow_t *f, const char *reason, int64_t now)
{
    int started = !f->down;
    f->down = 1;
    snprintf(f->reason, sizeof(f->reason), "%s", reason);
    f->failures++;
    f->next_attempt_ms =
        now + idem_backoff_ms(f->failures, f->initial_ms, f->max_ms);
    return started;
}

int idem_flow_ok(idem_flow_t *f, int64_t next_ms)
{
    int ended = f->down;
    f->down = 0;
    f->failures = 0;
    f->reason[0] = '\0';
    f->next_attempt_ms = next_ms;
    return ended;
}

int idem_flow_due(const idem_flow_t *f, int64_t now)
{
    return now >= f->next_attempt_ms;
}

int idem_flow_should_pause(idem_flow_t *f, int full, int64_t now)
{
    if (!full)
        f->full_since_ms = 0;
    else if (!f->full_since_ms)
        f->full_since_ms = now;
    return f->down || (f->full_since_ms &&
                       now - f->full_since_ms > IDEM_FLOW_FULL_PAUSE_MS);
}

const char *idem_flow_not_ready(const idem_flow_t *f, int stopping, int joined,
                                int brokers_down)
{
    if (stopping)
        return "shutting down";
    if (!joined)
        return "joining the consumer group";
    if (f->down)
        return f->reason;
    if (brokers_down)
        return "kafka: all brokers are down";
    return NULL;
}
