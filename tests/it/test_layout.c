/* test_layout (it): the dedup layout key against a real redis-server
 * (redis/layout.h): the chunk script refuses unless the key says
 * partition, and for one TTL after a switch from global finds the global
 * marks of the records it is sent (not applied, still marked); the global
 * script refuses when the key says another layout than the member runs;
 * the switch is a compare and set. Nothing is written by a refusal. */
#include "conf/conf.h"
#include "fixture_redisconn.h"
#include "harness.h"
#include "partrig.h"
#include "redis/layout.h"
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

typedef th_trec_t trec_t;

/* Redis, a store with the ledger's effect and the partition layout, for
 * group g with dedup.ttl.seconds ttl. */
static void start(const char *ttl)
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
                    t};
    conf = idem_conf_load(NULL, NULL, sets, 7, err, sizeof(err));
    cr_assert(conf, "%s", err);
    th_partrig_start(conf, &store, &ps);
    cli = redisConnect("127.0.0.1", rds.port);
    cr_assert(cli && !cli->err);
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

TestSuite(layout, .fini = fini, .timeout = 60);

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

/* Runs a chunk of t:0: n records of trecs with marks seeded from seed0. */
static int chunk(int64_t epoch, int64_t expect, int64_t newoff,
                 const trec_t *recs, size_t n, int seed0,
                 idem_partstate_result_t *res, char *err, size_t errsz)
{
    return th_partrig_chunk(ps, 0, epoch, expect, newoff, recs, n, seed0, res,
                            NULL, err, errsz);
}

static const trec_t three[] = {
    {"id-1", "m-1", "EUR", "u1", "150"},
    {"id-2", "m-2", "EUR", "u2", "200"},
    {"id-3", "m-3", "USD", "u1", "-25"},
};

/* Redis's clock (s). */
static long long redis_now(void)
{
    redisReply *r = redisCommand(cli, "TIME");
    cr_assert(r && r->type == REDIS_REPLY_ARRAY);
    long long t = atoll(r->element[0]->str);
    freeReplyObject(r);
    return t;
}

/* The layout key as a switch at `since` from `from` left it. */
static void layout_set(const char *layout, long long since, const char *from)
{
    char s[24];
    snprintf(s, sizeof(s), "%lld", since);
    redisReply *r =
        redisCommand(cli, "HSET idemproc:layout:g layout %s since %s from %s",
                     layout, s, from);
    cr_assert(r && r->type == REDIS_REPLY_INTEGER);
    freeReplyObject(r);
}

static int64_t ready_partition(void)
{
    char err[512];
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0,
        "%s", err);
    first_position(100);
    return epoch;
}

static long chunk_keys(void)
{
    return atol(q("EVAL %s 0",
                  "return #redis.call('KEYS', 'idemproc:st{g:t:0}:w*')", NULL));
}

Test(layout, chunk_refused_unless_the_key_says_partition)
{
    start("86400");
    int64_t epoch = ready_partition();
    char err[512];
    idem_partstate_result_t res[3];
    /* absent = global */
    cr_expect_eq(chunk(epoch, 100, 103, three, 3, 1, res, err, sizeof(err)),
                 IDEM_PARTSTATE_LAYOUT, "%s", err);
    cr_expect(strstr(err, "LAYOUT"), "%s", err);
    layout_set("global", redis_now(), "partition");
    cr_expect_eq(chunk(epoch, 100, 103, three, 3, 1, res, err, sizeof(err)),
                 IDEM_PARTSTATE_LAYOUT, "%s", err);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "");
    cr_expect_eq(chunk_keys(), 0);
    cr_expect(!strncmp(q("HGET idemproc:pos:g t:0", NULL, NULL), "100", 3));
    /* partition, switched long ago (past the TTL): applies */
    layout_set("partition", redis_now() - 86401, "global");
    cr_assert_eq(chunk(epoch, 100, 103, three, 3, 1, res, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "3");
}

Test(layout, within_a_ttl_of_the_switch_global_marks_are_honoured)
{
    start("86400");
    int64_t epoch = ready_partition();
    char err[512];
    idem_partstate_result_t res[3];
    /* id-1 was applied under the global layout before the switch */
    q("SET idemproc:dedup:g:id-1 %s", "done:m-0", NULL);
    layout_set("partition", redis_now(), "global");
    /* a member that does not send the identities is refused */
    cr_expect_eq(chunk(epoch, 100, 103, three, 3, 1, res, err, sizeof(err)),
                 IDEM_PARTSTATE_LAYOUT, "%s", err);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "");
    idem_partstate_honour_global(ps, 1);
    cr_assert_eq(chunk(epoch, 100, 103, three, 3, 1, res, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_eq(res[0].outcome, IDEM_PARTSTATE_GLOBAL_DONE);
    cr_expect_str_eq(res[0].detail, "done:m-0");
    cr_expect_eq(res[1].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_eq(res[2].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u1", NULL), "");
    cr_expect_str_eq(q("HGET idemproc:ledger:EUR %s", "u2", NULL), "200");
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "2");
    /* all three marks written in the chunk, id-1's too */
    cr_expect_eq(chunk_keys(), 1);
    cr_expect_str_eq(q("EVAL %s 0",
                       "return redis.call('STRLEN', redis.call('KEYS', "
                       "'idemproc:st{g:t:0}:w*')[1])",
                       NULL),
                     "48");
}

Test(layout, global_script_refuses_another_layout)
{
    start("86400");
    char err[512];
    /* the store registered the effect as script 2 (see test_partstate) */
    const trec_t recs[] = {{"id-1", "m-1", "EUR", "u1", "10"}};
    const void *rp[1] = {&recs[0]};
    idem_store_result_t res[1];
    layout_set("partition", redis_now(), "global");
    cr_assert_eq(
        idem_store_script_send(store, 2, rp, 1, NULL, 0, err, sizeof(err)), 0,
        "%s", err);
    cr_expect_neq(idem_store_script_recv(store, 1, res, err, sizeof(err)), 0);
    cr_expect(strstr(err, "LAYOUT"), "%s", err);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "");
    cr_expect_str_eq(q("GET idemproc:dedup:g:id-1", NULL, NULL), "");
    /* told the layout it runs: applies (a record that left its
     * partition) */
    idem_store_effect_layout(store, "partition");
    cr_assert_eq(
        idem_store_script_send(store, 2, rp, 1, NULL, 0, err, sizeof(err)), 0,
        "%s", err);
    cr_assert_eq(idem_store_script_recv(store, 1, res, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_eq(res[0].mark, IDEM_MARK_NEW);
    cr_expect_str_eq(q("GET idemproc:ledger:applied", NULL, NULL), "1");
}

Test(layout, switch_is_a_compare_and_set)
{
    start("86400");
    char err[512], sha[41] = "";
    idem_layout_t l;
    cr_assert_eq(idem_layout_read(cli, conf, &l, err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(l.layout, IDEM_LAYOUT_GLOBAL);
    cr_expect_eq(l.since, 0);
    cr_expect_gt(l.now, 0);
    /* expects partition, finds global: nothing */
    cr_expect_eq(idem_layout_switch(cli, conf, sha, IDEM_LAYOUT_PARTITION,
                                    IDEM_LAYOUT_GLOBAL, &l, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(q("EXISTS idemproc:layout:g", NULL, NULL), "0");
    /* the group has run (a member wrote its positions): global marks may
     * exist, so the switch honours them for a TTL */
    freeReplyObject(redisCommand(cli, "HSET idemproc:pos:g t:0 5"));
    cr_expect_eq(idem_layout_switch(cli, conf, sha, IDEM_LAYOUT_GLOBAL,
                                    IDEM_LAYOUT_PARTITION, &l, err,
                                    sizeof(err)),
                 1, "%s", err);
    cr_expect_eq(l.layout, IDEM_LAYOUT_PARTITION);
    cr_expect_eq(l.from, IDEM_LAYOUT_GLOBAL);
    cr_expect_geq(l.since, l.now - 1);
    /* a second switcher that read global too: refused */
    cr_expect_eq(idem_layout_switch(cli, conf, sha, IDEM_LAYOUT_GLOBAL,
                                    IDEM_LAYOUT_PARTITION, &l, err,
                                    sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(idem_layout_honours(&l, 86400, l.now), 1);
    cr_expect_eq(idem_layout_honours(&l, 86400, l.since + 86400), 0);
}

Test(layout, a_group_that_never_ran_switches_with_nothing_to_honour)
{
    start("86400");
    char err[512], sha[41] = "";
    idem_layout_t l;
    /* no layout key, no positions: no member ever applied a record */
    cr_expect_eq(idem_layout_switch(cli, conf, sha, IDEM_LAYOUT_GLOBAL,
                                    IDEM_LAYOUT_PARTITION, &l, err,
                                    sizeof(err)),
                 1, "%s", err);
    cr_expect_eq(l.layout, IDEM_LAYOUT_PARTITION);
    cr_expect_eq(l.since, 0);
    cr_expect_eq(idem_layout_honours(&l, 86400, l.now), 0);
    /* a rollback always honours the partition marks it leaves */
    cr_expect_eq(idem_layout_switch(cli, conf, sha, IDEM_LAYOUT_PARTITION,
                                    IDEM_LAYOUT_GLOBAL, &l, err, sizeof(err)),
                 1, "%s", err);
    cr_expect_eq(l.from, IDEM_LAYOUT_PARTITION);
    cr_expect_geq(l.since, l.now - 1);
    cr_expect_eq(idem_layout_honours(&l, 86400, l.now), 1);
}
