/* test_groupconf (e2e): members of one group that apply different effects
 * notice each other through their heartbeats in Redis (redis/liveness.h):
 * a warning naming both and idemproc_group_config_mismatch, on both. */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(groupconf, .fini = th_stack_cleanup);

/* The value of the gauge on `port`'s /metrics, -1 when not served. */
static long mismatch_gauge(int port)
{
    char *body = NULL;
    long v = -1;
    if (th_http_get(port, "/metrics", &body) == 200) {
        const char *p = strstr(body, "\nidemproc_group_config_mismatch ");
        if (p)
            v = strtol(p + strlen("\nidemproc_group_config_mismatch "), NULL,
                       10);
    }
    free(body);
    return v;
}

static long wait_gauge(int port, long want, int timeout_ms)
{
    long v = -1;
    for (int waited = 0; waited < timeout_ms; waited += 100) {
        v = mismatch_gauge(port);
        if (v == want)
            break;
        usleep(100 * 1000);
    }
    return v;
}

/* How many members published settings in the group's hash. */
static long published(th_stack_t *s)
{
    const char *const args[] = {"HLEN", "idemproc:memberconf:test-group", NULL};
    char *out = th_redis_cli(&s->redis, args);
    long n = out ? strtol(out, NULL, 10) : -1;
    free(out);
    return n;
}

/* Starts m1 and m2 with their own sets and HTTP ports. */
static void start_two(th_stack_t *s, const char *h1, const char *h2,
                      int ports[2], pid_t pids[2])
{
    char listen[2][64];
    for (int i = 0; i < 2; i++) {
        ports[i] = th_free_port();
        snprintf(listen[i], sizeof(listen[i]), "http.listen=127.0.0.1:%d",
                 ports[i]);
    }
    const char *const s1[] = {listen[0], h1, NULL};
    const char *const s2[] = {
        listen[1], h2,
        strstr(h2, "forward") ? "output.topic=payments.out" : NULL, NULL};
    pids[0] = th_stack_member(s, "m1", s1);
    pids[1] = th_stack_member(s, "m2", s2);
}

Test(groupconf, different_handlers_warn_on_both_members, .timeout = 120)
{
    th_stack_t s;
    cr_assert_eq(th_stack_start(&s, 2, NULL), 0);
    int ports[2];
    pid_t pids[2];
    start_two(&s, "handler=ledger", "handler=forward", ports, pids);
    for (int i = 0; i < 2; i++)
        cr_expect_eq(wait_gauge(ports[i], 1, 60000), 1, "member m%d", i + 1);
    const char *warn = "another live member of the group applies a "
                       "different effect";
    cr_expect_geq(th_stack_log_count(&s, "m1", warn), 1);
    cr_expect_geq(th_stack_log_count(&s, "m2", warn), 1);
    char *log1 = th_stack_member_log(&s, "m1");
    cr_expect(strstr(log1, "\"other\":\"m2\""), "%s", log1);
    cr_expect(strstr(log1, "\"differing\":\"handler,"), "%s", log1);
    cr_expect(strstr(log1, "\"other_handler\":\"forward\""), "%s", log1);
    free(log1);
    char *log2 = th_stack_member_log(&s, "m2");
    cr_expect(strstr(log2, "\"other\":\"m1\""), "%s", log2);
    cr_expect(strstr(log2, "\"other_handler\":\"ledger\""), "%s", log2);
    free(log2);
    /* m2 leaves: m1's gauge goes back to 0 and it says so. */
    cr_expect_eq(th_stop(pids[1], 15000), 0);
    cr_expect_eq(wait_gauge(ports[0], 0, 30000), 0);
    cr_expect_eq(
        th_stack_log_count(
            &s, "m1", "the group's live members agree on the effect settings"),
        1);
    cr_expect_eq(th_stop(pids[0], 15000), 0);
    th_stack_stop(&s);
}

Test(groupconf, same_settings_do_not_warn, .timeout = 120)
{
    th_stack_t s;
    cr_assert_eq(th_stack_start(&s, 2, NULL), 0);
    int ports[2];
    pid_t pids[2];
    start_two(&s, "handler=ledger", "handler=ledger", ports, pids);
    long n = 0;
    for (int waited = 0; waited < 60000 && n != 2; waited += 100) {
        n = published(&s);
        usleep(100 * 1000);
    }
    cr_assert_eq(n, 2, "both members' settings in redis");
    /* Each member has read the other's at its next beat. */
    sleep(3);
    for (int i = 0; i < 2; i++)
        cr_expect_eq(wait_gauge(ports[i], 0, 30000), 0, "member m%d", i + 1);
    cr_expect_eq(th_stack_log_count(&s, "m1", "applies a different effect"), 0);
    cr_expect_eq(th_stack_log_count(&s, "m2", "applies a different effect"), 0);
    for (int i = 0; i < 2; i++)
        cr_expect_eq(th_stop(pids[i], 15000), 0);
    /* A member that stops removes its settings. */
    cr_expect_eq(published(&s), 0);
    th_stack_stop(&s);
}
