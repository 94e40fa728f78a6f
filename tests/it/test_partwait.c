/* test_partwait (it): redis.wait.replicas after the partition chunks on a
 * single Redis with one replica (redis/partstate.c): a chunk passes WAIT 1
 * while the replica runs; with the replica stopped (SIGSTOP) the request
 * is an outage naming the short WAIT, and the chunk sent again is refused
 * by its position: applied once. */
#include "conf/conf.h"
#include "fixture_redisconn.h"
#include "harness.h"
#include "partrig.h"
#include "redis/partstate.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_redis_t primary, replica;
static idem_conf_t *conf;
static idem_store_t *store;
static idem_partstate_t *ps;
static pid_t stopped; /* the replica under SIGSTOP, 0 for none */

static void fini(void)
{
    if (stopped > 0)
        kill(stopped, SIGCONT);
    stopped = 0;
    idem_partstate_destroy(ps);
    ps = NULL;
    idem_store_destroy(store);
    store = NULL;
    idem_conf_destroy(conf);
    conf = NULL;
    th_redis_stop(&replica);
    th_redis_stop(&primary);
}

TestSuite(partwait, .fini = fini, .timeout = 120);

static const th_trec_t first[] = {
    {"id-1", "m-1", "EUR", "u1", "150"},
    {"id-2", "m-2", "EUR", "u2", "200"},
};

static const th_trec_t second[] = {
    {"id-3", "m-3", "EUR", "u1", "10"},
    {"id-4", "m-4", "EUR", "u2", "7"},
};

/* 1 when INFO replication on cli lists a replica in state online. */
static int replica_online(redisContext *cli)
{
    redisReply *r = redisCommand(cli, "INFO replication");
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    int on = strstr(r->str, "state=online") != NULL;
    freeReplyObject(r);
    return on;
}

Test(partwait, short_wait_fails_the_request_and_the_resend_is_refused)
{
    quiet();
    cr_assert_eq(th_redis_start(&primary), 0);
    static char port[16];
    snprintf(port, sizeof(port), "%d", primary.port);
    static const char *rargs[] = {"--replicaof", "127.0.0.1", port, NULL};
    rargs[2] = port;
    cr_assert_eq(th_redis_start_args(&replica, rargs), 0);
    redisContext *cli = redisConnect("127.0.0.1", primary.port);
    cr_assert(cli && !cli->err);
    int ok = 0;
    for (int t = 0; t < 300 && !ok; t++) {
        ok = replica_online(cli);
        if (!ok)
            usleep(100 * 1000);
    }
    cr_assert(ok, "the replica did not come online");
    freeReplyObject(redisCommand(
        cli, "HSET idemproc:layout:g layout partition since 0 from partition"));

    char url[128], err[512] = "";
    snprintf(url, sizeof(url), "redis.url=%s", primary.url);
    char *sets[] = {url,
                    "group.id=g",
                    "handler=ledger",
                    "dedup.scope=partition",
                    "input.topics=t",
                    "dlq.topic=d",
                    "kafka.bootstrap.servers=127.0.0.1:1",
                    "dedup.ttl.seconds=86400",
                    "redis.wait.replicas=1",
                    "redis.wait.timeout.ms=300"};
    conf = idem_conf_load(NULL, NULL, sets, sizeof(sets) / sizeof(sets[0]), err,
                          sizeof(err));
    cr_assert(conf, "%s", err);
    th_partrig_start(conf, &store, &ps);
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0,
        "%s", err);
    th_partrig_first_position(store, 0, 0);

    idem_partstate_result_t res[2];
    int rc = th_partrig_chunk(ps, 0, epoch, 0, 2, first, 2, 1, res, NULL, err,
                              sizeof(err));
    cr_assert_eq(rc, 0, "WAIT 1 with the replica running: %s", err);

    stopped = replica.pid;
    cr_assert_eq(kill(stopped, SIGSTOP), 0);
    rc = th_partrig_chunk(ps, 0, epoch, 2, 4, second, 2, 10, res, NULL, err,
                          sizeof(err));
    cr_assert_eq(rc, -1, "a short WAIT passed: %d (%s)", rc, err);
    cr_expect(strstr(err, "0 of 1 replicas"), "%s", err);
    cr_assert_eq(kill(stopped, SIGCONT), 0);
    stopped = 0;

    /* Applied on the primary: the resend is refused by its position. */
    rc = th_partrig_chunk(ps, 0, epoch, 2, 4, second, 2, 10, res, NULL, err,
                          sizeof(err));
    cr_expect_eq(rc, IDEM_PARTSTATE_POSITION, "%d (%s)", rc, err);
    redisReply *r = redisCommand(cli, "HGET idemproc:ledger:EUR u1");
    cr_assert(r);
    cr_expect_str_eq(r->type == REDIS_REPLY_STRING ? r->str : "", "160");
    freeReplyObject(r);
    redisFree(cli);
}
