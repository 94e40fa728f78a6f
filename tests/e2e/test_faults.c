/* test_faults (e2e): `broker --faults` applies a fault to the running
 * cluster on time. */
#include "dev/faults.h"
#include "harness.h"
#include "base/util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

Test(faults, bad_schedule_file_is_a_usage_error)
{
    char *dir = th_tmpdir();
    char path[512];
    snprintf(path, sizeof(path), "%s/faults", dir);
    cr_assert_eq(th_write_file(path, "+1s broker 1 down\n+2s broker 9 up\n"),
                 0);
    char *argv[] = {(char *)th_bin(), "broker", "--faults", path, NULL};
    char *err = NULL;
    int rc = th_run(argv, NULL, &err, 30000);
    cr_expect_eq(rc, 2, "rc %d", rc);
    char want[600];
    snprintf(want, sizeof(want), "%s:2: broker 9", path);
    cr_expect(strstr(err, want), "%s", err);
    free(err);
    char *argv2[] = {(char *)th_bin(), "broker", "--faults", "/nonexistent/f",
                     NULL};
    rc = th_run(argv2, NULL, &err, 30000);
    cr_expect_eq(rc, 2, "rc %d", rc);
    cr_expect(strstr(err, "/nonexistent/f: No such file"), "%s", err);
    free(err);
    th_rmrf(dir);
    free(dir);
}

/* A broker that is down from the start makes a produce wait; the schedule
 * brings it up after 4 s and the produce then finishes, all acknowledged. */
Test(faults, broker_down_makes_produce_wait_until_up, .timeout = 120)
{
    char *dir = th_tmpdir();
    char path[512];
    snprintf(path, sizeof(path), "%s/faults", dir);
    cr_assert_eq(th_write_file(path, "+0ms broker 1 down\n+4s broker 1 up\n"),
                 0);
    th_broker_t b;
    const char *extra[] = {"--topic", "pay:2", "--faults", path, NULL};
    cr_assert_eq(th_broker_start(&b, extra), 0);
    int64_t t0 = idem_now_ms();
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    b.bootstrap,
                    "-t",
                    "pay",
                    "--count",
                    "20",
                    "-X",
                    "message.timeout.ms=60000",
                    "-X",
                    "reconnect.backoff.max.ms=200",
                    NULL};
    char *err = NULL;
    int rc = th_run(argv, NULL, &err, 90000);
    int64_t took = idem_now_ms() - t0;
    cr_expect_eq(rc, 0, "rc %d: %s", rc, err);
    cr_expect(strstr(err, "acked 20, failed 0"), "%s", err);
    /* The broker went up 4 s after it printed its address, give or take
     * the moment it started its clock. */
    cr_expect_geq(took, 3500, "produce finished after %lld ms",
                  (long long)took);
    free(err);
    char ep[512];
    snprintf(ep, sizeof(ep), "%s/err", b.dir);
    char *log = th_slurp(ep, NULL);
    cr_expect(log && strstr(log, "fault +0ms broker 1 down"), "%s", log);
    cr_expect(log && strstr(log, "ms broker 1 up"), "%s", log);
    cr_expect(log && strstr(log, "fault schedule done (2)"), "%s", log);
    free(log);
    th_broker_stop(&b);
    th_rmrf(dir);
    free(dir);
}

/* The broker's check for dropped records never holds up the fault
 * schedule: with a broker down, a watermark request per partition used to
 * wait its full timeout each, and "broker 1 up" came minutes late. */
Test(faults, schedule_on_time_while_a_broker_is_down, .timeout = 120)
{
    char *dir = th_tmpdir();
    char path[512];
    snprintf(path, sizeof(path), "%s/faults", dir);
    cr_assert_eq(th_write_file(path, "+0ms broker 1 down\n+5s broker 1 up\n"),
                 0);
    th_broker_t b;
    const char *extra[] = {"--brokers", "3",  "--topic", "t:32",
                           "--faults",  path, NULL};
    cr_assert_eq(th_broker_start(&b, extra), 0);
    char ep[512];
    snprintf(ep, sizeof(ep), "%s/err", b.dir);
    char *log = NULL;
    for (int t = 0; t < 300; t++) { /* 30 s */
        free(log);
        log = th_slurp(ep, NULL);
        if (log && strstr(log, "ms broker 1 up"))
            break;
        usleep(100000);
    }
    cr_assert(log && strstr(log, "ms broker 1 up"), "%s", log);
    /* "fault +NNNNms broker 1 up": applied at its time, not before, and
     * not wildly late (the bound is loose: a sanitizer build on a loaded
     * machine runs the schedule's thread late by seconds) */
    const char *at = strstr(log, "ms broker 1 up");
    const char *plus = at;
    while (plus > log && plus[-1] != '+')
        plus--;
    long ms = strtol(plus, NULL, 10);
    cr_expect(ms >= 5000 && ms < 15000, "broker 1 up applied at +%ld ms", ms);
    free(log);
    th_broker_stop(&b);
    th_rmrf(dir);
    free(dir);
}
