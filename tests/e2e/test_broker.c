/* test_broker (e2e): the embedded development Kafka, in-process and as the
 * `idemproc broker` command. */
#include "dev/broker.h"
#include "harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Partition count of `topic` as kcat (an independent client) sees it, or
 * -1. */
static int kcat_partitions(const char *bootstrap, const char *topic)
{
    char *argv[] = {"/usr/bin/kcat",   "-L", "-J",          "-b",
                    (char *)bootstrap, "-t", (char *)topic, NULL};
    char *out = NULL;
    int rc = th_run(argv, &out, NULL, 30000);
    int n = -1;
    json_t *doc = rc == 0 ? json_loads(out, 0, NULL) : NULL;
    json_t *t = json_array_get(json_object_get(doc, "topics"), 0);
    if (t && !json_object_get(t, "error"))
        n = (int)json_array_size(json_object_get(t, "partitions"));
    json_decref(doc);
    free(out);
    return n;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

Test(broker, library_creates_topics_in_process)
{
    char err[256];
    idem_broker_t *b = idem_broker_new(3, err, sizeof(err));
    cr_assert(b, "%s", err);
    const char *bs = idem_broker_bootstraps(b);
    cr_assert(!strncmp(bs, "127.0.0.1:", 10), "%s", bs);
    cr_assert_eq(idem_broker_topic_create(b, "lib", 5, err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(kcat_partitions(bs, "lib"), 5);
    idem_broker_destroy(b);
    idem_broker_destroy(NULL);
    cr_assert_null(idem_broker_new(0, err, sizeof(err)));
}

Test(broker, prints_bootstrap_first_and_exits_0_on_sigterm)
{
    th_broker_t b;
    const char *extra[] = {"--topic", "t:8", "--brokers", "2", NULL};
    cr_assert_eq(th_broker_start(&b, extra), 0);
    cr_assert(!strncmp(b.bootstrap, "127.0.0.1:", 10), "%s", b.bootstrap);
    cr_assert(strchr(b.bootstrap, ','), "two brokers: %s", b.bootstrap);
    cr_assert_eq(kcat_partitions(b.bootstrap, "t"), 8);
    int rc = th_stop(b.pid, 10000);
    b.pid = 0;
    th_broker_stop(&b);
    cr_assert_eq(rc, 0, "exit code on SIGTERM: %d", rc);
}

Test(broker, exits_0_on_sigint)
{
    th_broker_t b;
    cr_assert_eq(th_broker_start(&b, NULL), 0);
    kill(b.pid, SIGINT);
    int rc = th_wait(b.pid, 10000);
    if (rc == -1)
        th_stop(b.pid, 1000);
    b.pid = 0;
    th_broker_stop(&b);
    cr_assert_eq(rc, 0, "exit code on SIGINT: %d", rc);
}

Test(broker, auto_created_topics_have_4_partitions)
{
    th_broker_t b;
    cr_assert_eq(th_broker_start(&b, NULL), 0);
    /* kcat -L on an unknown topic makes the mock auto-create it. */
    int n = kcat_partitions(b.bootstrap, "auto");
    th_broker_stop(&b);
    cr_assert_eq(n, 4);
}

Test(broker, bad_flags_exit_2_with_one_line)
{
    const char *cases[][3] = {
        {"--nope", NULL, "--nope"},      {"--brokers", "0", "--brokers"},
        {"--brokers", "x", "--brokers"}, {"--topic", "t", "--topic"},
        {"--topic", "t:0", "--topic"},   {"--topic", NULL, "--topic"},
        {"stray", NULL, "stray"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *argv[] = {(char *)th_bin(), "broker", (char *)cases[i][0],
                        (char *)cases[i][1], NULL};
        char *out = NULL, *err = NULL;
        int rc = th_run(argv, &out, &err, 10000);
        cr_expect_eq(rc, 2, "%s: rc %d", cases[i][0], rc);
        cr_expect_eq(count_lines(err), 1, "%s: stderr \"%s\"", cases[i][0],
                     err);
        cr_expect(strstr(err, cases[i][2]), "%s: stderr \"%s\"", cases[i][0],
                  err);
        cr_expect_str_empty(out);
        free(out);
        free(err);
    }
}

Test(broker, help_states_the_mock_limits)
{
    char *argv[] = {(char *)th_bin(), "broker", "--help", NULL};
    char *out = NULL;
    cr_assert_eq(th_run(argv, &out, NULL, 10000), 0);
    cr_expect(strstr(out, "in memory only"), "%s", out);
    cr_expect(strstr(out, "random ports"));
    cr_expect(strstr(out, "5 MiB per partition"));
    cr_expect(strstr(out, "fetch.wait.max.ms"));
    free(out);
}

/* The mock cluster drops a partition's oldest records past ~5 MiB without
 * a word: `idemproc broker` warns on stderr, and `verify --dlq` notes a DLQ
 * partition that no longer starts at offset 0. */
Test(broker, dropped_records_are_reported, .fini = th_stack_cleanup)
{
    th_stack_t s;
    cr_assert_eq(th_stack_start(&s, 1, NULL), 0);
    /* 80 poison records, 16 of them 1 MiB, written straight into the
     * 2-partition DLQ topic: about 8 MiB per partition. */
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    s.broker.bootstrap,
                    "-t",
                    "payments.dlq",
                    "--count",
                    "80",
                    "--poison",
                    "1",
                    NULL};
    char *err = NULL;
    cr_assert_eq(th_run(argv, NULL, &err, 60000), 0, "%s", err);
    free(err);
    char errp[512];
    snprintf(errp, sizeof(errp), "%s/err", s.broker.dir);
    char *berr = NULL;
    for (int i = 0; i < 300; i++) {
        free(berr);
        berr = th_slurp(errp, NULL);
        if (berr && strstr(berr, "dropped its"))
            break;
        usleep(100000);
    }
    cr_expect(berr &&
                  strstr(berr, "idemproc broker: warning: payments.dlq [") &&
                  strstr(berr, "oldest records (earliest offset now ") &&
                  strstr(berr, "--topic payments.dlq:N"),
              "%s", berr ? berr : "(no stderr)");
    free(berr);

    /* These records carry no dlq.* headers, so every count is 0 as
     * expected; the note is what matters. */
    cr_assert_eq(th_write_file(s.expect, "{\"ledger\":{},\"applied\":0}\n"), 0);
    char *out = NULL;
    int rc = th_stack_verify(&s, 1, NULL, &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(out && strstr(out, "verify: note: payments.dlq [") &&
                  strstr(out, "no longer has its"),
              "%s", out ? out : "");
    free(out);
    th_stack_stop(&s);
}
