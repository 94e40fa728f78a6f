/* test_httpclient (it): the webhook's libcurl multi engine against a real
 * HTTP server on 127.0.0.1 (tests/harness/hooksrv.c): headers and bodies
 * as sent, requests in flight at once, Retry-After, timeouts, refused
 * connections, TLS verified by default and with a CA file made here with
 * openssl. */
#include "harness.h"
#include "fixture_httpclient.h"
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

Test(httpclient, timeout_and_refused_connection_are_outages)
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
                 IDEM_HTTP_OUTAGE);
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
    cr_assert_eq(idem_httpclient_classify(&r, why, sizeof(why), NULL),
                 IDEM_HTTP_OUTAGE);
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
     * not know this certificate: a TLS error, an outage, nothing sent. */
    idem_httpclient_conf_t conf = conf_for(th_hook_url(srv), 2);
    idem_httpclient_t *c = idem_httpclient_new(&conf, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_assert_eq(
        idem_httpclient_submit(c, 1, "k", 1, "{}", 2, err, sizeof(err)), 0);
    idem_http_result_t r;
    cr_assert_eq(run_until(c, &r, 1), 1);
    cr_assert_eq(r.kind, IDEM_HTTP_TLS, "%d %s", (int)r.kind, r.error);
    cr_assert_eq(idem_httpclient_classify(&r, err, sizeof(err), NULL),
                 IDEM_HTTP_OUTAGE);
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
