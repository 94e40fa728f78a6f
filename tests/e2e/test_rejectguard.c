/* test_rejectguard (e2e): an effect that rejects every record stops after
 * handler.max.consecutive.rejects in a row: the member pauses and turns
 * not ready instead of dead-lettering the whole topic. */
#include "harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_stack_t stk;
static char *dir;

static void fini(void)
{
    th_stack_cleanup();
    if (dir)
        th_rmrf(dir);
    free(dir);
    dir = NULL;
}

TestSuite(rejectguard, .fini = fini);

static long rejected_dead_letters(void)
{
    th_recs_t dlq = th_topic_read(stk.broker.bootstrap, "payments.dlq");
    long n = 0;
    for (size_t i = 0; i < dlq.n; i++) {
        const char *reason =
            json_string_value(json_object_get(dlq.v[i].headers, "dlq.reason"));
        n += reason && !strcmp(reason, "handler-rejected");
    }
    th_recs_free(&dlq);
    return n;
}

Test(rejectguard, a_broken_effect_pauses_after_n_rejects_in_a_row,
     .timeout = 120)
{
    char file[600], listen[64];
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&dir, "broken.lua",
                        "function effect(rec)\n"
                        "  return false, 'field missing: ' .. rec.topic\n"
                        "end\n"));
    int hport = th_free_port();
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", hport);
    const char *props[] = {"handler=script",
                           file,
                           "handler.max.consecutive.rejects=5",
                           listen,
                           "progress.interval.ms=100",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, 1, props), 0);
    const char *traffic[] = {"--count", "40", "--seed", "27", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);

    char *body = NULL;
    int status = th_wait_unready(hport, "in a row", 60000, &body);
    cr_expect_eq(status, 503);
    cr_expect(body &&
                  strstr(body, "handler rejected 5 records in a row "
                               "(handler.max.consecutive.rejects)") &&
                  strstr(body, "last: field missing: payments"),
              "reason: %s", body);
    free(body);
    long rej = 0;
    for (int t = 0; t < 300 && (rej = rejected_dead_letters()) < 4; t++)
        usleep(100000);
    /* The progress line says how many partitions the member holds (lag 0
     * of a member with none is no news), as a JSON number. */
    char *log = NULL;
    for (int t = 0; t < 300; t++) {
        free(log);
        log = th_stack_member_log(&stk, "m1");
        if (log && strstr(log, "\"msg\":\"progress\"") &&
            strstr(log, "\"assigned\":1,"))
            break;
        usleep(100000);
    }
    cr_expect(log && strstr(log, "\"assigned\":1,"), "%s", log);
    free(log);
    /* Stopped cleanly (what was dead-lettered is acknowledged): four dead
     * letters, the fifth and the other 35 records held back. */
    cr_expect_eq(th_stop(m, 15000), 0);
    cr_expect_eq(rejected_dead_letters(), 4);
    log = th_stack_member_log(&stk, "m1");
    cr_expect(log && strstr(log, "records in a row"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}
