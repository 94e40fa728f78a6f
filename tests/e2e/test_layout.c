/* test_layout: switching a running group between the global and the
 * partition dedup layouts (the key <prefix>layout:<group>; docs/
 * guarantees.md, "Changing dedup.scope") with real members, the embedded
 * broker and a real Redis: an upgrade one member at a time, and a
 * rollback, each followed by late duplicates of records the other layout
 * applied, which must not be applied again. Every case checks the ledger
 * with verify. */
#include "harness.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_stack_t stk;

#define member(N, S)         th_stack_member_started(&stk, N, S)
#define wait_committed(P, T) th_stack_wait_committed(&stk, "payments", P, T)

TestSuite(layout, .fini = th_stack_cleanup);

#define LAYOUT_PROPS "handler=ledger", "batch.max.messages=100"

static const char *const want_partition[] = {"dedup.scope=partition", NULL};
static const char *const want_global[] = {"dedup.scope=global", NULL};

/* A field of the layout key (caller frees; "" when absent). */
static char *layout_field(const char *field)
{
    const char *args[] = {"HGET", "idemproc:layout:test-group", field, NULL};
    char *out = th_redis_cli(&stk.redis, args);
    if (!out)
        return strdup("");
    out[strcspn(out, "\r\n")] = 0;
    return out;
}

static int layout_is(const char *want)
{
    char *v = layout_field("layout");
    int same = !strcmp(v, want);
    free(v);
    return same;
}

static void wait_layout(const char *want, int timeout_ms)
{
    for (int t = 0; t < timeout_ms && !layout_is(want); t += 100)
        usleep(100000);
    char *v = layout_field("layout");
    cr_assert(layout_is(want), "layout key says \"%s\", not %s", v, want);
    free(v);
}

/* Keys of the partition layout: proves chunks were written. */
static long partscope_keys(void)
{
    const char *args[] = {"EVAL", "return #redis.call('KEYS', ARGV[1])", "0",
                          "idemproc:st{test-group:payments:*:w*", NULL};
    char *out = th_redis_cli(&stk.redis, args);
    long v = out ? atol(out) : 0;
    free(out);
    return v;
}

/* The same generated traffic each time (deterministic by seed): sent
 * again, every record is a late duplicate of one applied before. */
static const char *const traffic[] = {
    "--count", "3000", "--duplicates", "0.1", "--seed", "2477", NULL};

/* Upgrade: two members on global with traffic; one restarted wanting
 * partition mid-stream (no switch: the other still wants global), then the
 * other (the switch happens). The whole traffic sent again after the
 * switch goes through the partition chunks, which must find the global
 * marks of the first pass: nothing is applied twice. */
Test(layout, upgrade_one_member_at_a_time, .timeout = 300)
{
    const char *props[] = {LAYOUT_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    pid_t a = member("ma", want_global);
    pid_t b = member("mb", want_global);
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    stk.broker.bootstrap,
                    "-t",
                    "payments",
                    "--expect",
                    stk.expect,
                    "--count",
                    "3000",
                    "--duplicates",
                    "0.1",
                    "--seed",
                    "2477",
                    "--rate",
                    "600",
                    NULL};
    pid_t prod = th_spawn(argv, NULL, NULL, NULL);
    cr_assert_gt(prod, 0);
    cr_assert_eq(th_stack_wait_applied(&stk, 500, 90000), 0);

    /* A wants partition; B still global: the key stays. */
    cr_expect_eq(th_stop(a, 15000), 0);
    a = member("ma", want_partition);
    cr_assert_eq(th_wait(prod, 120000), 0, "produce failed");
    wait_committed(4, 120000);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    cr_expect(!layout_is("partition"),
              "switched while a live member wanted global");
    cr_expect_gt(th_stack_log_count(&stk, "ma", "dedup layout stays"), 0);
    cr_expect_eq(partscope_keys(), 0, "chunks written under global");

    /* B wants partition too: the switch. */
    cr_expect_eq(th_stop(b, 15000), 0);
    b = member("mb", want_partition);
    wait_layout("partition", 30000);
    char *from = layout_field("from");
    cr_expect_str_eq(from, "global");
    free(from);

    /* Late duplicates of everything applied under global. */
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    wait_committed(4, 120000);
    cr_expect_gt(partscope_keys(), 0,
                 "the duplicates never went through the partition chunks");
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    cr_expect_eq(th_stop(a, 15000), 0);
    cr_expect_eq(th_stop(b, 15000), 0);
    th_stack_stop(&stk);
}

/* Rollback: two members on partition (the key switched at their first
 * beats), traffic applied through chunks; one member restarted wanting
 * global switches the key back at start. The traffic sent again takes
 * the global script, whose marks know nothing of the chunks: the tables
 * (loaded read-only) must answer the duplicates. */
Test(layout, rollback_to_global, .timeout = 300)
{
    const char *props[] = {LAYOUT_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    pid_t a = member("ma", want_partition);
    pid_t b = member("mb", want_partition);
    wait_layout("partition", 30000);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    wait_committed(4, 120000);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    cr_expect_gt(partscope_keys(), 0, "no chunks under partition");

    cr_expect_eq(th_stop(a, 15000), 0);
    a = member("ma", want_global);
    wait_layout("global", 30000);
    char *from = layout_field("from");
    cr_expect_str_eq(from, "partition");
    free(from);

    /* Late duplicates of everything applied under partition. */
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    wait_committed(4, 120000);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    cr_expect(layout_is("global"), "B switched forward while A wants global");
    cr_expect_eq(th_stop(a, 15000), 0);
    cr_expect_eq(th_stop(b, 15000), 0);
    th_stack_stop(&stk);
}

/* `idemproc layout` with its config file: exit code, stdout, stderr. */
static int layout_cmd(const char *const args[], char **out, char **err)
{
    char *argv[8] = {(char *)th_bin(), "layout"};
    int n = 2;
    for (int i = 0; args[i] && n < 6; i++)
        argv[n++] = (char *)args[i];
    argv[n++] = "-c";
    argv[n++] = stk.conf;
    argv[n] = NULL;
    return th_run(argv, out, err, 30000);
}

/* The command README documents: show, set refused while a live member
 * wants the other layout (naming it, nothing changed), --force, and a
 * switch back. */
Test(layout, command_shows_and_sets_the_key_refusing_while_a_member_objects,
     .timeout = 120)
{
    const char *props[] = {LAYOUT_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    char *out = NULL, *err = NULL;
    const char *show[] = {"show", NULL};
    cr_assert_eq(layout_cmd(show, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "layout global"), "%s", out);
    cr_expect(strstr(out, "0 live members"), "%s", out);
    free(out);
    free(err);

    pid_t m = member("m1", want_global);
    out = err = NULL;
    for (int t = 0; t < 20000; t += 200) { /* its first heartbeat */
        free(out);
        free(err);
        out = err = NULL;
        cr_assert_eq(layout_cmd(show, &out, &err), 0, "%s", err);
        if (strstr(out, "m1 supports"))
            break;
        usleep(200000);
    }
    cr_assert(strstr(out, "m1 supports global,partition, wants global"), "%s",
              out);
    free(out);
    free(err);

    const char *set_p[] = {"set", "partition", NULL};
    out = err = NULL;
    cr_expect_neq(layout_cmd(set_p, &out, &err), 0);
    cr_expect(strstr(err, "refused: live member m1"), "%s", err);
    cr_expect(layout_is(""), "a refused set wrote the key");
    free(out);
    free(err);

    const char *force[] = {"set", "partition", "--force", NULL};
    out = err = NULL;
    cr_expect_eq(layout_cmd(force, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "layout partition"), "%s", out);
    cr_expect(layout_is("partition"));
    free(out);
    free(err);

    cr_expect_eq(th_stop(m, 15000), 0);
    const char *set_g[] = {"set", "global", NULL};
    out = err = NULL;
    cr_expect_eq(layout_cmd(set_g, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "the partition marks are honoured"), "%s", out);
    cr_expect(layout_is("global"));
    free(out);
    free(err);
    th_stack_stop(&stk);
}

/* The member's idemproc_dedup_layout_refusals_total{script=...}. */
static double refusals(int port, const char *script)
{
    char name[96], *body = NULL;
    snprintf(name, sizeof(name),
             "idemproc_dedup_layout_refusals_total{script=\"%s\"}", script);
    cr_assert_eq(th_http_get(port, "/metrics", &body), 200);
    double v = th_metric(body, name);
    free(body);
    return v;
}

/* A switch under a running member costs it one refused request, counted
 * by script: a member that reads the key only after a refusal
 * (dev.layout.read.ms of an hour), so its next request after each switch
 * meets it. Global to partition: its global script request is refused,
 * then the records go as chunks (ledger exact); partition to global: its
 * next chunk call is refused, then the records go the global way, each
 * applied once. */
Test(layout, refusals_are_counted_by_script, .timeout = 180)
{
    const char *props[] = {LAYOUT_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *sets[] = {"dedup.scope=global", "dev.layout.read.ms=3600000",
                          listen, NULL};
    pid_t m = member("m1", sets);
    char *out = NULL, *err = NULL;
    const char *force[] = {"set", "partition", "--force", NULL};
    cr_assert_eq(layout_cmd(force, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    wait_committed(2, 120000);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    cr_expect_gt(partscope_keys(), 0, "the records never went as chunks");
    /* (the counters appear with the member's first records) */
    double g = refusals(port, "global");
    cr_expect_geq(g, 1);
    cr_expect_eq(refusals(port, "chunk"), 0);

    const char *back[] = {"set", "global", NULL};
    out = err = NULL;
    cr_assert_eq(layout_cmd(back, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    const char *fresh[] = {"--count", "500", "--seed", "2478", NULL};
    cr_assert_eq(th_stack_produce(&stk, fresh), 0);
    long more = th_stack_expect_unique(&stk);
    wait_committed(2, 120000);
    cr_expect_eq(th_stack_applied(&stk), unique + more);
    cr_expect_geq(refusals(port, "chunk"), 1);
    cr_expect_eq(refusals(port, "global"), g);
    cr_expect(layout_is("global"));
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Milliseconds member m's heartbeat has left by Redis's clock; -1 when it
 * has none. */
static long long heartbeat_left_ms(const char *m)
{
    const char *args[] = {"EVAL",
                          "local s = redis.call('ZSCORE', KEYS[1], ARGV[1]) "
                          "if not s then return -1 end "
                          "local t = redis.call('TIME') "
                          "return tonumber(s) - (tonumber(t[1]) * 1000 + "
                          "math.floor(tonumber(t[2]) / 1000))",
                          "1",
                          "idemproc:members:test-group",
                          m,
                          NULL};
    char *out = th_redis_cli(&stk.redis, args);
    long long v = out ? strtoll(out, NULL, 10) : -1;
    free(out);
    return v;
}

/* A member killed without a word keeps its heartbeat as long as its Kafka
 * session (kafka.session.timeout.ms): the time the broker still counts it
 * in the group. Meanwhile it still blocks the switch (it wanted global);
 * once its session is over the switch goes through. With the former fixed
 * 10 s entry, the entry had at most 10 s left. */
Test(layout, killed_members_heartbeat_lasts_its_session, .timeout = 180)
{
    const char *props[] = {LAYOUT_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    const char *const old_sets[] = {"dedup.scope=global",
                                    "kafka.session.timeout.ms=20000", NULL};
    pid_t m1 = member("m1", old_sets);
    long long left = -1;
    for (int t = 0; t < 20000 && left < 0; t += 100) {
        left = heartbeat_left_ms("m1");
        if (left < 0)
            usleep(100000);
    }
    cr_assert_gt(left, 10000, "m1's heartbeat has %lld ms left", left);
    cr_expect_leq(left, 20000);
    cr_assert_eq(kill(m1, SIGKILL), 0);
    th_wait(m1, 10000);

    pid_t m2 = member("m2", want_partition);
    /* m2 beats while m1's entry lives: no switch. m2's heartbeat is
     * read first, so a switch could have been decided. */
    for (int t = 0; t < 20000 && heartbeat_left_ms("m2") < 0; t += 100)
        usleep(100000);
    cr_assert_geq(heartbeat_left_ms("m2"), 0);
    usleep(1500000); /* a beat of m2 after its first */
    cr_assert_gt(heartbeat_left_ms("m1"), 0,
                 "m1's entry ended before m2 beat twice: nothing proved");
    cr_expect(!layout_is("partition"),
              "switched while a killed member's session lasted");
    wait_layout("partition", 60000);
    cr_expect_lt(heartbeat_left_ms("m1"), 0, "m1's heartbeat outlived it");
    cr_expect_eq(th_stop(m2, 15000), 0);
    th_stack_stop(&stk);
}
