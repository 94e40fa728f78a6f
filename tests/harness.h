/* harness: real processes for integration tests: a private redis-server on
 * a free port in a temp dir, the embedded broker, and idemproc commands.
 * Every child gets PR_SET_PDEATHSIG so nothing outlives the test process. */
#ifndef IDEM_HARNESS_H
#define IDEM_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

/* Path of the idemproc binary under test ($IDEMPROC_BIN). */
const char *th_bin(void);

/* Source tree root ($IDEMPROC_SRC). */
const char *th_src(void);

/* A new private temp dir (caller frees the string; th_rmrf removes it). */
char *th_tmpdir(void);
void th_rmrf(const char *dir);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int th_free_port(void);

/* Starts argv (argv[0] a path) with stdout/stderr redirected to the given
 * files (NULL = /dev/null) and `env` (NULL = inherit). Returns the pid. */
pid_t th_spawn(char *const argv[], const char *out_path, const char *err_path,
               char *const env[]);

/* Runs argv to completion (killed after timeout_ms). Returns the exit code,
 * 128+signal when killed. *out / *err (may be NULL) receive the output;
 * caller frees. */
int th_run(char *const argv[], char **out, char **err, int timeout_ms);

/* Waits for pid up to timeout_ms. Returns exit code, 128+signal, or -1 on
 * timeout (the process is left running). */
int th_wait(pid_t pid, int timeout_ms);

/* SIGTERM then, after grace_ms, SIGKILL; reaps. Returns th_wait's code. */
int th_stop(pid_t pid, int grace_ms);

/* Reads a whole file; caller frees. NULL when missing. */
char *th_slurp(const char *path, size_t *len);

typedef struct {
    pid_t pid;
    int port;
    char *dir;
    char url[64]; /* redis://127.0.0.1:PORT/0 */
} th_redis_t;

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

#endif
