/* parttables: a member's tables of its partitions' dedup marks under
 * dedup.scope=partition (docs/design.md, "Dedup state layout"): which path
 * a record takes, its mark, the lookup that answers duplicates in the
 * member, the settling of a chunk's reply, when a table is dropped and
 * reloaded, expiry by window and the bound on memory. No Redis and no
 * Kafka here: the loop feeds it what redis/partstate.h reads and answers. */
#ifndef IDEM_PARTTABLES_H
#define IDEM_PARTTABLES_H

#include <stddef.h>
#include <stdint.h>

#include "loop/marktab.h"

typedef struct idem_parttables_s idem_parttables_t;

/* Tables under the group's hash key (16 bytes, copied) bounded together by
 * memory_max bytes. NULL when out of memory. Free with
 * idem_parttables_destroy (NULL is a no-op). */
idem_parttables_t *idem_parttables_new(const uint8_t key[16],
                                       size_t memory_max);
void idem_parttables_destroy(idem_parttables_t *t);

/* Which dedup path a record takes. Only a record read from an input topic,
 * with a Kafka key, and not a replay takes the partition's: a copy in a
 * retry topic or a replay may be read by another partition's owner, and a
 * record without a key says nothing of where its identity lives. */
typedef enum {
    IDEM_PART_PATH_PARTITION = 0,
    IDEM_PART_PATH_GLOBAL,
} idem_part_path_t;

idem_part_path_t idem_parttables_path(int from_retry_topic, int replayed,
                                      size_t key_len);

/* The record's mark: 12 bytes of SipHash-2-4-128 of the identity, then the
 * 31-bit digest of the message id, big-endian, top bit 0. */
void idem_parttables_mark(const idem_parttables_t *t, const void *identity,
                          size_t identity_len, const void *message_id,
                          size_t message_id_len, idem_mark_t16 *out);

/* A partition this member now owns, at epoch (its INCR): an empty table,
 * not loaded. Returns 0, or -1 out of memory or a negative partition. An
 * existing entry is reset. Tables are indexed by topic, then partition
 * number: every call below finds its partition in O(1) of the partitions
 * held (a compare per topic held, then an array index). */
int idem_parttables_assign(idem_parttables_t *t, const char *topic,
                           int32_t partition, int64_t epoch);

/* Revoked or lost: the table and the entry go. */
void idem_parttables_drop(idem_parttables_t *t, const char *topic,
                          int32_t partition);

/* Its table can no longer be trusted (a FENCED or POSITION answer, a
 * failed chunk, a new Redis run_id, a rewind): emptied and marked not
 * loaded; the loop loads it again before the partition's next chunk. */
void idem_parttables_reset(idem_parttables_t *t, const char *topic,
                           int32_t partition);

/* Loader feed: marks[n] (16 B each) of window w into the partition's table.
 * Returns 0; -1 out of memory; -2 when this table alone has passed
 * memory_max (the partition must be refused: it can never fit). */
int idem_parttables_load(idem_parttables_t *t, const char *topic,
                         int32_t partition, const uint8_t *marks, size_t n,
                         int64_t w);

/* The load ended: the partition's records may be looked up. */
void idem_parttables_loaded(idem_parttables_t *t, const char *topic,
                            int32_t partition);

/* 1 when the partition is assigned and its table loaded. *epoch (may be
 * NULL) gets its epoch. */
int idem_parttables_ready(const idem_parttables_t *t, const char *topic,
                          int32_t partition, int64_t *epoch);

/* What the member's table says of a record on the partition path. */
typedef enum {
    IDEM_PART_NEW = 0,   /* not held: taken (added in window w), send it */
    IDEM_PART_DUPLICATE, /* done: *prior the digest of the first's id */
    IDEM_PART_MOVED,     /* held as "moved": take the global path */
    IDEM_PART_NOT_READY, /* partition not assigned or not loaded */
    IDEM_PART_NOMEM,     /* could not be added: take it again later */
} idem_part_lookup_t;

/* Looks mark m up in the partition's table and, when not held, adds it in
 * window w (the window the loop expects the chunk to land in: the last one
 * Redis answered), so a second record of the same identity in the same
 * chunk is a duplicate. prior may be NULL. */
idem_part_lookup_t idem_parttables_take(idem_parttables_t *t, const char *topic,
                                        int32_t partition,
                                        const idem_mark_t16 *m, int64_t w,
                                        uint32_t *prior);

/* After a chunk's reply: mark m, taken in window w_taken, landed in window
 * w_redis; rejected: Redis refused its effect and wrote a "moved" mark
 * instead, which the table now holds. Returns 0, or -1 out of memory (the
 * caller resets the partition). */
int idem_parttables_settle(idem_parttables_t *t, const char *topic,
                           int32_t partition, const idem_mark_t16 *m,
                           int64_t w_taken, int64_t w_redis, int rejected);

/* The oldest window still alive at Redis time now (seconds): a chunk of
 * window w lives until (w + 1) * window_s + ttl_s. */
int64_t idem_parttables_min_window(int64_t now, int64_t window_s,
                                   int64_t ttl_s);

/* Drops every window < min_w from every table. */
void idem_parttables_expire(idem_parttables_t *t, int64_t min_w);

/* Bytes all tables hold, and whether that reached memory_max (the loop
 * stops fetching until windows expire or partitions leave). */
size_t idem_parttables_bytes(const idem_parttables_t *t);
int idem_parttables_full(const idem_parttables_t *t);

/* The input topic's partition count, recorded in Redis (recorded; -1: no
 * record yet) against the one Kafka reports now (current; <= 0: not
 * known). Keys map to partitions by the count, so a table is only right
 * for the count its marks were written under. */
typedef enum {
    IDEM_PART_COUNT_SAME = 0, /* recorded == current: go on */
    IDEM_PART_COUNT_RECORD,   /* no record: current is recorded, go on */
    IDEM_PART_COUNT_CHANGED,  /* differ: the topic's partitions wait */
    IDEM_PART_COUNT_UNKNOWN,  /* Kafka did not say: wait, ask again */
} idem_part_count_t;

idem_part_count_t idem_parttables_count_verdict(int64_t recorded,
                                                int64_t current);

/* Marks held by all tables. */
size_t idem_parttables_marks(const idem_parttables_t *t);

/* Marks held by the partition's table (0 when not assigned). */
size_t idem_parttables_count(const idem_parttables_t *t, const char *topic,
                             int32_t partition);

#endif
