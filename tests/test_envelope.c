/* test_envelope: record validation, dedup identity and exact amounts. */
#include "envelope.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every amount with at most 2 decimals in the accepted range becomes its
 * exact number of cents; adding any further digit is refused. */
Test(envelope, two_decimal_amounts_are_exact_and_more_are_refused)
{
    unsigned long long x = 88172645463325252ULL; /* xorshift64 */
    char text[64], err[256];
    for (int i = 0; i < 300000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        long long cents = 1 + (long long)(x % 100000000000ULL);
        snprintf(text, sizeof(text), "%lld.%02lld", cents / 100, cents % 100);
        int64_t minor = -1;
        cr_assert_eq(
            idem_amount_parse(text, strlen(text), &minor, err, sizeof(err)), 0,
            "%s refused: %s", text, err);
        cr_assert_eq(minor, cents, "%s became %lld", text, (long long)minor);
        int digit = 1 + (int)(x >> 60) % 9;
        snprintf(text, sizeof(text), "%lld.%02lld%d", cents / 100, cents % 100,
                 digit);
        cr_assert_neq(
            idem_amount_parse(text, strlen(text), &minor, err, sizeof(err)), 0,
            "%s accepted", text);
    }
}

Test(envelope, amount_edges)
{
    const char *bad[] = {"0",        "-1",        "0.001",
                         "0.000001", "12.340001", "1000000000.01",
                         "1e300",    "12.345"};
    int64_t m;
    char err[256];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect_neq(
            idem_amount_parse(bad[i], strlen(bad[i]), &m, err, sizeof(err)), 0,
            "%s accepted", bad[i]);
    cr_expect_eq(idem_amount_parse("1000000000", 10, &m, err, sizeof(err)), 0);
    cr_expect_eq(m, 100000000000LL);
    cr_expect_eq(idem_amount_parse("0.01", 4, &m, err, sizeof(err)), 0);
    cr_expect_eq(m, 1);
}

typedef struct {
    const char *value;
    const char *hdr_key; /* idempotency_key header, NULL = none */
    int ok;
    idem_reason_t reason;
    const char *error_has;
} env_case_t;

#define PAY ",\"user_id\":\"u1\",\"amount\":12.30,\"currency\":\"EUR\"}"

Test(envelope, every_poison_reason_and_the_identity)
{
    const env_case_t cases[] = {
        {"{\"idempotency_key\":\"k1\",\"message_id\":\"m1\"" PAY, NULL, 1, 0,
         NULL},
        {"{\"message_id\":\"m1\"" PAY, NULL, 1, 0, NULL},
        {"{\"x\":1" PAY, "hk", 1, 0, NULL},
        {"{\"x\":1" PAY, NULL, 0, IDEM_REASON_NO_IDENTITY, "neither"},
        {"{\"idempotency_key\":5" PAY, NULL, 0, IDEM_REASON_INVALID_FIELD,
         "idempotency_key:"},
        {"{\"idempotency_key\":\"\"" PAY, NULL, 0, IDEM_REASON_INVALID_FIELD,
         "idempotency_key:"},
        {"{\"idempotency_key\":\"k\",\"amount\":1,\"currency\":\"EUR\"}", NULL,
         0, IDEM_REASON_INVALID_FIELD, "user_id:"},
        {"{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":\"1\","
         "\"currency\":\"EUR\"}",
         NULL, 0, IDEM_REASON_INVALID_FIELD, "amount:"},
        {"{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":1,"
         "\"currency\":\"eur\"}",
         NULL, 0, IDEM_REASON_INVALID_FIELD, "currency:"},
        {"[1,2]", NULL, 0, IDEM_REASON_NOT_OBJECT, "not an object"},
        {"\"text\"", NULL, 0, IDEM_REASON_NOT_OBJECT, "not an object"},
        {"42", NULL, 0, IDEM_REASON_NOT_OBJECT, "not an object"},
        {"{\"idempotency_key\":", NULL, 0, IDEM_REASON_NOT_JSON, "not JSON"},
        {"{\"a\":\"\xff\xfe\"}", NULL, 0, IDEM_REASON_NOT_JSON, "not JSON"},
        {"", NULL, 0, IDEM_REASON_NOT_JSON, "empty"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const env_case_t *c = &cases[i];
        rd_kafka_headers_t *h = NULL;
        if (c->hdr_key) {
            h = rd_kafka_headers_new(2);
            rd_kafka_header_add(h, "idempotency_key", -1, c->hdr_key, -1);
        }
        idem_envelope_t env;
        idem_reason_t reason = IDEM_REASON_CNT;
        char err[256] = "";
        int r = idem_envelope_parse(c->value, strlen(c->value), h, 1, 4096,
                                    &env, &reason, err, sizeof(err));
        if (c->ok) {
            cr_expect_eq(r, 0, "case %zu refused: %s", i, err);
        } else {
            cr_expect_eq(r, -1, "case %zu accepted", i);
            cr_expect_eq(reason, c->reason, "case %zu: %s", i,
                         idem_reason2str(reason));
            cr_expect(strstr(err, c->error_has), "case %zu: %s", i, err);
        }
        if (h)
            rd_kafka_headers_destroy(h);
    }
}

Test(envelope, identity_prefers_the_idempotency_key)
{
    const char *v = "{\"idempotency_key\":\"k1\",\"message_id\":\"m1\"" PAY;
    idem_envelope_t env;
    idem_reason_t reason;
    char err[256];
    cr_assert_eq(idem_envelope_parse(v, strlen(v), NULL, 1, 4096, &env, &reason,
                                     err, sizeof(err)),
                 0);
    cr_expect_str_eq(env.identity, "k1");
    cr_expect_str_eq(env.message_id, "m1");
    cr_expect_eq(env.amount_minor, 1230);
    cr_expect_str_eq(env.currency, "EUR");
    /* Too large is decided before parsing. */
    cr_expect_eq(idem_envelope_parse(v, strlen(v), NULL, 1, 10, &env, &reason,
                                     err, sizeof(err)),
                 -1);
    cr_expect_eq(reason, IDEM_REASON_TOO_LARGE);
}
