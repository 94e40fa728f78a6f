/* test_conf (e2e): `idemproc check-config` and the first run's messages as
 * a user sees them. */
#include "conf/conf.h"
#include "harness.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(conf, check_config_command_exit_codes)
{
    char *ok[] = {(char *)th_bin(),
                  "check-config",
                  "--set",
                  "kafka.bootstrap.servers=127.0.0.1:1",
                  "--set",
                  "group.id=g",
                  "--set",
                  "input.topics=t",
                  "--set",
                  "dlq.topic=d",
                  "--set",
                  "redis.password=hunter2",
                  NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(ok, &out, &err, 10000), 0, "%s", err);
    cr_expect(strstr(out, "group.id=g\n"), "%s", out);
    cr_expect_null(strstr(out, "hunter2"));
    free(out);
    free(err);
    char *bad[] = {(char *)th_bin(), "check-config", "--set", "group.idd=g",
                   NULL};
    cr_expect_eq(th_run(bad, &out, &err, 10000), 2);
    cr_expect(strstr(err, "did you mean \"group.id\""), "%s", err);
    cr_expect_eq(strchr(err, '\n'), err + strlen(err) - 1, "one line: %s", err);
    free(out);
    free(err);
}

/* Messages a first run meets: run without -c names the missing file, help
 * takes --help, help config does not call a defaulted key required, and
 * verify --help names the forward handler and --timeout-ms. */
Test(conf, first_run_messages)
{
    char *run[] = {(char *)th_bin(), "run", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(run, &out, &err, 10000), 2);
    cr_expect(strstr(err, "kafka.bootstrap.servers: required but not set (no "
                          "configuration file given: use -c FILE"),
              "%s", err);
    free(out);
    free(err);
    char *help[] = {(char *)th_bin(), "help", "--help", NULL};
    cr_expect_eq(th_run(help, &out, &err, 10000), 0, "%s", err);
    cr_expect(strstr(out, "usage: idemproc COMMAND"), "%s", out);
    free(out);
    free(err);
    char *cfg[] = {(char *)th_bin(), "help", "config", NULL};
    cr_expect_eq(th_run(cfg, &out, &err, 10000), 0, "%s", err);
    char *line = strstr(out, "  redis.url ");
    cr_assert(line, "%s", out);
    char *eol = strchr(line, '\n');
    *eol = '\0';
    cr_expect_null(strstr(line, "required"), "%s", line);
    free(out);
    free(err);
    char *vh[] = {(char *)th_bin(), "verify", "--help", NULL};
    cr_expect_eq(th_run(vh, &out, &err, 10000), 0, "%s", err);
    cr_expect(strstr(out, "handler=forward") && strstr(out, "--timeout-ms") &&
                  strstr(out, "--dlq"),
              "%s", out);
    free(out);
    free(err);
}

/* check-config --connect with nothing listening: exit 1 within the bound,
 * one line each for Kafka (naming the bootstrap servers) and Redis. */
Test(conf, check_config_connect_unreachable)
{
    char bs[64], url[64];
    snprintf(bs, sizeof(bs), "kafka.bootstrap.servers=127.0.0.1:%d",
             th_free_port());
    snprintf(url, sizeof(url), "redis.url=redis://127.0.0.1:%d/0",
             th_free_port());
    char *argv[] = {(char *)th_bin(),
                    "check-config",
                    "--connect",
                    "--timeout-ms",
                    "1000",
                    "--set",
                    bs,
                    "--set",
                    "group.id=g",
                    "--set",
                    "input.topics=t",
                    "--set",
                    "dlq.topic=d",
                    "--set",
                    url,
                    NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &out, &err, 30000), 1, "%s", err);
    char want[128];
    snprintf(want, sizeof(want),
             "no Kafka broker reachable at %s within 1000 ms",
             bs + strlen("kafka.bootstrap.servers="));
    cr_expect(strstr(err, want), "%s", err);
    cr_expect(strstr(err, "redis: connect: "), "%s", err);
    free(out);
    free(err);
}

/* check-config --connect against a real broker: an input topic that does
 * not exist is an error (the member would consume nothing), one that
 * exists passes. */
Test(conf, check_config_connect_missing_input_topic)
{
    th_redis_t r;
    th_broker_t b;
    cr_assert_eq(th_redis_start(&r), 0);
    const char *const topics[] = {"--topic", "payments:2", NULL};
    cr_assert_eq(th_broker_start(&b, topics), 0);
    char bs[300], url[64];
    snprintf(bs, sizeof(bs), "kafka.bootstrap.servers=%s", b.bootstrap);
    snprintf(url, sizeof(url), "redis.url=redis://127.0.0.1:%d/0", r.port);
    const char *inputs[] = {"input.topics=payments", "input.topics=nosuch"};
    for (int i = 0; i < 2; i++) {
        char *argv[] = {(char *)th_bin(),
                        "check-config",
                        "--connect",
                        "--set",
                        bs,
                        "--set",
                        "group.id=g",
                        "--set",
                        (char *)inputs[i],
                        "--set",
                        "dlq.topic=d",
                        "--set",
                        url,
                        NULL};
        char *out = NULL, *err = NULL;
        int rc = th_run(argv, &out, &err, 60000);
        if (i == 0) {
            cr_expect_eq(rc, 0, "%s %s", out, err);
            cr_expect(strstr(out, "input topic payments: 2 partitions"), "%s",
                      out);
        } else {
            cr_expect_eq(rc, 1, "%s %s", out, err);
            cr_expect(strstr(err, "input topic \"nosuch\" does not exist"),
                      "%s", err);
        }
        free(out);
        free(err);
    }
    th_broker_stop(&b);
    th_redis_stop(&r);
}

/* Help names every command, and a near miss gets a did-you-mean, for
 * commands and dlq's subcommands alike. */
Test(conf, unknown_commands_list_all_and_suggest)
{
    char *help[] = {(char *)th_bin(), "help", "nosuch", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(help, &out, &err, 10000), 2);
    const char *all[] = {"run", "produce", "broker",      "verify",
                         "dlq", "outbox",  "check-config"};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        cr_expect(strstr(err, all[i]), "%s missing: %s", all[i], err);
    free(out);
    free(err);
    char *dlq[] = {(char *)th_bin(), "dlq", "stat", NULL};
    cr_expect_eq(th_run(dlq, &out, &err, 10000), 2);
    cr_expect(strstr(err, "did you mean \"stats\"?"), "%s", err);
    free(out);
    free(err);
    char *cmd[] = {(char *)th_bin(), "chek-config", NULL};
    cr_expect_eq(th_run(cmd, &out, &err, 10000), 2);
    cr_expect(strstr(err, "did you mean \"check-config\"?"), "%s", err);
    free(out);
    free(err);
}
