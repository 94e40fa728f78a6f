/* positions: the positions a member keeps in Redis next to its effects
 * (docs/design.md, "Positions in Redis"): saving them before Kafka
 * commits, reading them at assignment and after a reconnect, rewinding a
 * partition whose position Redis lost. Its state is its own; the
 * partitions (offsets.h) and the records in hand (records.h) are passed
 * in, and what a rewind needs of the rest of the loop (the handler let go
 * of the partition's records, which are dropped) is a hook the loop sets. */
#ifndef IDEM_POSITIONS_H
#define IDEM_POSITIONS_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "conf/conf.h"
#include "loop/offsets.h"
#include "loop/posread.h"
#include "loop/rec.h"
#include "loop/records.h"
#include "obs/metrics.h"
#include "redis/posval.h"
#include "redis/store.h"

typedef struct {
    const idem_conf_t *conf; /* borrowed: what posread needs */
    idem_metrics_t *m;       /* borrowed; may be NULL */
    idem_store_t *store;     /* borrowed */
    rd_kafka_t *rk;          /* borrowed: the consumer (cluster id, committed
                                offsets, seeks) */
    uint64_t store_conns;    /* store connections when positions were read */
    char run_id[48];         /* the Redis server's run_id at that time */
    idem_store_pos_t *pos;   /* scratch: positions to save or load (owned) */
    size_t pos_cap;
    char cluster[IDEM_POSVAL_CLUSTER_MAX]; /* the Kafka cluster's id ("": not
                                              known yet) */
    idem_posread_t *posread; /* reads back what positions vouch for
                                (created at the first need; owned) */
    /* Before partition pt is sought back: the loop lets the handler finish
     * or abandon what it holds and drops pt's records in hand. */
    void (*before_rewind)(void *ctx, const idem_part_t *pt);
    void *ctx;
    char why[320]; /* scratch of idem_positions_not_ready */
} idem_positions_t;

/* Embedded in the loop: the borrowed handles are set by the caller
 * (rk may come later), the hook too. _term frees what it owns. */
void idem_positions_init(idem_positions_t *ps, const idem_conf_t *conf,
                         idem_metrics_t *m, idem_store_t *store);
void idem_positions_term(idem_positions_t *ps);

/* Collects into ps->pos the partitions (of subset, if not NULL) whose
 * finished prefix moved past the position Redis holds. Returns how many. */
size_t idem_positions_due(idem_positions_t *ps, const idem_offsets_t *offs,
                          const rd_kafka_topic_partition_list_t *subset);

/* Cluster mode: touches the global path's buckets (store.h,
 * idem_store_gpos_touch) for every partition held whose touch is due. For
 * a loop under constant load, whose commit step rarely finds the store
 * free: the caller calls it when the store is free between two requests,
 * at most every second. No-op on a single Redis. */
void idem_positions_touch(idem_positions_t *ps, const idem_offsets_t *offs);

/* Writes the finished prefixes to Redis before they are committed to
 * Kafka. The caller calls it only when the store is free (no request in
 * flight) and up. A failure is logged and leaves the Kafka commit
 * behind; the next attempt catches up. */
void idem_positions_save(idem_positions_t *ps, idem_offsets_t *offs,
                         const idem_records_t *recs,
                         const rd_kafka_topic_partition_list_t *subset);

/* After every new connection to Redis (and for partitions assigned while
 * Redis could not be asked) reads the positions Redis holds and rewinds
 * every partition whose position is behind what the member holds. The
 * store must be free. Returns 0, or -1 (infrastructure: errstr). */
int idem_positions_sync(idem_positions_t *ps, idem_offsets_t *offs,
                        const idem_records_t *recs, char *errstr,
                        size_t errstr_size);

/* Before the handler gets the first records rs[n] of a partition for which
 * Redis holds no position, writes one there. The store must be free.
 * Returns 0, or -1 (outage: nothing was handed over). */
int idem_positions_first(idem_positions_t *ps, idem_offsets_t *offs,
                         const idem_records_t *recs, rec_t *const *rs, size_t n,
                         char *errstr, size_t errstr_size);

/* Sets each newly assigned partition of `parts` (already held in offs) to
 * start at the position Redis holds for it, when it holds one, and
 * compares it with Kafka's committed offset. The store must be free and
 * up; when Redis cannot be asked now, idem_positions_sync does it later. */
void idem_positions_assign(idem_positions_t *ps, idem_offsets_t *offs,
                           rd_kafka_topic_partition_list_t *parts);

/* A partition of which Redis lost everything (idem_part_t.lost: no
 * position in Redis, a member's offset in Kafka) stays paused: called
 * after idem_positions_assign and the loop's own pause preset, before
 * librdkafka's assign, it pauses the lost ones of `parts`; those librdkafka
 * does not know yet are added to *late (created when NULL), which the
 * caller pauses after the assign. */
void idem_positions_preset_lost(idem_positions_t *ps,
                                const idem_offsets_t *offs,
                                const rd_kafka_topic_partition_list_t *parts,
                                rd_kafka_topic_partition_list_t **late);

/* Why the member is not ready because of a lost partition (borrowed, valid
 * until the next call), or NULL when none is lost. */
const char *idem_positions_not_ready(idem_positions_t *ps,
                                     const idem_offsets_t *offs);

#endif
