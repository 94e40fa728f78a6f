/* offsets: the partitions a member holds and their positions: the
 * contiguous finished prefix (what may be committed), what was committed,
 * what Redis holds. No broker and no Redis here: the loop feeds it and
 * acts on what it says (tests/unit/test_offsets.c). */
#ifndef IDEM_OFFSETS_H
#define IDEM_OFFSETS_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "redis/store.h"

/* One assigned partition. Offsets are -1 when unknown. */
typedef struct {
    char *topic; /* owned */
    int32_t partition;
    int64_t next_offset;   /* everything below is finished */
    int64_t committed;     /* last offset we asked Kafka to commit */
    int64_t high_seen;     /* highest offset taken in hand */
    int64_t saved;         /* position Redis acknowledged */
    int64_t saving;        /* position in the Redis request in flight */
    int checked;           /* Redis's position was read since assignment */
    int lost;              /* Redis holds no position while Kafka holds a
                              member's offset (idem_offreset_redis_lost):
                              kept paused, nothing applied or committed */
    int64_t start;         /* the first position this assignment read from
                              Redis or wrote there (-1): where a member goes
                              back to when Redis lost every later one */
    idem_posval_rec_t fp;  /* the record just below next_offset, or the one
                              the position Redis holds vouches for
                              (posval.h; fp.offset -1: none known) */
    int blocked;           /* scratch of idem_offsets_advance */
    int waiting;           /* scratch of the loop: an earlier record waits */
    int retry_tier;        /* 0: an input topic; k: the k-th retry topic */
    int64_t hold_until_ms; /* a retry partition paused until its records
                              in hand are due (idem_now_ms); 0: not held */
    int key_hold;          /* due.c's word: its records in hand all wait
                              behind busy keys (idem_due_key_holds) */
    int key_held;          /* the loop paused its fetch for that */
} idem_part_t;

/* The partitions held (embedded in the loop: _init/_term). */
typedef struct {
    idem_part_t *v;
    size_t cnt, cap;
    size_t hint; /* where idem_offsets_find found the last one */
} idem_offsets_t;

void idem_offsets_init(idem_offsets_t *o);
void idem_offsets_term(idem_offsets_t *o);

/* The partition, or NULL when not held. Pointers stay valid until the
 * next _add or _remove. */
idem_part_t *idem_offsets_find(idem_offsets_t *o, const char *topic,
                               int32_t partition);

/* Holds a partition (all offsets unknown); returns it (the existing one
 * when already held). */
idem_part_t *idem_offsets_add(idem_offsets_t *o, const char *topic,
                              int32_t partition);

/* Lets a partition go (nothing when not held). */
void idem_offsets_remove(idem_offsets_t *o, const char *topic,
                         int32_t partition);

/* Moving the finished prefixes: call _advance_begin, then _advance_rec for
 * every record in hand in poll order (offsets of a partition ascending).
 * Each partition's next_offset moves over its contiguous run of finished
 * records and stops at the first unfinished one. */
void idem_offsets_advance_begin(idem_offsets_t *o);
void idem_offsets_advance_rec(idem_part_t *pt, int64_t offset, int finished);

/* _advance_rec and _below in one step, for a walk that lets records go
 * as it moves the prefixes (between _advance_begin and the walk's end):
 * returns 1 when the record at `offset` is finished and below its
 * partition's final prefix. A partition's prefix stops moving at its
 * first unfinished record, so the answer for the records after it is
 * final too. */
int idem_offsets_advance_take(idem_part_t *pt, int64_t offset, int finished);

/* Whether a finished record at `offset` is below its partition's prefix:
 * done with it (the loop lets it go). */
int idem_offsets_below(const idem_part_t *pt, int64_t offset);

/* The partitions (of subset, if not NULL) whose position Redis
 * acknowledged moved past what was committed (all of them with
 * `recommit`), with that position as offset; NULL when none. The caller
 * destroys the list. */
rd_kafka_topic_partition_list_t *
idem_offsets_commit_list(const idem_offsets_t *o,
                         const rd_kafka_topic_partition_list_t *subset,
                         int recommit);

/* Fills pos[] (room for o->cnt) with the partitions (of subset, if not
 * NULL) whose finished prefix moved past the position Redis holds, each
 * with the Kafka cluster id (borrowed, NULL: unknown) and the record below
 * it (fp). Returns how many. The topics are borrowed from o. */
size_t idem_offsets_positions_due(const idem_offsets_t *o,
                                  const rd_kafka_topic_partition_list_t *subset,
                                  const char *cluster, idem_store_pos_t *pos);

/* What a member does with a partition when it reads the position Redis
 * holds for it (after a reconnect, or at the first look since the
 * assignment). */
typedef struct {
    int behind;     /* Redis lost writes: say so (redis_behind) */
    int64_t rewind; /* seek back here and read again; -1: no rewind */
    int forget;     /* the position is gone: forget what Redis
                       acknowledged (the next request writes one first) */
} idem_offsets_rewind_t;

/* Judges pt against `redis`, the position Redis holds (-1: none, or not
 * usable here), `hold` the lowest offset the member holds in hand or
 * finished up to (-1: nothing consumed since the assignment),
 * `reconnected` a new connection since the last look, `other_server` one
 * to another server (another run_id). Before pt->checked, Redis's
 * position wins over what the member holds; after it, the member goes
 * back only when Redis holds less than it acknowledged (or another server
 * answers). Pure: the caller acts and then sets checked, start. */
idem_offsets_rewind_t idem_offsets_rewind_decide(const idem_part_t *pt,
                                                 int64_t redis, int64_t hold,
                                                 int reconnected,
                                                 int other_server);

#endif
