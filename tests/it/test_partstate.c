/* test_partstate (it): the partition layout's Redis side against a real
 * redis-server: the chunk script applies the ledger's effect with its
 * marks and position; a stale epoch (FENCED) and a position that differs
 * (POSITION) write nothing; the loader reads a partition's live window
 * keys back in pieces; a window's key expires at its end plus the TTL;
 * chunks of several partitions go in one script call, a refused
 * partition writing nothing and the others applied; a refused increment
 * leaves a "moved" mark; the global script, composed from the same effect,
 * still marks per identity. */
#include "conf/conf.h"
#include "fixture_redisconn.h"
#include "harness.h"
#include "partrig.h"
#include "redis/partstate.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_redis_t rds;
static idem_conf_t *conf;
static idem_store_t *store;
static idem_partstate_t *ps;
static redisContext *cli;

extern const char idem_ledger_lua[];
extern const size_t idem_ledger_lua_len;

typedef th_trec_t trec_t;

/* Redis, a store with the ledger's effect and the partition layout, for
 * group g with dedup.ttl.seconds ttl, and one more setting extra (NULL:
 * none). */
static void start_with(const char *ttl, const char *extra)
{
    quiet();
    cr_assert_eq(th_redis_start(&rds), 0);
    char url[128], t[64], err[512] = "";
    snprintf(url, sizeof(url), "redis.url=%s", rds.url);
    snprintf(t, sizeof(t), "dedup.ttl.seconds=%s", ttl);
    char *sets[] = {url,
                    "group.id=g",
                    "handler=ledger",
                    "input.topics=t",
                    "dlq.topic=d",
                    "kafka.bootstrap.servers=127.0.0.1:1",
                    t,
                    (char *)extra};
    conf = idem_conf_load(NULL, NULL, sets, extra ? 8 : 7, err, sizeof(err));
    cr_assert(conf, "%s", err);
    th_partrig_start(conf, &store, &ps);
    cli = redisConnect("127.0.0.1", rds.port);
    cr_assert(cli && !cli->err);
    /* the chunk script runs only under the partition layout (the layout
     * key; tests/it/test_layout.c has its refusals) */
    freeReplyObject(redisCommand(
        cli, "HSET idemproc:layout:g layout partition since 0 from partition"));
}

static void start(const char *ttl)
{
    start_with(ttl, NULL);
}

static void fini(void)
{
    if (cli)
        redisFree(cli);
    cli = NULL;
    idem_partstate_destroy(ps);
    ps = NULL;
    idem_store_destroy(store);
    store = NULL;
    idem_conf_destroy(conf);
    conf = NULL;
    if (rds.dir)
        th_redis_stop(&rds);
}

TestSuite(partstate, .fini = fini, .timeout = 60);

/* A command's reply on cli as text (partrig.h). */
static char *q(const char *fmt, const char *a, const char *b)
{
    return th_reply_text(cli, fmt, a, b);
}

static void first_position(int64_t off)
{
    th_partrig_first_position(store, 0, off);
}

#define mark_of th_mark_of

static int64_t last_window = -1; /* the last chunk's, as Redis answered */

/* Runs a chunk of t:0: n records of trecs with marks seeded from seed0. */
static int chunk(int64_t epoch, int64_t expect, int64_t newoff,
                 const trec_t *recs, size_t n, int seed0,
                 idem_partstate_result_t *res, char *err, size_t errsz)
{
    int64_t w;
    int rc = th_partrig_chunk(ps, 0, epoch, expect, newoff, recs, n, seed0, res,
                              &w, err, errsz);
    if (rc == 0)
        last_window = w;
    return rc;
}

typedef struct {
    uint8_t *buf;
    size_t n, calls;
    int64_t window;
} loaded_t;

static int collect(const uint8_t *marks, size_t n, int64_t window, void *opaque)
{
    loaded_t *l = opaque;
    l->buf = realloc(l->buf, (l->n + n) * 16);
    memcpy(l->buf + l->n * 16, marks, n * 16);
    l->n += n;
    l->calls++;
    l->window = window;
    return 0;
}

/* The window key of t:0 for Redis's clock now (its window) into buf;
 * shift: windows later. */
static void window_key(char *buf, size_t size, int64_t shift)
{
    char err[512];
    int64_t now = 0;
    cr_assert_eq(idem_partstate_now(ps, &now, err, sizeof(err)), 0, "%s", err);
    snprintf(buf, size, "idemproc:st{g:t:0}:w%" PRId64,
             now / idem_partstate_window_seconds(ps) + shift);
}

static const trec_t three[] = {
    {"id-1", "m-1", "EUR", "u1", "150"},
    {"id-2", "m-2", "EUR", "u2", "200"},
    {"id-3", "m-3", "USD", "u1", "-25"},
};

Test(partstate, chunk_applies_effect_marks_and_position)
{
    start("86400");
    char err[512];
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0,
        "%s", err);
    cr_assert_eq(epoch, 1);
    first_position(100);
    idem_partstate_result_t res[3];
    cr_assert_eq(chunk(epoch, 100, 103, three, 3, 1, res, err, sizeof(err)), 0,
                 "%s", err);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(res[i].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u1", NULL), "150");
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u2", NULL), "200");
    cr_expect_str_eq(q("HGET idemproc:ledger:USD %s", "u1", NULL), "-25");
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "3");
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "103 c1", 6));
    /* no global marks: the partition's chunk holds them */
    cr_expect_str_eq(q("EXISTS idemproc:dedup:g:id-1", NULL, NULL), "0");
    /* one key per window: no index, no sequence */
    char key[256];
    window_key(key, sizeof(key), 0);
    cr_expect_str_eq(q("STRLEN %s", key, NULL), "48");
    long long ttl = atoll(q("TTL %s", key, NULL));
    cr_expect(ttl > 86400 && ttl <= 86400 + 86400 / 8, "ttl %lld", ttl);
    cr_expect_str_eq(q("EXISTS %s", "idemproc:st{g:t:0}:idx", NULL), "0");
    cr_expect_str_eq(q("EXISTS %s", "idemproc:st{g:t:0}:seq", NULL), "0");
    /* the next chunk of the window appends to it, its expiry unchanged */
    long long at = atoll(q("EXPIRETIME %s", key, NULL));
    cr_assert_eq(chunk(epoch, 103, 104, three, 1, 7, res, err, sizeof(err)), 0,
                 "%s", err);
    char key2[256];
    window_key(key2, sizeof(key2), 0);
    if (!strcmp(key, key2)) { /* not across a window's end */
        cr_expect_str_eq(q("STRLEN %s", key, NULL), "64");
        cr_expect_eq(atoll(q("EXPIRETIME %s", key, NULL)), at);
    }
    loaded_t l = {0};
    cr_assert_eq(
        idem_partstate_load(ps, "t", 0, 0, collect, &l, NULL, err, sizeof(err)),
        0, "%s", err);
    cr_assert_eq(l.n, 4);
    for (int i = 0; i < 4; i++) {
        uint8_t m[16];
        mark_of(m, i < 3 ? 1 + i : 7);
        cr_expect_arr_eq(l.buf + i * 16, m, 16);
    }
    int64_t now = 0;
    cr_assert_eq(idem_partstate_now(ps, &now, err, sizeof(err)), 0);
    cr_expect_eq(l.window, now / idem_partstate_window_seconds(ps));
    free(l.buf);
}

Test(partstate, stale_epoch_is_fenced_and_writes_nothing)
{
    start("86400");
    char err[512];
    int64_t old = 0, cur = 0;
    cr_assert_eq(idem_partstate_epoch_bump(ps, "t", 0, &old, err, sizeof(err)),
                 0);
    first_position(0);
    idem_partstate_result_t res[3];
    cr_assert_eq(chunk(old, 0, 1, three, 1, 1, res, err, sizeof(err)), 0, "%s",
                 err);
    /* a new owner bumps the epoch: the old owner's next chunk is refused */
    cr_assert_eq(idem_partstate_epoch_bump(ps, "t", 0, &cur, err, sizeof(err)),
                 0);
    cr_assert_eq(cur, old + 1);
    cr_expect_eq(chunk(old, 1, 3, three + 1, 2, 2, res, err, sizeof(err)),
                 IDEM_PARTSTATE_FENCED);
    cr_expect(strstr(err, "FENCED"), "%s", err);
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u2", NULL), "");
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "1");
    char key[256];
    window_key(key, sizeof(key), 0);
    cr_expect_str_eq(q("STRLEN %s", key, NULL), "16"); /* the first's mark */
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "1 ", 2));
    /* the connection stays usable, and the owner's chunk goes through */
    cr_expect_eq(chunk(cur, 1, 3, three + 1, 2, 2, res, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "3");
}

Test(partstate, position_other_than_expected_writes_nothing)
{
    start("86400");
    char err[512];
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0);
    idem_partstate_result_t res[3];
    /* no position at all (Redis lost it with everything after it) */
    cr_expect_eq(chunk(epoch, 50, 53, three, 3, 1, res, err, sizeof(err)),
                 IDEM_PARTSTATE_POSITION);
    cr_expect(strstr(err, "holds none"), "%s", err);
    /* a position behind the member's (a lost tail) */
    first_position(40);
    cr_expect_eq(chunk(epoch, 50, 53, three, 3, 1, res, err, sizeof(err)),
                 IDEM_PARTSTATE_POSITION);
    cr_expect(strstr(err, "redis holds 40"), "%s", err);
    cr_expect_str_eq(q("EXISTS idemproc:ledger:EUR", NULL, NULL), "0");
    cr_expect_str_eq(q("EXISTS idemproc:ledger:applied", NULL, NULL), "0");
    char key[256];
    window_key(key, sizeof(key), 0);
    cr_expect_str_eq(q("EXISTS %s", key, NULL), "0");
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "40 ", 3));
    cr_expect_eq(chunk(epoch, 40, 43, three, 3, 1, res, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "3");
}

Test(partstate, loader_reads_a_partition_in_pieces)
{
    start("86400");
    char err[512];
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0);
    first_position(0);
    enum { CHUNKS = 4, PER_CHUNK = 700 };
    trec_t *recs = calloc(PER_CHUNK, sizeof(*recs));
    static char ids[PER_CHUNK][16];
    for (int i = 0; i < PER_CHUNK; i++) {
        snprintf(ids[i], sizeof(ids[i]), "i%d", i);
        recs[i] = (trec_t){ids[i], ids[i], "EUR", "u9", "1"};
    }
    idem_partstate_result_t *res = calloc(PER_CHUNK, sizeof(*res));
    for (int c = 0; c < CHUNKS; c++)
        cr_assert_eq(chunk(epoch, c * PER_CHUNK, (c + 1) * PER_CHUNK, recs,
                           PER_CHUNK, c * PER_CHUNK, res, err, sizeof(err)),
                     0, "%s", err);
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u9", NULL), "2800");
    /* The chunks appended to one window key (unless a window's end fell
     * between them): 2,800 marks, 44,800 bytes */
    char key[256];
    window_key(key, sizeof(key), 0);
    int one_window =
        atoll(q("STRLEN %s", key, NULL)) == CHUNKS * PER_CHUNK * 16;
    /* An older window that still lives, read first; one that cannot live
     * any more (past its window's end plus the TTL) is not read even when
     * Redis still holds it */
    uint8_t old[2][16];
    mark_of(old[0], 5000);
    mark_of(old[1], 5001);
    char live[256], dead[256];
    window_key(live, sizeof(live), -8);
    window_key(dead, sizeof(dead), -10);
    redisReply *r = redisCommand(cli, "SET %s %b", live, old, sizeof(old));
    freeReplyObject(r);
    r = redisCommand(cli, "SET %s %b", dead, old, sizeof(old));
    freeReplyObject(r);
    /* pieces of 4 KiB: 11 of the current window, 1 of the older one */
    loaded_t l = {0};
    size_t pieces = 0;
    cr_assert_eq(idem_partstate_load(ps, "t", 0, 4096, collect, &l, &pieces,
                                     err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(l.n, 2 + CHUNKS * PER_CHUNK);
    if (one_window) {
        cr_expect_eq(pieces, 12);
        cr_expect_eq(l.calls, 12);
    }
    cr_expect_arr_eq(l.buf, old, sizeof(old));
    for (int i = 0; i < CHUNKS * PER_CHUNK && i + 2 < (int)l.n; i++) {
        uint8_t m[16];
        mark_of(m, i);
        cr_assert_arr_eq(l.buf + (i + 2) * 16, m, 16, "mark %d", i);
    }
    /* a piece size that is not whole marks is rounded down to them */
    loaded_t l2 = {0};
    cr_assert_eq(idem_partstate_load(ps, "t", 0, 1000, collect, &l2, &pieces,
                                     err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(l2.n, 2 + CHUNKS * PER_CHUNK);
    free(l.buf);
    free(l2.buf);
    free(recs);
    free(res);
}

Test(partstate, chunks_expire_at_window_end_plus_ttl)
{
    start("2"); /* window 1 s: a chunk lives 2-3 s */
    cr_assert_eq(idem_partstate_window_seconds(ps), 1);
    char err[512];
    int64_t epoch = 0, now = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0);
    first_position(0);
    idem_partstate_result_t res[3];
    /* Redis's clock before the write: the chunk's window is not earlier */
    int64_t before = 0;
    cr_assert_eq(idem_partstate_now(ps, &before, err, sizeof(err)), 0);
    cr_assert_eq(chunk(epoch, 0, 3, three, 3, 1, res, err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(idem_partstate_now(ps, &now, err, sizeof(err)), 0);
    char key[256];
    int64_t w = last_window;
    snprintf(key, sizeof(key), "idemproc:st{g:t:0}:w%" PRId64, w);
    cr_expect_str_eq(q("STRLEN %s", key, NULL), "48");
    long long at = atoll(q("EXPIRETIME %s", key, NULL));
    cr_expect_eq(at, idem_partstate_window_end(ps, w));
    cr_expect_geq(at, before + 2); /* never less than the TTL */
    loaded_t l = {0};
    cr_assert_eq(
        idem_partstate_load(ps, "t", 0, 0, collect, &l, NULL, err, sizeof(err)),
        0);
    cr_expect_eq(l.n, 3);
    /* past the window's end plus the TTL, Redis's clock: gone. TIME is
     * whole seconds and a key expires once the clock is past its
     * millisecond, so wait for the second after `at` (at == now can still
     * be at's first millisecond, when the key lives) */
    for (int i = 0; i < 100 && now <= at; i++) {
        usleep(100 * 1000);
        cr_assert_eq(idem_partstate_now(ps, &now, err, sizeof(err)), 0);
    }
    cr_assert_gt(now, at);
    loaded_t l2 = {0};
    cr_assert_eq(idem_partstate_load(ps, "t", 0, 0, collect, &l2, NULL, err,
                                     sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(l2.n, 0);
    cr_expect_str_eq(q("EXISTS %s", key, NULL), "0");
    /* the next chunk starts its own window's key, with its own expiry */
    cr_assert_eq(chunk(epoch, 3, 4, three, 1, 9, res, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_gt(last_window, w);
    snprintf(key, sizeof(key), "idemproc:st{g:t:0}:w%" PRId64, last_window);
    cr_expect_str_eq(q("STRLEN %s", key, NULL), "16");
    cr_expect_eq(atoll(q("EXPIRETIME %s", key, NULL)),
                 idem_partstate_window_end(ps, last_window));
    free(l.buf);
    free(l2.buf);
}

Test(partstate, refused_increment_leaves_a_moved_mark)
{
    start("86400");
    freeReplyObject(
        redisCommand(cli, "HSET idemproc:ledger:EUR u1 9223372036854775807"));
    char err[512];
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0);
    first_position(0);
    /* u1 overflows (both of its records); u2 applies; the third record's
     * mark is sent as "moved" (it left the partition): no effect */
    const trec_t recs[] = {
        {"id-1", "m-1", "EUR", "u1", "1"},
        {"id-2", "m-2", "EUR", "u2", "5"},
        {"id-3", "m-3", "EUR", "u1", "2"},
        {"id-4", "m-4", "EUR", "u2", "7"},
    };
    const void *rp[4] = {&recs[0], &recs[1], &recs[2], &recs[3]};
    uint8_t marks[4][16];
    for (int i = 0; i < 4; i++)
        mark_of(marks[i], 1 + i);
    marks[3][12] |= IDEM_PARTSTATE_MOVED;
    idem_partstate_chunk_t ch = {.topic = "t",
                                 .partition = 0,
                                 .epoch = epoch,
                                 .expect_offset = 0,
                                 .recs = rp,
                                 .marks = (const uint8_t(*)[16])marks,
                                 .n = 4};
    idem_partstate_result_t res[4];
    int64_t w;
    cr_assert_eq(idem_partstate_chunk(ps, &ch, res, &w, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_eq(res[0].outcome, IDEM_PARTSTATE_REJECTED);
    cr_expect(strstr(res[0].detail, "overflow"), "%s", res[0].detail);
    cr_expect_eq(res[1].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_eq(res[2].outcome, IDEM_PARTSTATE_REJECTED);
    cr_expect_eq(res[3].outcome, IDEM_PARTSTATE_MOVED_MARK);
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u2", NULL), "5");
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u1", NULL),
                     "9223372036854775807");
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "1");
    /* no position given: the stored one stays */
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "0 ", 2));
    loaded_t l = {0};
    cr_assert_eq(
        idem_partstate_load(ps, "t", 0, 0, collect, &l, NULL, err, sizeof(err)),
        0);
    cr_assert_eq(l.n, 4);
    for (int i = 0; i < 4; i++) {
        int moved = i != 1;
        cr_expect_arr_eq(l.buf + i * 16, marks[i], 12, "mark %d's hash", i);
        cr_expect_eq(!!(l.buf[i * 16 + 12] & IDEM_PARTSTATE_MOVED), moved,
                     "mark %d moved", i);
        if (!moved)
            cr_expect_arr_eq(l.buf + i * 16, marks[i], 16);
    }
    free(l.buf);
}

/* The global script is composed from the same effect: marks per identity,
 * a duplicate within the chunk answered with the first's message id. */
Test(partstate, global_script_shares_the_effect)
{
    start("86400");
    char err[512];
    /* the store registered the effect once; its script number is 2 (after
     * the claim and mark scripts): ask by registering none again */
    cr_expect_lt(
        idem_store_effect_register(store, idem_ledger_lua, idem_ledger_lua_len,
                                   5, th_trec_args, NULL, err, sizeof(err)),
        0);
    const trec_t recs[] = {
        {"id-1", "m-1", "EUR", "u1", "10"},
        {"id-1", "m-1b", "EUR", "u1", "10"},
        {"id-2", "m-2", "EUR", "u1", "5"},
    };
    const void *rp[3] = {&recs[0], &recs[1], &recs[2]};
    idem_store_result_t res[3];
    /* the key says partition (start()): the global script runs for the
     * records that take it under that layout */
    idem_store_effect_layout(store, "partition");
    cr_assert_eq(
        idem_store_script_send(store, 2, rp, 3, NULL, 0, err, sizeof(err)), 0,
        "%s", err);
    cr_assert_eq(idem_store_script_recv(store, 3, res, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_eq(res[0].mark, IDEM_MARK_NEW);
    cr_expect_eq(res[1].mark, IDEM_MARK_DONE);
    cr_expect_str_eq(res[1].prior_mid, "m-1");
    cr_expect_eq(res[2].mark, IDEM_MARK_NEW);
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u1", NULL), "15");
    cr_expect_str_eq(q("GET idemproc:dedup:g:id-1", NULL, NULL), "done:m-1");
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "2");
}

/* Chunks of several partitions in one write: each answered on its own (a
 * fenced one writes nothing, the others apply); after SCRIPT FLUSH a
 * single chunk loads the script again and applies. */
Test(partstate, pipelined_chunks_answer_each_partition)
{
    start("86400");
    char err[512];
    int64_t e0 = 0, e1 = 0, e1b = 0;
    cr_assert_eq(idem_partstate_epoch_bump(ps, "t", 0, &e0, err, sizeof(err)),
                 0);
    cr_assert_eq(idem_partstate_epoch_bump(ps, "t", 1, &e1, err, sizeof(err)),
                 0);
    cr_assert_eq(idem_partstate_epoch_bump(ps, "t", 1, &e1b, err, sizeof(err)),
                 0); /* partition 1 has a newer owner */
    first_position(0);
    idem_store_pos_t p1 = {.topic = "t", .partition = 1, .offset = 0};
    idem_posval_init(&p1.val, "c1");
    cr_assert_eq(idem_store_positions_save(store, &p1, 1, err, sizeof(err)), 0);
    const void *r0[] = {&three[0], &three[1]}, *r1[] = {&three[2]};
    uint8_t m0[2][16], m1[1][16];
    mark_of(m0[0], 1);
    mark_of(m0[1], 2);
    mark_of(m1[0], 3);
    idem_partstate_chunk_t ch[2] = {
        {.topic = "t",
         .partition = 0,
         .epoch = e0,
         .expect_offset = 0,
         .recs = r0,
         .marks = (const uint8_t(*)[16])m0,
         .n = 2},
        {.topic = "t",
         .partition = 1,
         .epoch = e1,
         .expect_offset = 0,
         .recs = r1,
         .marks = (const uint8_t(*)[16])m1,
         .n = 1},
    };
    idem_partstate_result_t res0[2], res1[1];
    idem_partstate_result_t *const res[2] = {res0, res1};
    int64_t w[2] = {-1, -1};
    int rcs[2] = {-1, -1};
    cr_assert_eq(
        idem_partstate_chunks(ps, ch, 2, res, w, rcs, err, sizeof(err)), 0,
        "%s", err);
    cr_expect_eq(rcs[0], 0);
    cr_expect_eq(rcs[1], IDEM_PARTSTATE_FENCED);
    cr_expect_geq(w[0], 0);
    cr_expect_eq(res0[0].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "2");
    cr_expect_str_eq(q("HGET idemproc:ledger:USD %s", "u1", NULL), "");
    /* scripts flushed: one chunk alone is loaded again and applied */
    freeReplyObject(redisCommand(cli, "SCRIPT FLUSH"));
    ch[1].epoch = e1b;
    int64_t w1;
    cr_assert_eq(idem_partstate_chunk(ps, &ch[1], res1, &w1, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(q("HGET idemproc:ledger:USD %s", "u1", NULL), "-25");
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "3");
}

/* Three chunks in one script call (one EVALSHA): two of partition 0 (the
 * first without a position, as a partition past one chunk's size sends
 * them) and one of partition 1 whose position Redis does not hold. The
 * refused partition writes nothing (no effect, no mark, no position); the
 * others apply, their marks appended in order to partition 0's window
 * key, and the positions written. */
Test(partstate, one_call_for_several_partitions)
{
    start("86400");
    char err[512];
    int64_t e0 = 0, e1 = 0;
    cr_assert_eq(idem_partstate_epoch_bump(ps, "t", 0, &e0, err, sizeof(err)),
                 0);
    cr_assert_eq(idem_partstate_epoch_bump(ps, "t", 1, &e1, err, sizeof(err)),
                 0);
    first_position(10);
    idem_store_pos_t p1 = {.topic = "t", .partition = 1, .offset = 5};
    idem_posval_init(&p1.val, "c1");
    cr_assert_eq(idem_store_positions_save(store, &p1, 1, err, sizeof(err)), 0);
    freeReplyObject(redisCommand(cli, "CONFIG RESETSTAT"));
    const void *ra[] = {&three[0]}, *rb[] = {&three[1]}, *rc[] = {&three[2]};
    uint8_t ma[1][16], mb[1][16], mc[1][16];
    mark_of(ma[0], 1);
    mark_of(mb[0], 2);
    mark_of(mc[0], 3);
    idem_store_pos_t np0 = {.topic = "t", .partition = 0, .offset = 12};
    idem_posval_init(&np0.val, "c1");
    idem_store_pos_t np1 = {.topic = "t", .partition = 1, .offset = 9};
    idem_posval_init(&np1.val, "c1");
    idem_partstate_chunk_t ch[3] = {
        {.topic = "t",
         .partition = 0,
         .epoch = e0,
         .expect_offset = 10,
         .recs = ra,
         .marks = (const uint8_t(*)[16])ma,
         .n = 1},
        {.topic = "t",
         .partition = 1,
         .epoch = e1,
         .expect_offset = 7, /* Redis holds 5 */
         .newpos = &np1,
         .recs = rc,
         .marks = (const uint8_t(*)[16])mc,
         .n = 1},
        {.topic = "t",
         .partition = 0,
         .epoch = e0,
         .expect_offset = 10,
         .newpos = &np0,
         .recs = rb,
         .marks = (const uint8_t(*)[16])mb,
         .n = 1},
    };
    idem_partstate_result_t ra_[1], rb_[1], rc_[1];
    idem_partstate_result_t *const res[3] = {ra_, rc_, rb_};
    int64_t w[3] = {-1, -1, -1};
    int rcs[3] = {-1, -1, -1};
    cr_assert_eq(
        idem_partstate_chunks(ps, ch, 3, res, w, rcs, err, sizeof(err)), 0,
        "%s", err);
    cr_expect_eq(rcs[0], 0);
    cr_expect_eq(rcs[1], IDEM_PARTSTATE_POSITION);
    cr_expect(strstr(err, "t:1") && strstr(err, "redis holds 5"), "%s", err);
    cr_expect_eq(rcs[2], 0);
    cr_expect_eq(ra_[0].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_eq(rb_[0].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_geq(w[0], 0);
    cr_expect_eq(w[2], w[0]);
    /* one script call */
    redisReply *info = redisCommand(cli, "INFO commandstats");
    cr_assert(info && info->type == REDIS_REPLY_STRING);
    cr_expect(strstr(info->str, "cmdstat_evalsha:calls=1,"), "%s", info->str);
    freeReplyObject(info);
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u1", NULL), "150");
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u2", NULL), "200");
    cr_expect_str_eq(q("HGET idemproc:ledger:USD %s", "u1", NULL), "");
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "2");
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "12 ", 3));
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:1", NULL), "5 ", 2));
    char k0[256], k1[256];
    snprintf(k0, sizeof(k0), "idemproc:st{g:t:0}:w%" PRId64, w[0]);
    snprintf(k1, sizeof(k1), "idemproc:st{g:t:1}:w%" PRId64, w[0]);
    cr_expect_str_eq(q("STRLEN %s", k0, NULL), "32");
    cr_expect_str_eq(q("EXISTS %s", k1, NULL), "0");
    loaded_t l = {0};
    cr_assert_eq(
        idem_partstate_load(ps, "t", 0, 0, collect, &l, NULL, err, sizeof(err)),
        0, "%s", err);
    cr_assert_eq(l.n, 2);
    cr_expect_arr_eq(l.buf, ma[0], 16);
    cr_expect_arr_eq(l.buf + 16, mb[0], 16);
    free(l.buf);
}

/* n records of one EUR each to user u9, ids "s<i>". */
static trec_t *ones(int n)
{
    static char ids[64][16];
    cr_assert_leq(n, 64);
    trec_t *recs = calloc((size_t)n, sizeof(*recs));
    for (int i = 0; i < n; i++) {
        snprintf(ids[i], sizeof(ids[i]), "s%d", i);
        recs[i] = (trec_t){ids[i], ids[i], "EUR", "u9", "1"};
    }
    return recs;
}

/* The part k of t:0's window key of window w ("" for k = 0). */
static void part_key(char *buf, size_t size, int64_t w, int k)
{
    if (k)
        snprintf(buf, size, "idemproc:st{g:t:0}:w%" PRId64 ".%d", w, k);
    else
        snprintf(buf, size, "idemproc:st{g:t:0}:w%" PRId64, w);
}

/* A window key holds at most dedup.window.key.max bytes of whole marks
 * (100 here: 6 marks); the marks past it go to the part keys .1, .2, ...
 * with the same expiry, a chunk split across parts where it must, and the
 * loader reads every part back, each mark once and in order. */
Test(partstate, full_window_key_spills_to_part_keys)
{
    start_with("86400", "dedup.window.key.max=100");
    char err[512];
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0);
    first_position(0);
    trec_t *recs = ones(19);
    idem_partstate_result_t res[19];
    /* 4, 4, 10, 1 records: parts of 96, 96, 96 and 16 bytes */
    const int sizes[] = {4, 4, 10, 1};
    int64_t off = 0, w = -1;
    int one_window = 1;
    for (int c = 0; c < 4; c++) {
        cr_assert_eq(chunk(epoch, off, off + sizes[c], recs + off,
                           (size_t)sizes[c], (int)off, res, err, sizeof(err)),
                     0, "%s", err);
        for (int i = 0; i < sizes[c]; i++)
            cr_expect_eq(res[i].outcome, IDEM_PARTSTATE_APPLIED);
        if (w >= 0 && last_window != w)
            one_window = 0; /* a window's end fell between the chunks */
        w = last_window;
        off += sizes[c];
    }
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u9", NULL), "19");
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "19");
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "19 ", 3));
    if (one_window) {
        const char *lens[] = {"96", "96", "96", "16", "0"};
        char k0[256], k[256];
        part_key(k0, sizeof(k0), w, 0);
        long long at = atoll(q("EXPIRETIME %s", k0, NULL));
        cr_expect_eq(at, (w + 1) * idem_partstate_window_seconds(ps) + 86400);
        for (int i = 0; i < 5; i++) {
            part_key(k, sizeof(k), w, i);
            cr_expect_str_eq(q("STRLEN %s", k, NULL), lens[i], "part %d", i);
            if (i < 4)
                cr_expect_eq(atoll(q("EXPIRETIME %s", k, NULL)), at, "part %d",
                             i);
        }
    }
    /* a new owner's table: every part, in pieces of two marks */
    loaded_t l = {0};
    size_t pieces = 0;
    cr_assert_eq(idem_partstate_load(ps, "t", 0, 32, collect, &l, &pieces, err,
                                     sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(l.n, 19);
    if (one_window)
        cr_expect_eq(pieces, 3 + 3 + 3 + 1);
    for (int i = 0; i < 19; i++) {
        uint8_t m[16];
        mark_of(m, i);
        cr_expect_arr_eq(l.buf + i * 16, m, 16, "mark %d", i);
    }
    free(l.buf);
    free(recs);
}

/* A bound equal to the server's proto-max-bulk-len (here 1 MiB, its
 * least) is safe: the window key fills to exactly the limit and the rest
 * spills. (Past the limit an APPEND fails, and it would fail after the
 * effect, leaving the effect without its marks and the chunk sent again:
 * applied twice; that is what the bound prevents.) */
Test(partstate, window_key_bound_at_the_servers_limit)
{
    start_with("86400", "dedup.window.key.max=1048576");
    char err[512];
    freeReplyObject(redisCommand(cli, "CONFIG SET proto-max-bulk-len 1mb"));
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0);
    first_position(0);
    /* the current window's key two marks short of 1 MiB */
    char k0[256], k1[256];
    int64_t now = 0;
    cr_assert_eq(idem_partstate_now(ps, &now, err, sizeof(err)), 0);
    int64_t w0 = now / idem_partstate_window_seconds(ps);
    part_key(k0, sizeof(k0), w0, 0);
    freeReplyObject(redisCommand(cli, "SETRANGE %s %d %b", k0, 1048576 - 32 - 1,
                                 "", (size_t)1));
    cr_assert_str_eq(q("STRLEN %s", k0, NULL), "1048544");
    trec_t *recs = ones(3);
    idem_partstate_result_t res[3];
    cr_assert_eq(chunk(epoch, 0, 3, recs, 3, 0, res, err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "3");
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "3 ", 2));
    part_key(k1, sizeof(k1), w0, 1);
    if (last_window == w0) { /* else a window's end fell in between */
        cr_expect_str_eq(q("STRLEN %s", k0, NULL), "1048576");
        cr_expect_str_eq(q("STRLEN %s", k1, NULL), "16");
    }
    loaded_t l = {0};
    cr_assert_eq(
        idem_partstate_load(ps, "t", 0, 0, collect, &l, NULL, err, sizeof(err)),
        0, "%s", err);
    cr_assert_eq(l.n, 65534 + 3);
    for (int i = 0; i < 3; i++) {
        uint8_t m[16];
        mark_of(m, i);
        cr_expect_arr_eq(l.buf + (65534 + i) * 16, m, 16, "mark %d", i);
    }
    free(l.buf);
    free(recs);
}

/* Where the marks go is decided before any write: a part key that cannot
 * take an APPEND (here another type) fails the call with nothing written,
 * no effect, no mark, no position; once the key is fixed, the chunk
 * applies once. */
Test(partstate, unwritable_part_key_writes_nothing)
{
    start_with("86400", "dedup.window.key.max=96");
    char err[512];
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0);
    first_position(0);
    trec_t *recs = ones(9);
    idem_partstate_result_t res[9];
    cr_assert_eq(chunk(epoch, 0, 6, recs, 6, 0, res, err, sizeof(err)), 0, "%s",
                 err);
    char k1[256];
    part_key(k1, sizeof(k1), last_window, 1);
    freeReplyObject(redisCommand(cli, "HSET %s f v", k1));
    int rc = chunk(epoch, 6, 9, recs + 6, 3, 6, res, err, sizeof(err));
    char k0[256];
    window_key(k0, sizeof(k0), 0);
    if (!strncmp(k1, k0, strlen(k0))) { /* still the same window */
        cr_expect_eq(rc, -1);
        cr_expect(strstr(err, "WRONGTYPE"), "%s", err);
        cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "6");
        cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u9", NULL), "6");
        cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "6 ", 2));
        cr_expect_str_eq(q("STRLEN %s", k0, NULL), "96");
        freeReplyObject(redisCommand(cli, "DEL %s", k1));
        cr_assert_eq(chunk(epoch, 6, 9, recs + 6, 3, 6, res, err, sizeof(err)),
                     0, "%s", err);
    }
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "9");
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u9", NULL), "9");
    free(recs);
}

/* Marks go after the last part, never into an earlier one with room (a
 * window written under a smaller dedup.window.key.max): the parts a call
 * creates start empty, so none passes the bound. */
Test(partstate, marks_go_after_the_last_part)
{
    start_with("86400", "dedup.window.key.max=100");
    char err[512];
    int64_t epoch = 0, now = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0);
    first_position(0);
    cr_assert_eq(idem_partstate_now(ps, &now, err, sizeof(err)), 0);
    int64_t w0 = now / idem_partstate_window_seconds(ps);
    char k0[256], k1[256], k2[256];
    part_key(k0, sizeof(k0), w0, 0);
    part_key(k1, sizeof(k1), w0, 1);
    part_key(k2, sizeof(k2), w0, 2);
    uint8_t old[3][16];
    for (int i = 0; i < 3; i++)
        mark_of(old[i], 900 + i);
    /* two parts as a 32-byte bound left them: full at 32 bytes, then 16 */
    freeReplyObject(redisCommand(cli, "SET %s %b", k0, old, (size_t)32));
    freeReplyObject(redisCommand(cli, "SET %s %b", k1, old[2], (size_t)16));
    trec_t *recs = ones(6);
    idem_partstate_result_t res[6];
    cr_assert_eq(chunk(epoch, 0, 6, recs, 6, 0, res, err, sizeof(err)), 0, "%s",
                 err);
    if (last_window == w0) { /* else a window's end fell in between */
        cr_expect_str_eq(q("STRLEN %s", k0, NULL), "32");
        cr_expect_str_eq(q("STRLEN %s", k1, NULL), "96");
        cr_expect_str_eq(q("STRLEN %s", k2, NULL), "16");
        loaded_t l = {0};
        cr_assert_eq(idem_partstate_load(ps, "t", 0, 0, collect, &l, NULL, err,
                                         sizeof(err)),
                     0, "%s", err);
        cr_assert_eq(l.n, 3 + 6);
        cr_expect_arr_eq(l.buf, old, sizeof(old));
        for (int i = 0; i < 6; i++) {
            uint8_t m[16];
            mark_of(m, i);
            cr_expect_arr_eq(l.buf + (3 + i) * 16, m, 16, "mark %d", i);
        }
        free(l.buf);
    }
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "6");
    free(recs);
}
