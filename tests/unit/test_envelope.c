/* test_envelope: record validation, dedup identity and exact amounts. */
#include "input/envelope.h"

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
        {"{\"idempotency_key\":5.5" PAY, NULL, 0, IDEM_REASON_INVALID_FIELD,
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

/* envelope.identity / envelope.message.id: ordered sources, the first found
 * wins; a nested JSON Pointer, a header only, the Kafka key. */
static int read_with(const char *identity, const char *mid, int format,
                     const char *value, const char *hdr_name,
                     const char *hdr_value, const char *key,
                     idem_envelope_t *env, idem_reason_t *reason, char *err,
                     size_t err_size)
{
    char e[256];
    idem_envelope_rules_t *r =
        idem_envelope_rules_new(format, identity, mid, 0, 4096, e, sizeof(e));
    cr_assert(r, "rules refused: %s", e);
    rd_kafka_headers_t *h = NULL;
    if (hdr_name) {
        h = rd_kafka_headers_new(2);
        rd_kafka_header_add(h, hdr_name, -1, hdr_value, -1);
    }
    int rc =
        idem_envelope_read(r, value, value ? strlen(value) : 0, h, key,
                           key ? strlen(key) : 0, env, reason, err, err_size);
    if (h)
        rd_kafka_headers_destroy(h);
    idem_envelope_rules_destroy(r);
    return rc;
}

Test(envelope, identity_from_a_nested_pointer_a_header_or_the_key)
{
    idem_envelope_t env;
    idem_reason_t reason;
    char err[256];
    /* Nested pointer, with RFC 6901 escapes and an array index. */
    cr_assert_eq(read_with("value:/event/id", "value:/event/n~1m", 0,
                           "{\"event\":{\"id\":\"ev-7\",\"n/m\":\"m-1\"},"
                           "\"sku\":\"A\",\"qty\":2}",
                           NULL, NULL, NULL, &env, &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(env.identity, "ev-7");
    cr_expect_str_eq(env.message_id, "m-1");
    cr_expect_eq(env.json_object, 1);
    cr_assert_eq(read_with("value:/items/1/id", "", 0,
                           "{\"items\":[{\"id\":\"a\"},{\"id\":\"b\"}]}", NULL,
                           NULL, NULL, &env, &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(env.identity, "b");
    cr_expect_eq(env.message_id_len, 0); /* no message id source: none */
    /* Header only: the value's own field is not a source. */
    cr_assert_eq(read_with("header:event-id", "", 0,
                           "{\"idempotency_key\":\"ignored\"}", "event-id",
                           "h-1", NULL, &env, &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(env.identity, "h-1");
    /* The Kafka key, as a fallback after a missing pointer. */
    cr_assert_eq(read_with("value:/id,key", "", 0, "{\"x\":1}", NULL, NULL,
                           "k-9", &env, &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(env.identity, "k-9");
    /* None found: no-identity; a non-string at a pointer: invalid-field. */
    cr_expect_eq(read_with("value:/id,key", "", 0, "{\"x\":1}", NULL, NULL,
                           NULL, &env, &reason, err, sizeof(err)),
                 -1);
    cr_expect_eq(reason, IDEM_REASON_NO_IDENTITY);
    cr_expect_eq(read_with("value:/event/id", "", 0,
                           "{\"event\":{\"id\":true}}", NULL, NULL, NULL, &env,
                           &reason, err, sizeof(err)),
                 -1);
    cr_expect_eq(reason, IDEM_REASON_INVALID_FIELD);
    cr_expect(strstr(err, "event/id: must be a string"), "%s", err);
}

/* A JSON integer at an identity or message id source is its decimal text
 * (Debezium's numeric keys); any other number is invalid-field. Each case
 * is read both by the fast read and by jansson, with the same result. */
Test(envelope, integer_identities_are_their_decimal_text)
{
    static const struct {
        const char *identity, *value, *want; /* want NULL: invalid-field */
    } cases[] = {
        {"value:/event_id", "{\"event_id\":12345}", "12345"},
        {"value:/event_id", "{\"event_id\":-7,\"x\":1}", "-7"},
        {"value:/event_id", "{\"event_id\":0}", "0"},
        {"value:/event_id", "{\"event_id\":-0}", "0"},
        {"value:/event_id", "{\"event_id\":9223372036854775807}",
         "9223372036854775807"},
        {"value:/meta/event_id", "{\"meta\":{\"event_id\":42}}", "42"},
        {"value:/event_id", "{\"event_id\":12345.0}", NULL},
        {"value:/event_id", "{\"event_id\":1e3}", NULL},
        {"value:/event_id", "{\"event_id\":1.5}", NULL},
        {"value:/event_id", "{\"event_id\":99999999999999999999}", NULL},
        /* Another member's integer beyond 64 bits does not change the
         * verdict on the identity (jansson refuses to read integers
         * exactly in such a value; the identity's literal decides). */
        {"value:/event_id",
         "{\"event_id\":-5,\"d\":16786666666666666666669012345}", "-5"},
        {"value:/meta/event_id",
         "{\"d\":16786666666666666666669012345,\"meta\":{\"event_id\":"
         "9223372036854775807}}",
         "9223372036854775807"},
        {"value:/event_id",
         "{\"event_id\":9223372036854775808,\"d\":"
         "16786666666666666666669012345}",
         NULL},
        {"value:/event_id",
         "{\"event_id\":2.5,\"d\":16786666666666666666669012345}", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int fast = 0; fast < 2; fast++) {
            char e[256], err[256];
            idem_envelope_t env;
            idem_reason_t reason;
            idem_envelope_rules_t *r = idem_envelope_rules_new(
                0, cases[i].identity, "value:/event_id", 0, 4096, e, sizeof(e));
            cr_assert(r, "%s", e);
            idem_envelope_rules_fast(r, fast);
            int rc = idem_envelope_read(r, cases[i].value,
                                        strlen(cases[i].value), NULL, NULL, 0,
                                        &env, &reason, err, sizeof(err));
            if (cases[i].want) {
                cr_expect_eq(rc, 0, "%s (fast %d): %s", cases[i].value, fast,
                             err);
                cr_expect_str_eq(env.identity, cases[i].want, "%s (fast %d)",
                                 cases[i].value, fast);
                cr_expect_eq(env.identity_len, strlen(cases[i].want));
            } else {
                cr_expect_eq(rc, -1, "%s (fast %d)", cases[i].value, fast);
                cr_expect_eq(reason, IDEM_REASON_INVALID_FIELD, "%s (fast %d)",
                             cases[i].value, fast);
                cr_expect(strstr(err, "must be a string or an integer"),
                          "%s (fast %d): %s", cases[i].value, fast, err);
            }
            idem_envelope_term(&env);
            idem_envelope_rules_destroy(r);
        }
    }
}

/* envelope.format=bytes: the value is not parsed at all (not JSON, empty,
 * null: all fine); value: sources are skipped. */
Test(envelope, bytes_format_reads_no_value)
{
    idem_envelope_t env;
    idem_reason_t reason;
    char err[256];
    cr_assert_eq(read_with(IDEM_ENVELOPE_IDENTITY_DEFAULT, "header:message_id",
                           1, "\x01\x02 not json", "idempotency_key", "b-1",
                           NULL, &env, &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(env.identity, "b-1");
    cr_expect_eq(env.json_object, 0);
    cr_assert_eq(read_with("value:/id,key", "", 1, NULL, NULL, NULL, "k-1",
                           &env, &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(env.identity, "k-1");
    /* A JSON value with the identity inside is still not read. */
    cr_expect_eq(read_with("value:/id", "", 1, "{\"id\":\"x\"}", NULL, NULL,
                           NULL, &env, &reason, err, sizeof(err)),
                 -1);
    cr_expect_eq(reason, IDEM_REASON_NO_IDENTITY);
    /* Only the size rule applies. */
    char big[5000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    cr_expect_eq(read_with("key", "", 1, big, NULL, NULL, "k", &env, &reason,
                           err, sizeof(err)),
                 -1);
    cr_expect_eq(reason, IDEM_REASON_TOO_LARGE);
}

/* Payment fields are required only when the rules say so (ledger). */
Test(envelope, payment_fields_only_for_the_ledger)
{
    char e[256], err[256];
    idem_envelope_t env;
    idem_reason_t reason;
    const char *v = "{\"idempotency_key\":\"k\",\"shipment\":\"s-1\"}";
    idem_envelope_rules_t *any = idem_envelope_rules_new(
        0, IDEM_ENVELOPE_IDENTITY_DEFAULT, IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, 0,
        4096, e, sizeof(e));
    idem_envelope_rules_t *pay = idem_envelope_rules_new(
        0, IDEM_ENVELOPE_IDENTITY_DEFAULT, IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, 1,
        4096, e, sizeof(e));
    cr_expect_eq(idem_envelope_read(any, v, strlen(v), NULL, NULL, 0, &env,
                                    &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(idem_envelope_read(pay, v, strlen(v), NULL, NULL, 0, &env,
                                    &reason, err, sizeof(err)),
                 -1);
    cr_expect(strstr(err, "user_id: missing"), "%s", err);
    idem_envelope_rules_destroy(any);
    idem_envelope_rules_destroy(pay);
}

/* Fields a handler asks for (script.fields): each value's type and text as
 * cjson would read it, absent ones marked, never poison; only for JSON. */
Test(envelope, fields_are_extracted_with_their_types)
{
    char err[256];
    idem_envelope_rules_t *r = idem_envelope_rules_new(
        IDEM_ENVELOPE_JSON, "value:/id", IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, 0,
        4096, err, sizeof(err));
    cr_assert(r, "%s", err);
    cr_assert_eq(idem_envelope_rules_fields(r, "script.fields",
                                            "/s, /n,/i,/t,/f,/z,/o,/no,/a/0,"
                                            "/s/x,/big",
                                            err, sizeof(err)),
                 0, "%s", err);
    const char *v = "{\"id\":\"e1\",\"s\":\"a\\\"b\",\"n\":0.1,\"i\":7,"
                    "\"t\":true,\"f\":false,\"z\":null,\"o\":{\"k\":[1]},"
                    "\"a\":[\"x\"],\"big\":123456789012345678}";
    idem_envelope_t env = {0};
    idem_reason_t reason;
    cr_assert_eq(idem_envelope_read(r, v, strlen(v), NULL, NULL, 0, &env,
                                    &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(env.nfields, 11);
    struct {
        idem_field_type_t type;
        const char *text;
    } want[] = {
        {IDEM_FIELD_STRING, "a\"b"},
        {IDEM_FIELD_NUMBER, "0.1"},
        {IDEM_FIELD_NUMBER, "7"},
        {IDEM_FIELD_TRUE, ""},
        {IDEM_FIELD_FALSE, ""},
        {IDEM_FIELD_NULL, ""},
        {IDEM_FIELD_JSON, "{\"k\":[1.0]}"},
        {IDEM_FIELD_ABSENT, ""},
        {IDEM_FIELD_STRING, "x"},
        {IDEM_FIELD_ABSENT, ""},
        {IDEM_FIELD_NUMBER, "1.2345678901234568e+17"},
    };
    for (size_t i = 0; i < 11; i++) {
        cr_expect_eq(env.fields[i].type, want[i].type, "field %zu: %c", i,
                     env.fields[i].type);
        cr_expect_str_eq(env.fields[i].text, want[i].text, "field %zu", i);
        cr_expect_eq(env.fields[i].len, strlen(want[i].text), "field %zu", i);
    }
    /* The number reads back as the same double. */
    cr_expect_eq(strtod(env.fields[10].text, NULL), 123456789012345678.0);
    idem_envelope_term(&env);
    cr_expect_null(env.fields);
    idem_envelope_term(&env);
    idem_envelope_term(NULL);
    /* A record without any of them is no poison. */
    cr_assert_eq(idem_envelope_read(r, "{\"id\":\"e2\"}", 11, NULL, NULL, 0,
                                    &env, &reason, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(env.fields[0].type, IDEM_FIELD_ABSENT);
    idem_envelope_term(&env);
    idem_envelope_rules_destroy(r);

    /* With envelope.format=bytes there is nothing to take them from. */
    r = idem_envelope_rules_new(IDEM_ENVELOPE_BYTES, "key", "", 0, 4096, err,
                                sizeof(err));
    cr_assert(r, "%s", err);
    cr_expect_eq(
        idem_envelope_rules_fields(r, "script.fields", "/a", err, sizeof(err)),
        -1);
    cr_expect(strstr(err, "script.fields: needs envelope.format=json"), "%s",
              err);
    cr_expect_eq(
        idem_envelope_rules_fields(r, "script.fields", "", err, sizeof(err)),
        0);
    idem_envelope_rules_destroy(r);
}

/* The same header twice: the last one is the identity (README, "The
 * envelope"), for the default sources and for header:<name>. */
Test(envelope, a_repeated_header_counts_by_its_last_value)
{
    /* format 1: bytes, so the value: sources are skipped */
    const char *const rules[] = {NULL, "header:event-id"};
    const char *const names[] = {"idempotency_key", "event-id"};
    for (int i = 0; i < 2; i++) {
        char e[256], err[256];
        idem_envelope_rules_t *r = idem_envelope_rules_new(
            1, rules[i] ? rules[i] : IDEM_ENVELOPE_IDENTITY_DEFAULT, "", 0,
            4096, e, sizeof(e));
        cr_assert(r, "rules refused: %s", e);
        rd_kafka_headers_t *h = rd_kafka_headers_new(2);
        rd_kafka_header_add(h, names[i], -1, "first", -1);
        rd_kafka_header_add(h, names[i], -1, "last", -1);
        idem_envelope_t env;
        idem_reason_t reason;
        cr_assert_eq(idem_envelope_read(r, "x", 1, h, NULL, 0, &env, &reason,
                                        err, sizeof(err)),
                     0, "%s", err);
        cr_expect_eq(env.identity_len, 4);
        cr_expect(!memcmp(env.identity, "last", 4));
        rd_kafka_headers_destroy(h);
        idem_envelope_rules_destroy(r);
    }
}
