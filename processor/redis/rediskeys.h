/* rediskeys: what the redis folder's configuration keys hold, for their
 * readers (the keys themselves are declared in rediskeys.c). */
#ifndef IDEM_REDISKEYS_H
#define IDEM_REDISKEYS_H

/* dedup.scope (idem_conf_t.dedup_scope): where dedup marks live. */
typedef enum {
    IDEM_DEDUP_SCOPE_GLOBAL = 0, /* a mark key per identity (store.h) */
    IDEM_DEDUP_SCOPE_PARTITION,  /* per partition, held by its owner
                                    (partstate.h) */
} idem_dedup_scope_t;

#endif
