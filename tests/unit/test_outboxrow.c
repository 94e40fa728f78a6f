/* test_outboxrow: an outbox row's topic and headers, without a database
 * or a broker: what each odd column gives, or the error it fails with. */
#include "outbox/outboxrow.h"

#include <criterion/criterion.h>
#include <string.h>

/* The headers of h as "name=value;..." (a header without a value as
 * "name", bytes shown as they are, NUL as \0) into buf. */
static const char *headers2str(const rd_kafka_headers_t *h, char *buf,
                               size_t size)
{
    size_t o = 0;
    const char *name;
    const void *v;
    size_t sz;
    buf[0] = '\0';
    for (size_t i = 0; rd_kafka_header_get_all(h, i, &name, &v, &sz) == 0;
         i++) {
        o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? ";" : "", name);
        if (v) {
            o += (size_t)snprintf(buf + o, size - o, "=");
            for (size_t j = 0; j < sz && o + 3 < size; j++) {
                char ch = ((const char *)v)[j];
                if (ch) {
                    buf[o++] = ch;
                } else {
                    buf[o++] = '\\';
                    buf[o++] = '0';
                }
            }
            buf[o] = '\0';
        }
    }
    return buf;
}

typedef struct {
    const char *json, *mid, *ikey;
    const char *want; /* the headers, or "ERR:" and a piece of the error */
} hcase_t;

#define MID "00000000-0000-4000-8000-000000000001"

static const hcase_t hcases[] = {
    {NULL, MID, NULL, "message_id=" MID},
    {NULL, MID, "ik", "message_id=" MID ";idempotency_key=ik"},
    {"{}", MID, NULL, "message_id=" MID},
    {"null", MID, NULL, "message_id=" MID},
    {"{\"a\": \"x\", \"n\": 7, \"f\": 1.5, \"b\": false, \"z\": null, "
     "\"o\": {\"k\": [1, \"s\"]}, \"\": \"empty name\"}",
     MID, NULL,
     "a=x;n=7;f=1.5;b=false;z;o={\"k\":[1,\"s\"]};=empty name;message_id=" MID},
    /* a json column keeps \u0000 inside a value: the bytes go as they are */
    {"{\"bin\": \"a\\u0000b\"}", MID, NULL, "bin=a\\0b;message_id=" MID},
    {"{\"message_id\": \"" MID "\", \"idempotency_key\": \"ik\"}", MID, "ik",
     "message_id=" MID ";idempotency_key=ik"},
    {"{\"idempotency_key\": \"from-header\"}", MID, NULL,
     "message_id=" MID ";idempotency_key=from-header"},
    {"[1, 2]", MID, NULL, "ERR:headers: an array, not a JSON object"},
    {"\"x\"", MID, NULL, "ERR:headers: a string, not a JSON object"},
    {"7", MID, NULL, "ERR:headers: a number, not a JSON object"},
    {"true", MID, NULL, "ERR:headers: a boolean, not a JSON object"},
    {"{\"a\": ", MID, NULL, "ERR:headers: not JSON: "},
    {"{\"message_id\": \"other\"}", MID, NULL,
     "ERR:headers: message_id \"other\" differs from the message_id column"},
    {"{\"idempotency_key\": \"b\"}", MID, "a",
     "ERR:headers: idempotency_key \"b\" differs from the idempotency_key "
     "column \"a\""},
    {"{\"idempotency_key\": 5}", MID, NULL,
     "ERR:headers: idempotency_key must be a string"},
    {"{\"idempotency_key\": null}", MID, "a",
     "ERR:headers: idempotency_key must be a string"},
    {"{\"idempotency_key\": \"a\\u0000b\"}", MID, NULL,
     "ERR:headers: idempotency_key has a NUL byte"},
    {"{\"idempotency_key\": \"\"}", MID, NULL, "ERR:idempotency_key: empty"},
    {NULL, MID, "", "ERR:idempotency_key: empty"},
    {NULL, NULL, "ik", "ERR:message_id: NULL"},
    {NULL, "", "ik", "ERR:message_id: empty"},
    {"{\"message_id\": \"" MID "\"}", NULL, NULL, "message_id=" MID},
};

Test(outboxrow, headers_of_odd_columns)
{
    for (size_t i = 0; i < sizeof(hcases) / sizeof(hcases[0]); i++) {
        const hcase_t *c = &hcases[i];
        char err[256] = "", got[1024];
        rd_kafka_headers_t *h =
            idem_outboxrow_headers(c->json, c->mid, c->ikey, err, sizeof(err));
        if (!strncmp(c->want, "ERR:", 4)) {
            cr_expect_null(h, "%s: want an error", c->json);
            cr_expect(strstr(err, c->want + 4), "%s: got \"%s\", want \"%s\"",
                      c->json, err, c->want + 4);
        } else {
            cr_expect(h, "%s: %s", c->json, err);
            if (h)
                cr_expect_str_eq(headers2str(h, got, sizeof(got)), c->want,
                                 "%s", c->json);
        }
        if (h)
            rd_kafka_headers_destroy(h);
    }
}

Test(outboxrow, topic_names_kafka_allows)
{
    char long249[250], long250[251];
    memset(long249, 't', 249);
    long249[249] = '\0';
    memset(long250, 't', 250);
    long250[250] = '\0';
    const char *ok[] = {"payments", "a.b_c-D9", "...", ".a", long249};
    const struct {
        const char *topic, *want;
    } bad[] = {
        {"", "topic: empty"},
        {"a b", "a character Kafka does not allow"},
        {"a/b", "a character Kafka does not allow"},
        {"caf\xc3\xa9", "a character Kafka does not allow"},
        {".", "is not a valid name"},
        {"..", "is not a valid name"},
        {long250, "topic: 250 characters, Kafka allows at most 249"},
    };
    char err[256];
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        cr_expect_eq(idem_outboxrow_topic_check(ok[i], err, sizeof(err)), 0,
                     "%s: %s", ok[i], err);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        cr_expect_eq(idem_outboxrow_topic_check(bad[i].topic, err, sizeof(err)),
                     -1, "%s accepted", bad[i].topic);
        cr_expect(strstr(err, bad[i].want), "%s: %s", bad[i].topic, err);
    }
}

/* An error text cut inside a character (or quoting bytes that never were
 * UTF-8) must still be text PostgreSQL takes. */
Test(outboxrow, error_text_is_made_valid_utf8)
{
    const struct {
        const char *in, *want;
    } cases[] = {
        {"plain", "plain"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\x91",
         "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\x91"},
        {"cut \xc3", "cut ?"},
        {"cut \xe2\x82\"", "cut ??\""},
        {"\xff\xfe", "??"},
        {"\xc0\xaf", "??"},           /* overlong '/' */
        {"\xed\xa0\x80", "???"},      /* a surrogate */
        {"\xf4\x90\x80\x80", "????"}, /* above U+10FFFF */
        {"\x80x", "?x"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char buf[64];
        snprintf(buf, sizeof(buf), "%s", cases[i].in);
        cr_expect_str_eq(idem_outboxrow_utf8_clean(buf), cases[i].want,
                         "case %zu", i);
    }
}
