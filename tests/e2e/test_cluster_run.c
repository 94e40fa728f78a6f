/* test_cluster_run: two members with the ledger handler against a real
 * Redis Cluster of 3 primaries and 3 replicas (redis.cluster.nodes, whose
 * first seed is down), traffic with duplicates and poison, `verify` exact
 * (it sums the balances sharded by partition over every primary): while
 * the slots of a third of the partitions' tags are migrated mid-stream,
 * and while a primary owning tags is kill -9'd, its replica promoted, and
 * the killed node comes back as a replica. Then two members with
 * handler=script (a Lua effect writing balances with idem.hincrby, so
 * sharded by partition) through both at once, the balances summed over
 * every primary's shards against the ones computed from what was
 * produced, and `verify` agreeing (then failing once a shard is changed
 * by hand). */
#include "harness.h"
#include "harness_cluster.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs them. */
static th_stack_t stk;
static th_cluster_t clu;
static char *script_dir;

static void cluster_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
    if (script_dir)
        th_rmrf(script_dir);
    free(script_dir);
    script_dir = NULL;
}

TestSuite(cluster_run, .fini = cluster_fini);

#define PARTS 9

/* The properties of cluster mode: seeds whose first is a closed port;
 * the handler's own lines (handler=... and its keys) in handler_props. */
static char nodes_prop[512];
static const char *handler_props[4] = {"handler=ledger", NULL};

static const char *const *cluster_props(void)
{
    int dead = th_free_port();
    snprintf(nodes_prop, sizeof(nodes_prop),
             "redis.cluster.nodes=127.0.0.1:%d,%s", dead, clu.seeds);
    static const char *props[8];
    int n = 0;
    props[n++] = "dedup.scope=partition";
    props[n++] = "batch.max.messages=50";
    props[n++] = nodes_prop;
    for (int i = 0; handler_props[i]; i++)
        props[n++] = handler_props[i];
    props[n] = NULL;
    return props;
}

/* Sum over the live primaries of the sharded <prefix>ledger:applied{...}
 * counters: what th_stack_applied reads on a single Redis. */
static long cluster_applied(void)
{
    long sum = 0;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS idemproc:ledger:applied*");
        for (char *k = keys ? strtok(keys, "\n") : NULL; k;
             k = strtok(NULL, "\n")) {
            char *v = th_cluster_cmd(&clu, i, "GET %s", k);
            sum += v ? atol(v) : 0;
            free(v);
        }
        free(keys);
    }
    return sum;
}

/* The slot of partition p's tag, as the cluster computes it. */
static int tag_slot(int p)
{
    char *out =
        th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT {test-group:payments:%d}", p);
    int slot = out ? atoi(out) : -1;
    free(out);
    return slot;
}

/* Keys under the partitions' tags on the cluster: the layout was written
 * sharded (chunk windows, positions, ledger shards). */
static long sharded_keys(const char *pattern)
{
    long n = 0;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS %s", pattern);
        for (char *k = keys ? strtok(keys, "\n") : NULL; k;
             k = strtok(NULL, "\n"))
            n++;
        free(keys);
    }
    return n;
}

/* The traffic, produced at a fixed rate by a thread while the test
 * reshards or kills: 2,000 records/s, for about 6 s (12,000) unless the
 * test asks for more. */
static pthread_t producer;
static char traffic_count[16] = "12000";
static char traffic_poison[16] = "0.01";
static atomic_int produced; /* 1 once the producer ended, 2 + rc */

static void *produce_main(void *arg)
{
    (void)arg;
    const char *traffic[] = {"--count",
                             traffic_count,
                             "--duplicates",
                             "0.1",
                             "--poison",
                             traffic_poison,
                             "--too-large-bytes",
                             "5000",
                             "--seed",
                             "25",
                             "--rate",
                             "2000",
                             NULL};
    int rc = th_stack_produce(&stk, traffic);
    atomic_store(&produced, 2 + rc);
    return NULL;
}

static long (*applied_now)(void) = cluster_applied;

static void start_all(pid_t *m1, pid_t *m2)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    cr_assert_eq(th_stack_start(&stk, PARTS, cluster_props()), 0);
    atomic_init(&produced, 0);
    cr_assert_eq(pthread_create(&producer, NULL, produce_main, NULL), 0);
    *m1 = th_stack_member(&stk, "m1", NULL);
    *m2 = th_stack_member(&stk, "m2", NULL);
    int waited = 0;
    while (applied_now() < 500 && waited < 90000) {
        usleep(50 * 1000);
        waited += 50;
    }
    cr_assert_geq(applied_now(), 500, "members never got going:\n%s\n%s",
                  th_stack_member_log(&stk, "m1"),
                  th_stack_member_log(&stk, "m2"));
}

/* The producer still runs: what the test did happened mid-stream. */
static void assert_mid_stream(const char *what)
{
    cr_assert_eq(atomic_load(&produced), 0,
                 "the traffic ended before the %s: nothing tested", what);
}

static void end_exact(pid_t m1, pid_t m2)
{
    pthread_join(producer, NULL);
    cr_assert_eq(atomic_load(&produced), 2, "the producer failed");
    long unique = th_stack_expect_unique(&stk);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 180000);
    cr_expect_eq(cluster_applied(), unique);
    cr_expect_gt(sharded_keys("idemproc:ledger:*{test-group:payments:*}"), 0);
    cr_expect_gt(sharded_keys("idemproc:pos{test-group:payments:*}"), 0);
    /* Nothing of the single-Redis layout on the stack's own Redis. */
    cr_expect_eq(th_stack_applied(&stk), 0);
    cr_expect_eq(th_stop(m1, 15000), 0);
    cr_expect_eq(th_stop(m2, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* The plan for redis-cli --cluster reshard, which moves the lowest slots
 * of a source: for each primary, how many of its tags to move (its tags
 * in slot order; moving the m-th costs every slot of that primary up to
 * it), the cheapest plan that moves at least a third of the tags and
 * leaves one primary untouched as the target. */
static void plan_reshard(int *take, int *target)
{
    int slot[PARTS], owner[PARTS], cost[PARTS];
    for (int p = 0; p < PARTS; p++) {
        slot[p] = tag_slot(p);
        cr_assert_geq(slot[p], 0);
        owner[p] = th_cluster_owner(&clu, slot[p]);
        cr_assert_geq(owner[p], 0);
        cost[p] = th_cluster_slots_upto(&clu, owner[p], slot[p]);
        cr_assert_gt(cost[p], 0);
    }
    int best = -1;
    int m[TH_CLUSTER_MAX] = {0};
    /* Every choice of m[i] in 0..tags of i, as a mixed-radix counter. */
    for (;;) {
        int tags = 0, total = 0, free_primary = -1;
        for (int i = 0; i < clu.n; i++) {
            if (!th_cluster_is_primary(&clu, i))
                continue;
            if (m[i] == 0) {
                free_primary = i;
                continue;
            }
            /* The m[i]-th cheapest tag of i and the tags under it. */
            int c = 0, n = 0;
            for (int p = 0; p < PARTS; p++)
                if (owner[p] == i) {
                    int rank = 0;
                    for (int q = 0; q < PARTS; q++)
                        rank += owner[q] == i && cost[q] <= cost[p];
                    if (rank <= m[i] && cost[p] > c)
                        c = cost[p];
                    n += rank <= m[i];
                }
            tags += n;
            total += c;
        }
        if (free_primary >= 0 && tags * 3 >= PARTS &&
            (best < 0 || total < best)) {
            best = total;
            memcpy(take, m, sizeof(m));
            *target = free_primary;
        }
        int i = 0;
        for (; i < clu.n; i++) {
            int have = 0;
            for (int p = 0; p < PARTS; p++)
                have += owner[p] == i;
            if (m[i] < have) {
                m[i]++;
                break;
            }
            m[i] = 0;
        }
        if (i == clu.n)
            break;
    }
    cr_assert_geq(best, 0, "no reshard plan moves a third of the tags");
    /* take[i] becomes the slot count: the cost of its m-th tag. */
    for (int i = 0; i < clu.n; i++) {
        int c = 0;
        for (int p = 0; p < PARTS && take[i]; p++)
            if (owner[p] == i) {
                int rank = 0;
                for (int q = 0; q < PARTS; q++)
                    rank += owner[q] == i && cost[q] <= cost[p];
                if (rank <= take[i] && cost[p] > c)
                    c = cost[p];
            }
        take[i] = c;
    }
}

/* redis-cli --cluster reshard moves, while the members write, slots that
 * hold at least a third of the partitions' tags; checks that exactly those
 * tags' slots moved, to one target. Returns a tag it left in place. */
static int reshard_a_third(int *target_out)
{
    int before[PARTS];
    for (int p = 0; p < PARTS; p++)
        before[p] = th_cluster_owner(&clu, tag_slot(p));
    int take[TH_CLUSTER_MAX] = {0}, target = -1;
    plan_reshard(take, &target);
    for (int i = 0; i < clu.n; i++) {
        if (!take[i])
            continue;
        cr_assert_eq(th_cluster_reshard(&clu, i, target, take[i]), 0);
        cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0);
    }
    int moved_tags = 0, other = -1;
    for (int p = 0; p < PARTS; p++) {
        int now = th_cluster_owner(&clu, tag_slot(p));
        cr_assert_geq(now, 0);
        if (now != before[p]) {
            cr_assert_eq(now, target);
            moved_tags++;
        } else if (other < 0 && now != target) {
            other = p;
        }
    }
    cr_assert_geq(moved_tags * 3, PARTS, "the reshard moved %d tags' slots",
                  moved_tags);
    *target_out = target;
    return other;
}

Test(cluster_run, reshard_a_third_of_the_tags_mid_stream_exact, .timeout = 300)
{
    pid_t m1, m2;
    /* About 10 s: the tool's runs and one slot key by key fit in it. */
    snprintf(traffic_count, sizeof(traffic_count), "20000");
    start_all(&m1, &m2);
    int target = -1;
    int other = reshard_a_third(&target);
    assert_mid_stream("reshard");
    /* Then one more tag's slot key by key, half moved for a while:
     * scripts meet ASK, TRYAGAIN and keys already gone. */
    cr_assert_geq(other, 0);
    int slot = tag_slot(other), from = th_cluster_owner(&clu, slot);
    cr_assert_eq(th_cluster_migrate_begin(&clu, slot, from, target), 0);
    int k, keys = 0;
    while ((k = th_cluster_migrate_keys(&clu, slot, from, target, 1)) > 0) {
        keys += k;
        usleep(100 * 1000);
    }
    cr_assert_geq(k, 0);
    cr_assert_gt(keys, 0, "no key of partition %d's tag was moved", other);
    cr_assert_eq(th_cluster_migrate_end(&clu, slot, from, target), 0);
    cr_assert_eq(th_cluster_owner(&clu, slot), target);
    assert_mid_stream("migration");
    end_exact(m1, m2);
}

Test(cluster_run, primary_killed_replica_promoted_node_back_exact,
     .timeout = 300)
{
    pid_t m1, m2;
    start_all(&m1, &m2);
    int victim = th_cluster_owner(&clu, tag_slot(0));
    cr_assert_geq(victim, 0);
    int replica = th_cluster_replica_of(&clu, victim);
    cr_assert_geq(replica, 0);
    th_cluster_kill(&clu, victim);
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0, "no failover");
    cr_assert_eq(th_cluster_owner(&clu, tag_slot(0)), replica);
    assert_mid_stream("failover");
    cr_assert_eq(th_cluster_restart(&clu, victim), 0);
    cr_assert_eq(th_cluster_wait_ok(&clu, 60000), 0,
                 "the cluster not ok after the node came back as a replica");
    end_exact(m1, m2);
}

/* handler=script: payments applied by the user's Lua effect, sharded by
 * partition in cluster mode (bal:<CURRENCY>{<tag>}, applied{<tag>}). */
static const char payments_lua[] =
    "-- payments as the ledger applies them, written by the user\n"
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

/* Sum over the live primaries of the script's applied{...} shards. */
static long script_applied(void)
{
    long sum = 0;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS applied{*");
        for (char *k = keys ? strtok(keys, "\n") : NULL; k;
             k = strtok(NULL, "\n")) {
            char *v = th_cluster_cmd(&clu, i, "GET %s", k);
            sum += v ? atol(v) : 0;
            free(v);
        }
        free(keys);
    }
    return sum;
}

/* The balances the script left: every bal:<CUR>{<tag>} hash on every
 * live primary, summed per currency and user into a new object
 * {CUR: {user: minor units}}. */
static json_t *script_balances(void)
{
    json_t *all = json_object();
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS bal:*");
        char *save = NULL;
        for (char *k = keys ? strtok_r(keys, "\n", &save) : NULL; k;
             k = strtok_r(NULL, "\n", &save)) {
            char cur[16];
            cr_assert_eq(sscanf(k, "bal:%15[^{]{test-group:payments:", cur), 1,
                         "key %s is not under a partition's tag", k);
            json_t *users = json_object_get(all, cur);
            if (!users) {
                users = json_object();
                json_object_set_new(all, cur, users);
            }
            char *flat = th_cluster_cmd(&clu, i, "HGETALL %s", k);
            char *s2 = NULL;
            for (char *f = flat ? strtok_r(flat, "\n", &s2) : NULL; f;
                 f = strtok_r(NULL, "\n", &s2)) {
                char *v = strtok_r(NULL, "\n", &s2);
                cr_assert(v, "HGETALL %s: odd reply", k);
                json_t *had = json_object_get(users, f);
                json_object_set_new(
                    users, f,
                    json_integer((had ? json_integer_value(had) : 0) +
                                 atoll(v)));
            }
            free(flat);
        }
        free(keys);
    }
    return all;
}

/* The expectation of the script run for verify at path: the ledger
 * `produce` predicted (want's "ledger", borrowed) as the hashes
 * bal:<CURRENCY> the effect writes, its applied counter, and the applied
 * identities counted by their partition marks. */
static void script_expect_write(const char *path, json_t *want, long unique)
{
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
}

/* Runs verify with the expectation at path until it is exact (0) or
 * timeout_ms passed; its last output in *out (caller frees). */
static int script_verify(const char *path, int timeout_ms, char **out)
{
    char *argv[] = {(char *)th_bin(), "verify",     "-c", stk.conf,
                    "--expect",       (char *)path, NULL};
    int rc = -1;
    for (int waited = 0;; waited += 500) {
        char *err = NULL;
        free(*out);
        *out = NULL;
        rc = th_run(argv, out, &err, 60000);
        if (rc != 0 && *out && err) {
            char *both = NULL;
            if (asprintf(&both, "%s%s", *out, err) > 0) {
                free(*out);
                *out = both;
            }
        }
        free(err);
        if (rc == 0 || waited >= timeout_ms)
            return rc;
        usleep(500 * 1000);
    }
}

/* Adds 1 to one user's field of one bal:* shard on its primary (by hand,
 * as a double effect would); the shard and field in shard[64] and
 * field[64], the currency in cur[16]. */
static void shard_bump(char shard[64], char field[64], char cur[16])
{
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS bal:*");
        char *nl = keys ? strchr(keys, '\n') : NULL;
        if (nl)
            *nl = '\0';
        if (!keys || !*keys) {
            free(keys);
            continue;
        }
        snprintf(shard, 64, "%s", keys);
        free(keys);
        char *f = th_cluster_cmd(&clu, i, "HKEYS %s", shard);
        cr_assert(f && *f, "HKEYS %s: empty", shard);
        nl = strchr(f, '\n');
        if (nl)
            *nl = '\0';
        snprintf(field, 64, "%s", f);
        free(f);
        cr_assert_eq(sscanf(shard, "bal:%15[^{]", cur), 1);
        char *r = th_cluster_cmd(&clu, i, "HINCRBY %s %s 1", shard, field);
        cr_assert(r && atol(r) != 0, "HINCRBY %s %s: %s", shard, field, r);
        free(r);
        return;
    }
    cr_assert_fail("no bal:* shard on any primary");
}

Test(cluster_run, script_handler_reshard_and_failover_exact, .timeout = 300)
{
    pid_t m1, m2;
    char file[600];
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&script_dir, "payments.lua", payments_lua));
    handler_props[0] = "handler=script";
    handler_props[1] = file;
    handler_props[2] = "script.fields=/currency,/user_id,/amount";
    handler_props[3] = NULL;
    applied_now = script_applied;
    /* No poison: the expectation's balances are the ledger's rules, which
     * the effect above does not check (3-decimal amounts, ...). */
    snprintf(traffic_poison, sizeof(traffic_poison), "0");
    /* About 20 s: the tool's runs and a failover fit in it, also under
     * the sanitizers on a loaded machine (15 s was once too short). */
    snprintf(traffic_count, sizeof(traffic_count), "40000");
    start_all(&m1, &m2);
    int target = -1;
    reshard_a_third(&target);
    assert_mid_stream("reshard");
    /* Then the primary that owns partition 0's tag now is kill -9'd. */
    int victim = th_cluster_owner(&clu, tag_slot(0));
    cr_assert_geq(victim, 0);
    int replica = th_cluster_replica_of(&clu, victim);
    cr_assert_geq(replica, 0);
    th_cluster_kill(&clu, victim);
    assert_mid_stream("failover");
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0, "no failover");
    cr_assert_eq(th_cluster_owner(&clu, tag_slot(0)), replica);
    cr_assert_eq(th_cluster_restart(&clu, victim), 0);
    cr_assert_eq(th_cluster_wait_ok(&clu, 60000), 0,
                 "the cluster not ok after the node came back as a replica");
    pthread_join(producer, NULL);
    cr_assert_eq(atomic_load(&produced), 2, "the producer failed");
    long unique = th_stack_expect_unique(&stk);
    for (int waited = 0; script_applied() < unique && waited < 180000;
         waited += 200)
        usleep(200 * 1000);
    /* Exact: the applied count and every balance, none extra. */
    cr_expect_eq(script_applied(), unique, "applied %ld of %ld\n%s\n%s",
                 script_applied(), unique, th_stack_member_log(&stk, "m1"),
                 th_stack_member_log(&stk, "m2"));
    json_error_t jerr;
    json_t *want = json_load_file(stk.expect, 0, &jerr);
    cr_assert(want, "%s: %s", stk.expect, jerr.text);
    json_t *ledger = json_object_get(want, "ledger");
    cr_assert(json_is_object(ledger) && json_object_size(ledger) > 0);
    json_t *got = script_balances();
    const char *cur, *user;
    json_t *users, *v;
    size_t wrong = 0, checked = 0;
    json_object_foreach(ledger, cur, users)
    {
        json_object_foreach(users, user, v)
        {
            json_t *g = json_object_get(json_object_get(got, cur), user);
            checked++;
            if (!g || json_integer_value(g) != json_integer_value(v)) {
                if (wrong++ < 5)
                    cr_log_error("balance %s %s: got %lld, expected %lld", cur,
                                 user, g ? (long long)json_integer_value(g) : 0,
                                 (long long)json_integer_value(v));
            }
        }
    }
    json_object_foreach(got, cur, users)
    {
        json_object_foreach(users, user, v)
        {
            if (!json_object_get(json_object_get(ledger, cur), user)) {
                wrong++;
                cr_log_error("balance %s %s: %lld, not expected", cur, user,
                             (long long)json_integer_value(v));
            }
        }
    }
    cr_expect_eq(wrong, 0, "%zu of %zu balances wrong", wrong, checked);
    cr_expect_gt(checked, 50);
    json_decref(got);
    /* verify reads the same state its own way (the shards of every
     * primary added up, the applied identities by their partition marks)
     * and agrees with the sum above. */
    char vpath[600], *vout = NULL;
    snprintf(vpath, sizeof(vpath), "%s/script-expect.json", stk.dir);
    script_expect_write(vpath, want, unique);
    cr_expect_eq(script_verify(vpath, 30000, &vout), 0, "verify:\n%s", vout);
    char line[128];
    snprintf(line, sizeof(line), "verify: marks exact (%ld identities applied",
             unique);
    cr_expect(vout && strstr(vout, line), "want %s in:\n%s", line, vout);
    cr_expect(vout && strstr(vout, "verify: redis exact ("), "%s", vout);
    /* One shard changed by hand: verify names the value and the sum. */
    char shard[64], field[64], bumped[16];
    shard_bump(shard, field, bumped);
    cr_expect_eq(script_verify(vpath, 0, &vout), 1, "verify:\n%s", vout);
    snprintf(line, sizeof(line), "redis bal:%s %s: expected ", bumped, field);
    cr_expect(vout && strstr(vout, line) && strstr(vout, "off by 1)"),
              "want %s... off by 1) in:\n%s", line, vout);
    cr_expect(vout && strstr(vout, "verify: MISMATCH (1 differences)"), "%s",
              vout);
    free(vout);
    /* state get script reads the same sum, the bump included. */
    char key[80];
    snprintf(key, sizeof(key), "bal:%s", bumped);
    char *sargv[] = {
        (char *)th_bin(), "state", "get", "script", key, field, "-c",
        stk.conf,         NULL};
    char *sout = NULL, *serr = NULL;
    cr_expect_eq(th_run(sargv, &sout, &serr, 60000), 0, "%s", serr);
    json_t *wv = json_object_get(
        json_object_get(json_object_get(want, "ledger"), bumped), field);
    cr_assert(wv, "%s %s not in the expectation", bumped, field);
    snprintf(line, sizeof(line), "script bal:%s %s: %lld (the sum of ", bumped,
             field, (long long)json_integer_value(wv) + 1);
    cr_expect(sout && strstr(sout, line), "want %s in: %s", line, sout);
    free(sout);
    free(serr);
    json_decref(want);
    /* Nothing of the single-Redis names: only shards under the tags. */
    cr_expect_eq(sharded_keys("bal:EUR"), 0);
    cr_expect_gt(sharded_keys("idemproc:pos{test-group:payments:*}"), 0);
    cr_expect_eq(th_stop(m1, 15000), 0);
    cr_expect_eq(th_stop(m2, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}
