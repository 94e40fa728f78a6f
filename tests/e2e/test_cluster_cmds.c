/* test_cluster_cmds: the commands in Redis Cluster mode
 * (redis.cluster.nodes) on a real cluster started by the tests:
 * check-config --connect checks every primary and names the one that is
 * down; offsets show and layout show read the cluster, offsets reset
 * writes each partition's position on its node, layout set is
 * refused; state get sums a balance's shards (compared with the shards
 * read with redis-cli-like commands on every primary); a live node that
 * answers CLUSTERDOWN makes /readyz say the cluster is down, naming it. */
#include "harness.h"
#include "harness_cluster.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs them. */
static th_stack_t stk;
static th_cluster_t clu;

static void cmds_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
}

TestSuite(cluster_cmds, .fini = cmds_fini);

static char nodes_prop[512];

static const char *const *cluster_props(void)
{
    snprintf(nodes_prop, sizeof(nodes_prop), "redis.cluster.nodes=%s",
             clu.seeds);
    static const char *props[8];
    props[0] = "dedup.scope=partition";
    props[1] = "handler=ledger";
    props[2] = "batch.max.messages=50";
    props[3] = nodes_prop;
    props[4] = NULL;
    return props;
}

/* Runs `idemproc <args...> -c <conf>` (args NULL-terminated, the -c last).
 * Returns the exit code; *out and *err get the output (caller frees). */
static int idem(const char *const args[], char **out, char **err)
{
    char *argv[32] = {(char *)th_bin()};
    int n = 1;
    for (int i = 0; args[i] && n < 29; i++)
        argv[n++] = (char *)args[i];
    argv[n++] = "-c";
    argv[n++] = stk.conf;
    argv[n] = NULL;
    return th_run(argv, out, err, 120000);
}

/* Lines of `text` that contain both a and b. */
static int lines_with(const char *text, const char *a, const char *b)
{
    int count = 0;
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, len);
        count += strstr(line, a) && (!b || strstr(line, b));
        free(line);
        p = nl ? nl + 1 : NULL;
    }
    return count;
}

/* A user's EUR balance read from the shards themselves: every key
 * idemproc:ledger:EUR{...} on every primary, the field summed. *shards
 * gets the hashes that hold it. */
static long long shard_sum(const char *user, int *shards)
{
    long long sum = 0;
    *shards = 0;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS idemproc:ledger:EUR{*");
        for (char *k = keys ? strtok(keys, "\n") : NULL; k;
             k = strtok(NULL, "\n")) {
            char *v = th_cluster_cmd(&clu, i, "HGET %s %s", k, user);
            if (v && *v) {
                sum += strtoll(v, NULL, 10);
                (*shards)++;
            }
            free(v);
        }
        free(keys);
    }
    return sum;
}

/* Up to max users of the EUR shards on node i (the fields of its first
 * shard). */
static int some_users(char users[][32], int max)
{
    int n = 0;
    for (int i = 0; i < clu.n && !n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS idemproc:ledger:EUR{*");
        char *nl = keys ? strchr(keys, '\n') : NULL;
        if (nl)
            *nl = '\0';
        char *all =
            keys && *keys ? th_cluster_cmd(&clu, i, "HGETALL %s", keys) : NULL;
        int field = 1;
        for (char *f = all ? strtok(all, "\n") : NULL; f && n < max;
             f = strtok(NULL, "\n"), field = !field)
            if (field)
                snprintf(users[n++], 32, "%s", f);
        free(all);
        free(keys);
    }
    return n;
}

Test(cluster_cmds, check_config_offsets_layout_state_get_on_a_cluster,
     .timeout = 300)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    cr_assert_eq(th_stack_start(&stk, 9, cluster_props()), 0);
    char *out = NULL, *err = NULL;

    /* check-config --connect: every seed reached, every primary ok. */
    const char *check[] = {"check-config", "--connect", NULL};
    int rc = idem(check, &out, &err);
    cr_expect_eq(rc, 0, "check-config --connect: %d\n%s\n%s", rc, out, err);
    cr_expect_eq(lines_with(out, "redis cluster: seed", ": reached"), 6, "%s",
                 out);
    cr_expect_eq(lines_with(out, "redis cluster: primary", ": ok ("), 3, "%s",
                 out);
    cr_expect_eq(lines_with(out, "all 16384 slots covered by 3 primaries",
                            "every one ok"),
                 1, "%s", out);
    free(out);
    free(err);

    /* Traffic through a member; then the commands read what it left. */
    const char *traffic[] = {"--count", "3000", "--duplicates", "0.1", "--seed",
                             "25",      NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    th_stack_wait_committed(&stk, "payments", 9, 60000);

    /* state get equals the sum of the shards on every primary. */
    char users[3][32];
    int nu = some_users(users, 3);
    cr_assert_gt(nu, 0, "no EUR shard on any primary");
    int summed = 0;
    for (int u = 0; u < nu; u++) {
        int shards;
        long long want = shard_sum(users[u], &shards);
        summed += shards > 1;
        const char *get[] = {"state",  "get",    "ledger", "EUR",
                             users[u], "--json", NULL};
        rc = idem(get, &out, &err);
        cr_assert_eq(rc, 0, "state get: %s", err);
        json_error_t je;
        json_t *doc = json_loads(out, 0, &je);
        cr_assert(doc, "state get --json: %s\n%s", je.text, out);
        cr_expect_eq(json_integer_value(json_object_get(doc, "minor")), want,
                     "%s: %s against %lld over %d shards", users[u], out, want,
                     shards);
        cr_expect_eq(json_integer_value(json_object_get(doc, "shards")),
                     shards);
        cr_expect(json_is_true(json_object_get(doc, "cluster")));
        json_decref(doc);
        free(out);
        free(err);
    }
    cr_expect_gt(summed, 0, "no user had more than one shard: no sum tested");

    /* offsets show: Redis's positions come from each partition's node. */
    const char *offs[] = {"offsets", "show", "--json", NULL};
    rc = idem(offs, &out, &err);
    cr_assert_eq(rc, 0, "offsets show: %s", err);
    json_error_t je;
    json_t *doc = json_loads(out, 0, &je);
    cr_assert(doc, "offsets show --json: %s\n%s", je.text, out);
    json_t *parts = json_object_get(doc, "partitions");
    cr_assert_eq(json_array_size(parts), 9, "%s", out);
    for (size_t i = 0; i < json_array_size(parts); i++) {
        json_t *redis = json_object_get(json_array_get(parts, i), "redis");
        cr_expect(json_is_object(redis), "partition %zu: no redis position: %s",
                  i, out);
    }
    cr_expect_eq(json_integer_value(
                     json_object_get(json_object_get(doc, "total"), "lag")),
                 0, "%s", out);
    json_decref(doc);
    free(out);
    free(err);

    /* layout show: partition, the live member with its fingerprint. */
    const char *show[] = {"layout", "show", NULL};
    rc = idem(show, &out, &err);
    cr_expect_eq(rc, 0, "layout show: %s", err);
    cr_expect(strstr(out, "layout partition"), "%s", out);
    cr_expect(strstr(out, "1 live member"), "%s", out);
    cr_expect(strstr(out, "m1 supports global,partition, wants partition"),
              "%s", out);
    free(out);
    free(err);
    const char *set[] = {"layout", "set", "global", NULL};
    rc = idem(set, &out, &err);
    cr_expect_eq(rc, 1, "layout set: %d %s", rc, out);
    cr_expect(strstr(err, "refused in cluster mode"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);

    /* offsets reset writes each partition's position on its own node: the
     * key pos{group:topic:partition} holds offset 0 after a rewind. */
    const char *reset[] = {"offsets", "reset", "--to-earliest", "--execute",
                           NULL};
    rc = idem(reset, &out, &err);
    cr_expect_eq(rc, 0, "offsets reset: %s\n%s", out, err);
    free(out);
    free(err);
    for (int p = 0; p < 9; p++) {
        char key[96];
        snprintf(key, sizeof(key), "idemproc:pos{test-group:payments:%d}", p);
        char *slot = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT %s", key);
        int owner = th_cluster_owner(&clu, slot ? atoi(slot) : -1);
        free(slot);
        cr_assert_geq(owner, 0);
        char *v = th_cluster_cmd(&clu, owner, "HGET %s payments:%d", key, p);
        cr_expect(v && !strncmp(v, "0 ", 2), "%s on its node: %s", key,
                  v ? v : "(no reply)");
        free(v);
    }

    /* A primary and its replica down: check-config fails naming it. */
    int victim = th_cluster_owner(&clu, 0);
    cr_assert_geq(victim, 0);
    int replica = th_cluster_replica_of(&clu, victim);
    cr_assert_geq(replica, 0);
    th_cluster_kill(&clu, replica);
    th_cluster_kill(&clu, victim);
    char node[64];
    snprintf(node, sizeof(node), "primary 127.0.0.1:%d", clu.node[victim].port);
    rc = idem(check, &out, &err);
    cr_expect_eq(rc, 1, "check-config --connect: %d\n%s\n%s", rc, out, err);
    cr_expect_eq(lines_with(out, node, "FAILED"), 1, "%s", out);
    cr_expect(strstr(err, node), "stderr does not name %s: %s", node, err);
    cr_expect_eq(lines_with(out, "redis cluster: seed", "not reached"), 2, "%s",
                 out);
    free(out);
    free(err);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* The slot of `key` as the cluster computes it. */
static int key_slot(const char *key)
{
    char *out = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT %s", key);
    int slot = out ? atoi(out) : -1;
    free(out);
    cr_assert_geq(slot, 0, "CLUSTER KEYSLOT %s", key);
    return slot;
}

/* A member whose every key is on node 0, and node 2 (no replica) killed:
 * node 0 lives but answers CLUSTERDOWN (its cluster_state is fail), and
 * /readyz says the cluster is down naming node 0, not a node the member
 * never talks to; so does `state get script`, whose scan reads node 0
 * first. With both back, the ledger ends exact. */
Test(cluster_cmds, clusterdown_from_a_live_node_names_it_in_readiness,
     .timeout = 300)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    /* Every key a one-partition member uses, moved to node 0 while the
     * slots are empty. */
    const char *keys[] = {"{test-group:payments:0}", "{test-group}",
                          "{test-group:payments}", "idemproc:layout:test-group",
                          "idemproc:dedupkey:test-group"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        int slot = key_slot(keys[i]);
        int from = th_cluster_owner(&clu, slot);
        cr_assert_geq(from, 0);
        if (from == 0)
            continue;
        cr_assert_eq(th_cluster_migrate_begin(&clu, slot, from, 0), 0);
        cr_assert_eq(th_cluster_migrate_end(&clu, slot, from, 0), 0);
    }
    /* And slot 0, so node 0 is the first primary a scan reads. */
    int from0 = th_cluster_owner(&clu, 0);
    cr_assert_geq(from0, 0);
    if (from0 != 0) {
        cr_assert_eq(th_cluster_migrate_begin(&clu, 0, from0, 0), 0);
        cr_assert_eq(th_cluster_migrate_end(&clu, 0, from0, 0), 0);
    }
    cr_assert_eq(th_cluster_wait_ok(&clu, 60000), 0, "cluster not ok");
    cr_assert_eq(th_stack_start(&stk, 1, cluster_props()), 0);
    char listen[64];
    int port = th_free_port();
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *const sets[] = {listen, NULL};
    pid_t m1 = th_stack_member_started(&stk, "m1", sets);
    /* Ready first: assigned, its partition's state loaded from node 0. */
    int ready = 0;
    for (int w = 0; w < 60000 && !ready; w += 100) {
        char *b = NULL;
        ready = th_http_get(port, "/readyz", &b) == 200;
        free(b);
        if (!ready)
            usleep(100 * 1000);
    }
    cr_assert(ready, "m1 never ready:\n%s", th_stack_member_log(&stk, "m1"));

    /* A script effect's shard on node 0 (partition 0's tag), for state
     * get below. */
    char *hs =
        th_cluster_cmd(&clu, 0, "HSET shop:x{test-group:payments:0} f 5");
    cr_assert_str_eq(hs ? hs : "", "1");
    free(hs);
    th_cluster_kill(&clu, 2);
    int down = 0;
    for (int w = 0; w < 30000 && !down; w += 100) {
        down = !strcmp(th_cluster_state(&clu, 0), "fail");
        if (!down)
            usleep(100 * 1000);
    }
    cr_assert(down, "node 0 never saw the cluster down");
    /* Traffic while it is down: the member's chunks go to node 0. */
    const char *traffic[] = {"--count", "300", "--seed", "28", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    char want[128];
    snprintf(want, sizeof(want),
             "the cluster is down: the live node 127.0.0.1:%d answers "
             "CLUSTERDOWN",
             clu.node[0].port);
    char *body = NULL;
    int st = th_wait_unready(port, want, 60000, &body);
    cr_expect_eq(st, 503, "readyz: %d %s", st, body ? body : "");
    cr_expect(body && strstr(body, want), "readyz: %s\n(wanted: %s)",
              body ? body : "", want);
    free(body);
    /* state get script scans every primary for a key's shards: node 0,
     * the first (alive), holds one and answers its HGET CLUSTERDOWN; the
     * error says the cluster is down, naming node 0. */
    const char *sget[] = {"state", "get", "script", "shop:x", "f", NULL};
    char *sout = NULL, *serr = NULL;
    int src = idem(sget, &sout, &serr);
    cr_expect_eq(src, 1, "state get while the cluster is down: %d\n%s\n%s", src,
                 sout, serr);
    cr_expect(serr && strstr(serr, want), "state get: %s\n(wanted: %s)",
              serr ? serr : "", want);
    free(sout);
    free(serr);

    cr_assert_eq(th_cluster_restart(&clu, 2), 0);
    cr_assert_eq(th_cluster_wait_ok(&clu, 60000), 0, "cluster not ok");
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    cr_expect_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}
