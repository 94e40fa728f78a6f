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
