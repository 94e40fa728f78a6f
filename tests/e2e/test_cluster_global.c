/* test_cluster_global: the global path of the ledger and the script handler
 * in Redis Cluster mode (docs/design.md, "Redis Cluster mode", "The global
 * path"), on a real cluster of 3 primaries and 3 replicas: records without
 * a key, spread over the partitions and sent again to other partitions,
 * are applied once, their marks and balances sharded by bucket, `verify`
 * exact (and a MISMATCH once a bucket's mark is deleted by hand); a dead
 * letter replayed after the fix is applied once and a second replay is a
 * duplicate; the script handler's keyless records likewise. */
#include "harness.h"
#include "harness_cluster.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs them. */
static th_stack_t stk;
static th_cluster_t clu;
static char *script_dir;

static void global_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
    if (script_dir)
        th_rmrf(script_dir);
    free(script_dir);
    script_dir = NULL;
}

TestSuite(cluster_global, .fini = global_fini);

#define PARTS 6

static char nodes_prop[512];

/* The stack's properties in cluster mode, handler lines in more[]. */
static void start_stack(const char *const more[])
{
    snprintf(nodes_prop, sizeof(nodes_prop), "redis.cluster.nodes=%s",
             clu.seeds);
    const char *props[12];
    int n = 0;
    props[n++] = "dedup.scope=partition";
    props[n++] = "batch.max.messages=50";
    props[n++] = nodes_prop;
    for (int i = 0; more && more[i]; i++)
        props[n++] = more[i];
    props[n] = NULL;
    cr_assert_eq(th_stack_start(&stk, PARTS, props), 0);
}

/* Keys matching pattern over the cluster's primaries. */
static long cluster_keys(const char *pattern)
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

/* The primary that holds key (asked on each primary), or -1. */
static int key_node(const char *key)
{
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *v = th_cluster_cmd(&clu, i, "EXISTS %s", key);
        int here = v && !strcmp(v, "1");
        free(v);
        if (here)
            return i;
    }
    return -1;
}

/* A payment's value: identity pay-<id>, message id <mid>. */
static int payment_json(char *buf, size_t size, const char *id, int mid,
                        const char *user, int cents)
{
    return snprintf(buf, size,
                    "{\"message_id\":\"00000000-0000-4000-8000-%012d\","
                    "\"idempotency_key\":\"pay-%s\",\"order_id\":\"%s\","
                    "\"user_id\":\"%s\",\"amount\":%d.%02d,"
                    "\"currency\":\"EUR\"}",
                    mid, id, id, user, cents / 100, cents % 100);
}

/* Sends one payment to partition `part` (RD_KAFKA_PARTITION_UA: by key),
 * without a key when key is NULL. */
static void send_payment(rd_kafka_t *rk, int part, const char *key,
                         const char *id, int mid, const char *user, int cents)
{
    char v[512];
    int len = payment_json(v, sizeof(v), id, mid, user, cents);
    cr_assert_eq(rd_kafka_producev(
                     rk, RD_KAFKA_V_TOPIC("payments"),
                     RD_KAFKA_V_PARTITION(part),
                     RD_KAFKA_V_KEY((void *)key, key ? strlen(key) : 0),
                     RD_KAFKA_V_VALUE(v, (size_t)len),
                     RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
                 0);
}

/* The expectation verify reads: identities applied and the ledger. */
typedef struct {
    json_t *ids;    /* array of identities */
    json_t *ledger; /* user -> cents */
    long earlier;   /* applied before ids (their marks expired) */
} expect_t;

static void expect_add(expect_t *e, const char *id, const char *user, int cents)
{
    char ident[64];
    snprintf(ident, sizeof(ident), "pay-%s", id);
    json_array_append_new(e->ids, json_string(ident));
    json_int_t had = json_integer_value(json_object_get(e->ledger, user));
    json_object_set_new(e->ledger, user, json_integer(had + cents));
}

static void expect_write(expect_t *e)
{
    json_t *o =
        json_pack("{s:I, s:O, s:{s:O}}", "applied",
                  (json_int_t)(e->earlier + (long)json_array_size(e->ids)),
                  "identities", e->ids, "ledger", "EUR", e->ledger);
    cr_assert_eq(json_dump_file(o, stk.expect, JSON_COMPACT), 0);
    json_decref(o);
}

/* `idemproc <cmd> <sub> <args...> -c <conf>`; its exit code. */
static int cli(const char *cmd, const char *sub, const char *const args[],
               char **out, char **err)
{
    char *argv[24];
    int n = 0;
    argv[n++] = (char *)th_bin();
    argv[n++] = (char *)cmd;
    if (sub)
        argv[n++] = (char *)sub;
    for (int i = 0; args && args[i] && n < 21; i++)
        argv[n++] = (char *)args[i];
    argv[n++] = "-c";
    argv[n++] = stk.conf;
    argv[n] = NULL;
    return th_run(argv, out, err, 120000);
}

/* a. Keyless payments spread over the partitions, each sent again without
 * a key to another partition (half redeliveries, half resends), with keyed
 * traffic and its duplicates beside them, two members: every identity
 * applied once, the keyless ones marked in the buckets, their balances in
 * the buckets' shards, verify exact; then one bucket mark deleted by hand
 * and verify says MISMATCH naming it. */
Test(cluster_global, keyless_records_applied_once, .timeout = 360)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    const char *more[] = {"handler=ledger", NULL};
    start_stack(more);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    pid_t m2 = th_stack_member_started(&stk, "m2", NULL);
    expect_t e = {json_array(), json_object(), 0};
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    const int keyless = 300, copies = 100, keyed = 200, keyed_dups = 40;
    for (int i = 0; i < keyless; i++) {
        char id[32], user[32];
        snprintf(id, sizeof(id), "k-%d", i);
        snprintf(user, sizeof(user), "user-%d", i % 20);
        send_payment(rk, i % PARTS, NULL, id, i, user, 100 + i);
        expect_add(&e, id, user, 100 + i);
    }
    for (int i = 0; i < keyed; i++) {
        char id[32], user[32];
        snprintf(id, sizeof(id), "o-%d", i);
        snprintf(user, sizeof(user), "user-%d", i % 20);
        send_payment(rk, RD_KAFKA_PARTITION_UA, id, id, 10000 + i, user,
                     50 + i);
        expect_add(&e, id, user, 50 + i);
    }
    /* Copies: keyless to another partition than the first (even: the
     * same message id, a redelivery; odd: a new one, a resend); keyed
     * with their key (the same partition). */
    for (int i = 0; i < copies; i++) {
        char id[32], user[32];
        snprintf(id, sizeof(id), "k-%d", i);
        snprintf(user, sizeof(user), "user-%d", i % 20);
        send_payment(rk, (i + 1) % PARTS, NULL, id, i % 2 ? 50000 + i : i, user,
                     100 + i);
    }
    for (int i = 0; i < keyed_dups; i++) {
        char id[32], user[32];
        snprintf(id, sizeof(id), "o-%d", i);
        snprintf(user, sizeof(user), "user-%d", i % 20);
        send_payment(rk, RD_KAFKA_PARTITION_UA, id, id, 10000 + i, user,
                     50 + i);
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    rd_kafka_destroy(rk);
    expect_write(&e);

    TH_ASSERT_VERIFIED(&stk, 0, NULL, 180000);
    th_stack_wait_committed(&stk, "payments", PARTS, 60000);
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 0,
                 "a record was dead-lettered");
    cr_expect_eq(cluster_keys("idemproc:dedup{test-group::*}:*"), keyless,
                 "one bucket mark per keyless identity");
    cr_expect_gt(cluster_keys("idemproc:ledger:EUR{test-group::*}"), 0,
                 "no balance shard under a bucket's tag");
    cr_expect_gt(cluster_keys("idemproc:ledger:EUR{test-group:payments:*}"), 0,
                 "no balance shard under a partition's tag");
    cr_expect_gt(cluster_keys("idemproc:gpos{test-group::*}"), 0,
                 "no bucket positions");
    /* The buckets' marks are on more than one primary. */
    int on[TH_CLUSTER_MAX] = {0}, nodes = 0;
    for (int b = 0; b < 64; b++) {
        char key[64];
        snprintf(key, sizeof(key), "idemproc:gpos{test-group::%02d}", b);
        int nd = key_node(key);
        if (nd >= 0 && !on[nd]++)
            nodes++;
    }
    cr_expect_geq(nodes, 2, "the buckets' state is on one primary only");
    /* state get sums the shards, the buckets' included. */
    char *out = NULL, *err = NULL;
    const char *get[] = {"ledger", "EUR", "user-3", NULL};
    cr_assert_eq(cli("state", "get", get, &out, &err), 0, "%s", err);
    json_int_t want = json_integer_value(json_object_get(e.ledger, "user-3"));
    char line[128];
    snprintf(line, sizeof(line), "ledger EUR user-3: %lld", (long long)want);
    cr_expect(strstr(out, line), "%s (want %s)", out, line);
    free(out);
    free(err);
    cr_expect_eq(th_stop(m1, 15000), 0);
    cr_expect_eq(th_stop(m2, 15000), 0);

    /* A bucket mark deleted by hand: verify names the identity. */
    char key[128];
    int b = -1;
    for (int i = 0; i < clu.n && b < 0; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *k = th_cluster_cmd(&clu, i, "KEYS idemproc:dedup{*}:pay-k-7");
        if (k && *k) {
            snprintf(key, sizeof(key), "%s", k);
            char *d = th_cluster_cmd(&clu, i, "DEL %s", key);
            b = d && !strcmp(d, "1") ? i : -1;
            free(d);
        }
        free(k);
    }
    cr_assert_geq(b, 0, "no bucket mark of pay-k-7");
    out = NULL;
    cr_expect_neq(th_stack_verify(&stk, 0, NULL, &out), 0, "%s", out);
    cr_expect(out && strstr(out, "pay-k-7"), "%s", out);
    free(out);
    json_decref(e.ids);
    json_decref(e.ledger);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* The slot of a key, as the cluster computes it. */
static int key_slot(const char *key)
{
    for (int i = 0; i < clu.n; i++) {
        if (!clu.node[i].pid)
            continue; /* killed */
        char *out = th_cluster_cmd(&clu, i, "CLUSTER KEYSLOT %s", key);
        int slot = out ? atoi(out) : -1;
        free(out);
        if (slot >= 0)
            return slot;
    }
    cr_assert_fail("no node computed the slot of %s", key);
    return -1;
}

/* The global bucket of an identity: CRC16 modulo 64, which is the slot of
 * the identity taken as a key without braces, modulo 64 (16384 is a
 * multiple of 64). */
static int identity_bucket(const char *identity)
{
    return key_slot(identity) % 64;
}

/* Sends `n` keyless payments pay-<tag>-<i> of bucket `bucket` to
 * partition 0, with a keyed one (to partition 0) after each, adding them
 * to e; *next is the running number of identities tried. */
static void send_bucket_phase(rd_kafka_t *rk, expect_t *e, const char *tag,
                              int bucket, int n, int *next)
{
    for (int sent = 0; sent < n; (*next)++) {
        char id[48], ident[64], user[32];
        snprintf(id, sizeof(id), "%s-%d", tag, *next);
        snprintf(ident, sizeof(ident), "pay-%s", id);
        if (identity_bucket(ident) != bucket)
            continue;
        snprintf(user, sizeof(user), "user-%d", *next % 7);
        send_payment(rk, 0, NULL, id, 100000 + *next, user, 100 + sent);
        expect_add(e, id, user, 100 + sent);
        snprintf(id, sizeof(id), "%s-keyed-%d", tag, *next);
        send_payment(rk, 0, id, id, 200000 + *next, user, 7);
        expect_add(e, id, user, 7);
        sent++;
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
}

/* Partition 0's primary *a and a bucket whose gpos hash is on another
 * primary *b with a replica *r: the bucket. */
static int pick_bucket(int *a, int *b, int *r)
{
    *a = th_cluster_owner(&clu, key_slot("idemproc:pos{test-group:"
                                         "payments:0}"));
    cr_assert_geq(*a, 0);
    int bucket = -1;
    for (int t = 0; t < 64 && bucket < 0; t++) {
        char key[64];
        snprintf(key, sizeof(key), "idemproc:gpos{test-group::%02d}", t);
        int o = th_cluster_owner(&clu, key_slot(key));
        if (o >= 0 && o != *a && th_cluster_replica_of(&clu, o) >= 0) {
            bucket = t;
            *b = o;
        }
    }
    cr_assert_geq(bucket, 0, "no bucket on another primary");
    *r = th_cluster_replica_of(&clu, *b);
    return bucket;
}

/* B's replica r stops replicating: stopped (SIGSTOP), its link closed by
 * B (what B sent before would still sit in the stopped replica's socket),
 * so what follows is on B alone. */
static void replica_detach(int b, int r)
{
    cr_assert_eq(kill(clu.node[r].pid, SIGSTOP), 0);
    char *killed = th_cluster_cmd(&clu, b, "CLIENT KILL TYPE replica");
    cr_assert(killed && atoi(killed) >= 1, "replica link: %s", killed);
    free(killed);
}

/* B (the bucket's primary) dies; its replica r, without the writes since
 * replica_detach, takes over; asserts it lacks what partition 0's hash on
 * A recorded of the bucket (else nothing was lost, nothing tested). */
static void takeover(int a, int b, int r, int bucket)
{
    /* B dies; its replica, without the last writes, takes over. */
    th_cluster_kill(&clu, b);
    cr_assert_eq(kill(clu.node[r].pid, SIGCONT), 0);
    char *out = NULL;
    for (int i = 0; i < 50; i++) {
        free(out);
        out = th_cluster_cmd(&clu, r, "CLUSTER FAILOVER TAKEOVER");
        if (out && !strncmp(out, "OK", 2))
            break;
        usleep(200 * 1000);
    }
    cr_assert(out && !strncmp(out, "OK", 2), "takeover: %s", out);
    free(out);
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0);
    /* The promoted replica lacks the second phase's writes. */
    char gkey[64];
    snprintf(gkey, sizeof(gkey), "idemproc:gpos{test-group::%02d}", bucket);
    char *kept = th_cluster_cmd(&clu, r, "HGET %s payments:0", gkey);
    char *rec = th_cluster_cmd(&clu, a,
                               "HGET idemproc:pos{test-group:"
                               "payments:0} payments:0:g%02d",
                               bucket);
    cr_assert(kept && rec && atol(kept) < atol(rec),
              "the replica kept every write (bucket last %s, recorded %s): "
              "nothing was lost, nothing tested",
              kept ? kept : "-", rec ? rec : "-");
    free(kept);
    free(rec);
}

/* c. The lost tail of a bucket's node: partition 0's position lives on
 * primary A, the keyless records' bucket on primary B != A. B's replica is
 * stopped (SIGSTOP), records are applied (B acknowledges them, A's
 * position passes them and records what B acknowledged), B is killed and
 * its replica, which never got those writes, takes over (CLUSTER FAILOVER
 * TAKEOVER). The member must find the bucket behind what partition 0
 * recorded, rewind the partition to the bucket's last kept call and apply
 * the lost records again: verify exact, the loss logged and counted. */
Test(cluster_global, bucket_node_lost_tail_rewinds, .timeout = 360)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    const char *more[] = {"handler=ledger", "http.listen=127.0.0.1:0", NULL};
    start_stack(more);
    int a, b, r, bucket = pick_bucket(&a, &b, &r);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    expect_t e = {json_array(), json_object(), 0};
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    int next = 0;
    send_bucket_phase(rk, &e, "c1", bucket, 20, &next);
    expect_write(&e);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    th_stack_wait_committed(&stk, "payments", 1, 60000);

    replica_detach(b, r);
    cr_log_info("phase 1 applied; bucket %d on node %d, partition 0 on %d",
                bucket, b, a);
    send_bucket_phase(rk, &e, "c2", bucket, 20, &next);
    expect_write(&e);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    th_stack_wait_committed(&stk, "payments", 1, 60000);

    cr_log_info("phase 2 applied on B alone");
    takeover(a, b, r, bucket);
    cr_log_info("replica %d took over", r);
    /* More traffic: the member meets the promoted replica. */
    send_bucket_phase(rk, &e, "c3", bucket, 10, &next);
    rd_kafka_destroy(rk);
    expect_write(&e);
    char *vout = NULL;
    int vrc = th_stack_wait_verified(&stk, 0, NULL, 120000, &vout);
    if (vrc) {
        char *log = th_stack_member_log(&stk, "m1");
        cr_assert_eq(vrc, 0, "verify never exact:\n%s\nmember:\n%s", vout, log);
        free(log);
    }
    free(vout);
    cr_expect_geq(th_stack_log_count(&stk, "m1", "a global bucket's node"), 1,
                  "the loss was not logged:\n%s",
                  th_stack_member_log(&stk, "m1"));
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 0);
    cr_expect_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    json_decref(e.ids);
    json_decref(e.ledger);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* Partition 0's window keys of marks on its primary a. */
static long window_keys(int a)
{
    char *out = th_cluster_cmd(&clu, a, "EVAL %s 0 %s",
                               "return #redis.call('KEYS', ARGV[1])",
                               "idemproc:st{test-group:payments:0}:w*");
    cr_assert(out && out[0] >= '0' && out[0] <= '9', "KEYS: %s", out);
    long n = atol(out);
    free(out);
    return n;
}

/* Waits until partition 0's window keys of marks expired on its primary
 * a (dedup.ttl.seconds and a window after the last keyed record). */
static void wait_marks_expired(int a)
{
    cr_assert_gt(window_keys(a), 0, "no marks to expire");
    for (int i = 0; i < 600; i++) {
        if (window_keys(a) == 0)
            return;
        usleep(200 * 1000);
    }
    cr_assert_fail("partition 0's marks never expired");
}

/* Waits until the bucket's `at` for partition 0 (on its primary b) has
 * reached partition 0's position (on its primary a): the member touched
 * the bucket after its last records. Fails naming both when it does not
 * within 60 s (a touch is due every 10 s while the prefix moves). */
static void wait_touched(int a, int b, int bucket)
{
    char gkey[64];
    snprintf(gkey, sizeof(gkey), "idemproc:gpos{test-group::%02d}", bucket);
    long pos = -1, at = -1;
    for (int i = 0; i < 300; i++) {
        char *p =
            th_cluster_cmd(&clu, a, "HGET %s %s",
                           "idemproc:pos{test-group:payments:0}", "payments:0");
        char *t = th_cluster_cmd(&clu, b, "HGET %s %s", gkey, "payments:0:at");
        pos = p && *p >= '0' && *p <= '9' ? atol(p) : -1;
        at = t && *t >= '0' && *t <= '9' ? atol(t) : -1;
        free(p);
        free(t);
        if (pos >= 0 && at >= pos)
            return;
        usleep(200 * 1000);
    }
    cr_assert_fail("the bucket %d was never touched up to partition 0's "
                   "position: at %ld, position %ld",
                   bucket, at, pos);
}

/* g. The touch: partition 0 used the bucket once, long ago (its call older
 * than dedup.ttl.seconds=20), then only keyed records whose marks then
 * expired. The bucket's node loses a later call (as in c). Without the
 * touch the rewind would go back to the old call's `at` and apply the
 * expired keyed records again (verify MISMATCH: measured with the touch
 * disabled); with it, `at` is partition 0's finished prefix of at most a
 * touch period before the loss: exact. */
Test(cluster_global, rarely_used_bucket_rewinds_only_to_its_touch,
     .timeout = 360)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    const char *more[] = {"handler=ledger", "http.listen=127.0.0.1:0",
                          "dedup.ttl.seconds=20", NULL};
    start_stack(more);
    int a, b, r, bucket = pick_bucket(&a, &b, &r);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    expect_t e = {json_array(), json_object(), 0};
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    int next = 0;
    send_bucket_phase(rk, &e, "g1", bucket, 1, &next);
    for (int i = 0; i < 40; i++) {
        char id[32];
        snprintf(id, sizeof(id), "g-keyed-%d", i);
        send_payment(rk, 0, id, id, 300000 + i, "user-g", 3);
        expect_add(&e, id, "user-g", 3);
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    expect_write(&e);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    th_stack_wait_committed(&stk, "payments", 1, 60000);
    /* The bucket's call is now older than the window, and so are the
     * keyed records' marks. */
    wait_marks_expired(a);
    wait_touched(a, b, bucket);
    /* Their marks are gone, their effects stay: verify expects the
     * ledger's sums and only the identities sent from now on. */
    e.earlier += (long)json_array_size(e.ids);
    json_decref(e.ids);
    e.ids = json_array();
    cr_log_info("bucket %d on node %d: its call and the marks are old", bucket,
                b);

    replica_detach(b, r);
    send_bucket_phase(rk, &e, "g2", bucket, 3, &next);
    expect_write(&e);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    th_stack_wait_committed(&stk, "payments", 1, 60000);
    takeover(a, b, r, bucket);
    send_bucket_phase(rk, &e, "g3", bucket, 2, &next);
    rd_kafka_destroy(rk);
    expect_write(&e);
    char *vout = NULL;
    int vrc = th_stack_wait_verified(&stk, 0, NULL, 120000, &vout);
    if (vrc) {
        char *log = th_stack_member_log(&stk, "m1");
        cr_assert_eq(vrc, 0, "verify never exact:\n%s\nmember:\n%s", vout, log);
        free(log);
    }
    free(vout);
    cr_expect_geq(th_stack_log_count(&stk, "m1", "a global bucket's node"), 1,
                  "the loss was not logged");
    /* The rewind went to the touch (partition 0's finished prefix after
     * the keyed records), not to the bucket's old call at offset 0. */
    cr_expect_eq(th_stack_log_count(&stk, "m1", "\"bucket_at\":\"0\""), 0,
                 "the rewind went back to the old call:\n%s",
                 th_stack_member_log(&stk, "m1"));
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 0);
    cr_expect_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    json_decref(e.ids);
    json_decref(e.ledger);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* Sets (value) or deletes (value NULL) field user-bad of every partition's
 * ledger shard, each on its primary: a balance that is not a number makes
 * the ledger refuse user-bad's payments. */
static void poison_user_bad(const char *value)
{
    for (int p = 0; p < PARTS; p++) {
        char key[80];
        snprintf(key, sizeof(key),
                 "idemproc:ledger:EUR{test-group:payments:%d}", p);
        int o = th_cluster_owner(&clu, key_slot(key));
        char *out =
            value ? th_cluster_cmd(&clu, o, "HSET %s user-bad %s", key, value)
                  : th_cluster_cmd(&clu, o, "HDEL %s user-bad", key);
        cr_assert(out && out[0] >= '0' && out[0] <= '9', "%s: %s", key, out);
        free(out);
    }
}

/* b. dlq replay on a cluster: user-bad's payments are refused (a balance
 * that is not a number) and dead-lettered; the balance fixed, `dlq
 * replay` sends copies back to their partitions, which take the global
 * path (per identity, in the buckets): each applied once, verify exact.
 * Replayed again: duplicates, nothing applied twice, nothing
 * dead-lettered again. */
Test(cluster_global, dlq_replay_applies_each_copy_once, .timeout = 360)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    const char *more[] = {"handler=ledger", NULL};
    start_stack(more);
    poison_user_bad("not-a-number");
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    expect_t e = {json_array(), json_object(), 0};
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    const int bad = 12, good = 30;
    for (int i = 0; i < good + bad; i++) {
        char id[32];
        snprintf(id, sizeof(id), "r-%d", i);
        const char *user = i < good ? "user-good" : "user-bad";
        send_payment(rk, RD_KAFKA_PARTITION_UA, id, id, 70000 + i, user,
                     100 + i);
        expect_add(&e, id, user, 100 + i);
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    rd_kafka_destroy(rk);
    th_stack_wait_committed(&stk, "payments", PARTS, 60000);
    cr_assert_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), bad,
                 "user-bad's payments dead-lettered");

    poison_user_bad(NULL);
    char *out = NULL, *err = NULL;
    cr_assert_eq(cli("dlq", "replay", NULL, &out, &err), 0, "%s\n%s", out, err);
    free(out);
    free(err);
    expect_write(&e);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    /* The copies took the global path: one mark each in the buckets. */
    cr_expect_eq(cluster_keys("idemproc:dedup{test-group::*"), bad);
    cr_expect_gt(cluster_keys("idemproc:ledger:EUR{test-group::*}"), 0);

    /* Again: every copy a duplicate. */
    out = err = NULL;
    cr_assert_eq(cli("dlq", "replay", NULL, &out, &err), 0, "%s\n%s", out, err);
    free(out);
    free(err);
    th_stack_wait_committed(&stk, "payments", PARTS, 60000);
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments"),
                 good + 3 * bad, "the copies of both replays");
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), bad,
                 "a copy was dead-lettered again");
    cr_expect_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    json_decref(e.ids);
    json_decref(e.ledger);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* Sends n keyless payments w-<tag>-<i> of bucket `bucket` to partition 0,
 * adding them to e. */
static void send_keyless_bucket(rd_kafka_t *rk, expect_t *e, const char *tag,
                                int bucket, int n, int *next)
{
    for (int sent = 0; sent < n; (*next)++) {
        char id[48], ident[64];
        snprintf(id, sizeof(id), "w-%s-%d", tag, *next);
        snprintf(ident, sizeof(ident), "pay-%s", id);
        if (identity_bucket(ident) != bucket)
            continue;
        send_payment(rk, 0, NULL, id, 400000 + *next, "user-w", 100 + sent);
        expect_add(e, id, "user-w", 100 + sent);
        sent++;
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
}

/* f. redis.wait.replicas=1 on the global path: the bucket's primary's
 * replica stopped (SIGSTOP), keyless records applied there fail the
 * request's WAIT: an outage naming that node, nothing dead-lettered;
 * the replica resumed, the records (sent again: their marks) are applied
 * once, verify exact. */
Test(cluster_global, wait_replicas_on_the_global_path, .timeout = 300)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    const char *more[] = {"handler=ledger", "redis.wait.replicas=1",
                          "redis.wait.timeout.ms=300", NULL};
    start_stack(more);
    int a, b, r, bucket = pick_bucket(&a, &b, &r);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    expect_t e = {json_array(), json_object(), 0};
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    int next = 0;
    send_keyless_bucket(rk, &e, "1", bucket, 5, &next);
    expect_write(&e);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    cr_expect_eq(th_stack_log_count(&stk, "m1", "redis cluster: WAIT:"), 0,
                 "a WAIT failed with every replica up:\n%s",
                 th_stack_member_log(&stk, "m1"));

    cr_assert_eq(kill(clu.node[r].pid, SIGSTOP), 0);
    send_keyless_bucket(rk, &e, "2", bucket, 5, &next);
    char said[96];
    snprintf(said, sizeof(said), "redis cluster: WAIT: 127.0.0.1:%d: 0 of 1",
             clu.node[b].port);
    int seen = 0;
    for (int i = 0; i < 300 && !seen; i++) {
        seen = th_stack_log_count(&stk, "m1", said) > 0;
        if (!seen)
            usleep(100 * 1000);
    }
    cr_assert(seen, "no outage naming %d's WAIT:\n%s", b,
              th_stack_member_log(&stk, "m1"));
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 0);

    cr_assert_eq(kill(clu.node[r].pid, SIGCONT), 0);
    rd_kafka_destroy(rk);
    expect_write(&e);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 0);
    cr_expect_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    json_decref(e.ids);
    json_decref(e.ledger);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* The script handler's payments (as tests/e2e/test_cluster_run.c's). */
static const char script_lua[] =
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

/* d. handler=script with keyless records on a cluster: sent once to one
 * partition and again (a redelivery) to another, each applied once, its
 * idem.* writes in the buckets' shards; verify exact (the shards summed),
 * `state get script` the sum. */
Test(cluster_global, script_keyless_records_applied_once, .timeout = 300)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    char file[600];
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&script_dir, "payments.lua", script_lua));
    const char *more[] = {"handler=script", file,
                          "script.fields=/currency,/user_id,/amount", NULL};
    start_stack(more);
    pid_t m1 = th_stack_member_started(&stk, "m1", NULL);
    rd_kafka_t *rk = th_producer(stk.broker.bootstrap, NULL);
    const int n = 120;
    json_t *bal = json_object();
    for (int i = 0; i < n; i++) {
        char id[32], user[32];
        snprintf(id, sizeof(id), "s-%d", i);
        snprintf(user, sizeof(user), "user-%d", i % 5);
        send_payment(rk, i % PARTS, NULL, id, 500000 + i, user, 100 + i);
        send_payment(rk, (i + 1) % PARTS, NULL, id, 500000 + i, user, 100 + i);
        json_int_t had = json_integer_value(json_object_get(bal, user));
        json_object_set_new(bal, user, json_integer(had + 100 + i));
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    rd_kafka_destroy(rk);
    char vpath[600];
    snprintf(vpath, sizeof(vpath), "%s/script-expect.json", stk.dir);
    json_t *want = json_pack("{sI s{sO sI}}", "applied", (json_int_t)n, "redis",
                             "bal:EUR", bal, "applied", (json_int_t)n);
    cr_assert_eq(json_dump_file(want, vpath, JSON_INDENT(1)), 0);
    json_decref(want);
    const char *vargs[] = {"--expect", vpath, NULL};
    char *out = NULL, *err = NULL;
    int rc = -1;
    for (int waited = 0; waited < 120000 && rc != 0; waited += 500) {
        free(out);
        free(err);
        out = err = NULL;
        rc = cli("verify", NULL, vargs, &out, &err);
        if (rc)
            usleep(500 * 1000);
    }
    cr_assert_eq(rc, 0, "verify:\n%s\n%s", out, err);
    cr_expect(out && strstr(out, "verify: redis exact ("), "%s", out);
    free(out);
    free(err);
    cr_expect_gt(cluster_keys("idemproc:dedup{test-group::*"), 0);
    cr_expect_gt(cluster_keys("bal:EUR{test-group::*}"), 0,
                 "no script shard under a bucket's tag");
    /* state get: the sum of the shards. */
    const char *sargs[] = {"script", "bal:EUR", "user-3", NULL};
    out = err = NULL;
    cr_expect_eq(cli("state", "get", sargs, &out, &err), 0, "%s", err);
    char line[96];
    snprintf(line, sizeof(line), "script bal:EUR user-3: %lld (the sum of ",
             (long long)json_integer_value(json_object_get(bal, "user-3")));
    cr_expect(out && strstr(out, line), "want %s in:\n%s", line, out);
    free(out);
    free(err);
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 0);
    cr_expect_eq(th_stack_stop_member(&stk, "m1", m1, 15000), 0);
    json_decref(bal);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}
