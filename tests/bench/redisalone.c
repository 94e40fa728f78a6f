/* redisalone: the "Redis alone" row of `make bench`: what Redis can do for
 * the ledger work of one topic when no member stands in front of it.
 *
 * First (not timed) it reads every record of the configuration's input
 * topic, from the beginning to the high watermarks, and reads each one
 * with idemproc's own envelope rules, as a member does; poison records are
 * left out (a member never sends them to Redis either). Then (timed) it
 * sends the valid envelopes through idemproc's own ledger handler and
 * store (idem_handler_ledger's submit/collect: the same script, the same
 * arguments, the same chunking, positions of the request's partitions
 * written after the chunks) in requests of batch.max.messages records, over
 * --connections connections with one request in flight each, so Redis always
 * has the next request queued while the driver reads a reply. Nothing here
 * parses JSON or touches Kafka while the clock runs.
 *
 * Prints one line:
 *   redisalone: topic_records N sent N applied N duplicates N requests N
 *   connections N seconds S rate R
 * where rate = topic_records / seconds (the unit every bench row uses:
 * records of the topic per second). Every result must be "applied" or
 * "duplicate"; an outage or a rejected record fails the run (exit 1). The
 * ledger it writes is the one the configuration's prefix names, so
 * `idemproc verify` (without --dlq) can check it.
 *
 * With --effect-only it sends, for the same requests over the same
 * connections, only the effect: one EVALSHA per request of a script that
 * sums the amounts per (currency, user) and applies one HINCRBY each, as
 * the ledger script does, with no mark read or written and no position;
 * a repeated identity is left out in the driver (as a member holding its
 * partitions' marks would), so the ledger still comes out exact. That is
 * the Redis work a layout whose marks cost Redis nothing would leave
 * (docs/design.md, "Dedup state layout").
 *
 * With --partition it sends the same requests through the partition
 * layout (dedup.scope=partition; docs/design.md, "Dedup state layout"):
 * the driver holds each partition's marks in loop/parttables.c, as the
 * owning member would, answers duplicates itself and sends each request's
 * new records as one chunk script per partition (redis/partstate.c: epoch
 * and position checked, the ledger's effect, the marks and the position
 * written), a request's chunks pipelined in one write, one connection.
 *
 * Links idemproc's library objects; not part of the product binary. */
#include "conf/conf.h"
#include "effect/handler.h"
#include "input/envelope.h"
#include "redis/redisconn.h"
#include "loop/parttables.h"
#include "redis/layout.h"
#include "redis/partstate.h"
#include "redis/store.h"
#include "base/util.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>

/* The group runs the partition layout (the layout key; a fresh Redis: a
 * group that never ran switches with nothing of the global layout to
 * honour). 0, or -1 with errstr. */
static int switch_to_partition(idem_store_t *store, const idem_conf_t *conf,
                               char *errstr, size_t errstr_size)
{
    char sha[41] = "";
    idem_layout_t l;
    if (idem_layout_store_switch(store, conf, sha, IDEM_LAYOUT_GLOBAL,
                                 IDEM_LAYOUT_PARTITION, &l, errstr,
                                 errstr_size) < 0)
        return -1;
    if (l.layout != IDEM_LAYOUT_PARTITION) {
        snprintf(errstr, errstr_size, "dedup layout: not partition");
        return -1;
    }
    return 0;
}

#define MAX_CONNECTIONS 16
#define MAX_SETS        32

typedef struct {
    idem_envelope_t *env; /* valid records, in the order they were read */
    int32_t *partition;
    int64_t *offset;
    size_t n, cap;
    uint64_t topic_records; /* valid and poison */
} records_t;

static void records_add(records_t *r, const idem_envelope_t *env,
                        int32_t partition, int64_t offset)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 65536;
        r->env = idem_xrealloc(r->env, r->cap * sizeof(*r->env));
        r->partition = idem_xrealloc(r->partition, r->cap * sizeof(int32_t));
        r->offset = idem_xrealloc(r->offset, r->cap * sizeof(int64_t));
    }
    r->env[r->n] = *env;
    r->partition[r->n] = partition;
    r->offset[r->n] = offset;
    r->n++;
}

/* Reads every record of `topic` up to the high watermarks seen at the
 * start into `out` (valid envelopes by `rules`; poison only counted).
 * Returns 0, or -1 with errstr. */
static int read_topic(const idem_conf_t *conf, const char *topic,
                      const idem_envelope_rules_t *rules, records_t *out,
                      char *errstr, size_t errstr_size)
{
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    char group[64];
    snprintf(group, sizeof(group), "redisalone-reader-%ld", (long)getpid());
    if (idem_conf_apply_kafka(conf, kc, errstr, errstr_size) ||
        rd_kafka_conf_set(kc, "group.id", group, errstr, errstr_size) ||
        rd_kafka_conf_set(kc, "enable.auto.commit", "false", errstr,
                          errstr_size)) {
        rd_kafka_conf_destroy(kc);
        return -1;
    }
    rd_kafka_t *rk =
        rd_kafka_new(RD_KAFKA_CONSUMER, kc, errstr, (size_t)errstr_size);
    if (!rk)
        return -1;
    int rc = -1;
    rd_kafka_topic_partition_list_t *parts = NULL;
    int64_t *high = NULL;
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, 10000);
    rd_kafka_topic_destroy(rkt);
    if (err || md->topic_cnt != 1 || md->topics[0].err) {
        snprintf(errstr, errstr_size, "%s: no metadata: %s", topic,
                 rd_kafka_err2str(err             ? err
                                  : md->topic_cnt ? md->topics[0].err
                                                  : RD_KAFKA_RESP_ERR_UNKNOWN));
        goto out;
    }
    int np = md->topics[0].partition_cnt;
    parts = rd_kafka_topic_partition_list_new(np);
    high = idem_xcalloc((size_t)np, sizeof(*high));
    int64_t remaining = 0;
    for (int p = 0; p < np; p++) {
        int64_t lo, hi;
        int32_t id = md->topics[0].partitions[p].id;
        if ((err = rd_kafka_query_watermark_offsets(rk, topic, id, &lo, &hi,
                                                    10000))) {
            snprintf(errstr, errstr_size, "%s [%" PRId32 "]: watermarks: %s",
                     topic, id, rd_kafka_err2str(err));
            goto out;
        }
        high[p] = hi;
        remaining += hi - lo;
        if (hi > lo)
            rd_kafka_topic_partition_list_add(parts, topic, id)->offset = lo;
    }
    if ((err = rd_kafka_assign(rk, parts))) {
        snprintf(errstr, errstr_size, "%s: assign: %s", topic,
                 rd_kafka_err2str(err));
        goto out;
    }
    int64_t idle_since = idem_now_ms();
    while (remaining > 0) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) {
            if (idem_now_ms() - idle_since > 30000) {
                snprintf(errstr, errstr_size,
                         "%s: %" PRId64 " records not read after 30 s", topic,
                         remaining);
                goto out;
            }
            continue;
        }
        idle_since = idem_now_ms();
        if (m->err) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                snprintf(errstr, errstr_size, "%s: %s", topic,
                         rd_kafka_message_errstr(m));
                rd_kafka_message_destroy(m);
                goto out;
            }
            rd_kafka_message_destroy(m);
            continue;
        }
        int p = m->partition;
        if (p >= 0 && p < np && m->offset < high[p]) {
            rd_kafka_headers_t *h = NULL;
            if (rd_kafka_message_headers(m, &h))
                h = NULL;
            idem_envelope_t env;
            idem_reason_t reason;
            char perr[256];
            out->topic_records++;
            remaining--;
            if (idem_envelope_read(rules, m->payload, m->len, h, m->key,
                                   m->key_len, &env, &reason, perr,
                                   sizeof(perr)) == 0)
                records_add(out, &env, m->partition, m->offset);
        }
        rd_kafka_message_destroy(m);
    }
    rc = 0;
out:
    if (md)
        rd_kafka_metadata_destroy(md);
    if (parts)
        rd_kafka_topic_partition_list_destroy(parts);
    free(high);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return rc;
}

/* The positions a member would write with request [from, to): per
 * partition, the offset after its last record there. Returns the count
 * written into pos (room for `max`). */
static size_t request_positions(const records_t *r, size_t from, size_t to,
                                const char *topic, idem_store_pos_t *pos,
                                size_t max)
{
    size_t n = 0;
    for (size_t i = from; i < to; i++) {
        size_t k = 0;
        while (k < n && pos[k].partition != r->partition[i])
            k++;
        if (k == n) {
            if (n == max)
                continue;
            pos[n++] = (idem_store_pos_t){
                .topic = topic, .partition = r->partition[i], .offset = 0};
        }
        if (r->offset[i] + 1 > pos[k].offset)
            pos[k].offset = r->offset[i] + 1;
    }
    return n;
}

/* The effect alone: the ledger script's increments without its marks. */
static const char effect_lua[] =
    "local prefix = ARGV[1]\n"
    "local sums = {}\n"
    "for b = 2, #ARGV, 3 do\n"
    "  local h = prefix .. 'ledger:' .. ARGV[b]\n"
    "  sums[h] = sums[h] or {}\n"
    "  local f = ARGV[b + 1]\n"
    "  sums[h][f] = (sums[h][f] or 0) + tonumber(ARGV[b + 2])\n"
    "end\n"
    "for h, fields in pairs(sums) do\n"
    "  for f, x in pairs(fields) do\n"
    "    redis.call('HINCRBY', h, f, string.format('%.0f', x))\n"
    "  end\n"
    "end\n"
    "redis.call('INCRBY', prefix .. 'ledger:applied', (#ARGV - 1) / 3)\n"
    "return (#ARGV - 1) / 3\n";

/* FNV-1a of an identity, for the driver's set of identities seen. */
static uint64_t fnv(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

/* Marks keep[i] = 0 for each record whose identity came earlier (an open
 * addressing set of indexes). Returns how many are left. */
static size_t first_occurrences(const records_t *r, unsigned char *keep)
{
    size_t cap = 1;
    while (cap < r->n * 2 + 2)
        cap <<= 1;
    size_t *slot = idem_xcalloc(cap, sizeof(*slot)); /* index + 1; 0 empty */
    size_t left = 0;
    for (size_t i = 0; i < r->n; i++) {
        const idem_envelope_t *e = &r->env[i];
        size_t k = (size_t)fnv(e->identity, e->identity_len) & (cap - 1);
        keep[i] = 1;
        for (; slot[k]; k = (k + 1) & (cap - 1)) {
            const idem_envelope_t *o = &r->env[slot[k] - 1];
            if (o->identity_len == e->identity_len &&
                !memcmp(o->identity, e->identity, e->identity_len)) {
                keep[i] = 0;
                break;
            }
        }
        if (keep[i]) {
            slot[k] = i + 1;
            left++;
        }
    }
    free(slot);
    return left;
}

/* Appends the EVALSHA of records [from, to) that keep[] keeps to c. */
static void effect_append(redisContext *c, const char *sha, const char *prefix,
                          const records_t *r, const unsigned char *keep,
                          size_t from, size_t to)
{
    size_t max = 4 + 3 * (to - from);
    const char **argv = idem_xmalloc(max * sizeof(*argv));
    size_t *len = idem_xmalloc(max * sizeof(*len));
    char *nums = idem_xmalloc((to - from + 1) * 24);
    size_t n = 0, kept = 0;
    argv[n] = "EVALSHA", len[n++] = 7;
    argv[n] = sha, len[n++] = strlen(sha);
    argv[n] = "0", len[n++] = 1;
    argv[n] = prefix, len[n++] = strlen(prefix);
    for (size_t i = from; i < to; i++) {
        if (!keep[i])
            continue;
        const idem_envelope_t *e = &r->env[i];
        char *a = nums + 24 * kept++;
        snprintf(a, 24, "%" PRId64, e->amount_minor);
        argv[n] = e->currency, len[n++] = strlen(e->currency);
        argv[n] = e->user_id, len[n++] = strlen(e->user_id);
        argv[n] = a, len[n++] = strlen(a);
    }
    redisAppendCommandArgv(c, (int)n, argv, len);
    free(argv);
    free(len);
    free(nums);
}

/* --effect-only: see the file's comment. Prints the same line as the
 * ledger run (applied: the records sent, duplicates: those left out).
 * Returns 0 or 1. */
static int effect_only(const idem_conf_t *conf, const records_t *recs,
                       int conns)
{
    char errstr[1024];
    const char *prefix = conf->redis_prefix;
    unsigned char *keep = idem_xmalloc(recs->n + 1);
    size_t unique = first_occurrences(recs, keep);
    size_t batch = (size_t)conf->batch_max_messages;
    idem_redisconn_t *rc[MAX_CONNECTIONS];
    redisContext *c[MAX_CONNECTIONS];
    char sha[64] = "";
    for (int i = 0; i < conns; i++) {
        if (!(rc[i] = idem_redisconn_open(conf, 0, errstr, sizeof(errstr)))) {
            fprintf(stderr, "redisalone: %s\n", errstr);
            return 1;
        }
        c[i] = idem_redisconn_context(rc[i]);
        /* Long requests: no client timeout. */
        redisSetTimeout(c[i], (struct timeval){0, 0});
    }
    redisReply *rep = redisCommand(c[0], "SCRIPT LOAD %s", effect_lua);
    if (!rep || rep->type != REDIS_REPLY_STRING) {
        fprintf(stderr, "redisalone: SCRIPT LOAD: %s\n",
                rep ? rep->str : c[0]->errstr);
        return 1;
    }
    snprintf(sha, sizeof(sha), "%s", rep->str);
    freeReplyObject(rep);
    size_t next = 0, inflight[MAX_CONNECTIONS] = {0};
    uint64_t requests = 0, applied = 0;
    int64_t t0 = idem_now_us();
    for (int i = 0; i < conns && next < recs->n; i++) {
        size_t to = next + batch < recs->n ? next + batch : recs->n;
        effect_append(c[i], sha, prefix, recs, keep, next, to);
        inflight[i] = 1;
        next = to;
    }
    int rcode = 0;
    for (int i = 0, busy = 1; busy && !rcode; i = (i + 1) % conns) {
        if (inflight[i]) {
            void *r = NULL;
            if (redisGetReply(c[i], &r) != REDIS_OK || !r ||
                ((redisReply *)r)->type != REDIS_REPLY_INTEGER) {
                fprintf(stderr, "redisalone: effect script: %s\n",
                        r && ((redisReply *)r)->str ? ((redisReply *)r)->str
                                                    : c[i]->errstr);
                rcode = 1;
            } else {
                applied += (uint64_t)((redisReply *)r)->integer;
            }
            freeReplyObject(r);
            requests++;
            inflight[i] = 0;
            if (next < recs->n && !rcode) {
                size_t to = next + batch < recs->n ? next + batch : recs->n;
                effect_append(c[i], sha, prefix, recs, keep, next, to);
                inflight[i] = 1;
                next = to;
            }
        }
        busy = 0;
        for (int k = 0; k < conns; k++)
            busy |= inflight[k] > 0;
    }
    double secs = (double)(idem_now_us() - t0) / 1e6;
    if (!rcode)
        printf("redisalone: topic_records %" PRIu64 " sent %zu applied %" PRIu64
               " duplicates %zu requests %" PRIu64
               " connections %d seconds %.3f rate %.0f\n",
               recs->topic_records, recs->n, applied, recs->n - unique,
               requests, conns, secs,
               secs > 0 ? (double)recs->topic_records / secs : 0);
    for (int i = 0; i < conns; i++)
        idem_redisconn_close(rc[i]);
    free(keep);
    return rcode;
}

/* The ledger effect's arguments of an envelope for the partition chunk
 * (identity, message id, currency, user, amount); opaque: the amounts as
 * text, 24 bytes per record of recs. */
typedef struct {
    const records_t *recs;
    char (*nums)[24];
} part_args_t;

static size_t part_args(const void *rec, const char **argv, size_t *argvlen,
                        void *opaque)
{
    part_args_t *pa = opaque;
    const idem_envelope_t *e = rec;
    size_t i = (size_t)(e - pa->recs->env);
    snprintf(pa->nums[i], 24, "%" PRId64, e->amount_minor);
    const char *v[] = {e->identity, e->message_id, e->currency, e->user_id,
                       pa->nums[i]};
    const size_t l[] = {e->identity_len, e->message_id_len, strlen(e->currency),
                        strlen(e->user_id), strlen(pa->nums[i])};
    for (int k = 0; k < 5; k++) {
        argv[k] = v[k];
        argvlen[k] = l[k];
    }
    return 5;
}

#define PART_MAX 1024

/* --partition: see the file's comment. Returns 0 or 1. */
static int partition_mode(const idem_conf_t *conf, const records_t *recs,
                          const char *topic)
{
    char errstr[1024];
    extern const char idem_ledger_lua[];
    extern const size_t idem_ledger_lua_len;
    part_args_t pa = {recs, idem_xcalloc(recs->n + 1, sizeof(*pa.nums))};
    idem_store_t *store = idem_store_new(conf, NULL);
    idem_partstate_t *ps = NULL;
    idem_parttables_t *tabs = NULL;
    uint8_t key[16];
    int rc = 1;
    if (idem_store_effect_register(store, idem_ledger_lua, idem_ledger_lua_len,
                                   5, part_args, &pa, errstr,
                                   sizeof(errstr)) < 0 ||
        !(ps = idem_partstate_new(store, conf, errstr, sizeof(errstr))) ||
        idem_partstate_hashkey(ps, key, errstr, sizeof(errstr)) ||
        switch_to_partition(store, conf, errstr, sizeof(errstr)))
        goto out;
    tabs = idem_parttables_new(key, SIZE_MAX);
    int64_t epoch[PART_MAX], cur[PART_MAX], w = 0;
    for (int32_t p = 0; p < PART_MAX; p++)
        epoch[p] = cur[p] = -1;
    for (size_t i = 0; i < recs->n; i++) {
        int32_t p = recs->partition[i];
        if (p < 0 || p >= PART_MAX) {
            snprintf(errstr, sizeof(errstr), "partition %d: at most %d", (int)p,
                     PART_MAX);
            goto out;
        }
        if (epoch[p] >= 0)
            continue;
        idem_store_pos_t pos = {.topic = topic, .partition = p, .offset = 0};
        idem_posval_init(&pos.val, NULL);
        if (idem_partstate_epoch_bump(ps, topic, p, &epoch[p], errstr,
                                      sizeof(errstr)) ||
            idem_store_positions_save(store, &pos, 1, errstr, sizeof(errstr)) ||
            idem_parttables_assign(tabs, topic, p, epoch[p]))
            goto out;
        idem_parttables_loaded(tabs, topic, p);
        cur[p] = 0;
    }
    size_t batch = (size_t)conf->batch_max_messages;
    const void **crec = idem_xmalloc((batch + 1) * sizeof(*crec));
    uint8_t(*cmark)[16] = idem_xmalloc((batch + 1) * 16);
    idem_partstate_result_t *cres = idem_xmalloc((batch + 1) * sizeof(*cres));
    size_t *order = idem_xmalloc((batch + 1) * sizeof(*order));
    uint64_t applied = 0, dups = 0, requests = 0;
    int64_t t0 = idem_now_us();
    idem_partstate_chunk_t *ch = idem_xmalloc((batch + 1) * sizeof(*ch));
    idem_store_pos_t *cpos = idem_xmalloc((batch + 1) * sizeof(*cpos));
    idem_partstate_result_t **cr = idem_xmalloc((batch + 1) * sizeof(*cr));
    int64_t *cw = idem_xmalloc((batch + 1) * sizeof(*cw));
    int *crc = idem_xmalloc((batch + 1) * sizeof(*crc));
    for (size_t from = 0; from < recs->n; from += batch) {
        size_t to = from + batch < recs->n ? from + batch : recs->n;
        /* the request's records by partition (poll order kept within),
         * one chunk each, all chunks in one pipelined write */
        size_t no = 0, k = 0, used = 0;
        for (size_t i = from; i < to; i++)
            order[no++] = i;
        while (no) {
            int32_t p = recs->partition[order[0]];
            size_t n = 0, keep = 0;
            int64_t last = -1;
            for (size_t b = 0; b < no; b++) {
                size_t i = order[b];
                if (recs->partition[i] != p) {
                    order[keep++] = i;
                    continue;
                }
                last = recs->offset[i];
                idem_mark_t16 m;
                const idem_envelope_t *e = &recs->env[i];
                idem_parttables_mark(tabs, e->identity, e->identity_len,
                                     e->message_id, e->message_id_len, &m);
                idem_part_lookup_t got =
                    idem_parttables_take(tabs, topic, p, &m, w, NULL);
                if (got == IDEM_PART_DUPLICATE) {
                    dups++;
                } else if (got == IDEM_PART_NEW) {
                    crec[used + n] = e;
                    memcpy(cmark[used + n++], m.b, 16);
                } else {
                    snprintf(errstr, sizeof(errstr), "lookup: %d", (int)got);
                    goto done;
                }
            }
            no = keep;
            cpos[k] = (idem_store_pos_t){
                .topic = topic, .partition = p, .offset = last + 1};
            idem_posval_init(&cpos[k].val, NULL);
            ch[k] = (idem_partstate_chunk_t){
                .topic = topic,
                .partition = p,
                .epoch = epoch[p],
                .expect_offset = cur[p],
                .newpos = &cpos[k],
                .recs = crec + used,
                .marks = (const uint8_t(*)[16])(cmark + used),
                .n = n};
            cr[k] = cres + used;
            used += n;
            k++;
        }
        if (idem_partstate_chunks(ps, ch, k, cr, cw, crc, errstr,
                                  sizeof(errstr)))
            goto done;
        requests++;
        for (size_t c = 0; c < k; c++) {
            if (crc[c])
                goto done;
            cur[ch[c].partition] = cpos[c].offset;
            for (size_t j = 0; j < ch[c].n; j++) {
                if (cr[c][j].outcome != IDEM_PARTSTATE_APPLIED) {
                    snprintf(errstr, sizeof(errstr), "record refused: %s",
                             cr[c][j].detail);
                    goto done;
                }
                idem_mark_t16 m;
                memcpy(m.b, ch[c].marks[j], 16);
                idem_parttables_settle(tabs, topic, ch[c].partition, &m, w,
                                       cw[c], 0);
            }
            applied += ch[c].n;
            w = cw[c];
        }
    }
    double secs = (double)(idem_now_us() - t0) / 1e6;
    printf("redisalone: topic_records %" PRIu64 " sent %zu applied %" PRIu64
           " duplicates %" PRIu64 " requests %" PRIu64
           " connections 1 seconds %.3f rate %.0f\n",
           recs->topic_records, recs->n, applied, dups, requests, secs,
           secs > 0 ? (double)recs->topic_records / secs : 0);
    rc = 0;
done:
    free(ch);
    free(cpos);
    free(cr);
    free(cw);
    free(crc);
    free(crec);
    free(cmark);
    free(cres);
    free(order);
out:
    if (rc)
        fprintf(stderr, "redisalone: %s\n", errstr);
    idem_parttables_destroy(tabs);
    idem_partstate_destroy(ps);
    idem_store_destroy(store);
    free(pa.nums);
    return rc;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: redisalone -c FILE [--set k=v]... "
                 "[--connections N] [--effect-only | --partition]\n"
                 "  the configuration of an `idemproc run` member (ledger "
                 "handler): its input\n"
                 "  topic is read, its Redis, prefix and group.id written\n");
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    char *sets[MAX_SETS];
    size_t nsets = 0;
    int conns = 2;
    int effect = 0, partition = 0;
    enum { OPT_SET = 256, OPT_CONNECTIONS, OPT_EFFECT_ONLY, OPT_PARTITION };
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},
        {"set", required_argument, 0, OPT_SET},
        {"connections", required_argument, 0, OPT_CONNECTIONS},
        {"effect-only", no_argument, 0, OPT_EFFECT_ONLY},
        {"partition", no_argument, 0, OPT_PARTITION},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            path = optarg;
            break;
        case OPT_SET:
            if (nsets == MAX_SETS) {
                fprintf(stderr, "redisalone: at most %d --set\n", MAX_SETS);
                return 2;
            }
            sets[nsets++] = optarg;
            break;
        case OPT_CONNECTIONS:
            conns = atoi(optarg);
            if (conns < 1 || conns > MAX_CONNECTIONS) {
                fprintf(stderr, "redisalone: --connections: 1..%d\n",
                        MAX_CONNECTIONS);
                return 2;
            }
            break;
        case OPT_EFFECT_ONLY:
            effect = 1;
            break;
        case OPT_PARTITION:
            partition = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    char errstr[1024];
    idem_conf_t *conf =
        idem_conf_load(path, NULL, sets, nsets, errstr, sizeof(errstr));
    if (!conf) {
        fprintf(stderr, "redisalone: %s\n", errstr);
        return 2;
    }
    if (strchr(conf->input_topics, ',') || conf->input_topics[0] == '^') {
        fprintf(stderr,
                "redisalone: input.topics: one topic name, not \"%s\"\n",
                conf->input_topics);
        return 2;
    }
    const char *topic = conf->input_topics;
    idem_envelope_rules_t *rules = idem_envelope_rules_new(
        conf->envelope_format, conf->envelope_identity,
        conf->envelope_message_id, 1, (size_t)conf->message_max_bytes, errstr,
        sizeof(errstr));
    if (!rules) {
        fprintf(stderr, "redisalone: %s\n", errstr);
        return 2;
    }
    records_t recs = {0};
    if (read_topic(conf, topic, rules, &recs, errstr, sizeof(errstr))) {
        fprintf(stderr, "redisalone: %s\n", errstr);
        return 1;
    }
    if (effect || partition) {
        int erc = partition ? partition_mode(conf, &recs, topic)
                            : effect_only(conf, &recs, conns);
        free(recs.env);
        free(recs.partition);
        free(recs.offset);
        idem_envelope_rules_destroy(rules);
        idem_conf_destroy(conf);
        return erc;
    }
    size_t batch = (size_t)conf->batch_max_messages;
    idem_store_t *store[MAX_CONNECTIONS];
    void *led[MAX_CONNECTIONS];
    size_t req_from[MAX_CONNECTIONS], req_n[MAX_CONNECTIONS];
    for (int i = 0; i < conns; i++) {
        store[i] = idem_store_new(conf, NULL);
        /* The handler registers its script before the store connects. */
        idem_handler_ctx_t ctx = {.conf = conf, .arg = "", .store = store[i]};
        led[i] = idem_handler_ledger.start(&ctx, errstr, sizeof(errstr));
        if (!led[i] || idem_store_connect(store[i], errstr, sizeof(errstr))) {
            fprintf(stderr, "redisalone: %s\n", errstr);
            return 1;
        }
        req_n[i] = 0;
    }
    idem_record_t *views = idem_xcalloc(recs.n + 1, sizeof(*views));
    idem_record_t **envp = idem_xmalloc(recs.n * sizeof(*envp) + 1);
    for (size_t i = 0; i < recs.n; i++) {
        views[i].topic = topic;
        views[i].partition = recs.partition[i];
        views[i].offset = recs.offset[i];
        views[i].identity = recs.env[i].identity;
        views[i].identity_len = recs.env[i].identity_len;
        views[i].message_id = recs.env[i].message_id;
        views[i].message_id_len = recs.env[i].message_id_len;
        views[i].env = &recs.env[i];
        envp[i] = &views[i];
    }
    idem_result_t *res = idem_xmalloc(batch * sizeof(*res));
    idem_store_pos_t pos[1024];

    uint64_t applied = 0, dups = 0, requests = 0;
    size_t next = 0;
    int rc = 0;
    int64_t t0 = idem_now_us();
    /* Each connection holds one request; they are answered in the order
     * they were sent, so reading them round robin never waits on one
     * while another is ready. */
    for (int i = 0; i < conns && next < recs.n; i++) {
        size_t n = recs.n - next < batch ? recs.n - next : batch;
        size_t np = request_positions(&recs, next, next + n, topic, pos,
                                      sizeof(pos) / sizeof(pos[0]));
        if (idem_handler_ledger.submit(led[i], envp + next, n, pos, np, errstr,
                                       sizeof(errstr))) {
            fprintf(stderr, "redisalone: %s\n", errstr);
            return 1;
        }
        req_from[i] = next;
        req_n[i] = n;
        next += n;
    }
    for (int i = 0, busy = 1; busy && !rc; i = (i + 1) % conns) {
        if (req_n[i]) {
            if (idem_handler_ledger.collect(led[i], res, batch, -1) !=
                req_n[i]) {
                fprintf(stderr, "redisalone: a request's results are short\n");
                rc = 1;
                break;
            }
            requests++;
            for (size_t k = 0; k < req_n[i]; k++) {
                if (res[k].kind == IDEM_RESULT_DONE) {
                    applied++;
                } else if (res[k].kind == IDEM_RESULT_DUPLICATE) {
                    dups++;
                } else {
                    fprintf(stderr,
                            "redisalone: record %zu: unexpected result %s "
                            "(%s)\n",
                            req_from[i] + k, idem_result_kind2str(res[k].kind),
                            res[k].detail);
                    rc = 1;
                }
            }
            req_n[i] = 0;
            if (next < recs.n) {
                size_t n = recs.n - next < batch ? recs.n - next : batch;
                size_t np = request_positions(&recs, next, next + n, topic, pos,
                                              sizeof(pos) / sizeof(pos[0]));
                if (idem_handler_ledger.submit(led[i], envp + next, n, pos, np,
                                               errstr, sizeof(errstr))) {
                    fprintf(stderr, "redisalone: %s\n", errstr);
                    rc = 1;
                    break;
                }
                req_from[i] = next;
                req_n[i] = n;
                next += n;
            }
        }
        busy = 0;
        for (int k = 0; k < conns; k++)
            busy |= req_n[k] > 0;
    }
    double secs = (double)(idem_now_us() - t0) / 1e6;
    if (!rc)
        printf("redisalone: topic_records %" PRIu64 " sent %zu applied %" PRIu64
               " duplicates %" PRIu64 " requests %" PRIu64
               " connections %d seconds %.3f rate %.0f\n",
               recs.topic_records, recs.n, applied, dups, requests, conns, secs,
               secs > 0 ? (double)recs.topic_records / secs : 0);
    for (int i = 0; i < conns; i++) {
        idem_handler_ledger.stop(led[i]);
        idem_store_destroy(store[i]);
    }
    free(res);
    free(envp);
    free(views);
    free(recs.env);
    free(recs.partition);
    free(recs.offset);
    idem_envelope_rules_destroy(rules);
    idem_conf_destroy(conf);
    return rc;
}
