/* breaker: the webhook's circuit breaker: a service failing as a whole is
 * an outage, one record it keeps refusing is that record's (breaker.h). */
#include "handlers/breaker.h"

#include <stdio.h>
#include <string.h>

void idem_breaker_init(idem_breaker_t *b)
{
    memset(b, 0, sizeof(*b));
    b->open_ms = IDEM_BREAKER_OPEN_MIN_MS;
}

uint64_t idem_breaker_record_id(const void *identity, size_t identity_len)
{
    /* FNV-1a, then a finalizer so that short identities spread too. Two
     * identities sharing a hash (about 1 in 2^64) would count as one
     * record: at worst the breaker opens one failure later. */
    const unsigned char *p = identity;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < identity_len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

static void window_clear(idem_breaker_t *b)
{
    b->win_head = 0;
    b->win_cnt = 0;
}

static void window_add(idem_breaker_t *b, uint64_t who, int failed)
{
    size_t i = (b->win_head + b->win_cnt) % IDEM_BREAKER_WINDOW;
    if (b->win_cnt == IDEM_BREAKER_WINDOW)
        b->win_head = (b->win_head + 1) % IDEM_BREAKER_WINDOW;
    else
        b->win_cnt++;
    b->win[i].who = who;
    b->win[i].failed = failed;
}

/* Whether the window says the service fails as a whole; *failures gets
 * how many of its results failed. */
static int window_failing(const idem_breaker_t *b, size_t *failures)
{
    size_t failed = 0, records = 0;
    for (size_t k = 0; k < b->win_cnt; k++) {
        size_t i = (b->win_head + k) % IDEM_BREAKER_WINDOW;
        if (!b->win[i].failed)
            continue;
        failed++;
        int seen = 0; /* a record failing again counts once */
        for (size_t l = 0; l < k && !seen; l++) {
            size_t j = (b->win_head + l) % IDEM_BREAKER_WINDOW;
            seen = b->win[j].failed && b->win[j].who == b->win[i].who;
        }
        records += !seen;
    }
    *failures = failed;
    return failed >= IDEM_BREAKER_MIN_FAILURES &&
           failed * 100 >= (size_t)IDEM_BREAKER_FAILURE_PCT * b->win_cnt &&
           records >= IDEM_BREAKER_MIN_RECORDS;
}

/* A probe failed: the next open period is twice as long, up to
 * IDEM_BREAKER_OPEN_MAX_MS. */
static void period_double(idem_breaker_t *b)
{
    b->open_ms = b->open_ms * 2 < IDEM_BREAKER_OPEN_MAX_MS
                     ? b->open_ms * 2
                     : IDEM_BREAKER_OPEN_MAX_MS;
}

/* Opens for the current period, at least Retry-After. */
static void open_now(idem_breaker_t *b, int64_t retry_after_ms, int64_t now)
{
    int64_t ms = b->open_ms;
    if (retry_after_ms > IDEM_BREAKER_RETRY_AFTER_MAX_MS)
        retry_after_ms = IDEM_BREAKER_RETRY_AFTER_MAX_MS;
    if (retry_after_ms > ms)
        ms = retry_after_ms;
    b->state = IDEM_BREAKER_OPEN;
    b->open_until_ms = now + ms;
    b->probes = 0;
}

size_t idem_breaker_room(idem_breaker_t *b, int64_t now)
{
    if (b->state == IDEM_BREAKER_OPEN && now >= b->open_until_ms) {
        b->state = IDEM_BREAKER_HALF_OPEN;
        b->probes = 0;
    }
    switch (b->state) {
    case IDEM_BREAKER_CLOSED:
        return SIZE_MAX;
    case IDEM_BREAKER_HALF_OPEN:
        return b->probes < IDEM_BREAKER_PROBES ? IDEM_BREAKER_PROBES - b->probes
                                               : 0;
    default:
        return 0;
    }
}

void idem_breaker_started(idem_breaker_t *b)
{
    if (b->state == IDEM_BREAKER_HALF_OPEN)
        b->probes++;
}

int idem_breaker_result(idem_breaker_t *b, uint64_t who, int failed,
                        const char *why, int64_t retry_after_ms, int64_t now)
{
    if (b->state == IDEM_BREAKER_HALF_OPEN && b->probes)
        b->probes--;
    if (!failed) {
        if (b->state != IDEM_BREAKER_CLOSED) {
            /* The service answers again: closed, a fresh start. */
            b->state = IDEM_BREAKER_CLOSED;
            b->open_ms = IDEM_BREAKER_OPEN_MIN_MS;
            window_clear(b);
        }
        window_add(b, who, 0);
        return 0;
    }
    switch (b->state) {
    case IDEM_BREAKER_OPEN:
        /* Sent before it opened: part of the same outage. */
        if (retry_after_ms > 0 && now + retry_after_ms > b->open_until_ms)
            open_now(b, retry_after_ms, now);
        return 1;
    case IDEM_BREAKER_HALF_OPEN:
        period_double(b);
        open_now(b, retry_after_ms, now);
        snprintf(b->reason, sizeof(b->reason), "%s", why ? why : "");
        return 1;
    default:
        break;
    }
    window_add(b, who, 1);
    size_t failures;
    if (!window_failing(b, &failures))
        return 0;
    snprintf(b->reason, sizeof(b->reason),
             "%zu of the last %zu requests failed; last: %.400s", failures,
             b->win_cnt, why ? why : "");
    open_now(b, retry_after_ms, now);
    return 1;
}

void idem_breaker_trip(idem_breaker_t *b, const char *why,
                       int64_t retry_after_ms, int64_t now)
{
    if (b->state == IDEM_BREAKER_HALF_OPEN) {
        if (b->probes)
            b->probes--;
        period_double(b);
    }
    if (b->state != IDEM_BREAKER_OPEN || now >= b->open_until_ms)
        open_now(b, retry_after_ms, now);
    snprintf(b->reason, sizeof(b->reason), "%s", why ? why : "");
}

const char *idem_breaker_reason(const idem_breaker_t *b)
{
    return b->reason;
}

const char *idem_breaker_state2str(idem_breaker_state_t s)
{
    switch (s) {
    case IDEM_BREAKER_CLOSED:
        return "closed";
    case IDEM_BREAKER_OPEN:
        return "open";
    case IDEM_BREAKER_HALF_OPEN:
        return "half-open";
    }
    return "?";
}
