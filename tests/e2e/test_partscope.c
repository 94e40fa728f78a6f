/* test_partscope: the traps of the partition-scoped dedup layout
 * (dedup.scope=partition with handler=ledger; docs/design.md, "Dedup state
 * layout"), each with real members, the embedded broker and a real Redis:
 * a zombie owner fenced, an AOF tail lost twice under a member that holds
 * the marks, window expiry, duplicates inside one chunk with a refused
 * increment, and a dead letter replayed and then read again after an
 * offsets reset. Every case checks the ledger to the cent. */
#include "harness.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs it. */
static th_stack_t stk;

static pid_t member(const char *name)
{
    return th_stack_member_started(&stk, name, NULL);
}

static void wait_committed(int partitions, int timeout_ms)
{
    th_stack_wait_committed(&stk, "payments", partitions, timeout_ms);
}

TestSuite(partscope, .fini = th_stack_cleanup);

#define PARTSCOPE_PROPS                                                        \
    "dedup.scope=partition", "handler=ledger", "batch.max.messages=100"

/* Runs `idemproc <cmd> <verb> -c <conf>` plus args (NULL-terminated);
 * returns the exit code, *out / *err (may be NULL; caller frees). */
static int cli(const char *cmd, const char *verb, const char *const args[],
               char **out, char **err)
{
    char *argv[32] = {(char *)th_bin(), (char *)cmd, (char *)verb, "-c",
                      stk.conf};
    int n = 5;
    for (int i = 0; args && args[i] && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    return th_run(argv, out, err, 60000);
}

/* A Redis reply as a number (0 when nil). */
static long redis_num(const char *const args[])
{
    char *out = th_redis_cli(&stk.redis, args);
    long v = out ? atol(out) : 0;
    free(out);
    return v;
}

/* HGET of the EUR ledger for user (caller frees; "" when none). */
static char *balance(const char *user)
{
    const char *args[] = {"HGET", "idemproc:ledger:EUR", user, NULL};
    char *out = th_redis_cli(&stk.redis, args);
    return out ? out : strdup("");
}

static void expect_balance(const char *user, const char *want)
{
    char *got = balance(user);
    cr_expect_str_eq(got, want, "balance of %s", user);
    free(got);
}

/* How many keys of the partition layout the group has in Redis: proves
 * the member wrote partition-scoped state, not today's global marks. */
static long partscope_keys(void)
{
    const char *args[] = {"EVAL", "return #redis.call('KEYS', ARGV[1])", "0",
                          "idemproc:st{test-group:payments:*", NULL};
    return redis_num(args);
}

static long epoch_of(int partition)
{
    char key[128];
    snprintf(key, sizeof(key), "idemproc:st{test-group:payments:%d}:epoch",
             partition);
    const char *args[] = {"GET", key, NULL};
    return redis_num(args);
}

/* One payment as a JSON line (EUR; key: its order_id). */
static void payment(FILE *f, const char *mid, const char *order,
                    const char *user, const char *amount)
{
    fprintf(f,
            "{\"message_id\":\"00000000-0000-4000-8000-%012d\","
            "\"idempotency_key\":\"payment-%s\",\"order_id\":\"%s\","
            "\"user_id\":\"%s\",\"amount\":%s,\"currency\":\"EUR\"}\n",
            atoi(mid), order, order, user, amount);
}

/* Sends the lines of `text` (a JSON line each) to payments, keyed by
 * order_id. */
static void produce_text(const char *name, const char *text)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/%s.jsonl", stk.dir, name);
    cr_assert_eq(th_write_file(path, text), 0);
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    stk.broker.bootstrap,
                    "-t",
                    "payments",
                    "--input",
                    path,
                    NULL};
    char *err = NULL;
    int rc = th_run(argv, NULL, &err, 60000);
    cr_assert_eq(rc, 0, "produce: %s", err);
    free(err);
}

/* Builds lines with payment() into a memory buffer, then sends them. */
#define PRODUCE_LINES(name, ...)                                               \
    do {                                                                       \
        char *buf_ = NULL;                                                     \
        size_t len_ = 0;                                                       \
        FILE *f_ = open_memstream(&buf_, &len_);                               \
        cr_assert(f_);                                                         \
        __VA_ARGS__;                                                           \
        fclose(f_);                                                            \
        produce_text((name), buf_);                                            \
        free(buf_);                                                            \
    } while (0)

/* The dead letters' values (a record per line; caller frees). */
static th_recs_t dead_letters(void)
{
    return th_topic_read(stk.broker.bootstrap, "payments.dlq");
}

/* A zombie owner: member A is stopped (SIGSTOP) with records in hand while
 * traffic flows, past the session timeout; B takes every partition (a new
 * epoch each) and applies; then A runs again and sends what it held under
 * its old epoch. The chunk script must refuse it (FENCED): nothing is
 * applied twice, the ledger is exact. */
Test(partscope, zombie_owner_is_fenced, .timeout = 300)
{
    const char *props[] = {PARTSCOPE_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    stk.broker.bootstrap,
                    "-t",
                    "payments",
                    "--expect",
                    stk.expect,
                    "--count",
                    "16000",
                    "--duplicates",
                    "0.1",
                    "--seed",
                    "2424",
                    "--rate",
                    "1500",
                    NULL};
    pid_t prod = th_spawn(argv, NULL, NULL, NULL);
    cr_assert_gt(prod, 0);
    pid_t a = member("ma");
    cr_assert_eq(th_stack_wait_applied(&stk, 1500, 90000), 0);
    cr_assert_eq(kill(a, SIGSTOP), 0);
    long at_stop = th_stack_applied(&stk);
    long epochs_before = 0;
    for (int p = 0; p < 4; p++)
        epochs_before += epoch_of(p);
    cr_expect_geq(epochs_before, 4, "A bumped no epoch at assignment");

    pid_t b = member("mb");
    /* B owns the partitions once A's session expired (6 s). */
    cr_assert_eq(th_stack_wait_applied(&stk, at_stop + 3000, 120000), 0,
                 "B never took over from the stopped A");
    for (int p = 0; p < 4; p++)
        cr_expect_geq(epoch_of(p), 2, "partition %d: no new owner epoch", p);
    cr_assert_eq(kill(a, SIGCONT), 0);

    cr_assert_eq(th_wait(prod, 120000), 0, "produce failed");
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 150000);
    cr_expect_gt(partscope_keys(), 0, "no partition-scoped state in Redis");
    cr_log_info("A's log: %d fenced", th_stack_log_count(&stk, "ma", "fenced"));
    cr_expect_eq(th_stack_stop_member(&stk, "mb", b, 15000), 0);
    cr_expect_eq(th_stack_stop_member(&stk, "ma", a, 15000), 0);
    th_stack_stop(&stk);
}

/* AOF on with an fsync per write, the first rewrite done. */
static void aof_on(th_redis_t *r)
{
    const char *aof[] = {"CONFIG", "SET", "appendonly", "yes", NULL};
    th_redis_ok(r, aof);
    const char *fsync[] = {"CONFIG", "SET", "appendfsync", "always", NULL};
    th_redis_ok(r, fsync);
    for (int t = 0; t < 100; t++) {
        if (th_redis_info(r, "aof_rewrite_in_progress") == 0 &&
            th_redis_info(r, "aof_rewrite_scheduled") == 0)
            break;
        usleep(100000);
    }
    r->extra[0] = "--appendonly";
    r->extra[1] = "yes";
    r->extra[2] = "--appendfsync";
    r->extra[3] = "always";
}

/* kill -9, then the newest incr AOF cut in the middle of its last HINCRBY
 * (a torn write: that chunk's effects, marks and position are lost), then
 * a restart from the AOF on the same port. Returns the bytes cut. */
static long redis_crash_cut_tail(th_redis_t *r)
{
    kill(r->pid, SIGKILL);
    th_wait(r->pid, 5000);
    r->pid = 0;
    char adir[600], path[900] = "";
    snprintf(adir, sizeof(adir), "%s/appendonlydir", r->dir);
    DIR *d = opendir(adir);
    cr_assert(d, "no %s", adir);
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *at = strstr(e->d_name, ".aof.");
        if (!at || !strstr(e->d_name, ".incr.aof"))
            continue;
        if (atol(at + 5) > best) {
            best = atol(at + 5);
            snprintf(path, sizeof(path), "%s/%s", adir, e->d_name);
        }
    }
    closedir(d);
    cr_assert_geq(best, 0, "no incr AOF in %s", adir);
    size_t len = 0;
    char *buf = th_slurp(path, &len);
    cr_assert(buf, "cannot read %s", path);
    const char *needle = "$7\r\nHINCRBY\r\n";
    long last = -1;
    for (const char *p = buf;
         (p = memmem(p, len - (size_t)(p - buf), needle, strlen(needle))); p++)
        last = p - buf;
    free(buf);
    cr_assert_geq(last, 0, "no HINCRBY in %s", path);
    long cut = last + 6; /* inside the command's name */
    cr_assert_eq(truncate(path, cut), 0);
    cr_assert_eq(th_redis_restart(r), 0);
    return (long)len - cut;
}

/* The member's idemproc_redis_position_behind_total. */
static double behind_total(int port)
{
    char *body = NULL;
    cr_assert_eq(th_http_get(port, "/metrics", &body), 200);
    double v = th_metric(body, "idemproc_redis_position_behind_total");
    free(body);
    return v;
}

/* Redis killed with its AOF's tail cut, twice: once while the member
 * works, once when it is idle (every record committed in Kafka). The
 * member still holds marks of records whose effects Redis lost: it must
 * drop its table and load it again from Redis (whose run_id changed), go
 * back to Redis's position and apply those records again. Exact after
 * each, and after a third, clean restart. */
Test(partscope, aof_tail_lost_twice_table_reloaded, .timeout = 360)
{
    const char *props[] = {PARTSCOPE_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    aof_on(&stk.redis);
    const char *traffic[] = {
        "--count", "12000", "--duplicates", "0.1", "--seed", "2425", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    long unique = th_stack_expect_unique(&stk);
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *extra[] = {listen, NULL};
    pid_t m = th_stack_member_started(&stk, "m1", extra);
    cr_assert_eq(th_stack_wait_applied(&stk, unique / 3, 90000), 0);

    cr_log_info("cut %ld bytes", redis_crash_cut_tail(&stk.redis));
    long after = th_stack_applied(&stk);
    cr_expect_lt(after, unique, "Redis lost nothing: the test proves nothing");
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 150000);
    /* (A cut while the member works may take only what Redis never
     * acknowledged: no loss to report yet.) */
    double lost_before = behind_total(port);
    cr_expect_gt(partscope_keys(), 0, "no partition-scoped state in Redis");

    /* Idle now: the cut takes effects whose records Kafka has as
     * committed, and whose marks the member holds. */
    wait_committed(2, 60000);
    long before = th_stack_applied(&stk);
    cr_log_info("cut %ld bytes", redis_crash_cut_tail(&stk.redis));
    cr_expect_lt(th_stack_applied(&stk), before,
                 "the second cut lost no effect: the test proves nothing");
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 150000);
    /* This one took acknowledged writes: reported (alert
     * IdemprocRedisWentBackInTime), whether the reconnect check or a
     * table's load found it. */
    double lost = behind_total(port);
    cr_expect_gt(lost, lost_before, "idemproc_redis_position_behind_total %g",
                 lost);

    cr_assert_eq(th_redis_kill(&stk.redis), 0); /* and cleanly */
    cr_assert_eq(th_redis_restart(&stk.redis), 0);
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 150000);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Marks live dedup.ttl.seconds (plus at most one window, TTL / 8): a
 * duplicate inside the TTL is not applied, one after it is applied again,
 * as docs/guarantees.md says of the dedup window. */
Test(partscope, window_expiry_applies_a_late_duplicate_again, .timeout = 180)
{
    /* 30 s: the duplicates must be read inside it even on a slow
     * (sanitizer) build under load, or nothing is proved */
    const char *props[] = {PARTSCOPE_PROPS, "dedup.ttl.seconds=30", NULL};
    cr_assert_eq(th_stack_start(&stk, 1, props), 0);
    pid_t m = member("m1");
    PRODUCE_LINES("first", payment(f_, "1", "ORD-1", "user-1", "10.00"));
    cr_assert_eq(th_stack_wait_applied(&stk, 1, 90000), 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    /* Inside the TTL: a redelivery and a resend, not applied. */
    PRODUCE_LINES("inside", payment(f_, "1", "ORD-1", "user-1", "10.00");
                  payment(f_, "2", "ORD-1", "user-1", "10.00"));
    wait_committed(1, 60000);
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_lt(t1.tv_sec - t0.tv_sec, 28,
                 "the duplicates took longer than the TTL to be read: "
                 "nothing proved");
    cr_expect_eq(th_stack_applied(&stk), 1);
    expect_balance("user-1", "1000");
    cr_expect_gt(partscope_keys(), 0, "no partition-scoped state in Redis");

    /* After TTL + one window (30 + 3 s) and a margin: applied again. */
    sleep(36);
    PRODUCE_LINES("after", payment(f_, "3", "ORD-1", "user-1", "10.00"));
    cr_expect_eq(th_stack_wait_applied(&stk, 2, 60000), 0,
                 "a duplicate after the TTL was not applied again");
    wait_committed(1, 60000);
    cr_expect_eq(th_stack_applied(&stk), 2);
    expect_balance("user-1", "2000");
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Returns how many of the records hold `text` in their value. */
static size_t recs_with(const th_recs_t *r, const char *text)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += memmem(r->v[i].value, r->v[i].len, text, strlen(text)) != NULL;
    return n;
}

/* One chunk holds a record whose increment Redis refuses (user-bad's
 * balance is not an integer) and its redelivery and resend, beside a
 * good record with its own duplicates. The refused record and its
 * duplicates apply nothing (the table takes back the mark it added for
 * them); the good ones apply once. A second member, whose table is loaded
 * from Redis, then reads more copies of both: still nothing twice. */
Test(partscope, chunk_duplicates_with_a_refused_increment, .timeout = 180)
{
    const char *props[] = {PARTSCOPE_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 1, props), 0);
    const char *bad[] = {"HSET", "idemproc:ledger:EUR", "user-bad",
                         "not-a-number", NULL};
    free(th_redis_cli(&stk.redis, bad));
    PRODUCE_LINES("chunk", payment(f_, "1", "ORD-A", "user-bad", "5.00");
                  payment(f_, "10", "ORD-G", "user-good", "1.00");
                  payment(f_, "1", "ORD-A", "user-bad", "5.00");
                  payment(f_, "2", "ORD-A", "user-bad", "5.00");
                  payment(f_, "10", "ORD-G", "user-good", "1.00");
                  payment(f_, "11", "ORD-G", "user-good", "1.00");
                  payment(f_, "20", "ORD-H", "user-good", "2.00"));
    pid_t m = member("m1");
    wait_committed(1, 60000);
    cr_expect_eq(th_stack_applied(&stk), 2);
    expect_balance("user-good", "300");
    expect_balance("user-bad", "not-a-number");
    th_recs_t dl = dead_letters();
    cr_expect_geq(dl.n, 1, "the refused record was not dead-lettered");
    cr_expect_eq(recs_with(&dl, "payment-ORD-A"), dl.n,
                 "a dead letter that is not the refused record's");
    th_recs_free(&dl);
    cr_expect_gt(partscope_keys(), 0, "no partition-scoped state in Redis");
    cr_expect_eq(th_stop(m, 15000), 0);

    /* A new member loads the table from Redis: G and H are held, A is not
     * (or held as moved): more copies apply nothing. */
    PRODUCE_LINES("again", payment(f_, "12", "ORD-G", "user-good", "1.00");
                  payment(f_, "20", "ORD-H", "user-good", "2.00");
                  payment(f_, "3", "ORD-A", "user-bad", "5.00"));
    m = member("m2");
    wait_committed(1, 60000);
    cr_expect_eq(th_stack_applied(&stk), 2);
    expect_balance("user-good", "300");
    expect_balance("user-bad", "not-a-number");
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* A record dead-lettered because its increment was refused, replayed with
 * `dlq replay` after the fix, is applied once (its copy finds no mark and
 * writes the global one); an `offsets reset --to-earliest` afterwards
 * reads the original and the copy again: neither applies twice. */
Test(partscope, dlq_replay_then_reset_applies_once, .timeout = 240)
{
    const char *props[] = {PARTSCOPE_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    const char *bad[] = {"HSET", "idemproc:ledger:EUR", "user-bad",
                         "not-a-number", NULL};
    free(th_redis_cli(&stk.redis, bad));
    PRODUCE_LINES("first", payment(f_, "1", "ORD-A", "user-bad", "7.00");
                  payment(f_, "10", "ORD-G", "user-good", "1.00");
                  payment(f_, "11", "ORD-G", "user-good", "1.00");
                  payment(f_, "20", "ORD-H", "user-good", "2.00"));
    pid_t m = member("m1");
    wait_committed(2, 60000);
    cr_expect_eq(th_stack_applied(&stk), 2);
    th_recs_t dl = dead_letters();
    cr_assert_eq(dl.n, 1, "one dead letter: the refused record");
    cr_expect_eq(recs_with(&dl, "payment-ORD-A"), 1);
    th_recs_free(&dl);
    cr_expect_gt(partscope_keys(), 0, "no partition-scoped state in Redis");

    /* The fix, then the replay. */
    const char *fix[] = {"HDEL", "idemproc:ledger:EUR", "user-bad", NULL};
    free(th_redis_cli(&stk.redis, fix));
    char *out = NULL, *err = NULL;
    cr_assert_eq(cli("dlq", "replay", NULL, &out, &err), 0, "%s\n%s", out, err);
    free(out);
    free(err);
    cr_assert_eq(th_stack_wait_applied(&stk, 3, 60000), 0,
                 "the replayed record was not applied");
    wait_committed(2, 60000);
    expect_balance("user-bad", "700");
    expect_balance("user-good", "300");

    /* The copy went to the original's partition. */
    th_recs_t in = th_topic_read(stk.broker.bootstrap, "payments");
    int32_t part = -1;
    size_t copies = 0;
    for (size_t i = 0; i < in.n; i++) {
        if (!memmem(in.v[i].value, in.v[i].len, "payment-ORD-A", 13))
            continue;
        copies++;
        if (part < 0)
            part = in.v[i].partition;
        cr_expect_eq(in.v[i].partition, part,
                     "the replayed copy left the original's partition");
    }
    cr_expect_eq(copies, 2, "the original and its replayed copy");
    th_recs_free(&in);
    cr_expect_eq(th_stop(m, 15000), 0);

    /* Everything read again: the original (moved) and the copy find the
     * global mark, the others their partition's marks. */
    const char *earliest[] = {"--to-earliest", "--execute", NULL};
    cr_assert_eq(cli("offsets", "reset", earliest, &out, &err), 0, "%s\n%s",
                 out, err);
    free(out);
    free(err);
    m = member("m2");
    wait_committed(2, 60000);
    cr_expect_eq(th_stack_applied(&stk), 3);
    expect_balance("user-bad", "700");
    expect_balance("user-good", "300");
    dl = dead_letters();
    cr_expect_eq(dl.n, 1, "the replay or the re-read was dead-lettered");
    th_recs_free(&dl);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* The input's partition count is recorded in Redis by the first member;
 * one that finds another count recorded (here: 2 recorded, the topic has
 * 4, as after partitions were added) applies nothing, is not ready, and
 * says so naming topic and counts. Once the operator records the current
 * count, the same member goes on and applies each record once. */
Test(partscope, changed_input_partition_count_holds_the_topic, .timeout = 180)
{
    const char *props[] = {PARTSCOPE_PROPS, NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    const char *key = "idemproc:st{test-group:payments}:partitions";
    const char *set2[] = {"SET", key, "2", NULL};
    th_redis_ok(&stk.redis, set2);
    PRODUCE_LINES("first", payment(f_, "1", "ORD-1", "user-1", "10.00");
                  payment(f_, "2", "ORD-2", "user-2", "20.00");
                  payment(f_, "3", "ORD-3", "user-3", "30.00");
                  payment(f_, "1", "ORD-1", "user-1", "10.00"));
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *sets[] = {listen, NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);
    cr_assert_gt(m, 0);
    const char *said = "input partition count changed";
    for (int t = 0; t < 600 && th_stack_log_count(&stk, "m1", said) < 1; t++)
        usleep(100000);
    char *log = th_stack_member_log(&stk, "m1");
    cr_assert_eq(th_stack_log_count(&stk, "m1", said), 1, "%s", log ? log : "");
    cr_expect(log && strstr(log, "\"topic\":\"payments\"") &&
                  strstr(log, "\"recorded\":\"2\"") &&
                  strstr(log, "\"current\":\"4\""),
              "%s", log ? log : "");
    free(log);
    char *body = NULL;
    cr_expect_eq(th_wait_unready(port, "recorded in redis", 20000, &body), 503,
                 "%s", body ? body : "");
    free(body);
    /* Records in hand, none applied, no table loaded (no epoch taken),
     * and the record left as it was. */
    sleep(3);
    cr_expect_eq(th_stack_applied(&stk), 0);
    for (int p = 0; p < 4; p++)
        cr_expect_eq(epoch_of(p), 0, "partition %d loaded", p);
    const char *get[] = {"GET", key, NULL};
    cr_expect_eq(redis_num(get), 2);
    cr_expect_eq(th_stack_log_count(&stk, "m1", said), 1, "logged once");

    /* The operator records the current count: the member goes on. */
    const char *set4[] = {"SET", key, "4", NULL};
    th_redis_ok(&stk.redis, set4);
    if (th_stack_wait_applied(&stk, 3, 90000)) {
        log = th_stack_member_log(&stk, "m1");
        cr_assert_fail("not applied once the count was recorded:\n%s",
                       log ? log : "");
    }
    wait_committed(4, 90000);
    cr_expect_eq(th_stack_applied(&stk), 3);
    expect_balance("user-1", "1000");
    expect_balance("user-2", "2000");
    expect_balance("user-3", "3000");
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* A member's /metrics (GET must answer 200) value of `name`; -1 absent. */
static double member_metric(int port, const char *name)
{
    char *body = NULL;
    cr_assert_eq(th_http_get(port, "/metrics", &body), 200);
    double v = th_metric(body, name);
    free(body);
    return v;
}

/* The first member records the count it sees, and its tables' gauges say
 * what they hold: one mark per applied record of its partitions. */
Test(partscope, first_member_records_the_input_partition_count, .timeout = 120)
{
    const char *props[] = {PARTSCOPE_PROPS, "dedup.memory.max=2097152", NULL};
    cr_assert_eq(th_stack_start(&stk, 3, props), 0);
    int port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *sets[] = {listen, NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);
    cr_assert_gt(m, 0);
    PRODUCE_LINES("first", payment(f_, "1", "ORD-1", "user-1", "10.00");
                  payment(f_, "2", "ORD-2", "user-2", "20.00"));
    cr_assert_eq(th_stack_wait_applied(&stk, 2, 90000), 0);
    const char *get[] = {"GET", "idemproc:st{test-group:payments}:partitions",
                         NULL};
    cr_expect_eq(redis_num(get), 3);
    /* The gauges are taken as offsets move: wait for the second mark. */
    double marks = -1;
    for (int t = 0; t < 100 && marks != 2; t++) {
        marks = member_metric(port, "idemproc_dedup_table_marks");
        if (marks != 2)
            usleep(100000);
    }
    cr_expect_eq(marks, 2);
    cr_expect_gt(member_metric(port, "idemproc_dedup_table_bytes"), 0);
    cr_expect_eq(member_metric(port, "idemproc_dedup_memory_max_bytes"),
                 2097152);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Writes the member's resident set, as dev.fault.member.rss.file makes it
 * read it, into path. */
static void rss_write(const char *path, long long bytes)
{
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    cr_assert(f);
    fprintf(f, "%lld\n", bytes);
    fclose(f);
    cr_assert_eq(rename(tmp, path), 0); /* never read half written */
}

/* Polls a member's metric until it equals want (30 s at most). */
static double wait_metric(int port, const char *name, double want)
{
    double v = -1;
    for (int t = 0; t < 300 && v != want; t++) {
        v = member_metric(port, name);
        if (v != want)
            usleep(100000);
    }
    return v;
}

/* member.memory.max: over the bound the input pauses (gauge, counter, one
 * log line) and nothing new is applied; under the bound but not yet a
 * prefetch queue under it, still paused; well under, the waiting record
 * is applied once. The resident set is read from a file the test writes
 * (dev.fault.member.rss.file): the bound must be one the start check
 * accepts (1 MiB tables + 2 x 1 MiB queue + 4 x 100 x 2 KiB + 32 MiB =
 * 37,519,360 B), which the member's real RSS does not pass on its own. */
Test(partscope, member_memory_max_pauses_the_input_until_rss_is_under,
     .timeout = 180)
{
    const char *props[] = {PARTSCOPE_PROPS, "dedup.memory.max=1048576",
                           "kafka.queued.max.messages.kbytes=1024",
                           "member.memory.max=40000000", NULL};
    cr_assert_eq(th_stack_start(&stk, 1, props), 0);
    char rss[512], rss_set[600], listen[64];
    snprintf(rss, sizeof(rss), "%s/rss", stk.dir);
    snprintf(rss_set, sizeof(rss_set), "dev.fault.member.rss.file=%s", rss);
    rss_write(rss, 1000);
    int port = th_free_port();
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", port);
    const char *sets[] = {listen, rss_set, NULL};
    pid_t m = th_stack_member_started(&stk, "m1", sets);
    PRODUCE_LINES("first", payment(f_, "1", "ORD-1", "user-1", "10.00"));
    cr_assert_eq(th_stack_wait_applied(&stk, 1, 90000), 0);
    cr_expect_eq(member_metric(port, "idemproc_member_memory_max_bytes"),
                 40000000);
    cr_expect_eq(member_metric(port, "idemproc_member_memory_paused"), 0);

    rss_write(rss, 50000000);
    cr_assert_eq(wait_metric(port, "idemproc_member_memory_paused", 1), 1);
    PRODUCE_LINES("second", payment(f_, "2", "ORD-2", "user-2", "20.00"));
    sleep(3); /* applied in milliseconds when the input is not paused */
    cr_expect_eq(th_stack_applied(&stk), 1, "applied while over the bound");

    rss_write(rss, 39500000); /* under 40 MB, over 40 MB - 1 MiB */
    sleep(1);
    cr_expect_eq(member_metric(port, "idemproc_member_memory_paused"), 1);
    cr_expect_eq(th_stack_applied(&stk), 1);

    rss_write(rss, 1000);
    cr_expect_eq(th_stack_wait_applied(&stk, 2, 60000), 0);
    cr_expect_eq(member_metric(port, "idemproc_member_memory_paused"), 0);
    cr_expect_eq(member_metric(port, "idemproc_member_memory_pauses_total"), 1);
    cr_expect_eq(th_stack_log_count(&stk, "m1",
                                    "member.memory.max reached: pausing input"),
                 1);
    wait_committed(1, 60000);
    cr_expect_eq(th_stop(m, 15000), 0);
    expect_balance("user-1", "1000");
    expect_balance("user-2", "2000");
    th_stack_stop(&stk);
}
