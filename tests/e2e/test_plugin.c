/* test_plugin (e2e): handler=plugin:PATH.so. The loader (dlopen, the ABI
 * check, clear errors), the adapter between the public plugin interface
 * and the loop's handler interface driven directly with records, and the
 * example plugin config/examples/filesink.c as built by the Makefile. */
#include "conf/conf.h"
#include "effect/handler.h"
#include "harness.h"
#include "effect/plugin.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <libgen.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

TestSuite(plugin);
/* Through `idemproc run` with the embedded broker and a real Redis. */
TestSuite(plugin_run, .fini = th_stack_cleanup);

/* build/plugins/<name>.so (examples) or build/tplugins/<name>.so (test
 * plugins), next to the binary under test. */
static const char *plugin_path(const char *dir, const char *name)
{
    static char path[1024];
    char bin[900];
    snprintf(bin, sizeof(bin), "%s", th_bin());
    snprintf(path, sizeof(path), "%s/%s/%s.so", dirname(bin), dir, name);
    cr_assert_eq(access(path, R_OK), 0, "%s not built", path);
    return path;
}

Test(plugin, loads_the_example_and_checks_its_table)
{
    char err[512] = "";
    idem_plugin_t *pl =
        idem_plugin_open(plugin_path("plugins", "filesink"), err, sizeof(err));
    cr_assert(pl, "%s", err);
    const idemproc_plugin_t *t = idem_plugin_table(pl);
    cr_expect_str_eq(t->name, "filesink");
    cr_expect_eq(t->abi_version, IDEMPROC_PLUGIN_ABI_VERSION);
    cr_expect_eq(t->struct_size, sizeof(idemproc_plugin_t));
    cr_expect(t->keys && !strcmp(t->keys[0].name, "output"));
    idem_plugin_close(pl);
    idem_plugin_close(NULL);
}

/* Shared objects idemproc refuses at load, before any of their ops runs
 * (each op of abi_v1 and abi_next aborts), and what the error must say.
 * Values, not pointers: the test runs in another process image. */
typedef struct {
    char plugin[16];  /* build/tplugins/<plugin>.so */
    int abi;          /* the version it was built for; 0: not an ABI case */
    char want[2][64]; /* more substrings of the error ("": none) */
} refusal_t;

ParameterizedTestParameters(plugin, refuses_at_load)
{
    static refusal_t cases[] = {
        /* built against another version of idemproc/plugin.h: both
         * versions, what to do, and the path */
        {"abi_next", IDEMPROC_PLUGIN_ABI_VERSION + 1, {""}},
        /* built for version 1 (before room() was added): refused by its
         * version, not read past its shorter table */
        {"abi_v1", 1, {""}},
        {"no_table", 0, {"not an idemproc plugin", "\"idemproc_plugin\""}},
        {"bad_key", 0, {"cannot be set (plugin.<key>.file reads"}},
    };
    return cr_make_param_array(refusal_t, cases,
                               sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(refusal_t *c, plugin, refuses_at_load)
{
    char err[512] = "";
    const char *path = plugin_path("tplugins", c->plugin);
    cr_assert_null(idem_plugin_open(path, err, sizeof(err)), "%s loaded",
                   c->plugin);
    if (c->abi) {
        char want[128];
        snprintf(want, sizeof(want),
                 "built for plugin ABI version %d, but this idemproc loads "
                 "version %d: rebuild",
                 c->abi, IDEMPROC_PLUGIN_ABI_VERSION);
        cr_expect(strstr(err, want), "%s: %s", c->plugin, err);
        cr_expect(strstr(err, path), "%s: the path is missing: %s", c->plugin,
                  err);
    }
    for (size_t i = 0; i < 2 && c->want[i][0]; i++)
        cr_expect(strstr(err, c->want[i]), "%s: no \"%s\" in: %s", c->plugin,
                  c->want[i], err);
}

/* dlopen would find "libc.so.6" in the system's library directories; a
 * plugin named in a configuration is a file, so a bare name means the
 * working directory (where there is no such file). */
Test(plugin, bare_name_is_a_file_in_the_working_directory)
{
    char err[512] = "";
    char *dir = th_tmpdir();
    char cwd[1024];
    cr_assert(getcwd(cwd, sizeof(cwd)));
    cr_assert_eq(chdir(dir), 0);
    idem_plugin_t *pl = idem_plugin_open("libc.so.6", err, sizeof(err));
    cr_expect_null(pl, "a bare name was searched in the system's directories");
    idem_plugin_close(pl);
    cr_expect(strstr(err, "./libc.so.6"), "%s", err);
    /* ... and is found there. */
    char copy[1200];
    snprintf(copy, sizeof(copy), "cp '%s' '%s/filesink.so'",
             plugin_path("plugins", "filesink"), dir);
    cr_assert_eq(system(copy), 0);
    pl = idem_plugin_open("filesink.so", err, sizeof(err));
    cr_expect(pl, "%s", err);
    idem_plugin_close(pl);
    cr_assert_eq(chdir(cwd), 0);
    th_rmrf(dir);
    free(dir);
}

/* ------------------------------------------------- the adapter, directly */

/* Adds plugin.<name>=value to conf as the conf stores set handler keys. */
static void conf_plugin_key(idem_conf_t *conf, const char *name,
                            const char *value)
{
    char key[256];
    snprintf(key, sizeof(key), "plugin.%s", name);
    conf->hkeys =
        realloc(conf->hkeys, (conf->hkeys_cnt + 1) * sizeof(*conf->hkeys));
    conf->hkeys[conf->hkeys_cnt].name = strdup(key);
    conf->hkeys[conf->hkeys_cnt].value = strdup(value);
    conf->hkeys_cnt++;
}

static idem_record_t record(const char *identity, const char *value,
                            int64_t offset)
{
    idem_record_t r = {0};
    r.topic = "events";
    r.partition = 0;
    r.offset = offset;
    r.timestamp = 1700000000000;
    r.identity = identity;
    r.identity_len = strlen(identity);
    r.value = value;
    r.value_len = value ? strlen(value) : 0;
    r.message_id = "";
    return r;
}

static int validate(idem_conf_t *conf, const char *path, char *err,
                    size_t err_size)
{
    return idem_handler_plugin.validate(conf, path, err, err_size);
}

Test(plugin, validate_checks_the_plugins_keys)
{
    const char *path = plugin_path("plugins", "filesink");
    char err[512] = "";
    idem_conf_t *conf = idem_conf_new();
    cr_expect_neq(validate(conf, path, err, sizeof(err)), 0);
    cr_expect(strstr(err, "plugin.output: required by plugin filesink"), "%s",
              err);
    conf_plugin_key(conf, "output", "/tmp/x");
    cr_expect_eq(validate(conf, path, err, sizeof(err)), 0, "%s", err);
    conf_plugin_key(conf, "fsync", "maybe");
    cr_expect_neq(validate(conf, path, err, sizeof(err)), 0);
    cr_expect(strstr(err, "plugin filesink: plugin.fsync: \"maybe\" is not "
                          "true or false"),
              "%s", err);
    idem_conf_destroy(conf);

    conf = idem_conf_new();
    conf_plugin_key(conf, "output", "/tmp/x");
    conf_plugin_key(conf, "fsnyc", "false");
    cr_expect_neq(validate(conf, path, err, sizeof(err)), 0);
    cr_expect(strstr(err, "plugin.fsnyc: not a key of plugin filesink (its "
                          "keys: plugin.output, plugin.fsync,"),
              "%s", err);
    idem_conf_destroy(conf);

    conf = idem_conf_new();
    cr_expect_neq(
        validate(conf, plugin_path("tplugins", "abi_next"), err, sizeof(err)),
        0);
    cr_expect(strstr(err, "built for plugin ABI version"), "%s", err);
    idem_conf_destroy(conf);
}

/* Drives the adapter as the loop does: start, submit, collect, drain,
 * stop; returns how many results collect gave (into res). */
static size_t run_batch(idem_conf_t *conf, idem_record_t *recs, size_t n,
                        idem_result_t *res)
{
    char err[512] = "";
    const char *path = plugin_path("plugins", "filesink");
    cr_assert_eq(validate(conf, path, err, sizeof(err)), 0, "%s", err);
    idem_handler_ctx_t ctx = {.conf = conf, .arg = path, .member_id = "t"};
    void *h = idem_handler_plugin.start(&ctx, err, sizeof(err));
    cr_assert(h, "%s", err);
    idem_record_t *ptrs[16];
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &recs[i];
    cr_assert_eq(
        idem_handler_plugin.submit(h, ptrs, n, NULL, 0, err, sizeof(err)), 0,
        "%s", err);
    cr_expect_eq(idem_handler_plugin.inflight(h), n);
    size_t got = 0;
    for (int t = 0; t < 100 && got < n; t++)
        got += idem_handler_plugin.collect(h, res + got, n - got, 10);
    cr_expect_eq(idem_handler_plugin.inflight(h), 0);
    idem_handler_plugin.drain(h, 0);
    cr_expect_eq(idem_handler_plugin.collect(h, res + got, 1, 0), 0);
    idem_handler_plugin.stop(h);
    return got;
}

/* The result of record r among res[n]. */
static const idem_result_t *result_of(const idem_result_t *res, size_t n,
                                      const idem_record_t *r)
{
    for (size_t i = 0; i < n; i++)
        if (res[i].rec == r)
            return &res[i];
    cr_assert_fail("no result for offset %lld", (long long)r->offset);
    return NULL;
}

Test(plugin, example_writes_lines_and_reports_every_result_kind)
{
    char *dir = th_tmpdir();
    char file[600];
    snprintf(file, sizeof(file), "%s/out.tsv", dir);
    idem_conf_t *conf = idem_conf_new();
    conf_plugin_key(conf, "output", file);
    conf_plugin_key(conf, "max.value.bytes", "20");
    conf_plugin_key(conf, "oversize", "retry");
    idem_record_t recs[5] = {
        record("id-1", "{\"a\":1}", 10),
        record("id-2", "{\"a\":\n2}", 11), /* a newline: cannot be a line */
        record("id-3", "{\"a\":\"far too long a value\"}", 12),
        record("id-4", NULL, 13), /* a null value: an empty line */
        record("id\t5", "x", 14),
    };
    idem_result_t res[8];
    size_t got = run_batch(conf, recs, 5, res);
    cr_assert_eq(got, 5);
    cr_expect_eq(result_of(res, got, &recs[0])->kind, IDEM_RESULT_DONE);
    const idem_result_t *r = result_of(res, got, &recs[1]);
    cr_expect_eq(r->kind, IDEM_RESULT_REJECT);
    cr_expect(strstr(r->detail, "newline"), "%s", r->detail);
    r = result_of(res, got, &recs[2]);
    cr_expect_eq(r->kind, IDEM_RESULT_RETRY);
    cr_expect(strstr(r->detail, "over plugin.max.value.bytes (20)"), "%s",
              r->detail);
    cr_expect_eq(r->retry_after_ms, 0);
    cr_expect_eq(result_of(res, got, &recs[3])->kind, IDEM_RESULT_DONE);
    cr_expect_eq(result_of(res, got, &recs[4])->kind, IDEM_RESULT_REJECT);
    char *text = th_slurp(file, NULL);
    cr_expect_str_eq(text, "id-1\t{\"a\":1}\nid-4\t\n");
    free(text);
    idem_conf_destroy(conf);
    th_rmrf(dir);
    free(dir);
}

/* A file that cannot be written (a full disk: /dev/full) is an outage,
 * never a dead letter. */
Test(plugin, example_write_failure_is_an_outage)
{
    idem_conf_t *conf = idem_conf_new();
    conf_plugin_key(conf, "output", "/dev/full");
    conf_plugin_key(conf, "fsync", "false");
    idem_record_t recs[2] = {record("id-1", "a", 1), record("id-2", "b\n", 2)};
    idem_result_t res[4];
    size_t got = run_batch(conf, recs, 2, res);
    cr_assert_eq(got, 2);
    const idem_result_t *r = result_of(res, got, &recs[0]);
    cr_expect_eq(r->kind, IDEM_RESULT_OUTAGE);
    cr_expect(strstr(r->detail, "plugin filesink: filesink: write: No space"),
              "%s", r->detail);
    cr_expect_eq(result_of(res, got, &recs[1])->kind, IDEM_RESULT_REJECT);
    idem_conf_destroy(conf);
}

/* A plugin that cannot start says why, with its name. */
Test(plugin, start_failure_names_the_plugin_and_the_file)
{
    char err[512] = "";
    idem_conf_t *conf = idem_conf_new();
    conf_plugin_key(conf, "output", "/nonexistent/dir/out.tsv");
    const char *path = plugin_path("plugins", "filesink");
    idem_handler_ctx_t ctx = {.conf = conf, .arg = path, .member_id = "t"};
    cr_assert_null(idem_handler_plugin.start(&ctx, err, sizeof(err)));
    cr_expect(strstr(err, "plugin filesink: start: plugin.output: "
                          "/nonexistent/dir/out.tsv: No such file"),
              "%s", err);
    idem_conf_destroy(conf);
}

/* ---------------------------------------- the adapter with the probe plugin */

typedef struct {
    idem_conf_t *conf;
    void *h;
    idem_handler_ctx_t ctx;
} probe_run_t;

/* Validates and starts the adapter on build/<dir>/<name>.so with the
 * plugin key `key` set to `value` (none when key is NULL). */
static void adapter_start(probe_run_t *pr, const char *dir, const char *name,
                          const char *key, const char *value)
{
    char err[512] = "";
    pr->conf = idem_conf_new();
    if (key)
        conf_plugin_key(pr->conf, key, value);
    const char *path = plugin_path(dir, name);
    cr_assert_eq(validate(pr->conf, path, err, sizeof(err)), 0, "%s", err);
    pr->ctx =
        (idem_handler_ctx_t){.conf = pr->conf, .arg = path, .member_id = "t"};
    pr->h = idem_handler_plugin.start(&pr->ctx, err, sizeof(err));
    cr_assert(pr->h, "%s", err);
}

/* The probe plugin, with plugin.bogus=<bogus> unless NULL. */
static void probe_start(probe_run_t *pr, const char *bogus)
{
    adapter_start(pr, "tplugins", "probe", bogus ? "bogus" : NULL, bogus);
}

static void probe_end(probe_run_t *pr)
{
    idem_handler_plugin.stop(pr->h);
    idem_conf_destroy(pr->conf);
}

/* Collects until `want` results arrived (the probe gives two a call). */
static size_t collect_all(void *h, idem_result_t *res, size_t want)
{
    size_t got = 0;
    for (int t = 0; t < 50 && got < want; t++)
        got += idem_handler_plugin.collect(h, res + got, want - got, 0);
    return got;
}

/* Results come back out of order and in pieces; each maps back to its
 * record with its kind, delay and detail; the headers reached the plugin
 * with their lengths (NUL bytes are data, a null header stays null). */
Test(plugin, results_map_back_to_their_records)
{
    probe_run_t pr;
    probe_start(&pr, NULL);
    idem_record_t recs[5] = {
        record("a", "done", 1),     record("b", "retry:250", 2),
        record("c", "outage", 3),   record("d", "reject", 4),
        record("e", "status42", 5),
    };
    rd_kafka_headers_t *hs = rd_kafka_headers_new(2);
    rd_kafka_header_add(hs, "trace", -1, "a\0b", 3);
    rd_kafka_header_add(hs, "empty", -1, NULL, 0);
    recs[3].headers = hs;
    idem_record_t *ptrs[5] = {&recs[0], &recs[1], &recs[2], &recs[3], &recs[4]};
    char err[512] = "";
    cr_assert_eq(
        idem_handler_plugin.submit(pr.h, ptrs, 5, NULL, 0, err, sizeof(err)), 0,
        "%s", err);
    cr_expect_eq(idem_handler_plugin.inflight(pr.h), 5);
    idem_result_t res[8];
    size_t got = collect_all(pr.h, res, 5);
    cr_assert_eq(got, 5);
    cr_expect_eq(res[0].rec, &recs[4], "not the probe's order");
    cr_expect_eq(result_of(res, got, &recs[0])->kind, IDEM_RESULT_DONE);
    const idem_result_t *r = result_of(res, got, &recs[1]);
    cr_expect_eq(r->kind, IDEM_RESULT_RETRY);
    cr_expect_eq(r->retry_after_ms, 250);
    cr_expect_str_eq(r->detail, "probe: later");
    r = result_of(res, got, &recs[2]);
    cr_expect_eq(r->kind, IDEM_RESULT_OUTAGE);
    cr_expect_str_eq(r->detail, "plugin probe: probe: down");
    r = result_of(res, got, &recs[3]);
    cr_expect_eq(r->kind, IDEM_RESULT_REJECT);
    cr_expect_str_eq(r->detail, "h=2 trace:3 empty:null");
    /* A status the interface does not have: retried, then max-retries. */
    r = result_of(res, got, &recs[4]);
    cr_expect_eq(r->kind, IDEM_RESULT_RETRY);
    cr_expect(strstr(r->detail, "unknown status 42"), "%s", r->detail);
    cr_expect_eq(idem_handler_plugin.inflight(pr.h), 0);
    rd_kafka_headers_destroy(hs);
    probe_end(&pr);
}

/* A plugin that reports a record it was never given is ignored (and
 * logged), never turned into a result for some other record. */
Test(plugin, result_for_a_record_never_submitted_is_ignored)
{
    probe_run_t pr;
    probe_start(&pr, "true");
    idem_record_t rec = record("a", "done", 1);
    idem_record_t *ptr = &rec;
    char err[512] = "";
    cr_assert_eq(
        idem_handler_plugin.submit(pr.h, &ptr, 1, NULL, 0, err, sizeof(err)),
        0);
    idem_result_t res[4];
    size_t got = collect_all(pr.h, res, 1);
    cr_assert_eq(got, 1);
    cr_expect_eq(res[0].rec, &rec);
    cr_expect_eq(res[0].kind, IDEM_RESULT_DONE);
    cr_expect_eq(idem_handler_plugin.collect(pr.h, res, 4, 0), 0);
    probe_end(&pr);
}

/* room(): the plugin's own answer (plugin.room minus what it holds), or
 * no limit for a plugin without a room op (filesink). */
Test(plugin, room_is_the_plugins_or_unlimited)
{
    probe_run_t pr;
    probe_start(&pr, NULL);
    cr_expect_eq(idem_handler_plugin.room(pr.h), SIZE_MAX);
    probe_end(&pr);

    char err[512] = "";
    adapter_start(&pr, "tplugins", "probe", "room", "3");
    cr_expect_eq(idem_handler_plugin.room(pr.h), 3);
    idem_record_t recs[3] = {record("a", "hold", 1), record("b", "done", 2),
                             record("c", "hold", 3)};
    idem_record_t *ptrs[3] = {&recs[0], &recs[1], &recs[2]};
    cr_assert_eq(
        idem_handler_plugin.submit(pr.h, ptrs, 3, NULL, 0, err, sizeof(err)),
        0);
    cr_expect_eq(idem_handler_plugin.room(pr.h), 0);
    idem_result_t res[4];
    cr_expect_eq(collect_all(pr.h, res, 1), 1);
    cr_expect_eq(idem_handler_plugin.room(pr.h), 1, "b collected");
    idem_handler_plugin.drain(pr.h, 0);
    probe_end(&pr);

    adapter_start(&pr, "plugins", "filesink", "output", "/dev/null");
    cr_expect_eq(idem_handler_plugin.room(pr.h), SIZE_MAX);
    probe_end(&pr);
}

/* drain keeps what finished for the next collect and forgets what the
 * plugin abandoned: afterwards nothing is in flight. */
Test(plugin, drain_keeps_finished_results_and_forgets_the_rest)
{
    probe_run_t pr;
    probe_start(&pr, NULL);
    idem_record_t recs[3] = {record("a", "hold", 1), record("b", "done", 2),
                             record("c", "done", 3)};
    idem_record_t *ptrs[3] = {&recs[0], &recs[1], &recs[2]};
    char err[512] = "";
    cr_assert_eq(
        idem_handler_plugin.submit(pr.h, ptrs, 3, NULL, 0, err, sizeof(err)),
        0);
    idem_handler_plugin.drain(pr.h, 0);
    cr_expect_eq(idem_handler_plugin.inflight(pr.h), 2, "finished: 2");
    idem_result_t res[4];
    size_t got = idem_handler_plugin.collect(pr.h, res, 4, 0);
    cr_assert_eq(got, 2);
    cr_expect_eq(result_of(res, got, &recs[1])->kind, IDEM_RESULT_DONE);
    cr_expect_eq(result_of(res, got, &recs[2])->kind, IDEM_RESULT_DONE);
    cr_expect_eq(idem_handler_plugin.inflight(pr.h), 0);
    probe_end(&pr);
}

/* Thousands in flight over several submits, results newest first and
 * oldest first (the probe's plugin.order): each maps to its own record
 * (the adapter's set of records in flight grows, and deletes without
 * losing any). */
typedef struct {
    char name[8]; /* a value: the test runs in another process image */
} order_t;

ParameterizedTestParameters(plugin, many_in_flight_map_back_exactly)
{
    static order_t orders[] = {{"newest"}, {"oldest"}};
    return cr_make_param_array(order_t, orders, 2);
}

ParameterizedTest(order_t *order_p, plugin, many_in_flight_map_back_exactly)
{
    const char *order = order_p->name;
    char err[512] = "";
    idem_conf_t *conf = idem_conf_new();
    conf_plugin_key(conf, "per.collect", "333");
    conf_plugin_key(conf, "order", order);
    const char *path = plugin_path("tplugins", "probe");
    idem_handler_ctx_t ctx = {.conf = conf, .arg = path, .member_id = "t"};
    void *h = idem_handler_plugin.start(&ctx, err, sizeof(err));
    cr_assert(h, "%s", err);
    enum { N = 3000 };
    idem_record_t *recs = calloc(N, sizeof(*recs));
    idem_record_t **ptrs = calloc(N, sizeof(*ptrs));
    for (int i = 0; i < N; i++) {
        recs[i] = record("x", "done", i);
        ptrs[i] = &recs[i];
    }
    for (int b = 0; b < 3; b++)
        cr_assert_eq(idem_handler_plugin.submit(h, ptrs + b * 1000, 1000, NULL,
                                                0, err, sizeof(err)),
                     0, "%s", err);
    cr_expect_eq(idem_handler_plugin.inflight(h), N);
    idem_result_t *res = calloc(N, sizeof(*res));
    size_t got = 0;
    for (int t = 0; t < 100 && got < N; t++)
        got += idem_handler_plugin.collect(h, res + got, N - got, 0);
    cr_assert_eq(got, N);
    char *seen = calloc(N, 1);
    for (size_t i = 0; i < got; i++) {
        ptrdiff_t k = res[i].rec - recs;
        cr_assert(k >= 0 && k < N && !seen[k],
                  "%s first: result %zu: record %td", order, i, k);
        seen[k] = 1;
        cr_expect_eq(res[i].kind, IDEM_RESULT_DONE, "%s first", order);
    }
    cr_expect_eq(res[0].rec, &recs[strcmp(order, "oldest") ? N - 1 : 0],
                 "%s first: not the probe's order", order);
    cr_expect_eq(idem_handler_plugin.inflight(h), 0);
    idem_handler_plugin.stop(h);
    free(seen);
    free(res);
    free(ptrs);
    free(recs);
    idem_conf_destroy(conf);
}

/* A refused submit is an outage with the plugin's reason, and none of the
 * batch stays in flight. */
Test(plugin, refused_submit_is_an_outage)
{
    probe_run_t pr;
    probe_start(&pr, NULL);
    idem_record_t recs[2] = {record("a", "done", 1), record("b", "refuse", 2)};
    idem_record_t *ptrs[2] = {&recs[0], &recs[1]};
    char err[512] = "";
    cr_expect_eq(
        idem_handler_plugin.submit(pr.h, ptrs, 2, NULL, 0, err, sizeof(err)),
        -1);
    cr_expect_str_eq(err, "plugin probe: probe: refused");
    cr_expect_eq(idem_handler_plugin.inflight(pr.h), 0);
    probe_end(&pr);
}

/* ------------------------------------------------ through `idemproc run` */

static th_stack_t stk;

/* Produces to `payments`, keyed by `key` (so one identity stays in one
 * partition, in order). value_len -1: strlen. */
typedef struct {
    rd_kafka_t *rk;
} producer_t;

static void producer_open(producer_t *p)
{
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", stk.broker.bootstrap, err,
                      sizeof(err));
    rd_kafka_conf_set(kc, "enable.idempotence", "true", err, sizeof(err));
    rd_kafka_conf_set(kc, "linger.ms", "5", err, sizeof(err));
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
    cr_assert(p->rk, "%s", err);
}

static void produce(producer_t *p, const char *key, const char *value)
{
    rd_kafka_resp_err_t err;
    do {
        err = rd_kafka_producev(p->rk, RD_KAFKA_V_TOPIC("payments"),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_KEY(key, strlen(key)),
                                RD_KAFKA_V_VALUE((void *)value, strlen(value)),
                                RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(p->rk, 50);
    } while (err == RD_KAFKA_RESP_ERR__QUEUE_FULL);
    cr_assert_eq(err, 0, "%s", rd_kafka_err2str(err));
}

static void producer_close(producer_t *p)
{
    cr_assert_eq(rd_kafka_flush(p->rk, 30000), 0, "produce not acknowledged");
    rd_kafka_destroy(p->rk);
}

/* The events: `unique` identities ev-<i> (value {"idempotency_key":
 * "ev-<i>","message_id":"m-<i>","n":<i>}), then redeliveries of every 10th
 * (same message_id), resends of every 20th from 5 (a new message_id and
 * n=-1), and 15 poison records: 5 not JSON, 5 without identity, 5 valid
 * JSON with a raw newline inside, which filesink rejects. Returns the
 * number of redeliveries and resends in *redeliveries / *resends. */
static void produce_events(int unique, int *redeliveries, int *resends,
                           int poison)
{
    producer_t p;
    producer_open(&p);
    char key[64], value[256];
    for (int i = 0; i < unique; i++) {
        snprintf(key, sizeof(key), "ev-%d", i);
        snprintf(value, sizeof(value),
                 "{\"idempotency_key\":\"ev-%d\",\"message_id\":\"m-%d\","
                 "\"n\":%d}",
                 i, i, i);
        produce(&p, key, value);
    }
    *redeliveries = *resends = 0;
    for (int i = 0; i < unique; i += 10, (*redeliveries)++) {
        snprintf(key, sizeof(key), "ev-%d", i);
        snprintf(value, sizeof(value),
                 "{\"idempotency_key\":\"ev-%d\",\"message_id\":\"m-%d\","
                 "\"n\":%d}",
                 i, i, i);
        produce(&p, key, value);
    }
    for (int i = 5; i < unique; i += 20, (*resends)++) {
        snprintf(key, sizeof(key), "ev-%d", i);
        snprintf(value, sizeof(value),
                 "{\"idempotency_key\":\"ev-%d\",\"message_id\":\"m-%d-again\","
                 "\"n\":-1}",
                 i, i);
        produce(&p, key, value);
    }
    for (int i = 0; poison && i < 5; i++) {
        snprintf(key, sizeof(key), "poison-%d", i);
        produce(&p, key, "{\"idempotency_key\": not json");
        produce(&p, key, "{\"n\":1}");
        snprintf(value, sizeof(value),
                 "{\"idempotency_key\":\"nl-%d\",\n\"n\":1}", i);
        produce(&p, key, value);
    }
    producer_close(&p);
}

/* Lines of the filesink output per identity: counts[i] for ev-<i>;
 * returns the number of lines, -1 on a line that is no event's. The first
 * line of each identity must hold its original value. */
static long file_lines(const char *path, int unique, int *counts)
{
    memset(counts, 0, sizeof(*counts) * (size_t)unique);
    char *text = th_slurp(path, NULL);
    if (!text)
        return 0;
    long lines = 0;
    for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = '\0';
        int i = -1;
        char want[128];
        if (sscanf(line, "ev-%d\t", &i) != 1 || i < 0 || i >= unique) {
            free(text);
            cr_assert_fail("a line of no event: %s", line);
            return -1;
        }
        if (counts[i]++ == 0) {
            snprintf(want, sizeof(want),
                     "ev-%d\t{\"idempotency_key\":\"ev-%d\",\"message_id\":"
                     "\"m-%d\",\"n\":%d}",
                     i, i, i, i);
            cr_expect_str_eq(line, want, "first line of ev-%d", i);
        }
        lines++;
    }
    free(text);
    return lines;
}

/* Reads the DLQ once from the beginning: counts by dlq.reason; *newline
 * gets how many handler-rejected ones name the newline in dlq.error. */
static long dlq_read(int *not_json, int *no_identity, int *rejected,
                     int *newline)
{
    *not_json = *no_identity = *rejected = *newline = 0;
    th_recs_t dlq = th_topic_read(stk.broker.bootstrap, "payments.dlq");
    for (size_t i = 0; i < dlq.n; i++) {
        const char *reason =
            json_string_value(json_object_get(dlq.v[i].headers, "dlq.reason"));
        const char *error =
            json_string_value(json_object_get(dlq.v[i].headers, "dlq.error"));
        if (!reason)
            continue;
        if (!strcmp(reason, "not-json"))
            (*not_json)++;
        else if (!strcmp(reason, "no-identity"))
            (*no_identity)++;
        else if (!strcmp(reason, "handler-rejected")) {
            (*rejected)++;
            if (error && strstr(error, "filesink: the value holds a newline"))
                (*newline)++;
        }
    }
    long n = (long)dlq.n;
    th_recs_free(&dlq);
    return n;
}

/* Waits until every ev-<i> has a line and the DLQ holds the 15 poison
 * records. Returns 0 when both happened. */
static int wait_complete(const char *file, int unique, int *counts,
                         int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 250) {
        long lines = file_lines(file, unique, counts);
        int missing = 0;
        for (int i = 0; i < unique; i++)
            missing += counts[i] == 0;
        int nj, ni, rj, nl;
        if (lines >= unique && !missing && dlq_read(&nj, &ni, &rj, &nl) >= 15)
            return 0;
        usleep(250000);
    }
    return -1;
}

static int metrics_port;

/* The last ~2 KB of a member's log, for failure messages (static). */
static const char *log_tail(const char *name)
{
    static char tail[2048];
    char path[700];
    snprintf(path, sizeof(path), "%s/%s.log", stk.dir, name);
    size_t len = 0;
    char *log = th_slurp(path, &len);
    snprintf(tail, sizeof(tail), "%s",
             log ? log + (len > 2000 ? len - 2000 : 0) : "(no log)");
    free(log);
    return tail;
}

/* key2: a second plugin key line, or NULL. */
static void plugin_stack_with(const char *dir, const char *name,
                              const char *key, const char *key2,
                              const char *batch)
{
    static char handler[1200], pkey[700], listen[64], bmax[64];
    snprintf(handler, sizeof(handler), "handler=plugin:%s",
             plugin_path(dir, name));
    snprintf(pkey, sizeof(pkey), "%s", key);
    metrics_port = th_free_port();
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", metrics_port);
    snprintf(bmax, sizeof(bmax), "batch.max.messages=%s", batch);
    const char *props[] = {handler, pkey, listen, bmax, "dedup.lease.ms=2000",
                           key2,    NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
}

static void plugin_stack(const char *file, const char *batch)
{
    char key[700];
    snprintf(key, sizeof(key), "plugin.output=%s", file);
    plugin_stack_with("plugins", "filesink", key, NULL, batch);
}

/* Without a crash the file holds exactly one line per identity, each the
 * first version of the event; duplicates of both kinds are counted and
 * written nothing; the poison and what filesink refuses are dead letters
 * with their reasons. */
Test(plugin_run, filesink_one_line_per_identity_and_poison_in_the_dlq,
     .timeout = 120)
{
    char *dir = th_tmpdir();
    char file[600];
    snprintf(file, sizeof(file), "%s/events.tsv", dir);
    plugin_stack(file, "100");
    int unique = 600, redeliveries, resends;
    produce_events(unique, &redeliveries, &resends, 1);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    int *counts = calloc((size_t)unique, sizeof(int));
    cr_assert_eq(wait_complete(file, unique, counts, 60000), 0,
                 "not every event reached the file and the DLQ; m1: %s",
                 log_tail("m1"));
    /* Let anything extra show up before the exact checks. */
    char *body = NULL;
    double dups = 0;
    for (int t = 0; t < 100 && dups < redeliveries + resends; t++) {
        free(body);
        body = NULL;
        th_http_get(metrics_port, "/metrics", &body);
        dups = body ? th_metric(body, "idemproc_records_total{outcome="
                                      "\"duplicate\"}")
                    : 0;
        usleep(100000);
    }
    cr_assert(body, "no /metrics");
    cr_expect_eq(file_lines(file, unique, counts), unique);
    for (int i = 0; i < unique; i++)
        cr_expect_eq(counts[i], 1, "ev-%d has %d lines", i, counts[i]);
    cr_expect_eq(
        th_metric(body, "idemproc_duplicates_total{kind=\"redelivery\"}"),
        redeliveries);
    cr_expect_eq(th_metric(body, "idemproc_duplicates_total{kind=\"resend\"}"),
                 resends);
    cr_expect_eq(
        th_metric(body, "idemproc_records_total{outcome=\"processed\"}"),
        unique);
    free(body);
    int nj, ni, rj, nl;
    cr_expect_eq(dlq_read(&nj, &ni, &rj, &nl), 15);
    cr_expect_eq(nj, 5);
    cr_expect_eq(ni, 5);
    cr_expect_eq(rj, 5);
    cr_expect_eq(nl, 5, "dlq.error lacks filesink's reason");
    cr_expect_eq(th_stop(m, 15000), 0);
    free(counts);
    th_stack_stop(&stk);
    th_rmrf(dir);
    free(dir);
}

/* A member killed mid-stream loses nothing: after a restart every
 * identity has its line. Only records in hand at the kill (effect done,
 * mark not; the loop holds at most 4 batches) may be written twice. */
Test(plugin_run, filesink_sigkill_and_restart_loses_nothing, .timeout = 180)
{
    char *dir = th_tmpdir();
    char file[600];
    snprintf(file, sizeof(file), "%s/events.tsv", dir);
    plugin_stack(file, "50");
    int unique = 8000, redeliveries, resends;
    produce_events(unique, &redeliveries, &resends, 1);
    int *counts = calloc((size_t)unique, sizeof(int));
    pid_t m = th_stack_member(&stk, "m1", NULL);
    long lines = 0;
    for (int t = 0; t < 1500 && lines < unique / 20; t++) {
        lines = file_lines(file, unique, counts);
        usleep(20000);
    }
    kill(m, SIGKILL);
    cr_expect_eq(th_wait(m, 5000), 128 + SIGKILL);
    lines = file_lines(file, unique, counts);
    cr_assert_geq(lines, unique / 20, "m1 never got going: %s", log_tail("m1"));
    cr_assert_lt(lines, unique, "killed too late to prove anything");
    long at_kill = lines;
    m = th_stack_member(&stk, "m2", NULL);
    cr_assert_eq(wait_complete(file, unique, counts, 120000), 0,
                 "an event was lost across the kill; m2: %s", log_tail("m2"));
    cr_expect_eq(th_stop(m, 15000), 0);
    lines = file_lines(file, unique, counts);
    cr_log_info("filesink: %ld lines for %d events (killed at %ld)", lines,
                unique, at_kill);
    cr_expect_leq(lines - unique, 4 * 50,
                  "%ld lines written twice: more than the records in hand",
                  lines - unique);
    int nj, ni, rj, nl;
    dlq_read(&nj, &ni, &rj, &nl);
    cr_expect(nj >= 5 && ni >= 5 && rj >= 5 && nl == rj,
              "DLQ: not-json %d, no-identity %d, rejected %d", nj, ni, rj);
    free(counts);
    th_stack_stop(&stk);
    th_rmrf(dir);
    free(dir);
}

static double metric(const char *name)
{
    char *body = NULL;
    if (th_http_get(metrics_port, "/metrics", &body) != 200 || !body) {
        free(body);
        return -1;
    }
    double v = th_metric(body, name);
    free(body);
    return v;
}

/* A plugin that reports OUTAGE pauses the member: not ready, nothing
 * processed, nothing dead-lettered, however long it lasts; once its service
 * is back, everything is processed exactly once per identity and the DLQ
 * stays empty. */
Test(plugin_run, outage_pauses_and_dead_letters_nothing, .timeout = 120)
{
    char *dir = th_tmpdir();
    char flag[600], key[700];
    snprintf(flag, sizeof(flag), "%s/down", dir);
    cr_assert_eq(th_write_file(flag, "down\n"), 0);
    snprintf(key, sizeof(key), "plugin.outage.flag=%s", flag);
    /* Every result at once: between two attempts nothing is in flight,
     * the state in which the member could take the outage for over. */
    plugin_stack_with("tplugins", "probe", key, "plugin.per.collect=1000",
                      "100");
    int unique = 300, redeliveries, resends;
    produce_events(unique, &redeliveries, &resends, 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    int status = th_wait_unready(metrics_port, "probe", 30000, NULL);
    cr_assert_eq(status, 503, "never not ready: %s", log_tail("m1"));
    /* Longer than retry.max.attempts of backoff would take: an outage is
     * never counted, so nothing may be dead-lettered meanwhile. And never
     * ready meanwhile, always with the plugin's reason: /readyz polled
     * every 10 ms for 4 s from the first answer that names the outage
     * (polls from the first 503 at all, "joining the consumer group", saw
     * "ready" about 10 times in the ~100 ms between the assignment and
     * the plugin's first OUTAGE result: nothing is known to be down then). */
    int ready = 0, other = 0, polls = 0;
    for (; polls < 400; polls++) {
        char *body = NULL;
        int st = th_http_get(metrics_port, "/readyz", &body);
        ready += st == 200;
        other += st != 200 && !(st == 503 && body && strstr(body, "probe"));
        free(body);
        usleep(10000);
    }
    cr_expect_eq(ready, 0, "ready %d times in %d polls during the outage: %s",
                 ready, polls, log_tail("m1"));
    cr_expect_eq(other, 0, "%d answers without the plugin's reason", other);
    cr_expect_eq(metric("idemproc_records_total{outcome=\"processed\"}"), 0);
    int nj, ni, rj, nl;
    cr_expect_eq(dlq_read(&nj, &ni, &rj, &nl), 0, "dead letters in an outage");
    cr_assert_eq(unlink(flag), 0);
    double processed = 0;
    for (int t = 0; t < 600 && processed < unique; t++) {
        processed = metric("idemproc_records_total{outcome=\"processed\"}");
        usleep(100000);
    }
    cr_assert_eq(processed, unique, "after the outage: %s", log_tail("m1"));
    double dups = 0;
    for (int t = 0; t < 300 && dups < redeliveries + resends; t++) {
        dups = metric("idemproc_records_total{outcome=\"duplicate\"}");
        usleep(100000);
    }
    cr_expect_eq(dups, redeliveries + resends);
    status = 0;
    for (int t = 0; t < 300 && status != 200; t++) {
        status = th_http_get(metrics_port, "/readyz", NULL);
        usleep(100000);
    }
    cr_expect_eq(status, 200, "not ready again after the outage");
    cr_expect_eq(dlq_read(&nj, &ni, &rj, &nl), 0, "dead letters");
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
    th_rmrf(dir);
    free(dir);
}

/* Writes <dir>/c.properties, a configuration whose broker and Redis never
 * answer (for commands that must fail before connecting), into path. */
static void offline_conf(const char *dir, char *path, size_t path_size)
{
    snprintf(path, path_size, "%s/c.properties", dir);
    cr_assert_eq(th_write_file(path, "kafka.bootstrap.servers=127.0.0.1:1\n"
                                     "group.id=g\ninput.topics=t\n"
                                     "dlq.topic=t.dlq\n"
                                     "redis.url=redis://127.0.0.1:1/0\n"),
                 0);
}

/* The plugin's keys come from the environment too, and its validate
 * judges them: check-config exits 2 with the plugin's own message. */
Test(plugin_run, plugin_keys_from_the_environment_reach_its_validate,
     .timeout = 60)
{
    char *dir = th_tmpdir();
    char conf[600], handler[1200];
    offline_conf(dir, conf, sizeof(conf));
    snprintf(handler, sizeof(handler), "handler=plugin:%s",
             plugin_path("plugins", "filesink"));
    char *argv[] = {(char *)th_bin(), "check-config", "-c", conf,
                    "--set",          handler,        NULL};
    char *env[] = {"IDEMPROC_PLUGIN_OUTPUT=/tmp/never-written.tsv",
                   "IDEMPROC_PLUGIN_MAX_VALUE_BYTES=12x", "PATH=/usr/bin:/bin",
                   NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run_env(argv, env, &out, &err, 30000);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, err);
    cr_expect(err && strstr(err, "plugin filesink: plugin.max.value.bytes: "
                                 "\"12x\" is not a positive number"),
              "%s", err);
    free(out);
    free(err);
    env[1] = "IDEMPROC_PLUGIN_MAX_VALUE_BYTES=12";
    rc = th_run_env(argv, env, &out, &err, 30000);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, err);
    cr_expect(out && strstr(out, "plugin.max.value.bytes=[redacted]"), "%s",
              out);
    free(out);
    free(err);
    th_rmrf(dir);
    free(dir);
}

/* `check-config` and `run` refuse a plugin built for another ABI version
 * with exit 2 and both versions, before anything connects. */
Test(plugin_run, run_refuses_a_plugin_built_for_another_abi_version,
     .timeout = 60)
{
    char *dir = th_tmpdir();
    char conf[600], handler[1200];
    offline_conf(dir, conf, sizeof(conf));
    snprintf(handler, sizeof(handler), "handler=plugin:%s",
             plugin_path("tplugins", "abi_next"));
    char want[128];
    snprintf(want, sizeof(want),
             "built for plugin ABI version %d, but this idemproc loads "
             "version %d",
             IDEMPROC_PLUGIN_ABI_VERSION + 1, IDEMPROC_PLUGIN_ABI_VERSION);
    const char *cmds[] = {"check-config", "run"};
    for (int c = 0; c < 2; c++) {
        char *argv[] = {(char *)th_bin(), (char *)cmds[c], "-c", conf,
                        "--set",          handler,         NULL};
        char *out = NULL, *err = NULL;
        int rc = th_run(argv, &out, &err, 30000);
        cr_expect_eq(rc, 2, "%s: exit %d: %s", cmds[c], rc, err);
        cr_expect(err && strstr(err, want), "%s: %s", cmds[c], err);
        free(out);
        free(err);
    }
    th_rmrf(dir);
    free(dir);
}
