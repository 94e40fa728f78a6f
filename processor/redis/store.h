/* store: the Redis side of exactly-once: connection, the lease scripts
 * of external effects and the dedup scripts in-Redis handlers register
 * (loaded once, called with EVALSHA, pipelined per batch), positions, and
 * the reads verify needs. A redisReply never leaves this module. */
#ifndef IDEM_STORE_H
#define IDEM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"
#include "input/envelope.h"
#include "obs/metrics.h"
#include "redis/posval.h"

typedef struct idem_store_s idem_store_t;

/* What a script said about one record. */
typedef enum {
    IDEM_MARK_NEW = 0, /* applied (a handler script), claimed, marked */
    IDEM_MARK_DONE,    /* already done: a duplicate; prior_mid filled */
    IDEM_MARK_BUSY,    /* leased by someone else (or earlier in the batch) */
    IDEM_MARK_REJECT,  /* the effect was refused (error in `detail`) */
    IDEM_MARK_LOST,    /* mark: our lease was taken over by another owner */
    IDEM_MARK_AGAIN,   /* claim: same identity as an earlier record of this
                          call; ask again once that one is finished */
} idem_mark_t;

typedef struct {
    idem_mark_t mark;
    char prior_mid[IDEM_ENVELOPE_ID_MAX + 1]; /* message_id of the done mark */
    size_t prior_mid_len;                     /* its bytes (NULs are data) */
    char detail[512];                         /* reject reason, lease holder */
} idem_store_result_t;

/* One partition's position: the next offset to read, everything below it
 * finished, with the Kafka cluster and a record it belongs to (posval.h).
 * Kept in the hash <prefix>pos:<group.id>, field "<topic>:<partition>"
 * (docs/design.md, "Positions in Redis"). */
typedef struct {
    const char *topic; /* borrowed */
    int32_t partition;
    int64_t offset;    /* -1: Redis holds none (positions_load) */
    idem_posval_t val; /* what it belongs to (saved with it, loaded back) */
} idem_store_pos_t;

/* A new store for conf (borrowed; must outlive the store). m may be NULL.
 * Does not connect: the first call connects. Never NULL. */
idem_store_t *idem_store_new(const idem_conf_t *conf, idem_metrics_t *m);
void idem_store_destroy(idem_store_t *s); /* NULL is a no-op */

/* Connects if not connected: idem_redisconn_open (Sentinel discovery, TLS,
 * AUTH, SELECT, ROLE check), then SCRIPT LOAD and INFO. Returns 0, or -1
 * with errstr; every error here is retriable (infrastructure), except an
 * unsafe server, which idem_store_refused then reports. */
int idem_store_connect(idem_store_t *s, char *errstr, size_t errstr_size);

/* Drops the connection (after an error); the next call reconnects. */
void idem_store_disconnect(idem_store_t *s);

/* Makes every connect check the server's maxmemory-policy (`run` does;
 * readers such as verify do not need to). */
void idem_store_guard_eviction(idem_store_t *s);

/* Makes every write wait, on a server (run_id) not written to yet, for an
 * AOF rewrite that began after the server loaded its data (`run` does,
 * unless redis.aof.rewrite=false): Redis 7.0 can keep half a MULTI/EXEC in
 * an AOF cut by a host crash and replay it with the next transaction at the
 * next load (redis/aofgate.h). The store sends BGREWRITEAOF (or waits for
 * one that runs); until it ended ok, writes fail as an outage of class
 * "aofrewrite" and reads go on. */
void idem_store_guard_aof(idem_store_t *s);

/* 1 (and the reason in errstr) once a server was refused because its
 * maxmemory-policy may evict keys and redis.allow.eviction is false: fatal,
 * `run` exits 2. Else 0. */
int idem_store_refused(const idem_store_t *s, char *errstr, size_t errstr_size);

/* Checks the server's maxmemory-policy again when the last check is at
 * least interval_ms old (and the connection is idle). Returns 0, or -1
 * (refused or a failed INFO, as idem_store_connect). */
int idem_store_check(idem_store_t *s, int64_t interval_ms, char *errstr,
                     size_t errstr_size);

/* Successful connects so far: the caller notices a reconnect by a change.
 * Cluster mode: every connection to any node, plus every loss the global
 * path found (a bucket behind its record, or a call refused GPOS). */
uint64_t idem_store_connections(const idem_store_t *s);

/* For readers that never write (verify): accept a replica, so a ledger can
 * be read from one. Call before the first connect. */
void idem_store_allow_replica(idem_store_t *s);

/* The server's run_id seen at the last connect ("" before): a different
 * one means another server, or the same one restarted, which may have lost
 * its last writes. Borrowed. */
const char *idem_store_run_id(const idem_store_t *s);

/* The class label of a Redis error reply ("oom", "readonly", "misconf",
 * "noreplicas", "loading", "busy", "masterdown", "auth", "noscript",
 * "other"): the first word of the reply. Static string. */
const char *idem_store_error_class(const char *redis_error);

/* 1 in cluster mode (redis.cluster.nodes), else 0. */
int idem_store_cluster(const idem_store_t *s);

/* The key of topic/partition's position into buf: the group's hash
 * <prefix>pos:<group.id> on a single Redis; in cluster mode the
 * partition's own hash <prefix>pos{<group.id>:<topic>:<partition>}, under
 * its chunks' hash tag (field "<topic>:<partition>" in both). */
void idem_store_pos_key(const idem_conf_t *conf, const char *topic,
                        int32_t partition, char *buf, size_t size);

/* Cluster mode, handler ledger or script: the global path (records
 * without a key, dead-letter replays, retry-topic copies) keeps an
 * identity's mark, its effect's shard and the bucket's positions under one
 * of IDEM_GBUCKETS hash tags, so one script call per bucket is one slot
 * (docs/design.md, "Redis Cluster mode"). */
#define IDEM_GBUCKETS 64

/* The bucket of an identity: the CRC16 Redis Cluster hashes keys with,
 * taken over the identity's bytes as a plain string (no hash-tag rule),
 * modulo IDEM_GBUCKETS. Stable: marks and shards depend on it. */
int idem_store_gbucket(const char *identity, size_t len);

/* The bucket's hash tag "{<group.id>::<NN>}" (NN two digits, 00-63) into
 * buf. No topic is empty, so it never equals a partition's tag
 * "{<group.id>:<topic>:<partition>}". */
void idem_store_gbucket_tag(const idem_conf_t *conf, int bucket, char *buf,
                            size_t size);

/* The global path's mark key of an identity in cluster mode:
 * "<prefix>dedup{<group.id>::<NN>}:<identity>" into buf, the identity's
 * len bytes as they are (a NUL among them is data: use the returned
 * length, not strlen), NUL-terminated; returns its length (snprintf's: >=
 * size means cut). The global path's calls build their keys with it. */
int idem_store_gmark_key(const idem_conf_t *conf, const char *identity,
                         size_t len, char *buf, size_t size);

/* Cluster mode's touch of the global path's positions (docs/design.md,
 * "Redis Cluster mode", "The touch"): for each partition fin[i] (owned by
 * this member; .offset its finished prefix) and each bucket it used (the
 * buckets this member saw acknowledge its records), writes the prefix as
 * the bucket's `at` of the partition, when idem_gpos_touch_due says so
 * (force: revoke, shutdown; else every IDEM_GPOS_TOUCH_MS while the
 * prefix moves), one script per bucket, pipelined per node. A bucket that
 * no longer holds what it acknowledged refuses (counted as a new
 * connection: the positions are read again and the loss judged). No-op on
 * a single Redis. The store must be free. 0, or -1 (retriable). */
int idem_store_gpos_touch(idem_store_t *s, const idem_store_pos_t *fin,
                          size_t n, int force, char *errstr,
                          size_t errstr_size);

/* Writes pos[n] (borrowed) in one HSET (cluster mode: one per partition).
 * Returns 0, or -1 (retriable). */
int idem_store_positions_save(idem_store_t *s, const idem_store_pos_t *pos,
                              size_t n, char *errstr, size_t errstr_size);

/* Reads the positions of pos[n] (topic and partition set by the caller)
 * into pos[i].offset and .val, offset -1 where Redis holds none (or a value
 * it cannot read, which is logged). 0, or -1 (retriable).
 *
 * Cluster mode: a partition whose global-path records went to a bucket
 * whose node lost some of them since (the bucket's gpos fields behind what
 * the partition's hash recorded, redis/gpos.h) reads as the offset to read
 * again from (the bucket's `at`), and the store first writes that
 * position back to the partition's hash (compare-and-set on the value it
 * read; a change in between fails the load): logged "redis went back in
 * time" with the node. A bucket that holds nothing of the partition while
 * the partition recorded it reads as no position (-1), written back so.
 * Either counts as a new connection (idem_store_connections), so the loop
 * reads the positions again and rewinds. */
int idem_store_positions_load(idem_store_t *s, idem_store_pos_t *pos, size_t n,
                              char *errstr, size_t errstr_size);

/* The descriptor to poll (POLLIN) for the reply of the request in flight
 * (any _send above): readable once its first bytes arrive. Returns -1 when
 * there is nothing to wait for: no request in flight, no connection, or
 * reply bytes already read into the context (call _recv now). Borrowed:
 * valid until the next store call. */
int idem_store_reply_fd(const idem_store_t *s);

/* 1 while a request sent with a _send above waits for its _recv: the
 * connection is taken, no other call may use it. Else 0. */
int idem_store_busy(const idem_store_t *s);

/* External effects (loop/apply.c), step 1: claim each record with a lease
 * "lease:<owner>:<message_id>" for dedup.lease.ms, unless already done
 * (IDEM_MARK_DONE), leased by another owner (IDEM_MARK_BUSY) or claimed
 * by an earlier record of this call (IDEM_MARK_AGAIN). A lease of the same
 * owner is re-claimed. */
int idem_store_claim(idem_store_t *s, const char *owner,
                     const idem_envelope_t *const *env, size_t n,
                     idem_store_result_t *results, char *errstr,
                     size_t errstr_size);

/* External effects, step 3 (after the effect was acknowledged): turns our
 * lease into the done mark. IDEM_MARK_NEW when marked (or the lease had
 * expired unclaimed, or it was already done), IDEM_MARK_LOST when another
 * owner holds the lease now (fenced). */
int idem_store_mark_done(idem_store_t *s, const char *owner,
                         const idem_envelope_t *const *env, size_t n,
                         idem_store_result_t *results, char *errstr,
                         size_t errstr_size);

/* In-Redis effects (handler.h, IDEM_EFFECT_IN_REDIS).
 *
 * A handler registers its dedup script once (before the first connect, in
 * its start op); the store loads it with SCRIPT LOAD at every connect and
 * reloads it after NOSCRIPT. The script is called with EVALSHA, no KEYS,
 * and ARGV = prefix, group.id, dedup.ttl.seconds, then `per_record`
 * arguments for each record of the chunk (what `args` produces), for at
 * most 1000 records per call (chunks pipelined in one request). It returns
 * an array with one string per record:
 *   ""                  applied now: effect and done mark written together
 *   "done:<message_id>" a done mark existed: a duplicate, nothing written
 *   "lease:<owner>..."  an external handler's lease: busy, nothing written
 *   "reject:<reason>"   the record's effect is refused (dead letter)
 * The done mark is the key <prefix>dedup:<group.id>:<identity>, value
 * "done:<message_id>", EX ttl (redis/dedup_global.lua is the model). An error
 * reply is the server's state (OOM, READONLY, ...): an outage.
 *
 * Returns a script number for idem_store_script_send, or -1 with errstr. */
typedef size_t (*idem_store_args_fn)(const void *rec, const char **argv,
                                     size_t *argvlen, void *opaque);
int idem_store_script_register(idem_store_t *s, const char *lua, size_t len,
                               size_t per_record, idem_store_args_fn args,
                               void *opaque, char *errstr, size_t errstr_size);

/* A handler whose script is an effect function only (handlers/ledger.lua
 * is the model: `local function effect(first, js)`, arguments identity and
 * message_id first, then its own, PER in all): the store composes the
 * global dedup script (redis/dedup_global.lua, the contract above) from
 * it, registers it as idem_store_script_register does, and keeps the
 * effect so that the partition layout (redis/partstate.h) can compose its
 * chunk script from the same function. One effect per store. Returns the
 * script number, or -1 with errstr. */
int idem_store_effect_register(idem_store_t *s, const char *effect, size_t len,
                               size_t per_record, idem_store_args_fn args,
                               void *opaque, char *errstr, size_t errstr_size);

/* Where a record of the effect was read (idem_store_effect_where): its
 * topic (borrowed), partition and offset. */
typedef void (*idem_store_where_fn)(const void *rec, const char **topic,
                                    int32_t *partition, int64_t *offset);

/* Cluster mode's global path (records without a key, dead-letter replays,
 * retry copies; docs/design.md, "Redis Cluster mode"): the effect's
 * records are sent per bucket (idem_store_gbucket), each call on its
 * bucket's slot, and each call records, per partition it carries, the
 * offsets it applied in the bucket's <prefix>gpos{<group>::<NN>} hash, so
 * a bucket's node that loses a tail is found when the partition's
 * position is read (idem_store_positions_load). `where` tells the store a
 * record's partition and offset; without one no such record is kept (the
 * lost tail of a bucket's node then goes unseen). Set before the first
 * send. */
void idem_store_effect_where(idem_store_t *s, idem_store_where_fn where);

/* The layout the effect's global framing is told the member runs
 * ("global", the default, or "partition"; static text, borrowed): the
 * script refuses with an error LAYOUT when the group's layout key says
 * otherwise (redis/layout.h). */
void idem_store_effect_layout(idem_store_t *s, const char *layout);

/* The effect registered with idem_store_effect_register (borrowed, NUL-
 * terminated), its arguments per record in *per_record and its args
 * function and opaque in *args and *opaque; NULL when none was. */
const char *idem_store_effect(const idem_store_t *s, size_t *per_record,
                              idem_store_args_fn *args, void **opaque);

/* Sends script `script` for recs[n] (borrowed, e.g. idem_record_t; the
 * registered `args` is called once per record with recs[i], in order, and
 * must point argv[0..per_record) at bytes (argvlen) that stay valid until
 * _send returns): the whole pipelined request is written at once, so the
 * caller can work while Redis runs it; _recv reads its replies into
 * results[n] (n as sent) with the meanings above (IDEM_MARK_NEW, _DONE
 * with prior_mid, _BUSY, _REJECT with detail). One request in flight at a
 * time. pos[npos] (borrowed, may be empty) are positions written after
 * the chunks in the same request; they are stored when _recv returns 0.
 * With redis.wait.replicas, a WAIT ends the request and _recv fails (class
 * "wait") unless enough replicas acknowledged it; the same holds for
 * idem_store_mark_done. Both return 0, or -1 (retriable; after a failed
 * _recv some chunks may have been applied, which their marks reveal when
 * the caller sends them again). */
int idem_store_script_send(idem_store_t *s, int script, const void *const *recs,
                           size_t n, const idem_store_pos_t *pos, size_t npos,
                           char *errstr, size_t errstr_size);
int idem_store_script_recv(idem_store_t *s, size_t n,
                           idem_store_result_t *results, char *errstr,
                           size_t errstr_size);

/* verify: calls cb(currency, user_id, minor, opaque) for every ledger
 * field of every currency hash under the prefix. Returns 0 or -1. */
int idem_store_ledger_scan(idem_store_t *s,
                           void (*cb)(const char *currency, const char *user_id,
                                      int64_t minor, void *opaque),
                           void *opaque, char *errstr, size_t errstr_size);

/* verify: the value of <prefix>ledger:applied (0 when absent). */
int idem_store_applied_get(idem_store_t *s, int64_t *applied, char *errstr,
                           size_t errstr_size);

/* check-config --connect in cluster mode: each(node, slots, err, opaque)
 * once per primary of the slot map (in slot order; node "host:port" and
 * err borrowed for the call), slots the number it serves, err NULL when
 * the node passed what a member's connect checks on a single Redis (the
 * connection with redis.url's user and password and TLS, SCRIPT LOAD, INFO
 * and its maxmemory-policy as idem_store_guard_eviction refuses it) and
 * CLUSTER INFO says cluster_state:ok, else the failure naming the node.
 * *uncovered gets the slots with no primary in the map. Returns the number
 * of primaries that failed, or -1 with errstr when no seed gave the slot
 * map. */
typedef void (*idem_store_node_check_fn)(const char *node, size_t slots,
                                         const char *err, void *opaque);
int idem_store_cluster_check(idem_store_t *s, idem_store_node_check_fn each,
                             void *opaque, size_t *uncovered, char *errstr,
                             size_t errstr_size);

/* state get: user_id's balance in currency's ledger as readers see it, in
 * *minor: the field of <prefix>ledger:<currency> on a single Redis; in
 * cluster mode the sum of that field over every shard
 * <prefix>ledger:<currency>{<partition's tag>} on every primary (each
 * shard lives on exactly one). *shards gets the hashes that held the field
 * (0: none, *minor 0). 0, or -1 with errstr (an outage naming the node). */
int idem_store_ledger_get(idem_store_t *s, const char *currency,
                          const char *user_id, int64_t *minor, size_t *shards,
                          char *errstr, size_t errstr_size);

#endif
