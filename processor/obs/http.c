/* http: /metrics, /healthz and /readyz over libmicrohttpd, served from the
 * daemon's own polling thread so a slow scrape never blocks processing. */
#include "obs/http.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "base/log.h"
#include "base/util.h"

#define CT_METRICS "text/plain; version=0.0.4; charset=utf-8"
#define CT_TEXT    "text/plain; charset=utf-8"

/* Connections served at once. libmicrohttpd's default is FD_SETSIZE - 4
 * (1,020): about a thousand idle connections (a scanner, a client that
 * leaks them) then kept the probes out, and a liveness probe would have
 * restarted a healthy member. Idle connections close after
 * IDLE_TIMEOUT_S. */
#define CONNECTIONS_MAX 4096
/* Descriptors kept for the rest of the process (Kafka, Redis, webhook
 * connections) when the descriptor limit bounds the connections. */
#define FDS_KEPT       256
#define IDLE_TIMEOUT_S 10
/* libmicrohttpd's log lines are mostly about clients (one that closes
 * mid-request, a header too large): one a connection let any client, a
 * scanner or a load balancer's TCP check flood the log. One line is
 * logged a window, the others counted and the count logged with the next
 * one, or on stop. */
#define LOG_WINDOW_MS 60000

struct idem_http_s {
    struct MHD_Daemon *daemon;
    idem_metrics_t *metrics; /* borrowed */
    int64_t stall_ms;
    int port;
    char last_error[256];        /* libmicrohttpd's last log line, for errstr */
    pthread_mutex_t log_lock;    /* the window below: the daemon's thread and
                                    the starting or stopping one */
    int64_t log_window_start_ms; /* monotonic; 0: nothing logged yet */
    long log_suppressed;         /* lines not logged in this window */
};

/* Splits "host:port" into an IPv4 socket address. An empty host or "*"
 * means every interface. Returns 0, or -1 with errstr. */
static int listen_parse(const char *listen, struct sockaddr_in *sa,
                        char *errstr, size_t errstr_size)
{
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    if (!colon) {
        snprintf(errstr, errstr_size,
                 "http.listen: \"%s\" is not host:port (e.g. 0.0.0.0:9464)",
                 listen ? listen : "");
        return -1;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || port < 0 || port > 65535) {
        snprintf(errstr, errstr_size,
                 "http.listen: bad port \"%s\" in \"%s\" (0..65535)", colon + 1,
                 listen);
        return -1;
    }
    sa->sin_port = htons((uint16_t)port);

    size_t hl = (size_t)(colon - listen);
    char host[256];
    if (hl >= sizeof(host)) {
        snprintf(errstr, errstr_size, "http.listen: host too long in \"%s\"",
                 listen);
        return -1;
    }
    memcpy(host, listen, hl);
    host[hl] = '\0';
    if (hl == 0 || !strcmp(host, "*")) {
        sa->sin_addr.s_addr = htonl(INADDR_ANY);
        return 0;
    }
    if (inet_pton(AF_INET, host, &sa->sin_addr) == 1)
        return 0;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(errstr, errstr_size,
                 "http.listen: cannot resolve \"%s\" to an IPv4 address: %s",
                 host, rc ? gai_strerror(rc) : "no address");
        if (res)
            freeaddrinfo(res);
        return -1;
    }
    sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return 0;
}

int idem_http_listen_check(const char *listen, char *errstr, size_t errstr_size)
{
    struct sockaddr_in sa;
    return listen_parse(listen, &sa, errstr, errstr_size);
}

/* Logs how many libmicrohttpd lines were not logged (none: nothing). */
static void log_suppressed(long count)
{
    if (count <= 0)
        return;
    char n[32];
    snprintf(n, sizeof(n), "%ld", count);
    idem_log_kv(IDEM_LOG_WARN, "http server errors not logged", "count", n,
                NULL);
}

/* libmicrohttpd's error log: fires on whichever thread hit the problem
 * (the caller of MHD_start_daemon, or the daemon's thread). */
static void http_log(void *cls, const char *fmt, va_list ap)
{
    idem_http_t *h = cls;
    char line[256];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t l = strlen(line);
    while (l > 0 && (line[l - 1] == '\n' || line[l - 1] == '\r'))
        line[--l] = '\0';
    /* Only read by idem_http_start after a failed start, when no daemon
     * thread exists; later writes from the daemon thread race nothing. */
    snprintf(h->last_error, sizeof(h->last_error), "%s", line);
    pthread_mutex_lock(&h->log_lock);
    int64_t now = idem_now_ms();
    if (h->log_window_start_ms &&
        now - h->log_window_start_ms < LOG_WINDOW_MS) {
        h->log_suppressed++;
        pthread_mutex_unlock(&h->log_lock);
        return;
    }
    long suppressed = h->log_suppressed;
    h->log_window_start_ms = now;
    h->log_suppressed = 0;
    pthread_mutex_unlock(&h->log_lock);
    log_suppressed(suppressed);
    idem_log_kv(IDEM_LOG_WARN, "http server", "error", line, NULL);
}

/* Queues a response whose body is `body` (malloc'ed; ownership passes to
 * libmicrohttpd, which frees it). */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int status,
                             const char *content_type, char *body, size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result reply_text(struct MHD_Connection *conn,
                                  unsigned int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static enum MHD_Result reply_text(struct MHD_Connection *conn,
                                  unsigned int status, const char *fmt, ...)
{
    char *body = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&body, fmt, ap);
    va_end(ap);
    if (n < 0)
        return MHD_NO;
    return reply(conn, status, CT_TEXT, body, (size_t)n);
}

/* Makes a reason safe for a one-line body: control characters become
 * spaces. */
static void one_line(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20)
            *s = ' ';
}

static enum MHD_Result serve_metrics(idem_http_t *h,
                                     struct MHD_Connection *conn)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    if (!fp)
        return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
                          "cannot render metrics\n");
    idem_metrics_render(h->metrics, fp);
    if (fclose(fp) != 0) {
        free(buf);
        return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
                          "cannot render metrics\n");
    }
    return reply(conn, MHD_HTTP_OK, CT_METRICS, buf, len);
}

/* Request handler: fires on the daemon's thread once per request (the
 * first call; we never wait for a body). */
static enum MHD_Result handle(void *cls, struct MHD_Connection *conn,
                              const char *url, const char *method,
                              const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)con_cls;
    idem_http_t *h = cls;
    int known = !strcmp(url, "/metrics") || !strcmp(url, "/healthz") ||
                !strcmp(url, "/readyz");
    if (!known)
        return reply_text(conn, MHD_HTTP_NOT_FOUND,
                          "not found (try /metrics, /healthz, /readyz)\n");
    /* HEAD is GET without the body (RFC 9110 9.3.2), which libmicrohttpd
     * leaves out by itself: uptime checkers and load balancers use it. */
    if (strcmp(method, MHD_HTTP_METHOD_GET) &&
        strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                          "method not allowed (GET and HEAD only)\n");

    if (!strcmp(url, "/metrics"))
        return serve_metrics(h, conn);
    if (!strcmp(url, "/healthz")) {
        int64_t age = idem_metrics_heartbeat_age_ms(h->metrics);
        if (age < h->stall_ms)
            return reply_text(conn, MHD_HTTP_OK, "ok\n");
        return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                          "stalled: no progress for %" PRId64 " ms\n", age);
    }
    char reason[256];
    if (idem_metrics_ready_get(h->metrics, reason, sizeof(reason)))
        return reply_text(conn, MHD_HTTP_OK, "ready\n");
    one_line(reason);
    return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "not ready: %s\n",
                      reason[0] ? reason : "unknown");
}

/* How many connections the server takes at once: CONNECTIONS_MAX, less
 * when the descriptor limit (RLIMIT_NOFILE) leaves fewer than that beyond
 * FDS_KEPT. */
static unsigned int connection_limit(void)
{
    struct rlimit rl;
    rlim_t limit = CONNECTIONS_MAX;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t spare = rl.rlim_cur > 2 * FDS_KEPT ? rl.rlim_cur - FDS_KEPT
                                                  : rl.rlim_cur / 2;
        if (spare < limit)
            limit = spare;
    }
    return (unsigned int)limit;
}

idem_http_t *idem_http_start(const char *listen, idem_metrics_t *m,
                             int64_t stall_ms, char *errstr, size_t errstr_size)
{
    struct sockaddr_in sa;
    if (listen_parse(listen, &sa, errstr, errstr_size))
        return NULL;
    idem_http_t *h = idem_xcalloc(1, sizeof(*h));
    h->metrics = m;
    h->stall_ms = stall_ms;
    pthread_mutex_init(&h->log_lock, NULL);
    h->daemon = MHD_start_daemon(
        MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG,
        ntohs(sa.sin_port), /* only used in messages: SOCK_ADDR wins */
        NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER, http_log, h,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)IDLE_TIMEOUT_S,
        MHD_OPTION_CONNECTION_LIMIT, connection_limit(), MHD_OPTION_END);
    if (!h->daemon) {
        snprintf(errstr, errstr_size, "http.listen: cannot listen on %s: %s",
                 listen, h->last_error[0] ? h->last_error : "unknown error");
        pthread_mutex_destroy(&h->log_lock);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? (int)info->port : ntohs(sa.sin_port);
    return h;
}

int idem_http_port(const idem_http_t *h)
{
    return h->port;
}

void idem_http_stop(idem_http_t *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->daemon);
    log_suppressed(h->log_suppressed); /* the daemon's thread is gone */
    pthread_mutex_destroy(&h->log_lock);
    free(h);
}
