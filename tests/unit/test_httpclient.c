/* test_httpclient (unit): the webhook engine's key encoding, settings
 * checks and the verdict of every status class. */
#include "testlib.h"
#include "fixture_httpclient.h"
#include "handlers/httpclient.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

TestSuite(httpclient);

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
    /* The service cannot be reached: an outage, with libcurl's words. */
    idem_http_result_t e = {.kind = IDEM_HTTP_CONNECT, .retry_after_ms = -1};
    snprintf(e.error, sizeof(e.error), "Connection refused");
    cr_assert_eq(idem_httpclient_classify(&e, why, sizeof(why), &delay),
                 IDEM_HTTP_OUTAGE);
    cr_assert_str_eq(why, "connect: Connection refused");
    cr_assert_str_eq(idem_httpclient_class(&e), "connect");
    e.kind = IDEM_HTTP_TLS;
    cr_assert_eq(idem_httpclient_classify(&e, why, sizeof(why), &delay),
                 IDEM_HTTP_OUTAGE);
    e.kind = IDEM_HTTP_TIMEOUT; /* no response began */
    cr_assert_eq(idem_httpclient_classify(&e, why, sizeof(why), &delay),
                 IDEM_HTTP_OUTAGE);
    e.status = 200; /* a response cut short: this request failed */
    cr_assert_eq(idem_httpclient_classify(&e, why, sizeof(why), &delay),
                 IDEM_HTTP_RETRY);
    e.kind = IDEM_HTTP_ERROR; /* reset, empty reply */
    e.status = 0;
    cr_assert_eq(idem_httpclient_classify(&e, why, sizeof(why), &delay),
                 IDEM_HTTP_RETRY);
    r = response(404, "", -1);
    cr_assert_str_eq(idem_httpclient_class(&r), "4xx");
}

/* A record header's value on a request line: CR/LF and non-ASCII encoded;
 * an empty one is still sent (libcurl leaves "Name: " out). */
Test(httpclient, header_lines_from_record_headers)
{
    char out[64];
    cr_expect_eq(
        idem_httpclient_header_line("t", "a\r\nX: 1", 7, out, sizeof(out)),
        strlen("t: a%0D%0AX: 1"));
    cr_expect_str_eq(out, "t: a%0D%0AX: 1");
    idem_httpclient_header_line("t", "\xc3\xa9%", 3, out, sizeof(out));
    cr_expect_str_eq(out, "t: %C3%A9%25");
    cr_expect_eq(idem_httpclient_header_line("tenant", "", 0, out, sizeof(out)),
                 strlen("tenant;"));
    cr_expect_str_eq(out, "tenant;");
    idem_httpclient_header_line("tenant", " \t", 2, out, sizeof(out));
    cr_expect_str_eq(out, "tenant;");
}
