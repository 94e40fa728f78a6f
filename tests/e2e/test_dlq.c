/* test_dlq (e2e): `idemproc dlq stats|inspect|replay` against the embedded
 * broker and a real Redis: every reason and a retention gap, replay after
 * a fix with the ledger exact, replays counted across trips and refused
 * past dlq.replay.max. */
#include "kafka/dlq.h"
#include "harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static th_stack_t stk;

TestSuite(dlq, .fini = th_stack_cleanup);

/* Runs `idemproc dlq <verb> -c <conf>` plus args; returns the exit code,
 * stdout and stderr in *out / *err (may be NULL; caller frees). */
static int dlq_cmd(const char *verb, const char *const args[], char **out,
                   char **err)
{
    char *argv[64] = {(char *)th_bin(), "dlq", (char *)verb, "-c", stk.conf};
    int n = 5;
    for (int i = 0; args && args[i] && n < 63; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    return th_run(argv, out, err, 60000);
}

/* `dlq stats --json` as an object (caller decrefs). */
static json_t *stats(const char *const extra[])
{
    const char *args[16] = {"--json"};
    for (int i = 0; extra && extra[i] && i < 14; i++)
        args[i + 1] = extra[i];
    char *out = NULL, *err = NULL;
    int rc = dlq_cmd("stats", args, &out, &err);
    cr_assert_eq(rc, 0, "dlq stats: %s", err);
    json_error_t e;
    json_t *o = json_loads(out, 0, &e);
    cr_assert(o, "%s: %s", out, e.text);
    free(out);
    free(err);
    return o;
}

static long written(void)
{
    json_t *o = stats(NULL);
    long n = (long)json_integer_value(json_object_get(o, "written"));
    json_decref(o);
    return n;
}

/* Waits until the DLQ holds at least n dead letters. */
static long wait_written(long n, int timeout_ms)
{
    long w = 0;
    for (int t = 0; t < timeout_ms && (w = written()) < n; t += 200)
        usleep(200000);
    return w;
}

static long count_lines(const char *s)
{
    long n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

static long expect_poison(const char *reason)
{
    json_t *e = json_load_file(stk.expect, 0, NULL);
    cr_assert(e);
    long n = (long)json_integer_value(
        json_object_get(json_object_get(e, "poison"), reason));
    json_decref(e);
    return n;
}

/* Writes `count` dead letters of `bytes` bytes each straight into DLQ
 * partition 1, as a member would with reason max-retries (the ledger
 * handler has no retriable errors, so no member can write this reason
 * here); more than the mock cluster keeps per partition (~5 MiB), so the
 * partition's earliest offset moves above 0. */
static void fill_dlq_partition(int count, size_t bytes)
{
    const char *big[] = {"message.max.bytes=1000000", NULL};
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, big);
    char *value = malloc(bytes);
    memset(value, 'x', bytes);
    for (int i = 0; i < count; i++) {
        rd_kafka_headers_t *h = rd_kafka_headers_new(8);
        char off[32];
        snprintf(off, sizeof(off), "%d", 100000 + i);
        rd_kafka_header_add(h, "dlq.reason", -1, "max-retries", -1);
        rd_kafka_header_add(h, "dlq.error", -1, "output write refused", -1);
        rd_kafka_header_add(h, "dlq.original.topic", -1, "payments", -1);
        rd_kafka_header_add(h, "dlq.original.partition", -1, "0", -1);
        rd_kafka_header_add(h, "dlq.original.offset", -1, off, -1);
        rd_kafka_header_add(h, "dlq.failed.at", -1, "2026-01-01T00:00:00.000Z",
                            -1);
        cr_assert_eq(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("payments.dlq"),
                                       RD_KAFKA_V_PARTITION(1),
                                       RD_KAFKA_V_VALUE(value, bytes),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                       RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END),
                     0);
        rd_kafka_poll(rk, 0);
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    free(value);
    rd_kafka_destroy(rk);
}

/* Whether the member's group committed every partition of `payments` to
 * its end (so every record, replays included, has its outcome). */
static int input_committed_to_end(void)
{
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", stk.broker.bootstrap, err,
                      sizeof(err));
    rd_kafka_conf_set(kc, "group.id", "test-group", err, sizeof(err));
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
    cr_assert(rk, "%s", err);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(2);
    rd_kafka_topic_partition_list_add(l, "payments", 0);
    rd_kafka_topic_partition_list_add(l, "payments", 1);
    int done = rd_kafka_committed(rk, l, 10000) == 0;
    for (int i = 0; done && i < l->cnt; i++) {
        int64_t lo, hi;
        done = rd_kafka_query_watermark_offsets(rk, "payments", i, &lo, &hi,
                                                10000) == 0 &&
               l->elems[i].offset >= hi;
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return done;
}

static void wait_input_done(void)
{
    for (int t = 0; t < 600 && !input_committed_to_end(); t++)
        usleep(100000);
    cr_assert(input_committed_to_end(), "member never finished the input");
}

/* Stats and inspect on an empty DLQ, then on one with every reason and a
 * partition whose earliest records retention removed. */
Test(dlq, stats_and_inspect_every_reason_and_a_retention_gap, .timeout = 180)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    char *out = NULL, *err = NULL;
    cr_assert_eq(dlq_cmd("stats", NULL, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "dlq payments.dlq is empty: no dead letters in its "
                          "2 partitions"),
              "%s", out);
    free(out);
    free(err);
    cr_assert_eq(dlq_cmd("inspect", NULL, &out, &err), 0, "%s", err);
    cr_expect_str_eq(out, "");
    cr_expect(strstr(err, "payments.dlq is empty"), "%s", err);
    free(out);
    free(err);

    /* 60 x 100 KB: the mock cluster drops the oldest beyond ~5 MiB. */
    fill_dlq_partition(60, 100000);
    /* Balances of user-1 near the limit: its increments overflow. */
    const char *full[] = {"HSET", "idemproc:ledger:EUR", "user-1",
                          "9223372036854775000", NULL};
    free(th_redis_cli(&stk.redis, full));
    const char *traffic[] = {"--count", "400", "--poison",          "0.05",
                             "--users", "4",   "--currencies",      "EUR",
                             "--seed",  "12",  "--too-large-bytes", "5000",
                             NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    long parse_poison = 0;
    const char *parse_reasons[] = {"too-large", "not-json", "not-object",
                                   "no-identity", "invalid-field"};
    for (int i = 0; i < 5; i++)
        parse_poison += expect_poison(parse_reasons[i]);
    cr_assert_eq(parse_poison, 20);

    /* Wait for the member to dead-letter every parse failure and its
     * handler-rejected records (the latter's number is not known up front:
     * every valid user-1 record). */
    json_t *s = NULL;
    for (int t = 0; t < 600; t++) {
        json_decref(s);
        s = stats(NULL);
        json_t *by = json_object_get(s, "by_reason");
        long parsed = 0;
        for (int i = 0; i < 5; i++)
            parsed +=
                (long)json_integer_value(json_object_get(by, parse_reasons[i]));
        if (parsed == parse_poison &&
            json_integer_value(json_object_get(by, "handler-rejected")) > 0)
            break;
        usleep(100000);
    }
    /* Every input record finished (dead letters acknowledged): read again. */
    wait_input_done();
    json_decref(s);
    s = stats(NULL);
    json_t *by = json_object_get(s, "by_reason");
    for (int i = 0; i < 5; i++)
        cr_expect_eq(json_integer_value(json_object_get(by, parse_reasons[i])),
                     expect_poison(parse_reasons[i]), "%s", parse_reasons[i]);
    long rejected =
        (long)json_integer_value(json_object_get(by, "handler-rejected"));
    long max_retries =
        (long)json_integer_value(json_object_get(by, "max-retries"));
    cr_expect_gt(rejected, 0);
    cr_expect(max_retries > 0 && max_retries < 60, "%ld", max_retries);
    long gone = (long)json_integer_value(json_object_get(s, "gone"));
    cr_expect_eq(gone, 60 - max_retries, "gone %ld", gone);
    cr_expect_eq(json_integer_value(json_object_get(s, "written")),
                 parse_poison + rejected + max_retries);
    cr_expect_eq(json_integer_value(json_object_get(s, "distinct")),
                 parse_poison + rejected + max_retries);
    cr_expect_eq(json_integer_value(json_object_get(
                     json_object_get(s, "by_topic"), "payments")),
                 parse_poison + rejected + max_retries);
    cr_expect_eq(
        json_integer_value(json_object_get(
            json_array_get(json_object_get(s, "partitions"), 1), "low")),
        gone);
    json_decref(s);

    /* The table says the same, and names the gap. */
    char line[160];
    snprintf(line, sizeof(line),
             "partition 1 starts at offset %ld: %ld earlier dead letters are "
             "gone",
             gone, gone);
    cr_assert_eq(dlq_cmd("stats", NULL, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, line), "%s", out);
    cr_expect(strstr(out, "handler-rejected"), "%s", out);
    free(out);
    free(err);

    /* inspect: one JSON line per dead letter, the gap on stderr. */
    cr_assert_eq(dlq_cmd("inspect", NULL, &out, &err), 0, "%s", err);
    cr_expect_eq(count_lines(out), parse_poison + rejected + max_retries);
    cr_expect(strstr(err, line), "%s", err);
    free(out);
    free(err);
    /* --reason: the handler-rejected ones are user-1's, each with its
     * original coordinates and the member's error. */
    const char *rej[] = {"--reason", "handler-rejected", "--value", NULL};
    cr_assert_eq(dlq_cmd("inspect", rej, &out, &err), 0, "%s", err);
    cr_expect_eq(count_lines(out), rejected);
    char *save = NULL;
    for (char *l = strtok_r(out, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save)) {
        json_t *o = json_loads(l, 0, NULL);
        cr_assert(o, "%s", l);
        cr_expect_str_eq(json_string_value(json_object_get(o, "reason")),
                         "handler-rejected");
        cr_expect(strstr(json_string_value(json_object_get(o, "value")),
                         "\"user_id\":\"user-1\""),
                  "%s", l);
        cr_expect_str_eq(
            json_string_value(json_object_get(o, "original_topic")),
            "payments");
        cr_expect(json_integer_value(json_object_get(o, "original_offset")) >=
                  0);
        cr_expect_str_eq(json_string_value(json_object_get(o, "group")),
                         "test-group");
        cr_expect_not_null(json_object_get(o, "error"));
        json_decref(o);
    }
    free(out);
    free(err);
    /* --grep and --key select by value and key. */
    const char *grep[] = {"--grep", "\"user_id\":\"user-1\"", "--reason",
                          "handler-rejected", NULL};
    cr_assert_eq(dlq_cmd("inspect", grep, &out, &err), 0, "%s", err);
    cr_expect_eq(count_lines(out), rejected);
    json_t *first = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
    cr_assert(first);
    char key[128];
    snprintf(key, sizeof(key), "%s",
             json_string_value(json_object_get(first, "key")));
    json_decref(first);
    free(out);
    free(err);
    const char *bykey[] = {"--key", key, NULL};
    cr_assert_eq(dlq_cmd("inspect", bykey, &out, &err), 0, "%s", err);
    cr_expect_eq(count_lines(out), 1, "%s", out);
    cr_expect(strstr(out, key));
    free(out);
    free(err);
    /* --topic, --limit, --max-bytes */
    const char *lim[] = {"--topic",     "payments", "--limit", "3",
                         "--max-bytes", "10",       NULL};
    cr_assert_eq(dlq_cmd("inspect", lim, &out, &err), 0, "%s", err);
    cr_expect_eq(count_lines(out), 3);
    cr_expect(strstr(out, "\"value_truncated\":true"), "%s", out);
    free(out);
    free(err);
    const char *other[] = {"--topic", "orders", NULL};
    cr_assert_eq(dlq_cmd("inspect", other, &out, &err), 0, "%s", err);
    cr_expect_str_eq(out, "");
    free(out);
    free(err);
    /* --since/--until on dlq.failed.at: the member's dead letters are from
     * the last hour; the filler says 2026-01-01. */
    const char *recent[] = {"--since", "1h", NULL};
    cr_assert_eq(dlq_cmd("inspect", recent, &out, &err), 0, "%s", err);
    cr_expect_eq(count_lines(out), parse_poison + rejected);
    free(out);
    free(err);
    const char *old[] = {"--until", "2026-01-02T00:00:00Z", "--format", "text",
                         NULL};
    cr_assert_eq(dlq_cmd("inspect", old, &out, &err), 0, "%s", err);
    long text_recs = 0;
    for (char *p = out; (p = strstr(p, "payments.dlq/1/")); p++)
        text_recs++;
    cr_expect_eq(text_recs, max_retries, "%s", out);
    cr_expect(strstr(out, "  max-retries  2026-01-01T00:00:00.000Z"), "%s",
              out);
    free(out);
    free(err);
    /* --from-offset: only partition 1 has records that far. */
    char from[32];
    snprintf(from, sizeof(from), "%ld", gone + max_retries - 1);
    const char *tail[] = {"--from-offset", from, "--reason", "max-retries",
                          NULL};
    cr_assert_eq(dlq_cmd("inspect", tail, &out, &err), 0, "%s", err);
    cr_expect_eq(count_lines(out), 1, "%s", out);
    free(out);
    free(err);
    /* Bad input: one line naming the flag, exit 2. */
    const char *bad[] = {"--since", "yesterday", NULL};
    cr_expect_eq(dlq_cmd("inspect", bad, &out, &err), 2);
    cr_expect(strstr(err, "--since: \"yesterday\" is not a time"), "%s", err);
    free(out);
    free(err);
    const char *badr[] = {"--reason", "nope", NULL};
    cr_expect_eq(dlq_cmd("stats", badr, &out, &err), 2);
    cr_expect(strstr(err, "--reason: \"nope\" is not a reason"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

static long expect_num(const char *name)
{
    json_t *e = json_load_file(stk.expect, 0, NULL);
    cr_assert(e);
    long n = (long)json_integer_value(json_object_get(e, name));
    json_decref(e);
    return n;
}

/* Records rejected because the user's balance would overflow are fixable:
 * reset the balance, replay them, and the ledger is exact. Replaying them
 * all again applies nothing twice (dedup by their kept identities), and a
 * checkpointed run continues where the last one stopped. */
Test(dlq, replay_after_the_fix_applies_each_record_once, .timeout = 180)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *full[] = {"HSET", "idemproc:ledger:EUR", "user-1",
                          "9223372036854775000", NULL};
    free(th_redis_cli(&stk.redis, full));
    const char *few[] = {"--count",
                         "8",
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
    long sent = expect_num("sent"), applied = expect_num("applied");
    cr_assert(sent > applied && applied > 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(wait_written(sent, 60000), sent);
    json_t *s = stats(NULL);
    cr_expect_eq(json_integer_value(json_object_get(
                     json_object_get(s, "by_reason"), "handler-rejected")),
                 sent);
    json_decref(s);
    cr_expect_eq(th_stack_applied(&stk), 0);

    /* A dry run says what it would send and sends nothing. */
    char *out = NULL, *err = NULL;
    const char *dry[] = {"--dry-run", "--to", "payments.other", NULL};
    cr_assert_eq(dlq_cmd("replay", dry, &out, &err), 0, "%s", err);
    long would = 0;
    for (char *p = out; (p = strstr(p, "to payments.other as replay 1 of at "
                                       "most 3\n"));
         p++)
        would++;
    cr_expect_eq(would, sent, "%s", out);
    char summary[160];
    snprintf(summary, sizeof(summary),
             "replay: read %ld, matched %ld, would send %ld, acked 0, "
             "refused 0, failed 0\n",
             sent, sent, sent);
    cr_expect(strstr(out, summary), "%s", out);
    free(out);
    free(err);

    /* On a terminal (script(1) gives it one) a progress line goes to
     * stderr; piped, as above, none. */
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "%s dlq replay -c %s --dry-run", th_bin(),
             stk.conf);
    char *sargv[] = {"/usr/bin/script", "-qec", cmd, "/dev/null", NULL};
    cr_assert_eq(th_run(sargv, &out, NULL, 60000), 0);
    char progress[160];
    snprintf(progress, sizeof(progress),
             "\rreplay: read %ld, matched %ld, sent %ld, acked 0, refused 0, "
             "failed 0",
             sent, sent, sent);
    cr_expect(strstr(out, progress), "%s", out);
    free(out);
    cr_assert_eq(dlq_cmd("replay", dry, &out, &err), 0, "%s", err);
    cr_expect_null(strstr(err, "\rreplay:"), "%s", err);
    free(out);
    free(err);

    /* The fix, then the replay. */
    const char *fix[] = {"HDEL", "idemproc:ledger:EUR", "user-1", NULL};
    free(th_redis_cli(&stk.redis, fix));
    const char *cp[] = {"--reason", "handler-rejected", "--checkpoint", "cp",
                        NULL};
    cr_assert_eq(dlq_cmd("replay", cp, &out, &err), 0, "%s\n%s", out, err);
    snprintf(summary, sizeof(summary),
             "replay: read %ld, matched %ld, sent %ld, acked %ld, refused 0, "
             "failed 0\n",
             sent, sent, sent, sent);
    cr_expect(strstr(out, summary), "%s", out);
    free(out);
    free(err);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    wait_input_done();
    cr_expect_eq(th_stack_applied(&stk), applied);
    cr_expect_eq(written(), sent, "a replay was dead-lettered again");

    /* Everything again, without a checkpoint: all duplicates now. At 20
     * records a second, the sends take at least (sent - 1) / 20 s. */
    const char *slow[] = {"--rate", "20/s", NULL};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(dlq_cmd("replay", slow, &out, &err), 0, "%s", err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) +
                  (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_expect_geq(took, (double)(sent - 1) / 20.0, "%.3f s", took);
    cr_expect(strstr(out, summary), "%s", out);
    free(out);
    free(err);
    wait_input_done();
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    cr_expect_eq(th_stack_applied(&stk), applied);
    cr_expect_eq(written(), sent);

    /* The checkpoint remembers: nothing new for it. */
    cr_assert_eq(dlq_cmd("replay", cp, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "replay: read 0, matched 0, sent 0, acked 0, "
                          "refused 0, failed 0\n"),
              "%s", out);
    cr_expect(strstr(err, "nothing to read: every partition of payments.dlq "
                          "is read to its end by this checkpoint"),
              "%s", err);
    free(out);
    free(err);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Each line of kcat's '%h' output: the headers of one dead letter. */
static char *dlq_headers(void)
{
    char *argv[] = {"/usr/bin/kcat",
                    "-C",
                    "-b",
                    stk.broker.bootstrap,
                    "-t",
                    "payments.dlq",
                    "-e",
                    "-q",
                    "-f",
                    "%h\n",
                    "-X",
                    "fetch.wait.max.ms=10",
                    NULL};
    char *out = NULL;
    cr_assert_eq(th_run(argv, &out, NULL, 30000), 0);
    return out;
}

static long occurrences(const char *s, const char *what)
{
    long n = 0;
    for (const char *p = s; (p = strstr(p, what)); p++)
        n++;
    return n;
}

/* A record that keeps failing goes round at most dlq.replay.max times:
 * the member carries dlq.replay.count into each new dead letter, and the
 * next replay refuses it with a line saying why. */
Test(dlq, replay_counts_trips_and_refuses_past_replay_max, .timeout = 180)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *full[] = {"HSET", "idemproc:ledger:EUR", "user-1",
                          "9223372036854775000", NULL};
    free(th_redis_cli(&stk.redis, full));
    const char *one[] = {"--count", "1",      "--users", "1", "--currencies",
                         "EUR",     "--seed", "3",       NULL};
    cr_assert_eq(th_stack_produce(&stk, one), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(wait_written(1, 60000), 1);
    const char *cp[] = {"--checkpoint", "cp", "--set", "dlq.replay.max=2",
                        NULL};
    char *out = NULL, *err = NULL;
    for (long k = 1; k <= 2; k++) {
        cr_assert_eq(dlq_cmd("replay", cp, &out, &err), 0, "%s", err);
        cr_expect(strstr(out, "read 1, matched 1, sent 1, acked 1"), "%s", out);
        free(out);
        free(err);
        cr_assert_eq(wait_written(1 + k, 60000), 1 + k);
    }
    /* Three dead letters of one record: replay counts 0, 1, 2, each
     * pointing at the dead letter it was replayed from, each with one
     * dlq.reason (the member replaced the stale ones). */
    const char *all[] = {NULL};
    cr_assert_eq(dlq_cmd("inspect", all, &out, &err), 0, "%s", err);
    cr_expect_eq(count_lines(out), 3);
    cr_expect_eq(occurrences(out, "\"replay_count\":0,"), 1, "%s", out);
    cr_expect_eq(occurrences(out, "\"replay_count\":1,"), 1, "%s", out);
    cr_expect_eq(occurrences(out, "\"replay_count\":2,"), 1, "%s", out);
    cr_expect_eq(occurrences(out, "\"replayed_from\":\"payments.dlq/"), 2, "%s",
                 out);
    free(out);
    free(err);
    json_t *st = stats(NULL);
    cr_expect_eq(json_integer_value(json_object_get(st, "written")), 3);
    cr_expect_eq(json_integer_value(json_object_get(st, "replays")), 2);
    json_decref(st);
    cr_assert_eq(dlq_cmd("stats", NULL, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "3 dead letters, 3 distinct originals, 2 of them "
                          "replays that failed again\n"),
              "%s", out);
    free(out);
    free(err);
    char *h = dlq_headers();
    cr_expect_eq(count_lines(h), 3, "%s", h);
    cr_expect_eq(occurrences(h, "dlq.reason=handler-rejected"), 3, "%s", h);
    cr_expect_eq(occurrences(h, "dlq.replay.count="), 2, "%s", h);
    cr_expect_eq(occurrences(h, "dlq.failed.at="), 3, "%s", h);
    free(h);

    cr_assert_eq(dlq_cmd("replay", cp, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "refused payments.dlq/"), "%s", out);
    cr_expect(strstr(out, ": replayed 2 times already (dlq.replay.max=2): "
                          "fix the cause, or raise dlq.replay.max\n"),
              "%s", out);
    cr_expect(strstr(out, "replay: read 1, matched 1, sent 0, acked 0, "
                          "refused 1, failed 0\n"),
              "%s", out);
    free(out);
    free(err);
    /* Refused means moved past: the checkpoint does not offer it again. */
    cr_assert_eq(dlq_cmd("replay", cp, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "replay: read 0,"), "%s", out);
    free(out);
    free(err);
    usleep(1000000);
    cr_expect_eq(written(), 3);
    cr_expect_eq(th_stack_applied(&stk), 0);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* dlq.headers.format=spring: the member writes Spring's headers instead of
 * ours, they name the real original record, and `idemproc dlq` reads them. */
Test(dlq, spring_format_dead_letters_name_their_originals, .timeout = 120)
{
    const char *props[] = {"dlq.headers.format=spring", NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    const char *traffic[] = {"--count", "20", "--poison",          "0.25",
                             "--seed",  "5",  "--too-large-bytes", "5000",
                             NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(wait_written(5, 60000), 5);
    json_t *s = stats(NULL);
    json_t *by = json_object_get(s, "by_reason");
    const char *reasons[] = {"too-large", "not-json", "not-object",
                             "no-identity", "invalid-field"};
    for (int i = 0; i < 5; i++)
        cr_expect_eq(json_integer_value(json_object_get(by, reasons[i])), 1,
                     "%s", reasons[i]);
    cr_expect_eq(json_integer_value(json_object_get(s, "distinct")), 5);
    json_decref(s);
    char *h = dlq_headers();
    cr_expect_eq(occurrences(h, "dlq."), 0, "%s", h);
    cr_expect_eq(occurrences(h, "kafka_dlt-original-topic=payments"), 5, "%s",
                 h);
    cr_expect_eq(occurrences(h, "kafka_dlt-original-consumer-group=test-"
                                "group"),
                 5, "%s", h);
    cr_expect_eq(occurrences(h, "kafka_dlt-original-timestamp-type="
                                "CreateTime"),
                 5, "%s", h);
    free(h);

    /* The coordinates decoded from the binary headers hold the record. */
    const char *args[] = {"--value", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(dlq_cmd("inspect", args, &out, &err), 0, "%s", err);
    char *save = NULL;
    int checked = 0;
    for (char *l = strtok_r(out, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save)) {
        json_t *o = json_loads(l, 0, NULL);
        cr_assert(o, "%s", l);
        char p[16], off[32];
        snprintf(p, sizeof(p), "%" JSON_INTEGER_FORMAT,
                 json_integer_value(json_object_get(o, "original_partition")));
        snprintf(off, sizeof(off), "%" JSON_INTEGER_FORMAT,
                 json_integer_value(json_object_get(o, "original_offset")));
        char *argv[] = {"/usr/bin/kcat",
                        "-C",
                        "-b",
                        stk.broker.bootstrap,
                        "-t",
                        "payments",
                        "-p",
                        p,
                        "-o",
                        off,
                        "-c",
                        "1",
                        "-q",
                        "-f",
                        "%k",
                        "-X",
                        "fetch.wait.max.ms=10",
                        NULL};
        char *key = NULL;
        cr_assert_eq(th_run(argv, &key, NULL, 30000), 0);
        cr_expect_str_eq(key, json_string_value(json_object_get(o, "key")),
                         "%s", l);
        free(key);
        json_decref(o);
        checked++;
    }
    cr_expect_eq(checked, 5);
    free(out);
    free(err);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* A record that arrives with dead-letter headers already (a dead letter
 * copied back to the input by hand) gets each of ours once, with the new
 * values, not a second stale set that readers might take instead. */
Test(dlq, stale_dead_letter_headers_are_replaced, .timeout = 90)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.txt", stk.dir);
    cr_assert_eq(th_write_file(path, "not json at all\n"), 0);
    char *argv[] = {"/usr/bin/kcat",
                    "-P",
                    "-b",
                    stk.broker.bootstrap,
                    "-t",
                    "payments",
                    "-p",
                    "0",
                    "-H",
                    "dlq.reason=too-large",
                    "-H",
                    "dlq.original.offset=999",
                    "-H",
                    "dlq.replay.count=1",
                    "-H",
                    "kafka_dlt-original-topic=elsewhere",
                    path,
                    NULL};
    cr_assert_eq(th_run(argv, NULL, NULL, 30000), 0);
    pid_t m = th_stack_member(
        &stk, "m1", (const char *[]){"dlq.headers.format=both", NULL});
    cr_assert_eq(wait_written(1, 60000), 1);
    char *h = dlq_headers();
    cr_expect_eq(occurrences(h, "dlq.reason="), 1, "%s", h);
    cr_expect_eq(occurrences(h, "dlq.reason=not-json"), 1, "%s", h);
    cr_expect_eq(occurrences(h, "dlq.original.offset="), 1, "%s", h);
    cr_expect_eq(occurrences(h, "dlq.original.offset=0"), 1, "%s", h);
    cr_expect_eq(occurrences(h, "kafka_dlt-original-topic="), 1, "%s", h);
    cr_expect_eq(occurrences(h, "kafka_dlt-original-topic=payments"), 1, "%s",
                 h);
    cr_expect_eq(occurrences(h, "dlq.replay.count=1"), 1, "%s", h);
    free(h);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Writes one dead letter of `group` to payments.dlq as a member would,
 * with the original record's traceparent header. */
static void put_dead_letter(rd_kafka_t *rk, const char *group,
                            const char *value, const char *traceparent)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    rd_kafka_header_add(h, "traceparent", -1, traceparent, -1);
    rd_kafka_header_add(h, "dlq.reason", -1, "handler-rejected", -1);
    rd_kafka_header_add(h, "dlq.error", -1, "stock below zero", -1);
    rd_kafka_header_add(h, "dlq.original.topic", -1, "payments", -1);
    rd_kafka_header_add(h, "dlq.original.partition", -1, "0", -1);
    rd_kafka_header_add(h, "dlq.original.offset", -1, "7", -1);
    rd_kafka_header_add(h, "dlq.group", -1, group, -1);
    rd_kafka_header_add(h, "dlq.failed.at", -1, "2026-01-01T00:00:00.000Z", -1);
    cr_assert_eq(
        rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("payments.dlq"),
                          RD_KAFKA_V_PARTITION(0),
                          RD_KAFKA_V_VALUE((void *)value, strlen(value)),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                          RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END),
        0);
}

/* inspect shows each dead letter's identity (read by the config's
 * envelope.identity) and original headers; --group picks one group's
 * dead letters out of a DLQ shared by groups; a misspelt subcommand gets
 * a hint. */
Test(dlq, inspect_shows_identity_and_headers_and_filters_by_group,
     .timeout = 90)
{
    cr_assert_eq(th_stack_start(&stk, 1, NULL), 0);
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    put_dead_letter(rk, "orders-a", "{\"meta\":{\"event_id\":\"ev-1\"}}",
                    "00-aaaa-01");
    put_dead_letter(rk, "orders-b", "{\"meta\":{\"event_id\":\"ev-2\"}}",
                    "00-bbbb-01");
    put_dead_letter(rk, "orders-a", "{\"meta\":{}}", "00-cccc-01");
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    rd_kafka_destroy(rk);

    char *out = NULL, *errs = NULL;
    const char *args[] = {"--group", "orders-a", "--set",
                          "envelope.identity=value:/meta/event_id", NULL};
    cr_assert_eq(dlq_cmd("inspect", args, &out, &errs), 0, "%s", errs);
    cr_expect_eq(count_lines(out), 2, "%s", out);
    cr_expect(strstr(errs, "2 shown, 3 read"), "%s", errs);
    char *line2 = strchr(out, '\n');
    cr_assert(line2);
    *line2++ = '\0';
    json_t *a = json_loads(out, 0, NULL), *c = json_loads(line2, 0, NULL);
    cr_assert(a && c, "%s / %s", out, line2);
    cr_expect_str_eq(json_string_value(json_object_get(a, "group")),
                     "orders-a");
    cr_expect_str_eq(json_string_value(json_object_get(a, "identity")), "ev-1");
    json_t *h0 = json_array_get(json_object_get(a, "headers"), 0);
    cr_expect_str_eq(json_string_value(json_array_get(h0, 0)), "traceparent");
    cr_expect_str_eq(json_string_value(json_array_get(h0, 1)), "00-aaaa-01");
    cr_expect_eq(json_array_size(json_object_get(a, "headers")), 1,
                 "the dlq.* headers are shown decoded, not again");
    /* No identity: it says why, as the processor would. */
    cr_expect_null(json_object_get(c, "identity"));
    cr_expect(json_is_string(json_object_get(c, "identity_error")), "%s",
              line2);
    json_decref(a);
    json_decref(c);
    free(out);
    free(errs);

    const char *b[] = {"--group", "orders-b", NULL};
    json_t *s = stats(b);
    cr_expect_eq(json_integer_value(json_object_get(s, "written")), 1);
    json_decref(s);

    const char *none[] = {NULL};
    cr_expect_eq(dlq_cmd("stat", none, &out, &errs), 2);
    cr_expect(strstr(errs, "did you mean \"stats\""), "%s", errs);
    free(out);
    free(errs);
}

/* Writes one hand-made dead letter of payments (as a member would) keyed
 * `key`, whose dlq.original.partition is `partition`, to DLQ partition 0. */
static void put_letter_from(rd_kafka_t *rk, const char *key, int partition)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    char part[16];
    snprintf(part, sizeof(part), "%d", partition);
    rd_kafka_header_add(h, "dlq.reason", -1, "handler-rejected", -1);
    rd_kafka_header_add(h, "dlq.error", -1, "refused", -1);
    rd_kafka_header_add(h, "dlq.original.topic", -1, "payments", -1);
    rd_kafka_header_add(h, "dlq.original.partition", -1, part, -1);
    rd_kafka_header_add(h, "dlq.original.offset", -1, "7", -1);
    rd_kafka_header_add(h, "dlq.failed.at", -1, "2026-01-01T00:00:00.000Z", -1);
    cr_assert_eq(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("payments.dlq"),
                                   RD_KAFKA_V_PARTITION(0),
                                   RD_KAFKA_V_KEY((void *)key, strlen(key)),
                                   RD_KAFKA_V_VALUE((void *)key, strlen(key)),
                                   RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                   RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END),
                 0);
}

/* Each replay goes back to the partition number its record came from, not
 * where its key hashes; with --to, to the same partition number where the
 * target has it, else by key. A dead letter whose original partition is
 * gone (the topic created again with fewer) fails with the reason and
 * holds the checkpoint back. */
Test(dlq, replay_writes_each_dead_letter_to_its_original_partition,
     .timeout = 120)
{
    const char *topics[] = {"payments.other:2", NULL};
    cr_assert_eq(th_stack_start_topics(&stk, 4, topics, NULL), 0);
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    const int letters = 16;
    for (int i = 0; i < letters; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k-%d", i);
        put_letter_from(rk, key, i % 4);
    }
    put_letter_from(rk, "gone", 9);
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    rd_kafka_destroy(rk);

    char *out = NULL, *e = NULL;
    const char *dry[] = {"--dry-run", NULL};
    cr_expect_eq(dlq_cmd("replay", dry, &out, &e), 1, "%s", e);
    cr_expect(strstr(out, "to payments/3 as replay 1"), "%s", out);
    free(out);
    free(e);

    const char *cp[] = {"--checkpoint", "cp", NULL};
    cr_expect_eq(dlq_cmd("replay", cp, &out, &e), 1, "%s", e);
    cr_expect(strstr(e, "dlq.original.partition 9 is not a partition of "
                        "payments, which has 4"),
              "%s", e);
    char summary[160];
    snprintf(summary, sizeof(summary),
             "replay: read %d, matched %d, sent %d, acked %d, refused 0, "
             "failed 1\n",
             letters + 1, letters + 1, letters, letters);
    cr_expect(strstr(out, summary), "%s", out);
    free(out);
    free(e);
    th_recs_t in = th_topic_read(stk.broker.bootstrap, "payments");
    cr_assert_eq(in.n, (size_t)letters);
    for (size_t i = 0; i < in.n; i++)
        cr_expect_eq(in.v[i].partition, atoi(in.v[i].key + 2) % 4, "%s",
                     in.v[i].key);
    th_recs_free(&in);

    /* The failed one holds the checkpoint: offered again, and only it. */
    cr_expect_eq(dlq_cmd("replay", cp, &out, &e), 1, "%s", e);
    cr_expect(strstr(out, "replay: read 1, matched 1, sent 0"), "%s", out);
    free(out);
    free(e);

    const char *to[] = {"--to", "payments.other", NULL};
    cr_expect_eq(dlq_cmd("replay", to, &out, &e), 0, "%s", e);
    free(out);
    free(e);
    th_recs_t other = th_topic_read(stk.broker.bootstrap, "payments.other");
    cr_assert_eq(other.n, (size_t)letters + 1);
    for (size_t i = 0; i < other.n; i++) {
        int orig =
            strcmp(other.v[i].key, "gone") ? atoi(other.v[i].key + 2) % 4 : 9;
        if (orig < 2)
            cr_expect_eq(other.v[i].partition, orig, "%s", other.v[i].key);
    }
    th_recs_free(&other);
    th_stack_stop(&stk);
}

static int copy_reports, copy_errors;
static void copy_report(void *opaque, rd_kafka_resp_err_t err)
{
    (void)opaque;
    copy_reports++;
    copy_errors += err != 0;
}

/* A copy for a partition number its topic is known not to have (the
 * member's start check could not be made, or the topic was created again
 * with fewer partitions) goes where its key hashes instead of being
 * refused for ever, which would hold its partition as an outage. */
Test(dlq, a_copy_for_a_missing_partition_goes_where_its_key_hashes,
     .timeout = 60)
{
    const char *topics[] = {"short:1", NULL};
    cr_assert_eq(th_stack_start_topics(&stk, 2, topics, NULL), 0);
    char err[512];
    idem_conf_t *conf =
        idem_conf_load(stk.conf, NULL, NULL, 0, err, sizeof(err));
    cr_assert(conf, "%s", err);
    idem_dlq_t *d = idem_dlq_new(conf, copy_report, err, sizeof(err));
    cr_assert(d, "%s", err);
    rd_kafka_message_t m = {
        .key = "k-1", .key_len = 3, .payload = "v", .len = 1};
    /* The first write teaches the producer the topic's partitions. */
    cr_assert_eq(idem_dlq_send_to(d, "short", 0, &m, rd_kafka_headers_new(1),
                                  NULL, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(idem_dlq_flush(d, 10000), 0);
    cr_assert_eq(idem_dlq_send_to(d, "short", 3, &m, rd_kafka_headers_new(1),
                                  NULL, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(idem_dlq_flush(d, 10000), 0);
    cr_expect_eq(copy_reports, 2);
    cr_expect_eq(copy_errors, 0);
    idem_dlq_destroy(d);
    idem_conf_destroy(conf);
    th_recs_t t = th_topic_read(stk.broker.bootstrap, "short");
    cr_expect_eq(t.n, 2);
    th_recs_free(&t);
    th_stack_stop(&stk);
}
