/* harness_pg: a private PostgreSQL server for integration tests. */
#include "harness_pg.h"
#include "harness.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PG_BINDIR
#define PG_BINDIR "/usr/lib/postgresql/15/bin"
#endif

static th_pg_t *pg_current;

static const char *pg_bindir(void)
{
    const char *d = getenv("PG_BINDIR");
    return d && *d ? d : PG_BINDIR;
}

/* The user the server runs as: "postgres" when we are root (PostgreSQL
 * refuses to run as root), else ourselves (NULL). */
static struct passwd *pg_user(void)
{
    return geteuid() == 0 ? getpwnam("postgres") : NULL;
}

static void become_pg_user(void)
{
    struct passwd *pw = pg_user();
    if (!pw)
        return;
    if (setgroups(0, NULL) || setgid(pw->pw_gid) || setuid(pw->pw_uid))
        _exit(126);
}

/* Forks argv as the server's user, output to log (append). Returns the pid;
 * with pdeath the child gets SIGQUIT when the test process dies. */
static pid_t spawn_as_pg(char *const argv[], const char *log, int pdeath)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); /* a terminal's ^C reaches us, not the server */
        FILE *f = fopen(log, "a");
        if (f) {
            dup2(fileno(f), 1);
            dup2(fileno(f), 2);
        }
        become_pg_user();
        /* After the user change: changing the uid clears the death
         * signal. A parent already gone leaves nobody to stop the server. */
        if (pdeath && (prctl(PR_SET_PDEATHSIG, SIGQUIT) || getppid() != parent))
            _exit(125);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int server_start(th_pg_t *pg)
{
    char data[600], log[600], port[16];
    snprintf(data, sizeof(data), "%s/data", pg->dir);
    snprintf(log, sizeof(log), "%s/postgres.log", pg->dir);
    snprintf(port, sizeof(port), "%d", pg->port);
    char bin[600];
    snprintf(bin, sizeof(bin), "%s/postgres", pg_bindir());
    char *argv[] = {bin,
                    "-D",
                    data,
                    "-p",
                    port,
                    "-k",
                    pg->dir,
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=40",
                    "-c",
                    "shared_buffers=32MB",
                    NULL};
    pg->pid = spawn_as_pg(argv, log, 1);
    if (pg->pid < 0)
        return -1;
    for (int i = 0; i < 600; i++) {
        if (th_pg_sql(pg, "SELECT 1", NULL) == 0)
            return 0;
        if (waitpid(pg->pid, NULL, WNOHANG) == pg->pid) {
            pg->pid = 0;
            return -1;
        }
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return -1;
}

int th_pg_start(th_pg_t *pg)
{
    memset(pg, 0, sizeof(*pg));
    pg_current = pg;
    pg->dir = th_tmpdir();
    if (!pg->dir)
        return -1;
    struct passwd *pw = pg_user();
    if (pw && chown(pg->dir, pw->pw_uid, pw->pw_gid))
        return -1;
    pg->port = th_free_port();
    char data[600], log[600], initdb[600];
    snprintf(data, sizeof(data), "%s/data", pg->dir);
    snprintf(log, sizeof(log), "%s/initdb.log", pg->dir);
    snprintf(initdb, sizeof(initdb), "%s/initdb", pg_bindir());
    char *argv[] = {initdb,  "-D", data,   "-U",         "postgres",  "-A",
                    "trust", "-E", "UTF8", "--locale=C", "--no-sync", NULL};
    pid_t pid = spawn_as_pg(argv, log, 0);
    if (pid < 0 || wait_exit(pid) != 0)
        return -1;
    /* Trust on the socket and 127.0.0.1 only. */
    char hba[700];
    snprintf(hba, sizeof(hba), "%s/pg_hba.conf", data);
    if (th_write_file(hba, "local all all trust\n"
                           "host all all 127.0.0.1/32 trust\n"))
        return -1;
    if (pw && chown(hba, pw->pw_uid, pw->pw_gid))
        return -1;
    snprintf(pg->dsn, sizeof(pg->dsn),
             "host=127.0.0.1 port=%d user=postgres dbname=postgres", pg->port);
    return server_start(pg);
}

int th_pg_kill(th_pg_t *pg)
{
    if (pg->pid <= 0)
        return -1;
    kill(pg->pid, SIGQUIT);
    wait_exit(pg->pid);
    pg->pid = 0;
    return 0;
}

int th_pg_restart(th_pg_t *pg)
{
    return server_start(pg);
}

void th_pg_stop(th_pg_t *pg)
{
    if (pg->pid > 0)
        th_pg_kill(pg);
    th_rmrf(pg->dir);
    free(pg->dir);
    pg->dir = NULL;
    if (pg_current == pg)
        pg_current = NULL;
}

void th_pg_cleanup(void)
{
    if (pg_current && pg_current->dir)
        th_pg_stop(pg_current);
    pg_current = NULL;
}

int th_pg_sql(th_pg_t *pg, const char *sql, char **out)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", pg->port);
    char *argv[] = {
        "/usr/bin/psql",   "-X", "-A",        "-t", "-q",        "-v",
        "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", port,        "-U",
        "postgres",        "-d", "postgres",  "-c", (char *)sql, NULL};
    char *o = NULL;
    int rc = th_run(argv, &o, NULL, 120000);
    if (o) {
        size_t n = strlen(o);
        while (n && (o[n - 1] == '\n' || o[n - 1] == ' '))
            o[--n] = '\0';
    }
    if (out)
        *out = o;
    else
        free(o);
    return rc;
}

int th_pg_file(th_pg_t *pg, const char *path)
{
    char full[1024], port[16];
    if (path[0] == '/')
        snprintf(full, sizeof(full), "%s", path);
    else
        snprintf(full, sizeof(full), "%s/%s", th_src(), path);
    snprintf(port, sizeof(port), "%d", pg->port);
    char *argv[] = {"/usr/bin/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h",
                    "127.0.0.1",     "-p", port, "-U", "postgres",        "-d",
                    "postgres",      "-f", full, NULL};
    return th_run(argv, NULL, NULL, 60000);
}

long th_pg_long(th_pg_t *pg, const char *sql)
{
    char *out = NULL;
    long v = -1;
    if (th_pg_sql(pg, sql, &out) == 0 && out && *out)
        v = strtol(out, NULL, 10);
    free(out);
    return v;
}
