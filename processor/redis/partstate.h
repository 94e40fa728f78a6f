/* partstate: the partition layout of the dedup state in Redis
 * (dedup.scope=partition; docs/design.md, "Dedup state layout"): per
 * partition an owner epoch, one key per time window to which the
 * owner's scripts append 16-byte marks, and the chunk script that checks
 * epoch and position, runs the handler's effect and writes marks and
 * position in one call. The member holds the marks (loop/marktab.h); this
 * module only writes and reads them back. It speaks on the store's connection.
 */
#ifndef IDEM_PARTSTATE_H
#define IDEM_PARTSTATE_H

#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"
#include "redis/redisconn.h"
#include "redis/store.h"

#define IDEM_PARTSTATE_MARK  16    /* bytes of one mark */
#define IDEM_PARTSTATE_MOVED 0x80u /* in byte 12 of a mark: "moved" */

typedef struct idem_partstate_s idem_partstate_t;

/* The partition layout of store (borrowed; must outlive it) for conf
 * (borrowed). The store must have an effect registered
 * (idem_store_effect_register): the chunk script is composed from it.
 * NULL with errstr when none is. Free with idem_partstate_destroy (NULL is
 * a no-op). */
idem_partstate_t *idem_partstate_new(idem_store_t *store,
                                     const idem_conf_t *conf, char *errstr,
                                     size_t errstr_size);
void idem_partstate_destroy(idem_partstate_t *p);

/* The group's key of the keyed hash of identities: SET NX of 16 random
 * bytes at <prefix>dedupkey:<group>, then read back (whoever set it first
 * wins, every member reads the same). Once read, the same key is written
 * back instead of new bytes (a Redis or a cluster node that lost it may
 * still hold marks made with it elsewhere); in cluster mode another key
 * found then is an outage. 0, or -1 with errstr (retriable). */
int idem_partstate_hashkey(idem_partstate_t *p, uint8_t key[16], char *errstr,
                           size_t errstr_size);

/* The window length in seconds: dedup.ttl.seconds / 8, at least 1. A
 * chunk of window w expires at (w + 1) * length + TTL (Redis's clock). */
int64_t idem_partstate_window_seconds(const idem_partstate_t *p);

/* The first second at which window w's marks are gone. */
int64_t idem_partstate_window_end(const idem_partstate_t *p, int64_t w);

/* Redis's clock (TIME), seconds. 0, or -1 with errstr. */
int idem_partstate_now(idem_partstate_t *p, int64_t *now, char *errstr,
                       size_t errstr_size);

/* A new owner of topic/partition: INCR of its epoch, before it loads
 * anything, so a previous owner's chunk scripts are refused from now on.
 * The new epoch in *epoch. 0, or -1 with errstr (retriable). */
int idem_partstate_epoch_bump(idem_partstate_t *p, const char *topic,
                              int32_t partition, int64_t *epoch, char *errstr,
                              size_t errstr_size);

/* The input topic's partition count recorded at
 * <prefix>st{<group>:<topic>}:partitions: SET NX of current (> 0), then
 * read back into *recorded (the first member to use the topic records
 * it; a different value is a count that changed since). 0, or -1 with
 * errstr (retriable). */
int idem_partstate_partitions(idem_partstate_t *p, const char *topic,
                              int64_t current, int64_t *recorded, char *errstr,
                              size_t errstr_size);

/* Called by idem_partstate_load with marks[n] (n * 16 bytes, borrowed for
 * the call) of window `window`. Returns 0 to go on, else the load stops
 * and returns -1 (errstr "stopped by the caller"). */
typedef int (*idem_partstate_marks_fn)(const uint8_t *marks, size_t n,
                                       int64_t window, void *opaque);

/* Reads every live mark of topic/partition back: Redis's TIME, then the
 * key of each window that can still live (oldest first; each followed by
 * its part keys <key>.1, .2, ... until one is missing: a window key holds
 * at most dedup.window.key.max bytes) with GETRANGE in
 * pieces of at most piece_bytes (rounded down to whole marks; 0: 1 MiB),
 * so one big window never blocks Redis for long. An absent or expired key
 * reads as empty. *pieces (may be NULL) counts the GETRANGEs that returned
 * marks. 0, or -1 with errstr. */
int idem_partstate_load(idem_partstate_t *p, const char *topic,
                        int32_t partition, size_t piece_bytes,
                        idem_partstate_marks_fn cb, void *opaque,
                        size_t *pieces, char *errstr, size_t errstr_size);

/* What the chunk script said of one record. */
typedef enum {
    IDEM_PARTSTATE_APPLIED = 0, /* effect and mark written */
    IDEM_PARTSTATE_MOVED_MARK,  /* a "moved" mark sent: written, no effect */
    IDEM_PARTSTATE_REJECTED,    /* effect refused (detail); a moved mark */
    IDEM_PARTSTATE_GLOBAL_DONE, /* applied under the global layout (its
                                   mark in detail): not applied, marked */
} idem_partstate_outcome_t;

typedef struct {
    idem_partstate_outcome_t outcome;
    char detail[256]; /* the refusal */
} idem_partstate_result_t;

/* One chunk of one partition. */
typedef struct {
    const char *topic; /* borrowed */
    int32_t partition;
    int64_t epoch;                  /* idem_partstate_epoch_bump's */
    int64_t expect_offset;          /* the offset Redis's position holds */
    const idem_store_pos_t *newpos; /* written at the end; NULL: none */
    const void *const *recs;        /* the store effect's records */
    const uint8_t (*marks)[IDEM_PARTSTATE_MARK]; /* n, one per record */
    size_t n;
} idem_partstate_chunk_t;

/* The chunk script's answers besides success. */
#define IDEM_PARTSTATE_FENCED   1 /* another owner's epoch */
#define IDEM_PARTSTATE_POSITION 2 /* Redis's position is not expect_offset */
#define IDEM_PARTSTATE_LAYOUT                                                  \
    3 /* the layout key does not say partition,                                \
         or a switch from global is honoured                                   \
         and the chunk had no identities */
#define IDEM_PARTSTATE_OUTAGE                                                  \
    4 /* cluster mode: this chunk's call met an                                \
         outage or an error reply while other                                  \
         chunks of the call were answered; it                                  \
         may have been applied (errstr says why) */

/* With on set, chunks carry each record's identity (the handler's first
 * argument) before the effect's own (not sent otherwise), so that for one TTL
 * after a switch from the global layout the chunk script finds the records that
 * layout applied (IDEM_PARTSTATE_GLOBAL_DONE; redis/layout.h). */
void idem_partstate_honour_global(idem_partstate_t *p, int on);

/* Runs one chunk: results[ch->n] and the chunk's window in *window. Returns
 * 0; IDEM_PARTSTATE_FENCED or IDEM_PARTSTATE_POSITION (nothing written,
 * errstr says what Redis holds; the connection is kept); or -1 (an outage:
 * a server error, nothing written, or a failed connection, after which the
 * chunk may or may not have been applied: the caller drops its table,
 * reloads it and sends again what the table does not hold). */
int idem_partstate_chunk(idem_partstate_t *p, const idem_partstate_chunk_t *ch,
                         idem_partstate_result_t *results, int64_t *window,
                         char *errstr, size_t errstr_size);

/* Chunks ch[k] (of different partitions, or one partition's in order) as
 * one script call (pipelined calls of at most 4,096 records each). The
 * positions are checked before any write: every chunk of one partition
 * expects the position Redis holds before the call, and only its last
 * carries newpos (a chunk expecting an earlier chunk's newpos is refused
 * IDEM_PARTSTATE_POSITION). A refused chunk writes nothing and the
 * others apply. results[i] and
 * windows[i] for chunk i, rcs[i] 0, IDEM_PARTSTATE_FENCED or
 * IDEM_PARTSTATE_POSITION (errstr names the last such). On Redis Cluster
 * each chunk is its own call to its partition's primary, the calls
 * pipelined per node, and a chunk whose call failed is
 * IDEM_PARTSTATE_OUTAGE alone (its partition's table is reset, the
 * others' answers stand). Returns 0 when every reply came, or -1 (an
 * outage, or scripts flushed: some chunks may have been applied; the caller
 * resets their partitions' tables, reloads them and sends again what they do
 * not hold). */
int idem_partstate_chunks(idem_partstate_t *p, const idem_partstate_chunk_t *ch,
                          size_t k, idem_partstate_result_t *const *results,
                          int64_t *windows, int *rcs, char *errstr,
                          size_t errstr_size);

/* check-config --connect in Redis Cluster mode (cmd/clustercheck.c), on
 * one primary's connection rc (borrowed; its address names the node):
 * SCRIPT LOAD of the chunk script (the handler's effect in it), then
 * whether rc's ACL user may run every command the partition layout sends
 * there, each with the key it goes with (partition 0 of `topic`): the
 * chunk script's, its loader's, the positions' and the layout key's, the
 * cluster client's, WAIT with redis.wait.replicas, and the commands the
 * effect calls literally (redis.call('X'), without a key). Asked of the
 * node's own ACL (redis.acl_check_cmd in a script run by SCRIPT LOAD and
 * EVALSHA): nothing is written. 0, or -1 with errstr naming the node and
 * each right it lacks ("redis cluster: 127.0.0.1:7001: the ACL user
 * (redis.username) lacks +strlen (...)"), or the failed command. */
int idem_partstate_node_check(idem_partstate_t *p, idem_redisconn_t *rc,
                              const char *topic, char *errstr,
                              size_t errstr_size);

#endif
