/* harness: real processes for integration tests: a private redis-server on
 * a free port in a temp dir, the embedded broker, and idemproc commands. */
#include "harness.h"
#include "conf/conf.h"
#include "input/envelope.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <librdkafka/rdkafka.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
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

/* The first port of the kernel's ephemeral range: the ports it hands to
 * outgoing connections (every client in a test makes some) and to bind(0). */
static int ephemeral_low(void)
{
    int lo = 32768, hi = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 32768;
        fclose(f);
    }
    return lo;
}

/* A port the kernel picks from its ephemeral range, free a moment ago. */
static int ephemeral_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    if (fd < 0)
        return -1;
    int ok = !bind(fd, (struct sockaddr *)&a, sizeof(a)) &&
             !getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ok ? ntohs(a.sin_port) : -1;
}

/* Whether a listener could bind 127.0.0.1:port now. */
static int port_bindable(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* A port for a server a test starts. Not from the ephemeral range: a port
 * the kernel gave us with bind(0) and we closed could be handed to some
 * client's outgoing connection before the server binds it (the suite makes
 * thousands). Random below that range, so the suite's parallel jobs rarely
 * pick the same one, and never one this process handed out recently (a
 * test asks for several before starting their servers). */
int th_free_port(void)
{
    static int recent[64];
    static unsigned nrecent;
    static uint64_t x;
    if (!x) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        x = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^
            ((uint64_t)getpid() << 40) ^ 0x9e3779b97f4a7c15ull;
    }
    int lo = 10000, hi = ephemeral_low();
    if (hi - lo < 1000)
        lo = 1024;
    if (hi - lo < 1000) /* the ephemeral range starts low: only it is left */
        return ephemeral_port();
    for (int tries = 0; tries < 1000; tries++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int port = lo + (int)(x % (uint64_t)(hi - lo));
        int used = 0;
        for (unsigned i = 0; i < nrecent && i < 64; i++)
            used |= recent[i] == port;
        if (used || !port_bindable(port))
            continue;
        recent[nrecent++ % 64] = port;
        return port;
    }
    return -1;
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
    return th_spawn_in(NULL, argv, out_path, err_path, env);
}

pid_t th_spawn_in(const char *dir, char *const argv[], const char *out_path,
                  const char *err_path, char *const env[])
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    if (dir && chdir(dir))
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

int th_run(char *const argv[], char **out, char **err, int timeout_ms)
{
    return th_run_env(argv, NULL, out, err, timeout_ms);
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
    char *argv[40] = {"/usr/bin/redis-server",
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
    size_t n = 15; /* later arguments win in redis-server */
    for (size_t i = 0; i < 23 && r->extra[i]; i++)
        argv[n++] = (char *)r->extra[i];
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
    return th_redis_start_args(r, NULL);
}

int th_redis_start_args(th_redis_t *r, const char *const extra[])
{
    memset(r, 0, sizeof(*r));
    for (size_t i = 0; extra && extra[i] && i < 23; i++)
        r->extra[i] = extra[i];
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

int th_http_get(int port, const char *path, char **body)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (body)
        *body = NULL;
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        close(fd);
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while ((r = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (cap - len < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    close(fd);
    buf[len] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/%*s %d", &status) != 1) {
        free(buf);
        return -1;
    }
    char *b = strstr(buf, "\r\n\r\n");
    if (body)
        *body = strdup(b ? b + 4 : "");
    free(buf);
    return status;
}

/* The stack of the test running in this process (one test per process). */
static th_stack_t *stack_current;

void th_stack_cleanup(void)
{
    if (stack_current && stack_current->dir)
        th_stack_stop(stack_current);
    stack_current = NULL;
}

int th_stack_start(th_stack_t *s, int partitions,
                   const char *const extra_props[])
{
    return th_stack_start_topics(s, partitions, NULL, extra_props);
}

int th_stack_start_topics(th_stack_t *s, int partitions,
                          const char *const topics[],
                          const char *const extra_props[])
{
    memset(s, 0, sizeof(*s));
    stack_current = s;
    s->dir = th_tmpdir();
    if (th_redis_start(&s->redis))
        return -1;
    char t1[64], t2[64];
    snprintf(t1, sizeof(t1), "payments:%d", partitions);
    snprintf(t2, sizeof(t2), "payments.out:%d", partitions);
    const char *args[32] = {"--topic",        t1,        "--topic",
                            "payments.dlq:2", "--topic", t2};
    size_t n = 6;
    for (size_t i = 0; topics && topics[i] && n + 3 < 32; i++) {
        args[n++] = "--topic";
        args[n++] = topics[i];
    }
    args[n] = NULL;
    if (th_broker_start(&s->broker, args))
        return -1;
    snprintf(s->conf, sizeof(s->conf), "%s/idemproc.properties", s->dir);
    snprintf(s->expect, sizeof(s->expect), "%s/expect.json", s->dir);
    FILE *fp = fopen(s->conf, "w");
    if (!fp)
        return -1;
    fprintf(fp,
            "kafka.bootstrap.servers=%s\n"
            "group.id=test-group\n"
            "input.topics=payments\n"
            "dlq.topic=payments.dlq\n"
            "redis.url=%s\n"
            "message.max.bytes=4096\n"
            "kafka.fetch.wait.max.ms=10\n"
            "kafka.session.timeout.ms=6000\n"
            "kafka.heartbeat.interval.ms=500\n"
            "batch.max.wait.ms=10\n"
            "commit.interval.ms=200\n"
            "retry.backoff.max.ms=1000\n"
            "stats.interval.ms=1000\n"
            "progress.interval.ms=2000\n"
            "shutdown.timeout.ms=10000\n"
            "http.listen=\n",
            s->broker.bootstrap, s->redis.url);
    for (int i = 0; extra_props && extra_props[i]; i++)
        fprintf(fp, "%s\n", extra_props[i]);
    return fclose(fp);
}

void th_stack_stop(th_stack_t *s)
{
    th_broker_stop(&s->broker);
    th_redis_stop(&s->redis);
    th_rmrf(s->dir);
    free(s->dir);
    s->dir = NULL;
    if (stack_current == s)
        stack_current = NULL;
}

int th_stack_produce(th_stack_t *s, const char *const args[])
{
    char *argv[64] = {(char *)th_bin(),    "produce", "-b",
                      s->broker.bootstrap, "-t",      "payments",
                      "--expect",          s->expect};
    int n = 8;
    for (int i = 0; args && args[i] && n < 63; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    return th_run(argv, NULL, NULL, 120000);
}

pid_t th_stack_member(th_stack_t *s, const char *name, const char *const sets[])
{
    char idset[128], log[600];
    snprintf(idset, sizeof(idset), "member.id=%s", name);
    snprintf(log, sizeof(log), "%s/%s.log", s->dir, name);
    char *argv[64] = {(char *)th_bin(), "run", "-c", s->conf, "--set", idset};
    int n = 6;
    for (int i = 0; sets && sets[i] && n < 61; i++) {
        argv[n++] = "--set";
        argv[n++] = (char *)sets[i];
    }
    argv[n] = NULL;
    return th_spawn(argv, NULL, log, NULL);
}

int th_stack_verify(th_stack_t *s, int dlq, const char *const sets[],
                    char **out)
{
    char *argv[64] = {(char *)th_bin(), "verify",  "-c",           s->conf,
                      "--expect",       s->expect, "--timeout-ms", "20000"};
    int n = 8;
    if (dlq)
        argv[n++] = "--dlq";
    for (int i = 0; sets && sets[i] && n < 61; i++) {
        argv[n++] = "--set";
        argv[n++] = (char *)sets[i];
    }
    argv[n] = NULL;
    char *o = NULL;
    int rc = th_run(argv, &o, NULL, 60000);
    if (out)
        *out = o;
    else
        free(o);
    return rc;
}

int th_stack_wait_verified(th_stack_t *s, int dlq, const char *const sets[],
                           int timeout_ms, char **out)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char *o = NULL;
    for (;;) {
        free(o);
        o = NULL;
        if (th_stack_verify(s, dlq, sets, &o) == 0)
            break;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >
            timeout_ms) {
            if (out)
                *out = o;
            else
                free(o);
            return -1;
        }
        usleep(300000);
    }
    if (out)
        *out = o;
    else
        free(o);
    return 0;
}

long th_stack_applied(th_stack_t *s)
{
    const char *args[] = {"GET", "idemproc:ledger:applied", NULL};
    char *out = th_redis_cli(&s->redis, args);
    long v = out ? strtol(out, NULL, 10) : 0;
    free(out);
    return v;
}

int th_stack_wait_applied(th_stack_t *s, long n, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 50) {
        if (th_stack_applied(s) >= n)
            return 0;
        usleep(50000);
    }
    return -1;
}

long th_stack_expect_unique(th_stack_t *s)
{
    json_t *e = json_load_file(s->expect, 0, NULL);
    cr_assert(e, "no %s", s->expect);
    long n = (long)json_integer_value(json_object_get(e, "unique"));
    json_decref(e);
    cr_assert_gt(n, 0);
    return n;
}

pid_t th_stack_member_started(th_stack_t *s, const char *name,
                              const char *const sets[])
{
    pid_t pid = th_stack_member(s, name, sets);
    cr_assert_gt(pid, 0);
    int rc = th_wait(pid, 1500);
    if (rc != -1) {
        char *log = th_stack_member_log(s, name);
        cr_assert_fail("member %s exited (%d) at start:\n%s", name, rc, log);
    }
    return pid;
}

static int committed_to_end(th_stack_t *s, const char *topic, int partitions)
{
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", s->broker.bootstrap, err,
                      sizeof(err));
    rd_kafka_conf_set(kc, "group.id", "test-group", err, sizeof(err));
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
    cr_assert(rk, "%s", err);
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; p++)
        rd_kafka_topic_partition_list_add(l, topic, p);
    int done = rd_kafka_committed(rk, l, 10000) == 0;
    for (int i = 0; done && i < l->cnt; i++) {
        int64_t lo, hi;
        done = rd_kafka_query_watermark_offsets(rk, topic, i, &lo, &hi,
                                                10000) == 0 &&
               (l->elems[i].offset >= hi || hi == lo); /* empty: nothing */
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return done;
}

void th_stack_wait_committed(th_stack_t *s, const char *topic, int partitions,
                             int timeout_ms)
{
    for (int t = 0; t < timeout_ms && !committed_to_end(s, topic, partitions);
         t += 200)
        usleep(200000);
    cr_assert(committed_to_end(s, topic, partitions),
              "the group never committed %s to its end", topic);
}

char *th_stack_member_log(th_stack_t *s, const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.log", s->dir, name);
    char *log = th_slurp(path, NULL);
    return log ? log : strdup("");
}

int th_stack_stop_member(th_stack_t *s, const char *name, pid_t pid,
                         int grace_ms)
{
    int rc = th_stop(pid, grace_ms);
    if (rc != 0 || getenv("TH_SHOW_LOGS")) {
        char *log = th_stack_member_log(s, name);
        size_t len = strlen(log);
        const char *tail = len > 6000 ? log + len - 6000 : log;
        fprintf(stderr, "member %s stopped with %d; the end of its log:\n%s\n",
                name, rc, tail);
        free(log);
    }
    return rc;
}

int th_stack_log_count(th_stack_t *s, const char *name, const char *text)
{
    char *log = th_stack_member_log(s, name);
    int n = 0;
    for (char *at = log; (at = strstr(at, text)); at += strlen(text))
        n++;
    free(log);
    return n;
}

long long th_redis_info(th_redis_t *r, const char *field)
{
    const char *args[] = {"INFO", NULL};
    char *info = th_redis_cli(r, args);
    long long v = -1;
    char key[128];
    snprintf(key, sizeof(key), "\n%s:", field);
    char *at = info ? strstr(info, key) : NULL;
    if (at)
        v = atoll(at + strlen(key));
    free(info);
    return v;
}

void th_redis_ok(th_redis_t *r, const char *const args[])
{
    char *out = th_redis_cli(r, args);
    cr_assert(out && !strcmp(out, "OK"), "%s %s: %s", args[0],
              args[1] ? args[1] : "", out ? out : "(failed)");
    free(out);
}

int th_wait_unready(int port, const char *needle, int timeout_ms, char **body)
{
    char *b = NULL;
    int status = -1;
    for (int t = 0; t < timeout_ms; t += 100) {
        free(b);
        b = NULL;
        status = th_http_get(port, "/readyz", &b);
        if (status == 503 && (!needle || (b && strstr(b, needle))))
            break;
        usleep(100000);
    }
    if (body)
        *body = b;
    else
        free(b);
    return status;
}

void th_recs_free(th_recs_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->v[i].key);
        free(r->v[i].value);
        json_decref(r->v[i].headers);
    }
    free(r->v);
}

static char *rec_memdup0(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* Reads a whole topic from the beginning with librdkafka (assign, EOF). */
th_recs_t th_topic_read(const char *bootstrap, const char *topic)
{
    th_recs_t out = {0};
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
    rd_kafka_conf_set(kc, "group.id", "test-reader", err, sizeof(err));
    rd_kafka_conf_set(kc, "enable.partition.eof", "true", err, sizeof(err));
    rd_kafka_conf_set(kc, "fetch.wait.max.ms", "10", err, sizeof(err));
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
    cr_assert(rk, "%s", err);
    rd_kafka_poll_set_consumer(rk);
    const rd_kafka_metadata_t *md;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    cr_assert_eq(rd_kafka_metadata(rk, 0, rkt, &md, 10000), 0);
    int parts = md->topics[0].partition_cnt;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    for (int i = 0; i < parts; i++)
        rd_kafka_topic_partition_list_add(l, topic, i)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    int eof = 0;
    for (int idle = 0; eof < parts && idle < 300;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) {
            idle++;
            continue;
        }
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eof++;
        } else if (!m->err) {
            out.v = realloc(out.v, (out.n + 1) * sizeof(*out.v));
            th_rec_t *r = &out.v[out.n++];
            r->partition = m->partition;
            r->offset = m->offset;
            r->key = rec_memdup0(m->key, m->key_len);
            r->key_len = m->key_len;
            r->key_null = !m->key;
            r->value = rec_memdup0(m->payload, m->len);
            r->len = m->len;
            r->value_null = !m->payload;
            r->headers = json_object();
            r->nheaders = 0;
            rd_kafka_headers_t *h = NULL;
            if (rd_kafka_message_headers(m, &h) == 0) {
                const char *name;
                const void *v;
                size_t sz;
                for (size_t i = 0;
                     rd_kafka_header_get_all(h, i, &name, &v, &sz) == 0;
                     i++, r->nheaders++)
                    json_object_set_new(r->headers, name,
                                        v ? json_stringn(v, sz) : json_null());
            }
        }
        rd_kafka_message_destroy(m);
    }
    cr_assert_eq(eof, parts, "did not read %s to its end", topic);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return out;
}

rd_kafka_t *th_producer(const char *bootstrap, const char *const extra[])
{
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    cr_assert_eq(
        rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err)),
        RD_KAFKA_CONF_OK, "%s", err);
    for (size_t i = 0; extra && extra[i]; i++) {
        const char *eq = strchr(extra[i], '=');
        cr_assert(eq, "\"%s\" is not name=value", extra[i]);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)(eq - extra[i]), extra[i]);
        cr_assert_eq(rd_kafka_conf_set(kc, name, eq + 1, err, sizeof(err)),
                     RD_KAFKA_CONF_OK, "%s", err);
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
    cr_assert(rk, "%s", err);
    return rk;
}

/* Records in a topic: the sum of its partitions' high watermarks. */
long th_topic_size(const char *bootstrap, const char *topic)
{
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
    cr_assert(rk, "%s", err);
    const rd_kafka_metadata_t *md;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    long n = 0;
    if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) == 0) {
        for (int i = 0; i < md->topics[0].partition_cnt; i++) {
            int64_t lo, hi;
            if (rd_kafka_query_watermark_offsets(rk, topic, i, &lo, &hi,
                                                 10000) == 0)
                n += (long)(hi - lo);
        }
        rd_kafka_metadata_destroy(md);
    }
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return n;
}

idem_conf_t *th_ledger_conf(const th_redis_t *r)
{
    char url[128], err[512] = "";
    snprintf(url, sizeof(url), "redis.url=%s", r->url);
    char *sets[] = {url,
                    "group.id=g",
                    "handler=ledger",
                    "kafka.bootstrap.servers=127.0.0.1:1",
                    "input.topics=t",
                    "dlq.topic=d"};
    idem_conf_t *conf = idem_conf_load(NULL, NULL, sets, 6, err, sizeof(err));
    cr_assert(conf, "%s", err);
    return conf;
}
