/* harness_pg: a private PostgreSQL server for integration tests: initdb in
 * a temp dir, postgres on a free port of 127.0.0.1 (unix socket in the temp
 * dir), run as the "postgres" user when the tests run as root. */
#ifndef IDEM_HARNESS_PG_H
#define IDEM_HARNESS_PG_H

#include <sys/types.h>

typedef struct {
    pid_t pid; /* the postmaster, a child of the test */
    int port;
    char *dir;     /* temp dir: data/, the socket, the log */
    char dsn[256]; /* host=127.0.0.1 port=N user=postgres dbname=postgres */
} th_pg_t;

/* initdb (trust authentication on 127.0.0.1 only) and start the server;
 * waits until it accepts connections. 0 on success. The postmaster gets
 * SIGQUIT (immediate shutdown) when the test process dies. */
int th_pg_start(th_pg_t *pg);

/* Immediate shutdown (SIGQUIT), reap, remove the temp dir. */
void th_pg_stop(th_pg_t *pg);

/* Immediate shutdown keeping the data; th_pg_restart starts it again on the
 * same port. 0 on success. */
int th_pg_kill(th_pg_t *pg);
int th_pg_restart(th_pg_t *pg);

/* Runs sql with psql (-X -A -t -q, ON_ERROR_STOP) as user postgres.
 * Returns psql's exit code; *out (may be NULL) its trimmed stdout, caller
 * frees. */
int th_pg_sql(th_pg_t *pg, const char *sql, char **out);

/* Runs the SQL file at path (relative to the source tree when not
 * absolute) with psql. Returns psql's exit code. */
int th_pg_file(th_pg_t *pg, const char *path);

/* The result of sql as a long (first row, first column); -1 on error. */
long th_pg_long(th_pg_t *pg, const char *sql);

/* A suite's .fini: stops a server a failed test left running. */
void th_pg_cleanup(void);

#endif
