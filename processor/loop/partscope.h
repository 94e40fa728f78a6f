/* partscope: the in-Redis effect under dedup.scope=partition (docs/
 * design.md, "Dedup state layout"): records on a partition's path are
 * looked up in the member's table (parttables.h) and sent as that
 * partition's chunks (redis/partstate.h); the rest (retry topics, replays,
 * keyless records, identities marked moved) go back to the handler's
 * global script. A table is loaded before its partition's first chunk
 * (epoch bump, then the marks), and dropped and loaded again whenever it
 * cannot be trusted. */
#ifndef IDEM_PARTSCOPE_H
#define IDEM_PARTSCOPE_H

#include <stddef.h>

#include "conf/conf.h"
#include "effect/handler.h"
#include "loop/offsets.h"
#include "redis/layout.h"
#include "redis/partstate.h"
#include "redis/store.h"

typedef struct idem_partscope_s idem_partscope_t;

/* What partscope asks of Redis, a seam of our own (as loop/lease.h's): the
 * loop plugs in Redis (loop/partredis.h: partstate, the store and the
 * layout key), the unit tests a fake (tests/unit/fake_partredis.c). Each
 * call means what the real function named beside it says; the fallible ones
 * return 0, or -1 with errstr. A request costs a few calls (connections,
 * honour_global, chunks), never one per record. */
typedef struct {
    int (*hashkey)(void *ctx, uint8_t key[16], char *errstr,
                   size_t errstr_size);   /* idem_partstate_hashkey */
    uint64_t (*connections)(void *ctx);   /* idem_store_connections */
    const char *(*run_id)(void *ctx);     /* idem_store_run_id (logs) */
    int64_t (*window_seconds)(void *ctx); /* ..._window_seconds */
    int (*now)(void *ctx, int64_t *now, char *errstr,
               size_t errstr_size); /* idem_partstate_now */
    int (*partitions)(void *ctx, const char *topic, int64_t current,
                      int64_t *recorded, char *errstr,
                      size_t errstr_size); /* idem_partstate_partitions */
    int (*epoch_bump)(void *ctx, const char *topic, int32_t partition,
                      int64_t *epoch, char *errstr,
                      size_t errstr_size); /* idem_partstate_epoch_bump */
    int (*positions_load)(void *ctx, idem_store_pos_t *pos, size_t n,
                          char *errstr,
                          size_t errstr_size); /* idem_store_positions_load */
    int (*load)(void *ctx, const char *topic, int32_t partition,
                size_t piece_bytes, idem_partstate_marks_fn cb, void *opaque,
                size_t *pieces, char *errstr,
                size_t errstr_size);          /* idem_partstate_load */
    void (*honour_global)(void *ctx, int on); /* ..._honour_global */
    int (*chunks)(void *ctx, const idem_partstate_chunk_t *ch, size_t k,
                  idem_partstate_result_t *const *results, int64_t *windows,
                  int *rcs, char *errstr,
                  size_t errstr_size); /* idem_partstate_chunks */
    int (*layout_read)(void *ctx, idem_layout_t *out, char *errstr,
                       size_t errstr_size); /* idem_layout_store_read */
    int (*layout_switch)(void *ctx, idem_layout_kind_t expect,
                         idem_layout_kind_t to, idem_layout_t *out,
                         char *errstr,
                         size_t errstr_size); /* idem_layout_store_switch */
    void (*effect_layout)(void *ctx, const char *layout); /* idem_store_... */
    void (*destroy)(void *ctx); /* frees ctx at idem_partscope_destroy; NULL:
                                   ctx is borrowed */
    void *ctx;
} idem_partscope_redis_t;

/* For store (borrowed; an effect registered) and conf (borrowed): the Redis
 * seam over them (idem_partredis_open). NULL with errstr. Free with
 * idem_partscope_destroy (NULL is a no-op). */
idem_partscope_t *idem_partscope_new(idem_store_t *store,
                                     const idem_conf_t *conf, char *errstr,
                                     size_t errstr_size);

/* The same over the seam redis (copied; takes ownership of redis->ctx when
 * redis->destroy is set) and conf (borrowed). Never NULL: a layout key not
 * read now is read at the first submit. */
idem_partscope_t *idem_partscope_new_with(const idem_partscope_redis_t *redis,
                                          const idem_conf_t *conf);
void idem_partscope_destroy(idem_partscope_t *ps);

/* Takes recs[n] (part[i] the partition of record i) with the positions
 * due pos[npos]. Records on a partition path are answered in now[]
 * (*nnow; DONE, DUPLICATE, REJECT), or left for the next pass; the rest
 * are moved to recs[0..*nrest) for the handler, with the positions no
 * chunk carried in *rpos[0..*nrpos) (scratch, valid until the next call).
 * A partition whose chunk carried its position gets part->saved set.
 * Returns 0, or -1 with errstr (an outage: a chunk failed, was fenced or
 * found another position, or dedup.memory.max was reached; the tables
 * concerned were reset; nothing is left for the handler). */
int idem_partscope_submit(idem_partscope_t *ps, idem_record_t **recs,
                          idem_part_t *const *part, size_t n,
                          const idem_store_pos_t *pos, size_t npos,
                          idem_result_t *now, size_t *nnow, size_t *nrest,
                          const idem_store_pos_t **rpos, size_t *nrpos,
                          char *errstr, size_t errstr_size);

/* How partscope learns an input topic's partition count now: count(opaque,
 * topic) returns it, 0 when the topic does not exist, -1 when Kafka did not
 * answer (with errstr). Without one, no partition is loaded (each says
 * the count is not known). */
typedef int (*idem_partscope_count_fn)(void *opaque, const char *topic,
                                       char *errstr, size_t errstr_size);
void idem_partscope_counter(idem_partscope_t *ps, idem_partscope_count_fn fn,
                            void *opaque);

/* The group's dedup layout key (redis/layout.h) is read again before the
 * next submit: called after a failed request of the handler (its global
 * script refuses with LAYOUT when the key changed). */
void idem_partscope_layout_recheck(idem_partscope_t *ps);

/* Revoked or lost: the partition's table goes. */
void idem_partscope_drop(idem_partscope_t *ps, const char *topic,
                         int32_t partition);

/* The partition is read again from another place (a rewind, offsets
 * reset): its table is loaded again before its next chunk. */
void idem_partscope_reset(idem_partscope_t *ps, const char *topic,
                          int32_t partition);

/* The layout key's refusals met since start: *chunk, partition chunks
 * refused with LAYOUT (each partition of a refused call); *global, failed
 * handler requests (idem_partscope_layout_recheck) after which the key was
 * found changed: the global script's LAYOUT refusal, which the loop sees only
 * as a failed request. */
void idem_partscope_layout_refusals(const idem_partscope_t *ps, uint64_t *chunk,
                                    uint64_t *global);

/* The partition tables' loads that found the position in Redis behind the
 * one it acknowledged (Redis went back in time; each logged as a warning
 * with both offsets) since the last call: the caller counts them in
 * idemproc_redis_position_behind_total. */
uint64_t idem_partscope_behind_take(idem_partscope_t *ps);

/* Bytes and marks the tables hold. */
size_t idem_partscope_bytes(const idem_partscope_t *ps);
size_t idem_partscope_marks(const idem_partscope_t *ps);

#endif
