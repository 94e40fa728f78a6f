/* harness_cluster: a real Redis Cluster for integration tests: redis-server
 * nodes with --cluster-enabled on free 127.0.0.1 ports (each in its own
 * temp dir, started as th_redis_start starts one), joined by redis-cli
 * --cluster create; slot migration step by step (CLUSTER SETSLOT and
 * MIGRATE), kill -9 of a node and the wait for its replica's promotion. */
#ifndef IDEM_HARNESS_CLUSTER_H
#define IDEM_HARNESS_CLUSTER_H

#include "harness.h"

#define TH_CLUSTER_MAX 6

typedef struct {
    th_redis_t node[TH_CLUSTER_MAX]; /* node[i].pid is 0 while killed */
    int n;
    char seeds[TH_CLUSTER_MAX * 24]; /* "127.0.0.1:p1,127.0.0.1:p2,..." */
    char password[64]; /* requirepass of every node; "" for none */
    /* th_cluster_start_tls: each node's TLS port (0 without TLS), the
     * ports as "127.0.0.1:t1,..." and the CA that signed the nodes'
     * certificate (for 127.0.0.1), in a dir removed by th_cluster_stop. */
    int tls_port[TH_CLUSTER_MAX];
    char tls_seeds[TH_CLUSTER_MAX * 24];
    char *tls_dir;
    char tls_ca[512];
    char tls_args[TH_CLUSTER_MAX][5][512]; /* the nodes' TLS arguments */
    const char *extra[TH_CLUSTER_MAX][24];
} th_cluster_t;

/* Starts primaries * (1 + replicas) nodes (at most TH_CLUSTER_MAX) with a
 * 1 s cluster-node-timeout, creates the cluster with redis-cli --cluster
 * create --cluster-replicas <replicas> and waits for th_cluster_wait_ok.
 * 0 when the cluster is up; on failure everything started is stopped. */
int th_cluster_start(th_cluster_t *c, int primaries, int replicas);

/* th_cluster_start with requirepass (and masterauth) `password` on every
 * node, set before the cluster is created; th_cluster_cmd then sends
 * AUTH first. A node of such a cluster cannot be restarted (its PING
 * check knows no password). */
int th_cluster_start_auth(th_cluster_t *c, int primaries, int replicas,
                          const char *password);

/* th_cluster_start with TLS: a test CA and a server certificate for
 * 127.0.0.1 made with openssl; every node listens on a tls-port besides
 * its plain port (kept for the tests' own commands and redis-cli), with
 * tls-cluster yes (the cluster bus over TLS) and tls-replication yes;
 * client certificates are not required. */
int th_cluster_start_tls(th_cluster_t *c, int primaries, int replicas);

/* th_cluster_start with more redis-server arguments on every node
 * (NULL-ended, at most 14: e.g. "--appendonly", "yes"), kept for
 * th_cluster_restart. */
int th_cluster_start_args(th_cluster_t *c, int primaries, int replicas,
                          const char *const more[]);

/* Kills every node (SIGKILL) and removes their dirs. Safe to call twice
 * and on a zeroed struct. */
void th_cluster_stop(th_cluster_t *c);

/* Waits until every live node says cluster_state:ok and all of them agree
 * on every slot's primary. 0, or -1 after timeout_ms. */
int th_cluster_wait_ok(th_cluster_t *c, int timeout_ms);

/* The index of the node that every live node names as the primary of
 * slot; -1 when they disagree or none serves it. */
int th_cluster_owner(th_cluster_t *c, int slot);

/* The index of a live replica of node `primary`; -1 when none. On a TLS
 * cluster a replica names its primary's TLS port, which counts too. */
int th_cluster_replica_of(th_cluster_t *c, int primary);

/* Node i's cluster_state as "ok" or "fail" ("" when it did not answer). */
const char *th_cluster_state(th_cluster_t *c, int i);

/* kill -9 of node i (its dir and nodes.conf are kept for a restart). */
void th_cluster_kill(th_cluster_t *c, int i);

/* Starts a killed node again on its port and dir: it rejoins the cluster
 * from its nodes.conf. 0 when it answers PING. */
int th_cluster_restart(th_cluster_t *c, int i);

/* Step by step migration of slot from node `from` to node `to`, as
 * redis-cli --cluster reshard does it, each step at the test's chosen
 * moment: _begin marks the slot IMPORTING on `to` and MIGRATING on
 * `from`; _keys MIGRATEs up to max of the slot's keys still on `from`
 * and returns how many it moved (-1 on an error); _end assigns the slot
 * to `to` on every live primary. 0 or -1 (the first two, _end). */
int th_cluster_migrate_begin(th_cluster_t *c, int slot, int from, int to);
int th_cluster_migrate_keys(th_cluster_t *c, int slot, int from, int to,
                            int max);
int th_cluster_migrate_end(th_cluster_t *c, int slot, int from, int to);

/* redis-cli --cluster reshard of nslots slots from primary `from` to
 * primary `to` (by their node ids, --cluster-yes): the tool moves the
 * lowest-numbered slots `from` owns, key by key with MIGRATE. 0 when the
 * tool exited 0 (its output printed otherwise). */
int th_cluster_reshard(th_cluster_t *c, int from, int to, int nslots);

/* How many of the slots node i owns (as every live node agrees) are
 * lower than or equal to slot: the --cluster-slots count that makes
 * th_cluster_reshard move slot. -1 when i does not own slot. */
int th_cluster_slots_upto(th_cluster_t *c, int i, int slot);

/* A command on node i (hiredis, printf format as redisCommand); the
 * reply as text: a status, string or integer as such, an error as
 * "ERR..." (its text), an array as its elements one a line. Caller frees;
 * NULL when the node did not answer. */
char *th_cluster_cmd(th_cluster_t *c, int i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* th_cluster_cmd with the command as argc words argv (borrowed): for a
 * command built at run time (an ACL line). */
char *th_cluster_cmd_argv(th_cluster_t *c, int i, int argc,
                          const char *const argv[]);

/* 1 when node i runs and its ROLE says master (a primary now: a killed
 * primary's promoted replica says so too), else 0. */
int th_cluster_is_primary(th_cluster_t *c, int i);

#endif
