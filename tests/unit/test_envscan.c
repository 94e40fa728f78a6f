/* test_envscan: the fast read of envelopes (envscan.c) gives exactly what
 * jansson's read gives, and leaves to jansson what it cannot be sure of. */
#include "input/envelope.h"
#include "input/envscan.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define PAY ",\"user_id\":\"u1\",\"amount\":12.30,\"currency\":\"EUR\"}"

static const idem_envscan_step_t steps[] = {{"idempotency_key", 15, -1},
                                            {"message_id", 10, -1},
                                            {"user_id", 7, -1},
                                            {"amount", 6, -1},
                                            {"currency", 8, -1}};

static int scan(const char *v, idem_envscan_field_t *f)
{
    return idem_envscan(v, strlen(v), steps, 5, f);
}

/* String field f decoded (into a static buffer). */
static const char *str(const idem_envscan_field_t *f)
{
    static char buf[1024];
    cr_assert_lt(f->str_len, sizeof(buf));
    idem_envscan_string(f, buf);
    return buf;
}

Test(envscan, picks_the_top_level_members)
{
    idem_envscan_field_t f[5];
    const char *v = "{\"idempotency_key\":\"k\\\"1\",\"nested\":{\"amount\":5,"
                    "\"l\":[1,{\"message_id\":\"x\"}]},\"message_id\":null,"
                    "\"user_id\":true,\"amount\":-12.30}";
    cr_assert_eq(scan(v, f), 0);
    cr_expect_eq(f[0].kind, IDEM_ENVSCAN_STRING);
    cr_expect_str_eq(str(&f[0]), "k\"1");
    cr_expect_eq(f[0].str_len, 3);
    cr_expect_eq(f[0].text_len, 4);
    cr_expect_eq(f[1].kind, IDEM_ENVSCAN_NULL);
    cr_expect_eq(f[2].kind, IDEM_ENVSCAN_TRUE);
    cr_expect_eq(f[3].kind, IDEM_ENVSCAN_NUMBER);
    cr_expect_eq(f[3].text_len, 6);
    cr_expect(!memcmp(f[3].text, "-12.30", 6));
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
    cr_expect(!memcmp(str(&f[0]), "a\"b\\c/d\b\f\n\r\t", 13));
    cr_expect_eq(f[1].kind, IDEM_ENVSCAN_OBJECT);
    cr_expect_eq(f[3].kind, IDEM_ENVSCAN_NUMBER);
    cr_expect_eq(f[3].text_len, 5);
    cr_expect(!memcmp(f[3].text, "-0.25", 5));
    cr_assert_eq(
        scan("{\"user_id\":false,\"amount\":[1],\"currency\":\"\"}", f), 0);
    cr_expect_eq(f[2].kind, IDEM_ENVSCAN_FALSE);
    cr_expect_eq(f[3].kind, IDEM_ENVSCAN_ARRAY);
    cr_expect_eq(f[4].kind, IDEM_ENVSCAN_STRING);
    cr_expect_eq(f[4].str_len, 0);
    /* A long string is read whole (borrowed, not copied). */
    char v[600];
    memset(v, 'x', sizeof(v));
    memcpy(v, "{\"user_id\":\"", 12);
    memcpy(v + 12 + 300, "\"}", 3);
    cr_assert_eq(scan(v, f), 0);
    cr_expect_eq(f[2].kind, IDEM_ENVSCAN_STRING);
    cr_expect_eq(f[2].str_len, 300);
    cr_expect_eq(f[2].text, v + 12);
}

/* Steps below the top level: /event/id, /event/meta/a~1b (the key "a/b"),
 * /x~0y (the key "x~y"), /event as well as its members, and a pointer
 * through an array handed over. */
Test(envscan, follows_nested_steps)
{
    static const idem_envscan_step_t st[] = {{"event", 5, -1}, {"id", 2, 0},
                                             {"meta", 4, 0},   {"a/b", 3, 2},
                                             {"x~y", 3, -1},   {"id", 2, -1}};
    idem_envscan_field_t f[6];
    const char *v = "{\"id\":\"top\",\"other\":{\"id\":\"no\"},\"event\":"
                    "{\"meta\":{\"a/b\":7,\"a~1b\":8},\"id\":\"e\\/1\"},"
                    "\"x~y\":null}";
    cr_assert_eq(idem_envscan(v, strlen(v), st, 6, f), 0);
    cr_expect_eq(f[0].kind, IDEM_ENVSCAN_OBJECT);
    cr_expect_eq(f[1].kind, IDEM_ENVSCAN_STRING);
    cr_expect_str_eq(str(&f[1]), "e/1");
    cr_expect_eq(f[2].kind, IDEM_ENVSCAN_OBJECT);
    cr_expect_eq(f[3].kind, IDEM_ENVSCAN_NUMBER);
    cr_expect(!memcmp(f[3].text, "7", f[3].text_len));
    cr_expect_eq(f[4].kind, IDEM_ENVSCAN_NULL);
    cr_expect_eq(f[5].kind, IDEM_ENVSCAN_STRING);
    cr_expect_str_eq(str(&f[5]), "top");
    /* The parent is no object: its members are absent. */
    v = "{\"event\":\"s\",\"id\":1}";
    cr_assert_eq(idem_envscan(v, strlen(v), st, 6, f), 0);
    cr_expect_eq(f[0].kind, IDEM_ENVSCAN_STRING);
    cr_expect_eq(f[1].kind, IDEM_ENVSCAN_ABSENT);
    cr_expect_eq(f[3].kind, IDEM_ENVSCAN_ABSENT);
    /* An array on the way: jansson's pointer reading decides. */
    v = "{\"event\":[{\"id\":1}]}";
    cr_expect_eq(idem_envscan(v, strlen(v), st, 6, f), -1);
    /* An array where a step ends is read as one. */
    v = "{\"event\":{\"id\":[1]}}";
    cr_assert_eq(idem_envscan(v, strlen(v), st, 6, f), 0);
    cr_expect_eq(f[1].kind, IDEM_ENVSCAN_ARRAY);
    /* A duplicate on the way or elsewhere is jansson's to refuse. */
    v = "{\"event\":{\"id\":1,\"id\":2}}";
    cr_expect_eq(idem_envscan(v, strlen(v), st, 6, f), -1);
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

/* The fields of value v at the pointers `list` through both reads: the
 * same verdict and the same fields, type and bytes. Returns whether the
 * fast read took the record. */
static int fields_both_ways(const char *list, int ledger, const char *v)
{
    char e[256];
    idem_envelope_rules_t *r[2];
    for (int fast = 0; fast < 2; fast++) {
        r[fast] = idem_envelope_rules_new(
            IDEM_ENVELOPE_JSON, IDEM_ENVELOPE_IDENTITY_DEFAULT,
            IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, ledger, 4096, e, sizeof(e));
        cr_assert(r[fast], "%s", e);
        idem_envelope_rules_fast(r[fast], fast);
        cr_assert_eq(idem_envelope_rules_fields(r[fast], "script.fields", list,
                                                e, sizeof(e)),
                     0, "%s", e);
    }
    idem_envelope_t env[2];
    idem_reason_t reason[2];
    char err[2][256] = {"", ""};
    int rc[2];
    unsigned long before = idem_envelope_fast_reads();
    for (int fast = 0; fast < 2; fast++)
        rc[fast] =
            idem_envelope_read(r[fast], v, strlen(v), NULL, NULL, 0, &env[fast],
                               &reason[fast], err[fast], sizeof(err[fast]));
    int took = idem_envelope_fast_reads() != before;
    cr_expect_eq(rc[1], rc[0], "%s: fast %d, jansson %d (%s)", v, rc[1], rc[0],
                 err[0]);
    if (!rc[0] && !rc[1]) {
        cr_assert_eq(env[1].nfields, env[0].nfields);
        for (size_t i = 0; i < env[0].nfields; i++) {
            const idem_envelope_field_t *a = &env[0].fields[i],
                                        *b = &env[1].fields[i];
            cr_expect_eq(b->type, a->type, "%s %s field %zu: '%c' vs '%c'", v,
                         list, i, b->type, a->type);
            cr_expect_eq(b->len, a->len, "%s %s field %zu", v, list, i);
            cr_expect(b->len == a->len && !memcmp(b->text, a->text, a->len + 1),
                      "%s %s field %zu: \"%s\" vs \"%s\"", v, list, i, b->text,
                      a->text);
        }
    } else if (rc[0] && rc[1]) {
        cr_expect_str_eq(err[1], err[0], "%s", v);
    }
    for (int fast = 0; fast < 2; fast++) {
        if (!rc[fast])
            idem_envelope_term(&env[fast]);
        idem_envelope_rules_destroy(r[fast]);
    }
    return took;
}

/* Each type of field, nesting, ~0 ~1, absent against null: the fast read
 * gives what jansson's gives, and takes the records it should. */
Test(envscan, fields_same_as_jansson)
{
    const char *L = "/user_id,/amount,/currency,/event/id,/event/a~1b/c,"
                    "/x~0y,/flag,/off,/nil,/gone,/event/n";
    /* Taken by the fast read. */
    const char *fast[] = {
        "{\"idempotency_key\":\"k\"" PAY,
        "{\"idempotency_key\":\"k\",\"user_id\":\"a\\\"b\\\\c\\/d\\n\","
        "\"amount\":0,\"currency\":-0,\"flag\":true,\"off\":false,\"nil\":null,"
        "\"x~y\":\"tilde\",\"event\":{\"id\":\"e1\",\"a/b\":{\"c\":12.5},"
        "\"n\":123456789012345}}",
        "{\"idempotency_key\":\"k\",\"amount\":1234567890123456,"
        "\"currency\":-999999999999999,\"user_id\":0.1,\"event\":{\"id\":"
        "0.30000000000000004,\"n\":1.0000000000000002,\"a/b\":{\"c\":"
        "100000000000000000000000}}}",
        "{\"idempotency_key\":\"k\",\"amount\":-0.0,\"currency\":12.340,"
        "\"user_id\":0.00001,\"event\":{\"id\":9007199254740993,\"n\":"
        "123456789012345678901234567890.5,\"a/b\":{\"c\":0."
        "000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000001}}}",
        "{\"idempotency_key\":\"k\",\"event\":\"not an object\",\"x~y\":1}",
        "{\"idempotency_key\":\"k\",\"event\":null,\"a~1b\":1,\"x~0y\":2}",
        "{\"idempotency_key\":\"k\",\"event\":{\"a/b\":\"s\",\"id\":null}}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"\",\"other\":{\"id\":1,"
        "\"event\":{\"id\":2}},\"l\":[{\"event\":{\"id\":3}}]}",
    };
    for (size_t i = 0; i < sizeof(fast) / sizeof(fast[0]); i++)
        for (int ledger = 0; ledger < 2; ledger++) {
            int took = fields_both_ways(L, ledger, fast[i]);
            /* With the ledger only the first one is a good record. */
            if (!ledger || i == 0)
                cr_expect(took, "fast read not taken: %s", fast[i]);
        }
    /* Handed to jansson (same answers all the same): an object or array
     * as a field, a pointer through an array, a duplicate key, \u. */
    const char *slow[] = {
        "{\"idempotency_key\":\"k\",\"flag\":{\"a\":[1,2.5,\"x\"]}}",
        "{\"idempotency_key\":\"k\",\"nil\":[]}",
        "{\"idempotency_key\":\"k\",\"event\":{\"a/b\":[1],\"id\":null}}",
        "{\"idempotency_key\":\"k\",\"event\":{\"a/b\":\"s\",\"id\":{}}}",
        "{\"idempotency_key\":\"k\",\"amount\":0."
        "000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000001}",
        "{\"idempotency_key\":\"k\",\"event\":{\"id\":[1,{}]}}",
        "{\"idempotency_key\":\"k\",\"event\":[{\"id\":1}]}",
        "{\"idempotency_key\":\"k\",\"event\":{\"id\":1,\"id\":2}}",
        "{\"idempotency_key\":\"k\",\"flag\":1,\"flag\":1}",
        "{\"idempotency_key\":\"k\",\"user_id\":\"\\u00e9\\u0041\"}",
        "{\"idempotency_key\":\"k\",\"amount\":1e3}",
        "{\"idempotency_key\":\"k\",\"amount\":1e400}",
    };
    for (size_t i = 0; i < sizeof(slow) / sizeof(slow[0]); i++) {
        cr_expect(!fields_both_ways(L, 0, slow[i]), "fast read taken: %s",
                  slow[i]);
    }
    /* Pointers into arrays and the whole array: jansson's reading. */
    const char *arr = "{\"idempotency_key\":\"k\",\"l\":[\"a\",{\"b\":2}]}";
    cr_expect(!fields_both_ways("/l/0,/l/1/b,/l/01,/l/+1,/l/-1,/l", 0, arr));
    cr_expect(fields_both_ways("/m/0", 0, arr), "no step into an array");
    /* The empty key and a pointer ending in '/'. */
    const char *emp =
        "{\"idempotency_key\":\"k\",\"\":{\"\":1},\"a\":{\"\":2}}";
    cr_expect(fields_both_ways("//,/a/,/a//", 0, emp));
    cr_expect(!fields_both_ways("/", 0, emp), "an object field");
    /* A field that is also the identity or a ledger member. */
    cr_expect(fields_both_ways("/idempotency_key,/message_id,/amount", 1,
                               "{\"idempotency_key\":\"k\"" PAY));
    /* A token longer than jansson's reading looks up: absent both ways. */
    char ptr[700] = "/", val[1500];
    memset(ptr + 1, 'k', 600);
    ptr[601] = '\0';
    snprintf(val, sizeof(val), "{\"idempotency_key\":\"k\",\"%s\":1}", ptr + 1);
    fields_both_ways(ptr, 0, val);
}

/* Turning the fast read off stays off when fields are set later. */
Test(envscan, fields_after_fast_off)
{
    char e[256];
    idem_envelope_rules_t *r = idem_envelope_rules_new(
        IDEM_ENVELOPE_JSON, IDEM_ENVELOPE_IDENTITY_DEFAULT,
        IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, 0, 4096, e, sizeof(e));
    cr_assert(r);
    idem_envelope_rules_fast(r, 0);
    cr_assert_eq(idem_envelope_rules_fields(r, "f", "/a", e, sizeof(e)), 0);
    const char *v = "{\"idempotency_key\":\"k\",\"a\":1}";
    idem_envelope_t env;
    idem_reason_t reason;
    unsigned long before = idem_envelope_fast_reads();
    cr_assert_eq(idem_envelope_read(r, v, strlen(v), NULL, NULL, 0, &env,
                                    &reason, e, sizeof(e)),
                 0);
    cr_expect_eq(idem_envelope_fast_reads(), before);
    cr_expect_str_eq(env.fields[0].text, "1");
    idem_envelope_term(&env);
    idem_envelope_rules_destroy(r);
}
