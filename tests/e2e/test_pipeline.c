/* test_pipeline: the processor end to end, with a real redis-server and the
 * embedded broker: exact ledger, every poison reason in the DLQ, restarts,
 * members joining and leaving, SIGKILL, a Redis outage, leases, forward. */
#include "harness.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

/* At file scope, not on a test's stack: a failed assertion leaves the test
 * function, and the suite's .fini still needs the stack (one test runs per
 * process, so each test has its own). */
static th_stack_t stk;

TestSuite(pipeline, .fini = th_stack_cleanup);
TestSuite(forward, .fini = th_stack_cleanup);

/* One record read back from a topic by an independent consumer. */

static const char *hdr(const th_rec_t *r, const char *name)
{
    return json_string_value(json_object_get(r->headers, name));
}

static long expect_count(th_stack_t *s, const char *path1, const char *path2)
{
    json_t *e = json_load_file(s->expect, 0, NULL);
    cr_assert(e);
    json_t *v = json_object_get(e, path1);
    if (path2)
        v = json_object_get(v, path2);
    long n = (long)json_integer_value(v);
    json_decref(e);
    return n;
}

static char *member_log(th_stack_t *s, const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.log", s->dir, name);
    char *log = th_slurp(path, NULL);
    return log ? log : strdup("");
}

/* Waits until the redis applied counter reaches at least n. */
static int wait_applied(th_stack_t *s, long n, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 100) {
        if (th_stack_applied(s) >= n)
            return 0;
        usleep(100000);
    }
    return -1;
}

static const char *const traffic[] = {"--count",
                                      "6000",
                                      "--duplicates",
                                      "0.1",
                                      "--poison",
                                      "0.02",
                                      "--too-large-bytes",
                                      "5000",
                                      "--seed",
                                      "11",
                                      "--users",
                                      "50",
                                      "--currencies",
                                      "EUR,USD,TRY",
                                      NULL};

Test(pipeline, exact_ledger_and_every_poison_reason_in_dlq, .timeout = 120)
{
    /* Large batches so duplicates, including adjacent ones, share a batch. */
    const char *props[] = {"batch.max.messages=5000", "batch.max.wait.ms=200",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 60000);
    cr_expect_eq(th_stop(m, 15000), 0, "SIGTERM must exit 0");

    /* Every dead letter: original key and bytes, original headers, and the
     * dlq.* headers, matching the record at its original position. */
    th_recs_t in = th_topic_read(stk.broker.bootstrap, "payments");
    th_recs_t dlq = th_topic_read(stk.broker.bootstrap, "payments.dlq");
    long poison = 0;
    const char *all[] = {"too-large", "not-json", "not-object", "no-identity",
                         "invalid-field"};
    for (int r = 0; r < 5; r++)
        poison += expect_count(&stk, "poison", all[r]);
    cr_expect_geq((long)dlq.n, poison, "the DLQ lacks records");
    int reasons[16] = {0};
    const char *names[] = {"too-large", "not-json", "not-object", "no-identity",
                           "invalid-field"};
    for (size_t i = 0; i < dlq.n; i++) {
        th_rec_t *d = &dlq.v[i];
        const char *must[] = {"dlq.reason",          "dlq.error",
                              "dlq.original.topic",  "dlq.original.partition",
                              "dlq.original.offset", "dlq.original.timestamp",
                              "dlq.group",           "dlq.attempts",
                              "dlq.failed.at"};
        for (size_t h = 0; h < sizeof(must) / sizeof(must[0]); h++)
            cr_assert(hdr(d, must[h]) && *hdr(d, must[h]),
                      "dlq record %zu lacks %s", i, must[h]);
        cr_expect_str_eq(hdr(d, "dlq.original.topic"), "payments");
        cr_expect_str_eq(hdr(d, "dlq.group"), "test-group");
        cr_expect_eq(strlen(hdr(d, "dlq.failed.at")), 24,
                     "RFC 3339 with ms: %s", hdr(d, "dlq.failed.at"));
        int32_t p = atoi(hdr(d, "dlq.original.partition"));
        int64_t o = atoll(hdr(d, "dlq.original.offset"));
        th_rec_t *orig = NULL;
        for (size_t j = 0; j < in.n && !orig; j++)
            if (in.v[j].partition == p && in.v[j].offset == o)
                orig = &in.v[j];
        cr_assert(orig, "no original at %d/%lld", p, (long long)o);
        cr_expect(d->len == orig->len && !memcmp(d->value, orig->value, d->len),
                  "dlq value differs from the original bytes");
        cr_expect(d->key_len == orig->key_len &&
                      !memcmp(d->key, orig->key, d->key_len),
                  "dlq key differs from the original");
        const char *name;
        json_t *v;
        json_object_foreach(orig->headers, name, v)
        {
            cr_expect_str_eq(hdr(d, name), json_string_value(v),
                             "original header %s not kept", name);
        }
        for (int r = 0; r < 5; r++)
            if (!strcmp(hdr(d, "dlq.reason"), names[r]))
                reasons[r]++;
        if (!strcmp(hdr(d, "dlq.reason"), "invalid-field"))
            cr_expect(strchr(hdr(d, "dlq.error"), ':'),
                      "invalid-field error names the field: %s",
                      hdr(d, "dlq.error"));
    }
    for (int r = 0; r < 5; r++)
        cr_expect_eq(reasons[r], expect_count(&stk, "poison", names[r]),
                     "reason %s", names[r]);
    th_recs_free(&in);
    th_recs_free(&dlq);
    th_stack_stop(&stk);
}

Test(pipeline, restart_continues_from_committed_offsets, .timeout = 180)
{
    const char *props[] = {"http.listen=127.0.0.1:0", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *big[] = {
        "--count",           "40000", "--duplicates", "0.1", "--poison", "0.01",
        "--too-large-bytes", "5000",  "--seed",       "12",  NULL};
    cr_assert_eq(th_stack_produce(&stk, big), 0);
    long unique = expect_count(&stk, "unique", NULL);
    /* Small batches so the stop lands mid-stream. */
    const char *slow[] = {"batch.max.messages=50", NULL};
    pid_t m = th_stack_member(&stk, "m1", slow);
    cr_assert_eq(wait_applied(&stk, unique / 5, 60000), 0);
    cr_assert_eq(th_stack_stop_member(&stk, "m1", m, 15000), 0,
                 "SIGTERM must exit 0");
    long before = th_stack_applied(&stk);
    cr_expect_lt(before, unique, "stopped too late to test a restart");

    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *sets[] = {listen, NULL};
    m = th_stack_member(&stk, "m2", sets);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 90000);
    /* The restarted member began at the committed offsets: it saw no
     * record the first one had finished and committed, so it processed
     * and skipped far fewer records than were sent. */
    char *body = NULL;
    cr_assert_eq(th_http_get(port, "/metrics", &body), 200);
    double seen =
        th_metric(body, "idemproc_records_total{outcome=\"processed\"}") +
        th_metric(body, "idemproc_records_total{outcome=\"duplicate\"}") +
        th_metric(body, "idemproc_records_total{outcome=\"dlq\"}");
    long sent = expect_count(&stk, "sent", NULL);
    cr_expect_lt(seen, (double)sent - (double)before * 0.9,
                 "restart re-read from the beginning (%f of %ld)", seen, sent);
    free(body);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

typedef struct {
    char name[32];
} strategy_t;

/* A second member joins mid-stream and later leaves, with eager and with
 * cooperative-sticky assignment. */
ParameterizedTestParameters(pipeline, member_joins_and_leaves)
{
    /* Values, not pointers: the test runs in another process image. */
    static strategy_t strategies[] = {{"range"}, {"cooperative-sticky"}};
    return cr_make_param_array(strategy_t, strategies, 2);
}

ParameterizedTest(strategy_t *strategy, pipeline, member_joins_and_leaves,
                  .timeout = 180)
{
    char strat[128];
    snprintf(strat, sizeof(strat), "kafka.partition.assignment.strategy=%s",
             strategy->name);
    const char *props[] = {strat, "batch.max.messages=100", NULL};
    cr_assert_eq(th_stack_start(&stk, 8, props), 0);
    const char *big[] = {
        "--count",           "40000", "--duplicates", "0.1", "--poison", "0.01",
        "--too-large-bytes", "5000",  "--seed",       "13",  NULL};
    cr_assert_eq(th_stack_produce(&stk, big), 0);
    long unique = expect_count(&stk, "unique", NULL);
    pid_t a = th_stack_member(&stk, "a", NULL);
    cr_assert_eq(wait_applied(&stk, unique / 10, 60000), 0);
    pid_t b = th_stack_member(&stk, "b", NULL);
    /* Wait until b has partitions and works, then let it leave. */
    int assigned = 0;
    for (int t = 0; t < 600 && !assigned; t++) { /* 60 s: slow under ASan */
        char *log = member_log(&stk, "b");
        assigned = strstr(log, "partitions assigned") != NULL;
        free(log);
        usleep(100000);
    }
    cr_expect(assigned, "member b never got partitions");
    usleep(500000);
    cr_expect_eq(th_stop(b, 15000), 0, "b must leave cleanly");
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    cr_expect_eq(th_stop(a, 15000), 0);
    char *log = member_log(&stk, "a");
    /* a started alone with every partition; b's arrival and departure
     * must have taken some away and given them back. */
    int assigns = 0;
    for (char *q = log; (q = strstr(q, "partitions assigned")); q++)
        assigns++;
    cr_expect(strstr(log, "partitions revoked") || assigns >= 2,
              "a saw no rebalance:\n%s", log);
    free(log);
    th_stack_stop(&stk);
}

Test(pipeline, sigkill_mid_stream_then_restart, .timeout = 180)
{
    const char *props[] = {"batch.max.messages=50", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *big[] = {
        "--count",           "30000", "--duplicates", "0.1", "--poison", "0.01",
        "--too-large-bytes", "5000",  "--seed",       "14",  NULL};
    cr_assert_eq(th_stack_produce(&stk, big), 0);
    long unique = expect_count(&stk, "unique", NULL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(wait_applied(&stk, unique / 4, 60000), 0);
    kill(m, SIGKILL);
    cr_expect_eq(th_wait(m, 5000), 128 + SIGKILL);
    cr_expect_lt(th_stack_applied(&stk), unique);
    m = th_stack_member(&stk, "m2", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

Test(pipeline, redis_outage_pauses_and_resumes_without_dead_letters,
     .timeout = 180)
{
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *props[] = {listen, "batch.max.messages=50",
                           "redis.timeout.ms=500", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *big[] = {
        "--count",           "30000", "--duplicates", "0.1", "--poison", "0.01",
        "--too-large-bytes", "5000",  "--seed",       "15",  NULL};
    cr_assert_eq(th_stack_produce(&stk, big), 0);
    long unique = expect_count(&stk, "unique", NULL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    /* Starting: alive but not ready until it is in the group. */
    int status = -1;
    char *body = NULL;
    for (int t = 0; t < 100 && status < 0; t++) {
        status = th_http_get(port, "/readyz", &body);
        usleep(20000);
    }
    cr_expect_eq(status, 503, "a member that has not joined is not ready");
    cr_expect(body && (strstr(body, "joining") || strstr(body, "starting")),
              "reason: %s", body);
    free(body);
    body = NULL;
    cr_expect_eq(th_http_get(port, "/healthz", NULL), 200);
    cr_assert_eq(wait_applied(&stk, unique / 5, 60000), 0);
    cr_assert_eq(th_http_get(port, "/readyz", NULL), 200);

    cr_assert_eq(th_redis_kill(&stk.redis), 0);
    /* Not ready, with the reason, while Redis is gone; still alive. */
    status = 0;
    for (int t = 0; t < 100 && status != 503; t++) {
        free(body);
        status = th_http_get(port, "/readyz", &body);
        usleep(100000);
    }
    cr_expect_eq(status, 503);
    cr_expect(body && strstr(body, "redis"), "reason: %s", body);
    free(body);
    cr_expect_eq(th_http_get(port, "/healthz", NULL), 200);
    sleep(3);
    cr_expect_eq(th_http_get(port, "/healthz", NULL), 200,
                 "a paused loop is still alive");
    cr_assert_eq(th_redis_restart(&stk.redis), 0);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    status = 0;
    for (int t = 0; t < 100 && status != 200; t++) {
        status = th_http_get(port, "/readyz", NULL);
        usleep(100000);
    }
    cr_expect_eq(status, 200, "ready again after Redis came back");
    cr_expect_eq(th_http_get(port, "/metrics", &body), 200);
    cr_expect_gt(
        th_metric(body, "idemproc_redis_errors_total{class=\"connection\"}"),
        0);
    free(body);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Waits until GET /<path> on port answers `want`. */
static int wait_status(int port, const char *path, int want, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 100) {
        if (th_http_get(port, path, NULL) == want)
            return 0;
        usleep(100000);
    }
    return -1;
}

/* Waits until the member on port reports `want` for the metric `name`;
 * the last value read goes to *last (may be NULL). */
static int wait_gauge(int port, const char *name, double want, int timeout_ms,
                      double *last)
{
    for (int t = 0; t < timeout_ms; t += 100) {
        char *body = NULL;
        double v = -2;
        if (th_http_get(port, "/metrics", &body) == 200)
            v = th_metric(body, name);
        free(body);
        if (last)
            *last = v;
        if (v == want)
            return 0;
        usleep(100000);
    }
    return -1;
}

/* Waits until the member on port reports `want` assigned partitions. */
static int wait_assigned(int port, double want, int timeout_ms)
{
    return wait_gauge(port, "idemproc_assigned_partitions", want, timeout_ms,
                      NULL);
}

/* librdkafka keeps a partition's application pause across unassign and
 * assign. A member paused for a Redis outage that loses its partitions in
 * a rebalance and gets some of them back must fetch them again once Redis
 * is back (found by the chaos test: partitions stayed paused for good
 * while the member said ready). */
Test(pipeline, partitions_paused_before_a_rebalance_resume_after_it,
     .timeout = 180)
{
    int pa = th_free_port(), pb = th_free_port();
    char la[64], lb[64];
    snprintf(la, sizeof(la), "http.listen=127.0.0.1:%d", pa);
    snprintf(lb, sizeof(lb), "http.listen=127.0.0.1:%d", pb);
    const char *props[] = {"redis.timeout.ms=500", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *sa[] = {la, NULL}, *sb[] = {lb, NULL};
    pid_t a = th_stack_member(&stk, "a", sa);
    cr_assert_eq(wait_assigned(pa, 4, 60000), 0, "a got all partitions");
    cr_assert_eq(wait_status(pa, "/readyz", 200, 30000), 0);

    /* Redis goes away while a is idle: a pauses its partitions. */
    cr_assert_eq(th_redis_kill(&stk.redis), 0);
    cr_assert_eq(wait_status(pa, "/readyz", 503, 30000), 0);
    /* The loop says not ready, then pauses and sets the gauge: a scrape
     * between the two saw 0 paused partitions. */
    double paused = -2;
    cr_expect_eq(
        wait_gauge(pa, "idemproc_paused_partitions", 4, 30000, &paused), 0,
        "paused partitions: %g", paused);

    /* b joins: a gives up all four (eager) and gets two of them back. */
    pid_t b = th_stack_member(&stk, "b", sb);
    cr_assert_eq(wait_assigned(pa, 2, 60000), 0);
    cr_assert_eq(wait_assigned(pb, 2, 60000), 0);
    cr_assert_eq(th_redis_restart(&stk.redis), 0);
    cr_assert_eq(wait_status(pa, "/readyz", 200, 30000), 0);
    cr_assert_eq(wait_status(pb, "/readyz", 200, 30000), 0);

    const char *small[] = {"--count", "2000", "--seed", "21", NULL};
    cr_assert_eq(th_stack_produce(&stk, small), 0);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    cr_expect_eq(th_stop(a, 15000), 0);
    cr_expect_eq(th_stop(b, 15000), 0);
    th_stack_stop(&stk);
}

/* Counters on /metrics agree exactly with what produce --expect says. */
Test(pipeline, metrics_match_the_traffic_exactly, .timeout = 120)
{
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    /* Secrets that must never reach a log line or /metrics, even with
     * every debug context of librdkafka on. */
    const char *props[] = {listen,
                           "log.level=debug",
                           "kafka.debug=all",
                           "kafka.sasl.username=svc",
                           "kafka.sasl.password=hunter2-kafka",
                           "redis.password=hunter2-redis",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    /* Redis must then ask for that password. */
    const char *auth[] = {"CONFIG", "SET", "requirepass", "hunter2-redis",
                          NULL};
    free(th_redis_cli(&stk.redis, auth));
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 60000);
    /* The ledger is exact once Redis ran the last script; the member
     * counts those records when it reads the reply, a moment later. */
    char *body = NULL;
    double unique = (double)expect_count(&stk, "unique", NULL);
    for (int t = 0; t < 100; t++) {
        free(body);
        body = NULL;
        cr_assert_eq(th_http_get(port, "/metrics", &body), 200);
        if (th_metric(body, "idemproc_records_total{outcome=\"processed\"}") ==
            unique)
            break;
        usleep(100000);
    }
    cr_expect_null(strstr(body, "hunter2"), "a secret reached /metrics");
    cr_expect_eq(
        th_metric(body, "idemproc_records_total{outcome=\"processed\"}"),
        (double)expect_count(&stk, "unique", NULL));
    /* Every applied effect, and only those, has a produce-to-effect time;
     * the traffic was produced before the member started, so none is 0. */
    cr_expect_eq(th_metric(body, "idemproc_effect_latency_seconds_count"),
                 (double)expect_count(&stk, "unique", NULL));
    cr_expect_gt(th_metric(body, "idemproc_effect_latency_seconds_sum"), 0);
    cr_expect_eq(
        th_metric(body, "idemproc_duplicates_total{kind=\"redelivery\"}"),
        (double)expect_count(&stk, "duplicates", "redelivery"));
    cr_expect_eq(th_metric(body, "idemproc_duplicates_total{kind=\"resend\"}"),
                 (double)expect_count(&stk, "duplicates", "resend"));
    const char *reasons[] = {"too-large", "not-json", "not-object",
                             "no-identity", "invalid-field"};
    for (int i = 0; i < 5; i++) {
        char name[128];
        snprintf(name, sizeof(name),
                 "idemproc_dlq_records_total{reason=\"%s\"}", reasons[i]);
        cr_expect_eq(th_metric(body, name),
                     (double)expect_count(&stk, "poison", reasons[i]), "%s",
                     name);
    }
    cr_expect_eq(th_metric(body, "idemproc_ready"), 1);
    /* Commits are asynchronous: the first result may still be on its way. */
    for (int t = 0;
         t < 50 &&
         th_metric(body, "idemproc_commits_total{result=\"ok\"}") <= 0;
         t++) {
        free(body);
        usleep(100000);
        cr_assert_eq(th_http_get(port, "/metrics", &body), 200);
    }
    cr_expect_gt(th_metric(body, "idemproc_commits_total{result=\"ok\"}"), 0);
    /* promtool accepts a live scrape. */
    char path[600];
    snprintf(path, sizeof(path), "%s/scrape.txt", stk.dir);
    th_write_file(path, body);
    char cmd[800];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &out, &err, 30000), 0, "%s%s", out, err);
    free(out);
    free(err);
    free(body);
    cr_expect_eq(th_stop(m, 15000), 0);
    char *log = member_log(&stk, "m1");
    cr_expect_gt(strlen(log), 10000, "debug logging was on");
    cr_expect_null(strstr(log, "hunter2"), "a secret reached the log");
    free(log);
    th_stack_stop(&stk);
}

/* A member died holding a lease (forward handler): the record waits until
 * the lease expires, then is forwarded exactly once and marked done. */
Test(forward, expired_lease_of_a_dead_owner_is_processed_again, .timeout = 120)
{
    const char *props[] = {"handler=forward", "output.topic=payments.out",
                           "dedup.lease.ms=3000", "forward.processed.at=header",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *one[] = {"--count", "20", "--seed", "16", NULL};
    cr_assert_eq(th_stack_produce(&stk, one), 0);
    /* Take the identity of the first record and lease it to a dead owner. */
    th_recs_t in = th_topic_read(stk.broker.bootstrap, "payments");
    cr_assert_gt(in.n, 0);
    const char *ikey = hdr(&in.v[0], "idempotency_key");
    char key[512], val[256];
    snprintf(key, sizeof(key), "idemproc:dedup:test-group:%s", ikey);
    snprintf(val, sizeof(val), "lease:dead-member:1:%s",
             hdr(&in.v[0], "message_id"));
    const char *set[] = {"SET", key, val, "PX", "4000", NULL};
    char *ok = th_redis_cli(&stk.redis, set);
    cr_assert_str_eq(ok, "OK");
    free(ok);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 60000);
    const char *get[] = {"GET", key, NULL};
    char *mark = th_redis_cli(&stk.redis, get);
    cr_expect(mark && !strncmp(mark, "done:", 5), "mark: %s", mark);
    free(mark);
    th_recs_t out = th_topic_read(stk.broker.bootstrap, "payments.out");
    int copies = 0;
    for (size_t i = 0; i < out.n; i++) {
        json_t *v = json_loadb(out.v[i].value, out.v[i].len, 0, NULL);
        cr_assert(v);
        /* processed_at opted in as a header: the value is untouched. */
        cr_expect_null(json_object_get(v, "processed_at"), "value changed");
        const char *at = hdr(&out.v[i], "processed_at");
        cr_expect(at && strlen(at) == 24 && at[23] == 'Z', "processed_at: %s",
                  at ? at : "(none)");
        if (!strcmp(json_string_value(json_object_get(v, "idempotency_key")),
                    ikey))
            copies++;
        json_decref(v);
    }
    cr_expect_eq(copies, 1, "the leased record was forwarded %d times", copies);
    cr_expect_eq((long)out.n, expect_count(&stk, "unique", NULL));
    th_recs_free(&in);
    th_recs_free(&out);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* forward loses nothing: with duplicates and poison, and a member killed
 * mid-stream, every payment reaches the output (verify rebuilds the exact
 * ledger from it) and every poison record reaches the DLQ. */
Test(forward, loses_nothing_across_sigkill, .timeout = 180)
{
    const char *props[] = {"handler=forward", "output.topic=payments.out",
                           "dedup.lease.ms=2000", "batch.max.messages=50",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *big[] = {
        "--count",           "8000", "--duplicates", "0.1", "--poison", "0.01",
        "--too-large-bytes", "5000", "--seed",       "17",  NULL};
    cr_assert_eq(th_stack_produce(&stk, big), 0);
    long unique = expect_count(&stk, "unique", NULL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    /* Kill it mid-stream: part of the output written, not all. */
    long written = 0;
    for (int t = 0; t < 600 && written < unique / 4; t++) {
        written = th_topic_size(stk.broker.bootstrap, "payments.out");
        usleep(100000);
    }
    kill(m, SIGKILL);
    cr_expect_eq(th_wait(m, 5000), 128 + SIGKILL);
    written = th_topic_size(stk.broker.bootstrap, "payments.out");
    cr_assert_geq(written, unique / 4, "m1 never got going");
    cr_assert_lt(written, unique, "killed too late to prove anything");
    m = th_stack_member(&stk, "m2", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Wait until a member's log shows `text`; 0 when it did. */
static int wait_log(const char *name, const char *text, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 100) {
        char *log = member_log(&stk, name);
        int found = strstr(log, text) != NULL;
        free(log);
        if (found)
            return 0;
        usleep(100000);
    }
    return -1;
}

/* A shutdown that cannot finish (the broker froze) is ended by a second
 * signal at once, and by the watchdog at shutdown.timeout.ms otherwise:
 * leaving the group gives up by itself within the timeout (close_consumer
 * in loop/pipeline.c), so the stuck part the watchdog ends is a final
 * commit of applied records that the frozen broker never answers. */
Test(pipeline, second_signal_or_watchdog_ends_a_stuck_shutdown, .timeout = 90)
{
    const char *props[] = {"shutdown.timeout.ms=4000", NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    /* A close that needs nothing from the broker at that instant (the
     * group between two states) can end at once; that proves nothing
     * either way, so such a try is repeated with a new member. */
    static const char *names[] = {"m1", "m1b", "m1c"};
    pid_t m = -1;
    for (int i = 0; i < 3; i++) {
        m = th_stack_member(&stk, names[i], NULL);
        cr_assert_eq(wait_log(names[i], "partitions assigned", 30000), 0);
        kill(stk.broker.pid, SIGSTOP);
        kill(m, SIGTERM);
        cr_assert_eq(wait_log(names[i], "shutting down", 5000), 0);
        usleep(300000);
        if (th_wait(m, 0) == -1)
            break;
        cr_log_warn("%s: shutdown finished against a frozen broker; again",
                    names[i]);
        kill(stk.broker.pid, SIGCONT);
        m = -1;
    }
    cr_assert_neq(m, -1,
                  "shutdown finished against a frozen broker three times: "
                  "the test proves nothing");
    kill(m, SIGTERM);
    cr_expect_eq(th_wait(m, 2000), 128 + SIGTERM,
                 "the second signal must exit at once");

    /* Without a second signal the watchdog ends it after the timeout:
     * records applied from the prefetched queue after the freeze leave a
     * final commit to make. */
    kill(stk.broker.pid, SIGCONT);
    const char *more[] = {"--count", "20000", "--seed", "7", NULL};
    cr_assert_eq(th_stack_produce(&stk, more), 0);
    const char *slow[] = {"batch.max.messages=50", NULL};
    m = th_stack_member(&stk, "m2", slow);
    cr_assert_eq(wait_log("m2", "partitions assigned", 45000), 0);
    cr_assert_eq(wait_applied(&stk, 500, 60000), 0);
    kill(stk.broker.pid, SIGSTOP);
    cr_assert_lt(th_stack_applied(&stk), 20000, "the freeze came too late");
    kill(m, SIGTERM);
    int rc = th_wait(m, 9000);
    cr_expect_eq(rc, 1, "watchdog exit code, got %d", rc);
    char *log = member_log(&stk, "m2");
    cr_expect(strstr(log, "shutdown.timeout.ms exceeded"), "%s", log);
    free(log);
    kill(stk.broker.pid, SIGCONT);
    th_stack_stop(&stk);
}

/* A stop that comes while the group waits for a dead member (killed: its
 * session has not expired) cannot leave the group in time; the member
 * still ends inside shutdown.timeout.ms, and exits 0 when it had nothing
 * left to commit: leaving the group is a courtesy, the session timeout
 * does it for us. */
Test(pipeline, stop_while_the_group_waits_for_a_dead_member_exits_0,
     .timeout = 120)
{
    const char *props[] = {"shutdown.timeout.ms=4000", NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    pid_t dead = th_stack_member(&stk, "d1", NULL);
    cr_assert_eq(wait_log("d1", "partitions assigned", 30000), 0);
    kill(dead, SIGKILL);
    cr_expect_eq(th_wait(dead, 5000), 128 + SIGKILL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(wait_log("m1", "started", 10000), 0);
    usleep(1500 * 1000); /* its JoinGroup waits for d1's session (6 s) */
    char *log = member_log(&stk, "m1");
    int assigned = strstr(log, "partitions assigned") != NULL;
    free(log);
    if (assigned)
        cr_log_warn("the group did not wait for the dead member; the stop "
                    "below proves less");
    int64_t t0 = idem_now_ms();
    kill(m, SIGTERM);
    int rc = th_wait(m, 9000);
    int64_t took = idem_now_ms() - t0;
    log = member_log(&stk, "m1");
    cr_expect_eq(rc, 0, "exit %d after %lld ms:\n%s", rc, (long long)took, log);
    cr_expect_lt(took, 4000, "took %lld ms", (long long)took);
    free(log);
    th_stack_stop(&stk);
}

/* Regression: with the default message.max.bytes a too-large record is
 * bigger than librdkafka's default producer limit; its dead letter must
 * still be written (it once stalled the member forever). */
Test(pipeline, default_sized_too_large_records_reach_the_dlq, .timeout = 120)
{
    const char *props[] = {"message.max.bytes=1048576", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *few[] = {
        "--count", "120", "--poison", "0.2",
        "--seed",  "18",  NULL}; /* default --too-large-bytes: 1048577 */
    cr_assert_eq(th_stack_produce(&stk, few), 0);
    cr_assert_gt(expect_count(&stk, "poison", "too-large"), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 60000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* A dead letter whose value the DLQ can never take is written without the
 * value (dlq.value.dropped says how long it was) instead of blocking. */
Test(pipeline, dead_letter_too_big_for_the_dlq_drops_its_value, .timeout = 120)
{
    const char *props[] = {"message.max.bytes=4096",
                           "kafka.message.max.bytes=100000", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *few[] = {"--count", "120", "--poison",          "0.2",
                         "--seed",  "19",  "--too-large-bytes", "200000",
                         NULL};
    cr_assert_eq(th_stack_produce(&stk, few), 0);
    long too_large = expect_count(&stk, "poison", "too-large");
    cr_assert_gt(too_large, 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 60000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_recs_t dlq = th_topic_read(stk.broker.bootstrap, "payments.dlq");
    long dropped = 0;
    for (size_t i = 0; i < dlq.n; i++) {
        if (strcmp(hdr(&dlq.v[i], "dlq.reason"), "too-large"))
            continue;
        cr_expect_str_eq(hdr(&dlq.v[i], "dlq.value.dropped"), "200000");
        cr_expect_eq(dlq.v[i].len, 0);
        dropped++;
    }
    cr_expect_eq(dropped, too_large);
    th_recs_free(&dlq);
    th_stack_stop(&stk);
}

/* A member's own lease from an earlier rebalance epoch (a record it still
 * held on a partition it kept) is taken over at once, not waited out. */
Test(forward, own_lease_from_an_earlier_epoch_is_taken_at_once, .timeout = 90)
{
    const char *props[] = {"handler=forward", "output.topic=payments.out",
                           "dedup.lease.ms=60000", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *one[] = {"--count", "20", "--seed", "23", NULL};
    cr_assert_eq(th_stack_produce(&stk, one), 0);
    th_recs_t in = th_topic_read(stk.broker.bootstrap, "payments");
    cr_assert_gt(in.n, 0);
    char key[512], val[300];
    snprintf(key, sizeof(key), "idemproc:dedup:test-group:%s",
             hdr(&in.v[0], "idempotency_key"));
    snprintf(val, sizeof(val), "lease:m1:0:%s", hdr(&in.v[0], "message_id"));
    const char *set[] = {"SET", key, val, "PX", "60000", NULL};
    free(th_redis_cli(&stk.redis, set));
    th_recs_free(&in);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    /* Far less than the 60 s lease: it must not wait for it. */
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 25000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* An increment Redis refuses (the balance would overflow) is poison:
 * handler-rejected, nothing applied, no mark set. */
Test(pipeline, refused_increment_is_handler_rejected, .timeout = 90)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *few[] = {"--count",
                         "6",
                         "--users",
                         "1",
                         "--currencies",
                         "EUR",
                         "--duplicates",
                         "0.5",
                         "--seed",
                         "24",
                         NULL};
    cr_assert_eq(th_stack_produce(&stk, few), 0);
    /* Every record, duplicates included: none of them can be applied, and
     * a duplicate of a refused record is refused too (no mark was set). */
    long sent = expect_count(&stk, "sent", NULL);
    const char *full[] = {"HSET", "idemproc:ledger:EUR", "user-1",
                          "9223372036854775000", NULL};
    free(th_redis_cli(&stk.redis, full));
    pid_t m = th_stack_member(&stk, "m1", NULL);
    long rejected = 0;
    for (int t = 0; t < 300 && rejected < sent; t++) {
        th_recs_t dlq = th_topic_read(stk.broker.bootstrap, "payments.dlq");
        rejected = 0;
        for (size_t i = 0; i < dlq.n; i++)
            if (!strcmp(hdr(&dlq.v[i], "dlq.reason"), "handler-rejected"))
                rejected++;
        th_recs_free(&dlq);
        usleep(100000);
    }
    cr_expect_eq(rejected, sent, "%ld of %ld records handler-rejected",
                 rejected, sent);
    cr_expect_eq(th_stack_applied(&stk), 0);
    const char *bal[] = {"HGET", "idemproc:ledger:EUR", "user-1", NULL};
    char *v = th_redis_cli(&stk.redis, bal);
    cr_expect_str_eq(v, "9223372036854775000");
    free(v);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Redis forgets its scripts (SCRIPT FLUSH by an operator, a failover to a
 * replica without them): NOSCRIPT reloads them, nothing is dead-lettered
 * for it, the ledger stays exact; done marks carry dedup.ttl.seconds. */
Test(pipeline, script_flush_reloads_and_marks_expire, .timeout = 120)
{
    const char *props[] = {"batch.max.messages=50", "dedup.ttl.seconds=3600",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *big[] = {
        "--count",           "20000", "--duplicates", "0.1", "--poison", "0.01",
        "--too-large-bytes", "5000",  "--seed",       "25",  NULL};
    cr_assert_eq(th_stack_produce(&stk, big), 0);
    long unique = expect_count(&stk, "unique", NULL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(wait_applied(&stk, unique / 5, 60000), 0);
    for (int i = 0; i < 3; i++) {
        const char *flush[] = {"SCRIPT", "FLUSH", NULL};
        char *ok = th_redis_cli(&stk.redis, flush);
        cr_expect_str_eq(ok, "OK");
        free(ok);
        usleep(200000);
    }
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 90000);
    char *log = member_log(&stk, "m1");
    cr_expect(strstr(log, "reloading"), "no NOSCRIPT seen: the test proves "
                                        "nothing");
    free(log);
    /* A done mark expires after dedup.ttl.seconds. */
    th_recs_t in = th_topic_read(stk.broker.bootstrap, "payments");
    char key[512];
    for (size_t i = 0; i < in.n; i++) {
        const char *ik = hdr(&in.v[i], "idempotency_key");
        if (!ik)
            continue;
        snprintf(key, sizeof(key), "idemproc:dedup:test-group:%s", ik);
        break;
    }
    th_recs_free(&in);
    const char *ttl[] = {"TTL", key, NULL};
    char *t = th_redis_cli(&stk.redis, ttl);
    long secs = t ? atol(t) : -9;
    cr_expect(secs > 3000 && secs <= 3600, "TTL of %s: %s", key, t);
    free(t);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Before librdkafka's first statistics the lag is unknown: the progress
 * line says lag=?, never lag=-1. */
Test(pipeline, progress_line_lag_unknown_before_statistics)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *sets[] = {"stats.interval.ms=0", "progress.interval.ms=100",
                          "log.format=text", NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);
    char logp[600];
    snprintf(logp, sizeof(logp), "%s/m1.log", stk.dir);
    char *log = NULL;
    for (int i = 0; i < 300; i++) {
        free(log);
        log = th_slurp(logp, NULL);
        if (log && strstr(log, " progress "))
            break;
        usleep(100000);
    }
    cr_expect_eq(th_stop(m, 10000), 0);
    cr_assert(log && strstr(log, " progress "), "%s", log ? log : "");
    cr_expect(strstr(log, "lag=? "), "%s", log);
    cr_expect_null(strstr(log, "lag=-1"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}

/* Sends the lines of `text` to payments with kcat (one record a line, read
 * from stdin): "key:value" lines with `keyed`, one header name=value for
 * all of them when `header` is set. */
static void kcat_send(const char *text, int keyed, const char *header)
{
    char path[600], cmd[2048];
    static int n;
    snprintf(path, sizeof(path), "%s/kcat-%d.txt", stk.dir, n++);
    cr_assert_eq(th_write_file(path, text), 0);
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/kcat -P -b %s -t payments %s %s%s < %s",
             stk.broker.bootstrap, keyed ? "-K :" : "", header ? "-H " : "",
             header ? header : "", path);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    cr_assert_eq(th_run(argv, NULL, NULL, 30000), 0, "%s failed", cmd);
}

/* envelope.format=bytes through the loop: values that are not JSON pass
 * untouched (no processed_at), the identity comes from a header or else
 * the Kafka key, a repeated key is a duplicate, and a record with neither
 * is dead-lettered as no-identity. */
Test(forward, bytes_with_identity_from_a_header_or_the_key, .timeout = 120)
{
    const char *props[] = {
        "handler=forward",       "output.topic=payments.out",
        "envelope.format=bytes", "envelope.identity=header:event-id,key",
        "envelope.message.id=",  NULL};
    cr_assert_eq(th_stack_start(&stk, 1, props), 0);
    kcat_send("hk:\x01raw bytes one\n", 1, "event-id=ev-1");
    kcat_send("k-1:plain text\nk-2:{not json\nk-1:plain text again\n", 1, NULL);
    kcat_send("no key, no header\n", 0, NULL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    long out = 0, dlq = 0;
    for (int t = 0; t < 600 && (out < 3 || dlq < 1); t++) {
        out = th_topic_size(stk.broker.bootstrap, "payments.out");
        dlq = th_topic_size(stk.broker.bootstrap, "payments.dlq");
        usleep(100000);
    }
    usleep(500000); /* nothing more may come */
    th_recs_t o = th_topic_read(stk.broker.bootstrap, "payments.out");
    cr_assert_eq(o.n, 3, "forwarded %zu records", o.n);
    cr_expect_str_eq(o.v[0].value, "\x01raw bytes one");
    cr_expect_str_eq(o.v[0].key, "hk");
    cr_expect_str_eq(hdr(&o.v[0], "event-id"), "ev-1");
    cr_expect_str_eq(o.v[1].value, "plain text");
    cr_expect_str_eq(o.v[2].value, "{not json");
    th_recs_t d = th_topic_read(stk.broker.bootstrap, "payments.dlq");
    cr_assert_eq(d.n, 1);
    cr_expect_str_eq(hdr(&d.v[0], "dlq.reason"), "no-identity");
    th_recs_free(&o);
    th_recs_free(&d);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* A nested JSON Pointer identity through the loop, and the copy
 * byte-identical by default (forward.processed.at=false): the value's
 * bytes, spacing included, and no header added. */
Test(forward, identity_from_a_nested_pointer, .timeout = 120)
{
    const char *props[] = {"handler=forward", "output.topic=payments.out",
                           "envelope.identity=value:/event/id",
                           "envelope.message.id=value:/event/seq", NULL};
    cr_assert_eq(th_stack_start(&stk, 1, props), 0);
    kcat_send(
        "{\"event\":{\"id\":\"e1\",\"seq\":\"1\"},\"sku\":\"A\",\"qty\":2}\n"
        "{\"event\":{\"id\":\"e2\",\"seq\":\"1\"},\"sku\":\"B\",\"qty\":1}\n"
        "{\"event\":{\"id\":\"e1\",\"seq\":\"1\"},\"sku\":\"A\",\"qty\":2}\n"
        "{\"event\":{\"id\":\"e2\",\"seq\":\"2\"},\"sku\":\"B\",\"qty\":1}\n"
        "{\"sku\":\"C\"}\n",
        0, NULL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    long out = 0, dlq = 0;
    for (int t = 0; t < 600 && (out < 2 || dlq < 1); t++) {
        out = th_topic_size(stk.broker.bootstrap, "payments.out");
        dlq = th_topic_size(stk.broker.bootstrap, "payments.dlq");
        usleep(100000);
    }
    usleep(500000);
    th_recs_t o = th_topic_read(stk.broker.bootstrap, "payments.out");
    cr_assert_eq(o.n, 2, "forwarded %zu records", o.n);
    cr_expect_str_eq(o.v[0].value,
                     "{\"event\":{\"id\":\"e1\",\"seq\":\"1\"},\"sku\":\"A\","
                     "\"qty\":2}");
    cr_expect_null(hdr(&o.v[0], "processed_at"));
    cr_expect(strstr(o.v[1].value, "\"id\":\"e2\""), "%s", o.v[1].value);
    th_recs_free(&o);
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 1);
    cr_expect_eq(th_stop(m, 15000), 0);
    char *log = member_log(&stk, "m1");
    cr_expect(strstr(log, "no-identity"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}

/* One identity is with an external handler at most once at a time, also
 * when its two records fall into different chunks (1000 records) of one
 * claim call: before, the second chunk re-claimed the first chunk's lease
 * (ours) and the effect ran twice. A redelivery and a resend of early
 * records sit past record 1000 of one due set. */
Test(forward, duplicates_in_another_claim_chunk_are_forwarded_once,
     .timeout = 180)
{
    const char *props[] = {"handler=forward", "output.topic=payments.out",
                           "batch.max.messages=2000", "batch.max.wait.ms=3000",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, 1, props), 0);
    size_t cap = 1700 * 128, at = 0;
    char *lines = malloc(cap);
    for (int i = 0; i < 1600; i++) {
        int k = i == 1500 ? 10 : i == 1550 ? 20 : i;
        at += (size_t)snprintf(lines + at, cap - at,
                               "{\"idempotency_key\":\"k%d\",\"message_id\":"
                               "\"m%d%s\",\"user_id\":\"u%d\",\"amount\":1,"
                               "\"currency\":\"EUR\"}\n",
                               k, k, i == 1550 ? "-again" : "", i % 7);
    }
    char path[600];
    snprintf(path, sizeof(path), "%s/chunks.jsonl", stk.dir);
    cr_assert_eq(th_write_file(path, lines), 0);
    free(lines);
    const char *args[] = {"--input", path, NULL};
    cr_assert_eq(th_stack_produce(&stk, args), 0);
    long unique = expect_count(&stk, "unique", NULL);
    cr_assert_eq(unique, 1598);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 90000);
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.out"), unique,
                 "an identity was forwarded twice");
    cr_expect_eq(th_stop(m, 15000), 0);
    char *log = member_log(&stk, "m1");
    cr_expect(!strstr(log, "lease taken over"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}

/* SIGUSR1 and SIGUSR2 are ignored (they killed the member at once, no
 * commit, no leaving the group); SIGHUP stops it like SIGTERM: exit 0
 * after the final commit. */
Test(pipeline, sighup_stops_cleanly_and_user_signals_are_ignored,
     .timeout = 120)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *few[] = {"--count", "50", "--seed", "22", NULL};
    cr_assert_eq(th_stack_produce(&stk, few), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    kill(m, SIGUSR1);
    kill(m, SIGUSR2);
    usleep(500000);
    cr_assert_eq(th_wait(m, 0), -1, "a user signal ended the member");
    kill(m, SIGHUP);
    cr_expect_eq(th_wait(m, 15000), 0, "SIGHUP: exit 0");
    char *log = member_log(&stk, "m1");
    cr_expect(strstr(log, "stopped cleanly"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}
