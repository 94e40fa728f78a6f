/* test_script (e2e): members running a Lua effect: exact after SIGKILL,
 * OOM and ACL refusals mid-chunk; a syntax error stops run and
 * check-config. */
#include "harness.h"
#include "handlers/luascript.h"

#include <criterion/criterion.h>
#include <hiredis.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static char *dir;
static th_redis_t rds;

static th_stack_t stk;

static void script_fini(void)
{
    th_stack_cleanup();
    if (rds.dir)
        th_redis_stop(&rds);
    if (dir)
        th_rmrf(dir);
    free(dir);
    dir = NULL;
}

TestSuite(script, .fini = script_fini);

#define FIELDS_LIST                                                            \
    "/s,/n,/i,/big,/t,/f,/z,/o,/a,/missing,/nest/x,/a~1b,/a/1,/x~0y"

/* ---- handler=script in a running member ---- */

/* The effect of the end-to-end tests: commutative (totals per SKU), so
 * the expected state does not depend on the order partitions are
 * processed in. qty 13 is refused, qty 14 raises a runtime error. */
static const char run_lua[] =
    "local function event(rec)\n"
    "  return cjson.decode(rec.value)\n"
    "end\n"
    "function effect(rec)\n"
    "  local ev = event(rec)\n"
    "  if ev.qty == 13 then return false, 'unlucky ' .. ev.event.id end\n"
    "  if ev.qty == 14 then local t = nil; return t.boom end\n"
    "  redis.call('HINCRBY', 'test:stock', ev.sku, ev.qty)\n"
    "  redis.call('INCR', 'test:applied')\n"
    "end\n";

/* The same effect on script.fields (/event/id,/sku,/qty): the same lines,
 * so a runtime error names the same line 7. */
static const char run_fields_lua[] =
    "local function event(rec)\n"
    "  return {event = {id = rec.fields['/event/id']},\n"
    "    sku = rec.fields['/sku'], qty = rec.fields['/qty']} end\n"
    "function effect(rec)\n"
    "  local ev = event(rec)\n"
    "  if ev.qty == 13 then return false, 'unlucky ' .. ev.event.id end\n"
    "  if ev.qty == 14 then local t = nil; return t.boom end\n"
    "  redis.call('HINCRBY', 'test:stock', ev.sku, ev.qty)\n"
    "  redis.call('INCR', 'test:applied')\n"
    "end\n";

/* The same effect with the aggregated counters (idem.*), as the README
 * recommends: the same lines again. */
static const char run_idem_lua[] =
    "local function event(rec)\n"
    "  return {event = {id = rec.fields['/event/id']},\n"
    "    sku = rec.fields['/sku'], qty = rec.fields['/qty']} end\n"
    "function effect(rec)\n"
    "  local ev = event(rec)\n"
    "  if ev.qty == 13 then return false, 'unlucky ' .. ev.event.id end\n"
    "  idem.hincrby('test:stock', ev.sku, ev.qty); if ev.qty == 14 then local "
    "t = nil; return t.boom end\n"
    "  idem.hincrby('test:stock', ev.sku, 0)\n"
    "  idem.incrby('test:applied', 1)\n"
    "end\n";

#define RUN_SKUS 40

typedef struct {
    long stock[RUN_SKUS];
    long applied;                 /* distinct identities applied */
    long rejected, notjson, noid; /* distinct dead letters by reason */
    long redeliveries, resends;   /* duplicate lines sent */
} run_expect_t;

/* Writes n events (and their duplicates and poison) as JSON lines to path
 * and fills *e with what Redis and the DLQ must hold afterwards. Events
 * are keyed by sku (--key-field sku), so an event and its duplicates are
 * in one partition, in file order. */
static void run_traffic(const char *path, int n, run_expect_t *e)
{
    memset(e, 0, sizeof(*e));
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = 0; i < n; i++) {
        int sku = i % RUN_SKUS;
        int qty = 1 + (i * 7) % 12;
        if (i % 97 == 5)
            qty = 13;
        else if (i % 101 == 7)
            qty = 14;
        fprintf(f,
                "{\"event\":{\"id\":\"evt-%d\"},\"message_id\":\"m-%d\","
                "\"sku\":\"s%d\",\"qty\":%d}\n",
                i, i, sku, qty);
        if (qty >= 13) {
            e->rejected++;
            continue;
        }
        e->stock[sku] += qty;
        e->applied++;
        if (i % 10 == 3) { /* the same record again: a redelivery */
            fprintf(f,
                    "{\"event\":{\"id\":\"evt-%d\"},\"message_id\":\"m-%d\","
                    "\"sku\":\"s%d\",\"qty\":%d}\n",
                    i, i, sku, qty);
            e->redeliveries++;
        }
        if (i % 15 == 4) { /* the same event sent anew: a resend */
            fprintf(f,
                    "{\"event\":{\"id\":\"evt-%d\"},\"message_id\":\"r-%d\","
                    "\"sku\":\"s%d\",\"qty\":100}\n",
                    i, i, sku);
            e->resends++;
        }
        if (i % 250 == 9) {
            fprintf(f, "not json %d\n", i);
            e->notjson++;
        }
        if (i % 300 == 11) {
            fprintf(f, "{\"sku\":\"s%d\",\"qty\":1}\n", sku);
            e->noid++;
        }
    }
    fclose(f);
}

static long redis_long(th_redis_t *r, const char *const args[])
{
    char *out = th_redis_cli(r, args);
    long v = out && *out ? strtol(out, NULL, 10) : 0;
    free(out);
    return v;
}

/* Waits until test:applied reaches n. */
static int wait_run_applied(long n, int timeout_ms)
{
    const char *args[] = {"GET", "test:applied", NULL};
    for (int t = 0; t < timeout_ms; t += 100) {
        if (redis_long(&stk.redis, args) >= n)
            return 0;
        usleep(100000);
    }
    return -1;
}

/* Distinct dead letters (original partition/offset) of the DLQ by reason,
 * read with `idemproc dlq inspect`. */
static void dlq_distinct(long *rejected, long *notjson, long *noid,
                         char **errors_out)
{
    char *argv[] = {(char *)th_bin(), "dlq",         "inspect", "-c",
                    stk.conf,         "--max-bytes", "64",      NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_assert_eq(rc, 0, "dlq inspect: %s", err);
    *rejected = *notjson = *noid = 0;
    size_t seen_cap = 1024, seen_n = 0;
    char **seen = calloc(seen_cap, sizeof(*seen));
    char *errors = calloc(1, 1);
    size_t errors_len = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        cr_assert(j, "not JSON: %s", line);
        const char *reason = json_string_value(json_object_get(j, "reason"));
        char id[64];
        snprintf(id, sizeof(id), "%lld/%lld",
                 json_integer_value(json_object_get(j, "original_partition")),
                 json_integer_value(json_object_get(j, "original_offset")));
        int dup = 0;
        for (size_t k = 0; k < seen_n && !dup; k++)
            dup = !strcmp(seen[k], id);
        if (!dup) {
            if (seen_n == seen_cap)
                seen = realloc(seen, (seen_cap *= 2) * sizeof(*seen));
            seen[seen_n++] = strdup(id);
            if (!strcmp(reason, "handler-rejected")) {
                (*rejected)++;
                const char *e = json_string_value(json_object_get(j, "error"));
                size_t el = strlen(e);
                errors = realloc(errors, errors_len + el + 2);
                memcpy(errors + errors_len, e, el);
                errors_len += el;
                errors[errors_len++] = '\n';
                errors[errors_len] = '\0';
            } else if (!strcmp(reason, "not-json")) {
                (*notjson)++;
            } else if (!strcmp(reason, "no-identity")) {
                (*noid)++;
            }
        }
        json_decref(j);
    }
    for (size_t k = 0; k < seen_n; k++)
        free(seen[k]);
    free(seen);
    free(out);
    free(err);
    *errors_out = errors;
}

/* Redis holds exactly what e says, and the DLQ every poison record once
 * (counting distinct originals: dead letters are at-least-once). */
static void expect_run_state(const run_expect_t *e, int timeout_ms)
{
    cr_assert_eq(wait_run_applied(e->applied, timeout_ms), 0,
                 "applied never reached %ld", e->applied);
    /* Wait for the dead letters too. */
    long rej = 0, nj = 0, ni = 0;
    char *errors = NULL;
    for (int t = 0; t < timeout_ms; t += 500) {
        free(errors);
        dlq_distinct(&rej, &nj, &ni, &errors);
        if (rej >= e->rejected && nj >= e->notjson && ni >= e->noid)
            break;
        usleep(500000);
    }
    const char *ga[] = {"GET", "test:applied", NULL};
    cr_expect_eq(redis_long(&stk.redis, ga), e->applied);
    for (int k = 0; k < RUN_SKUS; k++) {
        char sku[16];
        snprintf(sku, sizeof(sku), "s%d", k);
        const char *args[] = {"HGET", "test:stock", sku, NULL};
        cr_expect_eq(redis_long(&stk.redis, args), e->stock[k], "stock of %s",
                     sku);
    }
    cr_expect_eq(rej, e->rejected);
    cr_expect_eq(nj, e->notjson);
    cr_expect_eq(ni, e->noid);
    cr_expect(strstr(errors, "unlucky evt-5\n"), "%s", errors);
    cr_expect(strstr(errors, "lua error: "), "%s", errors);
    cr_expect(strstr(errors, "run.lua:7: attempt to index local 't' (a nil "
                             "value)"),
              "%s", errors);
    free(errors);
}

static void run_stack_with(const char *lua, const char *const more[])
{
    if (!dir)
        dir = th_tmpdir();
    static char file[600];
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&dir, "run.lua", lua));
    const char *props[16] = {"handler=script", file,
                             "envelope.identity=value:/event/id"};
    size_t n = 3;
    for (size_t i = 0; more && more[i] && n < 15; i++)
        props[n++] = more[i];
    props[n] = NULL;
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
}

static void run_stack(const char *const more[])
{
    run_stack_with(run_lua, more);
}

static void produce_file(const char *path)
{
    const char *args[] = {"--input", path, "--key-field", "sku", NULL};
    cr_assert_eq(th_stack_produce(&stk, args), 0);
}

Test(script, member_applies_each_event_once, .timeout = 180)
{
    run_stack(NULL);
    run_expect_t e;
    const char *path = th_file_in(&dir, "events.jsonl", "");
    run_traffic(path, 3000, &e);
    produce_file(path);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    expect_run_state(&e, 90000);
    cr_expect_eq(th_stop(m, 15000), 0);
    /* The log names the runtime errors. */
    char lp[600];
    snprintf(lp, sizeof(lp), "%s/m1.log", stk.dir);
    char *log = th_slurp(lp, NULL);
    cr_expect(log && strstr(log, "script effect failed"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}

static void sigkill_then_restart(const char *lua)
{
    run_stack_with(
        lua, (const char *const[]){"batch.max.messages=50",
                                   "script.fields=/event/id,/sku,/qty", NULL});
    run_expect_t e;
    const char *path = th_file_in(&dir, "events.jsonl", "");
    run_traffic(path, 20000, &e);
    produce_file(path);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(wait_run_applied(e.applied / 4, 90000), 0);
    kill(m, SIGKILL);
    cr_expect_eq(th_wait(m, 5000), 128 + SIGKILL);
    const char *ga[] = {"GET", "test:applied", NULL};
    cr_expect_lt(redis_long(&stk.redis, ga), e.applied);
    m = th_stack_member(&stk, "m2", NULL);
    expect_run_state(&e, 150000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* On script.fields (the fast path), as the README's example runs. */
Test(script, sigkill_mid_stream_then_restart_is_exact, .timeout = 240)
{
    sigkill_then_restart(run_fields_lua);
}

/* With idem.*: increments and marks of a chunk land together or not at
 * all, whenever the member dies. (A runtime error after a staged
 * increment drops it: qty 14 stages, then raises.) */
Test(script, idem_sigkill_mid_stream_then_restart_is_exact, .timeout = 240)
{
    sigkill_then_restart(run_idem_lua);
}

/* A script that does not compile is a configuration error of run and
 * check-config (exit 2) naming the file and line, before any connection. */
Test(script, syntax_error_stops_run_and_check_config, .timeout = 60)
{
    const char *bad = th_file_in(&dir, "broken.lua",
                                 "function effect(rec)\n"
                                 "  if rec.value then\n"
                                 "    return false, 'x'\n"
                                 "end\n");
    char conf[600];
    snprintf(conf, sizeof(conf), "%s/broken.properties", dir);
    char text[1200];
    snprintf(text, sizeof(text),
             "kafka.bootstrap.servers=127.0.0.1:1\ngroup.id=g\n"
             "input.topics=t\ndlq.topic=t.dlq\nredis.url=redis://"
             "127.0.0.1:1/0\nhandler=script\nscript.file=%s\nhttp.listen=\n",
             bad);
    cr_assert_eq(th_write_file(conf, text), 0);
    const char *cmds[] = {"check-config", "run"};
    for (int i = 0; i < 2; i++) {
        char *argv[] = {(char *)th_bin(), (char *)cmds[i], "-c", conf, NULL};
        char *out = NULL, *err = NULL;
        int rc = th_run(argv, &out, &err, 20000);
        cr_expect_eq(rc, 2, "%s exit %d: %s", cmds[i], rc, err);
        char want[700];
        snprintf(want, sizeof(want), "script.file: %s:4: 'end' expected", bad);
        cr_expect(err && strstr(err, want), "%s: %s", cmds[i], err);
        free(out);
        free(err);
    }
    /* Without script.file, handler=script is refused too. */
    snprintf(text, sizeof(text),
             "kafka.bootstrap.servers=127.0.0.1:1\ngroup.id=g\n"
             "input.topics=t\ndlq.topic=t.dlq\nredis.url=redis://"
             "127.0.0.1:1/0\nhandler=script\nhttp.listen=\n");
    cr_assert_eq(th_write_file(conf, text), 0);
    char *argv[] = {(char *)th_bin(), "check-config", "-c", conf, NULL};
    char *err = NULL;
    cr_expect_eq(th_run(argv, NULL, &err, 20000), 2);
    cr_expect(err && strstr(err, "script.file"), "%s", err);
    free(err);
}

/* An effect reading a literal pointer script.fields does not list
 * (rec.fields["/x"]) would dead-letter every record: run and check-config
 * refuse it (exit 2) naming the pointer and the line, before any
 * connection. (Before, check-config passed and run dead-lettered 448
 * records in 25 ms.) */
Test(script, undeclared_literal_field_stops_run_and_check_config, .timeout = 60)
{
    const char *lua = th_file_in(&dir, "typo.lua",
                                 "function effect(rec)\n"
                                 "  local sku = rec.fields['/sku']\n"
                                 "  local qty = rec.fields['/qyt']\n"
                                 "  redis.call('HINCRBY', 'stock', sku, qty)\n"
                                 "end\n");
    char conf[600];
    snprintf(conf, sizeof(conf), "%s/typo.properties", dir);
    char text[1200];
    snprintf(text, sizeof(text),
             "kafka.bootstrap.servers=127.0.0.1:1\ngroup.id=g\n"
             "input.topics=t\ndlq.topic=t.dlq\nredis.url=redis://"
             "127.0.0.1:1/0\nhandler=script\nscript.file=%s\n"
             "script.fields=/sku,/qty\nhttp.listen=\n",
             lua);
    cr_assert_eq(th_write_file(conf, text), 0);
    const char *cmds[] = {"check-config", "run"};
    for (int i = 0; i < 2; i++) {
        char *argv[] = {(char *)th_bin(), (char *)cmds[i], "-c", conf, NULL};
        char *err = NULL;
        int rc = th_run(argv, NULL, &err, 20000);
        cr_expect_eq(rc, 2, "%s exit %d: %s", cmds[i], rc, err);
        char want[700];
        snprintf(want, sizeof(want),
                 "script.file: %s:3: rec.fields[\"/qyt\"]: not in "
                 "script.fields (/sku,/qty)",
                 lua);
        cr_expect(err && strstr(err, want), "%s: %s", cmds[i], err);
        free(err);
    }
}

/* Redis refusing writes mid-stream (maxmemory reached: OOM) is an outage
 * for the script handler too: the member pauses, dead-letters nothing
 * because of it, and ends exact once Redis takes writes again. (The
 * driver's own rule, an OOM the effect meets fails the whole script, is
 * server_refusals_are_outages; here the request's positions are refused
 * as well, so this checks the handler's and the loop's side.) */
static void oom_mid_stream(const char *lua, const char *fields, int n)
{
    run_stack_with(lua, (const char *const[]){"batch.max.messages=50",
                                              "retry.backoff.max.ms=200",
                                              fields, NULL});
    run_expect_t e;
    const char *path = th_file_in(&dir, "events.jsonl", "");
    run_traffic(path, n, &e);
    produce_file(path);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(wait_run_applied(e.applied / 5, 90000), 0);
    const char *full[] = {"CONFIG", "SET", "maxmemory", "1", NULL};
    free(th_redis_cli(&stk.redis, full));
    const char *ga[] = {"GET", "test:applied", NULL};
    long before = redis_long(&stk.redis, ga);
    sleep(2);
    cr_expect_eq(redis_long(&stk.redis, ga), before,
                 "applied while Redis refused writes");
    const char *ok[] = {"CONFIG", "SET", "maxmemory", "0", NULL};
    free(th_redis_cli(&stk.redis, ok));
    cr_expect_lt(before, e.applied);
    expect_run_state(&e, 150000);
    cr_expect_eq(th_stop(m, 15000), 0);
    char lp[600];
    snprintf(lp, sizeof(lp), "%s/m1.log", stk.dir);
    char *log = th_slurp(lp, NULL);
    cr_expect(log && strstr(log, "OOM"), "no OOM outage logged:\n%s", log);
    free(log);
    th_stack_stop(&stk);
}

Test(script, oom_mid_stream_is_an_outage_not_a_rejection, .timeout = 240)
{
    oom_mid_stream(run_lua, NULL, 6000);
}

/* With idem.*: the chunk that meets the OOM writes neither its marks nor
 * its increments; the member pauses and ends exact. */
Test(script, idem_oom_mid_stream_writes_nothing_then_exact, .timeout = 240)
{
    oom_mid_stream(run_idem_lua, "script.fields=/event/id,/sku,/qty", 12000);
}

/* The member's Redis user may not SADD (an ACL mistake), and every record
 * of sku s7 starts with one: the chunk that holds one fails as an outage
 * after earlier records made their plain writes. The member pauses and
 * retries; once the ACL is fixed it resumes, and every accepted record's
 * writes are applied exactly once (the failing record refuses before any
 * write of its own). Line 7 raises, as in the other scripts. */
static const char run_acl_lua[] =
    "local function event(rec)\n"
    "  return cjson.decode(rec.value)\n"
    "end\n"
    "function effect(rec)\n"
    "  local ev = event(rec)\n"
    "  if ev.qty == 13 then return false, 'unlucky ' .. ev.event.id end\n"
    "  if ev.qty == 14 then local t = nil; return t.boom end\n"
    "  if ev.sku == 's7' then redis.call('SADD', 'test:s7', ev.event.id) end\n"
    "  redis.call('HINCRBY', 'test:stock', ev.sku, ev.qty)\n"
    "  redis.call('INCR', 'test:applied')\n"
    "end\n";

/* The same with idem.* for the stock, and the applied counter by a plain
 * INCR for odd quantities only, so chunks switch to eager mode in the
 * middle, with idem.* increments of earlier records pending. */
static const char run_acl_idem_lua[] =
    "local function event(rec)\n"
    "  return {event = {id = rec.fields['/event/id']},\n"
    "    sku = rec.fields['/sku'], qty = rec.fields['/qty']} end\n"
    "function effect(rec)\n"
    "  local ev = event(rec)\n"
    "  if ev.qty == 13 then return false, 'unlucky ' .. ev.event.id end\n"
    "  idem.hincrby('test:stock', ev.sku, ev.qty); if ev.qty == 14 then local "
    "t = nil; return t.boom end\n"
    "  if ev.sku == 's7' then redis.call('SADD', 'test:s7', ev.event.id) end\n"
    "  if ev.qty % 2 == 1 then redis.call('INCR', 'test:applied')\n"
    "  else idem.incrby('test:applied', 1) end\n"
    "end\n";

static void acl_refusal_mid_chunk(const char *lua, const char *fields)
{
    run_stack_with(lua, (const char *const[]){"batch.max.messages=50",
                                              "retry.backoff.max.ms=200",
                                              fields, NULL});
    const char *acl[] = {"ACL", "SETUSER", "lim",   "on",    ">pw",
                         "~*",  "&*",      "+@all", "-sadd", NULL};
    free(th_redis_cli(&stk.redis, acl));
    run_expect_t e;
    const char *path = th_file_in(&dir, "events.jsonl", "");
    run_traffic(path, 3000, &e);
    produce_file(path);
    pid_t m = th_stack_member(
        &stk, "m1",
        (const char *const[]){"redis.username=lim", "redis.password=pw", NULL});
    /* Wait for the refusal, let the member retry a while, then fix it. */
    char lp[600];
    snprintf(lp, sizeof(lp), "%s/m1.log", stk.dir);
    int seen = 0;
    for (int t = 0; t < 60000 && !seen; t += 200) {
        char *log = th_slurp(lp, NULL);
        seen = log && strstr(log, "user executing the script can't");
        free(log);
        if (!seen)
            usleep(200000);
    }
    cr_expect(seen, "no ACL refusal logged");
    sleep(3);
    const char *ga[] = {"GET", "test:applied", NULL};
    cr_expect_lt(redis_long(&stk.redis, ga), e.applied);
    const char *fix[] = {"ACL", "SETUSER", "lim", "+sadd", NULL};
    free(th_redis_cli(&stk.redis, fix));
    expect_run_state(&e, 120000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

Test(script, acl_refusal_mid_chunk_applies_plain_writes_once, .timeout = 240)
{
    acl_refusal_mid_chunk(run_acl_lua, "script.fields=/event/id,/sku,/qty");
}

Test(script, idem_acl_refusal_mid_chunk_applies_every_write_once,
     .timeout = 240)
{
    acl_refusal_mid_chunk(run_acl_idem_lua,
                          "script.fields=/event/id,/sku,/qty");
}

/* ---- an effect that does not finish (script.timeout.ms) ---- */

/* hang:"loop" loops before any write; hang:"write" writes, then loops. */
static const char hang_lua[] =
    "function effect(rec)\n"
    "  local ev = cjson.decode(rec.value)\n"
    "  if ev.hang then\n"
    "    if ev.hang == 'write' then redis.call('INCR', 'test:before') end\n"
    "    while true do end\n"
    "  end\n"
    "  redis.call('INCR', 'test:applied')\n"
    "end\n";

/* Cuts Redis's busy threshold to 1 s (SCRIPT KILL is read only after
 * it), again after a restart. */
static void busy_threshold_1s(void)
{
    const char *cfg[] = {"CONFIG", "SET", "busy-reply-threshold", "1000", NULL};
    free(th_redis_cli(&stk.redis, cfg));
}

/* A stack on `partitions` partitions with n events, the one at index `at`
 * with "hang":"<how>"; extra: more properties (NULL-terminated, at most
 * 4; may be NULL). */
static int hang_http; /* the member's metrics port */

static void hang_stack(int partitions, size_t n, size_t at, const char *how,
                       const char *const extra[])
{
    if (!dir)
        dir = th_tmpdir();
    static char file[600], listen[64];
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&dir, "hang.lua", hang_lua));
    hang_http = th_free_port();
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", hang_http);
    const char *props[] = {"handler=script",
                           file,
                           listen,
                           "envelope.identity=value:/event/id",
                           "batch.max.messages=16",
                           "script.timeout.ms=500",
                           "retry.backoff.max.ms=500",
                           NULL,
                           NULL,
                           NULL,
                           NULL,
                           NULL};
    size_t np = 0;
    while (props[np])
        np++;
    for (size_t i = 0; extra && extra[i] && i < 4; i++)
        props[np + i] = extra[i];
    cr_assert_eq(th_stack_start(&stk, partitions, props), 0);
    busy_threshold_1s();
    char path[600];
    snprintf(path, sizeof(path), "%s/hang.jsonl", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    for (size_t i = 0; i < n; i++)
        fprintf(
            fp,
            "{\"event\":{\"id\":\"h-%zu\"},\"sku\":\"s%zu\",\"qty\":1%s%s%s}"
            "\n",
            i, i % 4, i == at ? ",\"hang\":\"" : "", i == at ? how : "",
            i == at ? "\"" : "");
    fclose(fp);
    produce_file(path);
}

/* Waits until the member's log holds text; returns the log (caller
 * frees) or NULL. */
static char *wait_member_log(const char *name, const char *text, int ms)
{
    char lp[600];
    snprintf(lp, sizeof(lp), "%s/%s.log", stk.dir, name);
    for (int t = 0; t < ms; t += 100) {
        char *log = th_slurp(lp, NULL);
        if (log && strstr(log, text))
            return log;
        free(log);
        usleep(100000);
    }
    return NULL;
}

/* Waits for `want` distinct handler-rejected dead letters; their dlq.error
 * lines go to *errors (caller frees). */
static long wait_rejected(long want, char **errors, int ms)
{
    long rej = 0, nj = 0, ni = 0;
    *errors = NULL;
    for (int t = 0; t < ms; t += 500) {
        free(*errors);
        *errors = NULL;
        dlq_distinct(&rej, &nj, &ni, errors);
        if (rej >= want)
            break;
        usleep(500000);
    }
    return rej;
}

/* The first of 200 effects loops before it writes: the member ends it
 * with SCRIPT KILL after script.timeout.ms, tries the request's records
 * one a request, ends the looping one alone and dead-letters it with the
 * reason; every other record is applied exactly once. (Before, each
 * SCRIPT KILL was followed by the same chunk again: nothing was
 * processed.) One partition, so the looping effect is the first of its
 * request: any write before it would make Redis refuse SCRIPT KILL (the
 * next test). */
Test(script, a_looping_effect_is_killed_and_its_record_dead_lettered,
     .timeout = 240)
{
    hang_stack(1, 200, 0, "loop", NULL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    const char *ga[] = {"GET", "test:applied", NULL};
    cr_assert_eq(wait_run_applied(199, 120000), 0, "applied %ld of 199",
                 redis_long(&stk.redis, ga));
    char *errors;
    cr_expect_eq(wait_rejected(1, &errors, 30000), 1);
    cr_expect(errors && strstr(errors, "script.timeout.ms: the effect did not "
                                       "finish within 500 ms; ended with "
                                       "SCRIPT KILL"),
              "%s", errors);
    free(errors);
    usleep(500000);
    cr_expect_eq(redis_long(&stk.redis, ga), 199, "exactly once");
    cr_expect_eq(th_stop(m, 15000), 0);
    char *log = wait_member_log("m1", "\"record\":\"payments/0@0\"", 1000);
    cr_expect(log && strstr(log, "the record is dead-lettered"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}

/* The member's /metrics (caller frees), waiting up to 10 s for its HTTP
 * server; asserts that it answered. */
static char *hang_metrics(void)
{
    char *body = NULL;
    int st = -1;
    for (int t = 0; t < 100 && st != 200; t++) {
        free(body);
        body = NULL;
        if ((st = th_http_get(hang_http, "/metrics", &body)) != 200)
            usleep(100000);
    }
    cr_assert_eq(st, 200, "no /metrics");
    return body;
}

/* The "first" record ("payments/P@O") of the last log line holding text,
 * as the series idemproc_script_unkillable_offset must show it for a
 * request of `records` records: its name and labels into name, the
 * offset into *offset. */
static void unkillable_series(const char *log, const char *text, size_t records,
                              char *name, size_t size, double *offset)
{
    const char *line = NULL;
    for (const char *p = log; (p = strstr(p, text)); p++)
        line = p;
    cr_assert(line, "no log line with %s", text);
    const char *f = strstr(line, "\"first\":\"payments/");
    cr_assert(f, "no first record in %.300s", line);
    int partition;
    long long off;
    cr_assert_eq(sscanf(f + strlen("\"first\":\"payments/"), "%d@%lld",
                        &partition, &off),
                 2);
    snprintf(name, size,
             "idemproc_script_unkillable_offset{topic=\"payments\","
             "partition=\"%d\",records=\"%zu\"}",
             partition, records);
    *offset = (double)off;
}

/* The effect writes before it loops: Redis refuses SCRIPT KILL
 * (UNKILLABLE) and serves nobody until SHUTDOWN NOSAVE. The member says so
 * in an error naming the request's records (the looping one among them)
 * and in its metrics (idemproc_script_unkillable_total, and the offset
 * series naming the request's first record while it is stuck: what the
 * IdemprocScriptUnkillable alert shows), and waits, dead-letters nothing
 * meanwhile; once Redis is back it tries them one a request, so the
 * second error and the series name the record itself, and after the
 * second restart that record is dead-lettered and the series is gone.
 * (Redis runs without persistence here: what it held is gone after each
 * restart, so only the dead letter is checked.) */
Test(script, a_looping_effect_that_wrote_cannot_be_killed_and_is_named,
     .timeout = 180)
{
    hang_stack(4, 40, 5, "write", NULL);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    char *body = hang_metrics();
    cr_expect_eq(th_metric(body, "idemproc_script_unkillable_total"), 0);
    cr_expect_null(strstr(body, "idemproc_script_unkillable_offset{"));
    free(body);
    char *log = wait_member_log("m1", "the record is among these", 60000);
    cr_assert(log, "no error naming the request's records");
    cr_expect(strstr(log, "UNKILLABLE"), "%s", log);
    body = hang_metrics();
    cr_expect_eq(th_metric(body, "idemproc_script_unkillable_total"), 1);
    const char *series = strstr(body, "idemproc_script_unkillable_offset{");
    cr_expect(series && !strstr(series, "records=\"1\""),
              "a request of many records: %s", series);
    free(body);
    free(log);
    const char *sd[] = {"SHUTDOWN", "NOSAVE", NULL};
    free(th_redis_cli(&stk.redis, sd));
    cr_assert_eq(th_redis_restart(&stk.redis), 0);
    busy_threshold_1s();
    const char *alone = "then the record is dead-lettered";
    log = wait_member_log("m1", alone, 60000);
    cr_assert(log, "no error naming the record");
    char name[200];
    double offset;
    unkillable_series(log, alone, 1, name, sizeof(name), &offset);
    free(log);
    body = hang_metrics();
    cr_expect_eq(th_metric(body, "idemproc_script_unkillable_total"), 2);
    cr_expect_eq(th_metric(body, name), offset, "%s in\n%s", name, body);
    free(body);
    free(th_redis_cli(&stk.redis, sd));
    cr_assert_eq(th_redis_restart(&stk.redis), 0);
    char *errors;
    cr_expect_eq(wait_rejected(1, &errors, 60000), 1);
    cr_expect(errors && strstr(errors, "Redis could not end it"), "%s", errors);
    free(errors);
    body = hang_metrics();
    cr_expect_null(strstr(body, "idemproc_script_unkillable_offset{"),
                   "the series outlived the request: %s", body);
    cr_expect_eq(th_metric(body, "idemproc_script_unkillable_total"), 2);
    free(body);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* A drain ends within its deadline: SIGTERM while Redis runs a script it
 * cannot end (it wrote, then loops), with shutdown.timeout.ms=1000 and a
 * Redis read timeout of 60 s. The member abandons the request at the
 * deadline (logged; the script's effects and marks would land together if
 * it ever ended), then commits, leaves the group and exits 0. (Before, the
 * drain waited for the reply past the deadline until the shutdown
 * watchdog ended the process: exit 1, no final commit.) */
Test(script, drain_of_a_script_that_cannot_end_keeps_its_deadline,
     .timeout = 180)
{
    const char *more[] = {"shutdown.timeout.ms=1000", "redis.timeout.ms=60000",
                          NULL};
    hang_stack(4, 40, 5, "write", more);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    char *log = wait_member_log("m1", "the record is among these", 60000);
    cr_assert(log, "Redis never refused SCRIPT KILL");
    free(log);
    /* 20 s of grace, then SIGKILL: a drain that waits for the 60 s read
     * timeout is killed and fails this. */
    int rc = th_stop(m, 20000);
    cr_expect_eq(rc, 0, "exit %d", rc);
    log = wait_member_log("m1", "script drain deadline", 1000);
    cr_expect(log, "no abandoned request in the log");
    free(log);
    const char *sd[] = {"SHUTDOWN", "NOSAVE", NULL};
    free(th_redis_cli(&stk.redis, sd));
    th_stack_stop(&stk);
}
