/* storeread: the read-only side of the store for `verify`: the dedup
 * marks of a group and the values an effect left in Redis, read where the
 * store writes them (one place knows the layout: this module). */
#ifndef IDEM_STOREREAD_H
#define IDEM_STOREREAD_H

#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"

typedef struct idem_storeread_s idem_storeread_t;

/* A reader for conf (borrowed; must outlive it). Does not connect: the
 * first call does, through idem_redisconn_open with a replica accepted.
 * Never NULL; free with idem_storeread_destroy (NULL is a no-op). */
idem_storeread_t *idem_storeread_new(const idem_conf_t *conf);
void idem_storeread_destroy(idem_storeread_t *r);

/* One dedup mark: the identity's bytes (a NUL is data), whether it is
 * done (else a lease of an effect in flight) and, for a done mark, the
 * message id of the record that applied it. All borrowed for the call. */
typedef struct {
    const char *identity;
    size_t identity_len;
    int done;
    const char *message_id;
    size_t message_id_len;
} idem_storeread_mark_t;

/* Calls cb for every dedup mark of group `group` (SCAN, then the marks'
 * values in batches; a mark that expires meanwhile is skipped). Returns 0,
 * or -1 with errstr (Redis unreachable, an unexpected reply); cb may have
 * been called for some marks before a failure. */
int idem_storeread_marks(idem_storeread_t *r, const char *group,
                         void (*cb)(const idem_storeread_mark_t *mark,
                                    void *opaque),
                         void *opaque, char *errstr, size_t errstr_size);

/* The value of string key `key` (field NULL) or of field `field` of hash
 * `key`, as Redis holds it: *out a new NUL-terminated copy the caller
 * frees (NULL when there is no such key or field), *out_len its bytes.
 * Keys are the user's own (a script effect's), not under redis.prefix.
 * Returns 0, or -1 with errstr (also for a key of another type: the
 * server's WRONGTYPE text). */
int idem_storeread_value(idem_storeread_t *r, const char *key,
                         const char *field, char **out, size_t *out_len,
                         char *errstr, size_t errstr_size);

/* The partition layout (dedup.scope=partition, and cluster mode): the
 * marks a group's chunks appended to their window keys
 * <prefix>st{<group>:<topic>:<partition>}:w<window>[.<part>]
 * (redis/partchunk.lua), one call per key with every mark it holds. A
 * mark is IDEM_STOREREAD_MARK bytes: 12 B keyed hash of the identity
 * (under the group's hash key, idem_storeread_hashkey; base/siphash.h),
 * then 4 B, whose top bit (byte 12, 0x80) says "moved": no effect was
 * applied with it (a refused record, or one whose mark only moved). */
#define IDEM_STOREREAD_MARK 16

typedef struct {
    const char *topic; /* not NUL-terminated: topic_len bytes */
    size_t topic_len;
    int32_t partition;
    const uint8_t *marks; /* n marks */
    size_t n;
} idem_storeread_partmarks_t;

/* Calls cb (all borrowed for the call) for every window key of group
 * `group` on the one Redis, or on every primary in cluster mode. Returns
 * 0, or -1 with errstr (Redis unreachable, a window key whose value is no
 * whole number of marks). */
int idem_storeread_partition_marks(
    idem_storeread_t *r, const char *group,
    void (*cb)(const idem_storeread_partmarks_t *pm, void *opaque),
    void *opaque, char *errstr, size_t errstr_size);

/* The group's hash key of the partition marks, <prefix>dedupkey:<group>,
 * into key[16], *found 1; *found 0 when there is none (no member ran the
 * partition layout). 0, or -1 with errstr. */
int idem_storeread_hashkey(idem_storeread_t *r, const char *group,
                           uint8_t key[16], int *found, char *errstr,
                           size_t errstr_size);

/* Cluster mode's read model of a script effect's key: the script handler
 * appends the partition's tag to every idem.* key, so `key` is held as
 * shards <key>{<group>:<topic>:<partition>}, one per partition that
 * wrote it, each on one primary. Calls cb(shard, shard_len, value,
 * value_len, opaque) (borrowed for the call) for every shard on every
 * primary that holds the value (field NULL: a string shard's value; else
 * that field of a hash shard). Returns 0, or -1 with errstr (Redis
 * unreachable; a shard of another type: the server's WRONGTYPE text). */
int idem_storeread_shards(idem_storeread_t *r, const char *key,
                          const char *field, const char *group,
                          void (*cb)(const char *shard, size_t shard_len,
                                     const char *value, size_t value_len,
                                     void *opaque),
                          void *opaque, char *errstr, size_t errstr_size);

#endif
