/* test_httpclient: the webhook's libcurl multi engine against a real HTTP
 * server on 127.0.0.1 (tests/hooksrv.c): headers and bodies as sent,
 * requests in flight at once, Retry-After, timeouts, refused connections,
 * and the verdict of every status class. */
#include "harness.h"
#include "hooksrv.h"
#include "handlers/httpclient.h"

#include <criterion/criterion.h>
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

TestSuite(httpclient, .fini = srv_stop, .timeout = 60);

static idem_httpclient_conf_t conf_for(const char *url, int inflight)
{
    idem_httpclient_conf_t c = {.url = url,
                                .content_type = "application/json",
                                .headers = NULL,
                                .timeout_ms = 10000,
                                .max_inflight = inflight,
                                .ca_file = NULL,
                                .tls_verify = 1};
    return c;
}

/* Runs c until n results are collected into out or 20 s pass. */
static size_t run_until(idem_httpclient_t *c, idem_http_result_t *out, size_t n)
{
    size_t got = 0;
    char err[256];
    int64_t end = idem_now_ms() + 20000;
    while (got < n && idem_now_ms() < end) {
        cr_assert_eq(idem_httpclient_run(c, 50, err, sizeof(err)), 0, "%s",
                     err);
        got += idem_httpclient_collect(c, out + got, n - got);
    }
    return got;
}

Test(httpclient, key_encoding_keeps_visible_ascii_and_escapes_the_rest)
{
    char out[64];
    cr_assert_eq(idem_httpclient_key_encode("pay-ORD-1", 9, out, sizeof(out)),
                 9);
    cr_assert_str_eq(out, "pay-ORD-1");
    /* NUL, space, '%' and UTF-8 become %XX: "a\0b c%é" */
    cr_assert_eq(
        idem_httpclient_key_encode("a\0b c%\xc3\xa9", 8, out, sizeof(out)), 18);
    cr_assert_str_eq(out, "a%00b%20c%25%C3%A9");
    /* Distinct keys stay distinct: the escaped form of one is not the
     * plain form of another, because '%' itself is escaped. */
    char other[64];
    idem_httpclient_key_encode("a%00b", 5, other, sizeof(other));
    cr_assert_str_eq(other, "a%2500b");
    idem_httpclient_key_encode("a\0b", 3, out, sizeof(out));
    cr_assert_str_neq(out, other);
    cr_assert_eq(idem_httpclient_key_encode("abc", 3, out, 3), (size_t)-1);
    cr_assert_eq(idem_httpclient_key_encode("\n", 1, out, 3), (size_t)-1);
    cr_assert_eq(idem_httpclient_key_encode("\n", 1, out, 4), 3);
}

typedef struct {
    const char *url;
    const char *headers;
    const char *content_type;
    const char *error; /* substring; NULL = accepted */
} check_case_t;

Test(httpclient, check_names_the_bad_setting)
{
    static const check_case_t cases[] = {
        {"http://127.0.0.1:8080/hook", NULL, "application/json", NULL},
        {"https://hooks.example.com/in", "Authorization: Bearer x\nX-A: 1",
         "text/plain", NULL},
        {"ftp://example.com/x", NULL, "a/b", "unsupported scheme \"ftp\""},
        {"not a url", NULL, "a/b", "webhook.url"},
        {"", NULL, "a/b", "webhook.url: required"},
        {"http://h/x", "NoColonHere", "a/b", "without \"Name: value\""},
        {"http://h/x", "Bad Name: v", "a/b", "not a header name"},
        {"http://h/x", "Idempotency-Key: mine", "a/b", "set by idemproc"},
        {"http://h/x", "content-type: x/y", "a/b", "webhook.content.type"},
        {"http://h/x", NULL, "", "webhook.content.type"},
        {"http://h/x", "A: 1\\nB: 2\\n", "a/b", NULL},
        {"http://h/x", "A: 1\\nB 2", "a/b", "line 2: not a header name"},
        {"http://h/x", "A: 1\n\nBearer s3cr3t", "a/b",
         "line 3: not a header name"},
        {"http://h/x", "A: 1\nBearers3cr3t", "a/b", "line 2: a line without"},
        {"http://h/x", "A: s3cr3t\x01", "a/b", "header A has a control"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const check_case_t *tc = &cases[i];
        idem_httpclient_conf_t c = conf_for(tc->url, 4);
        c.headers = tc->headers;
        c.content_type = tc->content_type;
        char err[256] = "";
        int rc = idem_httpclient_check(&c, err, sizeof(err));
        if (!tc->error) {
            cr_assert_eq(rc, 0, "%s: %s", tc->url, err);
        } else {
            cr_assert_eq(rc, -1, "%s accepted", tc->url);
            cr_assert(strstr(err, tc->error), "%s: got \"%s\"", tc->url, err);
            cr_assert_null(strstr(err, "s3cr3t"), "secret in \"%s\"", err);
        }
    }
}

static idem_http_result_t response(long status, const char *body,
                                   int64_t retry_after_ms)
{
    idem_http_result_t r = {.kind = IDEM_HTTP_RESPONSE,
                            .status = status,
                            .retry_after_ms = retry_after_ms};
    snprintf(r.body, sizeof(r.body), "%s", body);
    r.body_len = strlen(r.body);
    return r;
}

Test(httpclient, ca_file_must_be_readable)
{
    idem_httpclient_conf_t c = conf_for("https://127.0.0.1:1/", 1);
    c.ca_file = "/nonexistent/ca.pem";
    char err[256];
    cr_assert_eq(idem_httpclient_check(&c, err, sizeof(err)), -1);
    cr_assert_str_eq(err, "webhook.ca.file: /nonexistent/ca.pem: No such "
                          "file or directory");
}

Test(httpclient, verdict_by_status_class)
{
    char why[700];
    int64_t delay;
    static const long done[] = {200, 201, 202, 204, 299};
    for (size_t i = 0; i < sizeof(done) / sizeof(done[0]); i++) {
        idem_http_result_t r = response(done[i], "", -1);
        cr_assert_eq(idem_httpclient_classify(&r, why, sizeof(why), &delay),
                     IDEM_HTTP_DONE, "%ld", done[i]);
    }
    static const long retry[] = {408, 429, 500, 502, 503, 504, 599};
    for (size_t i = 0; i < sizeof(retry) / sizeof(retry[0]); i++) {
        idem_http_result_t r = response(retry[i], "busy", -1);
        cr_assert_eq(idem_httpclient_classify(&r, why, sizeof(why), &delay),
                     IDEM_HTTP_RETRY, "%ld", retry[i]);
        cr_assert_eq(delay, -1);
    }
    static const long reject[] = {301, 400, 401, 403, 404, 409, 422};
    for (size_t i = 0; i < sizeof(reject) / sizeof(reject[0]); i++) {
        idem_http_result_t r = response(reject[i], "no\nsuch\tuser", -1);
        cr_assert_eq(idem_httpclient_classify(&r, why, sizeof(why), &delay),
                     IDEM_HTTP_REJECT, "%ld", reject[i]);
        char want[64];
        snprintf(want, sizeof(want), "HTTP %ld: no such user", reject[i]);
        cr_assert_str_eq(why, want);
    }
    /* Retry-After is honoured for 429 and 503. */
    idem_http_result_t r = response(429, "", 3000);
    cr_assert_eq(idem_httpclient_classify(&r, why, sizeof(why), &delay),
                 IDEM_HTTP_RETRY);
    cr_assert_eq(delay, 3000);
    r = response(503, "", 1000);
    idem_httpclient_classify(&r, why, sizeof(why), &delay);
    cr_assert_eq(delay, 1000);
    /* No response at all: retry, with libcurl's words. */
    idem_http_result_t e = {.kind = IDEM_HTTP_CONNECT, .retry_after_ms = -1};
    snprintf(e.error, sizeof(e.error), "Connection refused");
    cr_assert_eq(idem_httpclient_classify(&e, why, sizeof(why), &delay),
                 IDEM_HTTP_RETRY);
    cr_assert_str_eq(why, "connect: Connection refused");
    cr_assert_str_eq(idem_httpclient_class(&e), "connect");
    r = response(404, "", -1);
    cr_assert_str_eq(idem_httpclient_class(&r), "4xx");
}

Test(httpclient, posts_body_and_headers_as_configured)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    idem_httpclient_conf_t conf = conf_for(th_hook_url(srv), 4);
    conf.headers = "Authorization: Bearer s3cret\r\n  X-Test: one two \n";
    conf.content_type = "application/x-test";
    char err[256];
    idem_httpclient_t *c = idem_httpclient_new(&conf, err, sizeof(err));
    cr_assert(c, "%s", err);
    static const char body[] = "{\"a\":1}\0tail"; /* a NUL inside */
    cr_assert_eq(idem_httpclient_submit(c, 7, "key\0one", 7, body,
                                        sizeof(body) - 1, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(idem_httpclient_submit(c, 8, "k2", 2, "", 0, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(idem_httpclient_pending(c), 2);
    idem_http_result_t res[2];
    cr_assert_eq(run_until(c, res, 2), 2);
    cr_assert_eq(idem_httpclient_pending(c), 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(res[i].kind, IDEM_HTTP_RESPONSE, "%s", res[i].error);
        cr_assert_eq(res[i].status, 200);
    }
    size_t n;
    th_hook_req_t *q = th_hook_requests(srv, &n);
    cr_assert_eq(n, 2);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(q[i].method, "POST");
        cr_assert_str_eq(q[i].path, "/hook");
        cr_assert_str_eq(q[i].content_type, "application/x-test");
        cr_assert_str_eq(q[i].auth, "Bearer s3cret");
        cr_assert_str_eq(q[i].xtest, "one two");
        if (!strcmp(q[i].key, "key%00one")) {
            cr_assert_eq(q[i].body_len, sizeof(body) - 1);
            cr_assert_eq(memcmp(q[i].body, body, sizeof(body) - 1), 0);
        } else {
            cr_assert_str_eq(q[i].key, "k2");
            cr_assert_eq(q[i].body_len, 0);
        }
    }
    th_hook_requests_free(q, n);
    idem_httpclient_destroy(c);
}

Test(httpclient, many_requests_in_flight_at_once)
{
    /* 40 requests of 200 ms each, 20 at a time: about 0.4 s, where one
     * at a time would take 8 s. */
    srv = th_hook_start((th_hook_reply_t){.status = 204, .delay_ms = 200}, 1);
    cr_assert(srv);
    idem_httpclient_conf_t conf = conf_for(th_hook_url(srv), 20);
    char err[256];
    idem_httpclient_t *c = idem_httpclient_new(&conf, err, sizeof(err));
    cr_assert(c, "%s", err);
    idem_http_result_t res[40];
    size_t got = 0, sent = 0;
    int64_t t0 = idem_now_ms();
    while (got < 40 && idem_now_ms() - t0 < 20000) {
        while (sent < 40 && idem_httpclient_room(c)) {
            char key[16];
            snprintf(key, sizeof(key), "k%zu", sent);
            cr_assert_eq(idem_httpclient_submit(c, sent, key, strlen(key), "x",
                                                1, err, sizeof(err)),
                         0, "%s", err);
            sent++;
        }
        cr_assert_leq(idem_httpclient_pending(c), 20);
        cr_assert_eq(idem_httpclient_run(c, 20, err, sizeof(err)), 0);
        got += idem_httpclient_collect(c, res + got, 40 - got);
    }
    int64_t took = idem_now_ms() - t0;
    cr_assert_eq(got, 40);
    cr_assert_lt(took, 4000, "40 x 200 ms with 20 in flight took %lld ms",
                 (long long)took);
    int seen[40] = {0};
    for (size_t i = 0; i < 40; i++) {
        cr_assert_eq(res[i].status, 204);
        cr_assert_geq(res[i].seconds, 0.19);
        seen[res[i].tag]++;
    }
    for (size_t i = 0; i < 40; i++)
        cr_assert_eq(seen[i], 1, "tag %zu seen %d times", i, seen[i]);
    /* No room past max_inflight. */
    for (size_t i = 0; i < 20; i++)
        cr_assert_eq(
            idem_httpclient_submit(c, i, "a", 1, "", 0, err, sizeof(err)), 0);
    cr_assert_eq(idem_httpclient_room(c), 0);
    cr_assert_eq(idem_httpclient_submit(c, 99, "a", 1, "", 0, err, sizeof(err)),
                 -1);
    cr_assert(strstr(err, "in flight"), "%s", err);
    idem_httpclient_destroy(c); /* aborts the 20 in flight */
}

Test(httpclient, retry_after_body_and_statuses)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    char big[2000];
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    th_hook_script(srv, "slow-down", (th_hook_reply_t){429, 0, "7", "later"});
    th_hook_script(
        srv, "dated",
        (th_hook_reply_t){503, 0, "Fri, 31 Dec 2100 23:59:59 GMT", NULL});
    th_hook_script(srv, "bad", (th_hook_reply_t){422, 0, NULL, big});
    idem_httpclient_conf_t conf = conf_for(th_hook_url(srv), 4);
    char err[256];
    idem_httpclient_t *c = idem_httpclient_new(&conf, err, sizeof(err));
    cr_assert(c, "%s", err);
    const char *keys[] = {"slow-down", "dated", "bad"};
    for (uint64_t i = 0; i < 3; i++)
        cr_assert_eq(idem_httpclient_submit(c, i, keys[i], strlen(keys[i]),
                                            "{}", 2, err, sizeof(err)),
                     0);
    idem_http_result_t res[3];
    cr_assert_eq(run_until(c, res, 3), 3);
    char why[700];
    int64_t delay;
    for (size_t i = 0; i < 3; i++) {
        idem_http_verdict_t v =
            idem_httpclient_classify(&res[i], why, sizeof(why), &delay);
        switch (res[i].tag) {
        case 0:
            cr_assert_eq(res[i].status, 429);
            cr_assert_eq(v, IDEM_HTTP_RETRY);
            cr_assert_eq(delay, 7000);
            cr_assert_str_eq(why, "HTTP 429: later");
            break;
        case 1: /* a date far ahead: a long delay, in ms */
            cr_assert_eq(res[i].status, 503);
            cr_assert_eq(v, IDEM_HTTP_RETRY);
            cr_assert_gt(delay, (int64_t)86400 * 1000);
            break;
        case 2:
            cr_assert_eq(v, IDEM_HTTP_REJECT);
            cr_assert_eq(res[i].body_len, IDEM_HTTPCLIENT_BODY_MAX);
            cr_assert_eq(strlen(why), strlen("HTTP 422: ") + 512, "%s", why);
            break;
        }
    }
    idem_httpclient_destroy(c);
}

Test(httpclient, timeout_and_refused_connection_are_retried)
{
    srv = th_hook_start((th_hook_reply_t){.status = 200, .delay_ms = 3000}, 0);
    cr_assert(srv);
    idem_httpclient_conf_t conf = conf_for(th_hook_url(srv), 4);
    conf.timeout_ms = 300;
    char err[256];
    idem_httpclient_t *c = idem_httpclient_new(&conf, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_assert_eq(idem_httpclient_submit(c, 1, "t", 1, "", 0, err, sizeof(err)),
                 0);
    idem_http_result_t r;
    cr_assert_eq(run_until(c, &r, 1), 1);
    cr_assert_eq(r.kind, IDEM_HTTP_TIMEOUT, "%d %s", (int)r.kind, r.error);
    char why[700];
    cr_assert_eq(idem_httpclient_classify(&r, why, sizeof(why), NULL),
                 IDEM_HTTP_RETRY);
    cr_assert(!strncmp(why, "timeout: ", 9), "%s", why);
    idem_httpclient_destroy(c);

    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/none", th_free_port());
    conf = conf_for(url, 4);
    c = idem_httpclient_new(&conf, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_assert_eq(idem_httpclient_submit(c, 2, "r", 1, "", 0, err, sizeof(err)),
                 0);
    cr_assert_eq(run_until(c, &r, 1), 1);
    cr_assert_eq(r.kind, IDEM_HTTP_CONNECT, "%d %s", (int)r.kind, r.error);
    cr_assert_str_eq(idem_httpclient_class(&r), "connect");
    idem_httpclient_destroy(c);
}

Test(httpclient, tls_verified_by_default_and_with_a_ca_file)
{
    /* A self-signed certificate for 127.0.0.1, made by the openssl tool. */
    char *dir = th_tmpdir();
    char cert[512], key[512];
    snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
    snprintf(key, sizeof(key), "%s/key.pem", dir);
    char *gen[] = {"/usr/bin/env",
                   "openssl",
                   "req",
                   "-x509",
                   "-newkey",
                   "rsa:2048",
                   "-nodes",
                   "-days",
                   "1",
                   "-subj",
                   "/CN=127.0.0.1",
                   "-addext",
                   "subjectAltName=IP:127.0.0.1",
                   "-keyout",
                   key,
                   "-out",
                   cert,
                   NULL};
    cr_assert_eq(th_run(gen, NULL, NULL, 30000), 0, "openssl req failed");
    char *cert_pem = th_slurp(cert, NULL), *key_pem = th_slurp(key, NULL);
    cr_assert(cert_pem && key_pem);
    srv = th_hook_start_tls((th_hook_reply_t){.status = 200}, 1, cert_pem,
                            key_pem);
    cr_assert(srv);
    cr_assert(!strncmp(th_hook_url(srv), "https://", 8));
    char err[256];

    /* Default: the peer is verified against the system store, which does
     * not know this certificate: a TLS error, retried, nothing sent. */
    idem_httpclient_conf_t conf = conf_for(th_hook_url(srv), 2);
    idem_httpclient_t *c = idem_httpclient_new(&conf, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_assert_eq(
        idem_httpclient_submit(c, 1, "k", 1, "{}", 2, err, sizeof(err)), 0);
    idem_http_result_t r;
    cr_assert_eq(run_until(c, &r, 1), 1);
    cr_assert_eq(r.kind, IDEM_HTTP_TLS, "%d %s", (int)r.kind, r.error);
    cr_assert_eq(idem_httpclient_classify(&r, err, sizeof(err), NULL),
                 IDEM_HTTP_RETRY);
    idem_httpclient_destroy(c);
    cr_assert_eq(th_hook_count(srv), 0);

    /* With the certificate as the CA file: verified, delivered. */
    conf.ca_file = cert;
    c = idem_httpclient_new(&conf, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_assert_eq(
        idem_httpclient_submit(c, 2, "k", 1, "{}", 2, err, sizeof(err)), 0);
    cr_assert_eq(run_until(c, &r, 1), 1);
    cr_assert_eq(r.kind, IDEM_HTTP_RESPONSE, "%s", r.error);
    cr_assert_eq(r.status, 200);
    idem_httpclient_destroy(c);
    cr_assert_eq(th_hook_count_key(srv, "k", 1), 1);
    free(cert_pem);
    free(key_pem);
    th_rmrf(dir);
    free(dir);
}
