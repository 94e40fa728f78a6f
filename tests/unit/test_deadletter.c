/* test_deadletter: a dead letter's life (written, failed, too large,
 * acknowledged) and a retry-topic copy's, as the loop judges their
 * delivery reports, and who frees a ticket. */
#include "loop/deadletter.h"

#include <criterion/criterion.h>
#include <stdlib.h>

static void expect_step(const ticket_t *t, int poison, int to_tier,
                        idem_deadletter_step_t want)
{
    idem_deadletter_step_t got = idem_deadletter_after(t, poison, to_tier);
    cr_expect_eq(got, want, "poison %d tier %d: %s, want %s", poison, to_tier,
                 idem_deadletter_step2str(got), idem_deadletter_step2str(want));
}

Test(deadletter, poison_record_failed_then_too_large_then_dead)
{
    /* Written: in flight until the report. */
    ticket_t *t = idem_deadletter_ticket_new();
    expect_step(t, 1, 0, IDEM_DL_PENDING);
    /* The broker was away: written again later, never committed past. */
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
    cr_expect_eq(t->state, -1);
    expect_step(t, 1, 0, IDEM_DL_FAILED);
    free(t);
    /* The DLQ refuses the value: written again without it. */
    t = idem_deadletter_ticket_new();
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    expect_step(t, 1, 0, IDEM_DL_DROP_VALUE);
    free(t);
    t = idem_deadletter_ticket_new();
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE);
    expect_step(t, 1, 0, IDEM_DL_DROP_VALUE);
    free(t);
    /* Acknowledged: the record's outcome is dlq. */
    t = idem_deadletter_ticket_new();
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR_NO_ERROR);
    cr_expect_eq(t->state, 1);
    expect_step(t, 1, 0, IDEM_DL_DEAD);
    /* A copy that went dead on its way to a retry tier is a dead letter. */
    expect_step(t, 1, 2, IDEM_DL_DEAD);
    free(t);
}

Test(deadletter, retry_copy_sent_failed_or_refused)
{
    ticket_t *t = idem_deadletter_ticket_new();
    expect_step(t, 0, 1, IDEM_DL_PENDING);
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR_NO_ERROR);
    expect_step(t, 0, 1, IDEM_DL_RETRY_SENT);
    free(t);
    t = idem_deadletter_ticket_new();
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR__TRANSPORT);
    expect_step(t, 0, 1, IDEM_DL_FAILED);
    free(t);
    /* Too large for the retry topic: dead instead of held forever. */
    t = idem_deadletter_ticket_new();
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    expect_step(t, 0, 1, IDEM_DL_RETRY_REFUSED);
    free(t);
}

Test(deadletter, ticket_of_a_dropped_record_is_freed_by_its_report)
{
    /* Reported first: the release frees it. */
    ticket_t *t = idem_deadletter_ticket_new();
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR_NO_ERROR);
    idem_deadletter_release(t);
    /* Dropped first (a rebalance took the partition): orphaned, and the
     * late report frees it (the leak check of the sanitizer build says
     * whether it did). */
    t = idem_deadletter_ticket_new();
    idem_deadletter_release(t);
    cr_expect(t->orphan);
    cr_expect_eq(t->state, 0);
    idem_deadletter_report(t, RD_KAFKA_RESP_ERR_NO_ERROR);
    idem_deadletter_release(NULL);
}
