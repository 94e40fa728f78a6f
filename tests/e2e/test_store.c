/* test_store (e2e): Redis as it really fails, with real redis-server
 * processes and the embedded broker: a full memory, a read-only replica,
 * an evicting memory policy, an AOF that lost its tail, WAIT for replicas.
 * Every fault ends with the ledger exact and no dead letter for it. */
#include "harness.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs it. */
static th_stack_t stk;
static th_redis_t replicas[2];

static void store_fini(void)
{
    for (int i = 0; i < 2; i++)
        if (replicas[i].dir)
            th_redis_stop(&replicas[i]);
    th_stack_cleanup();
}

TestSuite(store, .fini = store_fini);

static const char *const traffic[] = {
    "--count",           "20000", "--duplicates", "0.1", "--poison", "0.01",
    "--too-large-bytes", "5000",  "--seed",       "81",  NULL};

/* Polls the member's log for text. 0 when it appeared. */
static int wait_log(th_stack_t *s, const char *name, const char *text,
                    int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 100) {
        char *log = th_stack_member_log(s, name);
        int found = strstr(log, text) != NULL;
        free(log);
        if (found)
            return 0;
        usleep(100000);
    }
    return -1;
}

/* Polls /metrics for a sample above 0. */
static int wait_metric(int port, const char *name, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 100) {
        char *body = NULL;
        double v = -1;
        if (th_http_get(port, "/metrics", &body) == 200)
            v = th_metric(body, name);
        free(body);
        if (v > 0)
            return 0;
        usleep(100000);
    }
    return -1;
}

/* Starts a replica of primary (in replicas[i]) and waits until it is in
 * sync. */
static void replica_start(int i, th_redis_t *primary)
{
    static char port[2][16];
    snprintf(port[i], sizeof(port[i]), "%d", primary->port);
    const char *args[] = {"--replicaof", "127.0.0.1", port[i], NULL};
    cr_assert_eq(th_redis_start_args(&replicas[i], args), 0);
    for (int t = 0; t < 200; t++) {
        const char *a[] = {"INFO", "replication", NULL};
        char *info = th_redis_cli(&replicas[i], a);
        int up = info && strstr(info, "master_link_status:up");
        free(info);
        if (up)
            return;
        usleep(50000);
    }
    cr_assert_fail("replica %d never in sync", i);
}

/* maxmemory with noeviction reached mid-stream: every script is refused
 * with OOM. The member pauses (not ready, the OOM in the reason, counted
 * as class "oom"), dead-letters nothing for it, and once the limit is
 * raised the ledger is exact. */
Test(store, full_memory_pauses_then_resumes_exact, .timeout = 180)
{
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *props[] = {listen, "batch.max.messages=100", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    /* Room for a few hundred records, set before the member starts: a
     * member that is fast enough to finish everything before a limit set
     * mid-run would prove nothing. */
    char limit[32];
    snprintf(limit, sizeof(limit), "%lld",
             th_redis_info(&stk.redis, "used_memory") + 100000);
    const char *full[] = {"CONFIG", "SET", "maxmemory", limit, NULL};
    th_redis_ok(&stk.redis, full);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(
        wait_metric(port, "idemproc_redis_errors_total{class=\"oom\"}", 60000),
        0, "never ran into OOM");
    long held = th_stack_applied(&stk);
    cr_expect_lt(held, unique, "everything applied before the limit");
    char *body = NULL;
    int status = 0;
    for (int t = 0; t < 100 && status != 503; t++) {
        free(body);
        body = NULL;
        status = th_http_get(port, "/readyz", &body);
        usleep(100000);
    }
    cr_expect_eq(status, 503, "not ready while Redis refuses writes");
    cr_expect(body && strstr(body, "OOM"), "reason: %s", body);
    free(body);
    sleep(2);
    cr_expect_eq(th_http_get(port, "/healthz", NULL), 200);
    const char *room[] = {"CONFIG", "SET", "maxmemory", "0", NULL};
    th_redis_ok(&stk.redis, room);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    char *log = th_stack_member_log(&stk, "m1");
    cr_expect(!strstr(log, "handler-rejected"), "dead-lettered for OOM");
    free(log);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Pointed at a replica (a failover or a DNS mistake): every write is
 * READONLY, an outage, not poison. Promoting the replica lets the member
 * go on without a restart: exact on the promoted server. */
Test(store, read_only_replica_then_promoted_exact, .timeout = 180)
{
    cr_assert_eq(th_stack_start(&stk, 4, NULL), 0);
    replica_start(0, &stk.redis);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    char url[96];
    snprintf(url, sizeof(url), "redis.url=%s", replicas[0].url);
    const char *sets[] = {url, NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);
    cr_assert_eq(wait_log(&stk, "m1", "is not the primary", 60000), 0,
                 "never refused by the replica");
    sleep(2);
    const char *promote[] = {"REPLICAOF", "NO", "ONE", NULL};
    th_redis_ok(&replicas[0], promote);
    TH_ASSERT_VERIFIED(&stk, 1, sets, 120000);
    char *log = th_stack_member_log(&stk, "m1");
    cr_expect(!strstr(log, "handler-rejected"), "dead-lettered for READONLY");
    free(log);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_redis_stop(&replicas[0]);
    th_stack_stop(&stk);
}

/* An evicting maxmemory-policy would drop marks and apply records twice:
 * `run` refuses it (exit 2, a line that says why and how to fix it),
 * unless redis.allow.eviction=true says so on purpose. */
Test(store, evicting_policy_refused_unless_allowed, .timeout = 120)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    const char *lru[] = {"CONFIG", "SET", "maxmemory-policy", "allkeys-lru",
                         NULL};
    th_redis_ok(&stk.redis, lru);
    const char *few[] = {"--count", "2000", "--seed", "82", NULL};
    cr_assert_eq(th_stack_produce(&stk, few), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_expect_eq(th_wait(m, 30000), 2, "run accepted allkeys-lru");
    char *log = th_stack_member_log(&stk, "m1");
    cr_expect(strstr(log, "maxmemory-policy is allkeys-lru"), "log: %s", log);
    cr_expect(strstr(log, "maxmemory-policy noeviction"), "no fix: %s", log);
    cr_expect(strstr(log, "redis.allow.eviction=true"), "no way out: %s", log);
    free(log);
    cr_expect_eq(th_stack_applied(&stk), 0);

    const char *allow[] = {"redis.allow.eviction=true", NULL};
    m = th_stack_member(&stk, "m2", allow);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 90000);
    log = th_stack_member_log(&stk, "m2");
    cr_expect(strstr(log, "redis may evict dedup marks"), "no warning: %s",
              log);
    free(log);
    cr_expect_eq(th_stop(m, 15000), 0);

    /* Checked again while running: an operator switching to an evicting
     * policy stops the member too. */
    const char *safe[] = {"CONFIG", "SET", "maxmemory-policy", "noeviction",
                          NULL};
    th_redis_ok(&stk.redis, safe);
    m = th_stack_member(&stk, "m3", NULL);
    cr_assert_eq(wait_log(&stk, "m3", "partitions assigned", 30000), 0);
    sleep(2);
    char *early = th_stack_member_log(&stk, "m3");
    cr_expect(!strstr(early, "refusing"), "m3 refused noeviction: %s", early);
    free(early);
    const char *lfu[] = {"CONFIG", "SET", "maxmemory-policy", "volatile-lfu",
                         NULL};
    th_redis_ok(&stk.redis, lfu);
    int rc = th_wait(m, 30000);
    if (rc < 0)
        th_stop(m, 5000);
    cr_expect_eq(rc, 2, "run kept going with volatile-lfu");
    cr_expect_eq(wait_log(&stk, "m3", "maxmemory-policy is volatile-lfu", 1000),
                 0);
    th_stack_stop(&stk);
}

/* Cuts the last `fraction` of the newest incr AOF file in dir, the way a
 * host crash loses what the OS had not written yet. Returns bytes cut. */
/* The newest incr AOF file of dir (by its sequence number, not its name:
 * "10" sorts before "9") into path. */
static void aof_newest_incr(const char *dir, char *path, size_t size)
{
    char adir[600];
    snprintf(adir, sizeof(adir), "%s/appendonlydir", dir);
    DIR *d = opendir(adir);
    cr_assert(d, "no %s", adir);
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *at = strstr(e->d_name, ".aof.");
        if (!at || !strstr(e->d_name, ".incr.aof") || atol(at + 5) <= best)
            continue;
        best = atol(at + 5);
        snprintf(path, size, "%s/%s", adir, e->d_name);
    }
    closedir(d);
    cr_assert_geq(best, 0, "no incr AOF in %s", adir);
}

/* Where, in the AOF text buf[len], the first position of every partition
 * of payments (0..partitions-1) has been written: the end of the first
 * HSET of the group's positions hash that names the last of them. -1 when
 * one never was. Commands are RESP arrays of bulk strings. */
static long aof_first_positions_end(const char *buf, size_t len, int partitions)
{
    static const char key[] = "idemproc:pos:test-group";
    const int all = (1 << partitions) - 1;
    int seen = 0;
    long end = -1;
    size_t p = 0;
    while (p < len && buf[p] == '*' && seen != all) {
        long argc = atol(buf + p + 1);
        const char *nl = memchr(buf + p, '\n', len - p);
        if (!nl)
            break;
        p = (size_t)(nl - buf) + 1;
        int hset = 0, ours = 0, ok = 1;
        for (long a = 0; a < argc && ok; a++) {
            nl = p < len && buf[p] == '$' ? memchr(buf + p, '\n', len - p)
                                          : NULL;
            long l = nl ? atol(buf + p + 1) : -1;
            if (!nl || (size_t)(nl - buf) + 1 + (size_t)l + 2 > len) {
                ok = 0;
                break;
            }
            const char *arg = nl + 1;
            p = (size_t)(nl - buf) + 1 + (size_t)l + 2;
            if (a == 0)
                hset = l == 4 && !strncasecmp(arg, "HSET", 4);
            else if (a == 1)
                ours = hset && (size_t)l == strlen(key) && !memcmp(arg, key, l);
            else if (ours && a % 2 == 0 && l > 9 &&
                     !memcmp(arg, "payments:", 9)) {
                int part = atoi(arg + 9);
                if (part >= 0 && part < partitions)
                    seen |= 1 << part;
            }
        }
        if (!ok)
            break;
        if (seen == all)
            end = (long)p; /* this command named the last one */
    }
    return end;
}

/* Cuts the tail of dir's newest incr AOF: `fraction` of its bytes, or
 * less when that would take the first position of one of `partitions`
 * partitions (0: no such bound). Returns the bytes cut. */
static long aof_cut_tail(const char *dir, double fraction, int partitions)
{
    char best[900];
    aof_newest_incr(dir, best, sizeof(best));
    struct stat st;
    cr_assert_eq(stat(best, &st), 0);
    off_t keep = (off_t)((double)st.st_size * (1.0 - fraction));
    if (partitions) {
        size_t len = 0;
        char *buf = th_slurp(best, &len);
        cr_assert(buf, "cannot read %s", best);
        long first = aof_first_positions_end(buf, len, partitions);
        free(buf);
        cr_assert_geq(first, 0, "%s: a partition's first position is missing",
                      best);
        cr_log_info("AOF %ld bytes: every first position written by byte "
                    "%ld, cutting from byte %ld",
                    (long)st.st_size, first,
                    (long)(keep < first ? first : keep));
        if (keep < first)
            keep = first;
    }
    cr_assert_eq(truncate(best, keep), 0);
    return (long)(st.st_size - keep);
}

/* Redis with appendfsync everysec, killed with -9 and its AOF's unsynced
 * tail cut (a host crash): it comes back having lost its last writes,
 * effects, marks and positions together, while Kafka's committed offsets
 * are ahead. The member, still running, re-reads the positions after the
 * reconnect, rewinds and applies those records again: exact. */
Test(store, lost_aof_tail_is_read_again_exact, .timeout = 240)
{
    const char *props[] = {"batch.max.messages=100", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *aof[] = {"CONFIG", "SET", "appendonly", "yes", NULL};
    th_redis_ok(&stk.redis, aof);
    const char *fsync[] = {"CONFIG", "SET", "appendfsync", "everysec", NULL};
    th_redis_ok(&stk.redis, fsync);
    for (int t = 0; t < 100; t++) { /* the first rewrite makes the base */
        if (th_redis_info(&stk.redis, "aof_rewrite_in_progress") == 0 &&
            th_redis_info(&stk.redis, "aof_rewrite_scheduled") == 0)
            break;
        usleep(100000);
    }
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(th_stack_wait_applied(&stk, unique / 2, 90000), 0);
    kill(stk.redis.pid, SIGKILL);
    th_wait(stk.redis.pid, 5000);
    stk.redis.pid = 0;
    long cut = aof_cut_tail(stk.redis.dir, 0.6, 0);
    cr_assert_gt(cut, 0);
    stk.redis.extra[0] = "--appendonly";
    stk.redis.extra[1] = "yes";
    stk.redis.extra[2] = "--aof-load-truncated";
    stk.redis.extra[3] = "yes";
    cr_assert_eq(th_redis_restart(&stk.redis), 0);
    long after = th_stack_applied(&stk);
    cr_log_info("AOF: cut %ld bytes; %ld of %ld unique records still applied",
                cut, after, unique);
    cr_assert_gt(after, 0, "Redis came back empty: the AOF was not loaded");
    cr_expect_lt(after, unique, "Redis lost nothing: the test proves nothing");
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 150000);
    char *log = th_stack_member_log(&stk, "m1");
    cr_expect(strstr(log, "rewound to the position redis holds"),
              "no rewind: %s", log);
    cr_expect(strstr(log, "redis went back in time"), "not detected");
    free(log);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* redis.wait.replicas: a chunk is finished only once WAIT confirms enough
 * replicas. With fewer replicas than asked for, nothing is finished (not
 * ready, class "wait"); once a second replica joins, exact, and the
 * replicas hold the ledger too. */
Test(store, wait_for_replicas_before_finishing, .timeout = 180)
{
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *props[] = {listen, "redis.wait.replicas=2",
                           "redis.wait.timeout.ms=200", NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    replica_start(0, &stk.redis);
    const char *few[] = {"--count", "3000", "--duplicates", "0.1", "--seed",
                         "83",      NULL};
    cr_assert_eq(th_stack_produce(&stk, few), 0);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(
        wait_metric(port, "idemproc_redis_errors_total{class=\"wait\"}", 60000),
        0, "WAIT never fell short");
    /* Between two short WAITs the member reconnects and retries; the
     * probe must see it not ready for the replicas at some point. */
    char *body = NULL;
    int status = 0;
    for (int t = 0;
         t < 100 && !(status == 503 && body && strstr(body, "replicas")); t++) {
        free(body);
        body = NULL;
        status = th_http_get(port, "/readyz", &body);
        usleep(100000);
    }
    cr_expect_eq(status, 503);
    cr_expect(body && strstr(body, "replicas"), "reason: %s", body);
    free(body);
    body = NULL;
    cr_expect_eq(th_http_get(port, "/metrics", &body), 200);
    cr_expect_eq(
        th_metric(body, "idemproc_records_total{outcome=\"processed\"}"), 0,
        "finished without the replicas");
    free(body);
    replica_start(1, &stk.redis);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 120000);
    char url[96];
    snprintf(url, sizeof(url), "redis.url=%s", replicas[1].url);
    const char *sets[] = {url, NULL};
    TH_ASSERT_VERIFIED(&stk, 0, sets, 30000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_redis_stop(&replicas[1]);
    th_redis_stop(&replicas[0]);
    th_stack_stop(&stk);
}

/* A Redis that stops answering (CLIENT PAUSE) for longer than
 * redis.timeout.ms: reported as "timeout after N ms" (class "timeout"),
 * not as the system's error text; exact once it answers again. */
Test(store, stalled_redis_is_a_timeout_then_exact, .timeout = 180)
{
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *props[] = {listen, "batch.max.messages=100",
                           "redis.timeout.ms=300", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(th_stack_wait_applied(&stk, unique / 5, 60000), 0);
    const char *pause[] = {"CLIENT", "PAUSE", "4000", "ALL", NULL};
    th_redis_ok(&stk.redis, pause);
    cr_assert_eq(wait_log(&stk, "m1", "timeout after 300 ms", 30000), 0,
                 "no timeout reported");
    cr_expect_eq(wait_metric(port,
                             "idemproc_redis_errors_total{class=\"timeout\"}",
                             10000),
                 0);
    char *log = th_stack_member_log(&stk, "m1");
    cr_expect(!strstr(log, "Resource temporarily unavailable"),
              "system error text instead of the timeout");
    free(log);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* The sum of the positions Redis holds for the test group (-1 when none). */
static long positions_sum(th_stack_t *s)
{
    const char *args[] = {"HVALS", "idemproc:pos:test-group", NULL};
    char *vals = th_redis_cli(&s->redis, args);
    if (!vals || !*vals) {
        free(vals);
        return -1;
    }
    long sum = 0;
    for (char *l = vals; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : l)
        sum += atol(l);
    free(vals);
    return sum;
}

/* The lines of member `name`'s log that tell what happened to positions
 * and fetching (for a failure's message; caller frees). */
static char *member_log_digest(const char *name)
{
    static const char *const words[] = {"position",     "rewound",  "lost",
                                        "back in time", "fetched",  "assigned",
                                        "paused",       "resuming", "error"};
    char *log = th_stack_member_log(&stk, name);
    size_t cap = 16384, n = 0;
    char *out = calloc(1, cap);
    for (char *l = log, *nl; l && *l; l = nl ? nl + 1 : NULL) {
        nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        int keep = 0;
        for (size_t w = 0; w < sizeof(words) / sizeof(words[0]) && !keep; w++)
            keep = memmem(l, len, words[w], strlen(words[w])) != NULL;
        if (keep && n + len + 2 < cap) {
            memcpy(out + n, l, len);
            n += len;
            out[n++] = '\n';
        }
    }
    free(log);
    return out;
}

/* Redis loses the tail of its AOF while no member runs (the whole group
 * was down, or restarted with it). Kafka's committed offsets are at the
 * end, Redis's positions are not: the next member starts each partition at
 * the position Redis holds, says that Redis went back in time, and applies
 * the lost records again: exact.
 *
 * The cut keeps every partition's first position. A partition whose first
 * position comes late in the file (its fetch started seconds after the
 * others', as librdkafka sometimes does: the fetch watch repairs it) lost
 * everything with a plain half cut: Redis held no position of it, the
 * next member started it at Kafka's end, and the ledger stayed short (the
 * one failure seen in a full run). Such a partition is now lost, kept
 * paused until a reset (test_offsets.c), never guessed. */
Test(store, member_starts_at_the_position_redis_holds, .timeout = 240)
{
    cr_assert_eq(th_stack_start(&stk, 4, NULL), 0);
    const char *aof[] = {"CONFIG", "SET", "appendonly", "yes", NULL};
    th_redis_ok(&stk.redis, aof);
    for (int t = 0; t < 100; t++) {
        if (th_redis_info(&stk.redis, "aof_rewrite_in_progress") == 0 &&
            th_redis_info(&stk.redis, "aof_rewrite_scheduled") == 0)
            break;
        usleep(100000);
    }
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    json_t *e = json_load_file(stk.expect, 0, NULL);
    cr_assert(e);
    long sent = (long)json_integer_value(json_object_get(e, "sent"));
    json_decref(e);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    cr_expect_eq(th_stop(m, 15000), 0);
    /* Every record finished: Redis holds the end of every partition. */
    cr_expect_eq(positions_sum(&stk), sent);

    kill(stk.redis.pid, SIGKILL);
    th_wait(stk.redis.pid, 5000);
    stk.redis.pid = 0;
    cr_assert_gt(aof_cut_tail(stk.redis.dir, 0.5, 4), 0);
    stk.redis.extra[0] = "--appendonly";
    stk.redis.extra[1] = "yes";
    cr_assert_eq(th_redis_restart(&stk.redis), 0);
    long kept = positions_sum(&stk);
    cr_log_info("positions after the cut: %ld of %ld records", kept, sent);
    cr_assert(kept > 0 && kept < sent, "positions after the cut: %ld of %ld",
              kept, sent);
    const char *hlen[] = {"HLEN", "idemproc:pos:test-group", NULL};
    char *parts = th_redis_cli(&stk.redis, hlen);
    cr_assert(parts && atoi(parts) == 4, "positions kept: %s", parts);
    free(parts);

    m = th_stack_member(&stk, "m2", NULL);
    char *vout = NULL;
    if (th_stack_wait_verified(&stk, 1, NULL, 120000, &vout)) {
        char *d1 = member_log_digest("m1"), *d2 = member_log_digest("m2");
        cr_assert_fail("verify never exact:\n%s\nm1:\n%s\nm2:\n%s", vout, d1,
                       d2);
    }
    free(vout);
    char *log = th_stack_member_log(&stk, "m2");
    cr_expect(strstr(log, "redis went back in time"), "not detected: %s", log);
    free(log);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* A long-running script of someone else keeps Redis BUSY: an outage of
 * class "busy", no dead letters, exact once it ends. */
Test(store, busy_redis_pauses_then_exact, .timeout = 180)
{
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *props[] = {listen, "batch.max.messages=100", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *threshold[] = {"CONFIG", "SET", "busy-reply-threshold", "100",
                               NULL};
    th_redis_ok(&stk.redis, threshold);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    pid_t m = th_stack_member(&stk, "m1", NULL);
    cr_assert_eq(th_stack_wait_applied(&stk, unique / 5, 60000), 0);
    char rport[16];
    snprintf(rport, sizeof(rport), "%d", stk.redis.port);
    char *busy[] = {"/usr/bin/redis-cli",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    rport,
                    "EVAL",
                    "local s = tonumber(redis.call('TIME')[1]) "
                    "while tonumber(redis.call('TIME')[1]) < s + 4 do end "
                    "return 1",
                    "0",
                    NULL};
    pid_t b = th_spawn(busy, NULL, NULL, NULL);
    int found =
        wait_metric(port, "idemproc_redis_errors_total{class=\"busy\"}", 20000);
    cr_expect_eq(th_wait(b, 30000), 0, "the busy script did not end");
    cr_expect_eq(found, 0, "never saw BUSY");
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    char *log = th_stack_member_log(&stk, "m1");
    cr_expect(!strstr(log, "handler-rejected"), "dead-lettered for BUSY");
    free(log);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}
