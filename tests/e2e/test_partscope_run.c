/* test_partscope_run: the pipeline under dedup.scope=partition (handler
 * ledger) ends exact by `verify`: duplicates, poison records, a member
 * SIGKILLed mid-stream and another started in its place, then a second
 * member joining (its partitions' tables loaded from Redis). */
#include "harness.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs it. */
static th_stack_t stk;

TestSuite(partscope_run, .fini = th_stack_cleanup);

/* Keys of the partition layout in Redis (chunks, index, epoch). */
static long partscope_keys(void)
{
    const char *args[] = {"EVAL", "return #redis.call('KEYS', ARGV[1])", "0",
                          "idemproc:st{test-group:payments:*", NULL};
    char *out = th_redis_cli(&stk.redis, args);
    long v = out ? atol(out) : 0;
    free(out);
    return v;
}

static long expect_unique(void)
{
    return th_stack_expect_unique(&stk);
}

Test(partscope_run, sigkill_restart_and_join_end_exact, .timeout = 300)
{
    const char *props[] = {"dedup.scope=partition", "handler=ledger",
                           "batch.max.messages=50", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *traffic[] = {
        "--count",           "20000", "--duplicates", "0.1", "--poison", "0.01",
        "--too-large-bytes", "5000",  "--seed",       "24",  NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = expect_unique();
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(th_stack_wait_applied(&stk, unique / 4, 90000), 0,
                 "m1 never got going:\n%s", th_stack_member_log(&stk, "m1"));
    kill(m, SIGKILL);
    cr_expect_eq(th_wait(m, 5000), 128 + SIGKILL);
    cr_assert_lt(th_stack_applied(&stk), unique, "killed too late");
    /* The partition layout was written, not only global marks. */
    cr_assert_gt(partscope_keys(), 0);
    pid_t m2 = th_stack_member(&stk, "m2", NULL);
    cr_assert_eq(th_stack_wait_applied(&stk, unique / 2, 90000), 0,
                 "m2 never got going:\n%s", th_stack_member_log(&stk, "m2"));
    /* A second member joins: partitions move, their tables are loaded by
     * the new owner after its epoch bump. */
    pid_t m3 = th_stack_member(&stk, "m3", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 180000);
    cr_expect_eq(th_stack_applied(&stk), unique);
    cr_expect_eq(th_stop(m2, 15000), 0);
    cr_expect_eq(th_stop(m3, 15000), 0);
    th_stack_stop(&stk);
}
