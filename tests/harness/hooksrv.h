/* hooksrv: a real HTTP server (libmicrohttpd) on 127.0.0.1 for the webhook
 * tests and the benchmark: answers POSTs with scripted statuses, delays and
 * Retry-After, and records what it received. */
#ifndef IDEM_HOOKSRV_H
#define IDEM_HOOKSRV_H

#include <stddef.h>

typedef struct th_hook_s th_hook_t;

typedef struct {
    int status;              /* HTTP status to answer; 0: close the
                                connection without an answer (counted and
                                recorded with status 0) */
    int delay_ms;            /* wait this long before answering */
    const char *retry_after; /* Retry-After value, or NULL (copied) */
    const char *body;        /* response body, or NULL (copied) */
} th_hook_reply_t;

/* One request as the server saw it (a copy; th_hook_requests_free). */
typedef struct {
    char *method;
    char *path;
    char *key;          /* Idempotency-Key, NULL when absent */
    char *content_type; /* NULL when absent */
    char *auth;         /* Authorization, NULL when absent */
    char *xtest;        /* X-Test, NULL when absent */
    char *headers;      /* every header, "Name: value\n" each, in order */
    char *body;         /* NUL-terminated copy */
    size_t body_len;
    int status; /* what the server answered */
} th_hook_req_t;

/* Starts the server on a free port of 127.0.0.1 (thread per connection,
 * so delays overlap) answering `dflt` to anything no rule matches.
 * record: 0 keeps only counts (for the benchmark). NULL on failure. */
th_hook_t *th_hook_start(th_hook_reply_t dflt, int record);
void th_hook_stop(th_hook_t *h); /* NULL is a no-op */

/* th_hook_start over HTTPS with a PEM certificate and key (borrowed, may
 * be freed after the call); the URL then starts https://. */
th_hook_t *th_hook_start_tls(th_hook_reply_t dflt, int record,
                             const char *cert_pem, const char *key_pem);

/* Plain HTTP only: down closes the listening socket (a connection is
 * refused, as for a service being deployed); up listens on the same port
 * again. Scripts, rules and what was recorded stay. up: 0, or -1 when the
 * port could not be bound again within 5 s. */
void th_hook_down(th_hook_t *h);
int th_hook_up(th_hook_t *h);

int th_hook_port(const th_hook_t *h);
/* "http://127.0.0.1:PORT/hook" (borrowed, lives as long as h). */
const char *th_hook_url(const th_hook_t *h);

/* Changes the default reply (e.g. to 503 for an outage, then back). */
void th_hook_set_default(th_hook_t *h, th_hook_reply_t dflt);

/* Queues a reply for the next request whose Idempotency-Key is key;
 * queued replies of a key are used in order, then the rules/default. */
void th_hook_script(th_hook_t *h, const char *key, th_hook_reply_t reply);

/* Every request whose body contains needle gets reply (after the key
 * scripts, before the default; first matching rule wins). */
void th_hook_rule_body(th_hook_t *h, const char *needle, th_hook_reply_t reply);

/* Calls fn(key, opaque) on the server's thread as each request arrives
 * (its body read, before any delay), key being its Idempotency-Key or
 * NULL; fn must be thread-safe (requests arrive in parallel). NULL fn:
 * none. Set it before requests come. */
void th_hook_on_arrival(th_hook_t *h, void (*fn)(const char *key, void *opaque),
                        void *opaque);

/* Requests answered so far; and those answered 2xx. */
size_t th_hook_count(th_hook_t *h);
size_t th_hook_count_2xx(th_hook_t *h);

/* Requests with Idempotency-Key key (recording servers only); acked: only
 * those answered 2xx. */
size_t th_hook_count_key(th_hook_t *h, const char *key, int acked);

/* Distinct Idempotency-Keys starting with prefix that were answered 2xx at
 * least once (recording servers only); *acks (may be NULL) gets the number
 * of 2xx answers to them, repeats included. */
size_t th_hook_keys_acked(th_hook_t *h, const char *prefix, size_t *acks);

/* A copy of every recorded request, in the order answered; *n gets the
 * count. Free with th_hook_requests_free. */
th_hook_req_t *th_hook_requests(th_hook_t *h, size_t *n);
void th_hook_requests_free(th_hook_req_t *reqs, size_t n);

#endif
