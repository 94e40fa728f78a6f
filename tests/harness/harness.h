/* harness: real processes for integration tests: a private redis-server on
 * a free port in a temp dir, the embedded broker, and idemproc commands.
 * Every child gets PR_SET_PDEATHSIG so nothing outlives the test process. */
#ifndef IDEM_HARNESS_H
#define IDEM_HARNESS_H

#include <librdkafka/rdkafka.h>
#include "testlib.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Path of the idemproc binary under test ($IDEMPROC_BIN). */
const char *th_bin(void);

/* A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's
 * ephemeral range (so no outgoing connection takes it before the server
 * binds it); -1 when none is found. */
int th_free_port(void);

/* Starts argv (argv[0] a path) with stdout/stderr redirected to the given
 * files (NULL = /dev/null) and `env` (NULL = inherit). Returns the pid. */
pid_t th_spawn(char *const argv[], const char *out_path, const char *err_path,
               char *const env[]);

/* th_spawn in working directory `dir` (NULL = the current one). */
pid_t th_spawn_in(const char *dir, char *const argv[], const char *out_path,
                  const char *err_path, char *const env[]);

/* Runs argv to completion (killed after timeout_ms). Returns the exit code,
 * 128+signal when killed. *out / *err (may be NULL) receive the output;
 * caller frees. */
int th_run(char *const argv[], char **out, char **err, int timeout_ms);

/* Waits for pid up to timeout_ms. Returns exit code, 128+signal, or -1 on
 * timeout (the process is left running). */
int th_wait(pid_t pid, int timeout_ms);

/* SIGTERM then, after grace_ms, SIGKILL; reaps. Returns th_wait's code. */
int th_stop(pid_t pid, int grace_ms);

typedef struct {
    pid_t pid;
    int port;
    char *dir;
    char url[64];          /* redis://127.0.0.1:PORT/0 */
    const char *extra[24]; /* more redis-server arguments (borrowed) */
} th_redis_t;

struct idem_conf_s;
/* A ledger member's configuration against r and no broker, for tests that
 * drive the store directly (asserts that it loads; idem_conf_destroy it). */
struct idem_conf_s *th_ledger_conf(const th_redis_t *r);

/* th_redis_start with more redis-server arguments (NULL-terminated, at
 * most 23; borrowed: they must outlive r, restarts use them again). */
int th_redis_start_args(th_redis_t *r, const char *const extra[]);

/* Starts redis-server on a free port in a temp dir (persistence: an RDB is
 * written on shutdown so th_redis_restart keeps the data). 0 on success. */
int th_redis_start(th_redis_t *r);
void th_redis_stop(th_redis_t *r);   /* SIGTERM (saves), removes the dir */
int th_redis_kill(th_redis_t *r);    /* stop and keep the dir and data */
int th_redis_restart(th_redis_t *r); /* same port and dir, data kept */

/* Runs redis-cli against r with the given arguments; returns its stdout
 * (trimmed; caller frees) or NULL. */
char *th_redis_cli(th_redis_t *r, const char *const args[]);

typedef struct {
    pid_t pid;
    char bootstrap[256];
    char *dir;
} th_broker_t;

/* Starts `idemproc broker` with extra args (NULL-terminated, may be NULL)
 * and reads its bootstrap servers line. 0 on success. */
int th_broker_start(th_broker_t *b, const char *const extra[]);
void th_broker_stop(th_broker_t *b);

/* th_run with an explicit environment (NULL-terminated "NAME=value"
 * strings; NULL = inherit). Same return and ownership as th_run. */
int th_run_env(char *const argv[], char *const env[], char **out, char **err,
               int timeout_ms);

/* Minimal HTTP/1.0 GET to 127.0.0.1:port. Returns the status code (and
 * the body, caller frees) or -1 when nothing answered. */
int th_http_get(int port, const char *path, char **body);

/* A whole test stack: a private redis-server and the embedded broker with
 * topics payments:<partitions>, payments.dlq:2 and payments.out:<partitions>,
 * and a properties file for `run` and `verify` in a temp dir. */
typedef struct {
    th_redis_t redis;
    th_broker_t broker;
    char *dir;
    char conf[512];   /* properties file path */
    char expect[512]; /* where th_stack_produce writes --expect */
} th_stack_t;

/* extra_props: NULL-terminated "key=value" lines added to the properties
 * file (may be NULL). Returns 0 when everything started. */
int th_stack_start(th_stack_t *s, int partitions,
                   const char *const extra_props[]);
void th_stack_stop(th_stack_t *s);

/* th_stack_start with more topics ("NAME:PARTITIONS", NULL-terminated, at
 * most 12; may be NULL) in the broker. */
int th_stack_start_topics(th_stack_t *s, int partitions,
                          const char *const topics[],
                          const char *const extra_props[]);

/* A suite's .fini: stops the stack a failed test left running (its
 * processes die with the test anyway; this removes its temp dirs). */
void th_stack_cleanup(void);

/* Runs `produce -b <broker> -t payments --expect <s->expect>` plus args
 * (NULL-terminated). Returns produce's exit code. */
int th_stack_produce(th_stack_t *s, const char *const args[]);

/* Starts `run -c <conf> --set member.id=<name>` plus --set sets
 * (NULL-terminated "key=value", may be NULL); stderr goes to
 * <dir>/<name>.log. Returns the pid. */
pid_t th_stack_member(th_stack_t *s, const char *name,
                      const char *const sets[]);

/* Runs `verify -c <conf> --expect <s->expect>` (with --dlq when dlq) plus
 * sets; returns its exit code, *out (may be NULL) its stdout. */
int th_stack_verify(th_stack_t *s, int dlq, const char *const sets[],
                    char **out);

/* Polls th_stack_verify until it exits 0 or timeout_ms passes. Returns 0
 * when verified; the last output goes to *out (may be NULL). */
int th_stack_wait_verified(th_stack_t *s, int dlq, const char *const sets[],
                           int timeout_ms, char **out);

/* Asserts (Criterion's cr_assert_eq) that th_stack_wait_verified says
 * exact within ms; the failure message holds verify's last output. */
#define TH_ASSERT_VERIFIED(s, dlq, sets, ms)                                   \
    do {                                                                       \
        char *vout_ = NULL;                                                    \
        int vrc_ = th_stack_wait_verified((s), (dlq), (sets), (ms), &vout_);   \
        cr_assert_eq(vrc_, 0, "verify never exact:\n%s", vout_);               \
        free(vout_);                                                           \
    } while (0)

/* Reads the redis counter <prefix>ledger:applied (0 when absent). */
long th_stack_applied(th_stack_t *s);

/* Polls th_stack_applied every 50 ms until it reaches n. 0 when it did,
 * -1 after timeout_ms. */
int th_stack_wait_applied(th_stack_t *s, long n, int timeout_ms);

/* The "unique" count of the expectation th_stack_produce wrote; asserts
 * (Criterion) that it is there and above 0. */
long th_stack_expect_unique(th_stack_t *s);

/* th_stack_member, then fails the test at once, with the member's log,
 * when it exits during its first 1.5 s (a refused setting) rather than let
 * the test wait for records that will never be applied. */
pid_t th_stack_member_started(th_stack_t *s, const char *name,
                              const char *const sets[]);

/* Waits until the stack's group (test-group) has committed every one of
 * the first `partitions` partitions of `topic` to its end (an empty one is
 * done), so every record read has its outcome; fails the test after
 * timeout_ms. */
void th_stack_wait_committed(th_stack_t *s, const char *topic, int partitions,
                             int timeout_ms);

/* Member `name`'s log (<dir>/<name>.log), "" when there is none. Never
 * NULL; caller frees. */
char *th_stack_member_log(th_stack_t *s, const char *name);

/* th_stop for member `name` of the stack; when it does not exit 0 in
 * grace_ms, the end of its log goes to stderr (the test's output), so a
 * failed stop says why (always with TH_SHOW_LOGS set in the environment).
 * Returns th_stop's value. */
int th_stack_stop_member(th_stack_t *s, const char *name, pid_t pid,
                         int grace_ms);

/* How often text occurs in member `name`'s log. */
int th_stack_log_count(th_stack_t *s, const char *name, const char *text);

/* A numeric field of INFO ("used_memory", "aof_rewrite_in_progress");
 * -1 when absent or Redis did not answer. */
long long th_redis_info(th_redis_t *r, const char *field);

/* Runs a command that must answer OK; asserts (Criterion) that it did. */
void th_redis_ok(th_redis_t *r, const char *const args[]);

/* Polls GET /readyz every 100 ms until it answers 503 with needle in the
 * body (any body when needle is NULL), or timeout_ms passed. Returns the
 * last status (-1: nothing answered); *body (may be NULL) gets the last
 * body, caller frees. */
int th_wait_unready(int port, const char *needle, int timeout_ms, char **body);

typedef struct {
    int32_t partition;
    int64_t offset;
    char *key;
    size_t key_len;
    int key_null; /* no key at all (key is then "") */
    char *value;
    size_t len;
    int value_null;  /* a tombstone (value is then "") */
    json_t *headers; /* {name: last value}, null for a header without one */
    size_t nheaders; /* headers in the record, repeated names included */
} th_rec_t;

typedef struct {
    th_rec_t *v;
    size_t n;
} th_recs_t;

/* A plain librdkafka producer to bootstrap (asserts it was made); the
 * caller flushes and destroys it. extra: "name=value" properties,
 * NULL-terminated (may be NULL). */
rd_kafka_t *th_producer(const char *bootstrap, const char *const extra[]);

/* Frees what th_topic_read returned. */
void th_recs_free(th_recs_t *r);

/* Reads a whole topic from the beginning (assign, until EOF on every
 * partition); asserts it got to the end. Caller frees with th_recs_free. */
th_recs_t th_topic_read(const char *bootstrap, const char *topic);

/* Records in a topic: the sum of its partitions' watermark spans. */
long th_topic_size(const char *bootstrap, const char *topic);

#endif
