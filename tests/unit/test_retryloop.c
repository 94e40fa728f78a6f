/* test_retryloop: when a copy from a retry topic is due, how its partition
 * is held and released, without a broker. */
#include "loop/retryloop.h"

#include <criterion/criterion.h>
#include <string.h>

static idem_retrytopics_t *rt;
static idem_offsets_t offs;

static void setup(void)
{
    static const int64_t delays[] = {1000, 60000};
    rt = idem_retrytopics_new("in", delays, 2);
    idem_offsets_init(&offs);
    idem_offsets_add(&offs, "in-retry-1", 0)->retry_tier = 1;
    idem_offsets_add(&offs, "in-retry-1", 1)->retry_tier = 1;
}

static void teardown(void)
{
    idem_offsets_term(&offs);
    idem_retrytopics_destroy(rt);
}

TestSuite(retryloop, .init = setup, .fini = teardown);

/* Headers of a copy with `attempts` and retry.due.at `due_ms`. */
static rd_kafka_headers_t *copy_headers(int attempts, int64_t due_ms)
{
    idem_retry_info_t origin;
    memset(&origin, 0, sizeof(origin));
    snprintf(origin.topic, sizeof(origin.topic), "in");
    return idem_retrytopic_headers_new(NULL, &origin, attempts, due_ms, "e");
}

Test(retryloop, copy_waits_until_due_and_holds_its_partition)
{
    idem_part_t *pt = idem_offsets_find(&offs, "in-retry-1", 0);
    rec_t r1 = {.view = {.timestamp = 5000}}, r2 = r1;
    rd_kafka_headers_t *h = copy_headers(3, 10000);
    /* wall 9000, due 10000: waits 1000 on the loop's clock (now 50). */
    cr_expect_eq(idem_retryloop_arrived(rt, &r1, pt, h, 50, 9000), 1);
    cr_expect_eq(r1.tier, 1);
    cr_expect_eq(r1.prior_attempts, 3);
    cr_expect_eq(r1.retry_at_ms, 1050);
    cr_expect_eq(pt->hold_until_ms, 1050);
    cr_expect_eq(idem_retryloop_held(&offs), 1);
    /* A second copy of the held partition: held longer, no new pause. */
    rd_kafka_headers_destroy(h);
    h = copy_headers(3, 10500);
    cr_expect_eq(idem_retryloop_arrived(rt, &r2, pt, h, 60, 9000), 0);
    cr_expect_eq(pt->hold_until_ms, 1560);
    /* Released once the last is due, not before. */
    cr_expect_eq(idem_retryloop_release(pt, 1559), 0);
    cr_expect_eq(idem_retryloop_release(pt, 1560), 1);
    cr_expect_eq(pt->hold_until_ms, 0);
    cr_expect_eq(idem_retryloop_release(pt, 2000), 0, "released once");
    cr_expect_eq(idem_retryloop_held(&offs), 0);
    rd_kafka_headers_destroy(h);
}

Test(retryloop, due_copy_goes_at_once)
{
    idem_part_t *pt = idem_offsets_find(&offs, "in-retry-1", 1);
    rec_t r = {.view = {.timestamp = 5000}};
    rd_kafka_headers_t *h = copy_headers(1, 8000);
    cr_expect_eq(idem_retryloop_arrived(rt, &r, pt, h, 50, 9000), 0);
    cr_expect_eq(r.retry_at_ms, 0);
    cr_expect_eq(pt->hold_until_ms, 0);
    rd_kafka_headers_destroy(h);
}

Test(retryloop, without_due_header_its_tier_delay_after_its_timestamp)
{
    idem_part_t *pt = idem_offsets_find(&offs, "in-retry-1", 0);
    rec_t r = {.view = {.timestamp = 5000}};
    /* No headers at all: tier 1's delay (1000) after the timestamp, and
     * the attempts so far are the tier's number. */
    cr_expect_eq(idem_retryloop_arrived(rt, &r, pt, NULL, 0, 5400), 1);
    cr_expect_eq(r.retry_at_ms, 600);
    cr_expect_eq(r.prior_attempts, 1);
}

Test(retryloop, far_due_time_is_capped)
{
    idem_part_t *pt = idem_offsets_find(&offs, "in-retry-1", 0);
    rec_t r = {.view = {.timestamp = 5000}};
    /* Another member's clock a day ahead: at most the tier's delay and the
     * longest Retry-After. */
    rd_kafka_headers_t *h = copy_headers(2, 86400000);
    idem_retryloop_arrived(rt, &r, pt, h, 0, 5000);
    cr_expect_eq(r.retry_at_ms, 1000 + IDEM_RETRY_AFTER_MAX_MS);
    rd_kafka_headers_destroy(h);
}
