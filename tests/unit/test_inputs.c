/* test_inputs (unit): regressions for input bugs an adversarial run found:
 * NUL bytes in header identities, duplicate JSON keys, amounts decided
 * from the literal text, and one secret list for every command. */
#include "conf/conf.h"
#include "input/envelope.h"
#include "testlib.h"
#include "fixture_inputs.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(inputs, nul_bytes_in_header_identities_are_data)
{
    idem_envelope_t a, b;
    cr_assert_eq(parse_with_header("idempotency_key", "\0A", 2, &a), 0);
    cr_assert_eq(parse_with_header("idempotency_key", "\0B", 2, &b), 0);
    cr_expect_eq(a.identity_len, 2);
    cr_expect_eq(b.identity_len, 2);
    cr_expect_neq(memcmp(a.identity, b.identity, 2), 0);
    cr_assert_eq(parse_with_header("message_id", "ab\0x1", 5, &a), 0);
    cr_expect_eq(a.message_id_len, 5);
    cr_expect_eq(a.identity_len, 5);
    cr_expect_eq(memcmp(a.identity, "ab\0x1", 5), 0);
    cr_expect_eq(memcmp(a.message_id, "ab\0x1", 5), 0);
}

static idem_reason_t reason_of(const char *value, char *err, size_t size,
                               int64_t *minor)
{
    idem_envelope_t env;
    idem_reason_t reason = IDEM_REASON_CNT;
    if (idem_envelope_parse(value, strlen(value), NULL, 1, 1 << 20, &env,
                            &reason, err, size) == 0) {
        *minor = env.amount_minor;
        return IDEM_REASON_CNT; /* valid */
    }
    return reason;
}

Test(inputs, duplicate_keys_are_not_json)
{
    const char *dups[] = {
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":1,"
        "\"amount\":2,\"currency\":\"EUR\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u1\",\"user_id\":\"u2\","
        "\"amount\":1,\"currency\":\"EUR\"}",
        "{\"idempotency_key\":\"k\",\"idempotency_key\":\"j\",\"user_id\":"
        "\"u\",\"amount\":1,\"currency\":\"EUR\"}",
        /* the same key spelled with an escape is the same key */
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":1,"
        "\"\\u0061mount\":2,\"currency\":\"EUR\"}",
    };
    char err[256];
    int64_t m;
    for (size_t i = 0; i < sizeof(dups) / sizeof(dups[0]); i++) {
        idem_reason_t r = reason_of(dups[i], err, sizeof(err), &m);
        cr_expect_eq(r, IDEM_REASON_NOT_JSON, "case %zu: %s (%s)", i,
                     r == IDEM_REASON_CNT ? "valid" : idem_reason2str(r), err);
    }
}

/* Amounts are decided from the digits as written, not from a double. */
Test(inputs, amounts_follow_the_documented_rule_exactly)
{
    struct {
        const char *amount;
        int64_t minor; /* -1: invalid-field */
        const char *err_has;
    } cases[] = {
        {"0.30000000000000004", -1, "amount: 0.30000000000000004 has more"},
        {"0.300000000000000000001", -1, "more than 2 decimals"},
        {"1.005", -1, "amount: 1.005 has more than 2 decimals"},
        {"1234567890123456789012345678901", -1, "at most 1000000000"},
        {"1e-400", -1, "more than 2 decimals"},
        {"-0.5", -1, "above 0"},
        {"0.0", -1, "above 0"},
        {"0.3", 30, NULL},
        {"1.50", 150, NULL},
        {"1.500", 150, NULL},
        {"15e-1", 150, NULL},
        {"1E2", 10000, NULL},
        {"0.01", 1, NULL},
        {"1000000000.00", 100000000000LL, NULL},
        {"1000000000.01", -1, "at most"},
        {"100000000000e-2", 100000000000LL, NULL},
        {"12345678901234567890e-20", -1, "more than 2 decimals"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char value[256], err[256] = "";
        snprintf(value, sizeof(value),
                 "{\"idempotency_key\":\"k\",\"user_id\":\"u\", \"amount\" : "
                 "%s ,\"currency\":\"EUR\"}",
                 cases[i].amount);
        int64_t m = -1;
        idem_reason_t r = reason_of(value, err, sizeof(err), &m);
        if (cases[i].minor >= 0) {
            cr_expect_eq(r, IDEM_REASON_CNT, "%s refused: %s", cases[i].amount,
                         err);
            cr_expect_eq(m, cases[i].minor, "%s became %lld", cases[i].amount,
                         (long long)m);
        } else {
            cr_expect_eq(
                r, IDEM_REASON_INVALID_FIELD, "%s: %s (%s)", cases[i].amount,
                r == IDEM_REASON_CNT ? "valid" : idem_reason2str(r), err);
            cr_expect(strstr(err, cases[i].err_has), "%s: %s", cases[i].amount,
                      err);
        }
    }
}

/* The amount's text is found however the object is written. */
Test(inputs, amount_text_found_past_nested_values_and_strings)
{
    const char *v =
        "{\"meta\":{\"amount\":5,\"x\":[1,{\"amount\":\"}\"}]},"
        "\"s\":\"\\\"amount\\\":7\",\"idempotency_key\":\"k\","
        "\"user_id\":\"u\",\"amount\":\n\t2.5e1,\"currency\":\"EUR\"}";
    char err[256] = "";
    int64_t m = -1;
    cr_assert_eq(reason_of(v, err, sizeof(err), &m), IDEM_REASON_CNT, "%s",
                 err);
    cr_expect_eq(m, 2500);
}

Test(inputs, one_secret_list_for_every_command)
{
    const char *secret[] = {"ssl.key.pem",
                            "ssl.key.password",
                            "sasl.password",
                            "sasl.oauthbearer.client.secret",
                            "sasl.jaas.config",
                            "ssl.keystore.password",
                            "sasl.oauthbearer.config",
                            "SASL.PASSWORD"};
    for (size_t i = 0; i < sizeof(secret) / sizeof(secret[0]); i++)
        cr_expect(idem_conf_kafka_prop_is_secret(secret[i]), "%s", secret[i]);
    cr_expect_not(idem_conf_kafka_prop_is_secret("linger.ms"));
    cr_expect_not(idem_conf_kafka_prop_is_secret("bootstrap.servers"));
}

/* Found by the conf_file fuzzer: stacked or nested repetitions in an
 * input.topics regex made the config check's regcomp take gigabytes. Now
 * they are refused at once with an error naming the key. */
Test(inputs, regex_with_explosive_repetitions_is_refused, .timeout = 30)
{
    const char *bad[] = {
        "input.topics=payments,^a++++++++++++++++++++++++++++++"
        "++++++++",
        "input.topics=^((((((((((a+)+)+)+)+)+)+)+)+)+)+",
        "input.topics=^(a{100}){100}", "input.topics=^x{5000}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *sets[] = {"kafka.bootstrap.servers=127.0.0.1:1", "dlq.topic=d",
                        "redis.url=redis://127.0.0.1:1/0", "group.id=g",
                        (char *)bad[i]};
        char err[512] = "";
        idem_conf_t *conf =
            idem_conf_load(NULL, NULL, sets, 5, err, sizeof(err));
        cr_expect_null(conf, "%s accepted", bad[i]);
        idem_conf_destroy(conf);
        cr_expect(strstr(err, "input.topics: regex") &&
                      strstr(err, "repeats too much"),
                  "%s: %s", bad[i], err);
    }
    /* Ordinary patterns still work. */
    char *ok[] = {"kafka.bootstrap.servers=127.0.0.1:1", "dlq.topic=d",
                  "redis.url=redis://127.0.0.1:1/0", "group.id=g",
                  "input.topics=^pay(ments)?-[a-z]+\\.v[0-9]{2}$"};
    char err[512] = "";
    idem_conf_t *conf = idem_conf_load(NULL, NULL, ok, 5, err, sizeof(err));
    cr_expect(conf, "%s", err);
    idem_conf_destroy(conf);
}

/* The forward handler's output: the input's own bytes plus processed_at.
 * Re-serialising through a double turned 619.74 into 619.74000000000001,
 * which the amount rule (rightly) refuses when the output is read back. */
Test(inputs, forward_copy_keeps_the_value_bytes)
{
    struct {
        const char *in, *out;
    } cases[] = {
        {"{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":619.74,"
         "\"currency\":\"EUR\"}",
         "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":619.74,"
         "\"currency\":\"EUR\",\"processed_at\":\"T\"}"},
        {" { \"a\" : 1 } \n", " { \"a\" : 1 ,\"processed_at\":\"T\"} \n"},
        {"{}", "{\"processed_at\":\"T\"}"},
        {"{ }", "{ \"processed_at\":\"T\"}"},
        {"{\"processed_at\":\"old\",\"b\":{\"processed_at\":1}}",
         "{\"processed_at\":\"T\",\"b\":{\"processed_at\":1}}"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len;
        char *out = idem_envelope_set_member(cases[i].in, strlen(cases[i].in),
                                             "processed_at", "\"T\"", &len);
        cr_expect_str_eq(out, cases[i].out, "case %zu", i);
        cr_expect_eq(len, strlen(cases[i].out));
        free(out);
    }
    /* and it parses back with the same amount */
    size_t len;
    char *out = idem_envelope_set_member(cases[0].in, strlen(cases[0].in),
                                         "processed_at", "\"T\"", &len);
    char err[256] = "";
    int64_t m = 0;
    cr_expect_eq(reason_of(out, err, sizeof(err), &m), IDEM_REASON_CNT, "%s",
                 err);
    cr_expect_eq(m, 61974);
    free(out);
}
