/* http_loop: the HTTP thread serving /metrics, /healthz and /readyz while
 * another thread updates the metrics the way the processing loop does, as
 * a program of its own for the ThreadSanitizer build (`make tsan`; Criterion
 * cannot run under TSan). Any data race fails it (TSan exits 66), and so
 * does a lost update. Exit 0 when clean. */
#include "obs/http.h"
#include "obs/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCRAPES 150

typedef struct {
    idem_metrics_t *m;
    atomic_int stop; /* set by the scraper when it has done its scrapes */
    long rounds;     /* how many rounds the loop ran */
} loop_t;

/* What the processing loop does to the metrics, many times over: the
 * records' figures into its accumulator, merged every few rounds (a turn
 * of the loop). */
static void *loop_thread(void *arg)
{
    loop_t *l = arg;
    static const char stats[] =
        "{\"topics\":{\"payments\":{\"partitions\":{\"0\":{\"partition\":0,"
        "\"consumer_lag\":7},\"1\":{\"partition\":1,\"consumer_lag\":3}}}}}";
    idem_metrics_acc_t *acc = idem_metrics_acc_new(l->m);
    long i;
    for (i = 0; !atomic_load(&l->stop); i++) {
        idem_metrics_acc_outcome_add(acc, IDEM_OUTCOME_PROCESSED, 1);
        idem_metrics_duplicate_add(
            l->m, i % 2 ? IDEM_DUP_RESEND : IDEM_DUP_REDELIVERY, 1);
        idem_metrics_dlq_add(l->m, (idem_reason_t)(i % IDEM_REASON_CNT), 1);
        idem_metrics_acc_latency_observe(acc, (double)(i % 100) / 1000.0);
        idem_metrics_acc_effect_latency_observe(acc, (double)(i % 30) / 1000.0);
        idem_metrics_acc_fetch_latency_observe(acc, (double)(i % 20) / 1000.0);
        if (i % 50 == 0)
            idem_metrics_acc_merge(acc);
        idem_metrics_batch_observe(l->m, (double)(i % 500));
        idem_metrics_redis_observe(l->m, 0.001);
        idem_metrics_heartbeat(l->m);
        idem_metrics_inflight_set(l->m, i % 1000);
        if (i % 100 == 0) {
            idem_metrics_ready_set(l->m, i % 200 == 0,
                                   i % 200 ? "redis: down" : NULL);
            idem_metrics_rebalance_add(l->m, "assign");
            idem_metrics_assigned_set(l->m, i % 8);
            idem_metrics_commit_add(l->m, i % 300 != 0);
            idem_metrics_stats_json(l->m, stats, sizeof(stats) - 1);
        }
    }
    idem_metrics_acc_destroy(acc); /* merges the last rounds */
    idem_metrics_ready_set(l->m, 1, NULL);
    l->rounds = i;
    return NULL;
}

/* GET path from 127.0.0.1:port; returns the status (-1 on failure) and
 * the body in *body (caller frees; may be NULL). */
static int http_get(int port, const char *path, char **body)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 8192, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (cap - len < 2)
            buf = realloc(buf, cap *= 2);
    }
    close(fd);
    buf[len] = '\0';
    int status = -1;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    char *sep = strstr(buf, "\r\n\r\n");
    if (body)
        *body = strdup(sep ? sep + 4 : "");
    free(buf);
    return status;
}

/* The value of the sample named exactly series in a page; -1 if absent. */
static long page_sample(const char *page, const char *series)
{
    size_t l = strlen(series);
    for (const char *p = page; (p = strstr(p, series)); p++)
        if ((p == page || p[-1] == '\n') && p[l] == ' ')
            return strtol(p + l + 1, NULL, 10);
    return -1;
}

/* 1 when each merged histogram's +Inf bucket equals its _count: a scrape
 * sees a merge whole or not at all. */
static int merge_whole(const char *page)
{
    static const char *const names[] = {"idemproc_processing_latency_seconds",
                                        "idemproc_effect_latency_seconds",
                                        "idemproc_fetch_latency_seconds"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char inf[128], count[128];
        snprintf(inf, sizeof(inf), "%s_bucket{le=\"+Inf\"}", names[i]);
        snprintf(count, sizeof(count), "%s_count", names[i]);
        long a = page_sample(page, inf), b = page_sample(page, count);
        if (a < 0 || a != b) {
            fprintf(stderr, "http_loop: %s: +Inf %ld, _count %ld\n", names[i],
                    a, b);
            return 0;
        }
    }
    return 1;
}

int main(void)
{
    char err[256];
    loop_t l = {.m = idem_metrics_new()};
    idem_http_t *h =
        idem_http_start("127.0.0.1:0", l.m, 60000, err, sizeof(err));
    if (!h) {
        fprintf(stderr, "http_loop: %s\n", err);
        return 1;
    }
    int port = idem_http_port(h);
    pthread_t th;
    pthread_create(&th, NULL, loop_thread, &l);
    const char *paths[] = {"/metrics", "/readyz", "/healthz"};
    int bad = 0;
    for (int i = 0; i < SCRAPES; i++) {
        char *page = NULL;
        int st = http_get(port, paths[i % 3], i % 3 ? NULL : &page);
        if (st != 200 && st != 503) {
            fprintf(stderr, "http_loop: %s: status %d\n", paths[i % 3], st);
            bad = 1;
        }
        if (page && !merge_whole(page))
            bad = 1;
        free(page);
    }
    atomic_store(&l.stop, 1);
    pthread_join(th, NULL);
    char *body = NULL;
    int st = http_get(port, "/metrics", &body);
    const char *name = "idemproc_records_total{outcome=\"processed\"} ";
    const char *at = body ? strstr(body, name) : NULL;
    long got = at ? strtol(at + strlen(name), NULL, 10) : -1;
    if (st != 200 || got != l.rounds) {
        fprintf(stderr, "http_loop: /metrics %d: processed %ld, loop %ld\n", st,
                got, l.rounds);
        bad = 1;
    }
    if (http_get(port, "/readyz", NULL) != 200) {
        fprintf(stderr, "http_loop: /readyz not 200 at the end\n");
        bad = 1;
    }
    free(body);
    idem_http_stop(h);
    idem_metrics_destroy(l.m);
    if (!bad)
        printf("http_loop: %d scrapes against %ld loop rounds, no race\n",
               SCRAPES, l.rounds);
    return bad;
}
