/* test_explore (e2e): what an outside user and a hostile environment
 * found, each case a command as a user runs it against a real Redis and
 * the embedded broker. */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* check-config --connect said "connected" to a Redis whose
 * maxmemory-policy evicts, which `run` refuses: the check passed a
 * configuration the member then could not run with. */
Test(explore, check_config_connect_refuses_an_evicting_redis)
{
    const char *const policy[] = {"--maxmemory-policy", "allkeys-lru", NULL};
    th_redis_t r;
    cr_assert_eq(th_redis_start_args(&r, policy), 0);
    th_broker_t b;
    const char *const topics[] = {"--topic", "payments:1", NULL};
    cr_assert_eq(th_broker_start(&b, topics), 0);
    char bs[300], url[64];
    snprintf(bs, sizeof(bs), "kafka.bootstrap.servers=%s", b.bootstrap);
    snprintf(url, sizeof(url), "redis.url=redis://127.0.0.1:%d/0", r.port);
    const char *allow[] = {"redis.allow.eviction=false",
                           "redis.allow.eviction=true"};
    for (int i = 0; i < 2; i++) {
        char *argv[] = {(char *)th_bin(),
                        "check-config",
                        "--connect",
                        "--set",
                        bs,
                        "--set",
                        "group.id=g",
                        "--set",
                        "input.topics=payments",
                        "--set",
                        "dlq.topic=d",
                        "--set",
                        url,
                        "--set",
                        (char *)allow[i],
                        NULL};
        char *out = NULL, *err = NULL;
        int rc = th_run(argv, &out, &err, 60000);
        if (i == 0) {
            cr_expect_eq(rc, 1, "%s %s", out, err);
            cr_expect(strstr(err, "maxmemory-policy is allkeys-lru"), "%s",
                      err);
            cr_expect_null(strstr(out, "redis: connected"), "%s", out);
        } else {
            /* told to accept it, as `run` is */
            cr_expect_eq(rc, 0, "%s %s", out, err);
            cr_expect(strstr(out, "redis: connected"), "%s", out);
        }
        free(out);
        free(err);
    }
    th_broker_stop(&b);
    th_redis_stop(&r);
}
