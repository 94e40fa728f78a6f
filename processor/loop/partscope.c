/* partscope: records split by dedup path, partition chunks through the
 * member's tables (partscope.h). */
#include "loop/partscope.h"
#include "base/log.h"
#include "base/util.h"
#include "loop/partredis.h"
#include "loop/parttables.h"
#include "loop/rec.h"
#include "redis/rediskeys.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records of one chunk at most: the ledger's arguments for a chunk are
 * kept in a ring of this many (handlers/ledger.c). */
#define CHUNK_MAX 1024

struct idem_partscope_s {
    idem_partscope_redis_t redis; /* Redis's side (the seam; its ctx owned
                                     when redis.destroy is set) */
    const idem_conf_t *conf;
    int64_t wsec; /* the window's length, seconds (fixed by conf) */
    idem_parttables_t *tables; /* NULL until the group's hash key is read */
    int64_t window;            /* the last window Redis answered (-1) */
    int64_t expired_below;     /* windows below are dropped from tables */
    int64_t redis_now;         /* Redis's TIME (s) when last read */
    int64_t clock_read_ms;     /* our clock then (idem_now_ms) */
    uint64_t connections;      /* the store's connects when last seen */
    char run_id[48];           /* its server then */
    size_t cap;                /* scratch size (records) */
    idem_mark_t16 *marks;      /* per record: its mark */
    int *path;                 /* per record: 0 rest, 1 chunk, 2 held
                                  (in-chunk duplicate), 3 answered, 4 wait */
    int64_t *w_taken;          /* per record: window it was taken in */
    size_t *first;             /* per held record: the chunk record first */
    idem_record_t **chunkrecs; /* scratch: records in chunk order */
    size_t *chunk_at;          /* scratch: index in recs of each */
    idem_partstate_result_t *res;
    idem_mark_t16 *cmarks;  /* scratch: marks in chunk order */
    idem_store_pos_t *rpos; /* positions for the handler */
    size_t rpos_cap;
    idem_store_pos_t *cpos; /* positions chunks carry */
    idem_partstate_chunk_t *ch;
    idem_partstate_result_t **chres;
    int64_t *windows;
    int *rcs;
    idem_part_t **chpart; /* per chunk: its partition */
    size_t ch_cap;
    /* A request's scratch maps (open addressing, a slot holds a number +
     * 1, 0 empty; map_mask + 1 slots in use, cleared per request): firsts
     * finds the record first taken with a mark in this request, groups the
     * group of a partition. Groups are the partitions with chunk records,
     * in order of first appearance. */
    size_t *firsts, *groups;
    size_t map_cap, map_mask;
    size_t *grp;             /* per chunk record: its group */
    idem_part_t **gpart;     /* per group: its partition */
    size_t *gcount, *gstart; /* per group: records, first in chunkrecs */
    idem_partscope_count_fn count_fn; /* the input's partition count now */
    void *count_opaque;
    struct topic_count { /* topics whose count matched the recorded one */
        char *topic;
        int64_t recorded, current; /* last seen (changed: logged once) */
        int same;
    } * counts;
    size_t ncounts;
    idem_layout_t layout; /* the group's layout key as last read */
    int layout_known;     /* read once at least */
    int layout_recheck;   /* read it again at the next submit */
    int recheck_failed;   /* ... because a handler request failed */
    uint64_t refused_chunk, refused_global; /* layout refusals met */
    uint64_t behind;      /* loads that found redis behind what it acknowledged,
                             not yet taken (idem_partscope_behind_take) */
    int rollback_checked; /* the start's rollback considered */
    int64_t layout_read_ms; /* our clock when read */
};

static int layout_refresh(idem_partscope_t *ps, char *errstr,
                          size_t errstr_size);

idem_partscope_t *idem_partscope_new(idem_store_t *store,
                                     const idem_conf_t *conf, char *errstr,
                                     size_t errstr_size)
{
    idem_partscope_redis_t redis;
    if (idem_partredis_open(store, conf, &redis, errstr, errstr_size))
        return NULL;
    return idem_partscope_new_with(&redis, conf);
}

idem_partscope_t *idem_partscope_new_with(const idem_partscope_redis_t *redis,
                                          const idem_conf_t *conf)
{
    idem_partscope_t *ps = idem_xcalloc(1, sizeof(*ps));
    ps->redis = *redis;
    ps->conf = conf;
    ps->wsec = redis->window_seconds(redis->ctx);
    ps->window = -1;
    ps->expired_below = -1;
    /* The layout key at start (a rollback switches it back now, not at
     * the first records); Redis not there yet: at the first submit. */
    char lerr[512];
    if (layout_refresh(ps, lerr, sizeof(lerr)))
        idem_log_kv(IDEM_LOG_INFO,
                    "dedup layout key not read at start: read at the first "
                    "records",
                    "error", lerr, NULL);
    return ps;
}

void idem_partscope_destroy(idem_partscope_t *ps)
{
    if (!ps)
        return;
    if (ps->redis.destroy)
        ps->redis.destroy(ps->redis.ctx);
    idem_parttables_destroy(ps->tables);
    free(ps->marks);
    free(ps->path);
    free(ps->w_taken);
    free(ps->first);
    free(ps->chunkrecs);
    free(ps->chunk_at);
    free(ps->res);
    free(ps->cmarks);
    free(ps->rpos);
    free(ps->cpos);
    free(ps->ch);
    free(ps->chres);
    free(ps->windows);
    free(ps->rcs);
    free(ps->chpart);
    free(ps->firsts);
    free(ps->groups);
    free(ps->grp);
    free(ps->gpart);
    free(ps->gcount);
    free(ps->gstart);
    for (size_t i = 0; i < ps->ncounts; i++)
        free(ps->counts[i].topic);
    free(ps->counts);
    free(ps);
}

void idem_partscope_counter(idem_partscope_t *ps, idem_partscope_count_fn fn,
                            void *opaque)
{
    ps->count_fn = fn;
    ps->count_opaque = opaque;
}

/* Counts checked hold for one submit: a later load (a partition newly
 * assigned, cooperatively or not, or a table reset) asks again. */
static void counts_forget(idem_partscope_t *ps)
{
    for (size_t i = 0; i < ps->ncounts; i++)
        ps->counts[i].same = 0;
}

void idem_partscope_drop(idem_partscope_t *ps, const char *topic,
                         int32_t partition)
{
    if (ps && ps->tables)
        idem_parttables_drop(ps->tables, topic, partition);
}

void idem_partscope_reset(idem_partscope_t *ps, const char *topic,
                          int32_t partition)
{
    if (ps && ps->tables)
        idem_parttables_reset(ps->tables, topic, partition);
}

size_t idem_partscope_bytes(const idem_partscope_t *ps)
{
    return ps && ps->tables ? idem_parttables_bytes(ps->tables) : 0;
}

size_t idem_partscope_marks(const idem_partscope_t *ps)
{
    return ps && ps->tables ? idem_parttables_marks(ps->tables) : 0;
}

static void reserve(idem_partscope_t *ps, size_t n, size_t npos)
{
    if (ps->cap < n) {
        ps->cap = n;
        ps->marks = idem_xrealloc(ps->marks, n * sizeof(*ps->marks));
        ps->path = idem_xrealloc(ps->path, n * sizeof(*ps->path));
        ps->w_taken = idem_xrealloc(ps->w_taken, n * sizeof(*ps->w_taken));
        ps->first = idem_xrealloc(ps->first, n * sizeof(*ps->first));
        ps->chunkrecs =
            idem_xrealloc(ps->chunkrecs, n * sizeof(*ps->chunkrecs));
        ps->chunk_at = idem_xrealloc(ps->chunk_at, n * sizeof(*ps->chunk_at));
        ps->res = idem_xrealloc(ps->res, n * sizeof(*ps->res));
        ps->cmarks = idem_xrealloc(ps->cmarks, n * sizeof(*ps->cmarks));
        ps->grp = idem_xrealloc(ps->grp, n * sizeof(*ps->grp));
        ps->gpart = idem_xrealloc(ps->gpart, n * sizeof(*ps->gpart));
        ps->gcount = idem_xrealloc(ps->gcount, n * sizeof(*ps->gcount));
        ps->gstart = idem_xrealloc(ps->gstart, n * sizeof(*ps->gstart));
    }
    /* The maps: a power of two of at least twice the records. */
    size_t m = 16;
    while (m < 2 * n)
        m <<= 1;
    if (ps->map_cap < m) {
        ps->map_cap = m;
        ps->firsts = idem_xrealloc(ps->firsts, m * sizeof(*ps->firsts));
        ps->groups = idem_xrealloc(ps->groups, m * sizeof(*ps->groups));
    }
    ps->map_mask = m - 1;
    memset(ps->firsts, 0, m * sizeof(*ps->firsts));
    memset(ps->groups, 0, m * sizeof(*ps->groups));
    /* Chunks: at most one per record, plus none. */
    size_t k = n + 1;
    if (ps->ch_cap < k) {
        ps->ch_cap = k;
        ps->ch = idem_xrealloc(ps->ch, k * sizeof(*ps->ch));
        ps->chres = idem_xrealloc(ps->chres, k * sizeof(*ps->chres));
        ps->windows = idem_xrealloc(ps->windows, k * sizeof(*ps->windows));
        ps->rcs = idem_xrealloc(ps->rcs, k * sizeof(*ps->rcs));
        ps->chpart = idem_xrealloc(ps->chpart, k * sizeof(*ps->chpart));
        ps->cpos = idem_xrealloc(ps->cpos, k * sizeof(*ps->cpos));
    }
    if (ps->rpos_cap < npos + 1) {
        ps->rpos_cap = npos + 1;
        ps->rpos = idem_xrealloc(ps->rpos, ps->rpos_cap * sizeof(*ps->rpos));
    }
}

/* New, empty tables keyed with the group's hash key. */
static int tables_new(idem_partscope_t *ps, char *errstr, size_t errstr_size)
{
    uint8_t key[16];
    if (ps->redis.hashkey(ps->redis.ctx, key, errstr, errstr_size))
        return -1;
    ps->tables = idem_parttables_new(key, (size_t)ps->conf->dedup_memory_max);
    if (!ps->tables) {
        snprintf(errstr, errstr_size, "partition tables: out of memory");
        return -1;
    }
    return 0;
}

/* The group's hash key and the tables, once; Redis's window. */
static int tables_ready(idem_partscope_t *ps, char *errstr, size_t errstr_size)
{
    if (!ps->tables && tables_new(ps, errstr, errstr_size))
        return -1;
    /* A new connection may be a server that lost writes (a restart, a
     * failover): marks the tables hold may have effects that are gone.
     * Every table is loaded again. The tables are NULL until new ones
     * exist, so a failure here leaves nothing freed behind. */
    uint64_t c = ps->redis.connections(ps->redis.ctx);
    if (c != ps->connections) {
        if (ps->connections)
            idem_log_kv(IDEM_LOG_INFO,
                        "redis connection renewed: partition tables are "
                        "loaded again",
                        "run_id", ps->redis.run_id(ps->redis.ctx), NULL);
        idem_parttables_destroy(ps->tables);
        ps->tables = NULL;
        if (tables_new(ps, errstr, errstr_size))
            return -1;
        ps->connections = ps->redis.connections(ps->redis.ctx);
        ps->window = -1;
    }
    /* Redis's clock, at most once a second: the expiry of the tables
     * follows it (a duplicate the table answers asks Redis nothing). */
    int64_t ms = idem_now_ms();
    if (ps->window < 0 || ms - ps->clock_read_ms >= 1000) {
        int64_t now;
        if (ps->redis.now(ps->redis.ctx, &now, errstr, errstr_size))
            return -1;
        ps->clock_read_ms = ms;
        ps->redis_now = now;
        int64_t w = now / ps->wsec;
        if (w > ps->window)
            ps->window = w;
    }
    return 0;
}

typedef struct {
    idem_partscope_t *ps;
    const char *topic;
    int32_t partition;
    int rc;
} load_t;

static int load_marks(const uint8_t *marks, size_t n, int64_t window,
                      void *opaque)
{
    load_t *l = opaque;
    l->rc = idem_parttables_load(l->ps->tables, l->topic, l->partition, marks,
                                 n, window);
    return l->rc ? 1 : 0;
}

/* The input topic's partition count against the one recorded in Redis
 * (the first member records it): keys map to partitions by the count, so
 * marks written under another count do not find their duplicates. A
 * changed count holds the topic's partitions (an outage naming topic and
 * counts, logged once per change) until the operator says what to do
 * (docs/guarantees.md). 0, or -1 with errstr. */
static int count_check(idem_partscope_t *ps, const char *topic, char *errstr,
                       size_t errstr_size)
{
    struct topic_count *tc = NULL;
    for (size_t i = 0; i < ps->ncounts && !tc; i++)
        if (!strcmp(ps->counts[i].topic, topic))
            tc = &ps->counts[i];
    if (tc && tc->same)
        return 0;
    if (!tc) {
        ps->counts =
            idem_xrealloc(ps->counts, (ps->ncounts + 1) * sizeof(*ps->counts));
        tc = &ps->counts[ps->ncounts++];
        tc->topic = idem_xstrdup(topic);
        tc->recorded = tc->current = -1;
        tc->same = 0;
    }
    char kerr[256] = "";
    int64_t current =
        ps->count_fn ? ps->count_fn(ps->count_opaque, topic, kerr, sizeof(kerr))
                     : -1;
    int64_t recorded = -1;
    idem_part_count_t v = idem_parttables_count_verdict(-1, current);
    if (v != IDEM_PART_COUNT_UNKNOWN) {
        if (ps->redis.partitions(ps->redis.ctx, topic, current, &recorded,
                                 errstr, errstr_size))
            return -1;
        v = idem_parttables_count_verdict(recorded, current);
    }
    switch (v) {
    case IDEM_PART_COUNT_SAME:
    case IDEM_PART_COUNT_RECORD:
        tc->same = 1;
        return 0;
    case IDEM_PART_COUNT_UNKNOWN:
        snprintf(errstr, errstr_size,
                 "partition count of input topic %s not known (%s): its "
                 "partitions wait (dedup.scope=partition)",
                 topic, kerr[0] ? kerr : "no answer");
        return -1;
    case IDEM_PART_COUNT_CHANGED:
        break;
    }
    snprintf(errstr, errstr_size,
             "input topic %s has %" PRId64 " partitions, %" PRId64
             " recorded in redis: its partitions wait (dedup.scope=partition)",
             topic, current, recorded);
    if (tc->recorded != recorded || tc->current != current) {
        tc->recorded = recorded;
        tc->current = current;
        char r[24], c[24], k[640];
        snprintf(r, sizeof(r), "%" PRId64, recorded);
        snprintf(c, sizeof(c), "%" PRId64, current);
        snprintf(k, sizeof(k), "%sst{%s:%s}:partitions", ps->conf->redis_prefix,
                 ps->conf->group_id ? ps->conf->group_id : "", topic);
        idem_log_kv(
            IDEM_LOG_ERROR,
            "input partition count changed under dedup.scope=partition: "
            "keys now map to other partitions, so this topic's "
            "partitions wait. Run the group with dedup.scope=global "
            "for one dedup.ttl.seconds, then set the recorded count "
            "to the current one (redis SET of key) and go back to "
            "partition (docs/guarantees.md)",
            "topic", topic, "recorded", r, "current", c, "key", k, NULL);
    }
    return -1;
}

/* A new owner's (or a reset table's) load: the epoch bump first, so a
 * previous owner's chunks are refused from then on, then the position
 * Redis holds (the next chunk's start), then the marks. */
static int part_load(idem_partscope_t *ps, idem_part_t *pt, char *errstr,
                     size_t errstr_size)
{
    if (count_check(ps, pt->topic, errstr, errstr_size))
        return -1;
    int64_t epoch;
    if (ps->redis.epoch_bump(ps->redis.ctx, pt->topic, pt->partition, &epoch,
                             errstr, errstr_size))
        return -1;
    idem_store_pos_t pos = {.topic = pt->topic, .partition = pt->partition};
    uint64_t conns = ps->redis.connections(ps->redis.ctx);
    if (ps->redis.positions_load(ps->redis.ctx, &pos, 1, errstr, errstr_size))
        return -1;
    if (ps->redis.connections(ps->redis.ctx) != conns) {
        /* The load met a new connection, or (cluster mode) found a global
         * bucket that lost records and set the position back: the loop
         * reads the positions again and rewinds first (positions.c), the
         * table is loaded after that. */
        snprintf(errstr, errstr_size,
                 "partition table of %s/%" PRId32 ": redis went back in time "
                 "while it was loaded; positions are read again first",
                 pt->topic, pt->partition);
        return -1;
    }
    if (pos.offset != pt->saved) {
        char a[24], b[24], part[16];
        snprintf(a, sizeof(a), "%" PRId64, pt->saved);
        snprintf(b, sizeof(b), "%" PRId64, pos.offset);
        snprintf(part, sizeof(part), "%" PRId32, pt->partition);
        /* Behind what Redis acknowledged: Redis went back in time (it lost
         * acknowledged writes). Reported here, once: with saved lowered,
         * the reconnect check (positions.c) no longer sees it. */
        int behind = pt->saved >= 0 && pos.offset < pt->saved;
        if (behind)
            ps->behind++;
        idem_log_kv(behind ? IDEM_LOG_WARN : IDEM_LOG_INFO,
                    behind ? "redis went back in time: the position it holds "
                             "is behind the one it acknowledged; the "
                             "partition table is loaded from it and the "
                             "next chunk starts there"
                           : "partition table load: the position redis holds "
                             "is the next chunk's start",
                    "topic", pt->topic, "partition", part, "believed", a,
                    "redis", b, NULL);
        pt->saved = pos.offset;
    }
    if (idem_parttables_assign(ps->tables, pt->topic, pt->partition, epoch)) {
        snprintf(errstr, errstr_size, "partition table: out of memory");
        return -1;
    }
    load_t l = {ps, pt->topic, pt->partition, 0};
    size_t pieces = 0;
    if (ps->redis.load(ps->redis.ctx, pt->topic, pt->partition, 0, load_marks,
                       &l, &pieces, errstr, errstr_size)) {
        if (l.rc == -2)
            snprintf(errstr, errstr_size,
                     "dedup.memory.max reached: the table of %s/%" PRId32
                     " alone does not fit in %" PRId64 " bytes",
                     pt->topic, pt->partition, ps->conf->dedup_memory_max);
        else if (l.rc)
            snprintf(errstr, errstr_size, "partition table: out of memory");
        idem_parttables_reset(ps->tables, pt->topic, pt->partition);
        return -1;
    }
    idem_parttables_loaded(ps->tables, pt->topic, pt->partition);
    char part[16], cnt[24];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(cnt, sizeof(cnt), "%zu",
             idem_parttables_count(ps->tables, pt->topic, pt->partition));
    idem_log_kv(IDEM_LOG_DEBUG, "partition table loaded", "topic", pt->topic,
                "partition", part, "marks", cnt, NULL);
    return 0;
}

static int replayed(const idem_record_t *r)
{
    const void *v;
    size_t len;
    return r->headers &&
           !rd_kafka_header_get_last((rd_kafka_headers_t *)r->headers,
                                     "dlq.replayed.from", &v, &len);
}

static idem_part_path_t rec_path(const idem_record_t *r)
{
    const rec_t *lr = r->loop;
    size_t key_len = r->msg && r->msg->key ? r->msg->key_len : 0;
    return idem_parttables_path(lr && lr->tier > 0, replayed(r), key_len);
}

/* The message id's digest in a mark (its last 4 bytes, moved bit off). */
static uint32_t mark_digest(const idem_mark_t16 *m)
{
    return ((uint32_t)(m->b[12] & 0x7f) << 24) | ((uint32_t)m->b[13] << 16) |
           ((uint32_t)m->b[14] << 8) | m->b[15];
}

static void answer_duplicate(idem_result_t *r, idem_record_t *rec,
                             uint32_t prior, const idem_mark_t16 *own)
{
    idem_result_set(r, rec, IDEM_RESULT_DUPLICATE, NULL);
    /* The table holds the first's digest, not its id: the same digest is
     * told as the same message (a redelivery). */
    r->prior_mid_len = 0;
    r->prior_mid[0] = '\0';
    if (rec->message_id_len && prior == mark_digest(own) &&
        rec->message_id_len < sizeof(r->prior_mid)) {
        memcpy(r->prior_mid, rec->message_id, rec->message_id_len);
        r->prior_mid[rec->message_id_len] = '\0';
        r->prior_mid_len = rec->message_id_len;
    }
}

/* A pointer's slot in a map (a multiplicative hash of its address). */
static size_t ptr_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    return (size_t)(x ^ (x >> 33));
}

/* The record of this request first taken (path 1) in part[i]'s table with
 * record i's identity, or i when there is none: one probe sequence of
 * ps->firsts, whose marks are keyed hashes already. */
static size_t first_find(const idem_partscope_t *ps, idem_part_t *const *part,
                         size_t i)
{
    uint64_t h;
    memcpy(&h, ps->marks[i].b, sizeof(h));
    for (size_t s = (h ^ ptr_hash(part[i])) & ps->map_mask; ps->firsts[s];
         s = (s + 1) & ps->map_mask) {
        size_t j = ps->firsts[s] - 1;
        if (part[j] == part[i] && !memcmp(ps->marks[j].b, ps->marks[i].b, 12))
            return j;
    }
    return i;
}

/* Records record i as the first taken with its identity in its table. */
static void first_add(idem_partscope_t *ps, idem_part_t *const *part, size_t i)
{
    uint64_t h;
    memcpy(&h, ps->marks[i].b, sizeof(h));
    size_t s = (h ^ ptr_hash(part[i])) & ps->map_mask;
    while (ps->firsts[s])
        s = (s + 1) & ps->map_mask;
    ps->firsts[s] = i + 1;
}

/* pt's group, a new one (no records yet) if it had none; *ng counts the
 * groups. */
static size_t group_of(idem_partscope_t *ps, idem_part_t *pt, size_t *ng)
{
    size_t s = ptr_hash(pt) & ps->map_mask;
    for (; ps->groups[s]; s = (s + 1) & ps->map_mask)
        if (ps->gpart[ps->groups[s] - 1] == pt)
            return ps->groups[s] - 1;
    size_t g = (*ng)++;
    ps->groups[s] = g + 1;
    ps->gpart[g] = pt;
    ps->gcount[g] = 0;
    return g;
}

/* Resets every partition of a failed request's chunks. */
static void reset_chunks(idem_partscope_t *ps, size_t k)
{
    for (size_t c = 0; c < k; c++)
        idem_parttables_reset(ps->tables, ps->ch[c].topic, ps->ch[c].partition);
}

/* Chunk k: pt's records chunkrecs[start..nc), sent at the owner epoch
 * and expecting the position the member last saw acknowledged. */
static idem_partstate_chunk_t *chunk_fill(idem_partscope_t *ps, size_t k,
                                          const idem_part_t *pt, int64_t epoch,
                                          size_t start, size_t nc)
{
    idem_partstate_chunk_t *c = &ps->ch[k];
    memset(c, 0, sizeof(*c));
    c->topic = pt->topic;
    c->partition = pt->partition;
    c->epoch = epoch;
    c->expect_offset = pt->saved;
    c->recs = (const void *const *)&ps->chunkrecs[start];
    c->n = nc - start;
    return c;
}

void idem_partscope_layout_recheck(idem_partscope_t *ps)
{
    if (ps)
        ps->layout_recheck = ps->recheck_failed = 1;
}

uint64_t idem_partscope_behind_take(idem_partscope_t *ps)
{
    uint64_t n = ps->behind;
    ps->behind = 0;
    return n;
}

void idem_partscope_layout_refusals(const idem_partscope_t *ps, uint64_t *chunk,
                                    uint64_t *global)
{
    *chunk = ps ? ps->refused_chunk : 0;
    *global = ps ? ps->refused_global : 0;
}

/* Tables go (a layout change, the end of a transition): loaded again when
 * needed. */
static void tables_drop_all(idem_partscope_t *ps)
{
    idem_parttables_destroy(ps->tables);
    ps->tables = NULL;
    ps->window = -1;
}

/* The group's layout key, read at most once a second (dev.layout.read.ms; at
 * once after a LAYOUT answer): a stale belief is safe, since every script
 * checks the key with its writes and refuses. At the first read, a member that
 * wants global and finds partition switches the key back (a rollback, with
 * since = now: the partition marks are honoured for one TTL). A changed
 * layout drops the tables. The effect's global framing is told the
 * layout. 0, or -1 with errstr (retriable). */
static int layout_refresh(idem_partscope_t *ps, char *errstr,
                          size_t errstr_size)
{
    int64_t ms = idem_now_ms();
    if (ps->layout_known && !ps->layout_recheck &&
        ms - ps->layout_read_ms < ps->conf->dev_layout_read_ms)
        return 0;
    idem_layout_t l;
    if (ps->redis.layout_read(ps->redis.ctx, &l, errstr, errstr_size))
        return -1;
    if (!ps->rollback_checked &&
        ps->conf->dedup_scope != IDEM_DEDUP_SCOPE_PARTITION &&
        l.layout == IDEM_LAYOUT_PARTITION) {
        int rc = ps->redis.layout_switch(ps->redis.ctx, IDEM_LAYOUT_PARTITION,
                                         IDEM_LAYOUT_GLOBAL, &l, errstr,
                                         errstr_size);
        if (rc < 0)
            return -1;
        if (rc == 1)
            idem_log_kv(IDEM_LOG_WARN,
                        "dedup layout switched back to global: this member "
                        "wants dedup.scope=global; the partition marks are "
                        "honoured for one dedup.ttl.seconds",
                        "member", ps->conf->member_id, NULL);
    }
    ps->rollback_checked = 1;
    if (ps->layout_known &&
        (l.layout != ps->layout.layout || l.since != ps->layout.since)) {
        char since[24];
        snprintf(since, sizeof(since), "%" PRId64, l.since);
        idem_log_kv(IDEM_LOG_INFO,
                    "dedup layout changed: partition tables are loaded again",
                    "layout", idem_layout_kind2str(l.layout), "from",
                    idem_layout_kind2str(l.from), "since", since, NULL);
        tables_drop_all(ps);
        if (ps->recheck_failed)
            ps->refused_global++; /* the failed request's LAYOUT */
    }
    ps->layout = l;
    ps->layout_known = 1;
    ps->layout_recheck = ps->recheck_failed = 0;
    ps->layout_read_ms = ms;
    ps->redis.effect_layout(ps->redis.ctx, idem_layout_kind2str(l.layout));
    return 0;
}

/* A record the global layout applied (the chunk's "global:<mark>"): a
 * duplicate, with the first's message id from its mark "done:<id>". */
static void answer_global(idem_result_t *r, idem_record_t *rec,
                          const char *mark)
{
    idem_result_set(r, rec, IDEM_RESULT_DUPLICATE, NULL);
    r->prior_mid_len = 0;
    r->prior_mid[0] = '\0';
    if (!strncmp(mark, "done:", 5)) {
        size_t len = strlen(mark + 5);
        if (len < sizeof(r->prior_mid)) {
            memcpy(r->prior_mid, mark + 5, len + 1);
            r->prior_mid_len = len;
        }
    }
}

int idem_partscope_submit(idem_partscope_t *ps, idem_record_t **recs,
                          idem_part_t *const *part, size_t n,
                          const idem_store_pos_t *pos, size_t npos,
                          idem_result_t *now, size_t *nnow, size_t *nrest,
                          const idem_store_pos_t **rpos, size_t *nrpos,
                          char *errstr, size_t errstr_size)
{
    *nnow = *nrest = *nrpos = 0;
    *rpos = NULL;
    if (layout_refresh(ps, errstr, errstr_size))
        return -1;
    /* Under the global layout, past any transition: everything goes to
     * the handler. Under global for one TTL after a rollback (readonly):
     * the tables are loaded but never written to Redis, and a record they
     * hold was applied under partition. Under partition for one TTL after
     * the switch: chunks carry the identities, the script answers those
     * the global layout applied. */
    int64_t lnow = ps->layout.now + (idem_now_ms() - ps->layout_read_ms) / 1000;
    int honour =
        idem_layout_honours(&ps->layout, ps->conf->dedup_ttl_seconds, lnow);
    int readonly = ps->layout.layout != IDEM_LAYOUT_PARTITION;
    if (readonly && !honour) {
        if (ps->tables)
            tables_drop_all(ps);
        *nrest = n;
        *rpos = pos;
        *nrpos = npos;
        return 0;
    }
    ps->redis.honour_global(ps->redis.ctx, !readonly && honour);
    counts_forget(ps);
    reserve(ps, n, npos);
    if (tables_ready(ps, errstr, errstr_size))
        return -1;
    /* Expiry by Redis's window: a chunk of window w lives until
     * (w + 1) * W + TTL; the start of the window Redis last answered is
     * at or before its clock, so nothing alive is dropped. */
    int64_t wsec = ps->wsec;
    int64_t clock_s =
        ps->window * wsec > ps->redis_now ? ps->window * wsec : ps->redis_now;
    int64_t min_w =
        idem_parttables_min_window(clock_s, wsec, ps->conf->dedup_ttl_seconds);
    if (min_w > ps->expired_below) {
        idem_parttables_expire(ps->tables, min_w);
        ps->expired_below = min_w;
    }
    /* Which path each record takes; a partition's table is loaded before
     * its first lookup. At dedup.memory.max (checked once a request, after
     * expiry: a request may pass it by its own marks) no table is loaded
     * and no mark taken (an evicted mark would be a missed duplicate): the
     * partition path's records wait, duplicates too, as an outage until
     * windows expire or partitions leave. */
    int full = idem_parttables_full(ps->tables);
    for (size_t i = 0; i < n; i++) {
        idem_record_t *r = recs[i];
        idem_part_t *pt = part[i];
        ps->path[i] = 0;
        if (!pt || rec_path(r) != IDEM_PART_PATH_PARTITION)
            continue;
        if (full) {
            ps->path[i] = 4;
            continue;
        }
        idem_parttables_mark(ps->tables, r->identity, r->identity_len,
                             r->message_id, r->message_id_len, &ps->marks[i]);
        if (!idem_parttables_ready(ps->tables, pt->topic, pt->partition,
                                   NULL) &&
            part_load(ps, pt, errstr, errstr_size)) {
            /* Records taken so far are only optimistic entries: reset. */
            for (size_t j = 0; j < i; j++)
                if (part[j] && ps->path[j] == 1)
                    idem_parttables_reset(ps->tables, part[j]->topic,
                                          part[j]->partition);
            *nnow = 0;
            return -1;
        }
        uint32_t prior = 0;
        ps->w_taken[i] = ps->window;
        switch (idem_parttables_take(ps->tables, pt->topic, pt->partition,
                                     &ps->marks[i], ps->window, &prior)) {
        case IDEM_PART_NEW:
            if (!readonly) {
                ps->path[i] = 1;
                first_add(ps, part, i);
                break;
            }
            /* Not held: the global path, and a moved mark in the table,
             * so a repeat in this request goes there too. */
            if (idem_parttables_settle(ps->tables, pt->topic, pt->partition,
                                       &ps->marks[i], ps->window, ps->window,
                                       1))
                idem_parttables_reset(ps->tables, pt->topic, pt->partition);
            break;
        case IDEM_PART_DUPLICATE: {
            /* A first of this identity in this very request waits for
             * its chunk's answer (a refused first is no done mark). */
            size_t f = first_find(ps, part, i);
            if (f != i) {
                ps->path[i] = 2;
                ps->first[i] = f;
            } else {
                ps->path[i] = 3;
                answer_duplicate(&now[(*nnow)++], r, prior, &ps->marks[i]);
            }
            break;
        }
        case IDEM_PART_MOVED: /* it left the partition once: global */
            break;
        case IDEM_PART_NOT_READY:
        case IDEM_PART_NOMEM:
            ps->path[i] = 4;
            full = 1;
            break;
        }
    }
    int layout_failed = 0;
    /* Chunks: per partition in order of its first record, its records in
     * poll order (at most CHUNK_MAX each; only the last carries the
     * position). One pass counts the records of each partition, one
     * places them. */
    size_t ng = 0, nc = 0;
    for (size_t i = 0; i < n; i++)
        if (ps->path[i] == 1) {
            size_t g = group_of(ps, part[i], &ng);
            ps->grp[i] = g;
            ps->gcount[g]++;
        }
    for (size_t g = 0; g < ng; g++) {
        ps->gstart[g] = nc;
        nc += ps->gcount[g];
    }
    for (size_t i = 0; i < n; i++)
        if (ps->path[i] == 1) {
            size_t at = ps->gstart[ps->grp[i]]++;
            ps->chunkrecs[at] = recs[i];
            ps->chunk_at[at] = i;
        }
    size_t k = 0;
    for (size_t g = 0; g < ng; g++) {
        idem_part_t *pt = ps->gpart[g];
        int64_t epoch = 0;
        idem_parttables_ready(ps->tables, pt->topic, pt->partition, &epoch);
        size_t end = ps->gstart[g], start = end - ps->gcount[g];
        for (; end - start > CHUNK_MAX; start += CHUNK_MAX) {
            chunk_fill(ps, k, pt, epoch, start, start + CHUNK_MAX);
            ps->chpart[k++] = pt;
        }
        idem_partstate_chunk_t *c = chunk_fill(ps, k, pt, epoch, start, end);
        for (size_t q = 0; q < npos; q++)
            if (pos[q].partition == pt->partition &&
                !strcmp(pos[q].topic, pt->topic)) {
                ps->cpos[k] = pos[q];
                c->newpos = &ps->cpos[k];
            }
        ps->chpart[k++] = pt;
    }
    /* Marks in chunk order, results per chunk. */
    idem_mark_t16 *cm = ps->cmarks;
    for (size_t q = 0; q < nc; q++)
        cm[q] = ps->marks[ps->chunk_at[q]];
    for (size_t c = 0, at = 0; c < k; c++) {
        ps->ch[c].marks = (const uint8_t(*)[IDEM_PARTSTATE_MARK])cm[at].b;
        ps->chres[c] = &ps->res[at];
        at += ps->ch[c].n;
    }
    if (k) {
        /* A chunk whose expected start is not Redis's gets POSITION; a
         * chunk of a partition Redis holds no position for is not sent. */
        for (size_t c = 0; c < k; c++)
            ps->rcs[c] = 0;
        int rc = ps->redis.chunks(ps->redis.ctx, ps->ch, k, ps->chres,
                                  ps->windows, ps->rcs, errstr, errstr_size);
        if (rc) {
            reset_chunks(ps, k);
            *nnow = 0;
            return -1;
        }
        int failed = 0;
        for (size_t c = 0, at = 0; c < k; at += ps->ch[c].n, c++) {
            idem_partstate_chunk_t *ch = &ps->ch[c];
            if (ps->rcs[c] == IDEM_PARTSTATE_LAYOUT) {
                /* Nothing written: its records stay due, routed again
                 * after the key is read again (below). */
                layout_failed = 1;
                ps->refused_chunk++;
                continue;
            }
            if (ps->rcs[c]) {
                idem_parttables_reset(ps->tables, ch->topic, ch->partition);
                failed = 1;
                continue;
            }
            if (ps->windows[c] > ps->window)
                ps->window = ps->windows[c];
            for (size_t q = 0; q < ch->n; q++) {
                size_t i = ps->chunk_at[at + q];
                const idem_partstate_result_t *res = &ps->res[at + q];
                int rej = res->outcome == IDEM_PARTSTATE_REJECTED;
                int gdone = res->outcome == IDEM_PARTSTATE_GLOBAL_DONE;
                if (idem_parttables_settle(ps->tables, ch->topic, ch->partition,
                                           &ps->marks[i], ps->w_taken[i],
                                           ps->windows[c], rej))
                    idem_parttables_reset(ps->tables, ch->topic, ch->partition);
                ps->path[i] = rej ? 6 : 5; /* 5 done, 6 refused */
                if (gdone)
                    answer_global(&now[(*nnow)++], recs[i], res->detail);
                else if (rej)
                    idem_result_set(&now[(*nnow)++], recs[i],
                                    IDEM_RESULT_REJECT, "%s", res->detail);
                else
                    idem_result_set(&now[(*nnow)++], recs[i], IDEM_RESULT_DONE,
                                    NULL);
            }
            if (ch->newpos)
                ps->chpart[c]->saved = ch->newpos->offset;
        }
        if (failed) {
            /* Records of the failed chunks stay due (sent again once the
             * table is loaded again); the others were answered. */
            for (size_t i = 0; i < n; i++)
                if (ps->path[i] == 2 && ps->path[ps->first[i]] == 5)
                    answer_duplicate(&now[(*nnow)++], recs[i],
                                     mark_digest(&ps->marks[ps->first[i]]),
                                     &ps->marks[i]);
            return -1;
        }
    }
    /* Held duplicates of a first in this request: a duplicate when it was
     * applied; due again when it was refused (its moved mark then sends
     * it the global way). */
    for (size_t i = 0; i < n; i++)
        if (ps->path[i] == 2 && ps->path[ps->first[i]] == 5)
            answer_duplicate(&now[(*nnow)++], recs[i],
                             mark_digest(&ps->marks[ps->first[i]]),
                             &ps->marks[i]);
    if (layout_failed) {
        idem_log_kv(IDEM_LOG_INFO,
                    "a chunk found the dedup layout changed: its records are "
                    "routed again",
                    "member", ps->conf->member_id, NULL);
        ps->layout_recheck = 1;
        if (layout_refresh(ps, errstr, errstr_size))
            return -1;
        if (ps->tables)
            tables_drop_all(ps);
    }
    if (full) {
        snprintf(errstr, errstr_size,
                 "dedup.memory.max reached (%zu bytes in partition tables)",
                 idem_parttables_bytes(ps->tables));
        return -1;
    }
    /* The rest for the handler, with the positions no chunk carried. */
    for (size_t i = 0; i < n; i++)
        if (ps->path[i] == 0)
            recs[(*nrest)++] = recs[i];
    for (size_t q = 0; q < npos; q++) {
        int carried = 0;
        for (size_t c = 0; c < k && !carried; c++)
            carried = ps->ch[c].newpos && !ps->rcs[c] &&
                      ps->ch[c].partition == pos[q].partition &&
                      !strcmp(ps->ch[c].topic, pos[q].topic);
        if (!carried)
            ps->rpos[(*nrpos)++] = pos[q];
    }
    *rpos = ps->rpos;
    return 0;
}
