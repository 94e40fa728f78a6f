/* test_verify_partscope: `idemproc verify` of a script effect under
 * dedup.scope=partition on one Redis, where the dedup marks are keyed
 * hashes in the partitions' window keys, not one key per identity: exact
 * after a run with a redelivery, a resend and poison lines, and a
 * MISMATCH for an identity not applied, an applied identity not expected,
 * an identity marked twice, and a value changed by hand. */
#include "harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ORDERS    40
#define CUSTOMERS 4

/* At file scope (see test_pipeline.c): the suite's .fini needs it. */
static th_stack_t stk;

TestSuite(verify_partscope, .fini = th_stack_cleanup);

static const char orders_lua[] =
    "-- items per customer and orders counted, once per order\n"
    "function effect(rec)\n"
    "  local q = 0\n"
    "  for _, it in ipairs(rec.fields['/items']) do q = q + it.qty end\n"
    "  idem.hincrby('orders:items', rec.fields['/customer/id'], q)\n"
    "  idem.incrby('orders:count', 1)\n"
    "end\n";

static void order_line(FILE *fp, int i, const char *mid)
{
    fprintf(fp,
            "{\"meta\":{\"event_id\":\"ord-%d\"},\"message_id\":\"%s\","
            "\"customer\":{\"id\":\"c-%d\"},\"items\":[{\"qty\":%d}]}\n",
            i, mid, i % CUSTOMERS, i % 3 + 1);
}

/* Runs verify with the expectation at path; its exit code, its stdout in
 * *out (caller frees). */
static int verify_with(const char *path, char **out)
{
    char *argv[] = {(char *)th_bin(), "verify",     "-c",    stk.conf,
                    "--expect",       (char *)path, "--dlq", NULL};
    char *err = NULL;
    int rc = th_run(argv, out, &err, 60000);
    if (rc != 0 && rc != 1)
        cr_log_error("verify: %s", err);
    free(err);
    return rc;
}

/* A copy of the expectation at stk.expect changed by edit, written to
 * <dir>/<name>; its path in path[600]. */
static void expect_variant(const char *name, void (*edit)(json_t *e),
                           char path[600])
{
    snprintf(path, 600, "%s/%s", stk.dir, name);
    json_t *e = json_load_file(stk.expect, 0, NULL);
    cr_assert(e);
    edit(e);
    cr_assert_eq(json_dump_file(e, path, 0), 0);
    json_decref(e);
}

static void add_unknown(json_t *e)
{
    json_array_append_new(json_object_get(e, "identities"),
                          json_string("ord-999"));
    json_object_set_new(e, "applied", json_integer(ORDERS + 1));
}

static void drop_first(json_t *e)
{
    json_array_remove(json_object_get(e, "identities"), 0);
    json_object_set_new(e, "applied", json_integer(ORDERS - 1));
}

static void mismatch_names(const char *file, void (*edit)(json_t *e),
                           const char *want)
{
    char path[600];
    expect_variant(file, edit, path);
    char *out = NULL;
    cr_expect_eq(verify_with(path, &out), 1, "%s", out);
    cr_expect(out && strstr(out, want), "want \"%s\" in:\n%s", want, out);
    cr_expect(out && strstr(out, "verify: MISMATCH"), "%s", out);
    free(out);
}

/* A Lua command on the stack's Redis (EVAL with no keys, ARGV[1] = arg);
 * its reply as text (caller frees). */
static char *redis_eval(const char *lua, const char *arg)
{
    const char *args[] = {"EVAL", lua, "0", arg, NULL};
    return th_redis_cli(&stk.redis, args);
}

Test(verify_partscope, script_marks_and_values_exact_then_mismatches,
     .timeout = 180)
{
    char *dir = th_tmpdir();
    char lua[600], file[700];
    snprintf(lua, sizeof(lua), "%s/orders.lua", dir);
    cr_assert_eq(th_write_file(lua, orders_lua), 0);
    snprintf(file, sizeof(file), "script.file=%s", lua);
    const char *props[] = {"dedup.scope=partition",
                           "handler=script",
                           file,
                           "script.fields=/customer/id,/items",
                           "envelope.identity=value:/meta/event_id",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/orders.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    long qty[CUSTOMERS] = {0};
    for (int i = 1; i <= ORDERS; i++) {
        char mid[32];
        snprintf(mid, sizeof(mid), "m-%d", i);
        order_line(fp, i, mid);
        qty[i % CUSTOMERS] += i % 3 + 1;
    }
    order_line(fp, 1, "m-1");    /* a redelivery */
    order_line(fp, 2, "m-2-re"); /* a resend: new message id */
    fprintf(fp, "not an order\n");
    fclose(fp);
    char *pargv[] = {(char *)th_bin(), "produce",      "-c",       stk.conf,
                     "--input",        path,           "--expect", stk.expect,
                     "--key-field",    "/customer/id", NULL};
    char *pout = NULL, *perr = NULL;
    cr_assert_eq(th_run(pargv, &pout, &perr, 60000), 0, "%s", perr);
    free(pout);
    free(perr);
    /* The values the effect must leave. */
    json_t *e = json_load_file(stk.expect, 0, NULL);
    cr_assert(e);
    cr_assert_eq(json_array_size(json_object_get(e, "identities")), ORDERS);
    json_t *items = json_object();
    for (int c = 0; c < CUSTOMERS; c++) {
        char name[16];
        snprintf(name, sizeof(name), "c-%d", c);
        json_object_set_new(items, name, json_integer(qty[c]));
    }
    json_object_set_new(e, "redis",
                        json_pack("{so sI}", "orders:items", items,
                                  "orders:count", (json_int_t)ORDERS));
    cr_assert_eq(json_dump_file(e, stk.expect, JSON_INDENT(1)), 0);
    json_decref(e);

    pid_t m = th_stack_member(&stk, "p1", NULL);
    char *vout = NULL;
    int vrc = th_stack_wait_verified(&stk, 1, NULL, 90000, &vout);
    cr_assert_eq(vrc, 0, "verify never exact:\n%s\n%s", vout,
                 th_stack_member_log(&stk, "p1"));
    char want[160];
    snprintf(want, sizeof(want),
             "verify: marks exact (%d identities applied, group test-group, "
             "partition layout)",
             ORDERS);
    cr_expect(strstr(vout, want), "want %s in:\n%s", want, vout);
    cr_expect(strstr(vout, "verify: redis exact (5 values)"), "%s", vout);
    free(vout);
    cr_expect_eq(th_stop(m, 15000), 0);
    /* The marks verify read are the partition layout's: no global mark. */
    char *n = redis_eval("return #redis.call('KEYS', ARGV[1])",
                         "idemproc:dedup:test-group:*");
    cr_expect(n && !strcmp(n, "0"), "global marks: %s", n);
    free(n);
    n = redis_eval("return #redis.call('KEYS', ARGV[1])",
                   "idemproc:st{test-group:*}:w*");
    cr_expect(n && atol(n) > 0, "window keys: %s", n);
    free(n);

    mismatch_names("unknown.json", add_unknown,
                   "identity ord-999: not applied");
    mismatch_names("dropped.json", drop_first,
                   "1 identity applied (marks in the partition layout), but "
                   "not expected");
    /* One mark appended again to its window key: that identity applied
     * twice, as a double effect would leave it. */
    n = redis_eval("local k = redis.call('KEYS', ARGV[1])[1]\n"
                   "local m = redis.call('GETRANGE', k, 0, 15)\n"
                   "return redis.call('APPEND', k, m)",
                   "idemproc:st{test-group:*}:w*");
    cr_expect(n && atol(n) >= 32, "APPEND: %s", n);
    free(n);
    char *out = NULL;
    cr_expect_eq(verify_with(stk.expect, &out), 1, "%s", out);
    cr_expect(out && strstr(out, " applied 2 times (marks in the partition "
                                 "layout)"),
              "%s", out);
    cr_expect(out && strstr(out, "verify: MISMATCH (1 differences)"), "%s",
              out);
    free(out);
    /* Undo it, and change a value by hand instead. */
    n = redis_eval(
        "local k = redis.call('KEYS', ARGV[1])[1]\n"
        "local v = redis.call('GET', k)\n"
        "redis.call('SET', k, string.sub(v, 1, #v - 16), 'KEEPTTL')\n"
        "return redis.call('STRLEN', k)",
        "idemproc:st{test-group:*}:w*");
    free(n);
    out = NULL;
    cr_expect_eq(verify_with(stk.expect, &out), 0, "%s", out);
    free(out);
    /* state get script reads the key itself on one Redis. */
    char *sargv[] = {
        (char *)th_bin(), "state", "get", "script", "orders:count", "-", "-c",
        stk.conf,         NULL};
    char *sout = NULL, *serr = NULL;
    cr_expect_eq(th_run(sargv, &sout, &serr, 60000), 0, "%s", serr);
    snprintf(want, sizeof(want), "script orders:count: %d\n", ORDERS);
    cr_expect(sout && !strcmp(sout, want), "want %s, got %s", want, sout);
    free(sout);
    free(serr);
    const char *bump[] = {"HINCRBY", "orders:items", "c-1", "1", NULL};
    free(th_redis_cli(&stk.redis, bump));
    out = NULL;
    cr_expect_eq(verify_with(stk.expect, &out), 1, "%s", out);
    snprintf(want, sizeof(want),
             "redis orders:items c-1: expected %ld, got \"%ld\"", qty[1],
             qty[1] + 1);
    cr_expect(out && strstr(out, want), "want %s in:\n%s", want, out);
    free(out);
    th_stack_stop(&stk);
    th_rmrf(dir);
    free(dir);
}
