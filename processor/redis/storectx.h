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

/* idem_store_ctx for a command on `key` (len bytes): in cluster mode the
 * connection of the primary of key's slot (MOVED, ASK, CLUSTERDOWN then
 * come back as error replies: report them with idem_store_ctx_fail, the
 * map is read again before the next command); key NULL: the home node
 * (the layout key's slot). In cluster mode the AOF gate and the eviction
 * guard ran on each primary's connection when it was opened
 * (docs/design.md, "Redis Cluster mode", "Per node"). Borrowed as
 * idem_store_ctx's. */
redisContext *idem_store_ctx_key(idem_store_t *s, int write, const char *key,
                                 size_t len, char *errstr, size_t errstr_size);

/* Sends one command already in RESP (cmd, cmd_len bytes; borrowed) whose
 * keys are in key's slot and reads its reply (*reply, caller frees): on
 * a single Redis on the store's connection; in cluster mode to the slot's
 * primary, MOVED and TRYAGAIN followed, ASK followed or, with ask_waits,
 * waited out (a script whose undeclared keys may still be on the
 * migrating node). 0 (error replies included), or -1 with errstr (an
 * outage; the command may have run). */
int idem_store_ctx_call(idem_store_t *s, const char *key, size_t len,
                        const char *cmd, size_t cmd_len, int ask_waits,
                        redisReply **reply, char *errstr, size_t errstr_size);

/* idem_store_ctx_call for n commands at once: command i (cmds[i],
 * cmd_lens[i] bytes of RESP; borrowed) on the slot of keys[i] (lens[i]
 * bytes). On a single Redis all of them pipelined on the store's
 * connection; in cluster mode each to its slot's primary, the commands
 * of one node as one pipeline and every node's pipeline written before
 * any reply is read (idem_cluster_pipeline_slots: one round trip per
 * node; redirections followed per command, ASK waited out with
 * ask_waits). replies[i] (caller frees each) stays NULL for a command
 * that met an outage: it may have run. Returns 0 when every command has
 * a reply (error replies included); else -1 with errstr naming the
 * first outage (counted by its class), the other replies kept. */
int idem_store_ctx_calls(idem_store_t *s, const char *const *keys,
                         const size_t *lens, const char *const *cmds,
                         const size_t *cmd_lens, size_t n, int ask_waits,
                         redisReply **replies, char *errstr,
                         size_t errstr_size);

/* Cluster mode: "host:port" of the primary key's slot (len bytes) maps
 * to now (borrowed, valid until the next store call); NULL when the map
 * names none, or on a single Redis. */
const char *idem_store_key_node(idem_store_t *s, const char *key, size_t len);

/* Reports a failure of a command `what` sent on idem_store_ctx's context:
 * detail NULL means the context failed (I/O, timeout), else an error
 * reply's text, counted by its class. Drops the connection. Returns -1. */
int idem_store_ctx_fail(idem_store_t *s, const char *what, const char *detail,
                        char *errstr, size_t errstr_size);

/* With redis.wait.replicas=N, after writes sent through the functions
 * above: WAIT N redis.wait.timeout.ms on the connection that carried them
 * (in cluster mode the primary of key's slot, len bytes; key NULL on a
 * single Redis), that node counted on its own. 0 when N replicas
 * acknowledged (or N is 0); else -1 with errstr naming the node (class
 * "wait" when short, or when that connection was replaced since the
 * writes: a new connection's WAIT covers none of them). Retriable: the
 * writes may or may not be on the replicas. */
int idem_store_ctx_wait(idem_store_t *s, const char *key, size_t len,
                        char *errstr, size_t errstr_size);

#endif
