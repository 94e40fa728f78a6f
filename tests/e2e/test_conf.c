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
