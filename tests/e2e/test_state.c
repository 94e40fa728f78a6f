/* test_state: `idemproc state get` on a single Redis (a real
 * redis-server): a ledger balance as the plain hash holds it, text and
 * JSON, an absent one is 0, usage errors exit 2, Redis down exits 1. The
 * cluster's sum over shards is tested in test_cluster_cmds.c. */
#include "harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static th_redis_t red;
static char conf_path[600];

static void state_init(void)
{
    cr_assert_eq(th_redis_start(&red), 0, "redis did not start");
    snprintf(conf_path, sizeof(conf_path), "%s/state.properties", red.dir);
    char conf[1024];
    snprintf(conf, sizeof(conf),
             "kafka.bootstrap.servers=127.0.0.1:1\ngroup.id=g\n"
             "input.topics=payments\ndlq.topic=payments.dlq\n"
             "redis.url=%s\nredis.timeout.ms=2000\n",
             red.url);
    th_write_file(conf_path, conf);
}

static void state_fini(void)
{
    th_redis_stop(&red);
}

TestSuite(state, .init = state_init, .fini = state_fini);

/* `idemproc state get ARGS... -c conf`; the exit code, *out and *err. */
static int state_get(const char *const args[], char **out, char **err)
{
    char *argv[16] = {(char *)th_bin(), "state", "get"};
    int n = 3;
    for (int i = 0; args[i] && n < 13; i++)
        argv[n++] = (char *)args[i];
    argv[n++] = "-c";
    argv[n++] = conf_path;
    argv[n] = NULL;
    return th_run(argv, out, err, 30000);
}

Test(state, ledger_balance_from_the_plain_hash_text_and_json)
{
    const char *hset[] = {
        "HSET", "idemproc:ledger:EUR", "u1", "12345", "u2", "-700", NULL};
    char *o = th_redis_cli(&red, hset);
    free(o);
    char *out = NULL, *err = NULL;
    const char *a[] = {"ledger", "EUR", "u1", NULL};
    cr_assert_eq(state_get(a, &out, &err), 0, "%s", err);
    cr_expect_str_eq(out, "ledger EUR u1: 12345\n");
    free(out);
    free(err);
    const char *b[] = {"ledger", "EUR", "u2", "--json", NULL};
    cr_assert_eq(state_get(b, &out, &err), 0, "%s", err);
    json_error_t je;
    json_t *doc = json_loads(out, 0, &je);
    cr_assert(doc, "%s: %s", je.text, out);
    cr_expect_eq(json_integer_value(json_object_get(doc, "minor")), -700);
    cr_expect_eq(json_integer_value(json_object_get(doc, "shards")), 1);
    cr_expect(json_is_false(json_object_get(doc, "cluster")));
    cr_expect_str_eq(json_string_value(json_object_get(doc, "currency")),
                     "EUR");
    json_decref(doc);
    free(out);
    free(err);
    /* Absent: 0, and said so. */
    const char *c[] = {"ledger", "USD", "u1", NULL};
    cr_assert_eq(state_get(c, &out, &err), 0, "%s", err);
    cr_expect_str_eq(out, "ledger USD u1: 0 (no such field)\n");
    free(out);
    free(err);
}

Test(state, usage_errors_exit_2_and_redis_down_exits_1)
{
    char *out = NULL, *err = NULL;
    const char *kind[] = {"balance", "EUR", "u1", NULL};
    cr_expect_eq(state_get(kind, &out, &err), 2);
    cr_expect(strstr(err, "unknown kind \"balance\" (kinds: ledger script)"),
              "%s", err);
    free(out);
    free(err);
    const char *few[] = {"ledger", "EUR", NULL};
    cr_expect_eq(state_get(few, &out, &err), 2);
    cr_expect(strstr(err, "takes CURRENCY USER"), "%s", err);
    free(out);
    free(err);
    th_redis_kill(&red); /* keeps the dir and the config in it */
    const char *a[] = {"ledger", "EUR", "u1", NULL};
    cr_expect_eq(state_get(a, &out, &err), 1, "%s", out);
    cr_expect(strstr(err, "idemproc state get ledger: "), "%s", err);
    free(out);
    free(err);
}
