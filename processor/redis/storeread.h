/* storeread: the read-only side of the store for `verify`: the dedup
 * marks of a group and the values an effect left in Redis, read where the
 * store writes them (one place knows the layout: this module). */
#ifndef IDEM_STOREREAD_H
#define IDEM_STOREREAD_H

#include <stddef.h>

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

#endif
