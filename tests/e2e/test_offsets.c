/* test_offsets: `idemproc offsets show|reset` against a real Redis, the
 * embedded broker and real members: a skip to the end leaves a backlog
 * unapplied, a rewind to the start applies it once (the rest duplicates),
 * a datetime picks the records produced after it, one partition moves
 * alone, a running member refuses the reset, a dry run changes nothing;
 * and show's text and JSON say what both systems hold. */
#include "harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static th_stack_t stk;

TestSuite(offsets, .fini = th_stack_cleanup);

/* Runs `idemproc offsets VERB -c <conf>` plus args (NULL-terminated).
 * Returns the exit code; *out and *err (may be NULL) get the output. */
static int offsets_cmd(const char *verb, const char *const args[], char **out,
                       char **err)
{
    char *argv[32] = {(char *)th_bin(), "offsets", (char *)verb, "-c",
                      stk.conf};
    int n = 5;
    for (int i = 0; args && args[i] && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    return th_run(argv, out, err, 120000);
}

/* `offsets show --json` parsed; asserts it ran. Caller json_decrefs. */
static json_t *show_json(void)
{
    const char *args[] = {"--json", NULL};
    char *out = NULL, *err = NULL;
    int rc = offsets_cmd("show", args, &out, &err);
    cr_assert_eq(rc, 0, "offsets show: %s", err);
    json_error_t je;
    json_t *doc = json_loads(out, 0, &je);
    cr_assert(doc, "offsets show --json: not JSON: %s\n%s", je.text, out);
    free(out);
    free(err);
    return doc;
}

/* The total lag that show reports. */
static long show_lag(void)
{
    json_t *doc = show_json();
    long lag = (long)json_integer_value(
        json_object_get(json_object_get(doc, "total"), "lag"));
    json_decref(doc);
    return lag;
}

/* Waits until show reports no lag (a member read everything). */
static void wait_no_lag(int timeout_ms)
{
    long lag = -1;
    for (int t = 0; t < timeout_ms / 200; t++) {
        lag = show_lag();
        if (!lag)
            return;
        usleep(200000);
    }
    cr_assert_fail("lag still %ld after %d ms", lag, timeout_ms);
}

/* Runs a member until it has read everything, then stops it (exit 0). */
static void member_until_read(const char *name, const char *const sets[])
{
    pid_t m = th_stack_member(&stk, name, sets);
    wait_no_lag(90000);
    cr_assert_eq(th_stop(m, 15000), 0, "%s did not stop cleanly", name);
}

/* A member with its HTTP endpoints on a free port (*port). */
static pid_t member_http(const char *name, int *port)
{
    *port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", *port);
    const char *sets[] = {listen, NULL};
    return th_stack_member(&stk, name, sets);
}

/* Waits up to 30 s until member `name` has logged `said` n times. */
static void wait_said(const char *name, const char *said, int n)
{
    for (int t = 0; t < 300 && th_stack_log_count(&stk, name, said) < n; t++)
        usleep(100000);
}

/* The stack (2 partitions) with `count` records of `seed`, all read by a
 * member m1 that then stopped. */
static void stack_read_by_m1(const char *count, const char *seed)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *traffic[] = {"--count", count, "--seed", seed, NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    member_until_read("m1", NULL);
}

/* A value of a member's /metrics. */
static double member_metric(int port, const char *name)
{
    char *body = NULL;
    cr_assert_eq(th_http_get(port, "/metrics", &body), 200);
    double v = th_metric(body, name);
    free(body);
    return v;
}

Test(offsets, show_text_and_json_say_what_kafka_and_redis_hold, .timeout = 240)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *traffic[] = {"--count", "300", "--seed", "2101", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    char *out = NULL, *err = NULL;
    /* Before any member: nothing committed, nothing in Redis. */
    cr_assert_eq(offsets_cmd("show", NULL, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "group test-group, kafka cluster "), "%s", out);
    cr_expect(strstr(out, "total: 2 partitions, lag 300\n"), "%s", out);
    cr_expect(strstr(out, " auto.offset.reset "), "%s", out);
    free(out);
    free(err);
    member_until_read("m1", NULL);
    json_t *doc = show_json();
    json_t *parts = json_object_get(doc, "partitions");
    cr_assert_eq(json_array_size(parts), 2);
    long high_sum = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *p = json_array_get(parts, i);
        long high = (long)json_integer_value(json_object_get(p, "high"));
        high_sum += high;
        cr_expect_eq(json_integer_value(json_object_get(p, "partition")),
                     (json_int_t)i);
        cr_expect_eq(json_integer_value(json_object_get(p, "kafka_committed")),
                     high);
        cr_expect_str_eq(
            json_string_value(json_object_get(p, "kafka_metadata")),
            "idemproc");
        json_t *r = json_object_get(p, "redis");
        cr_assert(json_is_object(r));
        cr_expect_eq(json_integer_value(json_object_get(r, "offset")), high);
        cr_expect_str_eq(json_string_value(json_object_get(r, "verdict")),
                         "use");
        cr_expect_str_eq(json_string_value(json_object_get(p, "start_from")),
                         "redis");
        cr_expect_eq(json_integer_value(json_object_get(p, "lag")), 0);
        cr_expect(json_is_object(json_object_get(r, "record")));
    }
    cr_expect_eq(high_sum, 300);
    cr_expect_str_eq(json_string_value(json_object_get(doc, "group")),
                     "test-group");
    json_decref(doc);
    /* One partition; text: the line holds committed, position, verdict. */
    const char *one[] = {"--topic", "payments:1", NULL};
    cr_assert_eq(offsets_cmd("show", one, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "total: 1 partitions, lag 0\n"), "%s", out);
    cr_expect(strstr(out, " use "), "%s", out);
    cr_expect(!strstr(out, "payments                     0 "), "%s", out);
    free(out);
    free(err);
    const char *none[] = {"--topic", "nosuch", NULL};
    cr_expect_eq(offsets_cmd("show", none, NULL, &err), 1);
    cr_expect(strstr(err, "--topic nosuch: nosuch is not a topic of "
                          "input.topics (payments)"),
              "%s", err);
    free(err);
    /* A partition the topic lacks, alone or beside one it has: named, with
     * the partitions there are (a reset too, before it changes anything). */
    const char *seven[] = {"--topic", "payments:7", NULL};
    cr_expect_eq(offsets_cmd("show", seven, NULL, &err), 1);
    cr_expect(strstr(err, "--topic payments:7: payments has no partition 7 "
                          "(it has 0-1)"),
              "%s", err);
    free(err);
    const char *mixed[] = {"--topic", "payments:0,7", "--to-earliest",
                           "--execute", NULL};
    cr_expect_eq(offsets_cmd("reset", mixed, NULL, &err), 1);
    cr_expect(strstr(err, "--topic payments:0,7: payments has no partition 7 "
                          "(it has 0-1)"),
              "%s", err);
    free(err);
    th_stack_stop(&stk);
}

Test(offsets, reset_to_latest_skips_the_backlog, .timeout = 240)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *backlog[] = {"--count", "500", "--seed", "2102", NULL};
    cr_assert_eq(th_stack_produce(&stk, backlog), 0);
    const char *latest[] = {"--to-latest", "--execute", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(offsets_cmd("reset", latest, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "total: 2 partitions, 500 records skipped, 0 read "
                          "again\n"),
              "%s", out);
    cr_expect(strstr(out, "reset: done"), "%s", out);
    free(out);
    free(err);
    /* New traffic after the reset: only that is applied (its own
     * expectation replaces the backlog's). */
    const char *fresh[] = {"--count", "200", "--seed", "2103", NULL};
    cr_assert_eq(th_stack_produce(&stk, fresh), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 90000);
    wait_no_lag(60000);
    cr_expect_eq(th_stack_applied(&stk), 200);
    cr_expect_eq(th_stack_log_count(&stk, "m1", "went back in time"), 0);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

Test(offsets, reset_to_earliest_applies_the_backlog_once, .timeout = 300)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *traffic[] = {"--count", "400", "--duplicates", "0.1", "--seed",
                             "2104",    NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    long records = th_topic_size(stk.broker.bootstrap, "payments");
    member_until_read("m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    const char *earliest[] = {"--to-earliest", "--execute", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(offsets_cmd("reset", earliest, &out, &err), 0, "%s", err);
    char want[128];
    snprintf(want, sizeof(want),
             "total: 2 partitions, 0 records skipped, %ld read again\n",
             records);
    cr_expect(strstr(out, want), "%s", out);
    free(out);
    free(err);
    json_t *doc = show_json();
    cr_expect_eq(json_integer_value(
                     json_object_get(json_object_get(doc, "total"), "lag")),
                 records);
    json_t *p0 = json_array_get(json_object_get(doc, "partitions"), 0);
    cr_expect(strstr(json_string_value(json_object_get(p0, "kafka_metadata")),
                     "idemproc offsets reset "));
    json_decref(doc);
    /* Every record is read again: each one a duplicate, none applied. */
    int port;
    pid_t m = member_http("m2", &port);
    wait_no_lag(90000);
    double dup = 0;
    for (int t = 0; t < 100 && dup < records; t++) {
        usleep(100000);
        dup = member_metric(port,
                            "idemproc_records_total{outcome=\"duplicate\"}");
    }
    cr_expect_eq((long)dup, records, "duplicates %.0f of %ld", dup, records);
    cr_expect_eq(
        member_metric(port, "idemproc_records_total{outcome=\"processed\"}"),
        0);
    cr_expect_eq(th_stack_applied(&stk), unique);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 30000);
    cr_expect_eq(th_stack_log_count(&stk, "m2", "went back in time"), 0);
    cr_expect_eq(th_stack_log_count(&stk, "m2",
                                    "starting where idemproc offsets reset "
                                    "put the partition"),
                 2);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Now as RFC 3339 UTC with milliseconds. */
static void now_rfc3339(char *buf, size_t size)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char s[32];
    strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, size, "%s.%03ldZ", s, ts.tv_nsec / 1000000);
}

Test(offsets, reset_to_a_datetime_applies_what_came_after_it, .timeout = 240)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *before[] = {"--count", "300", "--seed", "2105", NULL};
    cr_assert_eq(th_stack_produce(&stk, before), 0);
    usleep(1200000); /* the timestamps of the two productions differ */
    char at[64];
    now_rfc3339(at, sizeof(at));
    usleep(1200000);
    const char *after[] = {"--count", "150", "--seed", "2106", NULL};
    cr_assert_eq(th_stack_produce(&stk, after), 0);
    const char *reset[] = {"--to-datetime", at, "--execute", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(offsets_cmd("reset", reset, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "total: 2 partitions, 300 records skipped, 0 read "
                          "again\n"),
              "%s", out);
    free(out);
    free(err);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 90000); /* the second production */
    wait_no_lag(60000);
    cr_expect_eq(th_stack_applied(&stk), 150);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

Test(offsets, reset_of_one_partition_leaves_the_others, .timeout = 240)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *traffic[] = {"--count", "400", "--seed", "2107", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    th_recs_t recs = th_topic_read(stk.broker.bootstrap, "payments");
    long in_p1 = 0;
    for (size_t i = 0; i < recs.n; i++)
        in_p1 += recs.v[i].partition == 1;
    th_recs_free(&recs);
    cr_assert(in_p1 > 0 && in_p1 < 400);
    const char *reset[] = {"--to-latest", "--topic", "payments:0", "--execute",
                           NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(offsets_cmd("reset", reset, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "payments [0]: 0 "), "%s", out);
    cr_expect(!strstr(out, "payments [1]"), "%s", out);
    char want[128];
    snprintf(want, sizeof(want),
             "total: 1 partitions, %ld records skipped, 0 read again\n",
             400 - in_p1);
    cr_expect(strstr(out, want), "%s", out);
    free(out);
    free(err);
    member_until_read("m1", NULL);
    cr_expect_eq(th_stack_applied(&stk), in_p1);
    th_stack_stop(&stk);
}

Test(offsets, reset_is_refused_while_a_member_runs, .timeout = 240)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *traffic[] = {"--count", "200", "--seed", "2108", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    pid_t m = th_stack_member(&stk, "refusal-m1", NULL);
    wait_no_lag(90000);
    json_t *before = show_json();
    const char *earliest[] = {"--to-earliest", "--execute", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(offsets_cmd("reset", earliest, &out, &err), 1, "%s", out);
    cr_expect(strstr(err, "group test-group has 1 live member: refusal-m1 "
                          "(heartbeat in redis"),
              "%s", err);
    cr_expect(strstr(err, "nothing changed"), "%s", err);
    free(out);
    free(err);
    json_t *after = show_json();
    cr_expect(json_equal(before, after), "the refused reset moved something");
    json_decref(after);
    cr_expect_eq(th_stop(m, 15000), 0);
    /* Stopped: its heartbeat is gone at once, and the same reset runs. */
    cr_expect_eq(offsets_cmd("reset", earliest, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    json_decref(before);
    th_stack_stop(&stk);
}

Test(offsets, dry_run_changes_nothing, .timeout = 240)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *traffic[] = {"--count", "200", "--seed", "2109", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    member_until_read("m1", NULL);
    json_t *before = show_json();
    const char *const plans[][3] = {
        {"--to-earliest", NULL, NULL},
        {"--shift-by", "-50", NULL},
        {"--to-offset", "3", NULL},
        /* not ListOffsets' -1, "latest" */
        {"--to-datetime", "1969-12-31T23:59:59.999Z", NULL}};
    for (size_t i = 0; i < sizeof(plans) / sizeof(plans[0]); i++) {
        char *out = NULL, *err = NULL;
        cr_assert_eq(offsets_cmd("reset", plans[i], &out, &err), 0, "%s", err);
        cr_expect(strstr(out, "read again"), "%s", out);
        cr_expect(strstr(out, "dry run: nothing changed (add --execute to "
                              "apply)\n"),
                  "%s", out);
        free(out);
        free(err);
    }
    json_t *after = show_json();
    cr_expect(json_equal(before, after), "a dry run moved something");
    json_decref(before);
    json_decref(after);
    /* Usage errors. */
    char *err = NULL;
    cr_expect_eq(offsets_cmd("reset", NULL, NULL, &err), 2);
    cr_expect(strstr(err, "one of --to-earliest"), "%s", err);
    free(err);
    const char *two[] = {"--to-earliest", "--to-latest", NULL};
    cr_expect_eq(offsets_cmd("reset", two, NULL, &err), 2);
    free(err);
    const char *huge[] = {"--shift-by", "99999999999999999999", NULL};
    cr_expect_eq(offsets_cmd("reset", huge, NULL, &err), 2);
    cr_expect(strstr(err, "is not a whole number"), "%s", err);
    free(err);
    th_stack_stop(&stk);
}

/* Commits offset for payments [partition] of test-group as another tool
 * would, with no commit metadata: joins the group (the mock cluster takes a
 * commit only from a member) and commits. */
static void foreign_commit(int32_t partition, int64_t offset)
{
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    cr_assert_eq(rd_kafka_conf_set(kc, "bootstrap.servers",
                                   stk.broker.bootstrap, err, sizeof(err)),
                 RD_KAFKA_CONF_OK);
    rd_kafka_conf_set(kc, "group.id", "test-group", err, sizeof(err));
    rd_kafka_conf_set(kc, "enable.auto.commit", "false", err, sizeof(err));
    rd_kafka_conf_set(kc, "session.timeout.ms", "6000", err, sizeof(err));
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
    cr_assert(rk, "%s", err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, "payments", RD_KAFKA_PARTITION_UA);
    cr_assert_eq(rd_kafka_subscribe(rk, sub), 0);
    rd_kafka_topic_partition_list_destroy(sub);
    int assigned = 0;
    for (int t = 0; t < 300 && !assigned; t++) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (m)
            rd_kafka_message_destroy(m);
        rd_kafka_topic_partition_list_t *a = NULL;
        if (!rd_kafka_assignment(rk, &a)) {
            assigned = a->cnt > 0;
            rd_kafka_topic_partition_list_destroy(a);
        }
    }
    cr_assert(assigned, "never assigned");
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, "payments", partition)->offset =
        offset;
    cr_assert_eq(rd_kafka_commit(rk, l, 0), 0);
    cr_assert_eq(l->elems[0].err, 0);
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
}

Test(offsets, kafka_offset_moved_by_another_tool_is_named_not_honoured,
     .timeout = 240)
{
    stack_read_by_m1("300", "2110");
    long unique = th_stack_expect_unique(&stk);
    cr_assert_eq(th_stack_applied(&stk), unique);
    foreign_commit(0, 0);
    int port;
    pid_t m = member_http("m2", &port);
    const char *said = "kafka's committed offset was moved by another tool";
    wait_said("m2", said, 1);
    cr_expect_eq(th_stack_log_count(&stk, "m2", said), 1);
    cr_expect_eq(member_metric(port, "idemproc_kafka_offset_moved_total"), 1);
    cr_expect_eq(member_metric(port, "idemproc_redis_position_behind_total"),
                 0);
    cr_expect_eq(th_stack_log_count(&stk, "m2", "went back in time"), 0);
    /* Redis's position won: nothing read again, nothing applied again. */
    wait_no_lag(60000);
    cr_expect_eq(
        member_metric(port, "idemproc_records_total{outcome=\"duplicate\"}"),
        0);
    cr_expect_eq(th_stack_applied(&stk), unique);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Kafka's committed offset of each partition (2), from show. */
static void committed_offsets(int64_t out[2])
{
    json_t *doc = show_json();
    json_t *parts = json_object_get(doc, "partitions");
    cr_assert_eq(json_array_size(parts), 2);
    for (size_t i = 0; i < 2; i++)
        out[i] = (int64_t)json_integer_value(
            json_object_get(json_array_get(parts, i), "kafka_committed"));
    json_decref(doc);
}

static const char lost_said[] = "redis lost its state of a partition";

/* A member whose partitions Redis lost (both of 2): it says so once per
 * partition, counts it as Redis going back in time, is not ready naming
 * the partition, and applies nothing of the records after Kafka's offsets
 * (`fresh` of them wait there). Stops it. */
static void member_keeps_lost_partitions_paused(const char *name, long fresh)
{
    int port;
    pid_t m = member_http(name, &port);
    wait_said(name, lost_said, 2);
    cr_expect_eq(th_stack_log_count(&stk, name, lost_said), 2);
    /* The loop logs a lost partition, then sets its reason at once; a
     * probe between the two still gets the state before it. */
    char *body = NULL;
    int st = th_wait_unready(port, "redis lost its state of payments [", 10000,
                             &body);
    cr_expect_eq(st, 503, "ready although redis lost its partitions");
    cr_expect(body && strstr(body, "redis lost its state of payments ["), "%s",
              body ? body : "");
    free(body);
    cr_expect_eq(member_metric(port, "idemproc_redis_position_behind_total"),
                 2);
    /* Joined and judged: the fetched records of a lost partition would be
     * applied within the same seconds; none is. */
    sleep(3);
    cr_expect_eq(th_stack_applied(&stk), 0);
    cr_expect_eq(show_lag(), fresh);
    cr_expect_eq(th_http_get(port, "/readyz", NULL), 503);
    cr_expect_eq(th_stop(m, 15000), 0, "%s did not stop cleanly", name);
}

/* Redis lost everything (FLUSHALL) while Kafka holds the offsets the
 * members committed: no member can say how far back Redis lost, so it
 * starts nowhere (before, it started at Kafka's offset and what Redis lost
 * was never applied again). show says "lost"; a reset to the earliest
 * offsets writes both sides, and the next member applies it all: exact. */
Test(offsets, redis_flushed_partitions_stay_paused_until_reset, .timeout = 300)
{
    stack_read_by_m1("300", "2120");
    long unique = th_stack_expect_unique(&stk);
    cr_assert_eq(th_stack_applied(&stk), unique);
    const char *flush[] = {"FLUSHALL", NULL};
    th_redis_ok(&stk.redis, flush);

    char *out = NULL, *err = NULL;
    cr_assert_eq(offsets_cmd("show", NULL, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, " lost "), "%s", out);
    cr_expect(strstr(out, " paused:redis-lost "), "%s", out);
    cr_expect(strstr(out, "payments [1]: redis holds no position while kafka "
                          "holds a member's offset"),
              "%s", out);
    cr_expect(strstr(out, "idemproc offsets reset --topic payments:0"), "%s",
              out);
    free(out);
    free(err);
    json_t *doc = show_json();
    json_t *p0 = json_array_get(json_object_get(doc, "partitions"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(p0, "start_from")),
                     "paused:redis-lost");
    json_decref(doc);

    member_keeps_lost_partitions_paused("m2", 0);

    const char *earliest[] = {"--to-earliest", "--execute", NULL};
    cr_assert_eq(offsets_cmd("reset", earliest, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "reset: done"), "%s", out);
    free(out);
    free(err);
    pid_t m = th_stack_member(&stk, "m3", NULL);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 90000);
    wait_no_lag(60000);
    cr_expect_eq(th_stack_applied(&stk), unique);
    cr_expect_eq(th_stack_log_count(&stk, "m3", lost_said), 0);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Redis replaced by a fresh, empty one on another port, and new records
 * after the members' offsets: nothing of them is applied while the
 * partitions are lost (before, they were, on top of a Redis without the
 * old state). A reset of each partition to Kafka's offset (the operator's
 * choice: the old effects are gone with the old Redis) lets the next
 * member apply exactly the new records. */
Test(offsets, fresh_redis_partitions_stay_paused_until_reset_to_offset,
     .timeout = 300)
{
    stack_read_by_m1("300", "2121");
    int64_t kafka[2];
    committed_offsets(kafka);
    th_redis_stop(&stk.redis);
    th_redis_t fresh = {0};
    cr_assert_eq(th_redis_start(&fresh), 0);
    cr_assert_neq(fresh.port, stk.redis.port);
    stk.redis = fresh;
    /* Members and the tools see the new one (the environment wins over the
     * file); this test's process only. */
    setenv("IDEMPROC_REDIS_URL", stk.redis.url, 1);
    const char *after[] = {"--count", "200", "--seed", "2122", NULL};
    cr_assert_eq(th_stack_produce(&stk, after), 0);
    long unique = th_stack_expect_unique(&stk);

    member_keeps_lost_partitions_paused("m2", 200);

    for (int p = 0; p < 2; p++) {
        char topic[32], to[32];
        snprintf(topic, sizeof(topic), "payments:%d", p);
        snprintf(to, sizeof(to), "%" PRId64, kafka[p]);
        const char *reset[] = {"--topic", topic,       "--to-offset",
                               to,        "--execute", NULL};
        char *out = NULL, *err = NULL;
        cr_assert_eq(offsets_cmd("reset", reset, &out, &err), 0, "%s", err);
        free(out);
        free(err);
    }
    pid_t m = th_stack_member(&stk, "m3", NULL);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 90000);
    wait_no_lag(60000);
    cr_expect_eq(th_stack_applied(&stk), unique);
    cr_expect_eq(th_stack_log_count(&stk, "m3", lost_said), 0);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
    unsetenv("IDEMPROC_REDIS_URL");
}

/* An upgrade from a version that committed without metadata (or a group
 * moved by kafka-consumer-groups), with no position in Redis: Kafka's
 * offset is used as before, nothing is called lost. */
Test(offsets, offset_without_our_metadata_and_no_position_starts_at_kafka,
     .timeout = 240)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *old[] = {"--count", "300", "--seed", "2123", NULL};
    cr_assert_eq(th_stack_produce(&stk, old), 0);
    json_t *doc = show_json();
    for (int p = 0; p < 2; p++)
        foreign_commit(p, (int64_t)json_integer_value(json_object_get(
                              json_array_get(json_object_get(doc, "partitions"),
                                             (size_t)p),
                              "high")));
    json_decref(doc);
    char *out = NULL, *err = NULL;
    cr_assert_eq(offsets_cmd("show", NULL, &out, &err), 0, "%s", err);
    cr_expect(!strstr(out, " lost "), "%s", out);
    cr_expect(strstr(out, " kafka "), "%s", out);
    free(out);
    free(err);
    const char *fresh[] = {"--count", "200", "--seed", "2124", NULL};
    cr_assert_eq(th_stack_produce(&stk, fresh), 0);
    long unique = th_stack_expect_unique(&stk);
    int port;
    pid_t m = member_http("m1", &port);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 90000);
    cr_expect_eq(th_stack_applied(&stk), unique);
    cr_expect_eq(th_http_get(port, "/readyz", NULL), 200);
    cr_expect_eq(member_metric(port, "idemproc_redis_position_behind_total"),
                 0);
    cr_expect_eq(th_stack_log_count(&stk, "m1", lost_said), 0);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* The same loss found later: the member is assigned its partitions while
 * Redis is down (their positions cannot be read then), and Redis comes back
 * empty. The first look at the positions finds none where a member
 * committed: lost, paused, not ready, nothing applied. */
Test(offsets, partitions_assigned_while_redis_is_down_are_judged_lost_later,
     .timeout = 300)
{
    stack_read_by_m1("300", "2125");
    const char *flush[] = {"FLUSHALL", NULL};
    th_redis_ok(&stk.redis, flush);
    cr_assert_eq(th_redis_kill(&stk.redis), 0);
    const char *after[] = {"--count", "200", "--seed", "2126", NULL};
    cr_assert_eq(th_stack_produce(&stk, after), 0);
    int port;
    pid_t m = member_http("m2", &port);
    const char *assigned = "partitions assigned";
    wait_said("m2", assigned, 1);
    cr_assert_eq(th_stack_log_count(&stk, "m2", assigned), 1);
    cr_expect_eq(th_stack_log_count(&stk, "m2", lost_said), 0);
    cr_assert_eq(th_redis_restart(&stk.redis), 0);
    wait_said("m2", lost_said, 2);
    cr_expect_eq(th_stack_log_count(&stk, "m2", lost_said), 2);
    /* The reason follows the log line (see above). */
    char *body = NULL;
    cr_expect_eq(th_wait_unready(port, "redis lost its state of payments [",
                                 10000, &body),
                 503);
    cr_expect(body && strstr(body, "redis lost its state of payments ["), "%s",
              body ? body : "");
    free(body);
    sleep(3);
    cr_expect_eq(th_stack_applied(&stk), 0);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}
