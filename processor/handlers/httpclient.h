/* httpclient: many HTTP POSTs in flight at once from one thread (libcurl's
 * multi interface), for the webhook handler: submit, drive, collect. */
#ifndef IDEM_HTTPCLIENT_H
#define IDEM_HTTPCLIENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct idem_httpclient_s idem_httpclient_t;

#define IDEM_HTTPCLIENT_BODY_MAX 512 /* response bytes kept for dlq.error */

typedef struct {
    const char *url;          /* http:// or https://; borrowed during _new */
    const char *content_type; /* Content-Type of every request */
    const char *headers;      /* extra "Name: value" lines separated by
                                 newlines or a literal \n, or NULL */
    int timeout_ms;           /* whole request, connect included */
    int max_inflight;         /* requests (and connections) at once */
    const char *ca_file;      /* PEM bundle, NULL for the system's */
    int tls_verify;           /* 0 turns peer and host checks off */
} idem_httpclient_conf_t;

/* What became of a request: a response (any status), or an error that
 * kept one from arriving. */
typedef enum {
    IDEM_HTTP_RESPONSE = 0, /* status holds the HTTP status */
    IDEM_HTTP_CONNECT,      /* resolve/connect refused or failed */
    IDEM_HTTP_TIMEOUT,      /* webhook.timeout.ms passed */
    IDEM_HTTP_TLS,          /* handshake or certificate check failed */
    IDEM_HTTP_ERROR         /* anything else on the way (reset, ...) */
} idem_http_result_kind_t;

typedef struct {
    uint64_t tag; /* as given to _submit */
    idem_http_result_kind_t kind;
    long status;            /* HTTP status when kind == RESPONSE; else the
                               status of a response cut short, 0 when no
                               response began */
    int64_t retry_after_ms; /* Retry-After (seconds or date), -1 if none */
    double seconds;         /* submit to completion */
    int resent;             /* attempts libcurl made before the last one
                               (a reused connection that died without an
                               answer is tried again on a fresh one): the
                               service may have seen each */
    size_t body_len;        /* bytes kept in body (at most _BODY_MAX) */
    char body[IDEM_HTTPCLIENT_BODY_MAX + 1]; /* start of the response body,
                                                NUL-terminated */
    char error[256]; /* libcurl's words when kind != RESPONSE */
} idem_http_result_t;

/* Checks that conf can work (URL scheme and syntax, header lines, ranges)
 * without creating anything: for check-config. 0 or -1 (errstr). */
int idem_httpclient_check(const idem_httpclient_conf_t *conf, char *errstr,
                          size_t errstr_size);

/* A client with conf's settings (copied). NULL on a bad setting (errstr). */
idem_httpclient_t *idem_httpclient_new(const idem_httpclient_conf_t *conf,
                                       char *errstr, size_t errstr_size);
/* Aborts whatever is in flight (their results are lost) and frees c.
 * NULL is a no-op. */
void idem_httpclient_destroy(idem_httpclient_t *c);

/* Free request slots: how many more _submit calls succeed now. */
size_t idem_httpclient_room(const idem_httpclient_t *c);
/* Requests submitted whose result was not collected yet. */
size_t idem_httpclient_pending(const idem_httpclient_t *c);

/* Requests submitted and not finished yet (pending minus the finished,
 * uncollected ones). */
size_t idem_httpclient_running(const idem_httpclient_t *c);

/* Aborts every unfinished request (no result for them; finished ones stay
 * collectable). Their tags go to tags[] (may be NULL; room for the
 * client's max_inflight). Returns how many were aborted. */
size_t idem_httpclient_abort(idem_httpclient_t *c, uint64_t *tags);

/* Starts a POST of body (copied) with `Idempotency-Key: <key>` (key is
 * bytes with a length, encoded by idem_httpclient_key_encode). It runs
 * during _run. Returns 0, or -1 when there is no room or libcurl refused
 * (errstr). */
int idem_httpclient_submit(idem_httpclient_t *c, uint64_t tag, const void *key,
                           size_t key_len, const void *body, size_t body_len,
                           char *errstr, size_t errstr_size);

/* idem_httpclient_submit with more header lines for this request alone
 * ("Name: value", borrowed, copied; nlines may be 0). The caller makes
 * each line safe: no CR or LF (idem_httpclient_header_line). */
int idem_httpclient_submit_hdrs(idem_httpclient_t *c, uint64_t tag,
                                const void *key, size_t key_len,
                                const void *body, size_t body_len,
                                const char *const *lines, size_t nlines,
                                char *errstr, size_t errstr_size);

/* Writes "Name: value" into out (NUL-terminated) for a header taken from a
 * record: value bytes that are visible ASCII, space or tab are kept, any
 * other byte (CR, LF, NUL, non-ASCII) becomes %XX, so a record cannot add
 * a header line of its own. An empty (or blank) value is written "Name;",
 * which libcurl sends as "Name:" ("Name: " it would leave out). Returns
 * the length, or (size_t)-1 when out is
 * too small (it needs strlen(name) + 3 * value_len + 3 bytes). */
size_t idem_httpclient_header_line(const char *name, const void *value,
                                   size_t value_len, char *out,
                                   size_t out_size);

/* Moves the transfers along: waits at most wait_ms for network activity
 * (0: never blocks). Returns 0, or -1 when libcurl's multi handle fails
 * (errstr; in-flight requests are then lost, treat them as failed). */
int idem_httpclient_run(idem_httpclient_t *c, int wait_ms, char *errstr,
                        size_t errstr_size);

/* Copies up to max finished results into out (oldest first) and forgets
 * them. Returns how many. */
size_t idem_httpclient_collect(idem_httpclient_t *c, idem_http_result_t *out,
                               size_t max);

/* What the webhook makes of a result. */
typedef enum {
    IDEM_HTTP_DONE = 0, /* 2xx: the effect happened */
    IDEM_HTTP_RETRY,    /* 408, 429, 5xx, an exchange broken after it began
                           (reset, empty reply, a timeout after the status
                           line): the service failed this request */
    IDEM_HTTP_REJECT,   /* any other status: this record never succeeds */
    IDEM_HTTP_OUTAGE    /* the service cannot be reached: connection
                           refused, DNS, TLS handshake or certificate, no
                           response before webhook.timeout.ms */
} idem_http_verdict_t;

/* Classifies r; for RETRY, REJECT and OUTAGE writes a one-line reason
 * (status and the start of the body, or the error) to reason. *delay_ms
 * gets the server's Retry-After for 429 and 503 (-1 when none or not
 * honoured). */
idem_http_verdict_t idem_httpclient_classify(const idem_http_result_t *r,
                                             char *reason, size_t reason_size,
                                             int64_t *delay_ms);

/* "2xx" ... "5xx" for a response, else "connect", "timeout", "tls",
 * "error": the label of the webhook's response metric. */
const char *idem_httpclient_class(const idem_http_result_t *r);

/* Writes key as an Idempotency-Key header value into out (NUL-terminated)
 * and returns its length, or (size_t)-1 if out is too small. Visible
 * ASCII but '%' is kept; every other byte (space, controls, NUL, '%',
 * non-ASCII) becomes %XX, so distinct keys stay distinct. out needs at
 * most 3 * key_len + 1 bytes. */
size_t idem_httpclient_key_encode(const void *key, size_t key_len, char *out,
                                  size_t out_size);

#endif
