/* test_webhook (e2e): members with handler=webhook: duplicates, poison and
 * retries end exact, SIGKILL mid-stream, bytes values, leases in the
 * queue. */
#include "effect/handler.h"
#include "harness.h"
#include "hooksrv.h"

#include <criterion/criterion.h>
#include <hiredis.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static th_hook_t *srv;

static void srv_stop(void)
{
    th_hook_stop(srv);
    srv = NULL;
}

static th_stack_t stk; /* static: the suite's .fini stops it after a
                          failed assertion */

static void run_fini(void)
{
    srv_stop();
    th_stack_cleanup();
}

TestSuite(webhook_run, .fini = run_fini, .timeout = 240);

/* ------------------------------------------------ members through the loop */

/* Appends one JSON line to fp. */
#define LINE(fp, ...) fprintf((fp), __VA_ARGS__), fputc('\n', (fp))

/* Reads the DLQ with kcat; counts records whose dlq.reason is reason and,
 * when error is not NULL, whose dlq.error equals it too. *first (may be
 * NULL) gets the dlq.error of the first record of that reason (caller
 * frees; NULL when none). */
static size_t dlq_scan(th_stack_t *s, const char *reason, const char *error,
                       char **first)
{
    if (first)
        *first = NULL;
    char *argv[] = {"/usr/bin/env",
                    "kcat",
                    "-C",
                    "-b",
                    s->broker.bootstrap,
                    "-t",
                    "payments.dlq",
                    "-e",
                    "-q",
                    "-J",
                    "-X",
                    "fetch.wait.max.ms=10",
                    NULL};
    char *out = NULL;
    cr_assert_eq(th_run(argv, &out, NULL, 60000), 0, "kcat failed");
    size_t n = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *m = json_loads(line, 0, NULL);
        cr_assert(m, "kcat -J line: %s", line);
        json_t *hs = json_object_get(m, "headers");
        const char *r = NULL, *e = NULL;
        for (size_t i = 0; i + 1 < json_array_size(hs); i += 2) {
            const char *k = json_string_value(json_array_get(hs, i));
            const char *v = json_string_value(json_array_get(hs, i + 1));
            if (k && !strcmp(k, "dlq.reason"))
                r = v;
            if (k && !strcmp(k, "dlq.error"))
                e = v;
        }
        if (r && !strcmp(r, reason) && first && !*first)
            *first = strdup(e ? e : "");
        if (r && !strcmp(r, reason) && (!error || (e && !strcmp(e, error))))
            n++;
        json_decref(m);
    }
    free(out);
    return n;
}

static size_t dlq_count(th_stack_t *s, const char *reason, const char *error)
{
    return dlq_scan(s, reason, error, NULL);
}

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

/* Waits until `want` distinct keys with prefix were acknowledged. */
static int wait_acked(const char *prefix, size_t want, int timeout_ms)
{
    int64_t end = idem_now_ms() + timeout_ms;
    while (idem_now_ms() < end) {
        if (th_hook_keys_acked(srv, prefix, NULL) >= want)
            return 0;
        usleep(100 * 1000);
    }
    return -1;
}

static pid_t start_member(th_stack_t *s, const char *name, int port,
                          const char *inflight)
{
    char listen[64], url[128], infl[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    snprintf(url, sizeof(url), "webhook.url=%s", th_hook_url(srv));
    snprintf(infl, sizeof(infl), "webhook.max.inflight=%s", inflight);
    const char *sets[] = {"handler=webhook",
                          url,
                          listen,
                          infl,
                          "webhook.headers=Authorization: Bearer it",
                          "dedup.lease.ms=2000",
                          "retry.backoff.initial.ms=50",
                          "retry.backoff.max.ms=200",
                          NULL};
    return th_stack_member(s, name, sets);
}

/* Waits until the member's records_total sums to n. */
static int wait_outcomes(int port, double n, int timeout_ms)
{
    int64_t end = idem_now_ms() + timeout_ms;
    while (idem_now_ms() < end) {
        double p = member_metric(port, "idemproc_records_total{outcome="
                                       "\"processed\"}");
        double d = member_metric(port, "idemproc_records_total{outcome="
                                       "\"duplicate\"}");
        double q = member_metric(port, "idemproc_records_total{outcome="
                                       "\"dlq\"}");
        if (p >= 0 && p + d + q >= n)
            return 0;
        usleep(200 * 1000);
    }
    return -1;
}

Test(webhook_run, duplicates_rejects_poison_and_retries_end_exact)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    th_hook_rule_body(srv, "\"reject\":true",
                      (th_hook_reply_t){422, 0, NULL, "nope"});
    th_hook_rule_body(srv, "\"down\":true",
                      (th_hook_reply_t){500, 0, NULL, "down"});
    cr_assert_eq(th_stack_start(&stk, 4, NULL), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    size_t good = 0, redeliveries = 0, resends = 0, rejects = 0, flaky = 0;
    for (int i = 0; i < 300; i++) {
        int reject = i % 50 == 7;
        LINE(fp,
             "{\"idempotency_key\":\"w-%d\",\"message_id\":\"m-%d\","
             "\"n\":%d%s}",
             i, i, i, reject ? ",\"reject\":true" : "");
        if (reject) {
            rejects++;
            continue;
        }
        good++;
        if (i % 10 == 0) { /* the same record again */
            LINE(fp,
                 "{\"idempotency_key\":\"w-%d\",\"message_id\":\"m-%d\","
                 "\"n\":%d}",
                 i, i, i);
            redeliveries++;
        }
        if (i % 15 == 1) { /* the same operation, a new message */
            LINE(fp,
                 "{\"idempotency_key\":\"w-%d\",\"message_id\":\"m-%d-b\","
                 "\"n\":%d}",
                 i, i, i);
            resends++;
        }
        if (i % 40 == 3) { /* the service fails twice, then takes it */
            char key[32];
            snprintf(key, sizeof(key), "w-%d", i);
            th_hook_script(srv, key, (th_hook_reply_t){503, 0, NULL, "busy"});
            th_hook_script(srv, key, (th_hook_reply_t){429, 0, "1", NULL});
            flaky++;
        }
    }
    /* The service always fails this one: retried, then dead-lettered. */
    LINE(fp, "{\"idempotency_key\":\"w-9999\",\"down\":true}");
    LINE(fp, "not json at all");
    LINE(fp, "{\"n\":1}"); /* no identity anywhere */
    fclose(fp);
    const char *args[] = {"--input", path, NULL};
    cr_assert_eq(th_stack_produce(&stk, args), 0);
    size_t total = good + redeliveries + resends + rejects + 3;

    int port = th_free_port();
    pid_t m = start_member(&stk, "w1", port, "16");
    cr_assert_eq(wait_outcomes(port, (double)total, 60000), 0,
                 "the member did not finish every record");
    cr_assert_eq(wait_acked("w-", good, 10000), 0);
    /* Exactly once here (no crash): one acknowledged request per key. */
    size_t acks;
    cr_assert_eq(th_hook_keys_acked(srv, "w-", &acks), good);
    cr_assert_eq(acks, good);
    cr_assert_eq(th_hook_count_key(srv, "w-3", 0), 3, "503, 429, 200");
    cr_assert_eq(member_metric(port, "idemproc_records_total{outcome="
                                     "\"processed\"}"),
                 (double)good);
    cr_assert_eq(member_metric(port, "idemproc_duplicates_total{kind="
                                     "\"redelivery\"}"),
                 (double)redeliveries);
    cr_assert_eq(member_metric(port, "idemproc_duplicates_total{kind="
                                     "\"resend\"}"),
                 (double)resends);
    /* w-9999: retry.max.attempts; one more when, at the tail, only the
     * failing records are left and the breaker judged a 500 an outage (not
     * an attempt): other keys no longer wait behind a retry (ordering=key). */
    double fives = member_metric(port, "idemproc_webhook_requests_total{class="
                                       "\"5xx\"}");
    cr_assert_geq(fives, (double)flaky + 5);
    cr_assert_leq(fives, (double)flaky + 5 + 2);
    cr_assert_geq(member_metric(port, "idemproc_retries_total"),
                  (double)(2 * flaky));
    cr_assert_eq(member_metric(port, "idemproc_webhook_latency_seconds_count"),
                 (double)th_hook_count(srv));
    cr_assert_eq(dlq_count(&stk, "handler-rejected", "HTTP 422: nope"),
                 rejects);
    char *why = NULL;
    cr_assert_eq(dlq_scan(&stk, "max-retries", NULL, &why), 1);
    cr_assert(why && strstr(why, "HTTP 500: down"), "dlq.error: %s",
              why ? why : "(none)");
    free(why);
    cr_assert_geq(th_hook_count_key(srv, "w-9999", 0), 5);
    cr_assert_leq(th_hook_count_key(srv, "w-9999", 0), 5 + 2);
    cr_assert_eq(dlq_count(&stk, "not-json", NULL), 1);
    cr_assert_eq(dlq_count(&stk, "no-identity", NULL), 1);
    /* What the service received: the value, the key, the token. */
    size_t n;
    th_hook_req_t *q = th_hook_requests(srv, &n);
    for (size_t i = 0; i < n; i++) {
        int k;
        cr_assert_eq(sscanf(q[i].key, "w-%d", &k), 1, "%s", q[i].key);
        cr_assert(strstr(q[i].body, "\"idempotency_key\""), "%s", q[i].body);
        cr_assert_str_eq(q[i].auth, "Bearer it");
        cr_assert_str_eq(q[i].content_type, "application/json");
    }
    th_hook_requests_free(q, n);
    cr_assert_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

Test(webhook_run, sigkill_mid_stream_then_restart_acknowledges_every_key)
{
    /* 20 ms a request, 8 at a time: about 400 records a second, so the
     * kill lands mid-stream. The identity is a nested field. */
    srv = th_hook_start((th_hook_reply_t){.status = 200, .delay_ms = 20}, 1);
    cr_assert(srv);
    const char *props[] = {"envelope.identity=value:/event/id", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    const size_t keys = 2000;
    size_t dups = 0;
    for (size_t i = 0; i < keys; i++) {
        LINE(fp, "{\"event\":{\"id\":\"k-%zu\"},\"n\":%zu}", i, i);
        if (i % 7 == 0) {
            LINE(fp, "{\"event\":{\"id\":\"k-%zu\"},\"n\":%zu}", i, i);
            dups++;
        }
    }
    fclose(fp);
    const char *args[] = {"--input", path, NULL};
    cr_assert_eq(th_stack_produce(&stk, args), 0);

    int port = th_free_port();
    pid_t m1 = start_member(&stk, "k1", port, "8");
    int64_t end = idem_now_ms() + 60000;
    while (th_hook_count(srv) < keys / 4 && idem_now_ms() < end)
        usleep(20 * 1000);
    cr_assert_geq(th_hook_count(srv), keys / 4, "the member sent too little");
    kill(m1, SIGKILL);
    th_wait(m1, 10000);
    size_t before = th_hook_keys_acked(srv, "k-", NULL);
    cr_assert_lt(before, keys, "the kill came after the end");

    int port2 = th_free_port();
    pid_t m2 = start_member(&stk, "k2", port2, "8");
    cr_assert_eq(wait_acked("k-", keys, 120000), 0,
                 "only %zu of %zu keys acknowledged",
                 th_hook_keys_acked(srv, "k-", NULL), keys);
    /* At least once: every key; repeats only for what was in flight or
     * done but not yet committed when the member died. */
    size_t acks;
    cr_assert_eq(th_hook_keys_acked(srv, "k-", &acks), keys);
    cr_assert_leq(acks - keys, 8 + 512, "%zu repeated requests after one kill",
                  acks - keys);
    cr_assert_eq(dlq_count(&stk, "max-retries", NULL), 0);
    cr_assert_eq(dlq_count(&stk, "handler-rejected", NULL), 0);
    /* No message id in these records: every duplicate is a resend, and
     * the restarted member saw at least the ones after its start. */
    cr_assert_gt(member_metric(port2, "idemproc_duplicates_total{kind="
                                      "\"resend\"}"),
                 0);
    cr_assert_leq(member_metric(port2, "idemproc_duplicates_total{kind="
                                       "\"resend\"}"),
                  (double)(dups + keys));
    cr_assert_eq(th_stop(m2, 15000), 0);
    th_stack_stop(&stk);
}

Test(webhook_run, bytes_values_with_identity_from_the_key_or_a_header)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    const char *props[] = {"envelope.format=bytes",
                           "envelope.identity=header:event-id,key", NULL};
    cr_assert_eq(th_stack_start(&stk, 1, props), 0);
    /* kcat: "key<TAB>value" lines; values that are not JSON at all. */
    char path[600];
    snprintf(path, sizeof(path), "%s/in.txt", stk.dir);
    cr_assert_eq(th_write_file(path, "b-1\tplain text, not json\n"
                                     "b-2\t<xml>2</xml>\n"
                                     "b-1\tplain text, not json\n"
                                     "b-3\t{\"not\": \"parsed\"\n"),
                 0);
    char *pargv[] = {
        "/usr/bin/env", "kcat",     "-P", "-b", stk.broker.bootstrap,
        "-t",           "payments", "-K", "\t", "-l",
        path,           NULL};
    cr_assert_eq(th_run(pargv, NULL, NULL, 30000), 0);
    /* A header wins over the key; a record with neither is poison. */
    char *oargv[] = {"/usr/bin/env", "sh", "-c", NULL, NULL};
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "printf 'from a header' | kcat -P -b %s -t payments -H "
             "event-id=h-9 -k b-1 && printf 'no key' | kcat -P -b %s -t "
             "payments",
             stk.broker.bootstrap, stk.broker.bootstrap);
    oargv[3] = cmd;
    cr_assert_eq(th_run(oargv, NULL, NULL, 30000), 0);

    int port = th_free_port();
    pid_t m = start_member(&stk, "b1", port, "4");
    cr_assert_eq(wait_outcomes(port, 6, 60000), 0);
    cr_assert_eq(member_metric(port, "idemproc_records_total{outcome="
                                     "\"processed\"}"),
                 4);
    cr_assert_eq(member_metric(port, "idemproc_duplicates_total{kind="
                                     "\"resend\"}"),
                 1);
    cr_assert_eq(dlq_count(&stk, "no-identity", NULL), 1);
    struct {
        const char *key, *body;
    } want[] = {{"b-1", "plain text, not json"},
                {"b-2", "<xml>2</xml>"},
                {"b-3", "{\"not\": \"parsed\""},
                {"h-9", "from a header"}};
    size_t n;
    th_hook_req_t *q = th_hook_requests(srv, &n);
    cr_assert_eq(n, 4);
    for (size_t w = 0; w < 4; w++) {
        size_t hits = 0;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(q[i].key, want[w].key)) {
                cr_assert_str_eq(q[i].body, want[w].body);
                hits++;
            }
        cr_assert_eq(hits, 1, "%s sent %zu times", want[w].key, hits);
    }
    th_hook_requests_free(q, n);
    cr_assert_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* What the arrival hook saw: a request whose lease in Redis was gone, or
 * had less left than the request takes, when the request arrived. */
typedef struct {
    int redis_port;
    int need_ms; /* the lease must outlive the request by this much */
    pthread_mutex_t lock;
    size_t seen, short_leases;
    char first_bad[256];
} lease_probe_t;

static void lease_at_arrival(const char *key, void *opaque)
{
    lease_probe_t *lp = opaque;
    char rkey[512];
    snprintf(rkey, sizeof(rkey), "idemproc:dedup:test-group:%s",
             key ? key : "");
    redisContext *c = redisConnect("127.0.0.1", lp->redis_port);
    long long pttl = -3;
    char val[128] = "";
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "PTTL %s", rkey);
        if (r && r->type == REDIS_REPLY_INTEGER)
            pttl = r->integer;
        freeReplyObject(r);
        r = redisCommand(c, "GET %s", rkey);
        if (r && r->type == REDIS_REPLY_STRING)
            snprintf(val, sizeof(val), "%s", r->str);
        freeReplyObject(r);
    }
    redisFree(c);
    pthread_mutex_lock(&lp->lock);
    lp->seen++;
    if (pttl < lp->need_ms || strncmp(val, "lease:", 6)) {
        if (!lp->short_leases++)
            snprintf(lp->first_bad, sizeof(lp->first_bad),
                     "%s: \"%s\", %lld ms left", key ? key : "(no key)", val,
                     pttl);
    }
    pthread_mutex_unlock(&lp->lock);
}

/* webhook.max.inflight=2 against a service answering in 150 ms, with
 * dedup.lease.ms=1000 and 40 records fetched at once: the loop claims
 * only what the handler can start (room()), so every request arrives
 * while its lease still has more than the request's time left (a claim of
 * all 40 at once would leave the last ones queued for ~3 s, their leases
 * long gone), each identity is POSTed once, and nothing is taken over. */
Test(webhook_run, room_keeps_leases_from_running_out_in_the_queue)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200, .delay_ms = 150}, 1);
    cr_assert(srv);
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    lease_probe_t lp = {.redis_port = stk.redis.port, .need_ms = 300};
    pthread_mutex_init(&lp.lock, NULL);
    th_hook_on_arrival(srv, lease_at_arrival, &lp);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    for (int i = 0; i < 40; i++)
        LINE(fp, "{\"idempotency_key\":\"q-%d\",\"message_id\":\"m-%d\"}", i,
             i);
    fclose(fp);
    const char *pargs[] = {"--input", path, NULL};
    cr_assert_eq(th_stack_produce(&stk, pargs), 0);
    int port = th_free_port();
    char listen[64], url[128];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    snprintf(url, sizeof(url), "webhook.url=%s", th_hook_url(srv));
    const char *sets[] = {"handler=webhook",
                          url,
                          listen,
                          "webhook.max.inflight=2",
                          "webhook.timeout.ms=900",
                          "dedup.lease.ms=1000",
                          NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);
    cr_assert_eq(wait_outcomes(port, 40, 60000), 0);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_hook_on_arrival(srv, NULL, NULL);
    cr_expect_eq(lp.seen, 40);
    cr_expect_eq(lp.short_leases, 0,
                 "%zu requests arrived with their lease (nearly) gone; "
                 "first: %s",
                 lp.short_leases, lp.first_bad);
    for (int i = 0; i < 40; i++) {
        char key[32];
        snprintf(key, sizeof(key), "q-%d", i);
        cr_expect_eq(th_hook_count_key(srv, key, 0), 1, "%s POSTed %zu times",
                     key, th_hook_count_key(srv, key, 0));
    }
    char lpath[600];
    snprintf(lpath, sizeof(lpath), "%s/m1.log", stk.dir);
    char *log = th_slurp(lpath, NULL);
    cr_expect(log && !strstr(log, "lease taken over"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}

/* Scaling up and down with a slow service (every answer takes 500 ms): a
 * drain (revoke, then shutdown) starts no new request, it only lets those
 * in flight finish, so no key is POSTed twice and no drain says the
 * handler kept records (a drain that kept starting requests until its
 * deadline aborted the last ones, and the next owner sent them again). */
Test(webhook_run, rebalance_with_a_slow_service_posts_nothing_twice)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200, .delay_ms = 500}, 1);
    cr_assert(srv);
    cr_assert_eq(th_stack_start(&stk, 4, NULL), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    const size_t keys = 240;
    for (size_t i = 0; i < keys; i++)
        LINE(fp, "{\"idempotency_key\":\"r-%zu\",\"message_id\":\"m-%zu\"}", i,
             i);
    fclose(fp);
    const char *pargs[] = {"--input", path, NULL};
    cr_assert_eq(th_stack_produce(&stk, pargs), 0);
    char url[128];
    snprintf(url, sizeof(url), "webhook.url=%s", th_hook_url(srv));
    const char *sets[] = {"handler=webhook",          url,
                          "webhook.max.inflight=16",  "dedup.lease.ms=10000",
                          "shutdown.timeout.ms=4000", NULL};
    pid_t m1 = th_stack_member(&stk, "d1", sets);
    cr_assert_eq(wait_acked("r-", 30, 60000), 0);
    pid_t m2 = th_stack_member(&stk, "d2", sets); /* a rebalance */
    cr_assert_eq(wait_acked("r-", 140, 60000), 0);
    cr_assert_eq(th_stop(m2, 15000), 0); /* and back */
    cr_assert_eq(wait_acked("r-", keys, 60000), 0, "%zu of %zu acknowledged",
                 th_hook_keys_acked(srv, "r-", NULL), keys);
    cr_assert_eq(th_stop(m1, 15000), 0);
    size_t twice = 0;
    char first[32] = "";
    for (size_t i = 0; i < keys; i++) {
        char key[32];
        snprintf(key, sizeof(key), "r-%zu", i);
        if (th_hook_count_key(srv, key, 0) != 1 && !twice++)
            snprintf(first, sizeof(first), "%s", key);
    }
    cr_expect_eq(twice, 0, "%zu keys POSTed more than once (first: %s)", twice,
                 first);
    const char *names[] = {"d1", "d2"};
    for (size_t i = 0; i < 2; i++) {
        char lpath[600];
        snprintf(lpath, sizeof(lpath), "%s/%s.log", stk.dir, names[i]);
        char *log = th_slurp(lpath, NULL);
        cr_expect(log && !strstr(log, "kept records after drain") &&
                      !strstr(log, "abandoned"),
                  "%s: %s", names[i], log);
        free(log);
    }
    th_stack_stop(&stk);
}

/* Waits until /readyz answers 503 with `needle` in its reason. */
static int wait_not_ready(int port, const char *needle, int timeout_ms)
{
    int64_t end = idem_now_ms() + timeout_ms;
    while (idem_now_ms() < end) {
        char *body = NULL;
        int st = th_http_get(port, "/readyz", &body);
        int hit = st == 503 && body && strstr(body, needle);
        free(body);
        if (hit)
            return 0;
        usleep(100 * 1000);
    }
    return -1;
}

/* The service goes away mid-stream (connections refused) for
 * OUTAGE_PHASE_S, then answers 503 with Retry-After for as long: an
 * outage, never a dead letter. The member turns not ready with the
 * reason, sends little while the breaker is open, and afterwards every
 * identity is delivered; only the record the service always refuses
 * (500, while the others pass) spends its retries and is dead-lettered.
 * Before, every record in flight went to the DLQ as max-retries within
 * about a second of the service going away. */
#define OUTAGE_PHASE_S 30
Test(webhook_run, service_down_then_failing_mid_stream_dead_letters_nothing,
     .timeout = 300)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200, .delay_ms = 20}, 1);
    cr_assert(srv);
    th_hook_rule_body(srv, "\"bad\":true",
                      (th_hook_reply_t){500, 0, NULL, "never"});
    cr_assert_eq(th_stack_start(&stk, 4, NULL), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    const size_t keys = 2000;
    for (size_t i = 0; i < keys; i++) {
        LINE(fp, "{\"idempotency_key\":\"o-%zu\",\"message_id\":\"m-%zu\"}", i,
             i);
        if (i == keys / 2)
            LINE(fp, "{\"idempotency_key\":\"bad-1\",\"bad\":true}");
    }
    fclose(fp);
    const char *pargs[] = {"--input", path, NULL};
    cr_assert_eq(th_stack_produce(&stk, pargs), 0);
    int port = th_free_port();
    pid_t m = start_member(&stk, "o1", port, "4");
    cr_assert_eq(wait_acked("o-", keys / 6, 60000), 0);

    th_hook_down(srv); /* a deploy: connections refused */
    cr_expect_eq(wait_not_ready(port, "webhook: service unreachable", 10000), 0,
                 "not ready with the reason while the service is down");
    size_t seen = th_hook_count(srv);
    sleep(OUTAGE_PHASE_S);
    cr_assert_eq(th_hook_up(srv), 0);
    th_hook_set_default(srv, (th_hook_reply_t){503, 0, "1", "maintenance"});
    cr_expect_eq(wait_not_ready(port, "webhook: service", 10000), 0);
    sleep(OUTAGE_PHASE_S);
    size_t during = th_hook_count(srv) - seen;
    th_hook_set_default(srv, (th_hook_reply_t){.status = 200, .delay_ms = 20});

    cr_assert_eq(wait_acked("o-", keys, 120000), 0, "%zu of %zu acknowledged",
                 th_hook_keys_acked(srv, "o-", NULL), keys);
    cr_assert_eq(wait_outcomes(port, (double)keys + 1, 60000), 0);
    cr_expect_eq(dlq_count(&stk, "max-retries", NULL), 1);
    char *why = NULL;
    dlq_scan(&stk, "max-retries", NULL, &why);
    cr_expect(why && strstr(why, "HTTP 500: never"), "dlq.error: %s",
              why ? why : "(none)");
    free(why);
    cr_expect_eq(dlq_count(&stk, "handler-rejected", NULL), 0);
    cr_expect_eq(member_metric(port, "idemproc_records_total{outcome="
                                     "\"processed\"}"),
                 (double)keys);
    /* While the breaker was open the member probed, it did not hammer:
     * a few requests a second at most over the 503 phase. */
    cr_expect_lt(during, (size_t)(OUTAGE_PHASE_S * 10),
                 "%zu requests during the 503 phase", during);
    cr_assert_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}
