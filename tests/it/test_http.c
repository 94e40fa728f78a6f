/* test_http (it): the /metrics, /healthz and /readyz endpoints over a real
 * socket, with a minimal HTTP/1.0 client of our own; promtool accepts a
 * scrape. */
#include "harness.h"
#include "obs/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"

typedef struct {
    int status;    /* -1 when the request failed */
    char *headers; /* raw header block, lower-cased names kept as sent */
    char *body;
} reply_t;

static void reply_free(reply_t *r)
{
    free(r->headers);
    free(r->body);
}

/* Sends "METHOD path HTTP/1.0" to 127.0.0.1:port and reads the whole reply
 * (HTTP/1.0: the server closes the connection). */
static reply_t http_request(int port, const char *method, const char *path)
{
    reply_t r = {.status = -1};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        close(fd);
        return r;
    }
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                     "Content-Length: 0\r\n\r\n",
                     method, path);
    cr_assert_eq(write(fd, req, (size_t)n), n);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (cap - len < 2)
            buf = realloc(buf, cap *= 2);
    }
    close(fd);
    buf[len] = '\0';
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &r.status) != 1 || !sep) {
        r.status = -1;
        free(buf);
        return r;
    }
    *sep = '\0';
    r.headers = strdup(buf);
    r.body = strdup(sep + 4);
    free(buf);
    return r;
}

static reply_t http_get(int port, const char *path)
{
    return http_request(port, "GET", path);
}

/* Case-insensitive header lookup; returns the value (caller frees) or NULL.
 */
static char *header(const reply_t *r, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = r->headers; p && *p;) {
        const char *eol = strstr(p, "\r\n");
        size_t ll = eol ? (size_t)(eol - p) : strlen(p);
        if (ll > nl && !strncasecmp(p, name, nl) && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            return strndup(v, ll - (size_t)(v - p));
        }
        p = eol ? eol + 2 : p + ll;
    }
    return NULL;
}

static idem_metrics_t *metrics;
static idem_http_t *server;
static int port;

static void start(void)
{
    char err[256];
    metrics = idem_metrics_new();
    server = idem_http_start("127.0.0.1:0", metrics, 300, err, sizeof(err));
    cr_assert(server, "%s", err);
    port = idem_http_port(server);
    cr_assert_gt(port, 0);
}

static void stop(void)
{
    idem_http_stop(server);
    idem_metrics_destroy(metrics);
    server = NULL;
    metrics = NULL;
}

TestSuite(http, .init = start, .fini = stop);

Test(http, metrics_200_with_prometheus_content_type)
{
    idem_metrics_outcome_add(metrics, IDEM_OUTCOME_PROCESSED, 11);
    reply_t r = http_get(port, "/metrics");
    cr_assert_eq(r.status, 200);
    char *ct = header(&r, "Content-Type");
    cr_expect_str_eq(ct, "text/plain; version=0.0.4; charset=utf-8");
    cr_expect(strstr(r.body, "\nidemproc_records_total{outcome=\"processed\"}"
                             " 11\n"),
              "%s", r.body);
    free(ct);
    reply_free(&r);
}

Test(http, healthz_ok_then_stalled)
{
    idem_metrics_heartbeat(metrics);
    reply_t r = http_get(port, "/healthz");
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(r.body, "ok\n");
    reply_free(&r);

    /* The loop's last beat was 2 s ago; stall_ms is 300. */
    idem_metrics_heartbeat_at(metrics, idem_now_ms() - 2000);
    r = http_get(port, "/healthz");
    cr_expect_eq(r.status, 503);
    long ms = -1;
    cr_expect_eq(sscanf(r.body, "stalled: no progress for %ld ms\n", &ms), 1,
                 "%s", r.body);
    cr_expect(ms >= 2000 && ms < 3000, "%s", r.body);
    reply_free(&r);

    /* A real (short) stall without faking the clock. */
    idem_metrics_heartbeat(metrics);
    r = http_get(port, "/healthz");
    cr_expect_eq(r.status, 200);
    reply_free(&r);
    usleep(400 * 1000);
    r = http_get(port, "/healthz");
    cr_expect_eq(r.status, 503);
    cr_expect(!strncmp(r.body, "stalled: no progress for ", 25), "%s", r.body);
    reply_free(&r);
}

Test(http, readyz_reports_reason)
{
    reply_t r = http_get(port, "/readyz");
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(r.body, "not ready: starting\n");
    reply_free(&r);

    idem_metrics_ready_set(metrics, 0, "redis: connection refused\n(retry)");
    r = http_get(port, "/readyz");
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(r.body, "not ready: redis: connection refused (retry)\n");
    reply_free(&r);

    idem_metrics_ready_set(metrics, 1, NULL);
    r = http_get(port, "/readyz");
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(r.body, "ready\n");
    reply_free(&r);
}

Test(http, unknown_path_404)
{
    reply_t r = http_get(port, "/nope");
    cr_expect_eq(r.status, 404);
    reply_free(&r);
    r = http_get(port, "/metrics/extra");
    cr_expect_eq(r.status, 404);
    reply_free(&r);
    /* A query string is not part of the path. */
    r = http_get(port, "/healthz?verbose=1");
    cr_expect_neq(r.status, 404);
    reply_free(&r);
}

Test(http, non_get_405)
{
    const char *methods[] = {"POST", "PUT", "DELETE"};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        reply_t r = http_request(port, methods[i], "/metrics");
        cr_expect_eq(r.status, 405, "%s", methods[i]);
        char *allow = header(&r, "Allow");
        cr_expect(allow && !strcmp(allow, "GET, HEAD"), "%s", methods[i]);
        free(allow);
        reply_free(&r);
    }
}

/* HEAD is GET without a body: the headers of GET, status included. */
Test(http, head_is_answered_without_a_body)
{
    const char *paths[] = {"/metrics", "/healthz", "/readyz"};
    idem_metrics_ready_set(metrics, 1, NULL);
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        reply_t r = http_request(port, "HEAD", paths[i]);
        cr_expect_eq(r.status, 200, "%s", paths[i]);
        cr_expect_str_empty(r.body ? r.body : "", "%s", paths[i]);
        char *ct = header(&r, "Content-Type");
        cr_expect(ct && *ct, "%s: no Content-Type", paths[i]);
        free(ct);
        reply_free(&r);
    }
}

Test(http, promtool_accepts_live_scrape)
{
    /* Fill every kind of series, including lag and escaped labels. */
    idem_metrics_outcome_add(metrics, IDEM_OUTCOME_DUPLICATE, 3);
    idem_metrics_latency_observe(metrics, 0.02);
    idem_metrics_batch_observe(metrics, 100);
    idem_metrics_redis_observe(metrics, 0.0003);
    idem_metrics_commit_add(metrics, 1);
    idem_metrics_member_set(metrics, "pay\"ments", "pod-1");
    const char *stats = "{\"topics\":{\"pay\\\"ments\":{\"partitions\":"
                        "{\"0\":{\"consumer_lag\":5}}}}}";
    cr_assert_eq(idem_metrics_stats_json(metrics, stats, strlen(stats)), 0);

    reply_t r = http_get(port, "/metrics");
    cr_assert_eq(r.status, 200);
    /* The process metrics client libraries export, and the info metric. */
    cr_expect_gt(th_metric(r.body, "process_resident_memory_bytes"), 0);
    cr_expect_gt(th_metric(r.body, "process_open_fds"), 2);
    cr_expect_geq(th_metric(r.body, "process_cpu_seconds_total"), 0);
    cr_expect_gt(th_metric(r.body, "process_start_time_seconds"), 1.6e9);
    cr_expect_eq(th_metric(r.body, "idemproc_member_info{group=\"pay\\\"ments"
                                   "\",member=\"pod-1\"}"),
                 1, "%s", r.body);
    char *dir = th_tmpdir();
    char path[512], cmd[1024];
    snprintf(path, sizeof(path), "%s/scrape.txt", dir);
    FILE *fp = fopen(path, "w");
    fputs(r.body, fp);
    fclose(fp);
    snprintf(cmd, sizeof(cmd), "/usr/bin/promtool check metrics < '%s'", path);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 30000);
    cr_expect_eq(rc, 0, "promtool check metrics: rc %d\n%s%s", rc, out, err);
    cr_expect_str_empty(out ? out : "", "%s", out);
    free(out);
    free(err);
    th_rmrf(dir);
    free(dir);
    reply_free(&r);
}

Test(http, bad_listen_addresses)
{
    const char *bad[] = {"nocolon", "127.0.0.1:http", "127.0.0.1:70000",
                         "no.such.host.invalid:0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        idem_http_t *h =
            idem_http_start(bad[i], metrics, 1000, err, sizeof(err));
        cr_expect_null(h, "%s accepted", bad[i]);
        cr_expect(!strncmp(err, "http.listen: ", 13), "%s: %s", bad[i], err);
        idem_http_stop(h);
    }
    /* The port our fixture holds is taken. */
    char listen[64], err[256] = "";
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    idem_http_t *h = idem_http_start(listen, metrics, 1000, err, sizeof(err));
    cr_expect_null(h);
    cr_expect(!strncmp(err, "http.listen: cannot listen on ", 30), "%s", err);
    idem_http_stop(h);
}

/* 1,100 idle connections (a scanner, a leaking client) leave the probes
 * answered: libmicrohttpd's own limit was FD_SETSIZE - 4 = 1,020
 * connections, after which /healthz and /readyz were refused and a
 * liveness probe would have restarted a healthy member. */
Test(http, probes_answered_under_a_flood_of_idle_connections, .timeout = 60)
{
    enum { IDLE = 1100 };
    static int fds[IDLE];
    size_t open_cnt = 0;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (size_t i = 0; i < IDLE; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            break;
        if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
            close(fd);
            break;
        }
        fds[open_cnt++] = fd;
    }
    cr_assert_eq(open_cnt, IDLE, "only %zu connections opened", open_cnt);
    usleep(300 * 1000); /* the server accepts them all */
    idem_metrics_heartbeat(metrics);
    idem_metrics_ready_set(metrics, 1, NULL);
    reply_t r = http_get(port, "/healthz");
    cr_expect_eq(r.status, 200, "/healthz under %d idle connections", IDLE);
    reply_free(&r);
    r = http_get(port, "/readyz");
    cr_expect_eq(r.status, 200, "/readyz under %d idle connections", IDLE);
    reply_free(&r);
    for (size_t i = 0; i < open_cnt; i++)
        close(fds[i]);
}

/* Counts the lines of the file at path holding needle; *count_sum gets
 * the sum of their "count" fields (0 when none). */
static int lines_with(const char *path, const char *needle, long *count_sum)
{
    size_t len;
    char *text = th_slurp(path, &len);
    cr_assert(text, "cannot read %s", path);
    int n = 0;
    *count_sum = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, needle))
            continue;
        n++;
        const char *c = strstr(line, "\"count\":");
        if (c)
            *count_sum += strtol(c + 8, NULL, 10);
    }
    free(text);
    return n;
}

/* Clients that give up mid-request (a port scanner, a load balancer's TCP
 * check, a client that times out) wrote one warn line each: any client
 * could flood the member's log. Now the first is logged, the rest of the
 * minute counted, and the count logged (at the latest on stop). */
Test(http, client_errors_do_not_flood_the_log, .timeout = 60)
{
    enum { CLIENTS = 50 };
    char *dir = th_tmpdir();
    char path[512];
    snprintf(path, sizeof(path), "%s/log", dir);
    int logfd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(logfd, 0);
    idem_log_setup(IDEM_LOG_INFO, IDEM_LOG_JSON);
    idem_log_set_fd(logfd);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < CLIENTS; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_geq(fd, 0);
        cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        const char part[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
        cr_assert_eq(write(fd, part, sizeof(part) - 1),
                     (ssize_t)sizeof(part) - 1);
        usleep(2000); /* the server reads the part before the close */
        close(fd);
    }
    usleep(500 * 1000);
    idem_http_stop(server);
    server = NULL;
    idem_log_set_fd(STDERR_FILENO);
    close(logfd);
    long logged_count, summed;
    int errors = lines_with(path, "\"http server\"", &logged_count);
    int summaries = lines_with(path, "http server errors not logged", &summed);
    cr_expect_eq(errors, 1, "%d warn lines for %d clients", errors, CLIENTS);
    cr_expect_eq(summaries, 1);
    /* A connection still open at the stop is closed without a line. */
    cr_expect(summed >= 1 && 1 + summed <= CLIENTS, "1 logged + %ld counted",
              summed);
    th_rmrf(dir);
    free(dir);
}
