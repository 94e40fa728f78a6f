/* test_envscan: the fast read of envelopes (envscan.c) gives exactly what
 * jansson's read gives, and leaves to jansson what it cannot be sure of. */
#include "envelope.h"
#include "envscan.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define PAY ",\"user_id\":\"u1\",\"amount\":12.30,\"currency\":\"EUR\"}"

static const char *const names[] = {"idempotency_key", "message_id", "user_id",
                                    "amount", "currency"};
static const size_t lens[] = {15, 10, 7, 6, 8};

static int scan(const char *v, idem_envscan_field_t *f)
{
    return idem_envscan(v, strlen(v), names, lens, 5, f);
}

Test(envscan, picks_the_top_level_members)
{
    idem_envscan_field_t f[5];
    const char *v = "{\"idempotency_key\":\"k\\\"1\",\"nested\":{\"amount\":5,"
                    "\"l\":[1,{\"message_id\":\"x\"}]},\"message_id\":null,"
                    "\"user_id\":true,\"amount\":-12.30}";
    cr_assert_eq(scan(v, f), 0);
    cr_expect_eq(f[0].kind, IDEM_ENVSCAN_STRING);
    cr_expect_str_eq(f[0].str, "k\"1");
    cr_expect_eq(f[0].str_len, 3);
    cr_expect_eq(f[1].kind, IDEM_ENVSCAN_NULL);
    cr_expect_eq(f[2].kind, IDEM_ENVSCAN_OTHER);
    cr_expect_eq(f[3].kind, IDEM_ENVSCAN_NUMBER);
    cr_expect_eq(f[3].num_len, 6);
    cr_expect(!memcmp(f[3].num, "-12.30", 6));
    cr_expect_eq(f[4].kind, IDEM_ENVSCAN_ABSENT);
}

/* What the scan itself reads (not handed over): escapes in keys and
 * values, every kind of value, JSON whitespace anywhere. */
Test(envscan, reads_the_subset_itself)
{
    idem_envscan_field_t f[5];
    cr_assert_eq(
        scan(" {\r\n\t\"idempotency_key\" : \"a\\\"b\\\\c\\/d\\b\\f\\n"
             "\\r\\t\" , \"x\\ty\":[ [ ] , { } , -0 , 0.5 , 10 , true ,"
             " false , null ] , \"amount\" : -0.25 , \"message_id\":"
             "{\"a\":{\"b\":[{\"c\":\"\"}]}}} \n",
             f),
        0);
    cr_expect_eq(f[0].kind, IDEM_ENVSCAN_STRING);
    cr_expect_eq(f[0].str_len, 12);
    cr_expect(!memcmp(f[0].str, "a\"b\\c/d\b\f\n\r\t", 13));
    cr_expect_eq(f[1].kind, IDEM_ENVSCAN_OTHER);
    cr_expect_eq(f[3].kind, IDEM_ENVSCAN_NUMBER);
    cr_expect_eq(f[3].num_len, 5);
    cr_expect(!memcmp(f[3].num, "-0.25", 5));
    /* A string longer than the fields keep is "other", not a failure. */
    char v[600];
    memset(v, 'x', sizeof(v));
    memcpy(v, "{\"user_id\":\"", 12);
    memcpy(v + 12 + 300, "\"}", 3);
    cr_assert_eq(scan(v, f), 0);
    cr_expect_eq(f[2].kind, IDEM_ENVSCAN_OTHER);
}

/* Duplicate keys are found however many keys an object has, keys that
 * share a bloom bit (same length, first and last byte) are told apart,
 * and each object has its own keys. */
Test(envscan, finds_duplicate_keys_among_many)
{
    idem_envscan_field_t f[5];
    char v[4096];
    size_t n = (size_t)snprintf(v, sizeof(v), "{");
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(v + n, sizeof(v) - n, "\"k%03d\":%d,", i, i);
    snprintf(v + n, sizeof(v) - n, "\"amount\":1}");
    cr_expect_eq(scan(v, f), 0, "200 distinct keys");
    cr_expect_eq(f[3].kind, IDEM_ENVSCAN_NUMBER);
    for (int dup = 0; dup < 200; dup += 37) {
        snprintf(v + n, sizeof(v) - n, "\"k%03d\":1}", dup);
        cr_expect_eq(scan(v, f), -1, "k%03d twice", dup);
    }
    cr_expect_eq(scan("{\"axb\":1,\"ayb\":2,\"azb\":3}", f), 0);
    cr_expect_eq(scan("{\"axb\":1,\"ayb\":2,\"axb\":3}", f), -1);
    cr_expect_eq(scan("{\"n\":{\"a\":1},\"m\":{\"a\":1},\"a\":1}", f), 0);
    cr_expect_eq(scan("{\"a\":1,\"n\":{\"b\":1},\"a\":2}", f), -1);
    cr_expect_eq(scan("{\"\":1,\"\":2}", f), -1, "the empty key twice");
}

/* Each of these is either refused by jansson or could be read differently
 * by a lenient parser: the scan must hand it to jansson. */
Test(envscan, leaves_what_it_is_not_sure_of_to_jansson)
{
    const char *cases[] = {
        "{\"a\":1,\v\"b\":2}",       /* \v: whitespace to some parsers */
        "{\"a\":1,\f\"b\":2}",       /* \f likewise */
        "{\"a\":\"x\\u0000y\"}",     /* jansson refuses \u0000 */
        "{\"a\":\"\\ud800\"}",       /* a lone surrogate */
        "{\"a\":\"\xc0\xaf\"}",      /* overlong UTF-8 */
        "{\"a\":\"\xed\xa0\x80\"}",  /* a surrogate in UTF-8 */
        "{\"a\":\"caf\xc3\xa9\"}",   /* any non-ASCII byte */
        "{\"a\":1e400}",             /* overflows a double */
        "{\"a\":1,\"a\":2}",         /* duplicate key */
        "{\"n\":{\"a\":1,\"a\":2}}", /* nested duplicate key */
        "[1,2]",                     /* not an object */
        "\"s\"",
        "{\"a\":1} x",       /* trailing garbage */
        "{\"a\":1} \"x}",    /* an unfinished string after the object */
        "{\"a\":1} tru",     /* an unfinished literal */
        "{\"a\":1} -",       /* an unfinished number */
        "{\"a\":1}{}",       /* two values */
        "{\"a\":01}",        /* leading zero */
        "{\"a\":1,}",        /* trailing comma */
        "{\"a\":1 /* c */}", /* a comment */
        "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
        "]]]]]]}",           /* deeper than the scan goes */
        "{\"a\":\"x\ty\"}",  /* a raw control character */
        "{\"a\":1 \"b\":2}", /* no comma */
        "{\"a\" 1}",         /* no colon */
        "{\"a\":[1,]}",      /* trailing comma in an array */
        "{,}",
        "{\"a\":1}}",
        "{\"a\":-}",
        "{\"a\":1.}",
        "{\"a\":.5}",
        "{\"a\":+1}",
        "{\"a\":tru}",
        "{\"a\":nul}",
        "{\"a\":truex}",
        "{\"a\":\"\\x\"}",             /* not an escape */
        "{\"a\":\"x\\\"}",             /* an escaped quote, then no end */
        "{\"a\\n\":1,\"a\\u000a\":2}", /* \u in a key */
        "{\"a\":[1 2]}",
        "{\"a\":{\"b\"}}",
        "{\"a\":1,\"b\":{\"c\":[true,false,null,\"x\",{\"d\":0}],\"c\":1}}",
        "{\"a\":\"x\"\x00}", /* a NUL after the object */
        "{\"a\"",
        "",
    };
    idem_envscan_field_t f[5];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        cr_expect_eq(scan(cases[i], f), -1, "case %zu taken: %s", i, cases[i]);
}

/* The same value through both reads: same verdict, same reason and error
 * text, same fields. */
static void same_both_ways(const char *identity, int ledger, const char *v,
                           const char *hdr_key)
{
    char e[256];
    idem_envelope_rules_t *r[2];
    for (int fast = 0; fast < 2; fast++) {
        r[fast] = idem_envelope_rules_new(IDEM_ENVELOPE_JSON, identity,
                                          IDEM_ENVELOPE_MESSAGE_ID_DEFAULT,
                                          ledger, 4096, e, sizeof(e));
        cr_assert(r[fast], "%s", e);
        idem_envelope_rules_fast(r[fast], fast);
    }
    rd_kafka_headers_t *h = NULL;
    if (hdr_key) {
        h = rd_kafka_headers_new(2);
        rd_kafka_header_add(h, "idempotency_key", -1, hdr_key, -1);
    }
    idem_envelope_t env[2];
    idem_reason_t reason[2] = {IDEM_REASON_CNT, IDEM_REASON_CNT};
    char err[2][256] = {"", ""};
    int rc[2];
    for (int fast = 0; fast < 2; fast++)
        rc[fast] =
            idem_envelope_read(r[fast], v, strlen(v), h, "key", 3, &env[fast],
                               &reason[fast], err[fast], sizeof(err[fast]));
    cr_expect_eq(rc[1], rc[0], "%s: fast %d, jansson %d (%s)", v, rc[1], rc[0],
                 err[0]);
    if (rc[0] == 0 && rc[1] == 0) {
        cr_expect_eq(env[1].identity_len, env[0].identity_len, "%s", v);
        cr_expect(
            !memcmp(env[1].identity, env[0].identity, env[0].identity_len + 1),
            "%s", v);
        cr_expect_eq(env[1].message_id_len, env[0].message_id_len, "%s", v);
        cr_expect_str_eq(env[1].message_id, env[0].message_id, "%s", v);
        cr_expect_str_eq(env[1].user_id, env[0].user_id, "%s", v);
        cr_expect_str_eq(env[1].currency, env[0].currency, "%s", v);
        cr_expect_eq(env[1].amount_minor, env[0].amount_minor, "%s", v);
        cr_expect_eq(env[1].json_object, env[0].json_object, "%s", v);
    } else if (rc[0] && rc[1]) {
        cr_expect_eq(reason[1], reason[0], "%s", v);
        cr_expect_str_eq(err[1], err[0], "%s", v);
    }
    if (h)
        rd_kafka_headers_destroy(h);
    idem_envelope_rules_destroy(r[0]);
    idem_envelope_rules_destroy(r[1]);
}

Test(envscan, same_results_as_jansson)
{
    const char *values[] = {
        "{\"idempotency_key\":\"k1\",\"message_id\":\"m1\"" PAY,
        "{\"message_id\":\"m1\"" PAY,
        "{\"idempotency_key\":null,\"message_id\":\"m1\"" PAY,
        "{\"idempotency_key\":\"\",\"message_id\":\"m1\"" PAY,
        "{\"idempotency_key\":5" PAY,
        "{\"idempotency_key\":{\"a\":1}" PAY,
        "{\"x\":1" PAY,
        "{\"idempotency_key\":\"k\\n\\\"\\/\\\\\"" PAY,
        "{\"idempotency_key\":\"k\",\"amount\":1,\"currency\":\"EUR\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":\"1\","
        "\"currency\":\"EUR\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":1.005,"
        "\"currency\":\"EUR\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":15e-1,"
        "\"currency\":\"EUR\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":1,"
        "\"currency\":\"eur\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":1,"
        "\"currency\":\"EURO\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":"
        "1000000000000000000000000000001,\"currency\":\"EUR\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":1,"
        "\"currency\":\"EUR\",\"amount\":2}",
        "{\"idempotency_key\":\"k\",\"n\":{\"x\":1,\"x\":1}" PAY,
        "{\"idempotency_key\":\"k\",\"a\":\"\\u00e9\"" PAY,
        "{\"idempotency_key\":\"k\\u0041\"" PAY,
        "{\"idempotency_key\":\"k\",\"a\":1e400" PAY,
        "{\"idempotency_key\":\"k\"\v" PAY,
        " \t\r\n{\"idempotency_key\":\"k\"" PAY " \n",
        "{\"idempotency_key\":\"k\"" PAY "x",
        "{\"idempotency_key\":\"k\"" PAY " \"]}}",
        "{\"idempotency_key\":\"k\"" PAY "\n\t\r ",
        "[1,2]",
        "42",
        "{\"idempotency_key\":",
        "{\"a\":\"\xff\xfe\"}",
        "{}",
        "{\"idempotency_key\":\"k\",\"a\\\"b\":1,\"a\\\"b\":2" PAY,
        "{\"idempotency_key\":\"k\",\"a\\tb\":1,\"a\\nb\":2" PAY,
        "{\"idempotency_key\":\"k\\/\\b\\f\\r\\t\",\"l\":[[],{},[1,-0,0.5,"
        "-12.250,true,false,null,\"s\"]]" PAY,
        "{\"idempotency\\u005fkey\":\"k\"" PAY,
        "{\"idempotency_\\key\":\"k\"" PAY,
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":-0.10,"
        "\"currency\":\"EUR\"}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"u\",\"amount\":01,"
        "\"currency\":\"EUR\"}",
    };
    const char *ids[] = {IDEM_ENVELOPE_IDENTITY_DEFAULT, "key",
                         "value:/user_id,header:idempotency_key",
                         "value:/nested/id,value:/message_id"};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++)
        for (size_t j = 0; j < sizeof(ids) / sizeof(ids[0]); j++)
            for (int ledger = 0; ledger < 2; ledger++) {
                same_both_ways(ids[j], ledger, values[i], NULL);
                same_both_ways(ids[j], ledger, values[i], "hk");
            }
}
