/* breaker: a circuit breaker that tells a service failing as a whole (an
 * outage: pause, never dead-letter) from one record it keeps refusing (that
 * record spends its retries). No clock, no network: the caller reports
 * results and the time (tests/unit/test_breaker.c).
 *
 * Closed: requests go out; the last IDEM_BREAKER_WINDOW results are kept.
 * It opens when that window holds at least IDEM_BREAKER_MIN_FAILURES
 * failures (5xx, 408, 429, a broken exchange), they are at least
 * IDEM_BREAKER_FAILURE_PCT percent of the window, and they come from at
 * least IDEM_BREAKER_MIN_RECORDS distinct records: one record that keeps
 * failing while others succeed never opens it. A service that cannot be
 * reached at all (connection refused, DNS, TLS handshake, no response
 * before the timeout) opens it at once (idem_breaker_trip).
 *
 * Open: no request goes out for the open period: IDEM_BREAKER_OPEN_MIN_MS,
 * doubled by each failed probe up to IDEM_BREAKER_OPEN_MAX_MS, and never
 * shorter than the service's Retry-After (capped at
 * IDEM_BREAKER_RETRY_AFTER_MAX_MS, the webhook's cap for a record's
 * Retry-After too).
 *
 * Half-open (the period over): up to IDEM_BREAKER_PROBES requests at once
 * probe the service; the first success closes it (the window starts
 * empty), a failure opens it again for the doubled period. */
#ifndef IDEM_BREAKER_H
#define IDEM_BREAKER_H

#include <stddef.h>
#include <stdint.h>

#define IDEM_BREAKER_WINDOW             20
#define IDEM_BREAKER_MIN_FAILURES       5
#define IDEM_BREAKER_FAILURE_PCT        50
#define IDEM_BREAKER_MIN_RECORDS        2
#define IDEM_BREAKER_OPEN_MIN_MS        1000
#define IDEM_BREAKER_OPEN_MAX_MS        30000
#define IDEM_BREAKER_RETRY_AFTER_MAX_MS (5 * 60 * 1000)
#define IDEM_BREAKER_PROBES             4

typedef enum {
    IDEM_BREAKER_CLOSED = 0,
    IDEM_BREAKER_OPEN,
    IDEM_BREAKER_HALF_OPEN,
} idem_breaker_state_t;

typedef struct {
    idem_breaker_state_t state;
    struct {
        uint64_t who; /* the record (idem_breaker_record_id; failures of
                         one count once) */
        int failed;
    } win[IDEM_BREAKER_WINDOW];
    size_t win_head, win_cnt;
    int64_t open_until_ms; /* OPEN: no request before this */
    int64_t open_ms;       /* the current open period */
    size_t probes;         /* HALF_OPEN: probes in flight */
    char reason[512];      /* why it opened last (one line) */
} idem_breaker_t;

void idem_breaker_init(idem_breaker_t *b);

/* The `who` of a record for idem_breaker_result: a 64-bit hash of its
 * identity (bytes, identity_len of them; NUL bytes are data), so one
 * operation failing again, whichever copy of it (a retry, a retry topic's
 * copy), counts once. Never a record's address: the loop reuses record
 * structs, and two records at one address would count as one. */
uint64_t idem_breaker_record_id(const void *identity, size_t identity_len);

/* How many more requests may start at `now`: SIZE_MAX while closed, 0
 * while open, the probes left while half-open (an open breaker whose
 * period passed turns half-open here). */
size_t idem_breaker_room(idem_breaker_t *b, int64_t now);

/* A request starts (counts a probe while half-open). */
void idem_breaker_started(idem_breaker_t *b);

/* A request of record `who` ended at `now`: failed (5xx, 408, 429, a
 * broken exchange) or not (any answer the service meant: 2xx, other 4xx).
 * why: one line (kept as the reason when this opens the breaker);
 * retry_after_ms: the service's Retry-After, -1 when none. Returns 1 when
 * the failure belongs to an outage (the breaker is open or half-open
 * after it: not the record's fault), 0 for a success or a failure the
 * record owns. */
int idem_breaker_result(idem_breaker_t *b, uint64_t who, int failed,
                        const char *why, int64_t retry_after_ms, int64_t now);

/* The service cannot be reached at all (why: one line): open now. */
void idem_breaker_trip(idem_breaker_t *b, const char *why,
                       int64_t retry_after_ms, int64_t now);

/* The reason it opened last ("" when it never did). */
const char *idem_breaker_reason(const idem_breaker_t *b);

const char *idem_breaker_state2str(idem_breaker_state_t s);

#endif
