/* positions: the positions a member keeps in Redis next to its effects
 * (positions.h). */
#include "loop/positions.h"
#include "base/log.h"
#include "base/util.h"
#include "kafka/offreset.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void idem_positions_init(idem_positions_t *ps, const idem_conf_t *conf,
                         idem_metrics_t *m, idem_store_t *store)
{
    memset(ps, 0, sizeof(*ps));
    ps->conf = conf;
    ps->m = m;
    ps->store = store;
}

void idem_positions_term(idem_positions_t *ps)
{
    idem_posread_destroy(ps->posread);
    free(ps->pos);
    ps->posread = NULL;
    ps->pos = NULL;
}

static idem_store_pos_t *pos_reserve(idem_positions_t *ps, size_t n)
{
    if (ps->pos_cap < n) {
        ps->pos_cap = n;
        ps->pos = idem_xrealloc(ps->pos, n * sizeof(*ps->pos));
    }
    return ps->pos;
}

/* Redis acknowledged the position ps: its partition's `saved`, and its
 * `start` when nothing of this assignment was in Redis before it. Returns
 * the partition. */
static idem_part_t *position_stored(idem_offsets_t *offs,
                                    const idem_store_pos_t *sp)
{
    idem_part_t *pt = idem_offsets_find(offs, sp->topic, sp->partition);
    pt->saved = sp->offset;
    if (pt->start < 0)
        pt->start = sp->offset;
    return pt;
}

/* Collects into ps->pos the partitions (of subset, if not NULL) whose
 * finished prefix moved past the position Redis holds. Returns how many. */
size_t idem_positions_due(idem_positions_t *ps, const idem_offsets_t *offs,
                          const rd_kafka_topic_partition_list_t *subset)
{
    return idem_offsets_positions_due(
        offs, subset, ps->cluster[0] ? ps->cluster : NULL,
        pos_reserve(ps, offs->cnt ? offs->cnt : 1));
}

/* Cluster mode: the touch of the global path's positions (store.h,
 * idem_store_gpos_touch) for the partitions of subset (NULL: all) this
 * member holds and has finished something of; forced at a revoke (a
 * subset). A failure is logged: the next save tries again. */
static void positions_touch(idem_positions_t *ps, const idem_offsets_t *offs,
                            const rd_kafka_topic_partition_list_t *subset)
{
    idem_store_pos_t *fin = pos_reserve(ps, offs->cnt ? offs->cnt : 1);
    size_t n = 0;
    for (size_t i = 0; i < offs->cnt; i++) {
        const idem_part_t *pt = &offs->v[i];
        if (pt->next_offset < 0 || pt->lost)
            continue;
        if (subset && !rd_kafka_topic_partition_list_find(subset, pt->topic,
                                                          pt->partition))
            continue;
        fin[n++] = (idem_store_pos_t){.topic = pt->topic,
                                      .partition = pt->partition,
                                      .offset = pt->next_offset};
    }
    char errstr[512];
    if (n && idem_store_gpos_touch(ps->store, fin, n, subset != NULL, errstr,
                                   sizeof(errstr)))
        idem_log_kv(IDEM_LOG_WARN,
                    "touching the global path's positions in redis failed",
                    "error", errstr, NULL);
}

void idem_positions_touch(idem_positions_t *ps, const idem_offsets_t *offs)
{
    if (idem_store_cluster(ps->store))
        positions_touch(ps, offs, NULL);
}

/* Writes the finished prefixes to Redis before they are committed to
 * Kafka (docs/design.md, "Positions in Redis"); only with no request in
 * flight (the ledger sends them along with its requests otherwise). A
 * failure leaves the Kafka commit behind; the next attempt catches up.
 * In cluster mode the global path's buckets are touched after. */
void idem_positions_save(idem_positions_t *ps, idem_offsets_t *offs,
                         const idem_records_t *recs,
                         const rd_kafka_topic_partition_list_t *subset)
{
    int touch = idem_store_cluster(ps->store);
    if (idem_positions_due(ps, offs, subset) == 0 && !touch)
        return;
    char errstr[512];
    /* A new connection is compared first (which may rewind): never write
     * a position over one Redis lost together with the effects below. */
    if (idem_positions_sync(ps, offs, recs, errstr, sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "reading positions from redis failed",
                    "error", errstr, NULL);
        return;
    }
    size_t n = idem_positions_due(ps, offs, subset);
    if (n && idem_store_positions_save(ps->store, ps->pos, n, errstr,
                                       sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "saving positions in redis failed", "error",
                    errstr, NULL);
        return;
    }
    for (size_t i = 0; i < n; i++)
        position_stored(offs, &ps->pos[i]);
    if (touch)
        positions_touch(ps, offs, subset);
}

/* The lowest offset pt holds in hand (or has finished up to); -1 when it
 * has not consumed anything since it was assigned. */
static int64_t part_hold(const idem_records_t *recs, idem_offsets_t *offs,
                         const idem_part_t *pt)
{
    if (pt->next_offset >= 0)
        return pt->next_offset;
    int64_t low = -1;
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(recs, &i));)
        if (idem_offsets_find(offs, r->view.topic, r->view.partition) == pt &&
            (low < 0 || r->view.offset < low))
            low = r->view.offset;
    return low >= 0 ? low : pt->saved;
}

/* The record of pt in hand at `offset`, or NULL. */
static const rec_t *rec_at(const idem_records_t *recs, idem_offsets_t *offs,
                           const idem_part_t *pt, int64_t offset)
{
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(recs, &i));)
        if (r->view.offset == offset &&
            idem_offsets_find(offs, r->view.topic, r->view.partition) == pt)
            return r;
    return NULL;
}

/* Before the handler gets the first records (rs[n]) of a partition for
 * which Redis holds no position (a new group, a position never used or
 * lost), writes one there: the lowest offset the member holds, vouching
 * for the record at it. So every effect has a position at or before it in
 * Redis's command stream, and a Redis that lost that position lost the
 * effects after it too (docs/design.md, "Positions in Redis"). No request
 * may be in flight. Returns 0, or -1 (outage: nothing was handed over). */
int idem_positions_first(idem_positions_t *ps, idem_offsets_t *offs,
                         const idem_records_t *recs, rec_t *const *rs, size_t n,
                         char *errstr, size_t errstr_size)
{
    /* Called before every request: once each partition has a position
     * (all but the first requests of an assignment), no record is looked
     * at. */
    int missing = 0;
    for (size_t i = 0; i < offs->cnt && !missing; i++)
        missing =
            offs->v[i].saved < 0 && offs->v[i].saving < 0 && !offs->v[i].lost;
    if (!missing)
        return 0;
    size_t cnt = 0;
    idem_store_pos_t *pos = pos_reserve(ps, offs->cnt ? offs->cnt : 1);
    for (size_t i = 0; i < n; i++) {
        idem_part_t *pt =
            idem_offsets_find(offs, rs[i]->view.topic, rs[i]->view.partition);
        if (!pt || pt->saved >= 0 || pt->saving >= 0 || pt->lost)
            continue;
        int dup = 0;
        for (size_t j = 0; j < cnt && !dup; j++)
            dup = pos[j].partition == pt->partition &&
                  !strcmp(pos[j].topic, pt->topic);
        int64_t hold = part_hold(recs, offs, pt);
        if (dup || hold < 0)
            continue;
        pos[cnt].topic = pt->topic;
        pos[cnt].partition = pt->partition;
        pos[cnt].offset = hold;
        idem_posval_init(&pos[cnt].val, ps->cluster);
        const rec_t *at = rec_at(recs, offs, pt, hold);
        if (at)
            idem_posread_fingerprint(at->msg, &pos[cnt].val.rec);
        else if (pt->fp.offset >= 0 && pt->fp.offset < hold)
            pos[cnt].val.rec = pt->fp;
        cnt++;
    }
    if (!cnt)
        return 0;
    if (idem_store_positions_save(ps->store, pos, cnt, errstr, errstr_size))
        return -1;
    for (size_t i = 0; i < cnt; i++) {
        idem_part_t *pt = position_stored(offs, &pos[i]);
        char part[16], off[24];
        snprintf(part, sizeof(part), "%" PRId32, pt->partition);
        snprintf(off, sizeof(off), "%" PRId64, pos[i].offset);
        idem_log_kv(IDEM_LOG_DEBUG, "first position written to redis", "topic",
                    pt->topic, "partition", part, "offset", off, NULL);
    }
    return 0;
}

/* ------------------------------------------------ positions from Redis */

/* Whether librdkafka's assignment holds pt (also when it cannot say). */
static int held_by_librdkafka(rd_kafka_t *rk, const idem_part_t *pt)
{
    rd_kafka_topic_partition_list_t *now = NULL;
    if (rd_kafka_assignment(rk, &now))
        return 1;
    int held = rd_kafka_topic_partition_list_find(now, pt->topic,
                                                  pt->partition) != NULL;
    rd_kafka_topic_partition_list_destroy(now);
    return held;
}

/* Drops what is in hand for pt and seeks it back to `offset`, the position
 * Redis holds: the records from there are read and applied again (their
 * marks, where Redis kept them, make them duplicates). No request may be
 * in flight. Returns 0, or -1 when the seek failed (errstr; the caller
 * tries again later). */
static int partition_rewind(idem_positions_t *ps, idem_part_t *pt,
                            int64_t offset, const idem_posval_rec_t *fp,
                            char *errstr, size_t errstr_size)
{
    if (ps->before_rewind)
        ps->before_rewind(ps->ctx, pt);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition)->offset =
        offset;
    /* A partition the fetch watch took out of the assignment (its assign
     * back refused) cannot be sought: librdkafka refuses, for good. Its
     * assign back starts where the member's position says, set below. */
    rd_kafka_error_t *e = held_by_librdkafka(ps->rk, pt)
                              ? rd_kafka_seek_partitions(ps->rk, l, 5000)
                              : NULL;
    char part[16], off[24], held[24];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(off, sizeof(off), "%" PRId64, offset);
    snprintf(held, sizeof(held), "%" PRId64,
             pt->next_offset >= 0 ? pt->next_offset : pt->high_seen + 1);
    int failed = e || l->elems[0].err;
    if (failed)
        snprintf(errstr, errstr_size,
                 "kafka: seek %s [%s] to the redis position %s: %s", pt->topic,
                 part, off,
                 e ? rd_kafka_error_string(e)
                   : rd_kafka_err2str(l->elems[0].err));
    else
        idem_log_kv(IDEM_LOG_WARN, "rewound to the position redis holds",
                    "topic", pt->topic, "partition", part, "offset", off,
                    "held", held, NULL);
    if (e)
        rd_kafka_error_destroy(e);
    rd_kafka_topic_partition_list_destroy(l);
    if (failed)
        return -1;
    pt->next_offset = offset;
    pt->high_seen = offset - 1;
    pt->saved = offset;
    pt->fp.offset = -1;
    if (fp && fp->offset >= 0 && fp->offset < offset)
        pt->fp = *fp;
    return 0;
}

/* Logs and counts one loss: a position in Redis behind the one it
 * acknowledged, or behind Kafka's committed offset (Redis went back in
 * time: it lost acknowledged writes); redis is -1 when the position is gone
 * altogether. Every loss is said: the caller calls it once per reconnect or
 * assignment that reveals one, and a rewind makes the member's own view
 * agree with Redis again. */
static void position_behind(idem_positions_t *ps, idem_part_t *pt,
                            int64_t redis)
{
    idem_metrics_redis_behind_add(ps->m, 1);
    char part[16], r[24], k[24], a[24], st[24];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(r, sizeof(r), "%" PRId64, redis);
    snprintf(k, sizeof(k), "%" PRId64, pt->committed);
    snprintf(a, sizeof(a), "%" PRId64, pt->saved);
    snprintf(st, sizeof(st), "%" PRId64, pt->start);
    idem_log_kv(IDEM_LOG_WARN,
                redis < 0 ? "redis lost the position of a partition: reading "
                            "again from the first position of this "
                            "assignment"
                          : "redis went back in time: its position is behind "
                            "what it acknowledged or kafka's committed "
                            "offset; reading again from it",
                "topic", pt->topic, "partition", part, "redis_offset", r,
                "acknowledged_offset", a, "kafka_offset", k, "start_offset", st,
                NULL);
}

/* Logs and counts Kafka's committed offset moved by another tool (its
 * commit metadata is not ours) to kafka, while Redis holds redis: not
 * honoured, the member starts from Redis's position. */
static void kafka_moved(idem_positions_t *ps, idem_part_t *pt, int64_t redis,
                        int64_t kafka, const rd_kafka_topic_partition_t *e)
{
    idem_metrics_kafka_moved_add(ps->m, 1);
    char part[16], r[24], k[24], meta[96];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(r, sizeof(r), "%" PRId64, redis);
    snprintf(k, sizeof(k), "%" PRId64, kafka);
    snprintf(meta, sizeof(meta), "%.*s",
             e->metadata ? (int)(e->metadata_size < 95 ? e->metadata_size : 95)
                         : 0,
             e->metadata ? (const char *)e->metadata : "");
    idem_log_kv(IDEM_LOG_WARN,
                "kafka's committed offset was moved by another tool, not by "
                "a member or idemproc offsets reset: not honoured, starting "
                "from redis's position (move a group with idemproc offsets "
                "reset)",
                "topic", pt->topic, "partition", part, "redis_offset", r,
                "kafka_offset", k, "kafka_metadata", meta, NULL);
}

/* Redis holds no position of pt while Kafka holds the offset `kafka` a
 * member committed (e: its commit): Redis lost everything of pt, and how
 * far back is unknown (idem_offreset_redis_lost). pt is marked lost: kept
 * paused and not ready until `idemproc offsets reset` writes both sides.
 * Logged and counted as Redis going back in time (alert
 * IdemprocRedisWentBackInTime). */
static void partition_lost(idem_positions_t *ps, idem_part_t *pt, int64_t kafka,
                           const rd_kafka_topic_partition_t *e)
{
    pt->lost = 1;
    idem_metrics_redis_behind_add(ps->m, 1);
    char part[16], k[24], meta[96];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(k, sizeof(k), "%" PRId64, kafka);
    snprintf(meta, sizeof(meta), "%.*s",
             e->metadata ? (int)(e->metadata_size < 95 ? e->metadata_size : 95)
                         : 0,
             e->metadata ? (const char *)e->metadata : "");
    idem_log_kv(IDEM_LOG_ERROR,
                "redis lost its state of a partition: it holds no position "
                "while kafka holds an offset a member committed; how far back "
                "redis lost is unknown, so the partition stays paused and the "
                "member not ready until idemproc offsets reset --execute "
                "writes both sides",
                "topic", pt->topic, "partition", part, "redis_offset", "-1",
                "kafka_offset", k, "kafka_metadata", meta, NULL);
}

/* Logs that a partition starts where `idemproc offsets reset` put it
 * (e: its commit, metadata "idemproc offsets reset <time>"). */
static void reset_honoured(const idem_part_t *pt, int64_t offset,
                           const rd_kafka_topic_partition_t *e)
{
    char part[16], o[24], meta[96];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(o, sizeof(o), "%" PRId64, offset);
    snprintf(meta, sizeof(meta), "%.*s",
             (int)(e->metadata_size < 95 ? e->metadata_size : 95),
             (const char *)e->metadata);
    idem_log_kv(IDEM_LOG_INFO,
                "starting where idemproc offsets reset put the partition",
                "topic", pt->topic, "partition", part, "offset", o, "reset",
                meta, NULL);
}

/* The Kafka cluster's id, asked once (the consumer has its metadata by
 * the first assignment); "" while not known. */
static const char *cluster_id(idem_positions_t *ps)
{
    if (!ps->cluster[0]) {
        char *id = rd_kafka_clusterid(ps->rk, 2000);
        if (id) {
            snprintf(ps->cluster, sizeof(ps->cluster), "%s", id);
            rd_kafka_mem_free(ps->rk, id);
        }
    }
    return ps->cluster;
}

/* Judges the positions pos[n] (offset -1: none) against what Kafka holds
 * now (posval.h) into verdict[n]: with `read`, by reading back the records
 * they vouch for and the partitions' watermarks; else by the cluster id
 * alone. A position that does not belong here is logged and counted (alert
 * IdemprocPositionMismatch). Returns 0, or -1 with errstr when Kafka did not
 * answer (retriable). */
static int positions_judge(idem_positions_t *ps, const idem_store_pos_t *pos,
                           size_t n, int read, idem_posval_verdict_t *verdict,
                           char *errstr, size_t errstr_size)
{
    const char *cluster = cluster_id(ps);
    idem_posread_item_t *items = idem_xcalloc(n ? n : 1, sizeof(*items));
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++) {
        verdict[i] = IDEM_POSVAL_USE;
        if (pos[i].offset < 0 || !read)
            continue;
        items[cnt].topic = pos[i].topic;
        items[cnt].partition = pos[i].partition;
        items[cnt].rec_offset = pos[i].val.rec.offset;
        cnt++;
    }
    if (cnt && !ps->posread &&
        !(ps->posread = idem_posread_new(ps->conf, errstr, errstr_size))) {
        free(items);
        return -1;
    }
    if (cnt &&
        idem_posread_read(ps->posread, items, cnt, 5000, errstr, errstr_size)) {
        free(items);
        return -1;
    }
    for (size_t i = 0, k = 0; i < n; i++) {
        if (pos[i].offset < 0)
            continue;
        idem_posval_now_t now = {.cluster = cluster, .low = -1, .high = -1};
        if (read)
            now = items[k++].now;
        now.cluster = cluster;
        idem_posval_t v = pos[i].val;
        if (!read)
            v.rec.offset = -1; /* the cluster alone */
        verdict[i] = idem_posval_judge(pos[i].offset, &v, &now);
        if (verdict[i] == IDEM_POSVAL_USE)
            continue;
        const char *why = idem_posval_verdict2str(verdict[i]);
        idem_metrics_position_mismatch_add(ps->m, why);
        char part[16], off[24], rec[24], high[24];
        snprintf(part, sizeof(part), "%" PRId32, pos[i].partition);
        snprintf(off, sizeof(off), "%" PRId64, pos[i].offset);
        snprintf(rec, sizeof(rec), "%" PRId64, pos[i].val.rec.offset);
        snprintf(high, sizeof(high), "%" PRId64, now.high);
        idem_log_kv(IDEM_LOG_ERROR,
                    "position in redis belongs to another kafka cluster or "
                    "topic: not used; starting from kafka's committed offset",
                    "topic", pos[i].topic, "partition", part, "redis_offset",
                    off, "reason", why, "position_cluster",
                    pos[i].val.cluster[0] ? pos[i].val.cluster : "-",
                    "kafka_cluster", cluster[0] ? cluster : "-",
                    "record_offset", rec, "high_watermark", high, NULL);
    }
    free(items);
    return 0;
}

/* Pauses pt in librdkafka (a partition it holds). */
static void pause_one(idem_positions_t *ps, const idem_part_t *pt)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition);
    rd_kafka_pause_partitions(ps->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
}

/* The partitions of offs not checked since their assignment (Redis could
 * not be asked then) for which Redis holds no position (pos[], one per
 * partition of offs) are judged as idem_positions_assign judges them:
 * lost when Kafka holds a member's offset, which are then paused, their
 * records in hand dropped. Returns 0, or -1 with errstr when Kafka did not
 * answer (retriable). */
static int unchecked_lost(idem_positions_t *ps, idem_offsets_t *offs,
                          const idem_store_pos_t *pos, char *errstr,
                          size_t errstr_size)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    for (size_t i = 0; i < offs->cnt; i++) {
        if (offs->v[i].checked || offs->v[i].lost || pos[i].offset >= 0)
            continue;
        if (!l)
            l = rd_kafka_topic_partition_list_new((int)offs->cnt);
        rd_kafka_topic_partition_list_add(l, offs->v[i].topic,
                                          offs->v[i].partition);
    }
    if (!l)
        return 0;
    rd_kafka_resp_err_t err = rd_kafka_committed(ps->rk, l, 5000);
    if (err) {
        snprintf(errstr, errstr_size, "kafka: committed offsets: %s",
                 rd_kafka_err2str(err));
        rd_kafka_topic_partition_list_destroy(l);
        return -1;
    }
    for (int i = 0; i < l->cnt; i++) {
        const rd_kafka_topic_partition_t *e = &l->elems[i];
        idem_part_t *pt = idem_offsets_find(offs, e->topic, e->partition);
        int64_t kafka = e->err ? -1 : e->offset;
        if (!pt ||
            !idem_offreset_redis_lost(
                -1, kafka,
                idem_offreset_committed_by(e->metadata, e->metadata_size)))
            continue;
        pt->committed = kafka;
        if (ps->before_rewind)
            ps->before_rewind(ps->ctx, pt);
        if (held_by_librdkafka(ps->rk, pt))
            pause_one(ps, pt);
        partition_lost(ps, pt, kafka, e);
        pt->checked = 1;
    }
    rd_kafka_topic_partition_list_destroy(l);
    return 0;
}

/* After every new connection to Redis (and for partitions assigned while
 * Redis could not be asked) reads the positions Redis holds and rewinds
 * every partition whose position is behind what the member holds: a
 * restarted Redis, or another server, may have lost its last writes while
 * the member kept running. A reconnect to the same server (same run_id,
 * nothing lost) rewinds only if Redis holds less than it acknowledged.
 * No request may be in flight. Returns 0, or -1 (infrastructure). */
int idem_positions_sync(idem_positions_t *ps, idem_offsets_t *offs,
                        const idem_records_t *recs, char *errstr,
                        size_t errstr_size)
{
    if (idem_store_connect(ps->store, errstr, errstr_size))
        return -1;
    uint64_t conns = idem_store_connections(ps->store);
    int reconnected = conns != ps->store_conns;
    const char *run_id = idem_store_run_id(ps->store);
    int other_server =
        reconnected && ps->run_id[0] && strcmp(ps->run_id, run_id);
    int unchecked = 0;
    for (size_t i = 0; i < offs->cnt; i++)
        unchecked |= !offs->v[i].checked;
    if (!reconnected && !unchecked)
        return 0;
    idem_store_pos_t *pos = pos_reserve(ps, offs->cnt ? offs->cnt : 1);
    for (size_t i = 0; i < offs->cnt; i++) {
        pos[i].topic = offs->v[i].topic;
        pos[i].partition = offs->v[i].partition;
        pos[i].offset = -1; /* filled in by the load */
    }
    if (idem_store_positions_load(ps->store, pos, offs->cnt, errstr,
                                  errstr_size))
        return -1;
    /* A partition not checked since its assignment is judged as at the
     * assignment (its records read back); the others were written by this
     * group in this cluster, and only their cluster is compared. */
    idem_posval_verdict_t *verdict =
        idem_xcalloc(offs->cnt ? offs->cnt : 1, sizeof(*verdict));
    if (positions_judge(ps, pos, offs->cnt, unchecked, verdict, errstr,
                        errstr_size)) {
        free(verdict);
        return -1;
    }
    if (unchecked_lost(ps, offs, pos, errstr, errstr_size)) {
        free(verdict);
        return -1;
    }
    for (size_t i = 0; i < offs->cnt; i++) {
        idem_part_t *pt = &offs->v[i];
        if (pt->lost)
            continue;
        int64_t r = verdict[i] == IDEM_POSVAL_USE ? pos[i].offset : -1;
        idem_offsets_rewind_t d = idem_offsets_rewind_decide(
            pt, r, part_hold(recs, offs, pt), reconnected, other_server);
        if (d.behind)
            position_behind(ps, pt, r);
        if (d.rewind >= 0 &&
            partition_rewind(ps, pt, d.rewind, r < 0 ? NULL : &pos[i].val.rec,
                             errstr, errstr_size)) {
            free(verdict);
            return -1; /* again next time: ps->store_conns not updated */
        }
        if (d.forget)
            pt->saved = -1;
        if (r >= 0 && !pt->checked && pt->start < 0)
            pt->start = r;
        pt->checked = 1;
    }
    free(verdict);
    ps->store_conns = conns;
    snprintf(ps->run_id, sizeof(ps->run_id), "%s", run_id);
    return 0;
}

/* ------------------------------------------------------------ rebalance */

/* Sets each newly assigned partition of `parts` to start at the position
 * Redis holds for it, when it holds one (else Kafka's committed offset
 * applies), and compares it with Kafka's committed offset. When Redis
 * cannot be asked now, idem_positions_sync does it once it can (the member
 * is paused until then). */
void idem_positions_assign(idem_positions_t *ps, idem_offsets_t *offs,
                           rd_kafka_topic_partition_list_t *parts)
{
    char errstr[512];
    if (parts->cnt == 0)
        return;
    idem_store_pos_t *pos = pos_reserve(ps, (size_t)parts->cnt);
    for (int i = 0; i < parts->cnt; i++) {
        pos[i].topic = parts->elems[i].topic;
        pos[i].partition = parts->elems[i].partition;
        pos[i].offset = -1; /* filled in by the load */
    }
    if (idem_store_positions_load(ps->store, pos, (size_t)parts->cnt, errstr,
                                  sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "reading positions from redis failed",
                    "error", errstr, NULL);
        return; /* idem_positions_sync asks again before anything is
                   applied */
    }
    /* Positions of another cluster or another incarnation of the topic
     * are never used (posval.h): their records are read back first. */
    idem_posval_verdict_t *verdict =
        idem_xcalloc((size_t)parts->cnt, sizeof(*verdict));
    if (positions_judge(ps, pos, (size_t)parts->cnt, 1, verdict, errstr,
                        sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN,
                    "reading back the records positions vouch for failed",
                    "error", errstr, NULL);
        free(verdict);
        return; /* idem_positions_sync judges before anything is
                   applied */
    }
    rd_kafka_topic_partition_list_t *committed =
        rd_kafka_topic_partition_list_copy(parts);
    if (rd_kafka_committed(ps->rk, committed, 5000))
        for (int i = 0; i < committed->cnt; i++)
            committed->elems[i].offset = RD_KAFKA_OFFSET_INVALID;
    for (int i = 0; i < parts->cnt; i++) {
        idem_part_t *pt = idem_offsets_find(offs, parts->elems[i].topic,
                                            parts->elems[i].partition);
        int64_t kafka = committed->elems[i].err ? RD_KAFKA_OFFSET_INVALID
                                                : committed->elems[i].offset;
        if (kafka >= 0)
            pt->committed = kafka;
        const rd_kafka_topic_partition_t *e = &committed->elems[i];
        idem_offreset_by_t by =
            idem_offreset_committed_by(e->metadata, e->metadata_size);
        if (idem_offreset_redis_lost(pos[i].offset, kafka, by))
            partition_lost(ps, pt, kafka, e);
        if (pos[i].offset >= 0 && verdict[i] == IDEM_POSVAL_USE) {
            parts->elems[i].offset = pos[i].offset;
            pt->saved = pos[i].offset;
            pt->start = pos[i].offset;
            if (pos[i].val.rec.offset < pos[i].offset)
                pt->fp = pos[i].val.rec;
            /* Who moved Kafka's offset tells a reset, another tool and
             * a Redis that lost writes apart (kafka/offreset.h). */
            if (kafka >= 0 && by == IDEM_OFFRESET_BY_OTHER &&
                pos[i].offset != kafka)
                kafka_moved(ps, pt, pos[i].offset, kafka, e);
            else if (kafka >= 0 && pos[i].offset < kafka)
                position_behind(ps, pt, pos[i].offset);
            else if (by == IDEM_OFFRESET_BY_RESET && pos[i].offset == kafka)
                reset_honoured(pt, kafka, e);
        }
        /* Else Kafka's committed offset (or auto.offset.reset) applies, and
         * the first request writes a position of this cluster first; or the
         * partition is lost (idem_positions_preset_lost keeps it paused). */
        pt->checked = 1;
    }
    free(verdict);
    rd_kafka_topic_partition_list_destroy(committed);
}

void idem_positions_preset_lost(idem_positions_t *ps,
                                const idem_offsets_t *offs,
                                const rd_kafka_topic_partition_list_t *parts,
                                rd_kafka_topic_partition_list_t **late)
{
    for (int i = 0; i < parts->cnt; i++) {
        const idem_part_t *pt =
            idem_offsets_find((idem_offsets_t *)offs, parts->elems[i].topic,
                              parts->elems[i].partition);
        if (!pt || !pt->lost)
            continue;
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition);
        rd_kafka_resp_err_t err = rd_kafka_pause_partitions(ps->rk, l);
        if (err || l->elems[0].err) {
            /* Unknown to librdkafka yet: paused after the assign. */
            if (!*late)
                *late = rd_kafka_topic_partition_list_new(parts->cnt);
            rd_kafka_topic_partition_list_add(*late, pt->topic, pt->partition);
        }
        rd_kafka_topic_partition_list_destroy(l);
    }
}

const char *idem_positions_not_ready(idem_positions_t *ps,
                                     const idem_offsets_t *offs)
{
    size_t n = 0;
    const idem_part_t *first = NULL;
    for (size_t i = 0; i < offs->cnt; i++)
        if (offs->v[i].lost && n++ == 0)
            first = &offs->v[i];
    if (!first)
        return NULL;
    snprintf(ps->why, sizeof(ps->why),
             "redis lost its state of %s [%" PRId32 "]%s (no position, kafka "
             "holds a member's offset %" PRId64 "): paused until idemproc "
             "offsets reset --execute",
             first->topic, first->partition,
             n > 1 ? " and other partitions" : "", first->committed);
    return ps->why;
}
