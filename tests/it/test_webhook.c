/* test_webhook (it): handler=webhook against a real HTTP server on
 * 127.0.0.1: what is sent, the result of every status, an unreachable
 * service, the drain. */
#include "effect/handler.h"
#include "harness.h"
#include "fixture_webhook.h"
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

TestSuite(webhook, .fini = srv_stop, .timeout = 90);

typedef struct {
    idem_conf_t *conf;
    idem_metrics_t *metrics;
    void *h;
    idem_record_t recs[64];
    char ids[64][32];
    char values[64][64];
} fixture_t;

static void fx_start(fixture_t *f, const char *url, const char *const more[])
{
    memset(f, 0, sizeof(*f));
    char u[256];
    snprintf(u, sizeof(u), "webhook.url=%s", url);
    const char *sets[16] = {u};
    for (size_t i = 0; more && more[i] && i < 14; i++)
        sets[i + 1] = more[i];
    f->conf = conf_with(sets);
    f->metrics = idem_metrics_new();
    char err[512];
    cr_assert_eq(idem_handler_webhook.validate(f->conf, "", err, sizeof(err)),
                 0, "%s", err);
    idem_handler_ctx_t ctx = {
        .conf = f->conf, .arg = "", .metrics = f->metrics, .member_id = "t"};
    f->h = idem_handler_webhook.start(&ctx, err, sizeof(err));
    cr_assert(f->h, "%s", err);
}

static void fx_stop(fixture_t *f)
{
    idem_handler_webhook.drain(f->h, idem_now_ms());
    idem_result_t res[64];
    idem_handler_webhook.collect(f->h, res, 64, 0);
    idem_handler_webhook.stop(f->h);
    idem_metrics_destroy(f->metrics);
    idem_conf_destroy(f->conf);
}

/* Record i with identity ids[i] = id and value {"n":i}. */
static idem_record_t *fx_rec(fixture_t *f, size_t i, const char *id)
{
    snprintf(f->ids[i], sizeof(f->ids[i]), "%s", id);
    snprintf(f->values[i], sizeof(f->values[i]), "{\"n\":%zu}", i);
    idem_record_t *r = &f->recs[i];
    memset(r, 0, sizeof(*r));
    r->topic = "t";
    r->offset = (int64_t)i;
    r->identity = f->ids[i];
    r->identity_len = strlen(id);
    r->value = f->values[i];
    r->value_len = strlen(f->values[i]);
    return r;
}

/* Collects until n results arrived (20 s at most); returns how many. */
static size_t fx_collect(fixture_t *f, idem_result_t *out, size_t n)
{
    size_t got = 0;
    int64_t end = idem_now_ms() + 20000;
    while (got < n && idem_now_ms() < end)
        got += idem_handler_webhook.collect(f->h, out + got, 64 - got, 50);
    return got;
}

static const idem_result_t *result_for(const idem_result_t *res, size_t n,
                                       const idem_record_t *r)
{
    for (size_t i = 0; i < n; i++)
        if (res[i].rec == r)
            return &res[i];
    return NULL;
}

Test(webhook, every_record_posted_once_with_its_identity_as_key)
{
    srv = th_hook_start((th_hook_reply_t){.status = 201, .delay_ms = 20}, 1);
    cr_assert(srv);
    fixture_t f;
    fx_start(&f, th_hook_url(srv),
             (const char *[]){"webhook.max.inflight=4",
                              "webhook.headers=Authorization: Bearer t0k",
                              "webhook.content.type=application/vnd.x+json",
                              NULL});
    idem_record_t *recs[20];
    for (size_t i = 0; i < 20; i++) {
        char id[32];
        snprintf(id, sizeof(id), "order-%zu", i);
        recs[i] = fx_rec(&f, i, id);
    }
    char err[256];
    /* More than max.inflight at once: the handler queues the rest. */
    cr_assert_eq(
        idem_handler_webhook.submit(f.h, recs, 20, NULL, 0, err, sizeof(err)),
        0);
    cr_assert_eq(idem_handler_webhook.inflight(f.h), 20);
    idem_result_t res[64];
    cr_assert_eq(fx_collect(&f, res, 20), 20);
    cr_assert_eq(idem_handler_webhook.inflight(f.h), 0);
    for (size_t i = 0; i < 20; i++) {
        const idem_result_t *r = result_for(res, 20, recs[i]);
        cr_assert(r, "no result for %zu", i);
        cr_assert_eq(r->kind, IDEM_RESULT_DONE, "%zu: %s", i, r->detail);
    }
    size_t n;
    th_hook_req_t *q = th_hook_requests(srv, &n);
    cr_assert_eq(n, 20);
    for (size_t i = 0; i < n; i++) {
        unsigned k;
        cr_assert_eq(sscanf(q[i].key, "order-%u", &k), 1, "%s", q[i].key);
        char want[64];
        snprintf(want, sizeof(want), "{\"n\":%u}", k);
        cr_assert_str_eq(q[i].body, want);
        cr_assert_str_eq(q[i].auth, "Bearer t0k");
        cr_assert_str_eq(q[i].content_type, "application/vnd.x+json");
    }
    th_hook_requests_free(q, n);
    cr_assert_eq(idem_metrics_webhook_request_get(f.metrics, "2xx"), 20);
    fx_stop(&f);
}

Test(webhook, headers_from_a_file_one_a_line)
{
    srv = th_hook_start((th_hook_reply_t){.status = 204}, 1);
    cr_assert(srv);
    char *dir = th_tmpdir();
    char path[512], set[600];
    snprintf(path, sizeof(path), "%s/headers", dir);
    cr_assert_eq(th_write_file(path, "Authorization: Bearer from-file\n"
                                     "\n"
                                     "X-Test: two words\n"),
                 0);
    snprintf(set, sizeof(set), "webhook.headers.file=%s", path);
    fixture_t f;
    fx_start(&f, th_hook_url(srv), (const char *[]){set, NULL});
    idem_record_t *r = fx_rec(&f, 0, "f-1");
    char err[256];
    cr_assert_eq(
        idem_handler_webhook.submit(f.h, &r, 1, NULL, 0, err, sizeof(err)), 0);
    idem_result_t res[64];
    cr_assert_eq(fx_collect(&f, res, 1), 1);
    cr_assert_eq(res[0].kind, IDEM_RESULT_DONE, "%s", res[0].detail);
    size_t n;
    th_hook_req_t *q = th_hook_requests(srv, &n);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(q[0].auth, "Bearer from-file");
    cr_assert_str_eq(q[0].xtest, "two words");
    th_hook_requests_free(q, n);
    fx_stop(&f);
    th_rmrf(dir);
    free(dir);
}

/* Where each record comes from (X-Kafka-*), and the record headers
 * webhook.forward.headers names; bytes that could start a header line of
 * their own are %XX-encoded. */
Test(webhook, record_metadata_and_chosen_headers_are_request_headers)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    fixture_t f;
    fx_start(&f, th_hook_url(srv),
             (const char *[]){
                 "webhook.forward.headers=traceparent, tenant, empty", NULL});
    rd_kafka_headers_t *h = rd_kafka_headers_new(4);
    rd_kafka_header_add(
        h, "traceparent", -1,
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", -1);
    rd_kafka_header_add(h, "tenant", -1, "a\r\nX-Evil: 1", -1);
    rd_kafka_header_add(h, "secret", -1, "not passed", -1);
    rd_kafka_header_add(h, "empty", -1, "", 0); /* sent, with no value */
    idem_record_t *r = fx_rec(&f, 0, "k-1");
    r->topic = "orders";
    r->partition = 3;
    r->offset = 37;
    r->key = "cust 7";
    r->key_len = 6;
    r->headers = h;
    idem_record_t *r2 = fx_rec(&f, 1, "k-2"); /* no key, no headers */
    idem_record_t *both[] = {r, r2};
    char err[256];
    cr_assert_eq(
        idem_handler_webhook.submit(f.h, both, 2, NULL, 0, err, sizeof(err)),
        0);
    idem_result_t res[64];
    cr_assert_eq(fx_collect(&f, res, 2), 2);
    size_t n;
    th_hook_req_t *q = th_hook_requests(srv, &n);
    cr_assert_eq(n, 2);
    for (size_t i = 0; i < n; i++) {
        const char *hs = q[i].headers;
        cr_assert(hs);
        if (!strcmp(q[i].key, "k-1")) {
            cr_expect(strstr(hs, "X-Kafka-Topic: orders\n"), "%s", hs);
            cr_expect(strstr(hs, "X-Kafka-Partition: 3\n"), "%s", hs);
            cr_expect(strstr(hs, "X-Kafka-Offset: 37\n"), "%s", hs);
            cr_expect(strstr(hs, "X-Kafka-Key: cust 7\n"), "%s", hs);
            cr_expect(strstr(hs, "traceparent: 00-0af7651916cd43dd8448eb211c80"
                                 "319c-b7ad6b7169203331-01\n"),
                      "%s", hs);
            cr_expect(strstr(hs, "tenant: a%0D%0AX-Evil: 1\n"), "%s", hs);
            cr_expect_null(strstr(hs, "\nX-Evil"), "%s", hs);
            cr_expect(strstr(hs, "empty: \n") || strstr(hs, "empty:\n"), "%s",
                      hs);
            cr_expect_null(strstr(hs, "secret"), "%s", hs);
        } else {
            cr_expect(strstr(hs, "X-Kafka-Topic: t\n"), "%s", hs);
            cr_expect(strstr(hs, "X-Kafka-Offset: 1\n"), "%s", hs);
            cr_expect_null(strstr(hs, "X-Kafka-Key"), "no key: %s", hs);
            cr_expect_null(strstr(hs, "traceparent"), "%s", hs);
        }
    }
    th_hook_requests_free(q, n);
    fx_stop(&f);
    rd_kafka_headers_destroy(h);
}

Test(webhook, forward_headers_must_be_header_names)
{
    idem_conf_t *c = conf_with(
        (const char *[]){"webhook.url=http://127.0.0.1:1/",
                         "webhook.forward.headers=ok,bad:name", NULL});
    char err[512] = "";
    cr_expect_eq(idem_handler_webhook.validate(c, "", err, sizeof(err)), -1);
    cr_expect(strstr(err, "webhook.forward.headers: \"bad:name\""), "%s", err);
    idem_conf_destroy(c);
    /* a record must not replace what the service dedups on, nor frame the
     * request */
    const char *owned[] = {
        "webhook.forward.headers=traceparent,idempotency-key",
        "webhook.forward.headers=Content-Length",
        "webhook.forward.headers=transfer-encoding",
        "webhook.forward.headers=Host",
        "webhook.forward.headers=X-Kafka-Offset"};
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++) {
        c = conf_with((const char *[]){"webhook.url=http://127.0.0.1:1/",
                                       owned[i], NULL});
        err[0] = '\0';
        cr_expect_eq(idem_handler_webhook.validate(c, "", err, sizeof(err)), -1,
                     "%s was taken", owned[i]);
        cr_expect(strstr(err, "is set by idemproc or by HTTP itself"), "%s",
                  err);
        idem_conf_destroy(c);
    }
}

Test(webhook, statuses_become_results)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    th_hook_script(srv, "rejected",
                   (th_hook_reply_t){422, 0, NULL, "{\"error\":\"bad sku\"}"});
    th_hook_script(srv, "gone", (th_hook_reply_t){404, 0, NULL, NULL});
    th_hook_script(srv, "slow-down", (th_hook_reply_t){429, 0, "2", NULL});
    th_hook_script(srv, "far", (th_hook_reply_t){503, 0, "86400", NULL});
    th_hook_script(srv, "boom", (th_hook_reply_t){500, 0, NULL, "oops"});
    th_hook_script(srv, "late", (th_hook_reply_t){408, 0, NULL, NULL});
    fixture_t f;
    fx_start(&f, th_hook_url(srv), NULL);
    const char *ids[] = {"rejected", "gone", "slow-down", "far",
                         "boom",     "late", "fine"};
    idem_record_t *recs[7];
    for (size_t i = 0; i < 7; i++)
        recs[i] = fx_rec(&f, i, ids[i]);
    char err[256];
    cr_assert_eq(
        idem_handler_webhook.submit(f.h, recs, 7, NULL, 0, err, sizeof(err)),
        0);
    idem_result_t res[64];
    cr_assert_eq(fx_collect(&f, res, 7), 7);
    const idem_result_t *r = result_for(res, 7, recs[0]);
    cr_assert_eq(r->kind, IDEM_RESULT_REJECT);
    cr_assert_str_eq(r->detail, "HTTP 422: {\"error\":\"bad sku\"}");
    r = result_for(res, 7, recs[1]);
    cr_assert_eq(r->kind, IDEM_RESULT_REJECT);
    cr_assert_str_eq(r->detail, "HTTP 404");
    r = result_for(res, 7, recs[2]);
    cr_assert_eq(r->kind, IDEM_RESULT_RETRY);
    cr_assert_eq(r->retry_after_ms, 2000);
    r = result_for(res, 7, recs[3]); /* a day: cut to 5 minutes */
    cr_assert_eq(r->kind, IDEM_RESULT_RETRY);
    cr_assert_eq(r->retry_after_ms, 5 * 60 * 1000);
    r = result_for(res, 7, recs[4]);
    cr_assert_eq(r->kind, IDEM_RESULT_RETRY);
    cr_assert_eq(r->retry_after_ms, 0); /* the loop's backoff */
    cr_assert_str_eq(r->detail, "HTTP 500: oops");
    r = result_for(res, 7, recs[5]);
    cr_assert_eq(r->kind, IDEM_RESULT_RETRY);
    r = result_for(res, 7, recs[6]);
    cr_assert_eq(r->kind, IDEM_RESULT_DONE);
    cr_assert_eq(idem_metrics_webhook_request_get(f.metrics, "4xx"), 4);
    cr_assert_eq(idem_metrics_webhook_request_get(f.metrics, "5xx"), 2);
    cr_assert_eq(idem_metrics_webhook_request_get(f.metrics, "2xx"), 1);
    fx_stop(&f);
}

/* A refused connection is an outage, never the record's retry; while the
 * breaker is open nothing is sent, records get OUTAGE at once, and one
 * slot is offered (room) so the loop stays paused. */
Test(webhook, unreachable_service_is_an_outage)
{
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/x", th_free_port());
    fixture_t f;
    fx_start(&f, url, NULL);
    idem_record_t *r = fx_rec(&f, 0, "k");
    char err[256];
    cr_assert_eq(
        idem_handler_webhook.submit(f.h, &r, 1, NULL, 0, err, sizeof(err)), 0);
    idem_result_t res[64];
    cr_assert_eq(fx_collect(&f, res, 1), 1);
    cr_assert_eq(res[0].kind, IDEM_RESULT_OUTAGE, "%s", res[0].detail);
    cr_assert(
        !strncmp(res[0].detail, "webhook: service unreachable: connect: ", 39),
        "%s", res[0].detail);
    cr_assert_eq(idem_metrics_webhook_request_get(f.metrics, "connect"), 1);
    cr_assert_eq(idem_handler_webhook.room(f.h), 1);
    idem_record_t *r2 = fx_rec(&f, 1, "k2");
    cr_assert_eq(
        idem_handler_webhook.submit(f.h, &r2, 1, NULL, 0, err, sizeof(err)), 0);
    cr_assert_eq(fx_collect(&f, res, 1), 1);
    cr_assert_eq(res[0].kind, IDEM_RESULT_OUTAGE);
    cr_assert(strstr(res[0].detail, "service unavailable, retrying in "), "%s",
              res[0].detail);
    cr_assert_eq(idem_metrics_webhook_request_get(f.metrics, "connect"), 1,
                 "sent while the breaker was open");
    fx_stop(&f);
}

/* Most requests answered 503 by a service failing as a whole: once the
 * breaker opens, their results are OUTAGE (not counted against the
 * records' retries) and Retry-After holds it open; one record answered
 * 500 while the others pass stays a RETRY every time. */
Test(webhook, a_failing_service_opens_the_breaker_one_bad_record_does_not)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    th_hook_rule_body(srv, "\"n\":0}", (th_hook_reply_t){500, 0, NULL, "bad"});
    fixture_t f;
    fx_start(&f, th_hook_url(srv),
             (const char *[]){"webhook.max.inflight=1", NULL});
    char err[256];
    idem_result_t res[64];
    idem_record_t *bad = fx_rec(&f, 0, "bad");
    for (size_t i = 1; i <= 30; i++) {
        idem_record_t *r = i % 4 == 1 ? bad : fx_rec(&f, i, "good");
        cr_assert_eq(
            idem_handler_webhook.submit(f.h, &r, 1, NULL, 0, err, sizeof(err)),
            0);
        cr_assert_eq(fx_collect(&f, res, 1), 1);
        cr_assert_eq(res[0].kind,
                     i % 4 == 1 ? IDEM_RESULT_RETRY : IDEM_RESULT_DONE,
                     "%zu: %d %s", i, (int)res[0].kind, res[0].detail);
    }
    th_hook_set_default(srv, (th_hook_reply_t){503, 0, "3", "maintenance"});
    size_t retries = 0, outages = 0;
    for (size_t i = 0; i < 20; i++) {
        char id[16];
        snprintf(id, sizeof(id), "o-%zu", i);
        idem_record_t *r = fx_rec(&f, 1 + i % 60, id);
        cr_assert_eq(
            idem_handler_webhook.submit(f.h, &r, 1, NULL, 0, err, sizeof(err)),
            0);
        cr_assert_eq(fx_collect(&f, res, 1), 1);
        retries += res[0].kind == IDEM_RESULT_RETRY;
        outages += res[0].kind == IDEM_RESULT_OUTAGE;
    }
    /* It opens once half the last 20 failed: before that the failures are
     * the records' own (their retries), after it none is. */
    cr_expect(retries >= 4 && retries < 10, "%zu retries", retries);
    cr_expect_eq(outages, 20 - retries);
    /* Open for Retry-After (3 s): nothing more reached the service. */
    cr_expect_eq(th_hook_count(srv), 30 + retries + 1);
    cr_expect_eq(idem_handler_webhook.room(f.h), 1);
    fx_stop(&f);
}

Test(webhook, drain_abandons_what_does_not_finish_in_time)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200, .delay_ms = 4000}, 0);
    cr_assert(srv);
    fixture_t f;
    fx_start(&f, th_hook_url(srv),
             (const char *[]){"webhook.max.inflight=2", NULL});
    idem_record_t *recs[5];
    for (size_t i = 0; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof(id), "d%zu", i);
        recs[i] = fx_rec(&f, i, id);
    }
    char err[256];
    cr_assert_eq(
        idem_handler_webhook.submit(f.h, recs, 5, NULL, 0, err, sizeof(err)),
        0);
    idem_result_t res[64];
    cr_assert_eq(idem_handler_webhook.collect(f.h, res, 64, 100), 0);
    int64_t t0 = idem_now_ms();
    idem_handler_webhook.drain(f.h, t0 + 300);
    int64_t took = idem_now_ms() - t0;
    cr_assert_lt(took, 2000, "drain took %lld ms", (long long)took);
    cr_assert_eq(idem_handler_webhook.collect(f.h, res, 64, 0), 0);
    cr_assert_eq(idem_handler_webhook.inflight(f.h), 0);
    fx_stop(&f);
}

/* ------------------------------------------------ members through the loop */

/* Appends one JSON line to fp. */
#define LINE(fp, ...) fprintf((fp), __VA_ARGS__), fputc('\n', (fp))

/* Sums idemproc_webhook_requests_total over its classes. */
static uint64_t requests_counted(idem_metrics_t *m)
{
    uint64_t n = 0;
    for (size_t i = 0; idem_metrics_webhook_classes[i]; i++)
        n += idem_metrics_webhook_request_get(m,
                                              idem_metrics_webhook_classes[i]);
    return n;
}

/* libcurl sends a request again, on a fresh connection, when a kept-alive
 * connection it reused died without a byte of answer; the service sees
 * both. Every attempt is counted (class "resent" for the one that got no
 * answer), so the metric's sum is what the service saw (it said 2,130
 * where the service counted 2,514). */
Test(webhook, every_attempt_is_counted_resends_included)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    th_hook_script(srv, "k-1", (th_hook_reply_t){.status = 0});
    fixture_t f;
    fx_start(&f, th_hook_url(srv),
             (const char *[]){"webhook.max.inflight=1", NULL});
    char err[256];
    idem_result_t res[64];
    for (size_t i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof(id), "k-%zu", i);
        idem_record_t *r = fx_rec(&f, i, id);
        cr_assert_eq(
            idem_handler_webhook.submit(f.h, &r, 1, NULL, 0, err, sizeof(err)),
            0);
        cr_assert_eq(fx_collect(&f, res, 1), 1);
        cr_expect_eq(res[0].kind, IDEM_RESULT_DONE, "%s: %s", id,
                     res[0].detail);
    }
    cr_assert_eq(th_hook_count_key(srv, "k-1", 0), 2,
                 "libcurl did not send k-1 again on a fresh connection");
    cr_expect_eq(th_hook_count(srv), 4);
    cr_expect_eq(requests_counted(f.metrics), th_hook_count(srv),
                 "counted %llu of the %zu requests the service saw",
                 (unsigned long long)requests_counted(f.metrics),
                 th_hook_count(srv));
    cr_expect_eq(idem_metrics_webhook_request_get(f.metrics, "resent"), 1);
    fx_stop(&f);
}
