/* test_verify: `idemproc verify`'s errors: expectation files that are
 * missing or malformed (usage errors naming the file), and a Kafka that
 * does not answer (bounded, naming the bootstrap servers). */
#include "harness.h"
#include "hooksrv.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

Test(verify, bad_expect_files_are_usage_errors)
{
    char *dir = th_tmpdir();
    struct {
        const char *name, *text, *want;
    } cases[] = {
        {"missing.json", NULL,
         "--expect %s/missing.json: cannot open: No such file or directory"},
        {"truncated.json", "{\"ledger\":\n", "--expect %s/truncated.json:2:"},
        {"array.json", "[1]\n", "needs a JSON object"},
        {"ledgerarray.json", "{\"ledger\":[],\"applied\":1}\n",
         "needs \"ledger\" as an object"},
        {"badids.json", "{\"applied\":1,\"identities\":[\"a\",7]}\n",
         "identities[1] must be a string"},
        {"badredis.json", "{\"applied\":1,\"redis\":{\"k\":{\"f\":[1]}}}\n",
         "redis \"k\" field \"f\" must be a string, a number or null"},
        {"noapplied.json", "{\"ledger\":{}}\n", "needs an integer \"applied\""},
        {"badbalance.json",
         "{\"ledger\":{\"EUR\":{\"u1\":\"12.50\"}},\"applied\":1}\n",
         "ledger EUR user \"u1\" must be an integer"},
        {"badpoison.json",
         "{\"ledger\":{},\"applied\":0,\"poison\":{\"not-json\":true}}\n",
         "poison reason \"not-json\" must be an integer"},
        {"negapplied.json", "{\"applied\":-3}\n",
         "\"applied\" must not be negative"},
        {"negpoison.json", "{\"applied\":0,\"poison\":{\"not-json\":-1}}\n",
         "poison \"not-json\" must not be negative"},
        {"badreason.json", "{\"applied\":0,\"poison\":{\"nope\":1}}\n",
         "poison \"nope\" is not a DLQ reason"},
        {"unknown.json", "{\"applied\":0,\"dlq\":5}\n",
         "unknown member \"dlq\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[512], want[512];
        snprintf(path, sizeof(path), "%s/%s", dir, cases[i].name);
        if (cases[i].text)
            cr_assert_eq(th_write_file(path, cases[i].text), 0);
        snprintf(want, sizeof(want), cases[i].want, dir);
        char *argv[] = {(char *)th_bin(),
                        "verify",
                        "--set",
                        "kafka.bootstrap.servers=127.0.0.1:1",
                        "--set",
                        "group.id=g",
                        "--set",
                        "input.topics=t",
                        "--set",
                        "dlq.topic=d",
                        "--expect",
                        path,
                        NULL};
        char *out = NULL, *err = NULL;
        cr_expect_eq(th_run(argv, &out, &err, 20000), 2, "%s: %s",
                     cases[i].name, err);
        cr_expect(strstr(err, want), "%s: want \"%s\" in \"%s\"", cases[i].name,
                  want, err);
        cr_expect_eq(count_lines(err), 1, "%s: %s", cases[i].name, err);
        cr_expect_null(strstr(err, "line -1"), "%s", err);
        free(out);
        free(err);
    }
    th_rmrf(dir);
    free(dir);
}

Test(verify, unreachable_kafka_is_named_and_bounded)
{
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    char *dir = th_tmpdir();
    char expect[512], bs[96], url[96];
    snprintf(expect, sizeof(expect), "%s/x.json", dir);
    cr_assert_eq(th_write_file(expect, "{\"ledger\":{},\"applied\":0}\n"), 0);
    int port = th_free_port();
    snprintf(bs, sizeof(bs), "kafka.bootstrap.servers=127.0.0.1:%d", port);
    snprintf(url, sizeof(url), "redis.url=%s", r.url);
    char *argv[] = {(char *)th_bin(), "verify",      "--set", bs,
                    "--set",          "group.id=g",  "--set", "input.topics=t",
                    "--set",          "dlq.topic=d", "--set", url,
                    "--expect",       expect,        "--dlq", "--timeout-ms",
                    "1500",           NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &out, &err, 30000), 1, "%s%s", out, err);
    char want[128];
    snprintf(want, sizeof(want),
             "no Kafka broker reachable at 127.0.0.1:%d within 1500 ms", port);
    cr_expect(strstr(err, want), "%s", err);
    free(out);
    free(err);
    th_rmrf(dir);
    free(dir);
    th_redis_stop(&r);
}

/* ---- own events: verify for forward, script and webhook ----------------
 * Orders of an own schema: the identity at /meta/event_id (a string, or an
 * integer for every third order, as Debezium writes them), the key at
 * /customer/id, a line-item array; two duplicates (a redelivery and a
 * resend) and two poison lines (not JSON, no identity). produce -c
 * predicts with the member's configuration; verify must say exact, and a
 * wrong expectation must make it fail. */

#define ORDERS    60
#define CUSTOMERS 5

static th_stack_t own;

static void own_fini(void)
{
    th_stack_cleanup();
}

TestSuite(ownevents, .fini = own_fini);

/* One order's line; qty sums to i % 4 + 1 + 2. */
static void order_line(FILE *fp, int i, const char *mid)
{
    if (i % 3 == 0)
        fprintf(fp, "{\"meta\":{\"event_id\":%d,\"source\":\"shop\"},",
                100000 + i);
    else
        fprintf(fp, "{\"meta\":{\"event_id\":\"ord-%d\",\"source\":\"shop\"},",
                i);
    fprintf(fp,
            "\"message_id\":\"%s\",\"customer\":{\"id\":\"c-%d\"},"
            "\"items\":[{\"sku\":\"s-%d\",\"qty\":%d},{\"sku\":\"s-x\","
            "\"qty\":2}],\"total\":12.50}\n",
            mid, i % CUSTOMERS, i, i % 4 + 1);
}

/* Writes the orders file; *qty[c] gets each customer's items. */
static void orders_write(const char *path, long qty[CUSTOMERS])
{
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    char mid[32];
    for (int c = 0; c < CUSTOMERS; c++)
        qty[c] = 0;
    for (int i = 1; i <= ORDERS; i++) {
        snprintf(mid, sizeof(mid), "m-%d", i);
        order_line(fp, i, mid);
        qty[i % CUSTOMERS] += i % 4 + 1 + 2;
    }
    order_line(fp, 1, "m-1");    /* a redelivery */
    order_line(fp, 2, "m-2-re"); /* a resend: new message id */
    fprintf(fp, "not an order\n");
    fprintf(fp, "{\"meta\":{},\"message_id\":\"m-none\",\"customer\":{\"id\":"
                "\"c-1\"},\"items\":[]}\n");
    fclose(fp);
}

/* Starts the stack with the member's configuration in its properties,
 * writes the orders and produces them with -c, predicting with it. */
static void own_start(const char *const props[], long qty[CUSTOMERS])
{
    cr_assert_eq(th_stack_start(&own, 4, props), 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/orders.jsonl", own.dir);
    orders_write(path, qty);
    char *argv[] = {(char *)th_bin(), "produce",      "-c",       own.conf,
                    "--input",        path,           "--expect", own.expect,
                    "--key-field",    "/customer/id", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(th_run(argv, &out, &err, 60000), 0, "%s", err);
    free(out);
    free(err);
    json_error_t jerr;
    json_t *e = json_load_file(own.expect, 0, &jerr);
    cr_assert(e, "%s", jerr.text);
    cr_expect_eq(json_integer_value(json_object_get(e, "unique")), ORDERS);
    cr_expect_eq(json_integer_value(json_object_get(e, "applied")), ORDERS);
    json_t *d = json_object_get(e, "duplicates");
    cr_expect_eq(json_integer_value(json_object_get(d, "redelivery")), 1);
    cr_expect_eq(json_integer_value(json_object_get(d, "resend")), 1);
    json_t *p = json_object_get(e, "poison");
    cr_expect_eq(json_integer_value(json_object_get(p, "not-object")) +
                     json_integer_value(json_object_get(p, "not-json")),
                 1);
    cr_expect_eq(json_integer_value(json_object_get(p, "no-identity")), 1);
    cr_expect_eq(json_array_size(json_object_get(e, "identities")), ORDERS);
    json_t *ids = json_object_get(e, "identities");
    int numeric = 0;
    size_t i;
    json_t *id;
    json_array_foreach(ids, i, id) numeric +=
        !strcmp(json_string_value(id), "100003");
    cr_expect_eq(numeric, 1, "the integer identity 100003 as its digits");
    cr_expect_null(json_object_get(e, "ledger"), "no ledger for %s", props[0]);
    json_decref(e);
}

/* Rewrites the expectation with member `name` set to v (stolen). */
static void expect_set(const char *path, const char *name, json_t *v)
{
    json_t *e = json_load_file(path, 0, NULL);
    cr_assert(e);
    json_object_set_new(e, name, v);
    cr_assert_eq(json_dump_file(e, path, JSON_INDENT(2)), 0);
    json_decref(e);
}

/* verify on a copy of the expectation with one identity too many fails,
 * naming it. */
static void expect_extra_identity_fails(const char *want)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/wrong.json", own.dir);
    json_t *e = json_load_file(own.expect, 0, NULL);
    cr_assert(e);
    json_array_append_new(json_object_get(e, "identities"),
                          json_string("ord-999"));
    json_object_set_new(e, "applied", json_integer(ORDERS + 1));
    cr_assert_eq(json_dump_file(e, path, 0), 0);
    json_decref(e);
    char *argv[] = {(char *)th_bin(), "verify", "-c",    own.conf,
                    "--expect",       path,     "--dlq", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &out, &err, 60000), 1, "%s%s", out, err);
    cr_expect(strstr(out, want), "want \"%s\" in:\n%s%s", want, out, err);
    cr_expect(strstr(out, "verify: MISMATCH"), "%s", out);
    free(out);
    free(err);
}

Test(ownevents, forward_run_is_exact_with_values_as_sent, .timeout = 180)
{
    const char *props[] = {"handler=forward", "output.topic=payments.out",
                           "forward.processed.at=false",
                           "envelope.identity=value:/meta/event_id", NULL};
    long qty[CUSTOMERS];
    own_start(props, qty);
    json_t *e = json_load_file(own.expect, 0, NULL);
    cr_expect_eq(json_object_size(json_object_get(e, "output")), ORDERS,
                 "forward.processed.at=false: each value is expected as sent");
    json_decref(e);
    pid_t m = th_stack_member(&own, "f1", NULL);
    char *vout = NULL;
    int vrc = th_stack_wait_verified(&own, 1, NULL, 90000, &vout);
    cr_assert_eq(vrc, 0, "verify never exact:\n%s", vout);
    cr_expect(strstr(vout, "verify: output exact (60 identities once each on "
                           "payments.out, values as sent)"),
              "%s", vout);
    cr_expect(strstr(vout, "verify: marks exact (60 identities applied"), "%s",
              vout);
    cr_expect(strstr(vout, "verify: dlq exact (2 distinct records"), "%s",
              vout);
    free(vout);
    expect_extra_identity_fails("output: identity ord-999: missing from "
                                "payments.out");
    /* A value that differs from the one sent is named. */
    e = json_load_file(own.expect, 0, NULL);
    json_t *out = json_deep_copy(json_object_get(e, "output"));
    json_object_set_new(out, "ord-1", json_string("{\"changed\":true}"));
    json_decref(e);
    expect_set(own.expect, "output", out);
    char *argv[] = {(char *)th_bin(), "verify",   "-c", own.conf,
                    "--expect",       own.expect, NULL};
    char *o = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &o, &err, 60000), 1, "%s%s", o, err);
    cr_expect(strstr(o, "output: identity ord-1: value differs"), "%s", o);
    free(o);
    free(err);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&own);
}

static const char orders_lua[] =
    "-- items per customer and orders counted, once per order\n"
    "function effect(rec)\n"
    "  local q = 0\n"
    "  for _, it in ipairs(rec.fields['/items']) do q = q + it.qty end\n"
    "  idem.hincrby('orders:items', rec.fields['/customer/id'], q)\n"
    "  idem.incrby('orders:count', 1)\n"
    "end\n";

Test(ownevents, script_run_is_exact_with_redis_values, .timeout = 180)
{
    char *dir = th_tmpdir();
    char lua[600], file[700];
    snprintf(lua, sizeof(lua), "%s/orders.lua", dir);
    cr_assert_eq(th_write_file(lua, orders_lua), 0);
    snprintf(file, sizeof(file), "script.file=%s", lua);
    const char *props[] = {"handler=script", file,
                           "script.fields=/customer/id,/items",
                           "envelope.identity=value:/meta/event_id", NULL};
    long qty[CUSTOMERS];
    own_start(props, qty);
    json_t *items = json_object();
    for (int c = 0; c < CUSTOMERS; c++) {
        char name[16];
        snprintf(name, sizeof(name), "c-%d", c);
        json_object_set_new(items, name, json_integer(qty[c]));
    }
    expect_set(own.expect, "redis",
               json_pack("{so sI}", "orders:items", items, "orders:count",
                         (json_int_t)ORDERS));
    pid_t m = th_stack_member(&own, "s1", NULL);
    char *vout = NULL;
    int vrc = th_stack_wait_verified(&own, 1, NULL, 90000, &vout);
    cr_assert_eq(vrc, 0, "verify never exact:\n%s", vout);
    cr_expect(strstr(vout, "verify: marks exact (60 identities applied"), "%s",
              vout);
    cr_expect(strstr(vout, "verify: redis exact (6 values)"), "%s", vout);
    free(vout);
    expect_extra_identity_fails("identity ord-999: not applied");
    /* A Redis value other than the expected one is named. */
    expect_set(own.expect, "redis",
               json_pack("{s{sI}}", "orders:items", "c-1", (json_int_t)1));
    char *argv[] = {(char *)th_bin(), "verify",   "-c", own.conf,
                    "--expect",       own.expect, NULL};
    char *o = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &o, &err, 60000), 1, "%s%s", o, err);
    char want[128];
    snprintf(want, sizeof(want),
             "redis orders:items c-1: expected 1, got \"%ld\"", qty[1]);
    cr_expect(strstr(o, want), "want %s in %s", want, o);
    free(o);
    free(err);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&own);
    th_rmrf(dir);
    free(dir);
}

Test(ownevents, webhook_run_is_exact_by_its_marks, .timeout = 180)
{
    th_hook_t *srv = th_hook_start((th_hook_reply_t){.status = 200}, 1);
    cr_assert(srv);
    char url[256];
    snprintf(url, sizeof(url), "webhook.url=%s", th_hook_url(srv));
    const char *props[] = {"handler=webhook", url,
                           "envelope.identity=value:/meta/event_id", NULL};
    long qty[CUSTOMERS];
    own_start(props, qty);
    pid_t m = th_stack_member(&own, "w1", NULL);
    char *vout = NULL;
    int vrc = th_stack_wait_verified(&own, 1, NULL, 90000, &vout);
    cr_assert_eq(vrc, 0, "verify never exact:\n%s", vout);
    cr_expect(strstr(vout, "verify: marks exact (60 identities applied"), "%s",
              vout);
    free(vout);
    /* What verify read from the marks, the service received: each order
     * acknowledged once under its identity. */
    cr_expect_eq(th_hook_count_key(srv, "ord-1", 1), 1);
    cr_expect_eq(th_hook_count_key(srv, "100003", 1), 1);
    expect_extra_identity_fails("identity ord-999: not applied");
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&own);
    th_hook_stop(srv);
}

/* --key-field names a JSON Pointer; a JSON object without a string or
 * integer there is not sent (a null key would scatter a customer's
 * orders), and produce says so and exits 1. */
Test(ownevents, key_field_refuses_a_line_without_the_key, .timeout = 60)
{
    th_broker_t b;
    const char *bargs[] = {"--topic", "orders:2", NULL};
    cr_assert_eq(th_broker_start(&b, bargs), 0);
    char *dir = th_tmpdir();
    char path[600];
    snprintf(path, sizeof(path), "%s/in.jsonl", dir);
    cr_assert_eq(th_write_file(path,
                               "{\"order\":{\"customer\":{\"id\":\"c-1\"}}}\n"
                               "{\"order\":{\"customer\":{}}}\n"
                               "not json\n"),
                 0);
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    b.bootstrap,
                    "-t",
                    "orders",
                    "--input",
                    path,
                    "--key-field",
                    "/order/customer/id",
                    NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &out, &err, 60000), 1, "%s", err);
    cr_expect(strstr(err, "line 2: --key-field /order/customer/id: no string "
                          "or integer there; line not sent"),
              "%s", err);
    cr_expect(strstr(err, "produce: sent 2, acked 2"), "%s", err);
    cr_expect(strstr(err, "refused 1 (--key-field)"), "%s", err);
    free(out);
    free(err);
    th_rmrf(dir);
    free(dir);
    th_broker_stop(&b);
}
