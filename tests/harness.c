/* harness: real processes for integration tests: a private redis-server on
 * a free port in a temp dir, the embedded broker, and idemproc commands. */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

const char *th_bin(void)
{
    const char *b = getenv("IDEMPROC_BIN");
    return b ? b : "build/idemproc";
}

const char *th_src(void)
{
    const char *s = getenv("IDEMPROC_SRC");
    return s ? s : ".";
}

char *th_tmpdir(void)
{
    char tmpl[] = "/tmp/idemproc-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void th_rmrf(const char *dir)
{
    if (!dir || strncmp(dir, "/tmp/idemproc-test-", 19))
        return; /* never remove anything we did not create */
    pid_t pid = fork();
    if (pid == 0) {
        execlp("rm", "rm", "-rf", dir, (char *)NULL);
        _exit(127);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

int th_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
        getsockname(fd, (struct sockaddr *)&a, &l)) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static void redirect(int fd, const char *path)
{
    int f = open(path ? path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (f >= 0) {
        dup2(f, fd);
        close(f);
    }
}

pid_t th_spawn(char *const argv[], const char *out_path, const char *err_path,
               char *const env[])
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
        dup2(devnull, 0);
        close(devnull);
    }
    redirect(1, out_path);
    redirect(2, err_path);
    execve(argv[0], argv, env ? env : environ);
    _exit(127);
}

int th_wait(pid_t pid, int timeout_ms)
{
    int status;
    for (int waited = 0;; waited += 10) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0)
            return -2;
        if (waited >= timeout_ms)
            return -1;
        usleep(10000);
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}

int th_stop(pid_t pid, int grace_ms)
{
    if (pid <= 0)
        return -2;
    kill(pid, SIGTERM);
    int rc = th_wait(pid, grace_ms);
    if (rc == -1) {
        kill(pid, SIGKILL);
        rc = th_wait(pid, 5000);
    }
    return rc;
}

char *th_slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    size_t cap = 4096, n = 0, r;
    char *buf = malloc(cap);
    while ((r = fread(buf + n, 1, cap - n - 1, fp)) > 0) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    fclose(fp);
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

int th_run(char *const argv[], char **out, char **err, int timeout_ms)
{
    char *dir = th_tmpdir();
    char op[512], ep[512];
    snprintf(op, sizeof(op), "%s/out", dir);
    snprintf(ep, sizeof(ep), "%s/err", dir);
    pid_t pid = th_spawn(argv, op, ep, NULL);
    int rc = th_wait(pid, timeout_ms);
    if (rc == -1) {
        kill(pid, SIGKILL);
        th_wait(pid, 5000);
        rc = 128 + SIGKILL;
    }
    if (out)
        *out = th_slurp(op, NULL);
    if (err)
        *err = th_slurp(ep, NULL);
    th_rmrf(dir);
    free(dir);
    return rc;
}

static int redis_ping(th_redis_t *r)
{
    const char *args[] = {"PING", NULL};
    char *out = th_redis_cli(r, args);
    int ok = out && !strcmp(out, "PONG");
    free(out);
    return ok;
}

static int redis_spawn(th_redis_t *r)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", r->port);
    char log[512];
    snprintf(log, sizeof(log), "%s/redis.log", r->dir);
    char *argv[] = {"/usr/bin/redis-server",
                    "--port",
                    port,
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    r->dir,
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--daemonize",
                    "no",
                    "--protected-mode",
                    "yes",
                    NULL};
    r->pid = th_spawn(argv, log, log, NULL);
    for (int i = 0; i < 500; i++) {
        if (redis_ping(r))
            return 0;
        if (th_wait(r->pid, 0) >= 0) {
            r->pid = 0;
            return -1;
        }
        usleep(10000);
    }
    return -1;
}

int th_redis_start(th_redis_t *r)
{
    memset(r, 0, sizeof(*r));
    r->dir = th_tmpdir();
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = th_free_port();
        snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%d/0", r->port);
        if (redis_spawn(r) == 0)
            return 0;
    }
    return -1;
}

int th_redis_kill(th_redis_t *r)
{
    /* SHUTDOWN SAVE writes dump.rdb so a restart keeps the data, the way a
     * Redis with persistence behaves across a restart. */
    const char *args[] = {"SHUTDOWN", "SAVE", NULL};
    free(th_redis_cli(r, args));
    int rc = th_stop(r->pid, 5000);
    r->pid = 0;
    return rc;
}

int th_redis_restart(th_redis_t *r)
{
    return redis_spawn(r);
}

void th_redis_stop(th_redis_t *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        th_wait(r->pid, 5000);
    }
    r->pid = 0;
    th_rmrf(r->dir);
    free(r->dir);
    r->dir = NULL;
}

char *th_redis_cli(th_redis_t *r, const char *const args[])
{
    char port[16];
    snprintf(port, sizeof(port), "%d", r->port);
    char *argv[64] = {"/usr/bin/redis-cli", "-h", "127.0.0.1", "-p", port};
    int n = 5;
    for (int i = 0; args[i] && n < 63; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    char *out = NULL;
    int rc = th_run(argv, &out, NULL, 10000);
    if (rc != 0) {
        free(out);
        return NULL;
    }
    size_t l = strlen(out);
    while (l > 0 && (out[l - 1] == '\n' || out[l - 1] == '\r'))
        out[--l] = '\0';
    return out;
}

int th_broker_start(th_broker_t *b, const char *const extra[])
{
    memset(b, 0, sizeof(*b));
    b->dir = th_tmpdir();
    char *argv[64] = {(char *)th_bin(), "broker"};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 63; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    char op[512], ep[512];
    snprintf(op, sizeof(op), "%s/out", b->dir);
    snprintf(ep, sizeof(ep), "%s/err", b->dir);
    b->pid = th_spawn(argv, op, ep, NULL);
    for (int i = 0; i < 1000; i++) {
        char *out = th_slurp(op, NULL);
        char *nl = out ? strchr(out, '\n') : NULL;
        if (nl) {
            *nl = '\0';
            snprintf(b->bootstrap, sizeof(b->bootstrap), "%s", out);
            free(out);
            return 0;
        }
        free(out);
        if (th_wait(b->pid, 0) >= 0) {
            b->pid = 0;
            return -1;
        }
        usleep(10000);
    }
    return -1;
}

void th_broker_stop(th_broker_t *b)
{
    if (b->pid > 0)
        th_stop(b->pid, 5000);
    b->pid = 0;
    th_rmrf(b->dir);
    free(b->dir);
    b->dir = NULL;
}

int th_run_env(char *const argv[], char *const env[], char **out, char **err,
               int timeout_ms)
{
    char *dir = th_tmpdir();
    char op[512], ep[512];
    snprintf(op, sizeof(op), "%s/out", dir);
    snprintf(ep, sizeof(ep), "%s/err", dir);
    pid_t pid = th_spawn(argv, op, ep, env);
    int rc = th_wait(pid, timeout_ms);
    if (rc == -1) {
        kill(pid, SIGKILL);
        th_wait(pid, 5000);
        rc = 128 + SIGKILL;
    }
    if (out)
        *out = th_slurp(op, NULL);
    if (err)
        *err = th_slurp(ep, NULL);
    th_rmrf(dir);
    free(dir);
    return rc;
}
