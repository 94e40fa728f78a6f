/* httpclient: many HTTP POSTs in flight at once from one thread (libcurl's
 * multi interface), for the webhook handler: submit, drive, collect. */
#include "handlers/httpclient.h"

#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* One request slot: an easy handle kept for reuse (its connection stays
 * in the multi handle's cache), the request's header list, and what the
 * response said so far. */
typedef struct {
    CURL *easy;
    struct curl_slist *hdrs; /* this request's headers, owned */
    uint64_t tag;
    int busy; /* submitted and not yet finished */
    int64_t start_us;
    int attempts;   /* requests sent for this one (libcurl may resend) */
    int local_port; /* of the connection it goes out on (pre-request) */
    struct idem_httpclient_s *client;
    size_t body_len; /* response bytes kept in body */
    char body[IDEM_HTTPCLIENT_BODY_MAX + 1];
    char error[CURL_ERROR_SIZE];
} slot_t;

struct idem_httpclient_s {
    CURLM *multi;
    char *url;
    char *content_type_hdr;  /* "Content-Type: ..." */
    struct curl_slist *base; /* the configured extra headers, owned */
    long timeout_ms;
    char *ca_file;
    int tls_verify;

    slot_t *slots;
    size_t slot_cnt;
    size_t *free_slots; /* stack of free slot indexes */
    size_t free_cnt;

    idem_http_result_t *done; /* finished, not yet collected: a ring */
    size_t done_head, done_cnt;

    struct sock_s {
        curl_socket_t fd;
        int port; /* local port; 0: not read yet */
    } * socks;    /* the connections libcurl opened and did not close */
    size_t sock_cnt, sock_cap;
};

static void err_set(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void err_set(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (!errstr || !errstr_size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;
static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* --------------------------------------------------------------- checks */

/* Checks header line number `no` (from 1): a token, a colon, a value
 * without control characters. The key is a secret: messages name the line
 * and, once it is a valid token, the header's name, never the value. */
static int check_header_line(const char *line, size_t len, size_t no,
                             char *errstr, size_t errstr_size)
{
    size_t i = 0;
    for (; i < len && line[i] != ':'; i++) {
        unsigned char ch = (unsigned char)line[i];
        if (ch <= 0x20 || ch >= 0x7f || strchr("\"(),/;<=>?@[\\]{}", ch)) {
            err_set(errstr, errstr_size,
                    "webhook.headers: line %zu: not a header name before "
                    "its first ':' (expected \"Name: value\")",
                    no);
            return -1;
        }
    }
    if (i == 0 || i == len) {
        err_set(errstr, errstr_size,
                "webhook.headers: line %zu: a line without \"Name: value\"",
                no);
        return -1;
    }
    for (size_t j = i; j < len; j++) {
        unsigned char ch = (unsigned char)line[j];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
            err_set(errstr, errstr_size,
                    "webhook.headers: header %.*s has a control character "
                    "in its value",
                    (int)i, line);
            return -1;
        }
    }
    static const char *const reserved[] = {"idempotency-key",   "content-type",
                                           "content-length",    "host",
                                           "transfer-encoding", NULL};
    for (size_t k = 0; reserved[k]; k++)
        if (strlen(reserved[k]) == i && !strncasecmp(line, reserved[k], i)) {
            err_set(errstr, errstr_size,
                    "webhook.headers: %.*s is set by idemproc (use "
                    "webhook.content.type for Content-Type)",
                    (int)i, line);
            return -1;
        }
    return 0;
}

/* The end of the line starting at p: the next newline or the two
 * characters backslash-n (a properties file cannot hold a newline), or
 * the end of the string. *next gets where the next line starts. */
static const char *line_end(const char *p, const char **next)
{
    for (const char *q = p;; q++) {
        if (!*q) {
            *next = q;
            return q;
        }
        if (*q == '\n') {
            *next = q + 1;
            return q;
        }
        if (q[0] == '\\' && q[1] == 'n') {
            *next = q + 2;
            return q;
        }
    }
}

/* Calls fn on each non-empty line of list (separated by newlines, CRLF or
 * a literal backslash-n; surrounding blanks trimmed). Stops at the first
 * failure. */
static int for_each_line(const char *list,
                         int (*fn)(const char *line, size_t len, size_t no,
                                   void *ctx, char *errstr, size_t errstr_size),
                         void *ctx, char *errstr, size_t errstr_size)
{
    if (!list)
        return 0;
    const char *p = list;
    size_t no = 0; /* line number, from 1, blank lines counted */
    while (*p) {
        no++;
        const char *next;
        const char *end = line_end(p, &next);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\r'))
            b--;
        if (b > a && fn(a, (size_t)(b - a), no, ctx, errstr, errstr_size))
            return -1;
        p = next;
    }
    return 0;
}

static int check_line_cb(const char *line, size_t len, size_t no, void *ctx,
                         char *errstr, size_t errstr_size)
{
    (void)ctx;
    return check_header_line(line, len, no, errstr, errstr_size);
}

/* curl_slist_append that cannot fail (abort on out-of-memory, as
 * idem_xmalloc does); returns the list's head. */
static struct curl_slist *slist_add(struct curl_slist *list, const char *s)
{
    struct curl_slist *n = curl_slist_append(list, s);
    if (!n)
        abort();
    return n;
}

static int append_line_cb(const char *line, size_t len, size_t no, void *ctx,
                          char *errstr, size_t errstr_size)
{
    (void)no;
    struct curl_slist **list = ctx;
    char *s = idem_xmalloc(len + 1);
    memcpy(s, line, len);
    s[len] = '\0';
    (void)errstr;
    (void)errstr_size;
    *list = slist_add(*list, s);
    free(s);
    return 0;
}

int idem_httpclient_check(const idem_httpclient_conf_t *conf, char *errstr,
                          size_t errstr_size)
{
    pthread_once(&global_once, global_init);
    if (global_rc) {
        err_set(errstr, errstr_size, "libcurl: %s",
                curl_easy_strerror(global_rc));
        return -1;
    }
    if (!conf->url || !*conf->url) {
        err_set(errstr, errstr_size, "webhook.url: required");
        return -1;
    }
    CURLU *u = curl_url();
    if (!u) {
        err_set(errstr, errstr_size, "webhook.url: out of memory");
        return -1;
    }
    CURLUcode uc = curl_url_set(u, CURLUPART_URL, conf->url, 0);
    char *scheme = NULL;
    if (!uc)
        uc = curl_url_get(u, CURLUPART_SCHEME, &scheme, 0);
    int rc = 0;
    if (uc) {
        err_set(errstr, errstr_size, "webhook.url: \"%s\": %s", conf->url,
                curl_url_strerror(uc));
        rc = -1;
    } else if (strcmp(scheme, "http") && strcmp(scheme, "https")) {
        err_set(errstr, errstr_size,
                "webhook.url: unsupported scheme \"%s\" (use http:// or "
                "https://)",
                scheme);
        rc = -1;
    }
    curl_free(scheme);
    curl_url_cleanup(u);
    if (rc)
        return -1;
    if (!conf->content_type || !*conf->content_type ||
        strpbrk(conf->content_type, "\r\n")) {
        err_set(errstr, errstr_size,
                "webhook.content.type: must be one non-empty line");
        return -1;
    }
    if (conf->timeout_ms <= 0 || conf->max_inflight <= 0) {
        err_set(errstr, errstr_size,
                "webhook: timeout and max in-flight must be positive");
        return -1;
    }
    if (conf->ca_file && *conf->ca_file) {
        FILE *fp = fopen(conf->ca_file, "r");
        if (!fp) {
            err_set(errstr, errstr_size, "webhook.ca.file: %s: %s",
                    conf->ca_file, strerror(errno));
            return -1;
        }
        fclose(fp);
    }
    return for_each_line(conf->headers, check_line_cb, NULL, errstr,
                         errstr_size);
}

/* ---------------------------------------------------------- lifecycle */

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    slot_t *s = userdata;
    size_t n = size * nmemb;
    size_t room = IDEM_HTTPCLIENT_BODY_MAX - s->body_len;
    size_t take = n < room ? n : room;
    memcpy(s->body + s->body_len, ptr, take);
    s->body_len += take;
    s->body[s->body_len] = '\0';
    return n; /* the rest is read and dropped */
}

/* libcurl's header callback: fires on the processing thread (inside
 * curl_multi_perform) for each response header line. At the status line
 * the connection's pending ACK goes out at once (TCP_QUICKACK): a service
 * that writes its headers and its body in two writes with Nagle on (the
 * default; Python's http.server does) holds the body until the headers
 * are acknowledged, and Linux delays that ACK by up to 40 ms on a
 * request/response connection. That was ~45 of the ~50 ms per record at
 * webhook.max.inflight=1 (docs/design.md, "Order per key"). */
static size_t header_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    slot_t *s = userdata;
    size_t n = size * nmemb;
    if (n < 5 || memcmp(ptr, "HTTP/", 5) || !s->local_port)
        return n;
    idem_httpclient_t *c = s->client;
    for (size_t i = 0; i < c->sock_cnt; i++) {
        struct sock_s *k = &c->socks[i];
        if (!k->port) {
            struct sockaddr_storage a;
            socklen_t al = sizeof(a);
            if (getsockname(k->fd, (struct sockaddr *)&a, &al))
                continue;
            k->port = a.ss_family == AF_INET6
                          ? ntohs(((struct sockaddr_in6 *)&a)->sin6_port)
                          : ntohs(((struct sockaddr_in *)&a)->sin_port);
        }
        if (k->port == s->local_port) {
#ifdef TCP_QUICKACK
            int one = 1;
            (void)setsockopt(k->fd, IPPROTO_TCP, TCP_QUICKACK, &one,
                             sizeof(one));
#endif
            break;
        }
    }
    return n;
}

/* libcurl's socket callbacks (on the processing thread): the connections
 * it opens and closes, for header_cb to find a transfer's socket by its
 * local port (CURLINFO_ACTIVESOCKET says nothing during a transfer). */
static int sockopt_cb(void *clientp, curl_socket_t fd, curlsocktype purpose)
{
    idem_httpclient_t *c = clientp;
    if (purpose != CURLSOCKTYPE_IPCXN)
        return CURL_SOCKOPT_OK;
    if (c->sock_cnt == c->sock_cap) {
        c->sock_cap = c->sock_cap ? 2 * c->sock_cap : 16;
        c->socks = idem_xrealloc(c->socks, c->sock_cap * sizeof(*c->socks));
    }
    c->socks[c->sock_cnt].fd = fd;
    c->socks[c->sock_cnt++].port = 0;
    return CURL_SOCKOPT_OK;
}

static int closesocket_cb(void *clientp, curl_socket_t fd)
{
    idem_httpclient_t *c = clientp;
    for (size_t i = 0; i < c->sock_cnt; i++)
        if (c->socks[i].fd == fd) {
            c->socks[i] = c->socks[--c->sock_cnt];
            break;
        }
    return close(fd);
}

idem_httpclient_t *idem_httpclient_new(const idem_httpclient_conf_t *conf,
                                       char *errstr, size_t errstr_size)
{
    if (idem_httpclient_check(conf, errstr, errstr_size))
        return NULL;
    idem_httpclient_t *c = idem_xcalloc(1, sizeof(*c));
    c->multi = curl_multi_init();
    if (!c->multi) {
        free(c);
        err_set(errstr, errstr_size, "libcurl: curl_multi_init failed");
        return NULL;
    }
    c->url = idem_xstrdup(conf->url);
    size_t ctl = strlen(conf->content_type) + 16;
    c->content_type_hdr = idem_xmalloc(ctl);
    snprintf(c->content_type_hdr, ctl, "Content-Type: %s", conf->content_type);
    c->timeout_ms = conf->timeout_ms;
    c->ca_file =
        conf->ca_file && *conf->ca_file ? idem_xstrdup(conf->ca_file) : NULL;
    c->tls_verify = conf->tls_verify;
    if (for_each_line(conf->headers, append_line_cb, &c->base, errstr,
                      errstr_size)) {
        idem_httpclient_destroy(c);
        return NULL;
    }
    c->slot_cnt = (size_t)conf->max_inflight;
    c->slots = idem_xcalloc(c->slot_cnt, sizeof(*c->slots));
    c->free_slots = idem_xcalloc(c->slot_cnt, sizeof(*c->free_slots));
    c->done = idem_xcalloc(c->slot_cnt, sizeof(*c->done));
    for (size_t i = 0; i < c->slot_cnt; i++) {
        c->slots[i].client = c;
        c->free_slots[c->free_cnt++] = c->slot_cnt - 1 - i;
    }
    /* Every slot may hold its own connection; keep them all open. */
    curl_multi_setopt(c->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS,
                      (long)c->slot_cnt);
    curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)c->slot_cnt);
    return c;
}

void idem_httpclient_destroy(idem_httpclient_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->slot_cnt; i++) {
        slot_t *s = &c->slots[i];
        if (s->easy) {
            if (s->busy)
                curl_multi_remove_handle(c->multi, s->easy);
            curl_easy_cleanup(s->easy);
        }
        curl_slist_free_all(s->hdrs);
    }
    curl_multi_cleanup(c->multi); /* closes through closesocket_cb */
    free(c->socks);
    curl_slist_free_all(c->base);
    free(c->slots);
    free(c->free_slots);
    free(c->done);
    free(c->url);
    free(c->content_type_hdr);
    free(c->ca_file);
    free(c);
}

size_t idem_httpclient_room(const idem_httpclient_t *c)
{
    /* A finished, uncollected result holds a place in the done ring as
     * long as its slot is free: in flight + done never pass slot_cnt. */
    return c->free_cnt > c->done_cnt ? c->free_cnt - c->done_cnt : 0;
}

size_t idem_httpclient_pending(const idem_httpclient_t *c)
{
    return c->slot_cnt - c->free_cnt + c->done_cnt;
}

size_t idem_httpclient_running(const idem_httpclient_t *c)
{
    return c->slot_cnt - c->free_cnt;
}

/* Frees slot s (its request finished or was aborted). */
static void slot_release(idem_httpclient_t *c, slot_t *s)
{
    s->busy = 0;
    curl_slist_free_all(s->hdrs);
    s->hdrs = NULL;
    c->free_slots[c->free_cnt++] = (size_t)(s - c->slots);
}

size_t idem_httpclient_abort(idem_httpclient_t *c, uint64_t *tags)
{
    size_t n = 0;
    for (size_t i = 0; i < c->slot_cnt; i++) {
        slot_t *s = &c->slots[i];
        if (!s->busy)
            continue;
        curl_multi_remove_handle(c->multi, s->easy);
        slot_release(c, s);
        if (tags)
            tags[n] = s->tag;
        n++;
    }
    return n;
}

/* ------------------------------------------------------------ requests */

size_t idem_httpclient_key_encode(const void *key, size_t key_len, char *out,
                                  size_t out_size)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *k = key;
    size_t o = 0;
    for (size_t i = 0; i < key_len; i++) {
        unsigned char ch = k[i];
        int plain = ch > 0x20 && ch < 0x7f && ch != '%';
        size_t need = plain ? 1 : 3;
        if (o + need >= out_size)
            return (size_t)-1;
        if (plain) {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    if (o >= out_size)
        return (size_t)-1;
    out[o] = '\0';
    return o;
}

/* libcurl's pre-request callback: fires on the processing thread (inside
 * curl_multi_perform) each time the request is about to go out on a
 * connection, a resend on a fresh connection included. */
static int prereq_cb(void *clientp, char *conn_primary_ip, char *conn_local_ip,
                     int conn_primary_port, int conn_local_port)
{
    (void)conn_primary_ip;
    (void)conn_local_ip;
    (void)conn_primary_port;
    slot_t *s = clientp;
    s->attempts++;
    s->local_port = conn_local_port;
    return CURL_PREREQFUNC_OK;
}

/* Sets every option of one request on s->easy (reset first, so nothing of
 * the previous request survives). */
static int slot_prepare(idem_httpclient_t *c, slot_t *s, const void *body,
                        size_t body_len, char *errstr, size_t errstr_size)
{
    CURL *e = s->easy;
    curl_easy_reset(e);
    CURLcode rc = CURLE_OK;
#define SET(opt, val)                                                          \
    do {                                                                       \
        if (!rc)                                                               \
            rc = curl_easy_setopt(e, opt, val);                                \
    } while (0)
    SET(CURLOPT_URL, c->url);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_NOSIGNAL, 1L); /* no SIGALRM: other threads run here */
    SET(CURLOPT_TIMEOUT_MS, c->timeout_ms);
    SET(CURLOPT_CONNECTTIMEOUT_MS, c->timeout_ms);
    SET(CURLOPT_POST, 1L);
    SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    SET(CURLOPT_COPYPOSTFIELDS, body_len ? (const char *)body : "");
    SET(CURLOPT_HTTPHEADER, s->hdrs);
    SET(CURLOPT_WRITEFUNCTION, write_cb);
    SET(CURLOPT_WRITEDATA, s);
    SET(CURLOPT_HEADERFUNCTION, header_cb);
    SET(CURLOPT_HEADERDATA, s);
    SET(CURLOPT_SOCKOPTFUNCTION, sockopt_cb);
    SET(CURLOPT_SOCKOPTDATA, c);
    SET(CURLOPT_CLOSESOCKETFUNCTION, closesocket_cb);
    SET(CURLOPT_CLOSESOCKETDATA, c);
    SET(CURLOPT_ERRORBUFFER, s->error);
    SET(CURLOPT_PRIVATE, s);
    SET(CURLOPT_PREREQFUNCTION, prereq_cb);
    SET(CURLOPT_PREREQDATA, s);
    SET(CURLOPT_FOLLOWLOCATION, 0L);
    SET(CURLOPT_SSL_VERIFYPEER, c->tls_verify ? 1L : 0L);
    SET(CURLOPT_SSL_VERIFYHOST, c->tls_verify ? 2L : 0L);
    if (c->ca_file)
        SET(CURLOPT_CAINFO, c->ca_file);
#undef SET
    if (rc) {
        err_set(errstr, errstr_size, "libcurl: %s", curl_easy_strerror(rc));
        return -1;
    }
    return 0;
}

size_t idem_httpclient_header_line(const char *name, const void *value,
                                   size_t value_len, char *out, size_t out_size)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *v = value;
    size_t n = strlen(name), o = 0;
    if (out_size < n + 3)
        return (size_t)-1;
    size_t blank = 0;
    while (blank < value_len && (v[blank] == ' ' || v[blank] == '\t'))
        blank++;
    if (blank == value_len) { /* "Name: " would make libcurl leave it out */
        memcpy(out, name, n);
        out[n] = ';'; /* libcurl's way to send "Name:" with no value */
        out[n + 1] = '\0';
        return n + 1;
    }
    memcpy(out, name, n);
    out[n] = ':';
    out[n + 1] = ' ';
    o = n + 2;
    for (size_t i = 0; i < value_len; i++) {
        int keep = (v[i] >= 0x20 && v[i] < 0x7f && v[i] != '%') || v[i] == '\t';
        if (o + (keep ? 1 : 3) >= out_size)
            return (size_t)-1;
        if (keep) {
            out[o++] = (char)v[i];
        } else {
            out[o++] = '%';
            out[o++] = hex[v[i] >> 4];
            out[o++] = hex[v[i] & 15];
        }
    }
    out[o] = '\0';
    return o;
}

int idem_httpclient_submit(idem_httpclient_t *c, uint64_t tag, const void *key,
                           size_t key_len, const void *body, size_t body_len,
                           char *errstr, size_t errstr_size)
{
    return idem_httpclient_submit_hdrs(c, tag, key, key_len, body, body_len,
                                       NULL, 0, errstr, errstr_size);
}

int idem_httpclient_submit_hdrs(idem_httpclient_t *c, uint64_t tag,
                                const void *key, size_t key_len,
                                const void *body, size_t body_len,
                                const char *const *lines, size_t nlines,
                                char *errstr, size_t errstr_size)
{
    if (!idem_httpclient_room(c)) {
        err_set(errstr, errstr_size, "webhook: %zu requests in flight",
                c->slot_cnt);
        return -1;
    }
    size_t idx = c->free_slots[c->free_cnt - 1];
    slot_t *s = &c->slots[idx];
    if (!s->easy && !(s->easy = curl_easy_init())) {
        err_set(errstr, errstr_size, "libcurl: curl_easy_init failed");
        return -1;
    }
    /* Headers: configured ones, Content-Type, the key, and an empty
     * Expect so curl never waits for "100 Continue". */
    curl_slist_free_all(s->hdrs);
    s->hdrs = NULL;
    size_t klen = 3 * key_len + 1;
    char *line = idem_xmalloc(klen + sizeof("Idempotency-Key: "));
    memcpy(line, "Idempotency-Key: ", sizeof("Idempotency-Key: ") - 1);
    idem_httpclient_key_encode(key, key_len,
                               line + sizeof("Idempotency-Key: ") - 1, klen);
    struct curl_slist *head = NULL;
    for (struct curl_slist *b = c->base; b; b = b->next)
        head = slist_add(head, b->data);
    head = slist_add(head, c->content_type_hdr);
    head = slist_add(head, line);
    for (size_t i = 0; i < nlines; i++)
        head = slist_add(head, lines[i]);
    head = slist_add(head, "Expect:");
    free(line);
    s->hdrs = head;
    s->body_len = 0;
    s->body[0] = '\0';
    s->error[0] = '\0';
    if (slot_prepare(c, s, body, body_len, errstr, errstr_size))
        return -1;
    CURLMcode mc = curl_multi_add_handle(c->multi, s->easy);
    if (mc) {
        err_set(errstr, errstr_size, "libcurl: %s", curl_multi_strerror(mc));
        return -1;
    }
    s->tag = tag;
    s->attempts = 0;
    s->busy = 1;
    s->start_us = idem_now_us();
    c->free_cnt--;
    return 0;
}

static idem_http_result_kind_t kind_of(CURLcode rc)
{
    switch (rc) {
    case CURLE_OK:
        return IDEM_HTTP_RESPONSE;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
        return IDEM_HTTP_CONNECT;
    case CURLE_OPERATION_TIMEDOUT:
        return IDEM_HTTP_TIMEOUT;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
        return IDEM_HTTP_TLS;
    default:
        return IDEM_HTTP_ERROR;
    }
}

/* Moves every finished transfer into the done ring and frees its slot. */
static void harvest(idem_httpclient_t *c)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(c->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        CURL *e = msg->easy_handle;
        CURLcode rc = msg->data.result;
        slot_t *s = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&s);
        curl_multi_remove_handle(c->multi, e);
        idem_http_result_t *r =
            &c->done[(c->done_head + c->done_cnt) % c->slot_cnt];
        memset(r, 0, offsetof(idem_http_result_t, body));
        r->tag = s->tag;
        r->kind = kind_of(rc);
        r->retry_after_ms = -1;
        r->seconds = (double)(idem_now_us() - s->start_us) / 1e6;
        r->resent = s->attempts > 1 ? s->attempts - 1 : 0;
        if (r->kind == IDEM_HTTP_RESPONSE) {
            long status = 0;
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
            r->status = status;
            curl_off_t ra = -1;
            if (curl_easy_getinfo(e, CURLINFO_RETRY_AFTER, &ra) == CURLE_OK &&
                ra > 0)
                r->retry_after_ms = (int64_t)ra * 1000;
            r->error[0] = '\0';
        } else {
            long status = 0; /* a response cut short, or none */
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
            r->status = status;
            snprintf(r->error, sizeof(r->error), "%s",
                     s->error[0] ? s->error : curl_easy_strerror(rc));
        }
        r->body_len = s->body_len;
        memcpy(r->body, s->body, s->body_len + 1);
        c->done_cnt++;
        slot_release(c, s);
    }
}

int idem_httpclient_run(idem_httpclient_t *c, int wait_ms, char *errstr,
                        size_t errstr_size)
{
    int running = 0;
    CURLMcode mc = curl_multi_perform(c->multi, &running);
    if (!mc && running && wait_ms > 0) {
        mc = curl_multi_poll(c->multi, NULL, 0, wait_ms, NULL);
        if (!mc)
            mc = curl_multi_perform(c->multi, &running);
    }
    harvest(c);
    if (mc) {
        err_set(errstr, errstr_size, "libcurl: %s", curl_multi_strerror(mc));
        return -1;
    }
    return 0;
}

size_t idem_httpclient_collect(idem_httpclient_t *c, idem_http_result_t *out,
                               size_t max)
{
    size_t n = 0;
    for (; n < max && c->done_cnt; n++) {
        out[n] = c->done[c->done_head];
        c->done_head = (c->done_head + 1) % c->slot_cnt;
        c->done_cnt--;
    }
    return n;
}

/* ------------------------------------------------------------ verdicts */

const char *idem_httpclient_class(const idem_http_result_t *r)
{
    static const char *const classes[] = {"1xx", "2xx", "3xx", "4xx", "5xx"};
    switch (r->kind) {
    case IDEM_HTTP_RESPONSE:
        if (r->status >= 100 && r->status < 600)
            return classes[r->status / 100 - 1];
        return "error";
    case IDEM_HTTP_CONNECT:
        return "connect";
    case IDEM_HTTP_TIMEOUT:
        return "timeout";
    case IDEM_HTTP_TLS:
        return "tls";
    default:
        return "error";
    }
}

/* Appends the body to a reason, control characters as spaces. */
static void reason_with_body(const idem_http_result_t *r, char *reason,
                             size_t reason_size)
{
    int n = snprintf(reason, reason_size, "HTTP %ld", r->status);
    if (n < 0 || (size_t)n >= reason_size || !r->body_len)
        return;
    size_t o = (size_t)n;
    if (o + 2 < reason_size) {
        reason[o++] = ':';
        reason[o++] = ' ';
    }
    for (size_t i = 0; i < r->body_len && o + 1 < reason_size; i++) {
        unsigned char ch = (unsigned char)r->body[i];
        reason[o++] = ch < 0x20 || ch == 0x7f ? ' ' : (char)ch;
    }
    reason[o] = '\0';
}

idem_http_verdict_t idem_httpclient_classify(const idem_http_result_t *r,
                                             char *reason, size_t reason_size,
                                             int64_t *delay_ms)
{
    if (delay_ms)
        *delay_ms = -1;
    if (r->kind != IDEM_HTTP_RESPONSE) {
        snprintf(reason, reason_size, "%s: %s", idem_httpclient_class(r),
                 r->error);
        /* Nothing reached a service that answers: the service is down,
         * not this record's fault. A reset or an empty reply came from a
         * service that took the request: that request failed. */
        if (r->kind == IDEM_HTTP_CONNECT || r->kind == IDEM_HTTP_TLS ||
            (r->kind == IDEM_HTTP_TIMEOUT && r->status == 0))
            return IDEM_HTTP_OUTAGE;
        return IDEM_HTTP_RETRY;
    }
    long s = r->status;
    if (s >= 200 && s < 300) {
        if (reason_size)
            reason[0] = '\0';
        return IDEM_HTTP_DONE;
    }
    reason_with_body(r, reason, reason_size);
    if (s == 408 || s == 429 || (s >= 500 && s < 600)) {
        if (delay_ms && (s == 429 || s == 503) && r->retry_after_ms >= 0)
            *delay_ms = r->retry_after_ms;
        return IDEM_HTTP_RETRY;
    }
    return IDEM_HTTP_REJECT;
}
