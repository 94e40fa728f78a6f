/* test_rejectguard: when a run of handler-rejected results stops being
 * dead-lettered, and what lets it through again. */
#include "loop/rejectguard.h"

#include <criterion/criterion.h>
#include <string.h>

Test(rejectguard, off_never_trips)
{
    idem_rejectguard_t g;
    idem_rejectguard_init(&g, 0);
    for (int i = 0; i < 100000; i++)
        cr_assert_eq(idem_rejectguard_reject(&g), 0);
    cr_expect_not(idem_rejectguard_tripped(&g));
}

Test(rejectguard, trips_at_the_nth_reject_in_a_row_and_stays)
{
    idem_rejectguard_t g;
    idem_rejectguard_init(&g, 3);
    cr_expect_eq(idem_rejectguard_reject(&g), 0);
    cr_expect_eq(idem_rejectguard_reject(&g), 0);
    cr_expect_not(idem_rejectguard_tripped(&g));
    /* The third is held back: two dead letters, not three. */
    cr_expect_eq(idem_rejectguard_reject(&g), 1);
    cr_expect(idem_rejectguard_tripped(&g));
    for (int i = 0; i < 10; i++)
        cr_expect_eq(idem_rejectguard_reject(&g), 1, "retries stay held");
}

Test(rejectguard, a_success_between_starts_the_run_again)
{
    idem_rejectguard_t g;
    idem_rejectguard_init(&g, 3);
    for (int i = 0; i < 10; i++) {
        cr_expect_eq(idem_rejectguard_reject(&g), 0);
        cr_expect_eq(idem_rejectguard_reject(&g), 0);
        idem_rejectguard_ok(&g); /* one poison record among good ones */
    }
    cr_expect_not(idem_rejectguard_tripped(&g));
    /* Tripped, then the effect is fixed: rejects go to the DLQ again. */
    for (int i = 0; i < 3; i++)
        idem_rejectguard_reject(&g);
    cr_expect(idem_rejectguard_tripped(&g));
    idem_rejectguard_ok(&g);
    cr_expect_not(idem_rejectguard_tripped(&g));
    cr_expect_eq(idem_rejectguard_reject(&g), 0);
}

Test(rejectguard, reason_names_the_key_and_the_last_reason)
{
    idem_rejectguard_t g;
    idem_rejectguard_init(&g, 100);
    char buf[512];
    idem_rejectguard_reason(&g, "script: attempt to index a nil value", buf,
                            sizeof(buf));
    cr_expect(strstr(buf, "100 records in a row"), "%s", buf);
    cr_expect(strstr(buf, "handler.max.consecutive.rejects"), "%s", buf);
    cr_expect(strstr(buf, "last: script: attempt to index a nil value"), "%s",
              buf);
}
