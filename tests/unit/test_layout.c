/* Unit tests of the dedup layout's switch decision and transition window
 * (redis/layout.h): who may switch the group to partition, given the live
 * members' fingerprints. */
#include <criterion/criterion.h>
#include <string.h>

#include "redis/layout.h"

#define NEW_PART                                                               \
    "handler=ledger\nlayouts=global,partition\nlayout.wants=partition\n"
#define NEW_GLOB                                                               \
    "handler=ledger\nlayouts=global,partition\nlayout.wants=global\n"
#define OLD "handler=ledger\ndedup.scope=#00000000000000aa\n"

Test(layout, every_member_new_and_wanting_partition_switches)
{
    const char *fps[] = {NEW_PART, NEW_PART, NEW_PART};
    char why[64] = "x";
    size_t b = 99;
    cr_assert_eq(
        idem_layout_decide(fps, 3, IDEM_LAYOUT_PARTITION, &b, why, sizeof(why)),
        1);
}

Test(layout, one_member_wanting_global_blocks)
{
    const char *fps[] = {NEW_PART, NEW_GLOB, NEW_PART};
    char why[64];
    size_t b = 99;
    cr_assert_eq(
        idem_layout_decide(fps, 3, IDEM_LAYOUT_PARTITION, &b, why, sizeof(why)),
        0);
    cr_expect_eq(b, 1);
    cr_expect_str_eq(why, "wants global");
}

Test(layout, a_binary_without_the_layout_key_blocks)
{
    const char *fps[] = {NEW_PART, OLD};
    char why[64];
    size_t b = 99;
    cr_assert_eq(
        idem_layout_decide(fps, 2, IDEM_LAYOUT_PARTITION, &b, why, sizeof(why)),
        0);
    cr_expect_eq(b, 1);
    cr_expect_str_eq(why, "does not support the layout key");
}

Test(layout, a_binary_supporting_only_global_blocks)
{
    const char *fps[] = {"layouts=global\nlayout.wants=partition\n", NEW_PART};
    char why[64];
    size_t b = 99;
    cr_assert_eq(
        idem_layout_decide(fps, 2, IDEM_LAYOUT_PARTITION, &b, why, sizeof(why)),
        0);
    cr_expect_eq(b, 0);
    cr_expect_str_eq(why, "does not support the layout key");
}

Test(layout, no_live_member_blocks_nothing)
{
    cr_expect_eq(
        idem_layout_decide(NULL, 0, IDEM_LAYOUT_PARTITION, NULL, NULL, 0), 1);
}

Test(layout, a_value_that_only_starts_like_partition_is_not_it)
{
    const char *fps[] = {"layouts=global,partitionx\nlayout.wants=partition\n"};
    cr_expect_eq(
        idem_layout_decide(fps, 1, IDEM_LAYOUT_PARTITION, NULL, NULL, 0), 0);
}

Test(layout, the_other_layout_is_honoured_for_one_ttl_after_the_switch)
{
    idem_layout_t l = {.layout = IDEM_LAYOUT_PARTITION,
                       .from = IDEM_LAYOUT_GLOBAL,
                       .since = 1000};
    cr_expect_eq(idem_layout_honours(&l, 60, 1000), 1);
    cr_expect_eq(idem_layout_honours(&l, 60, 1059), 1);
    cr_expect_eq(idem_layout_honours(&l, 60, 1060), 0);
    l.layout = IDEM_LAYOUT_GLOBAL;
    l.from = IDEM_LAYOUT_PARTITION; /* a rollback */
    cr_expect_eq(idem_layout_honours(&l, 60, 1030), 1);
}

Test(layout, a_key_never_switched_honours_nothing)
{
    idem_layout_t l = {0}; /* absent: global since 0 */
    cr_expect_eq(idem_layout_honours(&l, 86400, 10), 0);
    l.since = 1000; /* set to what it was: nothing to honour */
    l.from = l.layout;
    cr_expect_eq(idem_layout_honours(&l, 60, 1001), 0);
}

Test(layout, kinds_parse_and_print)
{
    idem_layout_kind_t k;
    cr_expect_eq(idem_layout_kind_parse("partition", &k), 0);
    cr_expect_eq(k, IDEM_LAYOUT_PARTITION);
    cr_expect_eq(idem_layout_kind_parse("global", &k), 0);
    cr_expect_eq(k, IDEM_LAYOUT_GLOBAL);
    cr_expect_eq(idem_layout_kind_parse("Global", &k), -1);
    cr_expect_str_eq(idem_layout_kind2str(IDEM_LAYOUT_PARTITION), "partition");
}
