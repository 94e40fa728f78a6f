/* test_migrate: `idemproc migrate`, a group moved from one Redis to a
 * real Redis Cluster (3 primaries, 3 replicas) mid-stream: the ledger with
 * dedup.scope=partition runs part of a stream on one Redis, stops, its
 * state is migrated, and members on the cluster run the rest plus every
 * record sent again; `verify` exact (nothing applied twice, nothing
 * lost). Its refusals (a live member, a cluster that holds the group's
 * state) and a second run (nothing to do). And the ACL line of
 * deploy/README.md for cluster mode: a member and verify run as that user
 * on every node, with nothing denied. The script handler's keys moved
 * into one shard (state get and verify equal before and after); over TLS
 * with --force both ways, a window key longer than a piece and a global
 * mark; a member started during the copy. */
#include "harness.h"
#include "harness_cluster.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_stack_t stk;
static th_cluster_t clu;
static char *script_dir;

static void migrate_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
    if (script_dir)
        th_rmrf(script_dir);
    free(script_dir);
    script_dir = NULL;
}

TestSuite(migrate, .fini = migrate_fini);

#define PARTS 6

static char nodes_prop[512];

static const char *cluster_set(void)
{
    snprintf(nodes_prop, sizeof(nodes_prop), "redis.cluster.nodes=%s",
             clu.seeds);
    return nodes_prop;
}

/* Sum over the live primaries of the values of `get` (GET or a field by
 * HGET) of the keys matching pattern. */
static long cluster_sum(const char *pattern, const char *field)
{
    long sum = 0;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS %s", pattern);
        char *save = NULL;
        for (char *k = keys ? strtok_r(keys, "\n", &save) : NULL; k;
             k = strtok_r(NULL, "\n", &save)) {
            char *v = field ? th_cluster_cmd(&clu, i, "HGET %s %s", k, field)
                            : th_cluster_cmd(&clu, i, "GET %s", k);
            sum += v ? atol(v) : 0;
            free(v);
        }
        free(keys);
    }
    return sum;
}

static long cluster_keys(const char *pattern)
{
    long n = 0;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS %s", pattern);
        for (char *c = keys; c && *c; c++)
            n += *c == '\n';
        n += keys && *keys && keys[strlen(keys) - 1] != '\n';
        free(keys);
    }
    return n;
}

/* idemproc migrate -c <stack conf> --set redis.cluster.nodes=... --from
 * <the stack's Redis> plus extra (may be NULL); its exit code, *out its
 * stdout and stderr. */
static int run_migrate(const char *extra, char **out)
{
    char from[96];
    snprintf(from, sizeof(from), "redis://127.0.0.1:%d/0", stk.redis.port);
    char *argv[] = {
        (char *)th_bin(),      "migrate", "-c", stk.conf,      "--set",
        (char *)cluster_set(), "--from",  from, (char *)extra, NULL};
    char *o = NULL, *e = NULL;
    int rc = th_run(argv, &o, &e, 120000);
    size_t n = strlen(o ? o : "") + strlen(e ? e : "") + 1;
    *out = malloc(n);
    snprintf(*out, n, "%s%s", o ? o : "", e ? e : "");
    free(o);
    free(e);
    return rc;
}

/* idemproc migrate -c <stack conf>, each of sets (NULL-ended; NULL: the
 * plain cluster's seeds) as --set, --from <the stack's Redis>, then extra
 * (NULL-ended, may be NULL); its exit code, *out its stdout and stderr. */
static int run_migrate_v(const char *const sets[], const char *const extra[],
                         char **out)
{
    char from[96];
    snprintf(from, sizeof(from), "redis://127.0.0.1:%d/0", stk.redis.port);
    const char *plain[] = {cluster_set(), NULL};
    char *argv[40];
    int n = 0;
    argv[n++] = (char *)th_bin();
    argv[n++] = "migrate";
    argv[n++] = "-c";
    argv[n++] = stk.conf;
    for (const char *const *s = sets ? sets : plain; *s && n < 30; s++) {
        argv[n++] = "--set";
        argv[n++] = (char *)*s;
    }
    argv[n++] = "--from";
    argv[n++] = from;
    for (int i = 0; extra && extra[i] && n < 39; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    char *o = NULL, *e = NULL;
    int rc = th_run(argv, &o, &e, 180000);
    size_t len = strlen(o ? o : "") + strlen(e ? e : "") + 1;
    *out = malloc(len);
    snprintf(*out, len, "%s%s", o ? o : "", e ? e : "");
    free(o);
    free(e);
    return rc;
}

/* The cluster node (index) that owns key's slot; -1 when none. */
static int key_owner(const char *key)
{
    char *slot = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT %s", key);
    int owner = slot ? th_cluster_owner(&clu, atoi(slot)) : -1;
    free(slot);
    return owner;
}

/* redis-cli on the stack's single Redis: its trimmed output (caller
 * frees). */
static char *src_cli(const char *const args[])
{
    char *r = th_redis_cli(&stk.redis, args);
    return r ? r : strdup("");
}

/* The same generated traffic each time (deterministic by seed): sent
 * again, every record is a duplicate of one applied before. */
static const char *const traffic[] = {
    "--count", "3000", "--duplicates", "0.1", "--seed", "2525", NULL};

Test(migrate, single_redis_to_cluster_mid_stream_exact, .timeout = 300)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    const char *props[] = {"dedup.scope=partition", "handler=ledger",
                           "batch.max.messages=50", NULL};
    cr_assert_eq(th_stack_start(&stk, PARTS, props), 0);
    /* Part of the stream on one Redis: the traffic at a fixed rate, the
     * member stopped while it still comes. */
    char *pargv[] = {(char *)th_bin(),
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
                     "2525",
                     "--rate",
                     "600",
                     NULL};
    pid_t prod = th_spawn(pargv, NULL, NULL, NULL);
    cr_assert_gt(prod, 0);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    cr_assert_eq(th_stack_wait_applied(&stk, 600, 90000), 0,
                 "the member never got going:\n%s",
                 th_stack_member_log(&stk, "m1"));

    /* Refused while the member runs; nothing written to the cluster. */
    char *out = NULL;
    cr_expect_eq(run_migrate(NULL, &out), 1, "%s", out);
    cr_expect(strstr(out, "refused: member m1"), "%s", out);
    free(out);
    cr_expect_eq(cluster_keys("idemproc:*"), 0);

    cr_assert_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    long applied_single = th_stack_applied(&stk);
    cr_expect_eq(th_wait(prod, 0), -1,
                 "the traffic ended before the member stopped: not "
                 "mid-stream");
    cr_assert_eq(th_wait(prod, 120000), 0, "produce failed");
    long unique = th_stack_expect_unique(&stk);
    cr_assert_lt(applied_single, unique);

    cr_assert_eq(run_migrate(NULL, &out), 0, "%s", out);
    fprintf(stderr, "idemproc migrate:\n%s", out); /* in the test's log */
    cr_expect(strstr(out, "migrated"), "%s", out);
    cr_expect(!strstr(out, "MISMATCH"), "%s", out);
    free(out);
    /* What the cluster holds now: the counter moved into one shard. */
    cr_expect_eq(cluster_sum("idemproc:ledger:applied{*", NULL),
                 applied_single);
    cr_expect_eq(cluster_keys("idemproc:pos{test-group:payments:*}"), PARTS);
    cr_expect_eq(cluster_keys("idemproc:dedupkey:test-group"), 1);
    cr_expect_gt(cluster_keys("idemproc:st{test-group:payments:*}:w*"), 0);
    /* A second run: nothing to do. */
    cr_expect_eq(run_migrate(NULL, &out), 0, "%s", out);
    cr_expect(strstr(out, "nothing to do"), "%s", out);
    free(out);

    /* The rest of the stream on the cluster, then all of it again. */
    const char *sets[] = {cluster_set(), NULL};
    pid_t m2 = th_stack_member_started(&stk, "m2", sets);
    pid_t m3 = th_stack_member_started(&stk, "m3", sets);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    th_stack_wait_committed(&stk, "payments", PARTS, 120000);
    TH_ASSERT_VERIFIED(&stk, 0, sets, 120000);
    cr_expect_eq(cluster_sum("idemproc:ledger:applied{*", NULL), unique);
    /* The cluster members wrote nothing to the single Redis. */
    cr_expect_eq(th_stack_applied(&stk), applied_single);
    cr_expect_eq(th_stack_stop_member(&stk, "m2", m2, 15000), 0);
    cr_expect_eq(th_stack_stop_member(&stk, "m3", m3, 15000), 0);

    /* The marker gone, the cluster's state of the group is refused. */
    char *del = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT %s",
                               "idemproc:migrated{test-group}");
    int owner = th_cluster_owner(&clu, del ? atoi(del) : 0);
    free(del);
    cr_assert_geq(owner, 0);
    free(th_cluster_cmd(&clu, owner, "DEL idemproc:migrated{test-group}"));
    cr_expect_eq(run_migrate(NULL, &out), 1, "%s", out);
    cr_expect(strstr(out, "refused: the cluster already holds"), "%s", out);
    free(out);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* deploy/README.md's ACL line for cluster mode (the processor's line, the
 * partition layout's addition and the cluster's), given on every node. */
#define ACL_CLUSTER                                                            \
    "ACL SETUSER idemproc reset on >acl-user-pw ~idemproc:* resetchannels "    \
    "-@all +select +role +script|load +evalsha +mget +get +set +incrby "       \
    "+hincrby +hset +hmget +info +wait +scan +hgetall +ping +bgrewriteaof "    \
    "+time +zadd +zrem +zremrangebyscore +zrangebyscore +pexpire +hdel "       \
    "+incr +getrange +append +expireat +exists +strlen "                       \
    "+cluster|slots +asking +hsetnx +hget"

Test(migrate, cluster_acl_line_is_enough_for_a_member_and_verify,
     .timeout = 240)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    for (int i = 0; i < clu.n; i++) {
        char *r = th_cluster_cmd(&clu, i, ACL_CLUSTER);
        cr_assert_str_eq(r ? r : "", "OK", "node %d", i);
        free(r);
    }
    const char *props[] = {"dedup.scope=partition", "handler=ledger",
                           "batch.max.messages=50", NULL};
    cr_assert_eq(th_stack_start(&stk, PARTS, props), 0);
    const char *sets[] = {cluster_set(),
                          "redis.url=redis://idemproc:acl-user-pw@127.0.0.1/0",
                          NULL};
    pid_t m = th_stack_member_started(&stk, "m1", sets);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    th_stack_wait_committed(&stk, "payments", PARTS, 120000);
    TH_ASSERT_VERIFIED(&stk, 0, sets, 120000);
    cr_expect_gt(cluster_keys("idemproc:st{test-group:payments:*}:w*"), 0);
    for (int i = 0; i < clu.n; i++) {
        char *log = th_cluster_cmd(&clu, i, "ACL LOG");
        cr_expect_str_empty(log ? log : "?", "node %d denied:\n%s", i, log);
        free(log);
    }
    cr_expect_eq(th_wait(m, 0), -1, "the member must still run");
    cr_expect_eq(th_stack_stop_member(&stk, "m1", m, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* migrate decides by the handler's effect kind: an external effect
 * (forward) is refused before anything is read or written, and so is the
 * script handler without --script-keys (its keys would start over on the
 * cluster). */
Test(migrate, other_handlers_refused)
{
    char dir[] = "/tmp/idemproc-mig-XXXXXX";
    cr_assert(mkdtemp(dir));
    char conf[128];
    snprintf(conf, sizeof(conf), "%s/m.properties", dir);
    FILE *f = fopen(conf, "w");
    cr_assert(f);
    fputs("kafka.bootstrap.servers=127.0.0.1:1\ngroup.id=g\n"
          "input.topics=t\ndlq.topic=d\nredis.cluster.nodes=127.0.0.1:1\n",
          f);
    fclose(f);
    char lua[160], script[192];
    snprintf(lua, sizeof(lua), "%s/e.lua", dir);
    f = fopen(lua, "w");
    cr_assert(f);
    fputs("function effect(rec)\nend\n", f);
    fclose(f);
    snprintf(script, sizeof(script), "script.file=%s", lua);
    const char *sets[][3] = {
        {"handler=forward", "output.topic=o", "dedup.scope=global"},
        {"handler=script", script, "dedup.scope=partition"},
    };
    const char *says[] = {"its effect is outside Redis",
                          "list them with --script-keys"};
    for (size_t i = 0; i < 2; i++) {
        char *argv[] = {(char *)th_bin(),
                        "migrate",
                        "-c",
                        conf,
                        "--set",
                        (char *)sets[i][0],
                        "--set",
                        (char *)sets[i][1],
                        "--set",
                        (char *)sets[i][2],
                        "--from",
                        "redis://127.0.0.1:1/0",
                        NULL};
        char *o = NULL, *e = NULL;
        int rc = th_run(argv, &o, &e, 30000);
        cr_expect_eq(rc, 1, "%s: exit %d: %s", sets[i][0], rc, e ? e : "");
        cr_expect(e && strstr(e, says[i]) && strstr(e, "nothing copied"),
                  "%s: %s", sets[i][0], e ? e : "");
        free(o);
        free(e);
    }
    unlink(conf);
    unlink(lua);
    rmdir(dir);
}

/* handler=script: payments applied by the user's Lua effect (the one of
 * test_cluster_run.c): bal:<CURRENCY> hashes and an applied counter, on
 * one Redis under their own names, in cluster mode sharded by partition. */
static const char payments_lua[] =
    "function effect(rec)\n"
    "  local f = rec.fields\n"
    "  local cur, user, amt = f['/currency'], f['/user_id'], f['/amount']\n"
    "  if type(cur) ~= 'string' or type(user) ~= 'string' or\n"
    "    type(amt) ~= 'number' then\n"
    "    return false, 'not a payment'\n"
    "  end\n"
    "  idem.hincrby('bal:' .. cur, user, math.floor(amt * 100 + 0.5))\n"
    "  idem.incrby('applied', 1)\n"
    "end\n";

static const char *const script_traffic[] = {
    "--count", "2000",         "--duplicates", "0.1", "--seed",
    "4242",    "--currencies", "EUR,USD",      NULL};

/* verify -c <stack conf> --expect path, plus each of sets as --set (may be
 * NULL); its exit code, *out its output (caller frees). */
static int run_verify(const char *path, const char *const sets[], char **out)
{
    char *argv[16];
    int n = 0;
    argv[n++] = (char *)th_bin();
    argv[n++] = "verify";
    argv[n++] = "-c";
    argv[n++] = stk.conf;
    argv[n++] = "--expect";
    argv[n++] = (char *)path;
    for (int i = 0; sets && sets[i] && n < 14; i++) {
        argv[n++] = "--set";
        argv[n++] = (char *)sets[i];
    }
    argv[n] = NULL;
    char *o = NULL, *e = NULL;
    int rc = th_run(argv, &o, &e, 60000);
    size_t len = strlen(o ? o : "") + strlen(e ? e : "") + 1;
    *out = malloc(len);
    snprintf(*out, len, "%s%s", o ? o : "", e ? e : "");
    free(o);
    free(e);
    return rc;
}

/* `state get script key field --json` (plus sets): its "value" as text
 * (a JSON dump; "absent" when null, "error: ..." on a failure), caller
 * frees. */
static char *state_value(const char *key, const char *field,
                         const char *const sets[])
{
    char *argv[16];
    int n = 0;
    argv[n++] = (char *)th_bin();
    argv[n++] = "state";
    argv[n++] = "get";
    argv[n++] = "script";
    argv[n++] = (char *)key;
    argv[n++] = (char *)field;
    argv[n++] = "-c";
    argv[n++] = stk.conf;
    argv[n++] = "--json";
    for (int i = 0; sets && sets[i] && n < 14; i++) {
        argv[n++] = "--set";
        argv[n++] = (char *)sets[i];
    }
    argv[n] = NULL;
    char *o = NULL, *e = NULL, *res = NULL;
    int rc = th_run(argv, &o, &e, 60000);
    json_t *j = rc == 0 && o ? json_loads(o, 0, NULL) : NULL;
    json_t *v = j ? json_object_get(j, "value") : NULL;
    if (!j)
        res = strdup("error");
    else if (!v || json_is_null(v))
        res = strdup("absent");
    else
        res = json_dumps(v, JSON_ENCODE_ANY);
    if (!j)
        cr_log_error("state get script %s %s: exit %d: %s%s", key, field, rc,
                     o ? o : "", e ? e : "");
    json_decref(j);
    free(o);
    free(e);
    return res;
}

/* The expectation of the script run for verify at path: the ledger
 * `produce` predicted as the hashes bal:<CURRENCY>, the applied counter,
 * and the applied identities by their marks. */
static void script_expect_write(const char *path, long unique)
{
    json_error_t jerr;
    json_t *want = json_load_file(stk.expect, 0, &jerr);
    cr_assert(want, "%s: %s", stk.expect, jerr.text);
    json_t *redis = json_object();
    const char *cur;
    json_t *users;
    json_object_foreach(json_object_get(want, "ledger"), cur, users)
    {
        char key[64];
        snprintf(key, sizeof(key), "bal:%s", cur);
        json_object_set(redis, key, users);
    }
    json_object_set_new(redis, "applied", json_integer(unique));
    json_t *e =
        json_pack("{sI so}", "applied", (json_int_t)unique, "redis", redis);
    cr_assert_eq(json_dump_file(e, path, JSON_INDENT(1)), 0);
    json_decref(e);
    json_decref(want);
}

/* The script handler's state moved: a run on one Redis, `verify` exact
 * and `state get script` read there; a set among the keys named is
 * refused by name with nothing written; then the move, after which
 * `state get` gives the same values and `verify` (the same expectation)
 * is exact on the cluster; then members on the cluster get every record
 * again and apply none of them. */
Test(migrate, script_handler_moved_exact, .timeout = 300)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    char file[600];
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&script_dir, "payments.lua", payments_lua));
    const char *props[] = {"dedup.scope=partition",
                           "handler=script",
                           file,
                           "script.fields=/currency,/user_id,/amount",
                           "batch.max.messages=50",
                           NULL};
    cr_assert_eq(th_stack_start(&stk, PARTS, props), 0);
    cr_assert_eq(th_stack_produce(&stk, script_traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    cr_assert_gt(unique, 1000);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    const char *get_applied[] = {"GET", "applied", NULL};
    long applied = 0;
    for (int waited = 0; waited < 120000; waited += 200) {
        char *v = src_cli(get_applied);
        applied = atol(v);
        free(v);
        if (applied >= unique)
            break;
        usleep(200 * 1000);
    }
    cr_assert_eq(applied, unique, "%s", th_stack_member_log(&stk, "m1"));
    cr_assert_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);

    char vpath[600], *out = NULL;
    snprintf(vpath, sizeof(vpath), "%s/script-expect.json", stk.dir);
    script_expect_write(vpath, unique);
    cr_expect_eq(run_verify(vpath, NULL, &out), 0, "one Redis:\n%s", out);
    free(out);
    /* What state get reads on one Redis: a few balances, the counter. */
    const char *probes[][2] = {{"bal:EUR", "user-1"},
                               {"bal:USD", "user-2"},
                               {"bal:EUR", "user-99"},
                               {"applied", "-"}};
    size_t nprobes = sizeof(probes) / sizeof(probes[0]);
    char *before[4];
    for (size_t i = 0; i < nprobes; i++) {
        before[i] = state_value(probes[i][0], probes[i][1], NULL);
        cr_assert(strcmp(before[i], "error") && strcmp(before[i], "absent"),
                  "%s %s: %s", probes[i][0], probes[i][1], before[i]);
    }

    /* A set among the keys named: refused by name, nothing written. */
    const char *sadd[] = {"SADD", "seen:x", "a", "b", NULL};
    free(src_cli(sadd));
    const char *with_set[] = {"--script-keys", "bal:*,applied,seen:*", NULL};
    cr_expect_eq(run_migrate_v(NULL, with_set, &out), 1, "%s", out);
    cr_expect(strstr(out, "refused: script key seen:x is a set"), "%s", out);
    free(out);
    cr_expect_eq(cluster_keys("*"), 0);
    const char *del[] = {"DEL", "seen:x", NULL};
    free(src_cli(del));

    const char *keys[] = {"--script-keys", "bal:*,applied", NULL};
    cr_assert_eq(run_migrate_v(NULL, keys, &out), 0, "%s", out);
    fprintf(stderr, "idemproc migrate:\n%s", out);
    cr_expect(strstr(out, "script: 3 keys into the shard "
                          "{test-group:payments:0}"),
              "%s", out);
    free(out);
    /* Each key whole in one shard, so the sums are the old values. */
    cr_expect_eq(cluster_keys("bal:*{test-group:payments:0}"), 2);
    cr_expect_eq(cluster_sum("applied{*", NULL), unique);
    const char *sets[] = {cluster_set(), NULL};
    for (size_t i = 0; i < nprobes; i++) {
        char *after = state_value(probes[i][0], probes[i][1], sets);
        cr_expect_str_eq(after, before[i], "state get script %s %s",
                         probes[i][0], probes[i][1]);
        free(after);
        free(before[i]);
    }
    cr_expect_eq(run_verify(vpath, sets, &out), 0, "cluster:\n%s", out);
    cr_expect(strstr(out, "verify: redis exact ("), "%s", out);
    free(out);

    /* Every record again, to members on the cluster: all duplicates. */
    pid_t m2 = th_stack_member_started(&stk, "m2", sets);
    cr_assert_eq(th_stack_produce(&stk, script_traffic), 0);
    th_stack_wait_committed(&stk, "payments", PARTS, 120000);
    cr_expect_eq(run_verify(vpath, sets, &out), 0, "cluster, again:\n%s", out);
    char line[128];
    snprintf(line, sizeof(line), "verify: marks exact (%ld identities applied",
             unique);
    cr_expect(strstr(out, line), "want %s in:\n%s", line, out);
    free(out);
    cr_expect_eq(cluster_sum("applied{*", NULL), unique);
    cr_expect_eq(th_stack_stop_member(&stk, "m2", m2, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* SHA-1 of the string at key, computed by the Redis that holds it (node
 * `node` of the cluster, or the stack's Redis when node < 0); caller
 * frees. */
static char *key_sha(int node, const char *key)
{
    static const char lua[] =
        "return redis.sha1hex(redis.call('GET', KEYS[1]) or '')";
    if (node >= 0)
        return th_cluster_cmd(&clu, node, "EVAL %s 1 %s", lua, key);
    const char *args[] = {"EVAL", lua, "1", key, NULL};
    return src_cli(args);
}

/* Over TLS to a TLS cluster (seeds its TLS ports, rediss:// and the test
 * CA; the source a plain Redis): --force shown both ways (a ledger shard
 * on the cluster refuses the move, nothing written; with --force it is
 * replaced by the copy), a window key longer than one 1 MiB piece copied
 * byte for byte, and the global path's mark of a record without a key
 * copied to its bucket's name with its time to live. */
Test(migrate, over_tls_force_long_key_and_global_marks, .timeout = 300)
{
    cr_assert_eq(th_cluster_start_tls(&clu, 3, 0), 0,
                 "TLS cluster did not start");
    const char *props[] = {"dedup.scope=partition", "handler=ledger",
                           "batch.max.messages=50", NULL};
    cr_assert_eq(th_stack_start(&stk, PARTS, props), 0);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    /* A record without a key (kcat, no headers): the global path. */
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "printf '%%s\\n' '{\"message_id\":\"kl-1\",\"idempotency_key\":"
             "\"payment-kl-1\",\"event_type\":\"payment.captured\","
             "\"created_at\":\"2026-01-01T00:00:00Z\",\"version\":1,"
             "\"order_id\":\"kl-1\",\"user_id\":\"user-1\",\"amount\":1.00,"
             "\"currency\":\"EUR\"}' | /usr/bin/kcat -P -b %s -t payments",
             stk.broker.bootstrap);
    char *sh[] = {"/bin/sh", "-c", cmd, NULL};
    cr_assert_eq(th_run(sh, NULL, NULL, 30000), 0, "kcat failed");
    cr_assert_eq(th_stack_wait_applied(&stk, unique + 1, 120000), 0,
                 "applied %ld of %ld:\n%s", th_stack_applied(&stk), unique + 1,
                 th_stack_member_log(&stk, "m1"));
    cr_assert_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    const char *gkeys[] = {"KEYS", "idemproc:dedup:test-group:*", NULL};
    char *gmark = src_cli(gkeys);
    cr_assert(*gmark && !strchr(gmark, '\n'),
              "want one global mark on the source, got: %s", gmark);
    const char *id = gmark + strlen("idemproc:dedup:test-group:");
    /* A window key of 3.2 MiB (more than three pieces), distinct bytes. */
    const char *big = "idemproc:st{test-group:payments:0}:w7";
    const char *mk[] = {
        "EVAL",
        "for i = 1, tonumber(ARGV[1]) do redis.call('APPEND', KEYS[1], "
        "string.format('%08d', i) .. string.rep('.', 56)) end "
        "redis.call('PEXPIRE', KEYS[1], 600000) "
        "return redis.call('STRLEN', KEYS[1])",
        "1",
        big,
        "50000",
        NULL};
    char *len = src_cli(mk);
    cr_assert_str_eq(len, "3200000");
    free(len);

    char nodes[600], ca[600];
    snprintf(nodes, sizeof(nodes), "redis.cluster.nodes=%s", clu.tls_seeds);
    snprintf(ca, sizeof(ca), "redis.tls.ca.file=%s", clu.tls_ca);
    const char *tls[] = {nodes, "redis.url=rediss://127.0.0.1:1/0", ca, NULL};
    /* A shard of the ledger already on the cluster: refused, nothing
     * written, the shard as it was. */
    const char *shard = "idemproc:ledger:EUR{test-group:payments:0}";
    int so = key_owner(shard);
    cr_assert_geq(so, 0);
    free(th_cluster_cmd(&clu, so, "HSET %s user-1 7", shard));
    char *out = NULL;
    cr_expect_eq(run_migrate_v(tls, NULL, &out), 1, "%s", out);
    cr_expect(strstr(out, "refused: the cluster already holds "
                          "idemproc:ledger:EUR{test-group:payments:0}"),
              "%s", out);
    free(out);
    cr_expect_eq(cluster_keys("idemproc:st{*"), 0);
    char *v = th_cluster_cmd(&clu, so, "HGET %s user-1", shard);
    cr_expect_str_eq(v ? v : "", "7");
    free(v);
    /* --force: copied over it, the shard now the source's balance. */
    const char *force[] = {"--force", NULL};
    cr_assert_eq(run_migrate_v(tls, force, &out), 0, "%s", out);
    fprintf(stderr, "idemproc migrate --force:\n%s", out);
    cr_expect(strstr(out, "ledger:EUR  source "), "%s", out);
    cr_expect(!strstr(out, "MISMATCH"), "%s", out);
    cr_expect(strstr(out, "1 global marks"), "%s", out);
    cr_expect(strstr(out, "1 keys longer than 1048576 bytes copied in "
                          "pieces"),
              "%s", out);
    free(out);
    const char *hget[] = {"HGET", "idemproc:ledger:EUR", "user-1", NULL};
    char *want = src_cli(hget);
    v = th_cluster_cmd(&clu, so, "HGET %s user-1", shard);
    cr_expect_str_eq(v ? v : "", want);
    free(v);
    free(want);
    cr_expect_eq(cluster_sum("idemproc:ledger:applied{*", NULL), unique + 1);
    /* The long key byte for byte, its time to live kept. */
    int bo = key_owner(big);
    cr_assert_geq(bo, 0);
    char *a = key_sha(-1, big), *b = key_sha(bo, big);
    cr_expect_str_eq(b ? b : "", a, "SHA-1 of %s", big);
    free(a);
    free(b);
    v = th_cluster_cmd(&clu, bo, "PTTL %s", big);
    cr_expect(v && atol(v) > 0 && atol(v) <= 600000, "PTTL %s: %s", big, v);
    free(v);
    /* The global mark under its bucket's tag: the bucket is the CRC16 of
     * the identity (CLUSTER KEYSLOT's, for a name without braces) % 64. */
    char *slot = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT %s", id);
    cr_assert(slot && !strchr(id, '{'));
    char dst[512];
    snprintf(dst, sizeof(dst), "idemproc:dedup{test-group::%02d}:%s",
             atoi(slot) % 64, id);
    free(slot);
    int go = key_owner(dst);
    cr_assert_geq(go, 0);
    const char *pttl[] = {"PTTL", gmark, NULL};
    char *src_ttl = src_cli(pttl);
    v = th_cluster_cmd(&clu, go, "PTTL %s", dst);
    cr_expect(v && atol(v) > 0 && atol(v) <= atol(src_ttl),
              "PTTL %s: %s (source %s)", dst, v, src_ttl);
    free(v);
    free(src_ttl);
    const char *get[] = {"GET", gmark, NULL};
    char *sv = src_cli(get);
    v = th_cluster_cmd(&clu, go, "GET %s", dst);
    cr_expect_str_eq(v ? v : "", sv, "the mark's value");
    free(v);
    free(sv);
    free(gmark);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* A member started while the copy runs: the copy is held on a cluster
 * node's CLIENT PAUSE WRITE (migrate's own reads, the member checks
 * included, go on), a member starts on the single Redis meanwhile, then
 * the pause ends: migrate fails naming it and writes no marker; once it
 * is stopped, a new run is refused (the cluster holds the group's state;
 * then the source's layout still honours global marks after a switch)
 * until --force, which overrides both. */
Test(migrate, member_started_during_the_copy_fails, .timeout = 300)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    const char *props[] = {"dedup.scope=partition", "handler=ledger",
                           "batch.max.messages=50", NULL};
    cr_assert_eq(th_stack_start(&stk, PARTS, props), 0);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    cr_assert_eq(th_stack_wait_applied(&stk, unique, 120000), 0);
    cr_assert_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    /* The node to pause: one that takes a partition's state but not the
     * group's heartbeats (its liveness script is a write for PAUSE). */
    int hb = key_owner("idemproc:members{test-group}"), paused = -1;
    for (int p = 0; p < PARTS && paused < 0; p++) {
        char k[96];
        snprintf(k, sizeof(k), "idemproc:st{test-group:payments:%d}:epoch", p);
        int o = key_owner(k);
        if (o != hb)
            paused = o;
    }
    cr_assert_geq(paused, 0, "every partition on the heartbeats' node");
    char *r = th_cluster_cmd(&clu, paused, "CLIENT PAUSE 60000 WRITE");
    cr_assert_str_eq(r ? r : "", "OK");
    free(r);
    char from[96], outp[600], errp[600];
    snprintf(from, sizeof(from), "redis://127.0.0.1:%d/0", stk.redis.port);
    snprintf(outp, sizeof(outp), "%s/migrate.out", stk.dir);
    snprintf(errp, sizeof(errp), "%s/migrate.err", stk.dir);
    char *argv[] = {(char *)th_bin(),      "migrate", "-c", stk.conf, "--set",
                    (char *)cluster_set(), "--from",  from, NULL};
    pid_t mig = th_spawn(argv, outp, errp, NULL);
    cr_assert_gt(mig, 0);
    int blocked = 0;
    for (int waited = 0; !blocked && waited < 60000; waited += 100) {
        char *info = th_cluster_cmd(&clu, paused, "INFO clients");
        blocked = info && strstr(info, "blocked_clients:1");
        free(info);
        if (!blocked)
            usleep(100 * 1000);
    }
    cr_assert(blocked, "migrate never wrote to the paused node");
    pid_t m2 = th_stack_member_started(&stk, "m2", NULL);
    free(th_cluster_cmd(&clu, paused, "CLIENT UNPAUSE"));
    cr_expect_eq(th_wait(mig, 120000), 1);
    char *o = NULL, *e = NULL;
    FILE *f = fopen(errp, "r");
    if (f) {
        e = calloc(1, 65536);
        fread(e, 1, 65535, f);
        fclose(f);
    }
    f = fopen(outp, "r");
    if (f) {
        o = calloc(1, 65536);
        fread(o, 1, 65535, f);
        fclose(f);
    }
    cr_expect(e && strstr(e, "failed: member m2 of group test-group started "
                             "on the source during the copy"),
              "%s%s", o ? o : "", e ? e : "");
    free(o);
    free(e);
    int mo = key_owner("idemproc:migrated{test-group}");
    char *marker =
        th_cluster_cmd(&clu, mo, "EXISTS %s", "idemproc:migrated{test-group}");
    cr_expect_str_eq(marker ? marker : "", "0", "the marker was written");
    free(marker);
    cr_expect_eq(th_stack_stop_member(&stk, "m2", m2, 15000), 0);
    /* Run again with every member stopped: the copy is refused over the
     * group's state, then made with --force. */
    char *out = NULL;
    cr_expect_eq(run_migrate_v(NULL, NULL, &out), 1, "%s", out);
    cr_expect(strstr(out, "refused: the cluster already holds"), "%s", out);
    free(out);
    /* The source switched to partition a moment ago: it still honours
     * the global marks, which cluster mode does not read: refused. */
    const char *layouts[] = {"global", "partition"};
    for (int i = 0; i < 2; i++) {
        char *largv[] = {
            (char *)th_bin(), "layout", "set", (char *)layouts[i], "-c",
            stk.conf,         NULL};
        char *lo = NULL, *le = NULL;
        cr_assert_eq(th_run(largv, &lo, &le, 30000), 0, "layout set %s: %s%s",
                     layouts[i], lo ? lo : "", le ? le : "");
        free(lo);
        free(le);
    }
    cr_expect_eq(run_migrate_v(NULL, NULL, &out), 1, "%s", out);
    cr_expect(strstr(out, "refused: the source switched from global"), "%s",
              out);
    free(out);
    /* --force copies over the cluster's state and past the honouring. */
    const char *force[] = {"--force", NULL};
    cr_expect_eq(run_migrate_v(NULL, force, &out), 0, "%s", out);
    cr_expect(strstr(out, "migrated;"), "%s", out);
    free(out);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}
