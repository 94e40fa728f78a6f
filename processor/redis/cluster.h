/* cluster: a Redis Cluster client on blocking hiredis 0.14 (which has no
 * cluster support): the slot map, one connection per primary, and the
 * cluster's redirections (MOVED, ASK, TRYAGAIN) followed; outages
 * (CLUSTERDOWN, a node that cannot be reached) come back with a class and
 * the node they concern. */
#ifndef IDEM_CLUSTER_H
#define IDEM_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis.h>

#include "conf/conf.h"

#define IDEM_CLUSTER_SLOTS 16384

/* The slot of a key: CRC16 (XMODEM) of the key, or of its hash tag (what
 * is between the first '{' and the first '}' after it, when that is not
 * empty), modulo 16384: the Redis Cluster specification's HASH_SLOT. */
int idem_cluster_keyslot(const char *key, size_t len);

/* CRC16 (XMODEM) of len bytes, no hash-tag rule (the slot's hash). */
unsigned idem_cluster_crc16(const char *buf, size_t len);

/* What kind of failure a call met, as data. Every class is an outage
 * (retriable): the caller backs off and calls again; the client has
 * already marked what it must read again (the slot map, a connection). */
typedef enum {
    IDEM_CLUSTER_ERR_NONE = 0,
    IDEM_CLUSTER_ERR_CONNECTION,  /* a node refused, reset, closed, or its
                                     connect failed (TLS, AUTH: see code) */
    IDEM_CLUSTER_ERR_TIMEOUT,     /* a node did not answer in
                                     redis.timeout.ms */
    IDEM_CLUSTER_ERR_CLUSTERDOWN, /* CLUSTERDOWN: the cluster refuses
                                     commands (a slot has no primary) */
    IDEM_CLUSTER_ERR_REDIRECTS,   /* still redirected (MOVED, ASK) or told
                                     TRYAGAIN after every attempt */
    IDEM_CLUSTER_ERR_SLOTS,       /* no slot map could be read, or it has
                                     no primary for the slot */
    IDEM_CLUSTER_ERR_REFUSED,     /* the caller's check of a new connection
                                     (idem_cluster_set_check) said no */
} idem_cluster_errclass_t;

typedef struct {
    idem_cluster_errclass_t cls;
    char node[300]; /* "host:port" the failure concerns; "" when none */
    char code[32];  /* an error reply's first word (CLUSTERDOWN, WRONGPASS,
                       NOAUTH), "" when there was no reply */
    char str[512];  /* one line naming the node, never a password */
} idem_cluster_err_t;

const char *idem_cluster_errclass2str(idem_cluster_errclass_t cls);

/* Counters per node, since the client was made; a caller exports them
 * (metrics per node). */
typedef struct {
    uint64_t requests;    /* commands sent to the node */
    uint64_t moved;       /* MOVED replies from it */
    uint64_t ask;         /* ASK replies from it */
    uint64_t tryagain;    /* TRYAGAIN replies from it */
    uint64_t clusterdown; /* CLUSTERDOWN replies from it */
    uint64_t conn_errors; /* connects that failed, connections lost */
    uint64_t timeouts;    /* connects or replies that timed out */
} idem_cluster_node_stats_t;

/* A client is used by one thread at a time (blocking calls, as the
 * store's connection is). */
typedef struct idem_cluster_s idem_cluster_t;

/* Reads the slot map from the first of `seeds` ("host:port,host:port",
 * comma or space separated) that answers CLUSTER SLOTS; a seed that is
 * down is skipped. Connections are opened through redisconn with conf's
 * redis.* keys (TLS, user, password, redis.timeout.ms), each primary's
 * when a command first goes to it. conf is borrowed and must outlive the
 * client. Returns the client (caller frees with idem_cluster_destroy) or
 * NULL with *err (IDEM_CLUSTER_ERR_SLOTS with the last seed's failure in
 * the text, or a seed list that does not parse). */
idem_cluster_t *idem_cluster_new(const idem_conf_t *conf, const char *seeds,
                                 idem_cluster_err_t *err);

/* A check of every new connection to a primary, run before any command
 * goes on it (a member's per-node safety: the eviction guard, the AOF
 * rewrite before the first write to a restarted node). addr is the
 * node's "host:port", c its connection (both borrowed for the call; the
 * check may send commands on c and must read their replies). Returns 0
 * to use the connection; else -1 with why: the connection is closed and
 * the commands meant for the node fail with IDEM_CLUSTER_ERR_REFUSED and
 * why as their text (asked again at the next connect). */
typedef int (*idem_cluster_check_fn)(void *opaque, const char *addr,
                                     redisContext *c, char *why,
                                     size_t why_size);

/* Sets the check (NULL: none, the default). opaque is passed to it. */
void idem_cluster_set_check(idem_cluster_t *cl, idem_cluster_check_fn fn,
                            void *opaque);

/* Closes every connection and frees the client. NULL is a no-op. */
void idem_cluster_destroy(idem_cluster_t *cl);

/* Sends one command (argv with lengths; argvlen NULL = strlen) to the
 * primary of the slot of `key` (key_len bytes) and returns its reply
 * (caller frees with freeReplyObject): the command's own answer, error
 * replies included (WRONGTYPE, a script's error), after following MOVED,
 * ASK and TRYAGAIN; a MOVED or ASK for another slot than key's (the
 * command's key is elsewhere: a caller's error) is returned as its reply. NULL
 * with *err on an outage; a command whose reply was lost may have been applied,
 * so resend only what is idempotent. */
redisReply *idem_cluster_command(idem_cluster_t *cl, const char *key,
                                 size_t key_len, int argc, const char **argv,
                                 const size_t *argvlen,
                                 idem_cluster_err_t *err);

/* One command of a pipeline. */
typedef struct {
    int argc;
    const char **argv;
    const size_t *argvlen; /* NULL = strlen of each */
    const char *formatted; /* when set: the command in RESP (formatted_len
                              bytes), argv unused; borrowed for the call */
    size_t formatted_len;
    int ask_waits; /* ASK is waited out like TRYAGAIN (resent to the same
                      node after a backoff) instead of followed: for a
                      script whose undeclared keys may still be on the
                      migrating node (docs/design.md, "Redis Cluster
                      mode") */
} idem_cluster_cmd_t;

/* Sends the n commands, whose keys must all be in the slot of `key`, as
 * one pipeline to that slot's primary, and fills replies[i] (caller frees
 * each with freeReplyObject). A command whose replies[i] is already
 * non-NULL on entry is not sent: after an outage, calling again with the
 * same replies[] resends exactly the commands that have no reply. A
 * command redirected by MOVED or ASK, or told TRYAGAIN, was not run and
 * is resent alone where it was sent; a lost connection reads the slot map
 * again and resends what has no reply to the slot's (new) primary. Returns
 * 0 when every command has a reply (error replies included), -1 with *err
 * on an outage, the replies received so far kept in replies[]. */
int idem_cluster_pipeline(idem_cluster_t *cl, const char *key, size_t key_len,
                          const idem_cluster_cmd_t *cmds, size_t n,
                          redisReply **replies, idem_cluster_err_t *err);

/* Sends n commands, command i to the primary of slots[i] (its keys must
 * all be in that slot): the commands of one node as one pipeline, every
 * node's pipeline written before any reply is read, so a call costs one
 * round trip per node, not per command. replies[] as
 * idem_cluster_pipeline's (a non-NULL entry is not sent). Each command's
 * redirections are its own: one moved (MOVED, ASK) or told TRYAGAIN is
 * resent alone, in the next round, to its new node (with ASKING after
 * ASK, or to the same node after a backoff when ask_waits); a connection
 * lost costs the commands that had no reply from that node one resend
 * (the map read again), the other nodes' commands nothing. errs[i] (n of
 * them, filled) says why command i has no reply: CLUSTERDOWN, a node
 * that stays down, the map unreadable, redirected after every round
 * (cls IDEM_CLUSTER_ERR_NONE for a command with its reply). A command
 * without a reply may have been applied. Returns 0 when every command
 * has a reply (error replies included), else -1 with *first the first
 * such errs[i]. */
int idem_cluster_pipeline_slots(idem_cluster_t *cl,
                                const idem_cluster_cmd_t *cmds,
                                const int *slots, size_t n,
                                redisReply **replies, idem_cluster_err_t *errs,
                                idem_cluster_err_t *first);

/* The connection of the slot's primary (opened when needed, the map read
 * first when it is stale), for callers that speak hiredis themselves:
 * MOVED, ASK and the rest then come back to them as error replies, and
 * they call idem_cluster_failed. Borrowed: valid until the next call on
 * cl. NULL with *err (an outage). */
redisContext *idem_cluster_context(idem_cluster_t *cl, int slot,
                                   idem_cluster_err_t *err);

/* The k-th primary of the map (in slot order, each once) and its
 * connection, for commands every primary must answer (SCAN, INFO).
 * *addr (may be NULL) gets its "host:port" (borrowed). NULL with
 * err->cls IDEM_CLUSTER_ERR_NONE past the last primary, else an outage. */
redisContext *idem_cluster_primary_context(idem_cluster_t *cl, size_t k,
                                           const char **addr,
                                           idem_cluster_err_t *err);

/* Reports what a caller of idem_cluster_context met on the slot's
 * connection: reply is the error reply's text (MOVED, ASK, CLUSTERDOWN,
 * TRYAGAIN: the map is read again before the next command) or NULL when
 * the connection itself failed (it is closed and counted). */
void idem_cluster_failed(idem_cluster_t *cl, int slot, const char *reply);

/* Connections to primaries opened so far (a new one may be a promoted
 * replica or a restarted node: a caller re-reads its positions). */
uint64_t idem_cluster_connects(const idem_cluster_t *cl);

/* Reads the slot map again now (from the primaries known, then the
 * seeds). 0, or -1 with *err (the old map is kept). */
int idem_cluster_refresh(idem_cluster_t *cl, idem_cluster_err_t *err);

/* "host:port" of the slot's primary in the map as last read (borrowed,
 * valid until the next call on cl), NULL when none. */
const char *idem_cluster_slot_node(const idem_cluster_t *cl, int slot);

/* The nodes the client knows (seeds, primaries of the map, nodes named by
 * a redirection), in the order it met them; none is ever forgotten, so an
 * index stays valid for the client's life. */
size_t idem_cluster_node_count(const idem_cluster_t *cl);

/* Node i's "host:port" (borrowed) and counters; NULL for i out of range. */
const char *idem_cluster_node_stats(const idem_cluster_t *cl, size_t i,
                                    idem_cluster_node_stats_t *out);

/* How often the whole slot map was read (the first read included). */
uint64_t idem_cluster_refreshes(const idem_cluster_t *cl);

#endif
