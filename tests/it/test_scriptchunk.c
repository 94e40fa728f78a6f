/* test_scriptchunk (it): handler=script under dedup.scope=partition against
 * a real redis-server: the user's effect composed into the partition chunk
 * script (redis/partchunk.lua) applies each new record once with its mark
 * and position, a rejected record writes nothing and its mark is sent back
 * as "moved", a sum Redis refuses rejects its records, the records that
 * take the global path (the store's global framing of the same effect)
 * answer a duplicate within the request, and the effect with a partition's
 * tag (Redis Cluster mode's ksuf) writes every idem.* key under it and
 * rejects a key with a tag of its own; on a real cluster, a plain write to
 * a key outside the partition's slot rejects its record naming the key. */
#include "conf/conf.h"
#include "effect/handler.h"
#include "fixture_redisconn.h"
#include "handlers/luascript.h"
#include "harness.h"
#include "harness_cluster.h"
#include "partrig.h"
#include "redis/partstate.h"
#include "redis/posval.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const idem_handler_ops_t idem_handler_script;

static th_redis_t rds;
static char *dir;
static idem_conf_t *conf;
static idem_store_t *store;
static idem_partstate_t *ps;
static void *handler;
static redisContext *cli;
static th_cluster_t clu;

/* balance[user] += n for a JSON value {"u": user, "n": n}; a value with
 * "no" is refused after staging (its increment must not land); every
 * accepted record is also counted and its identity added to a set with a
 * plain write (under idem.key). */
static const char effect_lua[] =
    "function effect(rec)\n"
    "  local v = cjson.decode(rec.value)\n"
    "  idem.hincrby('balance', v.u, v.n)\n"
    "  if v.no then return false, 'refused: ' .. v.no end\n"
    "  idem.incrby('count', 1)\n"
    "  redis.call('SADD', idem.key('seen'), rec.identity)\n"
    "end\n";

/* A store on Redis (nodes NULL) or on the cluster at nodes, the script
 * handler with `text` as script.file, and partstate. */
static void start_on(const char *text, const char *nodes)
{
    char url[600], file[512], err[512] = "";
    if (nodes) {
        snprintf(url, sizeof(url), "redis.cluster.nodes=%s", nodes);
    } else {
        cr_assert_eq(th_redis_start(&rds), 0);
        snprintf(url, sizeof(url), "redis.url=%s", rds.url);
    }
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&dir, "effect.lua", text));
    char *sets[] = {url,
                    file,
                    "group.id=g",
                    "handler=script",
                    "dedup.scope=partition",
                    "input.topics=t",
                    "dlq.topic=d",
                    "kafka.bootstrap.servers=127.0.0.1:1"};
    conf = idem_conf_load(NULL, NULL, sets, 8, err, sizeof(err));
    cr_assert(conf, "%s", err);
    store = idem_store_new(conf, NULL);
    cr_assert(store);
    idem_handler_ctx_t ctx = {.conf = conf, .store = store};
    handler = idem_handler_script.start(&ctx, err, sizeof(err));
    cr_assert(handler, "%s", err);
    ps = idem_partstate_new(store, conf, err, sizeof(err));
    cr_assert(ps, "%s", err);
    if (nodes)
        return;
    cli = redisConnect("127.0.0.1", rds.port);
    cr_assert(cli && !cli->err);
    freeReplyObject(redisCommand(
        cli, "HSET idemproc:layout:g layout partition since 0 from partition"));
}

static void start_file(const char *text)
{
    start_on(text, NULL);
}

static void fini(void)
{
    if (cli)
        redisFree(cli);
    cli = NULL;
    idem_partstate_destroy(ps);
    ps = NULL;
    if (handler)
        idem_handler_script.stop(handler);
    handler = NULL;
    idem_store_destroy(store);
    store = NULL;
    idem_conf_destroy(conf);
    conf = NULL;
    if (rds.dir)
        th_redis_stop(&rds);
    th_cluster_stop(&clu);
    if (dir)
        th_rmrf(dir);
    free(dir);
    dir = NULL;
}

TestSuite(scriptchunk, .init = quiet, .fini = fini, .timeout = 60);

static char *q(const char *fmt, const char *a, const char *b)
{
    return th_reply_text(cli, fmt, a, b);
}

/* Record i of t:0 with identity id and value v. */
static idem_record_t rec_of(const char *id, const char *v, int64_t off)
{
    return (idem_record_t){.identity = id,
                           .identity_len = strlen(id),
                           .message_id = id,
                           .message_id_len = strlen(id),
                           .topic = "t",
                           .partition = 0,
                           .offset = off,
                           .timestamp = 1700000000000,
                           .key = "k",
                           .key_len = 1,
                           .value = v,
                           .value_len = strlen(v)};
}

/* One chunk of t:0 (epoch, expected start, new position) over recs[n],
 * marks seeded 1.. . */
static int chunk(int64_t epoch, int64_t expect, const idem_record_t *recs,
                 size_t n, idem_partstate_result_t *res, char *err,
                 size_t errsz)
{
    const void *rp[16];
    uint8_t marks[16][16];
    cr_assert_leq(n, 16);
    for (size_t i = 0; i < n; i++) {
        rp[i] = &recs[i];
        th_mark_of(marks[i], 1 + (int)i);
    }
    idem_store_pos_t pos = {
        .topic = "t", .partition = 0, .offset = expect + (int64_t)n};
    idem_posval_init(&pos.val, "c1");
    idem_partstate_chunk_t ch = {.topic = "t",
                                 .partition = 0,
                                 .epoch = epoch,
                                 .expect_offset = expect,
                                 .newpos = &pos,
                                 .recs = rp,
                                 .marks = (const uint8_t(*)[16])marks,
                                 .n = n};
    int64_t w;
    return idem_partstate_chunk(ps, &ch, res, &w, err, errsz);
}

typedef struct {
    uint8_t buf[16 * 16];
    size_t n;
} loaded_t;

static int collect(const uint8_t *marks, size_t n, int64_t window, void *opaque)
{
    (void)window;
    loaded_t *l = opaque;
    for (size_t i = 0; i < n && l->n < 16; i++)
        memcpy(l->buf + 16 * l->n++, marks + 16 * i, 16);
    return 0;
}

static int64_t epoch_of(void)
{
    char err[512];
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0,
        "%s", err);
    th_partrig_first_position(store, 0, 0);
    return epoch;
}

Test(scriptchunk, effect_applied_once_with_marks_and_position)
{
    start_file(effect_lua);
    int64_t epoch = epoch_of();
    idem_record_t recs[] = {rec_of("a", "{\"u\":\"u1\",\"n\":5}", 0),
                            rec_of("b", "{\"u\":\"u2\",\"n\":7}", 1),
                            rec_of("c", "{\"u\":\"u1\",\"n\":-2}", 2)};
    idem_partstate_result_t res[3];
    char err[512] = "";
    cr_assert_eq(chunk(epoch, 0, recs, 3, res, err, sizeof(err)), 0, "%s", err);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(res[i].outcome, IDEM_PARTSTATE_APPLIED, "%d: %s", i,
                     res[i].detail);
    cr_expect_str_eq(q("HGET balance %s", "u1", NULL), "3");
    cr_expect_str_eq(q("HGET balance %s", "u2", NULL), "7");
    cr_expect_str_eq(q("GET count", NULL, NULL), "3");
    cr_expect_str_eq(q("SCARD seen", NULL, NULL), "3");
    cr_expect(!strncmp(q("HGET idemproc:pos:g %s", "t:0", NULL), "3 ", 2));
    loaded_t l = {0};
    cr_assert_eq(
        idem_partstate_load(ps, "t", 0, 0, collect, &l, NULL, err, sizeof(err)),
        0, "%s", err);
    cr_expect_eq(l.n, 3);
    /* The same chunk again (a member that did not see the reply): refused
     * POSITION, nothing written twice. */
    cr_assert_eq(chunk(epoch, 0, recs, 3, res, err, sizeof(err)),
                 IDEM_PARTSTATE_POSITION, "%s", err);
    cr_expect_str_eq(q("HGET balance %s", "u1", NULL), "3");
    cr_expect_str_eq(q("GET count", NULL, NULL), "3");
}

Test(scriptchunk, rejected_record_writes_nothing_and_its_mark_is_moved)
{
    start_file(effect_lua);
    freeReplyObject(redisCommand(cli, "SET wrong x"));
    int64_t epoch = epoch_of();
    /* b refuses itself after staging; d's sum goes to a field that holds
     * no integer (Redis refuses it: d and e, which share it, are
     * rejected); a, c applied */
    freeReplyObject(redisCommand(cli, "HSET balance bad notanumber"));
    idem_record_t recs[] = {
        rec_of("a", "{\"u\":\"u1\",\"n\":5}", 0),
        rec_of("b", "{\"u\":\"u1\",\"n\":100,\"no\":\"stock\"}", 1),
        rec_of("c", "{\"u\":\"u2\",\"n\":1}", 2),
        rec_of("d", "{\"u\":\"bad\",\"n\":1}", 3),
        rec_of("e", "{\"u\":\"bad\",\"n\":2}", 4),
        rec_of("f", "not json", 5)};
    idem_partstate_result_t res[6];
    char err[512] = "";
    cr_assert_eq(chunk(epoch, 0, recs, 6, res, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(res[0].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_eq(res[1].outcome, IDEM_PARTSTATE_REJECTED);
    cr_expect_str_eq(res[1].detail, "refused: stock");
    cr_expect_eq(res[2].outcome, IDEM_PARTSTATE_APPLIED);
    cr_expect_eq(res[3].outcome, IDEM_PARTSTATE_REJECTED);
    cr_expect(strstr(res[3].detail, "HINCRBY balance bad"), "%s",
              res[3].detail);
    cr_expect_eq(res[4].outcome, IDEM_PARTSTATE_REJECTED);
    cr_expect_eq(res[5].outcome, IDEM_PARTSTATE_REJECTED);
    cr_expect(!strncmp(res[5].detail, "lua error: ", 11), "%s", res[5].detail);
    cr_expect(strstr(res[5].detail, "effect.lua:2:"), "%s", res[5].detail);
    cr_expect_str_eq(q("HGET balance %s", "u1", NULL), "5");
    cr_expect_str_eq(q("HGET balance %s", "u2", NULL), "1");
    cr_expect_str_eq(q("HGET balance %s", "bad", NULL), "notanumber");
    /* d and e were rejected after their count and SADD ran (the sums are
     * written after every effect): their plain writes stay, as the README
     * says of a rejection; the counts of the refused records do not */
    cr_expect_str_eq(q("GET count", NULL, NULL), "2");
    loaded_t l = {0};
    cr_assert_eq(
        idem_partstate_load(ps, "t", 0, 0, collect, &l, NULL, err, sizeof(err)),
        0, "%s", err);
    cr_assert_eq(l.n, 6);
    for (size_t i = 0; i < 6; i++) {
        int moved = !!(l.buf[16 * i + 12] & IDEM_PARTSTATE_MOVED);
        cr_expect_eq(moved, i == 1 || i >= 3, "mark %zu moved %d", i, moved);
    }
}

/* The records that take the global path (no key, replayed) go through the
 * store's global framing of the same effect: a done mark per identity, a
 * duplicate within the request answered with the first's message id. */
Test(scriptchunk, global_path_answers_a_duplicate_within_the_request)
{
    start_file(effect_lua);
    idem_store_effect_layout(store, "partition");
    idem_record_t recs[] = {
        rec_of("a", "{\"u\":\"u1\",\"n\":5}", 0),
        rec_of("a", "{\"u\":\"u1\",\"n\":5}", 1),
        rec_of("b", "{\"u\":\"u1\",\"n\":1,\"no\":\"x\"}", 2)};
    idem_record_t *rp[] = {&recs[0], &recs[1], &recs[2]};
    char err[512] = "";
    cr_assert_eq(
        idem_handler_script.submit(handler, rp, 3, NULL, 0, err, sizeof(err)),
        0, "%s", err);
    idem_result_t out[3];
    size_t got = 0;
    for (int k = 0; k < 100 && got < 3; k++)
        got += idem_handler_script.collect(handler, out + got, 3 - got, 100);
    cr_assert_eq(got, 3);
    cr_expect_eq(out[0].kind, IDEM_RESULT_DONE, "%s", out[0].detail);
    cr_expect_eq(out[1].kind, IDEM_RESULT_DUPLICATE, "%s", out[1].detail);
    cr_expect_eq(out[2].kind, IDEM_RESULT_REJECT);
    cr_expect_str_eq(out[2].detail, "refused: x");
    cr_expect_str_eq(q("HGET balance %s", "u1", NULL), "5");
    cr_expect_str_eq(q("GET idemproc:dedup:g:a", NULL, NULL), "done:a");
    cr_expect_str_eq(q("EXISTS idemproc:dedup:g:b", NULL, NULL), "0");
}

/* Redis Cluster mode's key suffix, run with EVAL on one Redis: the
 * effect's framing here passes ksuf as partchunk.lua does in cluster
 * mode. */
static const char tagged_lua[] =
    "function effect(rec)\n"
    "  idem.hincrby('balance', rec.value, 1)\n"
    "  idem.incrbyfloat('total', 0.5)\n"
    "  if rec.value == 'x' then idem.incrby('raw{other}', 1) end\n"
    "  redis.call('SET', idem.key('last'), rec.identity)\n"
    "end\n";

Test(scriptchunk, cluster_suffix_tags_every_key_and_refuses_own_tags)
{
    start_file(tagged_lua);
    char err[512] = "";
    idem_luascript_t *sc = idem_luascript_load(
        th_file_in(&dir, "tagged.lua", tagged_lua), NULL, err, sizeof(err));
    cr_assert(sc, "%s", err);
    size_t per = 2 + idem_luascript_rec_args(sc);
    const char *eff = idem_luascript_effect(sc);
    size_t srcl = strlen(eff) + 512;
    char *src = malloc(srcl);
    snprintf(src, srcl,
             "local PER = %zu\n%s\n"
             "local js = {}\n"
             "for j = 1, (#ARGV - 1) / PER do js[j] = j end\n"
             "local refused, e = effect(3, PER, js, ARGV[1])\n"
             "if not refused then return redis.error_reply(e) end\n"
             "local out = {}\n"
             "for j = 1, #js do out[j] = refused[j] or '' end\n"
             "return out\n",
             per, eff);
    idem_record_t recs[] = {rec_of("a", "u1", 0), rec_of("b", "x", 1),
                            rec_of("c", "u1", 2)};
    const char *argv[64];
    size_t lens[64];
    size_t a = 0;
    argv[a] = "EVAL", lens[a++] = 4;
    argv[a] = src, lens[a++] = strlen(src);
    argv[a] = "0", lens[a++] = 1;
    argv[a] = "{g:t:0}", lens[a++] = 7;
    idem_luascript_scratch_t sb = {0};
    for (size_t i = 0; i < 3; i++) {
        argv[a] = recs[i].identity, lens[a++] = recs[i].identity_len;
        argv[a] = recs[i].message_id, lens[a++] = recs[i].message_id_len;
        a += idem_luascript_args(sc, &recs[i], &sb, argv + a, lens + a);
    }
    redisReply *r = redisCommandArgv(cli, (int)a, argv, lens);
    cr_assert(r && r->type == REDIS_REPLY_ARRAY && r->elements == 3, "%s",
              r && r->str ? r->str : "no array");
    cr_expect_str_eq(r->element[0]->str, "");
    cr_expect(strstr(r->element[1]->str, "\"raw{other}\" contains \"{\""), "%s",
              r->element[1]->str);
    cr_expect(strstr(r->element[1]->str, "tagged.lua:4:"), "%s",
              r->element[1]->str);
    cr_expect_str_eq(r->element[2]->str, "");
    freeReplyObject(r);
    cr_expect_str_eq(q("HGET balance{g:t:0} %s", "u1", NULL), "2");
    cr_expect_str_eq(q("GET total{g:t:0}", NULL, NULL), "1");
    cr_expect_str_eq(q("GET last{g:t:0}", NULL, NULL), "c");
    cr_expect_str_eq(q("EXISTS balance", NULL, NULL), "0");
    cr_expect_str_eq(q("EXISTS raw{other}{g:t:0}", NULL, NULL), "0");
    cr_expect_str_eq(q("EXISTS raw{other}", NULL, NULL), "0");
    idem_luascript_scratch_term(&sb);
    idem_luascript_destroy(sc);
    free(src);
}

/* On a real cluster: every idem.* key under the partition's tag, and a
 * plain write to a key of another slot (computed, so check-config cannot
 * see it) rejects its record with the key named; nothing of a rejected
 * record lands. */
static const char cluster_lua[] =
    "function effect(rec)\n"
    "  idem.hincrby('balance', rec.value, 1)\n"
    "  if rec.value == 'raw' then\n"
    "    redis.call('SET', 'raw:' .. rec.identity, 1)\n"
    "  end\n"
    "  redis.call('SET', idem.key('last'), rec.identity)\n"
    "end\n";

Test(scriptchunk, cluster_key_outside_the_slot_is_rejected, .timeout = 120)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    start_on(cluster_lua, clu.seeds);
    char err[512] = "";
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", 0, &epoch, err, sizeof(err)), 0,
        "%s", err);
    th_partrig_first_position(store, 0, 0);
    idem_record_t recs[] = {rec_of("a", "u", 0), rec_of("b", "raw", 1),
                            rec_of("c", "u", 2)};
    idem_partstate_result_t res[3];
    cr_assert_eq(chunk(epoch, 0, recs, 3, res, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(res[0].outcome, IDEM_PARTSTATE_APPLIED, "%s", res[0].detail);
    cr_expect_eq(res[1].outcome, IDEM_PARTSTATE_REJECTED);
    cr_expect(strstr(res[1].detail, "\"raw:b\" is not under the partition's "
                                    "hash tag {g:t:0}"),
              "%s", res[1].detail);
    cr_expect(strstr(res[1].detail, "effect.lua:4:"), "%s", res[1].detail);
    cr_expect_eq(res[2].outcome, IDEM_PARTSTATE_APPLIED, "%s", res[2].detail);
    char *slot = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT {g:t:0}");
    cr_assert(slot);
    int owner = th_cluster_owner(&clu, atoi(slot));
    free(slot);
    cr_assert_geq(owner, 0);
    char *v = th_cluster_cmd(&clu, owner, "HGET balance{g:t:0} u");
    cr_expect(v && !strcmp(v, "2"), "balance u: %s", v ? v : "(nil)");
    free(v);
    v = th_cluster_cmd(&clu, owner, "HEXISTS balance{g:t:0} raw");
    cr_expect(v && !strcmp(v, "0"), "balance raw: %s", v ? v : "(nil)");
    free(v);
    v = th_cluster_cmd(&clu, owner, "GET last{g:t:0}");
    cr_expect(v && !strcmp(v, "c"), "last: %s", v ? v : "(nil)");
    free(v);
}
