/* test_gpos: the global path's positions in cluster mode judged without
 * Redis (redis/gpos.h): a bucket that kept what the partition recorded, one
 * that lost a tail (read again from its `at`, never past the position),
 * one that lost everything, and the record fields' names. */
#include "redis/gpos.h"

#include <criterion/criterion.h>
#include <string.h>

Test(gpos, a_bucket_that_kept_its_records_needs_nothing)
{
    int64_t rw;
    cr_expect_eq(idem_gpos_judge(120, 120, 100, 500, &rw), IDEM_GPOS_KEPT);
    cr_expect_eq(rw, -1);
    /* The position's primary lost its tail instead: its record is behind
     * the bucket's; the records read again find the bucket's marks. */
    cr_expect_eq(idem_gpos_judge(80, 120, 100, 90, &rw), IDEM_GPOS_KEPT);
    /* Nothing recorded for the bucket: nothing it could have lost. */
    cr_expect_eq(idem_gpos_judge(-1, -1, -1, 90, &rw), IDEM_GPOS_KEPT);
}

Test(gpos, a_bucket_behind_the_record_rewinds_to_its_at)
{
    int64_t rw;
    cr_expect_eq(idem_gpos_judge(120, 95, 90, 500, &rw), IDEM_GPOS_BEHIND);
    cr_expect_eq(rw, 90);
    /* Never past the partition's own position. */
    cr_expect_eq(idem_gpos_judge(120, 95, 90, 60, &rw), IDEM_GPOS_BEHIND);
    cr_expect_eq(rw, 60);
    /* No position at all: the bucket's at. */
    cr_expect_eq(idem_gpos_judge(120, 95, 90, -1, &rw), IDEM_GPOS_BEHIND);
    cr_expect_eq(rw, 90);
}

Test(gpos, a_bucket_without_fields_lost_everything)
{
    int64_t rw;
    cr_expect_eq(idem_gpos_judge(120, -1, -1, 500, &rw), IDEM_GPOS_GONE);
    cr_expect_eq(rw, -1);
    cr_expect_eq(idem_gpos_judge(120, 130, -1, 500, &rw), IDEM_GPOS_GONE);
    cr_expect_str_eq(idem_gpos_verdict2str(IDEM_GPOS_GONE), "gone");
}

Test(gpos, record_fields_name_their_bucket)
{
    const char *base = "payments:3";
    size_t bl = strlen(base);
    cr_expect_eq(idem_gpos_record_bucket("payments:3:g07", 14, base, bl), 7);
    cr_expect_eq(idem_gpos_record_bucket("payments:3:g63", 14, base, bl), 63);
    cr_expect_eq(idem_gpos_record_bucket("payments:3", 10, base, bl), -1);
    cr_expect_eq(idem_gpos_record_bucket("payments:3:gx7", 14, base, bl), -1);
    cr_expect_eq(idem_gpos_record_bucket("payments:4:g07", 14, base, bl), -1);
    cr_expect_eq(idem_gpos_record_bucket("payments:3:g071", 15, base, bl), -1);
}

Test(gpos, the_touch_is_due_when_the_prefix_moved_and_a_period_passed)
{
    int64_t p = IDEM_GPOS_TOUCH_MS;
    /* Never touched: due at once. */
    cr_expect_eq(idem_gpos_touch_due(500, -1, -1, 120, 1000, 0), 1);
    /* Touched at 480 a moment ago: not yet; a period later: due. */
    cr_expect_eq(idem_gpos_touch_due(500, 480, 1000, 120, 1000 + p - 1, 0), 0);
    cr_expect_eq(idem_gpos_touch_due(500, 480, 1000, 120, 1000 + p, 0), 1);
    /* Revoke or shutdown: no period. */
    cr_expect_eq(idem_gpos_touch_due(500, 480, 1000, 120, 1001, 1), 1);
    /* The prefix did not move past the last touch: nothing to write, not
     * even when forced. */
    cr_expect_eq(idem_gpos_touch_due(480, 480, 1000, 120, 1000 + 9 * p, 0), 0);
    cr_expect_eq(idem_gpos_touch_due(470, 480, 1000, 120, 1000 + 9 * p, 1), 0);
    /* A bucket the partition never used, or no prefix yet: never. */
    cr_expect_eq(idem_gpos_touch_due(500, -1, -1, -1, 1000, 1), 0);
    cr_expect_eq(idem_gpos_touch_due(-1, -1, -1, 120, 1000, 1), 0);
}

Test(gpos, a_rewind_older_than_the_dedup_window_is_stale)
{
    /* at written 25 s ago, TTL 20 s: stale; 15 s ago: within it. */
    cr_expect_eq(idem_gpos_stale(100000, 125000, 20), 1);
    cr_expect_eq(idem_gpos_stale(110000, 125000, 20), 0);
    cr_expect_eq(idem_gpos_stale(105000, 125000, 20), 0);
    /* When at was written is not known (a bucket written before the
     * field existed): not judged. */
    cr_expect_eq(idem_gpos_stale(-1, 125000, 20), 0);
}
