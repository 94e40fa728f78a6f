/* test_membound: what member.memory.max must hold, and when the loop
 * pauses and resumes its fetching by the member's resident set. */
#include "loop/membound.h"

#include <criterion/criterion.h>

#define MiB (INT64_C(1) << 20)

Test(membound, need_counts_tables_twice_the_prefetch_hands_and_fixed)
{
    /* 64 MiB tables, 32 MiB prefetch, batches of 1000. */
    int64_t need = idem_membound_need(64 * MiB, 32768, 1000);
    cr_expect_eq(need, 64 * MiB + 64 * MiB + 4 * 1000 * 2048 +
                           IDEM_MEMBOUND_FIXED_BYTES);
    /* Global scope: no tables. */
    cr_expect_eq(idem_membound_need(0, 32768, 1000), need - 64 * MiB);
}

Test(membound, pauses_over_the_bound_and_resumes_a_prefetch_under_it)
{
    idem_membound_t mb;
    idem_membound_init(&mb, 256 * MiB, 32768); /* prefetch 32 MiB */
    cr_expect_eq(mb.resume_below, 224 * MiB);
    cr_expect_eq(idem_membound_update(&mb, 200 * MiB), 0);
    cr_expect_eq(idem_membound_update(&mb, 256 * MiB), 0); /* at, not over */
    cr_expect_eq(idem_membound_update(&mb, 256 * MiB + 1), 1);
    cr_expect(mb.over);
    cr_expect_eq(mb.pauses, 1);
    /* Still over, or under the bound but not yet under the resume point:
     * stays paused, no second pause counted. */
    cr_expect_eq(idem_membound_update(&mb, 300 * MiB), 0);
    cr_expect_eq(idem_membound_update(&mb, 230 * MiB), 0);
    cr_expect(mb.over);
    cr_expect_eq(idem_membound_update(&mb, 224 * MiB - 1), -1);
    cr_expect_not(mb.over);
    cr_expect_eq(idem_membound_update(&mb, 257 * MiB), 1);
    cr_expect_eq(mb.pauses, 2);
}

Test(membound, unreadable_rss_and_no_bound_change_nothing)
{
    idem_membound_t mb;
    idem_membound_init(&mb, 0, 32768);
    cr_expect_eq(idem_membound_update(&mb, INT64_MAX), 0);
    cr_expect_not(mb.over);
    idem_membound_init(&mb, 128 * MiB, 32768);
    cr_expect_eq(idem_membound_update(&mb, 200 * MiB), 1);
    cr_expect_eq(idem_membound_update(&mb, -1), 0); /* unreadable */
    cr_expect(mb.over);
    cr_expect_eq(mb.last_rss, 200 * MiB);
}

Test(membound, resume_point_stays_under_a_small_bound)
{
    idem_membound_t mb;
    /* A prefetch bound larger than half the bound: resume at half. */
    idem_membound_init(&mb, 64 * MiB, 65536);
    cr_expect_eq(mb.resume_below, 32 * MiB);
}
