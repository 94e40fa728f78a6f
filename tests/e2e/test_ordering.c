/* test_ordering (e2e): ordering=key|partition|none with handler=webhook
 * against tests/ordersink, a service that records the arrival order per
 * key: a request of a key arriving before the previous one of that key
 * was answered is a violation, a first success of an identity below one
 * of its key already applied a reorder. By key, neither happens across a
 * member's SIGKILL and restart, in-place retries (the service answers 503
 * now and then) and a rebalance (a second member joins), and each
 * identity is applied once; by partition one request of a partition is
 * in flight at a time; none overlaps a key's records as before. */
#include "harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

static th_stack_t stk; /* static: the suite's .fini stops it after a
                          failed assertion */
static pid_t sink = -1;

static void sink_stop(void)
{
    if (sink > 0)
        th_stop(sink, 5000);
    sink = -1;
}

static void run_fini(void)
{
    sink_stop();
    th_stack_cleanup();
}

TestSuite(ordering, .fini = run_fini, .timeout = 300);

/* Starts tests/ordersink (next to the idemproc binary) with args; returns
 * its port, its URL in url[]. */
static int sink_start(const char *dir, const char *const args[], char *url,
                      size_t url_size)
{
    char self[600], bin[700], out[600];
    snprintf(self, sizeof(self), "%s", th_bin());
    snprintf(bin, sizeof(bin), "%s/ordersink", dirname(self));
    snprintf(out, sizeof(out), "%s/sink.%d.out", dir, (int)idem_now_ms());
    char *argv[16] = {bin};
    size_t n = 1;
    for (; args && args[n - 1] && n < 15; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    sink = th_spawn(argv, out, NULL, NULL);
    cr_assert_gt(sink, 0, "ordersink did not start (%s)", bin);
    int64_t end = idem_now_ms() + 5000;
    int port = 0;
    while (!port && idem_now_ms() < end) {
        char *s = th_slurp(out, NULL);
        if (s && sscanf(s, "http://127.0.0.1:%d/hook", &port) == 1)
            snprintf(url, url_size, "http://127.0.0.1:%d/hook", port);
        else
            port = 0;
        free(s);
        if (!port)
            usleep(20 * 1000);
    }
    cr_assert_gt(port, 0, "ordersink printed no URL");
    return port;
}

/* One number of the service's /stats. */
static long long stat_of(int port, const char *name)
{
    char *body = NULL;
    cr_assert_eq(th_http_get(port, "/stats", &body), 200);
    json_t *j = json_loads(body, 0, NULL);
    cr_assert(j, "stats: %s", body);
    long long v = json_integer_value(json_object_get(j, name));
    json_decref(j);
    free(body);
    return v;
}

static int wait_applied(int port, long long n, int timeout_ms)
{
    int64_t end = idem_now_ms() + timeout_ms;
    while (idem_now_ms() < end) {
        if (stat_of(port, "applied") >= n)
            return 0;
        usleep(50 * 1000);
    }
    return -1;
}

/* Writes n records over `keys` keys (key i % keys, so each key's records
 * are spread over the stream) as KEY<TAB>VALUE lines, and produces them
 * keyed; identities o-<i>. */
static void produce_keyed(th_stack_t *s, size_t n, size_t keys)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/keyed.lines", s->dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    for (size_t i = 0; i < n; i++)
        fprintf(fp, "key-%zu\t{\"idempotency_key\":\"o-%zu\",\"n\":%zu}\n",
                (i * 7) % keys, i, i);
    fclose(fp);
    const char *args[] = {"--input", path, "--key-delimiter", "\\t", NULL};
    cr_assert_eq(th_stack_produce(s, args), 0);
}

/* A webhook member of group `group` (its own Redis prefix: a run of its
 * own) against url with `ordering`. */
static pid_t member(th_stack_t *s, const char *name, const char *group,
                    const char *url, const char *ordering)
{
    char u[160], g[96], o[64], prefix[96];
    snprintf(u, sizeof(u), "webhook.url=%s", url);
    snprintf(g, sizeof(g), "group.id=%s", group);
    snprintf(o, sizeof(o), "ordering=%s", ordering);
    snprintf(prefix, sizeof(prefix), "redis.prefix=%s:", group);
    const char *sets[] = {"handler=webhook",
                          u,
                          g,
                          o,
                          prefix,
                          "webhook.max.inflight=16",
                          "dedup.lease.ms=2000",
                          "retry.backoff.initial.ms=20",
                          "retry.backoff.max.ms=100",
                          "retry.max.attempts=100",
                          "shutdown.timeout.ms=4000",
                          NULL};
    return th_stack_member(s, name, sets);
}

Test(ordering, by_key_no_violation_across_a_kill_retries_and_a_rebalance)
{
    cr_assert_eq(th_stack_start(&stk, 4, NULL), 0);
    const size_t n = 3000, keys = 60;
    produce_keyed(&stk, n, keys);
    char url[128];
    const char *sargs[] = {"--delay-min-ms",
                           "1",
                           "--delay-max-ms",
                           "8",
                           "--fail-percent",
                           "10",
                           "--seed",
                           "26",
                           NULL};
    int sp = sink_start(stk.dir, sargs, url, sizeof(url));

    pid_t m1 = member(&stk, "o1", "ord", url, "key");
    cr_assert_eq(wait_applied(sp, n / 5, 120000), 0,
                 "the member sent too little");
    kill(m1, SIGKILL);
    th_wait(m1, 10000);
    long long before = stat_of(sp, "applied");
    cr_assert_lt(before, (long long)n, "the kill came after the end");

    pid_t m2 = member(&stk, "o2", "ord", url, "key");
    cr_assert_eq(wait_applied(sp, before + (long long)n / 5, 120000), 0);
    pid_t m3 = member(&stk, "o3", "ord", url, "key"); /* a rebalance */
    cr_assert_eq(wait_applied(sp, (long long)n, 180000), 0,
                 "%lld of %zu identities applied", stat_of(sp, "applied"), n);
    cr_assert_eq(th_stack_stop_member(&stk, "o3", m3, 15000), 0);
    cr_assert_eq(th_stack_stop_member(&stk, "o2", m2, 15000), 0);

    cr_expect_eq(stat_of(sp, "violations"), 0,
                 "a key's record arrived before its previous one was answered");
    cr_expect_eq(stat_of(sp, "reorders"), 0,
                 "a key's later record took effect before an earlier one");
    cr_expect_eq(stat_of(sp, "applied"), (long long)n);
    cr_expect_gt(stat_of(sp, "failed"), 0, "no in-place retry happened");
    /* At least once across the kill: a repeat only for what was answered
     * but not yet marked when the member died (16 in flight at most). */
    cr_expect_leq(stat_of(sp, "repeats"), 16);
    sink_stop();
    th_stack_stop(&stk);
}

/* One run of a fresh group over the records of the stack with `ordering`
 * against a fresh service started with sargs; returns the service's
 * violations. With `held` (sargs hold a key), waits until a violation
 * came or 60 s passed, then releases the held key. */
static long long one_run_held(const char *group, const char *ordering,
                              const char *const sargs[], size_t n, int held)
{
    char url[128];
    int sp = sink_start(stk.dir, sargs, url, sizeof(url));
    pid_t m = member(&stk, group, group, url, ordering);
    if (held) {
        int64_t end = idem_now_ms() + 60000;
        while (stat_of(sp, "violations") < 1 && idem_now_ms() < end)
            usleep(50 * 1000);
        char *body = NULL;
        cr_assert_eq(th_http_get(sp, "/release", &body), 200);
        free(body);
    }
    cr_assert_eq(wait_applied(sp, (long long)n, 120000), 0,
                 "%s: %lld of %zu applied", ordering, stat_of(sp, "applied"),
                 n);
    cr_assert_eq(th_stop(m, 15000), 0);
    long long v = stat_of(sp, "violations");
    cr_expect_eq(stat_of(sp, "applied"), (long long)n);
    cr_expect_eq(stat_of(sp, "repeats"), 0, "%s: an identity sent twice",
                 ordering);
    sink_stop();
    return v;
}

static long long one_run(const char *group, const char *ordering,
                         const char *const sargs[], size_t n)
{
    return one_run_held(group, ordering, sargs, n, 0);
}

Test(ordering, partition_is_strict_key_runs_keys_side_by_side_none_overlaps)
{
    cr_assert_eq(th_stack_start(&stk, 1, NULL), 0);
    const size_t n = 400, keys = 20;
    produce_keyed(&stk, n, keys);
    const char *by_part[] = {"--delay-min-ms", "1", "--delay-max-ms", "4",
                             "--by-partition", NULL};
    const char *by_key[] = {"--delay-min-ms", "1", "--delay-max-ms", "4", NULL};
    /* One request of the partition at a time. */
    cr_expect_eq(one_run("p1", "partition", by_part, n), 0);
    /* By key: never two of a key at once, but keys side by side. */
    cr_expect_eq(one_run("k1", "key", by_key, n), 0);
    /* The service holds key-0's requests: the other keys' go on beside
     * the open one (by the delays alone, a slowed member sent one at a
     * time; see below). */
    const char *by_part_held[] = {
        "--delay-min-ms", "1",     "--delay-max-ms", "4",
        "--hold-key",     "key-0", "--by-partition", NULL};
    cr_expect_gt(one_run_held("k2", "key", by_part_held, n, 1), 0,
                 "ordering=key ran one record at a time");
    /* As before: records of one key in flight together. The service
     * holds key-0's requests, so its second arrives while its first is
     * open. (Left to the delays alone, the overlap needs a request open
     * while 20 later ones are sent, keys being 20 records apart: a member
     * slowed down, under a sanitizer on a busy machine, kept the order.) */
    const char *by_key_held[] = {
        "--delay-min-ms", "1", "--delay-max-ms", "4", "--hold-key",
        "key-0",          NULL};
    cr_expect_gt(one_run_held("n1", "none", by_key_held, n, 1), 0,
                 "ordering=none kept a key's order");
    th_stack_stop(&stk);
}

/* CRC-32 (IEEE), as librdkafka's default partitioner hashes a key. */
static uint32_t crc32_of(const char *s)
{
    uint32_t c = 0xffffffffu;
    for (; *s; s++) {
        c ^= (unsigned char)*s;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return c ^ 0xffffffffu;
}

/* One gauge or counter of a member's /metrics. */
static double metric_of(int port, const char *name)
{
    char *body = NULL;
    cr_assert_eq(th_http_get(port, "/metrics", &body), 200);
    double v = th_metric(body, name);
    free(body);
    return v;
}

/* A hot key in one partition whose first request the service holds: its
 * later records all wait behind it, so that partition pauses its fetch
 * instead of filling the hands (600 records in hand at most here: 3
 * batches of 200) with the hot key's 1500 records, and the other
 * partition's 1000 records all take effect while the hot key still waits.
 * Then the service lets the hot key go: everything exactly once, in
 * order per key. Without the per-partition pause the hands fill with hot
 * records and the other partition's stall behind them. */
Test(ordering, a_hot_key_pauses_its_partition_the_other_goes_on)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    /* The hot key and 40 normal keys hashed to the other partition. */
    const char *hot = "hot-key";
    uint32_t hp = crc32_of(hot) % 2;
    const size_t n_hot = 1500, n_cold = 1000;
    char path[600], key[32];
    snprintf(path, sizeof(path), "%s/hot.lines", stk.dir);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    for (size_t i = 0; i < n_hot; i++)
        fprintf(fp, "%s\t{\"idempotency_key\":\"h-%zu\",\"n\":%zu}\n", hot, i,
                i);
    size_t made = 0;
    for (int k = 0; made < n_cold; k++) {
        snprintf(key, sizeof(key), "key-%d", k % 4000);
        if (crc32_of(key) % 2 == hp)
            continue;
        fprintf(fp, "%s\t{\"idempotency_key\":\"c-%zu\",\"n\":%zu}\n", key,
                made, made);
        made++;
    }
    fclose(fp);
    const char *pargs[] = {"--input", path, "--key-delimiter", "\\t", NULL};
    cr_assert_eq(th_stack_produce(&stk, pargs), 0);

    char url[128];
    const char *sargs[] = {
        "--delay-min-ms", "0", "--delay-max-ms", "1", "--hold-key", hot, NULL};
    int sp = sink_start(stk.dir, sargs, url, sizeof(url));
    int port = th_free_port();
    char u[160], listen[64];
    snprintf(u, sizeof(u), "webhook.url=%s", url);
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *sets[] = {"handler=webhook",
                          u,
                          listen,
                          "group.id=hot",
                          "redis.prefix=hot:",
                          "ordering=key",
                          "batch.max.messages=200",
                          "webhook.max.inflight=16",
                          "webhook.timeout.ms=120000",
                          "dedup.lease.ms=120000",
                          "shutdown.timeout.ms=4000",
                          "kafka.queued.min.messages=150",
                          NULL};
    pid_t m = th_stack_member(&stk, "hot", sets);

    /* The hot key's partition pauses behind it (once it is fetched). */
    int64_t end = idem_now_ms() + 60000;
    double held = 0;
    while (held < 1 && idem_now_ms() < end) {
        char *b = NULL;
        if (th_http_get(port, "/metrics", &b) == 200)
            held = th_metric(b, "idemproc_ordering_partitions_held");
        free(b);
        if (held < 1)
            usleep(50 * 1000);
    }
    cr_assert_geq(held, 1, "the hot key's partition never paused");
    /* Every normal record takes effect while the hot key's first request
     * is still held. */
    cr_assert_eq(wait_applied(sp, (long long)n_cold, 120000), 0,
                 "%lld of the other partition's %zu applied while the hot "
                 "key waits (the hands full of it?)",
                 stat_of(sp, "applied"), n_cold);
    cr_expect_eq(stat_of(sp, "hold_applied"), 0);
    cr_expect_eq(stat_of(sp, "applied"), (long long)n_cold);
    cr_expect_eq(metric_of(port, "idemproc_ordering_partitions_held"), 1,
                 "the hot key's partition is not paused behind it");
    cr_expect_geq(metric_of(port, "idemproc_ordering_partition_holds_total"),
                  1);
    /* Only the hot partition's records are in hand now: the bound (100)
     * and at most two polls of 200, far below the hands' 600. */
    double in_hand = metric_of(port, "idemproc_inflight_records");
    cr_expect_leq(in_hand, 500, "%.0f records in hand", in_hand);
    cr_expect_geq(in_hand, 100, "%.0f records in hand", in_hand);

    char *body = NULL;
    cr_assert_eq(th_http_get(sp, "/release", &body), 200);
    free(body);
    cr_assert_eq(wait_applied(sp, (long long)(n_hot + n_cold), 180000), 0,
                 "%lld of %zu applied after the release",
                 stat_of(sp, "applied"), n_hot + n_cold);
    cr_expect_eq(metric_of(port, "idemproc_ordering_partitions_held"), 0);
    cr_assert_eq(th_stop(m, 15000), 0);
    cr_expect_eq(stat_of(sp, "violations"), 0);
    cr_expect_eq(stat_of(sp, "reorders"), 0);
    cr_expect_eq(stat_of(sp, "repeats"), 0);
    cr_expect_eq(stat_of(sp, "applied"), (long long)(n_hot + n_cold));
    cr_expect_eq(stat_of(sp, "hold_applied"), (long long)n_hot);
    sink_stop();
    th_stack_stop(&stk);
}
