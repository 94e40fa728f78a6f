/* storectx: the store's connection for the other modules of redis/ that
 * speak to the same server in their own commands (partstate.c), so that
 * they share its connect, AOF gate and error classes. Not for use outside
 * redis/: a redisReply never leaves the folder. */
#ifndef IDEM_STORECTX_H
#define IDEM_STORECTX_H

#include <hiredis.h>
#include <stddef.h>

#include "redis/store.h"

/* The store's context, connected (idem_store_connect), with no request in
 * flight; with `write` set, past the AOF gate (idem_store_guard_aof).
 * Borrowed: valid until the next store call that fails. NULL with errstr
 * (retriable). */
redisContext *idem_store_ctx(idem_store_t *s, int write, char *errstr,
                             size_t errstr_size);

/* Reports a failure of a command `what` sent on idem_store_ctx's context:
 * detail NULL means the context failed (I/O, timeout), else an error
 * reply's text, counted by its class. Drops the connection. Returns -1. */
int idem_store_ctx_fail(idem_store_t *s, const char *what, const char *detail,
                        char *errstr, size_t errstr_size);

#endif
