/* positions: the positions a member keeps in Redis next to its effects
 * (docs/design.md, "Positions in Redis"): saving them before Kafka
 * commits, reading them at assignment and after a reconnect, rewinding a
 * partition whose position Redis lost. Part of the loop (loop.h). */
#include "loop/loop.h"
#include "base/log.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static idem_store_pos_t *pos_reserve(idem_pipeline_t *p, size_t n)
{
    if (p->pos_cap < n) {
        p->pos_cap = n;
        p->pos = idem_xrealloc(p->pos, n * sizeof(*p->pos));
    }
    return p->pos;
}

/* Collects into p->pos the partitions (of subset, if not NULL) whose
 * finished prefix moved past the position Redis holds. Returns how many. */
size_t idem_loop_positions_due(idem_pipeline_t *p,
                               const rd_kafka_topic_partition_list_t *subset)
{
    return idem_offsets_positions_due(
        &p->offs, subset, pos_reserve(p, p->offs.cnt ? p->offs.cnt : 1));
}

/* Writes the finished prefixes to Redis before they are committed to
 * Kafka (docs/design.md, "Positions in Redis"); only with no request in
 * flight (the ledger sends them along with its requests otherwise). A
 * failure leaves the Kafka commit behind; the next attempt catches up. */
void idem_loop_positions_save(idem_pipeline_t *p,
                              const rd_kafka_topic_partition_list_t *subset)
{
    if (idem_loop_store_busy(p) || p->flow.down || p->refused ||
        idem_loop_positions_due(p, subset) == 0)
        return;
    char errstr[512];
    /* A new connection is compared first (which may rewind): never write
     * a position over one Redis lost together with the effects below. */
    if (idem_loop_positions_sync(p, errstr, sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "reading positions from redis failed",
                    "error", errstr, NULL);
        return;
    }
    size_t n = idem_loop_positions_due(p, subset);
    if (n && idem_store_positions_save(p->store, p->pos, n, errstr,
                                       sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "saving positions in redis failed", "error",
                    errstr, NULL);
        return;
    }
    for (size_t i = 0; i < n; i++)
        idem_loop_part_find(p, p->pos[i].topic, p->pos[i].partition)->saved =
            p->pos[i].offset;
}

/* ------------------------------------------------ positions from Redis */

static int rec_in_part(idem_pipeline_t *p, const rec_t *r, const void *pt)
{
    return idem_loop_rec_part(p, r) == pt;
}

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
static int partition_rewind(idem_pipeline_t *p, idem_part_t *pt, int64_t offset,
                            char *errstr, size_t errstr_size)
{
    idem_loop_handler_settle(p, idem_now_ms() + idem_loop_wait_budget_ms(p));
    idem_loop_batch_remove_if(p, rec_in_part, pt);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition)->offset =
        offset;
    /* A partition the fetch watch took out of the assignment (its assign
     * back refused) cannot be sought: librdkafka refuses, for good. Its
     * assign back starts where the member's position says, set below. */
    rd_kafka_error_t *e = held_by_librdkafka(p->rk, pt)
                              ? rd_kafka_seek_partitions(p->rk, l, 5000)
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
    idem_metrics_inflight_set(p->m, (int64_t)p->cnt);
    if (failed)
        return -1;
    pt->next_offset = offset;
    pt->high_seen = offset - 1;
    pt->saved = offset;
    return 0;
}

/* Logs (once per partition and assignment) and counts a position in Redis
 * behind the one it acknowledged, or behind Kafka's committed offset:
 * Redis went back in time (it lost acknowledged writes). redis is -1 when
 * the position is gone altogether. */
static void position_behind(idem_pipeline_t *p, idem_part_t *pt, int64_t redis)
{
    if (pt->behind_logged)
        return;
    pt->behind_logged = 1;
    idem_metrics_redis_behind_add(p->m, 1);
    char part[16], r[24], k[24], a[24];
    snprintf(part, sizeof(part), "%" PRId32, pt->partition);
    snprintf(r, sizeof(r), "%" PRId64, redis);
    snprintf(k, sizeof(k), "%" PRId64, pt->committed);
    snprintf(a, sizeof(a), "%" PRId64, pt->saved);
    idem_log_kv(IDEM_LOG_WARN,
                redis < 0 ? "redis lost the position of a partition (it "
                            "lost its data: persistence off?)"
                          : "redis went back in time: its position is behind "
                            "what it acknowledged or kafka's committed "
                            "offset; reading again from it",
                "topic", pt->topic, "partition", part, "redis_offset", r,
                "acknowledged_offset", a, "kafka_offset", k, NULL);
}

/* The lowest offset pt holds in hand (or has finished up to); -1 when it
 * has not consumed anything since it was assigned. */
static int64_t part_hold(idem_pipeline_t *p, const idem_part_t *pt)
{
    if (pt->next_offset >= 0)
        return pt->next_offset;
    int64_t low = -1;
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(&p->recs, &i));)
        if (idem_loop_rec_part(p, r) == pt && (low < 0 || r->view.offset < low))
            low = r->view.offset;
    return low >= 0 ? low : pt->saved;
}

/* After every new connection to Redis (and for partitions assigned while
 * Redis could not be asked) reads the positions Redis holds and rewinds
 * every partition whose position is behind what the member holds: a
 * restarted Redis, or another server, may have lost its last writes while
 * the member kept running. A reconnect to the same server (same run_id,
 * nothing lost) rewinds only if Redis holds less than it acknowledged.
 * No request may be in flight. Returns 0, or -1 (infrastructure). */
int idem_loop_positions_sync(idem_pipeline_t *p, char *errstr,
                             size_t errstr_size)
{
    if (idem_loop_store_busy(p))
        return 0;
    if (idem_store_connect(p->store, errstr, errstr_size))
        return -1;
    uint64_t conns = idem_store_connections(p->store);
    int reconnected = conns != p->store_conns;
    const char *run_id = idem_store_run_id(p->store);
    int other_server = reconnected && p->run_id[0] && strcmp(p->run_id, run_id);
    int unchecked = 0;
    for (size_t i = 0; i < p->offs.cnt; i++)
        unchecked |= !p->offs.v[i].checked;
    if (!reconnected && !unchecked)
        return 0;
    idem_store_pos_t *pos = pos_reserve(p, p->offs.cnt ? p->offs.cnt : 1);
    for (size_t i = 0; i < p->offs.cnt; i++) {
        pos[i].topic = p->offs.v[i].topic;
        pos[i].partition = p->offs.v[i].partition;
        pos[i].offset = -1; /* filled in by the load */
    }
    if (idem_store_positions_load(p->store, pos, p->offs.cnt, errstr,
                                  errstr_size))
        return -1;
    for (size_t i = 0; i < p->offs.cnt; i++) {
        idem_part_t *pt = &p->offs.v[i];
        int64_t r = pos[i].offset;
        if (r < 0) {
            if (other_server && pt->saved >= 0)
                position_behind(p, pt, -1);
            pt->checked = 1;
            continue;
        }
        /* Lost writes: what Redis acknowledged (the writes after a host
         * crash's last fsync, a lagging replica), and perhaps also what
         * Kafka had committed after them. */
        if ((pt->committed >= 0 && r < pt->committed) ||
            (pt->saved >= 0 && r < pt->saved))
            position_behind(p, pt, r);
        int64_t hold = part_hold(p, pt);
        int rewind = pt->checked ? (other_server || r < pt->saved) &&
                                       hold >= 0 && r < hold
                                 : hold < 0 || r < hold;
        if (rewind && partition_rewind(p, pt, r, errstr, errstr_size))
            return -1; /* again next time: p->store_conns not updated */
        pt->checked = 1;
    }
    p->store_conns = conns;
    snprintf(p->run_id, sizeof(p->run_id), "%s", run_id);
    return 0;
}

/* ------------------------------------------------------------ rebalance */

/* Sets each newly assigned partition of `parts` to start at the position
 * Redis holds for it, when it holds one (else Kafka's committed offset
 * applies), and compares it with Kafka's committed offset. When Redis
 * cannot be asked now, idem_loop_positions_sync does it once it can (the member
 * is paused until then). */
void idem_loop_assign_positions(idem_pipeline_t *p,
                                rd_kafka_topic_partition_list_t *parts)
{
    char errstr[512];
    if (idem_loop_store_busy(p)) /* its replies come first on the connection */
        idem_loop_handler_collect(p, 0, errstr, sizeof(errstr));
    if (p->flow.down || p->refused || parts->cnt == 0)
        return;
    idem_store_pos_t *pos = pos_reserve(p, (size_t)parts->cnt);
    for (int i = 0; i < parts->cnt; i++) {
        pos[i].topic = parts->elems[i].topic;
        pos[i].partition = parts->elems[i].partition;
        pos[i].offset = -1; /* filled in by the load */
    }
    if (idem_store_positions_load(p->store, pos, (size_t)parts->cnt, errstr,
                                  sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_WARN, "reading positions from redis failed",
                    "error", errstr, NULL);
        return; /* idem_loop_positions_sync asks again before anything is
                   applied */
    }
    rd_kafka_topic_partition_list_t *committed =
        rd_kafka_topic_partition_list_copy(parts);
    if (rd_kafka_committed(p->rk, committed, 5000))
        for (int i = 0; i < committed->cnt; i++)
            committed->elems[i].offset = RD_KAFKA_OFFSET_INVALID;
    for (int i = 0; i < parts->cnt; i++) {
        idem_part_t *pt = idem_loop_part_find(p, parts->elems[i].topic,
                                              parts->elems[i].partition);
        int64_t kafka = committed->elems[i].err ? RD_KAFKA_OFFSET_INVALID
                                                : committed->elems[i].offset;
        if (kafka >= 0)
            pt->committed = kafka;
        if (pos[i].offset >= 0) {
            parts->elems[i].offset = pos[i].offset;
            pt->saved = pos[i].offset;
            if (kafka >= 0 && pos[i].offset < kafka)
                position_behind(p, pt, pos[i].offset);
        }
        pt->checked = 1;
    }
    rd_kafka_topic_partition_list_destroy(committed);
}
