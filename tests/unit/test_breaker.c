/* test_breaker (unit): the webhook's circuit breaker: the service failing
 * as a whole opens it, one record failing while others succeed does not;
 * the open period, Retry-After, probes. */
#include "handlers/breaker.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

TestSuite(breaker);

Test(breaker, one_record_failing_while_others_succeed_stays_its_own)
{
    idem_breaker_t b;
    idem_breaker_init(&b);
    int64_t t = 1000;
    /* Record 7 fails on every attempt, interleaved with successes and
     * even when nothing else is sent: never an outage. */
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(idem_breaker_result(&b, 7, 1, "HTTP 500", -1, t), 0,
                     "attempt %d", i);
        if (i % 3 == 0)
            cr_assert_eq(idem_breaker_result(&b, 100 + i, 0, NULL, -1, t), 0);
        cr_assert_eq(idem_breaker_room(&b, t), SIZE_MAX);
        t += 10;
    }
    cr_expect_eq(b.state, IDEM_BREAKER_CLOSED);
}

Test(breaker, most_recent_requests_failing_open_it)
{
    idem_breaker_t b;
    idem_breaker_init(&b);
    int64_t t = 0;
    for (uint64_t i = 0; i < IDEM_BREAKER_WINDOW; i++)
        idem_breaker_result(&b, i, 0, NULL, -1, t);
    /* A full window of successes: failures must make half of it. */
    int opened_at = -1;
    for (int i = 0; i < IDEM_BREAKER_WINDOW && opened_at < 0; i++)
        if (idem_breaker_result(&b, 1000 + (uint64_t)i, 1, "HTTP 503: busy", -1,
                                t))
            opened_at = i;
    cr_expect_eq(opened_at, IDEM_BREAKER_WINDOW / 2 - 1);
    cr_expect_eq(b.state, IDEM_BREAKER_OPEN);
    cr_expect(strstr(idem_breaker_reason(&b), "10 of the last 20 requests "
                                              "failed; last: HTTP 503: busy"),
              "%s", idem_breaker_reason(&b));
    cr_expect_eq(idem_breaker_room(&b, t), 0);
    /* In flight when it opened: part of the outage. */
    cr_expect_eq(idem_breaker_result(&b, 5000, 1, "HTTP 503", -1, t + 1), 1);
}

Test(breaker, few_requests_need_the_minimum_and_two_records)
{
    idem_breaker_t b;
    idem_breaker_init(&b);
    /* 4 failures of 4 requests: below the minimum of 5. */
    for (uint64_t i = 0; i < IDEM_BREAKER_MIN_FAILURES - 1; i++)
        cr_expect_eq(idem_breaker_result(&b, i, 1, "HTTP 502", -1, 0), 0);
    cr_expect_eq(idem_breaker_result(&b, 99, 1, "HTTP 502", -1, 0), 1);

    /* Only one record at a time, failing again and again: its own. */
    idem_breaker_init(&b);
    for (int i = 0; i < 3 * IDEM_BREAKER_WINDOW; i++)
        cr_expect_eq(idem_breaker_result(&b, 42, 1, "HTTP 502", -1, i), 0);
    /* A second record failing too: the service fails as a whole. */
    cr_expect_eq(idem_breaker_result(&b, 43, 1, "HTTP 502", -1, 100), 1);
}

Test(breaker, open_period_retry_after_probes_and_close)
{
    idem_breaker_t b;
    idem_breaker_init(&b);
    idem_breaker_trip(&b, "connect: Connection refused", -1, 0);
    cr_expect_eq(b.state, IDEM_BREAKER_OPEN);
    cr_expect_str_eq(idem_breaker_reason(&b), "connect: Connection refused");
    cr_expect_eq(idem_breaker_room(&b, IDEM_BREAKER_OPEN_MIN_MS - 1), 0);
    /* The period passed: a few probes. */
    int64_t t = IDEM_BREAKER_OPEN_MIN_MS;
    cr_expect_eq(idem_breaker_room(&b, t), IDEM_BREAKER_PROBES);
    idem_breaker_started(&b);
    cr_expect_eq(idem_breaker_room(&b, t), IDEM_BREAKER_PROBES - 1);
    /* A failed probe opens it for twice as long. */
    cr_expect_eq(idem_breaker_result(&b, 1, 1, "HTTP 503", -1, t), 1);
    cr_expect_eq(idem_breaker_room(&b, t + 2 * IDEM_BREAKER_OPEN_MIN_MS - 1),
                 0);
    t += 2 * IDEM_BREAKER_OPEN_MIN_MS;
    cr_expect_gt(idem_breaker_room(&b, t), 0);
    idem_breaker_started(&b);
    /* Retry-After wins over a shorter period. */
    cr_expect_eq(idem_breaker_result(&b, 1, 1, "HTTP 429", 20000, t), 1);
    cr_expect_eq(idem_breaker_room(&b, t + 19999), 0);
    t += 20000;
    cr_expect_gt(idem_breaker_room(&b, t), 0);
    idem_breaker_started(&b);
    /* A success closes it with an empty window. */
    cr_expect_eq(idem_breaker_result(&b, 2, 0, NULL, -1, t), 0);
    cr_expect_eq(b.state, IDEM_BREAKER_CLOSED);
    cr_expect_eq(idem_breaker_room(&b, t), SIZE_MAX);
    cr_expect_eq(b.win_cnt, 1);
    cr_expect_eq(b.open_ms, IDEM_BREAKER_OPEN_MIN_MS);
}

Test(breaker, period_doubles_up_to_its_cap)
{
    idem_breaker_t b;
    idem_breaker_init(&b);
    int64_t t = 0;
    idem_breaker_trip(&b, "down", -1, t);
    for (int i = 0; i < 10; i++) {
        t = b.open_until_ms;
        cr_assert_gt(idem_breaker_room(&b, t), 0);
        idem_breaker_started(&b);
        idem_breaker_trip(&b, "down", -1, t);
    }
    cr_expect_eq(b.open_until_ms - t, IDEM_BREAKER_OPEN_MAX_MS);
    /* Retry-After is capped too. */
    t = b.open_until_ms;
    idem_breaker_room(&b, t);
    idem_breaker_trip(&b, "down", 24LL * 3600 * 1000, t);
    cr_expect_eq(b.open_until_ms - t, IDEM_BREAKER_RETRY_AFTER_MAX_MS);
}

/* A record is its identity, not its address: the loop reuses record
 * structs, so failures of different records in one struct are different
 * records (and open the breaker), while one identity failing again in any
 * struct stays one record. */
Test(breaker, records_are_told_apart_by_identity_not_address)
{
    char rec[16]; /* one struct, reused for each record */
    memcpy(rec, "ord-1", 5);
    uint64_t a = idem_breaker_record_id(rec, 5);
    memcpy(rec, "ord-2", 5);
    uint64_t b2 = idem_breaker_record_id(rec, 5);
    cr_expect_neq(a, b2);
    cr_expect_eq(idem_breaker_record_id("ord-1", 5), a, "same identity");
    /* NUL bytes are data; a prefix is another identity. */
    cr_expect_neq(idem_breaker_record_id("a\0b", 3),
                  idem_breaker_record_id("a\0c", 3));
    cr_expect_neq(idem_breaker_record_id("ord-1", 4), a);

    idem_breaker_t b;
    idem_breaker_init(&b);
    int64_t t = 1000;
    int opened = 0;
    for (int i = 0; i < IDEM_BREAKER_MIN_FAILURES && !opened; i++) {
        snprintf(rec, sizeof(rec), "ord-%d", i);
        opened = idem_breaker_result(
            &b, idem_breaker_record_id(rec, strlen(rec)), 1, "HTTP 503", -1, t);
    }
    cr_expect(opened, "different records in one struct opened nothing");
    cr_expect_eq(b.state, IDEM_BREAKER_OPEN);

    idem_breaker_init(&b);
    for (int i = 0; i < 3 * IDEM_BREAKER_MIN_FAILURES; i++) {
        char other[16];
        snprintf(other, sizeof(other), "ord-x");
        cr_expect_eq(idem_breaker_result(&b, idem_breaker_record_id(other, 5),
                                         1, "HTTP 503", -1, t),
                     0, "one identity failing opened it");
    }
    cr_expect_eq(b.state, IDEM_BREAKER_CLOSED);
}
