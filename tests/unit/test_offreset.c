/* test_offreset: `idemproc offsets`'s rules without a broker or Redis:
 * --topic selections, where a member starts, where each --to-* moves a
 * partition, and whose commit an offset is. */
#include "kafka/offreset.h"

#include <criterion/criterion.h>
#include <string.h>

Test(offreset, topic_selections_parse_and_match)
{
    idem_offreset_sel_t s[2];
    char err[256];
    cr_assert_eq(idem_offreset_sel_parse("payments", &s[0], err, sizeof(err)),
                 0);
    cr_assert_eq(idem_offreset_sel_parse("orders:0,3", &s[1], err, sizeof(err)),
                 0);
    cr_expect_eq(s[1].nparts, 2);
    cr_expect(idem_offreset_sel_match(s, 2, "payments", 7));
    cr_expect(idem_offreset_sel_match(s, 2, "orders", 3));
    cr_expect(!idem_offreset_sel_match(s, 2, "orders", 1));
    cr_expect(!idem_offreset_sel_match(s, 2, "other", 0));
    cr_expect(idem_offreset_sel_match(s, 0, "other", 0)); /* none: all */
    idem_offreset_sel_clear(&s[0]);
    idem_offreset_sel_clear(&s[1]);
    const char *bad[] = {"", ":1", "t:", "t:x", "t:1,", "t:-1", "t:1;2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_eq(idem_offreset_sel_parse(bad[i], &s[0], err, sizeof(err)),
                     -1, "\"%s\" taken", bad[i]);
        cr_expect(strstr(err, "--topic"), "%s", err);
    }
}

Test(offreset, a_partition_the_topic_lacks_is_named_with_those_it_has)
{
    idem_offreset_sel_t s;
    char err[256];
    const int32_t two[] = {1, 0};
    cr_assert_eq(idem_offreset_sel_parse("payments:7", &s, err, sizeof(err)),
                 0);
    cr_assert_eq(idem_offreset_sel_check(&s, two, 2, err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--topic payments:7: payments has no partition 7 "
                          "(it has 0-1)");
    idem_offreset_sel_clear(&s);
    const int32_t gaps[] = {5, 0, 1, 2, 3, 9};
    cr_assert_eq(idem_offreset_sel_parse("orders:1,8,12", &s, err, sizeof(err)),
                 0);
    cr_assert_eq(idem_offreset_sel_check(&s, gaps, 6, err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--topic orders:1,8,12: orders has no partitions 8, "
                          "12 (it has 0-3, 5, 9)");
    idem_offreset_sel_clear(&s);
    cr_assert_eq(idem_offreset_sel_parse("orders:0,9", &s, err, sizeof(err)),
                 0);
    cr_expect_eq(idem_offreset_sel_check(&s, gaps, 6, err, sizeof(err)), 0);
    idem_offreset_sel_clear(&s);
    cr_assert_eq(idem_offreset_sel_parse("orders", &s, err, sizeof(err)), 0);
    cr_expect_eq(idem_offreset_sel_check(&s, gaps, 6, err, sizeof(err)), 0);
    idem_offreset_sel_clear(&s);
}

Test(offreset, a_member_starts_at_redis_then_kafka_then_auto_reset)
{
    idem_offreset_from_t from;
    const idem_offreset_by_t other = IDEM_OFFRESET_BY_OTHER;
    cr_expect_eq(idem_offreset_start(40, 1, 30, other, 1, 0, 50, &from), 40);
    cr_expect_eq(from, IDEM_OFFRESET_FROM_REDIS);
    cr_expect_eq(idem_offreset_start(40, 0, 30, other, 1, 0, 50, &from), 30);
    cr_expect_eq(from, IDEM_OFFRESET_FROM_KAFKA);
    cr_expect_eq(idem_offreset_start(-1, 1, -1, other, 1, 5, 50, &from), 5);
    cr_expect_eq(from, IDEM_OFFRESET_FROM_AUTO);
    cr_expect_eq(idem_offreset_start(-1, 1, -1, other, 0, 5, 50, &from), 50);
    cr_expect_str_eq(idem_offreset_from2str(IDEM_OFFRESET_FROM_AUTO),
                     "auto.offset.reset");
}

/* Redis holds no position while Kafka holds a member's offset: Redis lost
 * everything of the partition, and it starts nowhere. Another tool's
 * offset (an upgrade from before the metadata, kafka-consumer-groups) or a
 * reset's is used as before; a position not usable here is no loss. */
Test(offreset, a_member_offset_without_a_redis_position_starts_nowhere)
{
    idem_offreset_from_t from;
    cr_expect(idem_offreset_redis_lost(-1, 30, IDEM_OFFRESET_BY_MEMBER));
    cr_expect_eq(idem_offreset_start(-1, 1, 30, IDEM_OFFRESET_BY_MEMBER, 1, 0,
                                     50, &from),
                 30);
    cr_expect_eq(from, IDEM_OFFRESET_FROM_NOWHERE);
    cr_expect_str_eq(idem_offreset_from2str(from), "paused:redis-lost");
    cr_expect(!idem_offreset_redis_lost(-1, 30, IDEM_OFFRESET_BY_OTHER));
    cr_expect(!idem_offreset_redis_lost(-1, 30, IDEM_OFFRESET_BY_RESET));
    cr_expect(!idem_offreset_redis_lost(-1, -1, IDEM_OFFRESET_BY_MEMBER));
    cr_expect(!idem_offreset_redis_lost(20, 30, IDEM_OFFRESET_BY_MEMBER));
    cr_expect_eq(
        idem_offreset_start(-1, 1, 30, IDEM_OFFRESET_BY_OTHER, 1, 0, 50, &from),
        30);
    cr_expect_eq(from, IDEM_OFFRESET_FROM_KAFKA);
    cr_expect_eq(idem_offreset_start(20, 0, 30, IDEM_OFFRESET_BY_MEMBER, 1, 0,
                                     50, &from),
                 30);
    cr_expect_eq(from, IDEM_OFFRESET_FROM_KAFKA);
}

Test(offreset, targets_stay_within_the_watermarks)
{
    idem_offreset_to_t to = {IDEM_OFFRESET_EARLIEST, 0};
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 10);
    to.mode = IDEM_OFFRESET_LATEST;
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 100);
    to = (idem_offreset_to_t){IDEM_OFFRESET_OFFSET, 3};
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 10);
    to.value = 70;
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 70);
    to.value = 700;
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 100);
    to = (idem_offreset_to_t){IDEM_OFFRESET_SHIFT, -20};
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 40);
    to.value = -1000;
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 10);
    to.value = INT64_MAX;
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 100);
    to = (idem_offreset_to_t){IDEM_OFFRESET_DATETIME, 1796000000000};
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, 42), 42);
    cr_expect_eq(idem_offreset_target(&to, 10, 100, 60, -1), 100); /* none */
}

Test(offreset, a_time_before_1970_is_asked_as_the_epoch)
{
    /* -1 and -2 are ListOffsets' "latest" and "earliest" */
    cr_expect_eq(idem_offreset_time_query(-1), 0);
    cr_expect_eq(idem_offreset_time_query(-2), 0);
    cr_expect_eq(idem_offreset_time_query(INT64_MIN), 0);
    cr_expect_eq(idem_offreset_time_query(0), 0);
    cr_expect_eq(idem_offreset_time_query(1796000000000), 1796000000000);
}

Test(offreset, whose_commit_an_offset_is)
{
    cr_expect_eq(idem_offreset_committed_by("idemproc", 8),
                 IDEM_OFFRESET_BY_MEMBER);
    const char *r = "idemproc offsets reset 2026-12-01T20:00:00Z";
    cr_expect_eq(idem_offreset_committed_by(r, strlen(r)),
                 IDEM_OFFRESET_BY_RESET);
    cr_expect_eq(idem_offreset_committed_by(NULL, 0), IDEM_OFFRESET_BY_OTHER);
    cr_expect_eq(idem_offreset_committed_by("", 0), IDEM_OFFRESET_BY_OTHER);
    cr_expect_eq(idem_offreset_committed_by("idemprocX", 9),
                 IDEM_OFFRESET_BY_OTHER);
    cr_expect_eq(idem_offreset_committed_by("idem", 4), IDEM_OFFRESET_BY_OTHER);
}
