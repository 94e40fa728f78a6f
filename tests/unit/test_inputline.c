/* test_inputline: `produce --input`'s reading of a line (inputline.c)
 * gives the same key, ids and verdict whether the envelope scan or jansson
 * reads it: each line is read both ways (idem_inputline_fast) and the two
 * readings compared. */
#include "dev/inputline.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *line;
    const char *key_field;
    int json, object, members, has_mid;
    const char *key, *mid, *ikey; /* NULL: none */
    int scanned;                  /* -1: either */
} line_case_t;

static void expect_str(const char *got, const char *want, const char *what,
                       const char *line)
{
    if (!want)
        cr_expect_null(got, "%s of %s: %s", what, line, got);
    else if (!got)
        cr_expect_fail("%s of %s: none, want %s", what, line, want);
    else
        cr_expect_str_eq(got, want, "%s of %s", what, line);
}

static line_case_t cases[] = {
    {"{\"message_id\":\"m-1\",\"idempotency_key\":\"k-1\",\"order_id\":\"O1\"}",
     "order_id", 1, 1, 1, 1, "O1", "m-1", "k-1", 1},
    /* no key field: message_id is the key */
    {"{\"message_id\":\"m-2\",\"amount\":12.30}", "order_id", 1, 1, 1, 1, "m-2",
     "m-2", NULL, 1},
    /* integers are text as jansson prints them; reals are no key */
    {"{\"message_id\":42,\"idempotency_key\":-7,\"order_id\":1.5}", "order_id",
     1, 1, 1, 1, "42", "42", "-7", 1},
    /* escapes are decoded */
    {"{\"order_id\":\"a\\\"b\\\\c\\/d\"}", "order_id", 1, 1, 1, 0, "a\"b\\c/d",
     NULL, NULL, 1},
    /* \u escapes and non-ASCII bytes are jansson's */
    {"{\"order_id\":\"\\u00e9\",\"message_id\":\"m\"}", "order_id", 1, 1, 1, 1,
     "\xc3\xa9", "m", NULL, 0},
    {"{\"order_id\":\"\xc3\xa9\"}", "order_id", 1, 1, 1, 0, "\xc3\xa9", NULL,
     NULL, 0},
    /* duplicate keys: jansson's reading, the last one */
    {"{\"order_id\":\"a\",\"order_id\":\"b\"}", "order_id", 1, 1, 1, 0, "b",
     NULL, NULL, 0},
    /* "-0" and long integers: jansson's text */
    {"{\"order_id\":-0}", "order_id", 1, 1, 1, 0, "0", NULL, NULL, 0},
    {"{\"order_id\":1234567890123456789}", "order_id", 1, 1, 1, 0,
     "1234567890123456789", NULL, NULL, 0},
    /* an integer beyond 64 bits is JSON, but no key */
    {"{\"order_id\":123456789012345678901234567890,\"message_id\":\"m\"}",
     "order_id", 1, 1, 1, 1, "m", "m", NULL, 0},
    /* a message_id that is null: present, but no id */
    {"{\"message_id\":null,\"order_id\":\"O\"}", "order_id", 1, 1, 1, 1, "O",
     NULL, NULL, 1},
    {" { } ", "order_id", 1, 1, 0, 0, NULL, NULL, NULL, -1},
    {"[1,2]", "order_id", 1, 0, 0, 0, NULL, NULL, NULL, 0},
    {"\"just a string\"", "order_id", 1, 0, 0, 0, NULL, NULL, NULL, 0},
    {"this is not json", "order_id", 0, 0, 0, 0, NULL, NULL, NULL, 0},
    {"{\"order_id\":\"O\"} trailing", "order_id", 0, 0, 0, 0, NULL, NULL, NULL,
     0},
    /* the key field may be one of the ids, or none */
    {"{\"idempotency_key\":\"k\",\"message_id\":\"m\"}", "idempotency_key", 1,
     1, 1, 1, "k", "m", "k", 1},
    {"{\"idempotency_key\":\"k\",\"message_id\":\"m\",\"order_id\":\"O\"}",
     NULL, 1, 1, 1, 1, "m", "m", "k", 1},
};

static int same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

/* Reads `line` with the scan allowed and with jansson alone and expects
 * the same reading; returns whether the scan served it. */
static int expect_both_paths_agree(const char *line, const char *key_field)
{
    idem_inputline_t fast, slow;
    idem_inputline_init(&fast);
    idem_inputline_init(&slow);
    idem_inputline_fast(&slow, 0);
    size_t len = strlen(line);
    idem_inputline_read(&fast, line, len, key_field);
    idem_inputline_read(&slow, line, len, key_field);
    cr_assert(!slow.scanned, "jansson alone, yet scanned: %s", line);
    const char *kf = key_field ? key_field : "(none)";
    cr_expect(fast.json == slow.json && fast.object == slow.object &&
                  fast.members == slow.members &&
                  fast.has_message_id == slow.has_message_id,
              "verdicts differ (scanned %d) for %s, key field %s: json %d/%d "
              "object %d/%d members %d/%d has message_id %d/%d",
              fast.scanned, line, kf, fast.json, slow.json, fast.object,
              slow.object, fast.members, slow.members, fast.has_message_id,
              slow.has_message_id);
    cr_expect(same_str(fast.key, slow.key) && fast.key_len == slow.key_len,
              "key differs (scanned %d) for %s, key field %s: %s / %s",
              fast.scanned, line, kf, fast.key ? fast.key : "(none)",
              slow.key ? slow.key : "(none)");
    cr_expect(same_str(fast.message_id, slow.message_id),
              "message_id differs (scanned %d) for %s: %s / %s", fast.scanned,
              line, fast.message_id ? fast.message_id : "(none)",
              slow.message_id ? slow.message_id : "(none)");
    cr_expect(same_str(fast.idempotency_key, slow.idempotency_key),
              "idempotency_key differs (scanned %d) for %s: %s / %s",
              fast.scanned, line,
              fast.idempotency_key ? fast.idempotency_key : "(none)",
              slow.idempotency_key ? slow.idempotency_key : "(none)");
    int scanned = fast.scanned;
    idem_inputline_term(&fast);
    idem_inputline_term(&slow);
    return scanned;
}

/* The parameters are indexes: Criterion copies a parameter's bytes into
 * the test's process, where the case table's pointers would not hold. */
ParameterizedTestParameters(inputline, reads_like_jansson)
{
    static size_t idx[sizeof(cases) / sizeof(cases[0])];
    for (size_t i = 0; i < sizeof(idx) / sizeof(idx[0]); i++)
        idx[i] = i;
    return cr_make_param_array(size_t, idx, sizeof(idx) / sizeof(idx[0]));
}

ParameterizedTest(size_t *i, inputline, reads_like_jansson)
{
    const line_case_t *c = &cases[*i];
    idem_inputline_t il;
    idem_inputline_init(&il);
    idem_inputline_read(&il, c->line, strlen(c->line), c->key_field);
    cr_expect_eq(il.json, c->json, "json of %s", c->line);
    cr_expect_eq(il.object, c->object, "object of %s", c->line);
    cr_expect_eq(il.members, c->members, "members of %s", c->line);
    cr_expect_eq(il.has_message_id, c->has_mid, "has message_id of %s",
                 c->line);
    expect_str(il.key, c->key, "key", c->line);
    cr_expect_eq(il.key_len, c->key ? strlen(c->key) : 0, "key length of %s",
                 c->line);
    expect_str(il.message_id, c->mid, "message_id", c->line);
    expect_str(il.idempotency_key, c->ikey, "idempotency_key", c->line);
    if (c->scanned >= 0)
        cr_expect_eq(il.scanned, c->scanned, "scanned %s", c->line);
    idem_inputline_term(&il);
    expect_both_paths_agree(c->line, c->key_field);
}

/* Values a member may hold: the ones the scan reads itself and the ones
 * it must leave to jansson, side by side. */
static const char *const member_values[] = {
    "\"s\"",
    "\"\"",
    "\"a\\\"b\\\\c\\/d\\n\\t\"",
    "\"\\u0041\"",
    "\"\xc3\xa9\"",
    "\"\xff\"",
    "0",
    "7",
    "-7",
    "-0",
    "007",
    "123456789012345678",
    "1234567890123456789",
    "-1234567890123456789",
    "12345678901234567890123",
    "1.5",
    "1.0",
    "1e3",
    "-1E-2",
    "null",
    "true",
    "false",
    "{}",
    "{\"message_id\":\"inner\"}",
    "[1,\"x\"]",
};
#define NVALUES (sizeof(member_values) / sizeof(member_values[0]))

/* Lines made of those values under the members the reader looks at (and
 * one it does not), in two orders, with a duplicate, with blanks, and cut
 * short; every one read both ways. The scan must serve a good share of
 * them, or the comparison proves nothing about it. */
Test(inputline, both_paths_agree_on_generated_lines)
{
    static const char *const key_fields[] = {
        "order_id", "message_id",   "idempotency_key", "a/b",
        "/a~1b",    "/order_id/id", "/message_id/x",   NULL};
    static const char *const shapes[] = {
        "{\"message_id\":%s,\"idempotency_key\":%s,\"order_id\":%s}",
        "{ \"order_id\" : %s , \"x\":[{}], \"idempotency_key\":%s,"
        "\"message_id\":%s }",
        "{\"order_id\":%s,\"message_id\":%s,\"message_id\":%s}",
        "{\"a/b\":%s,\"a\\/b\":%s,\"idempotency_key\":%s}",
        "\t{\"message_id\":%s,\"order_id\":%s,\"n\":%s",
    };
    size_t lines = 0, scanned = 0;
    char line[512];
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (size_t i = 0; i < NVALUES; i++)
            for (size_t j = 0; j < NVALUES; j += 3)
                for (size_t k = 0; k < sizeof(key_fields) / sizeof(*key_fields);
                     k++) {
                    /* the third value turns with the first, so each value
                     * meets each position */
                    const char *v3 = member_values[(i + j + 1) % NVALUES];
                    snprintf(line, sizeof(line), shapes[s], member_values[i],
                             member_values[j], v3);
                    scanned +=
                        (size_t)expect_both_paths_agree(line, key_fields[k]);
                    lines++;
                }
    cr_expect_gt(scanned, lines / 20, "the scan served %zu of %zu lines",
                 scanned, lines);
    cr_expect_lt(scanned, lines, "jansson read none of %zu lines", lines);
}

/* One reader serves lines of any length one after another; a line's
 * strings stay whole however long they are. */
Test(inputline, long_lines_after_short_ones)
{
    idem_inputline_t il;
    idem_inputline_init(&il);
    idem_inputline_read(&il, "{\"order_id\":\"a\"}", 16, "order_id");
    cr_expect_str_eq(il.key, "a");
    static char line[20000], id[6000];
    memset(id, 'x', sizeof(id) - 1);
    snprintf(line, sizeof(line),
             "{\"message_id\":\"%s\",\"idempotency_key\":\"%s\",\"order_id\":"
             "\"%s\"}",
             id, id, id);
    idem_inputline_read(&il, line, strlen(line), "order_id");
    cr_assert(il.scanned);
    cr_expect_str_eq(il.key, id);
    cr_expect_str_eq(il.message_id, id);
    cr_expect_str_eq(il.idempotency_key, id);
    idem_inputline_term(&il);
    idem_inputline_term(&il); /* twice: a no-op */
}

/* --key-field as a JSON Pointer: nested members, escapes and array
 * indexes, read the same by the scan and by jansson; key_found tells a
 * key found at the pointer from the message_id fallback. */
Test(inputline, key_field_is_a_json_pointer)
{
    static const struct {
        const char *line, *field, *key;
        int found;
    } ptr_cases[] = {
        {"{\"order\":{\"customer\":{\"id\":\"c-7\"}},\"message_id\":\"m\"}",
         "/order/customer/id", "c-7", 1},
        {"{\"order\":{\"customer\":{\"id\":42}}}", "/order/customer/id", "42",
         1},
        {"{\"order\":{\"customer\":{}},\"message_id\":\"m\"}",
         "/order/customer/id", "m", 0},
        {"{\"order\":{\"customer\":{\"id\":1.5}}}", "/order/customer/id", NULL,
         0},
        {"{\"a/b\":{\"c~d\":\"x\"}}", "/a~1b/c~0d", "x", 1},
        {"{\"items\":[{\"sku\":\"s0\"},{\"sku\":\"s1\"}]}", "/items/1/sku",
         "s1", 1},
        {"{\"sku\":\"apple\"}", "sku", "apple", 1},
        {"{\"sku\":\"apple\"}", "/sku", "apple", 1},
        {"{\"message_id\":\"m\"}", "/message_id", "m", 1},
        {"{\"message_id\":{\"id\":\"n\"}}", "/message_id/id", "n", 1},
    };
    for (size_t i = 0; i < sizeof(ptr_cases) / sizeof(ptr_cases[0]); i++) {
        for (int fast = 0; fast < 2; fast++) {
            idem_inputline_t il;
            idem_inputline_init(&il);
            idem_inputline_fast(&il, fast);
            idem_inputline_read(&il, ptr_cases[i].line,
                                strlen(ptr_cases[i].line), ptr_cases[i].field);
            expect_str(il.key, ptr_cases[i].key, "key", ptr_cases[i].line);
            cr_expect_eq(il.key_found, ptr_cases[i].found,
                         "key_found of %s (%d)", ptr_cases[i].line, fast);
            idem_inputline_term(&il);
        }
        expect_both_paths_agree(ptr_cases[i].line, ptr_cases[i].field);
    }
}
