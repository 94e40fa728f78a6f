/* test_flow: backoff bounds, the outage state machine, readiness and the
 * pause decision, without a broker or Redis. */
#include "loop/flow.h"

#include <criterion/criterion.h>
#include <string.h>

Test(flow, backoff_doubles_within_bounds)
{
    cr_expect_eq(idem_backoff_ms(1, 100, 5000), 100);
    cr_expect_eq(idem_backoff_ms(2, 100, 5000), 200);
    cr_expect_eq(idem_backoff_ms(6, 100, 5000), 3200);
    cr_expect_eq(idem_backoff_ms(7, 100, 5000), 5000);
    cr_expect_eq(idem_backoff_ms(1000, 100, 5000), 5000); /* no overflow */
    cr_expect_eq(idem_backoff_ms(0, 100, 5000), 100);
    for (int64_t r = 0; r < 5000; r += 7) {
        int64_t j = idem_backoff_jitter(1000, r * 7919);
        cr_assert(j >= 500 && j <= 1000, "jitter %lld", (long long)j);
    }
    cr_expect_eq(idem_backoff_jitter(0, 5), 0);
    cr_expect_eq(idem_backoff_jitter(1, 5), 0 + 5 % 1);
}

Test(flow, outage_starts_once_backs_off_and_ends)
{
    idem_flow_t f;
    idem_flow_init(&f, 100, 1000);
    cr_expect(idem_flow_due(&f, 0));
    cr_expect_null(idem_flow_not_ready(&f, 0, 1, 0));
    cr_expect_eq(idem_flow_failed(&f, "redis: connection refused", 10000), 1);
    cr_expect_eq(f.next_attempt_ms, 10100);
    cr_expect(!idem_flow_due(&f, 10099));
    cr_expect(idem_flow_due(&f, 10100));
    cr_expect_eq(idem_flow_failed(&f, "redis: still refused", 10100), 0,
                 "an outage is said once");
    cr_expect_eq(f.next_attempt_ms, 10300);
    for (int i = 0; i < 10; i++)
        idem_flow_failed(&f, "x", 20000);
    cr_expect_eq(f.next_attempt_ms, 21000, "capped at max");
    cr_expect_str_eq(idem_flow_not_ready(&f, 0, 1, 0), "x");
    cr_expect(idem_flow_should_pause(&f, 0, 20000), "paused while down");
    cr_expect_eq(idem_flow_ok(&f, 0), 1);
    cr_expect_eq(idem_flow_ok(&f, 0), 0);
    cr_expect_null(idem_flow_not_ready(&f, 0, 1, 0));
    /* The backoff starts over after a success. */
    idem_flow_failed(&f, "again", 30000);
    cr_expect_eq(f.next_attempt_ms, 30100);
}

Test(flow, readiness_reasons_in_order)
{
    idem_flow_t f;
    idem_flow_init(&f, 100, 1000);
    idem_flow_failed(&f, "redis down", 0);
    cr_expect_str_eq(idem_flow_not_ready(&f, 1, 0, 1), "shutting down");
    cr_expect_str_eq(idem_flow_not_ready(&f, 0, 0, 1),
                     "joining the consumer group");
    cr_expect_str_eq(idem_flow_not_ready(&f, 0, 1, 1), "redis down");
    idem_flow_ok(&f, 0);
    cr_expect_str_eq(idem_flow_not_ready(&f, 0, 1, 1),
                     "kafka: all brokers are down");
}

/* Full hands stop fetching at once but pause only after a second. */
Test(flow, full_hands_pause_only_when_it_lasts)
{
    idem_flow_t f;
    idem_flow_init(&f, 100, 1000);
    cr_expect(!idem_flow_should_pause(&f, 1, 5000));
    cr_expect(!idem_flow_should_pause(&f, 1, 5000 + IDEM_FLOW_FULL_PAUSE_MS));
    cr_expect(idem_flow_should_pause(&f, 1, 5001 + IDEM_FLOW_FULL_PAUSE_MS));
    cr_expect(!idem_flow_should_pause(&f, 0, 7000), "no longer full");
    cr_expect(!idem_flow_should_pause(&f, 1, 7001), "the clock starts over");
}
