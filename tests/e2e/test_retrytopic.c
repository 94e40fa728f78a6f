/* test_retrytopic (e2e): members with a webhook handler whose service fails
 * some records a few times: each effect once, the partition never
 * blocked, the last tier dead-lettered as max-retries, and a member killed
 * while records wait in a retry topic. */
#include "conf/conf.h"
#include "harness.h"
#include "hooksrv.h"
#include "kafka/retrytopic.h"
#include "base/util.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

Test(retrytopic, check_config_lists_the_retry_topics)
{
    char *dir = th_tmpdir();
    char path[512];
    snprintf(path, sizeof(path), "%s/c.properties", dir);
    cr_assert_eq(th_write_file(path, "kafka.bootstrap.servers=127.0.0.1:1\n"
                                     "group.id=g\n"
                                     "input.topics=a,b\n"
                                     "dlq.topic=dlq\n"
                                     "retry.topics=500ms,1m\n"),
                 0);
    char *argv[] = {(char *)th_bin(), "check-config", "-c", path, NULL};
    char *out = NULL;
    cr_assert_eq(th_run(argv, &out, NULL, 20000), 0);
    cr_expect(strstr(out, "retry.topics=500ms,1m\n"), "%s", out);
    cr_expect(strstr(out, "check-config: retry topic a.retry.500ms (tier 1 "
                          "of 2: 500ms)\n"),
              "%s", out);
    cr_expect(strstr(out, "check-config: retry topic a.retry.1m (tier 2 of "
                          "2: 1m)\n"),
              "%s", out);
    cr_expect(strstr(out, "check-config: retry topic b.retry.500ms"), "%s",
              out);
    cr_expect(strstr(out, "check-config: retry topic b.retry.1m"), "%s", out);
    free(out);
    th_rmrf(dir);
    free(dir);
}

/* ------------------------------------------------ members through the loop */

static th_hook_t *srv;
static th_stack_t stk; /* static: .fini stops it after a failed assertion */

static void run_fini(void)
{
    th_hook_stop(srv);
    srv = NULL;
    th_stack_cleanup();
}

TestSuite(retrytopic_run, .fini = run_fini, .timeout = 240);

#define LINE(fp, ...) fprintf((fp), __VA_ARGS__), fputc('\n', (fp))

static double member_metric(int port, const char *series)
{
    char *body = NULL;
    if (th_http_get(port, "/metrics", &body) != 200) {
        free(body);
        return -1;
    }
    double v = th_metric(body, series);
    free(body);
    return v;
}

static double outcomes(int port)
{
    double p = member_metric(port, "idemproc_records_total{outcome="
                                   "\"processed\"}");
    double d = member_metric(port, "idemproc_records_total{outcome="
                                   "\"duplicate\"}");
    double q = member_metric(port, "idemproc_records_total{outcome=\"dlq\"}");
    return p < 0 || d < 0 || q < 0 ? -1 : p + d + q;
}

/* Waits until the member's outcomes sum to at least n. */
static int wait_outcomes(int port, double n, int timeout_ms)
{
    int64_t end = idem_now_ms() + timeout_ms;
    while (idem_now_ms() < end) {
        if (outcomes(port) >= n)
            return 0;
        usleep(100 * 1000);
    }
    return -1;
}

static pid_t start_member(const char *name, int port)
{
    char listen[64], url[128];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    snprintf(url, sizeof(url), "webhook.url=%s", th_hook_url(srv));
    const char *sets[] = {"handler=webhook", url, listen, "dedup.lease.ms=2000",
                          NULL};
    return th_stack_member(&stk, name, sets);
}

static const char *hdr(const th_rec_t *r, const char *name)
{
    return json_string_value(json_object_get(r->headers, name));
}

/* Index of the n-th (0-based) request with Idempotency-Key key in q[],
 * or -1. */
static long req_index(const th_hook_req_t *q, size_t cnt, const char *key,
                      int n)
{
    for (size_t i = 0; i < cnt; i++)
        if (q[i].key && !strcmp(q[i].key, key) && n-- == 0)
            return (long)i;
    return -1;
}

/* The input record of key `key` in `in` (asserts it is there). */
static const th_rec_t *input_of(const th_recs_t *in, const char *key)
{
    for (size_t i = 0; i < in->n; i++)
        if (in->v[i].key && !strcmp(in->v[i].key, key))
            return &in->v[i];
    cr_assert_fail("no input record with key %s", key);
    return NULL;
}

/* One input partition, so "never blocked" is visible: records after a
 * failing one finish before its first retry. r-3 fails once, r-7 twice
 * (each then succeeds in a retry topic); r-11 always fails: two retry
 * tiers, then the DLQ as max-retries. */
Test(retrytopic_run, failures_retry_in_tiers_without_blocking_the_partition)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    th_hook_rule_body(srv, "\"down\":true",
                      (th_hook_reply_t){500, 0, NULL, "down"});
    th_hook_script(srv, "r-3", (th_hook_reply_t){503, 0, NULL, "busy"});
    th_hook_script(srv, "r-7", (th_hook_reply_t){503, 0, NULL, "busy"});
    th_hook_script(srv, "r-7", (th_hook_reply_t){429, 0, NULL, "slow down"});
    const char *topics[] = {"payments.retry.500ms:2", "payments.retry.1s:2",
                            NULL};
    const char *props[] = {"retry.topics=500ms,1s", NULL};
    cr_assert_eq(th_stack_start_topics(&stk, 1, topics, props), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    const int keys = 40;
    for (int i = 0; i < keys; i++)
        LINE(fp,
             "{\"idempotency_key\":\"r-%d\",\"message_id\":\"m-%d\","
             "\"order_id\":\"r-%d\"%s}",
             i, i, i, i == 11 ? ",\"down\":true" : "");
    fclose(fp);
    const char *args[] = {"--input", path, "--key-field", "order_id", NULL};
    cr_assert_eq(th_stack_produce(&stk, args), 0);

    int port = th_free_port();
    pid_t m = start_member("t1", port);
    cr_assert_eq(wait_outcomes(port, keys, 60000), 0,
                 "the member did not finish every record (%g)", outcomes(port));
    /* Each key's effect once; the failing ones as often as scripted. */
    size_t acks;
    cr_assert_eq(th_hook_keys_acked(srv, "r-", &acks), (size_t)keys - 1);
    cr_assert_eq(acks, (size_t)keys - 1, "an effect was applied twice");
    cr_expect_eq(th_hook_count_key(srv, "r-3", 0), 2, "503, then 200");
    cr_expect_eq(th_hook_count_key(srv, "r-7", 0), 3, "503, 429, 200");
    cr_expect_eq(th_hook_count_key(srv, "r-11", 0), 3, "input and 2 tiers");
    cr_expect_eq(th_hook_count_key(srv, "r-11", 1), 0);

    /* Never blocked: every later record of the partition was acknowledged
     * before the failing ones were tried again. */
    size_t cnt;
    th_hook_req_t *q = th_hook_requests(srv, &cnt);
    long again3 = req_index(q, cnt, "r-3", 1);
    long again11 = req_index(q, cnt, "r-11", 1);
    cr_assert(again3 > 0 && again11 > 0);
    for (int i = 12; i < keys; i++) {
        char key[16];
        snprintf(key, sizeof(key), "r-%d", i);
        long first = req_index(q, cnt, key, 0);
        cr_expect(first >= 0 && first < again3 && first < again11,
                  "%s (request %ld) waited for r-3's retry (%ld)", key, first,
                  again3);
    }
    th_hook_requests_free(q, cnt);

    /* What the retry topics hold: copies with the original coordinates. */
    th_recs_t in = th_topic_read(stk.broker.bootstrap, "payments");
    th_recs_t t1 = th_topic_read(stk.broker.bootstrap, "payments.retry.500ms");
    th_recs_t t2 = th_topic_read(stk.broker.bootstrap, "payments.retry.1s");
    cr_assert_eq(t1.n, 3, "r-3, r-7, r-11 in the first tier: %zu", t1.n);
    cr_assert_eq(t2.n, 2, "r-7, r-11 in the second tier: %zu", t2.n);
    for (size_t i = 0; i < t1.n + t2.n; i++) {
        const th_rec_t *r = i < t1.n ? &t1.v[i] : &t2.v[i - t1.n];
        const th_rec_t *o = input_of(&in, r->key);
        cr_expect_str_eq(r->value, o->value, "value unchanged");
        cr_expect_str_eq(hdr(r, "retry.attempt"), i < t1.n ? "1" : "2");
        cr_expect_str_eq(hdr(r, "retry.original.topic"), "payments");
        cr_expect_eq(atoi(hdr(r, "retry.original.partition")), o->partition);
        cr_expect_eq(atoll(hdr(r, "retry.original.offset")), o->offset);
        cr_expect(strstr(hdr(r, "retry.error"), "HTTP 5") ||
                      strstr(hdr(r, "retry.error"), "HTTP 429"),
                  "%s", hdr(r, "retry.error"));
        /* Due a tier's delay after the failure, so after the original was
         * written plus that delay. */
        long long due = atoll(hdr(r, "retry.due.at"));
        long long ts = atoll(hdr(r, "retry.original.timestamp"));
        cr_expect_geq(due, ts + (i < t1.n ? 500 : 1000), "%s", r->key);
        cr_assert(hdr(o, "message_id"));
        cr_expect_str_eq(hdr(r, "message_id"), hdr(o, "message_id"),
                         "the message id stays");
    }
    /* The last tier's failure: one dead letter, the first input record's
     * coordinates, every attempt counted, no retry.* left. */
    th_recs_t dlq = th_topic_read(stk.broker.bootstrap, "payments.dlq");
    cr_assert_eq(dlq.n, 1);
    const th_rec_t *d = &dlq.v[0];
    const th_rec_t *o11 = input_of(&in, "r-11");
    cr_expect_str_eq(d->key, "r-11");
    cr_expect_str_eq(hdr(d, "dlq.reason"), "max-retries");
    cr_expect(strstr(hdr(d, "dlq.error"), "HTTP 500: down"), "%s",
              hdr(d, "dlq.error"));
    cr_expect_str_eq(hdr(d, "dlq.original.topic"), "payments");
    cr_expect_eq(atoll(hdr(d, "dlq.original.offset")), o11->offset);
    cr_expect_eq(atoi(hdr(d, "dlq.original.partition")), o11->partition);
    cr_expect_str_eq(hdr(d, "dlq.attempts"), "3");
    cr_expect_null(hdr(d, "retry.attempt"));
    cr_expect_null(hdr(d, "retry.original.topic"));
    th_recs_free(&dlq);
    th_recs_free(&t1);
    th_recs_free(&t2);
    th_recs_free(&in);

    /* Outcomes count each record once (a hop to a retry topic is none). */
    cr_expect_eq(member_metric(port, "idemproc_records_total{outcome="
                                     "\"processed\"}"),
                 keys - 1);
    cr_expect_eq(member_metric(port, "idemproc_records_total{outcome="
                                     "\"dlq\"}"),
                 1);
    cr_expect_eq(member_metric(port, "idemproc_retry_topic_records_total{"
                                     "tier=\"500ms\"}"),
                 3);
    cr_expect_eq(member_metric(port, "idemproc_retry_topic_records_total{"
                                     "tier=\"1s\"}"),
                 2);
    cr_expect_eq(member_metric(port, "idemproc_dlq_records_total{reason="
                                     "\"max-retries\"}"),
                 1);
    cr_expect_geq(member_metric(port, "idemproc_retry_partitions_waiting"), 0);
    cr_assert_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Records wait in a retry topic when the member dies (kill -9); its
 * successor (same member id) finds them there and applies each once. */
Test(retrytopic_run, sigkill_while_records_wait_in_a_retry_topic)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    const char *topics[] = {"payments.retry.3s:2", "payments.retry.4s:2", NULL};
    const char *props[] = {"retry.topics=3s,4s", NULL};
    cr_assert_eq(th_stack_start_topics(&stk, 2, topics, props), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    const int keys = 200, flaky = 20;
    for (int i = 0; i < keys; i++) {
        LINE(fp, "{\"idempotency_key\":\"s-%d\",\"order_id\":\"s-%d\"}", i, i);
        if (i % (keys / flaky) == 0) {
            char key[16];
            snprintf(key, sizeof(key), "s-%d", i);
            th_hook_script(srv, key, (th_hook_reply_t){503, 0, NULL, "busy"});
        }
    }
    fclose(fp);
    const char *args[] = {"--input", path, "--key-field", "order_id", NULL};
    cr_assert_eq(th_stack_produce(&stk, args), 0);

    int port = th_free_port();
    pid_t m1 = start_member("k1", port);
    /* Every record handled (the others marked done, the flaky ones copied
     * to the first tier) before any copy is due. */
    int64_t end = idem_now_ms() + 60000;
    while (idem_now_ms() < end &&
           (member_metric(port, "idemproc_records_total{outcome="
                                "\"processed\"}") < keys - flaky ||
            th_topic_size(stk.broker.bootstrap, "payments.retry.3s") < flaky))
        usleep(50 * 1000);
    cr_assert_eq(th_topic_size(stk.broker.bootstrap, "payments.retry.3s"),
                 flaky);
    kill(m1, SIGKILL);
    th_wait(m1, 10000);
    cr_assert_lt(th_hook_keys_acked(srv, "s-", NULL), (size_t)keys,
                 "the kill came after the retries");

    pid_t m2 = start_member("k1", th_free_port());
    end = idem_now_ms() + 90000;
    while (idem_now_ms() < end &&
           th_hook_keys_acked(srv, "s-", NULL) < (size_t)keys)
        usleep(100 * 1000);
    size_t acks;
    cr_assert_eq(th_hook_keys_acked(srv, "s-", &acks), (size_t)keys);
    /* The kill came with nothing in flight: exactly once, each. */
    cr_expect_eq(acks, (size_t)keys, "%zu acknowledgements for %d keys", acks,
                 keys);
    for (int i = 0; i < keys; i += keys / flaky) {
        char key[16];
        snprintf(key, sizeof(key), "s-%d", i);
        cr_expect_eq(th_hook_count_key(srv, key, 1), 1, "%s", key);
    }
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 0);
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.retry.4s"), 0,
                 "no second failure");
    cr_assert_eq(th_stop(m2, 15000), 0);
    th_stack_stop(&stk);
}

/* A copy waiting long in a retry topic must not stall the rest of the
 * member: here the handler is slow (one request at a time), so the hands
 * fill up and input pauses for a while; the records in hand must still be
 * worked on while the copy waits for its 8 s. */
Test(retrytopic_run, full_hands_do_not_wait_for_a_retry_copy)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200, .delay_ms = 20}, 1);
    cr_assert(srv);
    th_hook_script(srv, "h-0", (th_hook_reply_t){503, 0, NULL, "busy"});
    const char *topics[] = {"payments.retry.8s:1", NULL};
    const char *props[] = {"retry.topics=8s", "batch.max.messages=2",
                           "webhook.max.inflight=1", NULL};
    cr_assert_eq(th_stack_start_topics(&stk, 1, topics, props), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    const int keys = 150;
    for (int i = 0; i < keys; i++)
        LINE(fp, "{\"idempotency_key\":\"h-%d\",\"order_id\":\"h-%d\"}", i, i);
    fclose(fp);
    const char *args[] = {"--input", path, "--key-field", "order_id", NULL};
    cr_assert_eq(th_stack_produce(&stk, args), 0);
    int port = th_free_port();
    pid_t m = start_member("f1", port);
    int64_t end = idem_now_ms() + 90000;
    while (idem_now_ms() < end &&
           th_hook_keys_acked(srv, "h-", NULL) < (size_t)keys)
        usleep(100 * 1000);
    cr_assert_eq(th_hook_keys_acked(srv, "h-", NULL), (size_t)keys);
    size_t cnt;
    th_hook_req_t *q = th_hook_requests(srv, &cnt);
    long again = req_index(q, cnt, "h-0", 1);
    cr_assert_gt(again, 0);
    for (int i = 1; i < keys; i++) {
        char key[16];
        snprintf(key, sizeof(key), "h-%d", i);
        long first = req_index(q, cnt, key, 0);
        cr_expect(first >= 0 && first < again,
                  "%s (request %ld) waited for h-0's retry (%ld)", key, first,
                  again);
    }
    th_hook_requests_free(q, cnt);
    cr_assert_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Writes {"idempotency_key":"<prefix>-i","order_id":"<prefix>-i"} keyed
 * "<prefix>-i" to partition i % partitions of payments: not where the key
 * hashes, as a producer with its own partitioner would. */
static void produce_to_partitions(const char *prefix, int count, int partitions)
{
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    for (int i = 0; i < count; i++) {
        char key[32], value[128];
        snprintf(key, sizeof(key), "%s-%d", prefix, i);
        snprintf(value, sizeof(value),
                 "{\"idempotency_key\":\"%s\",\"order_id\":\"%s\"}", key, key);
        cr_assert_eq(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("payments"),
                                       RD_KAFKA_V_PARTITION(i % partitions),
                                       RD_KAFKA_V_KEY(key, strlen(key)),
                                       RD_KAFKA_V_VALUE(value, strlen(value)),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                       RD_KAFKA_V_END),
                     0);
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    rd_kafka_destroy(rk);
}

/* A copy goes to the partition number its record was read from, not
 * where its key hashes: the input's records are written to partitions
 * their keys do not hash to, and the retry topics have more partitions
 * than the input (allowed), so hashing would scatter the copies. Each
 * key's effect still once. */
Test(retrytopic_run, copies_keep_the_partition_number_of_their_record)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    /* One key in ten fails (more would trip the webhook's breaker, an
     * outage retried in place), a third of them twice; in both input
     * partitions. */
    const int keys = 120, flaky = 12, twice = 4;
    for (int i = 0; i < flaky; i++) {
        char key[16];
        snprintf(key, sizeof(key), "c-%d", i * 10 + i % 2);
        th_hook_script(srv, key, (th_hook_reply_t){503, 0, NULL, "busy"});
        if (i % 3 == 0)
            th_hook_script(srv, key, (th_hook_reply_t){503, 0, NULL, "busy"});
    }
    const char *topics[] = {"payments.retry.200ms:5", "payments.retry.400ms:3",
                            NULL};
    const char *props[] = {"retry.topics=200ms,400ms", NULL};
    cr_assert_eq(th_stack_start_topics(&stk, 2, topics, props), 0);
    produce_to_partitions("c", keys, 2);
    int port = th_free_port();
    pid_t m = start_member("p1", port);
    int64_t end = idem_now_ms() + 60000;
    while (idem_now_ms() < end &&
           th_hook_keys_acked(srv, "c-", NULL) < (size_t)keys)
        usleep(100 * 1000);
    size_t acks;
    cr_assert_eq(th_hook_keys_acked(srv, "c-", &acks), (size_t)keys);
    cr_expect_eq(acks, (size_t)keys, "an effect was applied twice");

    th_recs_t in = th_topic_read(stk.broker.bootstrap, "payments");
    th_recs_t t1 = th_topic_read(stk.broker.bootstrap, "payments.retry.200ms");
    th_recs_t t2 = th_topic_read(stk.broker.bootstrap, "payments.retry.400ms");
    cr_assert_eq(t1.n, (size_t)flaky);
    cr_assert_eq(t2.n, (size_t)twice, "%zu in the second tier", t2.n);
    for (size_t i = 0; i < t1.n + t2.n; i++) {
        const th_rec_t *r = i < t1.n ? &t1.v[i] : &t2.v[i - t1.n];
        const th_rec_t *o = input_of(&in, r->key);
        cr_expect_eq(o->partition, atoi(r->key + 2) % 2, "%s", r->key);
        cr_expect_eq(atoi(hdr(r, "retry.original.partition")), o->partition);
        cr_expect_eq(r->partition, o->partition,
                     "%s: copy in partition %d, its record in %d", r->key,
                     (int)r->partition, (int)o->partition);
    }
    th_recs_free(&t1);
    th_recs_free(&t2);
    th_recs_free(&in);
    cr_assert_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* A retry topic with fewer partitions than its input could not take a
 * copy at its record's partition number: the member refuses to start and
 * check-config --connect fails, both naming the two counts. */
Test(retrytopic_run, a_retry_topic_with_fewer_partitions_is_refused)
{
    const char *topics[] = {"payments.retry.1s:4", "payments.retry.1m:2", NULL};
    const char *props[] = {"retry.topics=1s,1m", NULL};
    cr_assert_eq(th_stack_start_topics(&stk, 4, topics, props), 0);
    const char *why = "retry topic payments.retry.1m has 2 partitions, input "
                      "topic payments has 4";
    pid_t m = th_stack_member(&stk, "r1", NULL);
    int rc = th_wait(m, 60000);
    cr_assert_neq(rc, -1, "the member did not stop");
    cr_expect_neq(rc, 0);
    char *log = th_stack_member_log(&stk, "r1");
    cr_expect(strstr(log, why), "%s", log);
    free(log);

    char *argv[] = {
        (char *)th_bin(), "check-config", "--connect", "-c", stk.conf, NULL};
    char *out = NULL, *err = NULL;
    cr_expect_neq(th_run(argv, &out, &err, 60000), 0, "%s", out);
    cr_expect(strstr(err, why), "%s", err);
    cr_expect(strstr(out, "check-config: kafka: retry topic payments.retry.1m: "
                          "2 partitions\n"),
              "%s", out);
    free(out);
    free(err);
    th_stack_stop(&stk);
}
