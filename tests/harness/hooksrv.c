/* hooksrv: a real HTTP server (libmicrohttpd) on 127.0.0.1 for the webhook
 * tests and the benchmark: answers POSTs with scripted statuses, delays and
 * Retry-After, and records what it received. */
#include "hooksrv.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int status;
    int delay_ms;
    char *retry_after;
    char *body;
} reply_t;

typedef struct script_s {
    char *key;
    reply_t reply;
    struct script_s *next; /* in the order queued */
} script_t;

typedef struct rule_s {
    char *needle;
    reply_t reply;
    struct rule_s *next;
} rule_t;

/* One request being received: its body grows over several callbacks. */
typedef struct {
    char *body;
    size_t len, cap;
} upload_t;

struct th_hook_s {
    struct MHD_Daemon *daemon;
    int port;
    char url[64];
    int record;
    pthread_mutex_t lock; /* guards everything below */
    reply_t dflt;
    script_t *scripts;
    rule_t *rules;
    th_hook_req_t *reqs;
    size_t req_cnt, req_cap;
    atomic_size_t count, count_2xx;
    void (*on_arrival)(const char *key, void *opaque);
    void *arrival_opaque;
};

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static reply_t reply_copy(th_hook_reply_t r)
{
    reply_t c = {r.status, r.delay_ms, dup_or_null(r.retry_after),
                 dup_or_null(r.body)};
    return c;
}

static void reply_free(reply_t *r)
{
    free(r->retry_after);
    free(r->body);
}

/* Decides the reply for one request (a copy, under the lock): the first
 * script queued for its key, else the first body rule, else the default.
 */
static reply_t choose(th_hook_t *h, const char *key, const char *body)
{
    reply_t out;
    pthread_mutex_lock(&h->lock);
    script_t **pp = &h->scripts;
    for (; *pp; pp = &(*pp)->next)
        if (key && !strcmp((*pp)->key, key))
            break;
    if (*pp) {
        script_t *s = *pp;
        *pp = s->next;
        out = s->reply; /* moved */
        free(s->key);
        free(s);
        pthread_mutex_unlock(&h->lock);
        return out;
    }
    const reply_t *r = &h->dflt;
    for (rule_t *u = h->rules; u; u = u->next)
        if (strstr(body, u->needle)) {
            r = &u->reply;
            break;
        }
    out.status = r->status;
    out.delay_ms = r->delay_ms;
    out.retry_after = dup_or_null(r->retry_after);
    out.body = dup_or_null(r->body);
    pthread_mutex_unlock(&h->lock);
    return out;
}

/* MHD_KeyValueIterator: appends "Name: value\n" to the memstream. */
static enum MHD_Result header_line(void *cls, enum MHD_ValueKind kind,
                                   const char *key, const char *value)
{
    (void)kind;
    fprintf(cls, "%s: %s\n", key, value ? value : "");
    return MHD_YES;
}

static void record(th_hook_t *h, struct MHD_Connection *conn, const char *url,
                   const char *method, const upload_t *up, int status)
{
    if (!h->record)
        return;
    th_hook_req_t q = {0};
    q.method = strdup(method);
    q.path = strdup(url);
    q.key = dup_or_null(
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Idempotency-Key"));
    q.content_type = dup_or_null(
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type"));
    q.auth = dup_or_null(
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization"));
    q.xtest = dup_or_null(
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Test"));
    size_t hlen = 0;
    FILE *hf = open_memstream(&q.headers, &hlen);
    MHD_get_connection_values(conn, MHD_HEADER_KIND, header_line, hf);
    fclose(hf);
    q.body = malloc(up->len + 1);
    if (up->len)
        memcpy(q.body, up->body, up->len);
    q.body[up->len] = '\0';
    q.body_len = up->len;
    q.status = status;
    pthread_mutex_lock(&h->lock);
    if (h->req_cnt == h->req_cap) {
        h->req_cap = h->req_cap ? 2 * h->req_cap : 256;
        h->reqs = realloc(h->reqs, h->req_cap * sizeof(*h->reqs));
    }
    h->reqs[h->req_cnt++] = q;
    pthread_mutex_unlock(&h->lock);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    th_hook_t *h = cls;
    upload_t *up = *con_cls;
    if (!up) { /* headers only so far */
        *con_cls = calloc(1, sizeof(upload_t));
        return *con_cls ? MHD_YES : MHD_NO;
    }
    if (*upload_data_size) {
        if (up->len + *upload_data_size + 1 > up->cap) {
            up->cap = 2 * (up->len + *upload_data_size) + 64;
            up->body = realloc(up->body, up->cap);
        }
        memcpy(up->body + up->len, upload_data, *upload_data_size);
        up->len += *upload_data_size;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (!up->body)
        up->body = calloc(1, 1);
    up->body[up->len] = '\0';
    const char *key =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Idempotency-Key");
    if (h->on_arrival)
        h->on_arrival(key, h->arrival_opaque);
    reply_t r = choose(h, key, up->body);
    if (r.delay_ms > 0) {
        struct timespec ts = {r.delay_ms / 1000,
                              (long)(r.delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts))
            ;
    }
    if (r.status == 0) { /* close the connection without an answer */
        record(h, conn, url, method, up, 0);
        atomic_fetch_add(&h->count, 1);
        reply_free(&r);
        return MHD_NO;
    }
    const char *body = r.body ? r.body : "";
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r.retry_after)
        MHD_add_response_header(resp, "Retry-After", r.retry_after);
    record(h, conn, url, method, up, r.status);
    atomic_fetch_add(&h->count, 1);
    if (r.status >= 200 && r.status < 300)
        atomic_fetch_add(&h->count_2xx, 1);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)r.status, resp);
    MHD_destroy_response(resp);
    reply_free(&r);
    return rc;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    upload_t *up = *con_cls;
    if (up) {
        free(up->body);
        free(up);
        *con_cls = NULL;
    }
}

void th_hook_on_arrival(th_hook_t *h, void (*fn)(const char *key, void *opaque),
                        void *opaque)
{
    h->arrival_opaque = opaque;
    h->on_arrival = fn;
}

static struct MHD_Daemon *plain_daemon(th_hook_t *h, int port);

th_hook_t *th_hook_start(th_hook_reply_t dflt, int rec)
{
    return th_hook_start_tls(dflt, rec, NULL, NULL);
}

th_hook_t *th_hook_start_tls(th_hook_reply_t dflt, int rec,
                             const char *cert_pem, const char *key_pem)
{
    th_hook_t *h = calloc(1, sizeof(*h));
    pthread_mutex_init(&h->lock, NULL);
    h->dflt = reply_copy(dflt);
    h->record = rec;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = 0; /* the kernel picks a free one */
    unsigned int flags =
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION;
    if (cert_pem)
        h->daemon =
            MHD_start_daemon(flags | MHD_USE_TLS, 0, NULL, NULL, on_request, h,
                             MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                             MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
                             MHD_OPTION_HTTPS_MEM_CERT, cert_pem,
                             MHD_OPTION_HTTPS_MEM_KEY, key_pem, MHD_OPTION_END);
    else
        h->daemon = plain_daemon(h, 0);
    if (!h->daemon) {
        reply_free(&h->dflt);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? (int)info->port : 0;
    snprintf(h->url, sizeof(h->url), "%s://127.0.0.1:%d/hook",
             cert_pem ? "https" : "http", h->port);
    return h;
}

/* The plain-HTTP daemon on 127.0.0.1:port (0: any free port), reusing the
 * address (th_hook_up binds the port it had). */
static struct MHD_Daemon *plain_daemon(th_hook_t *h, int port)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    return MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0,
        NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)1024, MHD_OPTION_END);
}

void th_hook_down(th_hook_t *h)
{
    if (h->daemon)
        MHD_stop_daemon(h->daemon);
    h->daemon = NULL;
}

int th_hook_up(th_hook_t *h)
{
    if (h->daemon)
        return 0;
    for (int i = 0; i < 50 && !h->daemon; i++)
        if (!(h->daemon = plain_daemon(h, h->port)))
            usleep(100 * 1000);
    return h->daemon ? 0 : -1;
}

void th_hook_stop(th_hook_t *h)
{
    if (!h)
        return;
    if (h->daemon)
        MHD_stop_daemon(h->daemon);
    reply_free(&h->dflt);
    while (h->scripts) {
        script_t *s = h->scripts;
        h->scripts = s->next;
        free(s->key);
        reply_free(&s->reply);
        free(s);
    }
    while (h->rules) {
        rule_t *u = h->rules;
        h->rules = u->next;
        free(u->needle);
        reply_free(&u->reply);
        free(u);
    }
    th_hook_requests_free(h->reqs, h->req_cnt);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

int th_hook_port(const th_hook_t *h)
{
    return h->port;
}

const char *th_hook_url(const th_hook_t *h)
{
    return h->url;
}

void th_hook_set_default(th_hook_t *h, th_hook_reply_t dflt)
{
    reply_t r = reply_copy(dflt);
    pthread_mutex_lock(&h->lock);
    reply_free(&h->dflt);
    h->dflt = r;
    pthread_mutex_unlock(&h->lock);
}

void th_hook_script(th_hook_t *h, const char *key, th_hook_reply_t reply)
{
    script_t *s = calloc(1, sizeof(*s));
    s->key = strdup(key);
    s->reply = reply_copy(reply);
    pthread_mutex_lock(&h->lock);
    script_t **pp = &h->scripts;
    while (*pp)
        pp = &(*pp)->next;
    *pp = s;
    pthread_mutex_unlock(&h->lock);
}

void th_hook_rule_body(th_hook_t *h, const char *needle, th_hook_reply_t reply)
{
    rule_t *u = calloc(1, sizeof(*u));
    u->needle = strdup(needle);
    u->reply = reply_copy(reply);
    pthread_mutex_lock(&h->lock);
    rule_t **pp = &h->rules;
    while (*pp)
        pp = &(*pp)->next;
    *pp = u;
    pthread_mutex_unlock(&h->lock);
}

size_t th_hook_count(th_hook_t *h)
{
    return atomic_load(&h->count);
}

size_t th_hook_count_2xx(th_hook_t *h)
{
    return atomic_load(&h->count_2xx);
}

size_t th_hook_count_key(th_hook_t *h, const char *key, int acked)
{
    size_t n = 0;
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < h->req_cnt; i++) {
        const th_hook_req_t *q = &h->reqs[i];
        if (q->key && !strcmp(q->key, key) &&
            (!acked || (q->status >= 200 && q->status < 300)))
            n++;
    }
    pthread_mutex_unlock(&h->lock);
    return n;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

size_t th_hook_keys_acked(th_hook_t *h, const char *prefix, size_t *acks)
{
    size_t plen = strlen(prefix), n = 0;
    pthread_mutex_lock(&h->lock);
    char **keys = malloc((h->req_cnt ? h->req_cnt : 1) * sizeof(*keys));
    for (size_t i = 0; i < h->req_cnt; i++) {
        const th_hook_req_t *q = &h->reqs[i];
        if (q->key && !strncmp(q->key, prefix, plen) && q->status >= 200 &&
            q->status < 300)
            keys[n++] = q->key;
    }
    qsort(keys, n, sizeof(*keys), cmp_str);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++)
        if (!i || strcmp(keys[i], keys[i - 1]))
            distinct++;
    pthread_mutex_unlock(&h->lock);
    free(keys);
    if (acks)
        *acks = n;
    return distinct;
}

th_hook_req_t *th_hook_requests(th_hook_t *h, size_t *n)
{
    pthread_mutex_lock(&h->lock);
    th_hook_req_t *out = calloc(h->req_cnt ? h->req_cnt : 1, sizeof(*out));
    for (size_t i = 0; i < h->req_cnt; i++) {
        const th_hook_req_t *q = &h->reqs[i];
        out[i] = *q;
        out[i].method = dup_or_null(q->method);
        out[i].path = dup_or_null(q->path);
        out[i].key = dup_or_null(q->key);
        out[i].content_type = dup_or_null(q->content_type);
        out[i].auth = dup_or_null(q->auth);
        out[i].xtest = dup_or_null(q->xtest);
        out[i].headers = dup_or_null(q->headers);
        out[i].body = malloc(q->body_len + 1);
        memcpy(out[i].body, q->body, q->body_len + 1);
    }
    *n = h->req_cnt;
    pthread_mutex_unlock(&h->lock);
    return out;
}

void th_hook_requests_free(th_hook_req_t *reqs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(reqs[i].method);
        free(reqs[i].path);
        free(reqs[i].key);
        free(reqs[i].content_type);
        free(reqs[i].auth);
        free(reqs[i].xtest);
        free(reqs[i].headers);
        free(reqs[i].body);
    }
    free(reqs);
}
