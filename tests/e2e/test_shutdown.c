/* test_shutdown: the abandoned close of shutdown (loop/pipeline.c,
 * close_consumer): everything applied is committed, then the broker
 * freezes (SIGSTOP) and the member is stopped; leaving the group cannot
 * finish, so the close is abandoned at the deadline, the member logs it
 * and exits 0 inside shutdown.timeout.ms (before the watchdog's exit 1),
 * and once the broker is back nothing applied is lost or applied again. */
#include "harness.h"
#include "base/util.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs it. */
static th_stack_t stk;

static void shutdown_fini(void)
{
    if (stk.broker.pid > 0)
        kill(stk.broker.pid, SIGCONT);
    th_stack_cleanup();
}

TestSuite(shutdown, .fini = shutdown_fini);

#define ABANDONED "leaving the group did not finish within shutdown.timeout.ms"

/* 0 once member `name`'s log holds text, -1 after timeout_ms. */
static int wait_log(const char *name, const char *text, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 100) {
        char *log = th_stack_member_log(&stk, name);
        int found = strstr(log, text) != NULL;
        free(log);
        if (found)
            return 0;
        usleep(100000);
    }
    return -1;
}

Test(shutdown, a_close_the_frozen_broker_never_ends_is_abandoned_exit_0,
     .timeout = 180)
{
    const char *props[] = {"shutdown.timeout.ms=4000", NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    const char *traffic[] = {"--count", "400", "--seed", "11", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    /* A close that needs nothing from the broker at that instant (the
     * group between two states) ends at once and proves nothing: such a
     * try is repeated with a new member. */
    static const char *names[] = {"m1", "m2", "m3"};
    int abandoned = 0;
    for (int i = 0; i < 3 && !abandoned; i++) {
        pid_t m = th_stack_member(&stk, names[i], NULL);
        cr_assert_eq(wait_log(names[i], "partitions assigned", 30000), 0);
        th_stack_wait_committed(&stk, "payments", 2, 60000);
        usleep(500 * 1000); /* the commit's reply read: nothing left */
        cr_assert_eq(kill(stk.broker.pid, SIGSTOP), 0);
        int64_t t0 = idem_now_ms();
        kill(m, SIGTERM);
        int rc = th_wait(m, 15000);
        int64_t took = idem_now_ms() - t0;
        cr_assert_eq(kill(stk.broker.pid, SIGCONT), 0);
        char *log = th_stack_member_log(&stk, names[i]);
        abandoned = strstr(log, ABANDONED) != NULL;
        cr_expect_eq(rc, 0, "%s: exit %d after %lld ms:\n%s", names[i], rc,
                     (long long)took, log);
        cr_expect(!strstr(log, "shutdown.timeout.ms exceeded"),
                  "%s: the watchdog ended it:\n%s", names[i], log);
        if (abandoned)
            cr_expect_lt(took, 4000, "%s: took %lld ms", names[i],
                         (long long)took);
        else
            cr_log_warn("%s: the close finished against a frozen broker; "
                        "again",
                        names[i]);
        free(log);
    }
    cr_assert(abandoned, "no close was abandoned in three tries: the test "
                         "proves nothing");
    /* Nothing applied lost, nothing applied twice: a new member finds
     * every record's effect once. */
    pid_t last = th_stack_member(&stk, "m4", NULL);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    cr_expect_eq(th_stack_applied(&stk), th_stack_expect_unique(&stk));
    cr_expect_eq(th_stack_stop_member(&stk, "m4", last, 15000), 0);
    th_stack_stop(&stk);
}
