/* test_verify: `idemproc verify`'s errors: expectation files that are
 * missing or malformed (usage errors naming the file), and a Kafka that
 * does not answer (bounded, naming the bootstrap servers). */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

Test(verify, bad_expect_files_are_usage_errors)
{
    char *dir = th_tmpdir();
    struct {
        const char *name, *text, *want;
    } cases[] = {
        {"missing.json", NULL,
         "--expect %s/missing.json: cannot open: No such file or directory"},
        {"truncated.json", "{\"ledger\":\n", "--expect %s/truncated.json:2:"},
        {"array.json", "[1]\n", "needs a JSON object"},
        {"noledger.json", "{\"applied\":1}\n", "needs a \"ledger\" object"},
        {"noapplied.json", "{\"ledger\":{}}\n", "needs an integer \"applied\""},
        {"badbalance.json",
         "{\"ledger\":{\"EUR\":{\"u1\":\"12.50\"}},\"applied\":1}\n",
         "ledger EUR user \"u1\" must be an integer"},
        {"badpoison.json",
         "{\"ledger\":{},\"applied\":0,\"poison\":{\"not-json\":true}}\n",
         "poison reason \"not-json\" must be an integer"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[512], want[512];
        snprintf(path, sizeof(path), "%s/%s", dir, cases[i].name);
        if (cases[i].text)
            cr_assert_eq(th_write_file(path, cases[i].text), 0);
        snprintf(want, sizeof(want), cases[i].want, dir);
        char *argv[] = {(char *)th_bin(),
                        "verify",
                        "--set",
                        "kafka.bootstrap.servers=127.0.0.1:1",
                        "--set",
                        "group.id=g",
                        "--set",
                        "input.topics=t",
                        "--set",
                        "dlq.topic=d",
                        "--expect",
                        path,
                        NULL};
        char *out = NULL, *err = NULL;
        cr_expect_eq(th_run(argv, &out, &err, 20000), 2, "%s: %s",
                     cases[i].name, err);
        cr_expect(strstr(err, want), "%s: want \"%s\" in \"%s\"", cases[i].name,
                  want, err);
        cr_expect_eq(count_lines(err), 1, "%s: %s", cases[i].name, err);
        cr_expect_null(strstr(err, "line -1"), "%s", err);
        free(out);
        free(err);
    }
    th_rmrf(dir);
    free(dir);
}

Test(verify, unreachable_kafka_is_named_and_bounded)
{
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    char *dir = th_tmpdir();
    char expect[512], bs[96], url[96];
    snprintf(expect, sizeof(expect), "%s/x.json", dir);
    cr_assert_eq(th_write_file(expect, "{\"ledger\":{},\"applied\":0}\n"), 0);
    int port = th_free_port();
    snprintf(bs, sizeof(bs), "kafka.bootstrap.servers=127.0.0.1:%d", port);
    snprintf(url, sizeof(url), "redis.url=%s", r.url);
    char *argv[] = {(char *)th_bin(), "verify",      "--set", bs,
                    "--set",          "group.id=g",  "--set", "input.topics=t",
                    "--set",          "dlq.topic=d", "--set", url,
                    "--expect",       expect,        "--dlq", "--timeout-ms",
                    "1500",           NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &out, &err, 30000), 1, "%s%s", out, err);
    char want[128];
    snprintf(want, sizeof(want),
             "no Kafka broker reachable at 127.0.0.1:%d within 1500 ms", port);
    cr_expect(strstr(err, want), "%s", err);
    free(out);
    free(err);
    th_rmrf(dir);
    free(dir);
    th_redis_stop(&r);
}
