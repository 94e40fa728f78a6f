/* test_partscope (unit): partscope's own decisions (loop/partscope.h)
 * against a fake Redis side behind its seam (fake_partredis.h): the load
 * at a partition's first records (epoch bump, position, marks, in that
 * order), duplicates the table answers without Redis, the table dropped
 * and loaded again after POSITION, FENCED, a new connection, an outage of
 * one chunk or of the call, an offsets reset; a changed partition count
 * refused, the layout key followed, and the memory bound. */
#include "loop/partscope.h"

#include "fake_partredis.h"
#include "loop/parttables.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define T_RECS 1600

typedef struct {
    idem_record_t r;
    rd_kafka_message_t m;
    char id[32], mid[32];
} trec_t;

static fake_partredis_t fr;
static idem_conf_t *conf;
static idem_partscope_t *ps;
static char topic[] = "in";
static idem_part_t parts[FAKE_PR_PARTS];
static trec_t tr[T_RECS];
static idem_record_t *recs[T_RECS];
static idem_part_t *rpart[T_RECS];
static idem_result_t now[T_RECS];
static size_t nnow, nrest, nrpos, nrec;
static const idem_store_pos_t *rpos;
static char err[512];
static int64_t kafka_count = 4; /* the input's partitions, as Kafka says */

static int count_fn(void *opaque, const char *t, char *errstr,
                    size_t errstr_size)
{
    (void)opaque;
    cr_assert_str_eq(t, topic);
    if (kafka_count < 0)
        snprintf(errstr, errstr_size, "metadata timed out");
    return (int)kafka_count;
}

static void start(void)
{
    idem_partscope_redis_t seam = fake_partredis_init(&fr);
    conf = idem_conf_new();
    char e[256];
    cr_assert_eq(idem_conf_set(conf, "dedup.scope", "partition", e, sizeof(e)),
                 0, "%s", e);
    cr_assert_eq(idem_conf_set(conf, "group.id", "g", e, sizeof(e)), 0);
    cr_assert_eq(idem_conf_set(conf, "member.id", "m1", e, sizeof(e)), 0);
    for (int i = 0; i < FAKE_PR_PARTS; i++)
        parts[i] = (idem_part_t){.topic = topic, .partition = i, .saved = -1};
    kafka_count = 4;
    ps = idem_partscope_new_with(&seam, conf);
    idem_partscope_counter(ps, count_fn, NULL);
}

static void stop(void)
{
    idem_partscope_destroy(ps);
    idem_conf_destroy(conf);
}

TestSuite(partscope, .init = start, .fini = stop);

/* Adds a keyed input record of partition p to the next request. */
static idem_record_t *add(int32_t p, const char *id, const char *mid)
{
    cr_assert_lt(nrec, T_RECS);
    trec_t *t = &tr[nrec];
    memset(t, 0, sizeof(*t));
    snprintf(t->id, sizeof(t->id), "%s", id);
    snprintf(t->mid, sizeof(t->mid), "%s", mid);
    t->m.key = t->id;
    t->m.key_len = strlen(t->id);
    t->m.partition = p;
    t->r = (idem_record_t){
        .topic = topic,
        .partition = p,
        .offset = (int64_t)nrec,
        .key = t->id,
        .key_len = strlen(t->id),
        .identity = t->id,
        .identity_len = strlen(t->id),
        .message_id = t->mid,
        .message_id_len = strlen(t->mid),
        .msg = &t->m,
    };
    recs[nrec] = &t->r;
    rpart[nrec] = &parts[p];
    return recs[nrec++];
}

/* Submits the records added since the last call with pos[npos]. */
static int submit_pos(const idem_store_pos_t *pos, size_t npos)
{
    size_t n = nrec;
    nrec = 0;
    err[0] = '\0';
    return idem_partscope_submit(ps, recs, rpart, n, pos, npos, now, &nnow,
                                 &nrest, &rpos, &nrpos, err, sizeof(err));
}

static int submit(void)
{
    return submit_pos(NULL, 0);
}

/* The result of record r in now[], or NULL. */
static const idem_result_t *result_of(const idem_record_t *r)
{
    for (size_t i = 0; i < nnow; i++)
        if (now[i].rec == r)
            return &now[i];
    return NULL;
}

static void expect_kind(const idem_record_t *r, idem_result_kind_t k)
{
    const idem_result_t *res = result_of(r);
    cr_assert(res, "record %.*s has no result", (int)r->identity_len,
              r->identity);
    cr_expect_eq(res->kind, k, "record %.*s: %d, expected %d",
                 (int)r->identity_len, r->identity, res->kind, k);
}

/* A mark as the member computes it (the fake's group key). */
static idem_mark_t16 mark_of(const char *id, const char *mid)
{
    idem_parttables_t *t =
        idem_parttables_new((const uint8_t *)"0123456789abcdef", 1 << 20);
    idem_mark_t16 m;
    idem_parttables_mark(t, id, strlen(id), mid, strlen(mid), &m);
    idem_parttables_destroy(t);
    return m;
}

Test(partscope, a_partition_is_loaded_before_its_first_chunk_epoch_first)
{
    /* A previous owner reached epoch 5 and position 41. */
    fr.part[0].epoch = 5;
    fr.part[0].position = 41;
    idem_record_t *a = add(0, "a", "m-a");
    idem_store_pos_t pos = {.topic = topic, .partition = 0, .offset = 42};
    cr_assert_eq(submit_pos(&pos, 1), 0, "%s", err);
    cr_expect_str_eq(fr.log, "count:in bump:in/0 pos:in/0 load:in/0 chunks:1 ");
    cr_expect_eq(fr.part[0].epoch, 6, "bumped once");
    cr_assert_eq(nnow, 1);
    expect_kind(a, IDEM_RESULT_DONE);
    /* The chunk was sent at the new epoch, expecting Redis's position
     * (the fake refuses anything else), and carried the new one. */
    cr_expect_eq(fr.part[0].position, 42);
    cr_expect_eq(parts[0].saved, 42);
    cr_expect_eq(nrpos, 0, "the chunk carried the position");
    cr_expect_eq(nrest, 0);
    cr_expect_eq(fr.part[0].n, 1, "one mark appended");
}

Test(partscope, a_duplicate_is_answered_from_the_table_without_redis)
{
    /* One mark a previous owner wrote, one this member writes. */
    idem_mark_t16 old = mark_of("old", "m-old");
    fake_partredis_put(&fr, 0, old.b, fr.now / fr.wsec);
    idem_record_t *a = add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    expect_kind(a, IDEM_RESULT_DONE);
    fake_partredis_log_clear(&fr);
    int calls = fr.chunk_calls;

    idem_record_t *again = add(0, "a", "m-a");  /* a redelivery */
    idem_record_t *other = add(0, "a", "m-a2"); /* same identity, other id */
    idem_record_t *o = add(0, "old", "m-old");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_str_eq(fr.log, "", "no Redis call: %s", fr.log);
    cr_expect_eq(fr.chunk_calls, calls);
    cr_assert_eq(nnow, 3);
    expect_kind(again, IDEM_RESULT_DUPLICATE);
    expect_kind(other, IDEM_RESULT_DUPLICATE);
    expect_kind(o, IDEM_RESULT_DUPLICATE);
    /* The same message id's digest: told as the same message. */
    cr_expect_str_eq(result_of(again)->prior_mid, "m-a");
    cr_expect_eq(result_of(other)->prior_mid_len, 0, "another message");
    cr_expect_str_eq(result_of(o)->prior_mid, "m-old");
}

Test(partscope, a_repeat_in_one_request_waits_for_its_first)
{
    idem_record_t *a1 = add(0, "a", "m-1");
    idem_record_t *a2 = add(0, "a", "m-2");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_eq(fr.part[0].n, 1, "one mark sent for the identity");
    cr_assert_eq(nnow, 2);
    expect_kind(a1, IDEM_RESULT_DONE);
    expect_kind(a2, IDEM_RESULT_DUPLICATE);

    /* A refused first is no done mark: its repeat is not answered, and
     * once refused (a moved mark) the identity takes the global path. */
    fr.reject = "r";
    idem_record_t *r1 = add(0, "r", "m-1");
    idem_record_t *r2 = add(0, "r", "m-2");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_assert_eq(nnow, 1);
    expect_kind(r1, IDEM_RESULT_REJECT);
    cr_expect_null(result_of(r2), "left for the next pass");
    cr_expect_eq(nrest, 0);
    int calls = fr.chunk_calls;
    idem_record_t *r3 = add(0, "r", "m-2");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_eq(nnow, 0);
    cr_assert_eq(nrest, 1, "moved: the handler's global script");
    cr_expect_eq(recs[0], r3);
    cr_expect_eq(fr.chunk_calls, calls);
}

Test(partscope, position_refused_drops_the_table_and_loads_it_again)
{
    idem_store_pos_t pos = {.topic = topic, .partition = 0, .offset = 10};
    add(0, "a", "m-a");
    cr_assert_eq(submit_pos(&pos, 1), 0, "%s", err);
    /* Redis lost its tail (an AOF cut): a's mark and the position. */
    fr.part[0].n = 0;
    fr.part[0].position = -1;
    idem_record_t *b = add(0, "b", "m-b");
    cr_expect_eq(submit(), -1);
    cr_expect(strstr(err, "POSITION"), "%s", err);
    cr_expect_eq(nnow, 0, "nothing answered: %zu", nnow);
    cr_expect_null(result_of(b));

    /* Loaded again: a, whose effect is gone, is applied again rather than
     * answered from the old table; b goes too. */
    fake_partredis_log_clear(&fr);
    idem_record_t *a = add(0, "a", "m-a");
    b = add(0, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_str_eq(fr.log, "count:in bump:in/0 pos:in/0 load:in/0 chunks:1 ");
    expect_kind(a, IDEM_RESULT_DONE);
    expect_kind(b, IDEM_RESULT_DONE);
    cr_expect_eq(parts[0].saved, -1, "the position Redis holds now");
}

Test(partscope, a_load_behind_what_redis_acknowledged_is_counted_once)
{
    /* A load that finds Redis ahead of what the member believed (a new
     * owner) is no loss. */
    fr.part[0].position = 41;
    idem_store_pos_t pos = {.topic = topic, .partition = 0, .offset = 50};
    add(0, "a", "m-a");
    cr_assert_eq(submit_pos(&pos, 1), 0, "%s", err);
    cr_expect_eq(parts[0].saved, 50);
    cr_expect_eq(idem_partscope_behind_take(ps), 0);
    /* Redis restarts at 45, behind the 50 it acknowledged: the table's
     * load reports it, once. */
    fr.part[0].position = 45;
    fr.part[0].n = 0;
    fr.connections++;
    add(0, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_eq(parts[0].saved, 45, "the next chunk starts where redis is");
    cr_expect_eq(idem_partscope_behind_take(ps), 1);
    cr_expect_eq(idem_partscope_behind_take(ps), 0, "taken");
    /* Loaded again with nothing lost: nothing more. */
    fr.connections++;
    add(0, "c", "m-c");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_eq(idem_partscope_behind_take(ps), 0);
}

Test(partscope, a_new_connection_loads_every_table_again)
{
    add(0, "a", "m-a");
    add(1, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_assert_eq(fr.loads, 2);
    /* Redis restarted without its last writes: a new run_id, a new
     * connection. */
    fr.part[0].n = fr.part[1].n = 0;
    fr.connections++;
    fake_partredis_log_clear(&fr);
    idem_record_t *a = add(0, "a", "m-a");
    idem_record_t *b = add(1, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect(strstr(fr.log, "bump:in/0 pos:in/0 load:in/0"), "%s", fr.log);
    cr_expect(strstr(fr.log, "bump:in/1 pos:in/1 load:in/1"), "%s", fr.log);
    cr_expect_eq(fr.loads, 4);
    expect_kind(a, IDEM_RESULT_DONE);
    expect_kind(b, IDEM_RESULT_DONE);
    cr_expect_eq(fr.part[0].n, 1, "a applied again");
    cr_expect_eq(fr.part[1].n, 1, "b applied again");
}

Test(partscope, fenced_resets_the_table_and_loads_at_a_new_epoch)
{
    add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_assert_eq(fr.part[0].epoch, 1);
    /* Another member took the partition over (its bump). */
    fr.part[0].epoch++;
    idem_record_t *b = add(0, "b", "m-b");
    cr_expect_eq(submit(), -1);
    cr_expect(strstr(err, "FENCED"), "%s", err);
    cr_expect_eq(nnow, 0);
    cr_expect_null(result_of(b));
    cr_expect_eq(fr.part[0].n, 1, "nothing written");
    /* Assigned back: a bump of its own before the table is used again. */
    fake_partredis_log_clear(&fr);
    b = add(0, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_str_eq(fr.log, "count:in bump:in/0 pos:in/0 load:in/0 chunks:1 ");
    cr_expect_eq(fr.part[0].epoch, 3);
    expect_kind(b, IDEM_RESULT_DONE);
}

Test(partscope, an_outage_of_one_chunk_resets_only_its_partition)
{
    add(0, "x0", "m");
    add(1, "y0", "m");
    cr_assert_eq(submit(), 0, "%s", err);
    fr.part[1].refuse_next = IDEM_PARTSTATE_OUTAGE;
    idem_record_t *x = add(0, "x", "m-x");
    idem_record_t *y = add(1, "y", "m-y");
    idem_record_t *x2 = add(0, "x", "m-x2");
    cr_expect_eq(submit(), -1);
    cr_expect(strstr(err, "in/1"), "%s", err);
    /* The other partition's answers stand, its held repeat too. */
    cr_assert_eq(nnow, 2);
    expect_kind(x, IDEM_RESULT_DONE);
    expect_kind(x2, IDEM_RESULT_DUPLICATE);
    cr_expect_null(result_of(y));
    fake_partredis_log_clear(&fr);
    y = add(1, "y", "m-y");
    x2 = add(0, "x", "m-x2");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_str_eq(fr.log, "count:in bump:in/1 pos:in/1 load:in/1 chunks:1 ");
    expect_kind(y, IDEM_RESULT_DONE);
    expect_kind(x2, IDEM_RESULT_DUPLICATE);
}

Test(partscope, a_failed_call_resets_every_partition_it_carried)
{
    add(0, "x0", "m");
    add(1, "y0", "m");
    add(2, "z0", "m");
    cr_assert_eq(submit(), 0, "%s", err);
    fr.chunks_down = 1;
    add(0, "x", "m-x");
    add(1, "y", "m-y");
    cr_expect_eq(submit(), -1);
    cr_expect_eq(nnow, 0);
    fr.chunks_down = 0;
    fake_partredis_log_clear(&fr);
    add(0, "x", "m-x");
    add(1, "y", "m-y");
    add(2, "z0", "m");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect(strstr(fr.log, "load:in/0"), "%s", fr.log);
    cr_expect(strstr(fr.log, "load:in/1"), "%s", fr.log);
    cr_expect(!strstr(fr.log, "in/2"), "not in the failed call: %s", fr.log);
    cr_expect_eq(nnow, 3);
}

Test(partscope, an_offsets_reset_or_a_drop_loads_the_partition_again)
{
    add(0, "a", "m-a");
    add(1, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    idem_partscope_reset(ps, "in", 0);
    fake_partredis_log_clear(&fr);
    idem_record_t *a = add(0, "a", "m-a");
    idem_record_t *b = add(1, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_str_eq(fr.log, "count:in bump:in/0 pos:in/0 load:in/0 ");
    expect_kind(a, IDEM_RESULT_DUPLICATE); /* from the reloaded table */
    expect_kind(b, IDEM_RESULT_DUPLICATE);

    idem_partscope_drop(ps, "in", 1);
    fake_partredis_log_clear(&fr);
    b = add(1, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_str_eq(fr.log, "count:in bump:in/1 pos:in/1 load:in/1 ");
    expect_kind(b, IDEM_RESULT_DUPLICATE);
}

Test(partscope, a_changed_partition_count_is_refused_until_recorded)
{
    fr.recorded = 2;
    idem_record_t *a = add(0, "a", "m-a");
    cr_expect_eq(submit(), -1);
    cr_expect_str_eq(err, "input topic in has 4 partitions, 2 recorded in "
                          "redis: its partitions wait (dedup.scope=partition)");
    cr_expect_eq(fr.bumps, 0, "no epoch bump");
    cr_expect_eq(fr.loads, 0);
    cr_expect_eq(fr.chunk_calls, 0);
    cr_expect_eq(nnow, 0);
    /* Kafka does not answer: wait too, and say so. */
    kafka_count = -1;
    add(0, "a", "m-a");
    cr_expect_eq(submit(), -1);
    cr_expect_str_eq(err, "partition count of input topic in not known "
                          "(metadata timed out): its partitions wait "
                          "(dedup.scope=partition)");
    cr_expect_eq(fr.bumps, 0);
    /* The operator records the current count. */
    kafka_count = 4;
    fr.recorded = 4;
    a = add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    expect_kind(a, IDEM_RESULT_DONE);
}

Test(partscope, the_first_count_is_recorded)
{
    add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_eq(fr.recorded, 4);
}

Test(partscope, under_the_global_layout_everything_goes_to_the_handler)
{
    add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_str_eq(fr.effect_layout, "partition");
    /* Switched to global long ago (past one TTL): the key is read again
     * after a failed handler request, the tables go. */
    fr.layout.layout = IDEM_LAYOUT_GLOBAL;
    fr.layout.from = IDEM_LAYOUT_PARTITION;
    fr.layout.since = fr.now - conf->dedup_ttl_seconds - 1;
    idem_partscope_layout_recheck(ps);
    fake_partredis_log_clear(&fr);
    idem_record_t *a = add(0, "a", "m-a");
    add(1, "b", "m-b");
    idem_store_pos_t pos = {.topic = topic, .partition = 0, .offset = 7};
    cr_assert_eq(submit_pos(&pos, 1), 0, "%s", err);
    cr_expect_str_eq(fr.log, "", "no partition call: %s", fr.log);
    cr_expect_eq(nnow, 0);
    cr_expect_eq(nrest, 2);
    cr_expect_eq(recs[0], a);
    cr_expect_eq(nrpos, 1);
    cr_expect_eq(rpos[0].offset, 7);
    cr_expect_str_eq(fr.effect_layout, "global");
    cr_expect_eq(idem_partscope_marks(ps), 0, "tables dropped");
    uint64_t chunk, global;
    idem_partscope_layout_refusals(ps, &chunk, &global);
    cr_expect_eq(global, 1, "the failed request's LAYOUT counted");
    cr_expect_eq(chunk, 0);
}

Test(partscope, a_chunk_refused_layout_routes_its_records_again)
{
    add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    int reads = fr.layout_reads;
    fr.part[0].refuse_next = IDEM_PARTSTATE_LAYOUT;
    idem_record_t *b = add(0, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_null(result_of(b), "due again");
    cr_expect_eq(nrest, 0);
    cr_expect_gt(fr.layout_reads, reads, "the key read again at once");
    uint64_t chunk, global;
    idem_partscope_layout_refusals(ps, &chunk, &global);
    cr_expect_eq(chunk, 1);
    cr_expect_eq(global, 0);
    /* The tables went with it: loaded again at the next records. */
    fake_partredis_log_clear(&fr);
    b = add(0, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_str_eq(fr.log, "count:in bump:in/0 pos:in/0 load:in/0 chunks:1 ");
    expect_kind(b, IDEM_RESULT_DONE);
}

Test(partscope, a_switch_from_global_honours_its_marks_for_one_ttl)
{
    fr.layout.layout = IDEM_LAYOUT_PARTITION;
    fr.layout.from = IDEM_LAYOUT_GLOBAL;
    fr.layout.since = fr.now - 10;
    idem_partscope_layout_recheck(ps);
    add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_eq(fr.honour, 1, "chunks carry the identities");
    /* Past one TTL: no longer. */
    fr.layout.since = fr.now - conf->dedup_ttl_seconds - 1;
    idem_partscope_layout_recheck(ps);
    add(0, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_eq(fr.honour, 0);
}

Test(partscope, a_rolled_back_member_switches_the_key_and_only_reads_tables)
{
    /* A member that wants global starts against a group under partition:
     * it switches the key back at start. */
    idem_partscope_destroy(ps);
    char e[256];
    cr_assert_eq(idem_conf_set(conf, "dedup.scope", "global", e, sizeof(e)), 0);
    idem_mark_t16 m = mark_of("a", "m-a");
    idem_partscope_redis_t seam = fake_partredis_init(&fr);
    fake_partredis_put(&fr, 0, m.b, fr.now / fr.wsec);
    ps = idem_partscope_new_with(&seam, conf);
    idem_partscope_counter(ps, count_fn, NULL);
    cr_expect_str_eq(fr.log, "switch:global ");
    cr_expect_eq(fr.layout.layout, IDEM_LAYOUT_GLOBAL);
    cr_expect_eq(fr.layout.since, fr.now);
    /* For one TTL: what partition applied is answered from its table,
     * the rest goes to the global script; no chunk is written. */
    idem_record_t *a = add(0, "a", "m-a");
    idem_record_t *b = add(0, "b", "m-b");
    idem_record_t *b2 = add(0, "b", "m-b2");
    cr_assert_eq(submit(), 0, "%s", err);
    cr_expect_eq(fr.chunk_calls, 0);
    cr_expect_eq(fr.honour, 0);
    cr_assert_eq(nnow, 1);
    expect_kind(a, IDEM_RESULT_DUPLICATE);
    cr_assert_eq(nrest, 2);
    cr_expect_eq(recs[0], b);
    cr_expect_eq(recs[1], b2);
    cr_expect_eq(fr.switches, 1);
}

Test(partscope, a_partition_past_the_memory_bound_is_refused)
{
    /* The bound is below what partition 0's marks need. */
    idem_partscope_destroy(ps);
    conf->dedup_memory_max = 4096;
    idem_partscope_redis_t seam = fake_partredis_init(&fr);
    for (int i = 0; i < 2000; i++) {
        char id[16];
        snprintf(id, sizeof(id), "id-%d", i);
        idem_mark_t16 m = mark_of(id, "m");
        fake_partredis_put(&fr, 0, m.b, fr.now / fr.wsec);
    }
    ps = idem_partscope_new_with(&seam, conf);
    idem_partscope_counter(ps, count_fn, NULL);
    idem_record_t *a = add(0, "id-1", "m");
    add(1, "b", "m-b");
    cr_expect_eq(submit(), -1);
    cr_expect_str_eq(err, "dedup.memory.max reached: the table of in/0 alone "
                          "does not fit in 4096 bytes");
    cr_expect_eq(fr.chunk_calls, 0);
    cr_expect_eq(nnow, 0);
    cr_expect_null(result_of(a));
    cr_expect_lt(idem_partscope_bytes(ps), 4096, "the table was emptied");
    /* Partition 1 alone fits. */
    idem_record_t *b = add(1, "b", "m-b");
    cr_assert_eq(submit(), 0, "%s", err);
    expect_kind(b, IDEM_RESULT_DONE);
}

Test(partscope, big_requests_go_in_chunks_and_only_the_last_moves_the_position)
{
    fr.part[0].position = 3;
    for (int i = 0; i < 1500; i++) {
        char id[16];
        snprintf(id, sizeof(id), "k%d", i);
        add(0, id, "m");
    }
    idem_store_pos_t pos[2] = {
        {.topic = topic, .partition = 0, .offset = 1503},
        {.topic = topic, .partition = 2, .offset = 9}, /* no chunk */
    };
    cr_assert_eq(submit_pos(pos, 2), 0, "%s", err);
    cr_expect_eq(fr.chunks_sent, 2, "1,024 + 476");
    cr_expect_eq(nnow, 1500);
    cr_expect_eq(fr.part[0].position, 1503);
    cr_assert_eq(nrpos, 1, "the position no chunk carried");
    cr_expect_eq(rpos[0].partition, 2);
}

Test(partscope, marks_expire_by_the_window_redis_answers)
{
    idem_record_t *a = add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    a = add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    expect_kind(a, IDEM_RESULT_DUPLICATE);
    /* One TTL and two windows later (a chunk lands there), a's mark is
     * gone in Redis and in the table. */
    fr.now += conf->dedup_ttl_seconds + 2 * fr.wsec;
    add(0, "z", "m-z");
    cr_assert_eq(submit(), 0, "%s", err);
    a = add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    expect_kind(a, IDEM_RESULT_DONE);
}

Test(partscope, records_off_the_partition_path_go_to_the_handler)
{
    idem_record_t *k = add(0, "a", "m-a");
    idem_record_t *nokey = add(0, "b", "m-b");
    tr[1].m.key = NULL;
    tr[1].m.key_len = 0;
    cr_assert_eq(submit(), 0, "%s", err);
    expect_kind(k, IDEM_RESULT_DONE);
    cr_assert_eq(nrest, 1);
    cr_expect_eq(recs[0], nokey);
}

Test(partscope, redis_down_at_the_load_is_an_outage)
{
    fr.down = 1;
    add(0, "a", "m-a");
    cr_expect_eq(submit(), -1);
    cr_expect(strstr(err, "connection refused"), "%s", err);
    cr_expect_eq(nnow, 0);
    fr.down = 0;
    idem_record_t *a = add(0, "a", "m-a");
    cr_assert_eq(submit(), 0, "%s", err);
    expect_kind(a, IDEM_RESULT_DONE);
}

Test(partscope, at_the_memory_bound_new_marks_wait_until_a_partition_leaves)
{
    idem_partscope_destroy(ps);
    conf->dedup_memory_max = 8192;
    idem_partscope_redis_t seam = fake_partredis_init(&fr);
    ps = idem_partscope_new_with(&seam, conf);
    idem_partscope_counter(ps, count_fn, NULL);
    /* Partition 0 fills the tables, 50 records a request. */
    int k = 0;
    while (idem_partscope_bytes(ps) < 8192) {
        cr_assert_lt(k, 5000, "the tables never reached the bound");
        for (int i = 0; i < 50; i++, k++) {
            char id[16];
            snprintf(id, sizeof(id), "f%d", k);
            add(0, id, "m");
        }
        cr_assert_eq(submit(), 0, "%s", err);
    }
    size_t bytes = idem_partscope_bytes(ps), marks = idem_partscope_marks(ps);
    int calls = fr.chunk_calls;
    /* At the bound: nothing taken, nothing sent, no table loaded; the
     * records wait (an outage naming the bound). */
    idem_record_t *a = add(0, "new-0", "m");
    idem_record_t *b = add(1, "new-1", "m");
    cr_expect_eq(submit(), -1);
    cr_expect(strstr(err, "dedup.memory.max reached"), "%s", err);
    cr_expect_eq(nnow, 0);
    cr_expect_null(result_of(a));
    cr_expect_null(result_of(b));
    cr_expect_eq(fr.chunk_calls, calls, "no chunk sent");
    cr_expect_eq(fr.part[1].epoch, 0, "partition 1 not loaded");
    cr_expect_eq(idem_partscope_marks(ps), marks, "no mark taken");
    cr_expect_eq(idem_partscope_bytes(ps), bytes);
    /* Partition 0 leaves (revoked): room again. */
    idem_partscope_drop(ps, "in", 0);
    b = add(1, "new-1", "m");
    cr_assert_eq(submit(), 0, "%s", err);
    expect_kind(b, IDEM_RESULT_DONE);
}
