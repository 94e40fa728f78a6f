/* webhook: handler=webhook, an at-least-once HTTP effect: POSTs each new
 * record's value to webhook.url with `Idempotency-Key: <identity>`, many
 * requests in flight at once (httpclient, libcurl multi). The loop claims
 * each record with a lease first and marks it done after a 2xx, so a
 * crash repeats a request at worst; the key lets the service drop that
 * repeat. A service that cannot be reached, or fails most requests, is an
 * outage (the member pauses, nothing is dead-lettered); only a record it
 * keeps refusing while others pass spends its retries (breaker.h). */
#include "effect/handler.h"
#include "handlers/breaker.h"
#include "handlers/httpclient.h"
#include "base/log.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const idem_conf_key_t webhook_keys[] = {
    {.name = "webhook.url",
     .type = IDEM_KEY_STR,
     .required = 1,
     .doc = "the http:// or https:// URL each record's value is "
            "POSTed to"},
    {.name = "webhook.content.type",
     .type = IDEM_KEY_STR,
     .def = "application/json",
     .doc = "Content-Type of the requests"},
    {.name = "webhook.headers",
     .type = IDEM_KEY_STR,
     .secret = 1,
     .doc = "more request headers, \"Name: value\" separated by "
            "newlines or \\n (tokens: use webhook.headers.file)"},
    {.name = "webhook.forward.headers",
     .type = IDEM_KEY_STR,
     .doc = "record headers passed on as request headers, a comma list of "
            "names (e.g. traceparent,tracestate); X-Kafka-Topic, "
            "-Partition, -Offset and -Key are always sent"},
    {.name = "webhook.timeout.ms",
     .type = IDEM_KEY_INT,
     .def = "10000",
     .min = 1,
     .max = 600000,
     .doc = "a request's whole time, connect included; then it is "
            "retried"},
    {.name = "webhook.max.inflight",
     .type = IDEM_KEY_INT,
     .def = "64",
     .min = 1,
     .max = 10000,
     .doc = "requests (and connections) in flight at once"},
    {.name = "webhook.ca.file",
     .type = IDEM_KEY_STR,
     .doc = "CA certificates (PEM) to verify the service with "
            "(default: the system's)"},
    {.name = "webhook.tls.verify",
     .type = IDEM_KEY_ENUM,
     .def = "true",
     .enums = {"false", "true"},
     .doc = "verify the service's certificate and host name"},
    {.name = NULL},
};

typedef struct {
    idem_httpclient_t *http;
    idem_metrics_t *metrics;
    idem_record_t **queue; /* submitted, waiting for a free slot: a ring */
    size_t qhead, qcnt, qcap;
    idem_result_t *ready; /* results made without a request (refusals) */
    size_t ready_cnt, ready_cap;
    idem_http_result_t *scratch; /* collect's buffer, max.inflight long */
    size_t scratch_cap;
    uint64_t *aborted;      /* tags of aborted requests, max.inflight long */
    idem_breaker_t breaker; /* the service as a whole: outage or not */
    char **fwd;             /* webhook.forward.headers, split */
    size_t fwd_cnt;
} webhook_t;

#define FWD_MAX 16 /* names in webhook.forward.headers */

/* Whether name[0..n) is a header idemproc sends itself (Idempotency-Key,
 * Content-Type, Expect, X-Kafka-*) or one that frames the request
 * (Content-Length, Transfer-Encoding, Host, Connection, ...): a record's
 * value would change what the service dedups on, or cut the body. */
static int fwd_reserved(const char *name, size_t n)
{
    static const char *const reserved[] = {
        "Idempotency-Key",
        "Content-Type",
        "Content-Length",
        "Transfer-Encoding",
        "Host",
        "Connection",
        "Expect",
        "Te",
        "Trailer",
        "Upgrade",
        "Keep-Alive",
        "Proxy-Connection",
        "Content-Encoding",
    };
    if (n >= 8 && !strncasecmp(name, "X-Kafka-", 8))
        return 1;
    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
        if (strlen(reserved[i]) == n && !strncasecmp(name, reserved[i], n))
            return 1;
    return 0;
}

/* Splits webhook.forward.headers (NULL or "": none) into *out (caller
 * frees each and the array). Returns 0, or -1 with errstr for a name that
 * is not an HTTP token (RFC 9110) or one too many. */
static int fwd_parse(const char *list, char ***out, size_t *cnt, char *errstr,
                     size_t errstr_size)
{
    *out = NULL;
    *cnt = 0;
    for (const char *p = list; p && *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t n = strcspn(p, ", ");
        if (!n)
            break;
        for (size_t i = 0; i < n; i++)
            if (!strchr("!#$%&'*+-.^_`|~", p[i]) &&
                !(p[i] >= '0' && p[i] <= '9') &&
                !((p[i] | 0x20) >= 'a' && (p[i] | 0x20) <= 'z')) {
                snprintf(errstr, errstr_size,
                         "webhook.forward.headers: \"%.*s\" is not a header "
                         "name",
                         (int)n, p);
                goto fail;
            }
        if (fwd_reserved(p, n)) {
            snprintf(errstr, errstr_size,
                     "webhook.forward.headers: \"%.*s\" is set by idemproc "
                     "or by HTTP itself, not by a record",
                     (int)n, p);
            goto fail;
        }
        if (*cnt == FWD_MAX) {
            snprintf(errstr, errstr_size,
                     "webhook.forward.headers: more than %d names", FWD_MAX);
            goto fail;
        }
        *out = idem_xrealloc(*out, (*cnt + 1) * sizeof(**out));
        char *name = idem_xmalloc(n + 1);
        memcpy(name, p, n);
        name[n] = '\0';
        (*out)[(*cnt)++] = name;
        p += n;
    }
    return 0;
fail:
    for (size_t i = 0; i < *cnt; i++)
        free((*out)[i]);
    free(*out);
    *out = NULL;
    *cnt = 0;
    return -1;
}

static void conf_from(const idem_conf_t *conf, idem_httpclient_conf_t *c)
{
    c->url = idem_conf_str(conf, "webhook.url");
    c->content_type = idem_conf_str(conf, "webhook.content.type");
    c->headers = idem_conf_str(conf, "webhook.headers");
    c->timeout_ms = (int)idem_conf_int(conf, "webhook.timeout.ms");
    c->max_inflight = (int)idem_conf_int(conf, "webhook.max.inflight");
    c->ca_file = idem_conf_str(conf, "webhook.ca.file");
    c->tls_verify = (int)idem_conf_int(conf, "webhook.tls.verify");
}

static int webhook_validate(const idem_conf_t *conf, const char *arg,
                            char *errstr, size_t errstr_size)
{
    (void)arg;
    idem_httpclient_conf_t c;
    conf_from(conf, &c);
    char **fwd;
    size_t fwd_cnt;
    if (fwd_parse(idem_conf_str(conf, "webhook.forward.headers"), &fwd,
                  &fwd_cnt, errstr, errstr_size))
        return -1;
    for (size_t i = 0; i < fwd_cnt; i++)
        free(fwd[i]);
    free(fwd);
    return idem_httpclient_check(&c, errstr, errstr_size);
}

static void *webhook_start(const idem_handler_ctx_t *ctx, char *errstr,
                           size_t errstr_size)
{
    idem_httpclient_conf_t c;
    conf_from(ctx->conf, &c);
    idem_httpclient_t *http = idem_httpclient_new(&c, errstr, errstr_size);
    if (!http)
        return NULL;
    webhook_t *w = idem_xcalloc(1, sizeof(*w));
    if (fwd_parse(idem_conf_str(ctx->conf, "webhook.forward.headers"), &w->fwd,
                  &w->fwd_cnt, errstr, errstr_size)) {
        idem_httpclient_destroy(http);
        free(w);
        return NULL;
    }
    w->http = http;
    w->metrics = ctx->metrics;
    w->scratch_cap = (size_t)c.max_inflight;
    w->scratch = idem_xcalloc(w->scratch_cap, sizeof(*w->scratch));
    w->aborted = idem_xcalloc(w->scratch_cap, sizeof(*w->aborted));
    idem_breaker_init(&w->breaker);
    if (w->metrics)
        idem_metrics_webhook_enable(w->metrics);
    if (!c.tls_verify)
        idem_log_kv(IDEM_LOG_WARN,
                    "webhook.tls.verify=false: the service's certificate is "
                    "not checked",
                    "url", c.url, NULL);
    return w;
}

static void queue_push(webhook_t *w, idem_record_t *r)
{
    if (w->qcnt == w->qcap) {
        size_t cap = w->qcap ? 2 * w->qcap : 256;
        idem_record_t **q = idem_xmalloc(cap * sizeof(*q));
        for (size_t i = 0; i < w->qcnt; i++)
            q[i] = w->queue[(w->qhead + i) % w->qcap];
        free(w->queue);
        w->queue = q;
        w->qcap = cap;
        w->qhead = 0;
    }
    w->queue[(w->qhead + w->qcnt) % w->qcap] = r;
    w->qcnt++;
}

static idem_result_t *ready_add(webhook_t *w)
{
    if (w->ready_cnt == w->ready_cap) {
        w->ready_cap = w->ready_cap ? 2 * w->ready_cap : 16;
        w->ready = idem_xrealloc(w->ready, w->ready_cap * sizeof(*w->ready));
    }
    return &w->ready[w->ready_cnt++];
}

/* Submits r's request with its own headers: where it comes from
 * (X-Kafka-Topic, -Partition, -Offset, -Key when it has one) and the
 * record headers webhook.forward.headers names (the last value of each;
 * absent ones are left out). Bytes that could break a header line are
 * %XX-encoded. */
static int submit_record(webhook_t *w, idem_record_t *r, char *err,
                         size_t err_size)
{
    char *lines[4 + FWD_MAX];
    size_t n = 0;
    char num[32];
    size_t cap;
    lines[n] = idem_xmalloc(cap = strlen(r->topic) * 3 + 32);
    idem_httpclient_header_line("X-Kafka-Topic", r->topic, strlen(r->topic),
                                lines[n++], cap);
    snprintf(num, sizeof(num), "%" PRId32, r->partition);
    lines[n] = idem_xmalloc(64);
    idem_httpclient_header_line("X-Kafka-Partition", num, strlen(num),
                                lines[n++], 64);
    snprintf(num, sizeof(num), "%" PRId64, r->offset);
    lines[n] = idem_xmalloc(64);
    idem_httpclient_header_line("X-Kafka-Offset", num, strlen(num), lines[n++],
                                64);
    if (r->key) {
        lines[n] = idem_xmalloc(cap = r->key_len * 3 + 32);
        idem_httpclient_header_line("X-Kafka-Key", r->key, r->key_len,
                                    lines[n++], cap);
    }
    for (size_t i = 0; i < w->fwd_cnt && r->headers; i++) {
        const void *v;
        size_t vlen;
        if (rd_kafka_header_get_last(r->headers, w->fwd[i], &v, &vlen) || !v)
            continue;
        lines[n] = idem_xmalloc(cap = strlen(w->fwd[i]) + 3 * vlen + 3);
        idem_httpclient_header_line(w->fwd[i], v, vlen, lines[n++], cap);
    }
    int rc = idem_httpclient_submit_hdrs(
        w->http, (uint64_t)(uintptr_t)r, r->identity, r->identity_len, r->value,
        r->value ? r->value_len : 0, (const char *const *)lines, n, err,
        err_size);
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    return rc;
}

/* Starts queued records while there are free slots and the breaker lets
 * them go, in submit order (so a partition's requests leave in offset
 * order). A request libcurl refuses gets a RETRY result; while the breaker
 * is open, every queued record gets an OUTAGE result at once (the loop
 * pauses and offers it again after its backoff). */
static void pump(webhook_t *w)
{
    char err[256];
    int64_t now = idem_now_ms();
    size_t allowed = idem_breaker_room(&w->breaker, now);
    while (w->qcnt && (!allowed || idem_httpclient_room(w->http))) {
        idem_record_t *r = w->queue[w->qhead];
        w->qhead = (w->qhead + 1) % w->qcap;
        w->qcnt--;
        if (!allowed) {
            idem_result_set(ready_add(w), r, IDEM_RESULT_OUTAGE,
                            "webhook: service unavailable, retrying in %lld "
                            "ms: %.500s",
                            (long long)(w->breaker.open_until_ms - now),
                            idem_breaker_reason(&w->breaker));
            continue;
        }
        if (submit_record(w, r, err, sizeof(err))) {
            idem_result_set(ready_add(w), r, IDEM_RESULT_RETRY, "%s", err);
            continue;
        }
        idem_breaker_started(&w->breaker);
        if (allowed != SIZE_MAX && !--allowed)
            break; /* the probes are out */
    }
}

/* libcurl's multi handle failed (out of memory, a broken socket set): the
 * requests in flight will never finish. Each gets a RETRY result, so the
 * loop tries its record again (its lease is still ours). */
static void transfers_failed(webhook_t *w, const char *err)
{
    idem_log_kv(IDEM_LOG_ERROR, "webhook: transfers failed", "error", err,
                NULL);
    size_t n = idem_httpclient_abort(w->http, w->aborted);
    for (size_t i = 0; i < n; i++)
        idem_result_set(ready_add(w), (idem_record_t *)(uintptr_t)w->aborted[i],
                        IDEM_RESULT_RETRY, "%s", err);
}

static int webhook_submit(void *h, idem_record_t *const *recs, size_t n,
                          const idem_store_pos_t *pos, size_t npos,
                          char *errstr, size_t errstr_size)
{
    (void)pos;
    (void)npos;
    (void)errstr;
    (void)errstr_size;
    webhook_t *w = h;
    for (size_t i = 0; i < n; i++)
        queue_push(w, recs[i]);
    pump(w);
    /* Send them now, not at the next collect: the loop may wait for
     * Kafka in between. */
    char err[256];
    if (idem_httpclient_run(w->http, 0, err, sizeof(err)))
        transfers_failed(w, err);
    return 0;
}

/* One finished request as the loop's result. */
static void result_of(webhook_t *w, const idem_http_result_t *hr,
                      idem_result_t *out)
{
    idem_record_t *r = (idem_record_t *)(uintptr_t)hr->tag;
    if (w->metrics) {
        /* Every attempt the service may have seen is counted. */
        for (int i = 0; i < hr->resent; i++)
            idem_metrics_webhook_request_add(w->metrics, "resent");
        idem_metrics_webhook_request_add(w->metrics, idem_httpclient_class(hr));
        idem_metrics_webhook_latency_observe(w->metrics, hr->seconds);
    }
    char why[IDEM_RESULT_DETAIL_MAX - 64];
    uint64_t who = idem_breaker_record_id(r->identity, r->identity_len);
    int64_t delay = -1;
    int64_t now = idem_now_ms();
    switch (idem_httpclient_classify(hr, why, sizeof(why), &delay)) {
    case IDEM_HTTP_DONE:
        idem_breaker_result(&w->breaker, who, 0, NULL, -1, now);
        idem_result_set(out, r, IDEM_RESULT_DONE, NULL);
        break;
    case IDEM_HTTP_REJECT: /* the service meant it: it works */
        idem_breaker_result(&w->breaker, who, 0, NULL, -1, now);
        idem_result_set(out, r, IDEM_RESULT_REJECT, "%s", why);
        break;
    case IDEM_HTTP_OUTAGE:
        idem_breaker_trip(&w->breaker, why, -1, now);
        idem_result_set(out, r, IDEM_RESULT_OUTAGE,
                        "webhook: service unreachable: %s", why);
        break;
    case IDEM_HTTP_RETRY:
        if (idem_breaker_result(&w->breaker, who, 1, why, delay, now)) {
            /* Most requests fail: the service, not this record. */
            idem_result_set(out, r, IDEM_RESULT_OUTAGE,
                            "webhook: service failing: %s",
                            idem_breaker_reason(&w->breaker));
            break;
        }
        idem_result_set(out, r, IDEM_RESULT_RETRY, "%s", why);
        /* A date far ahead must not hold a partition for days. */
        if (delay > IDEM_BREAKER_RETRY_AFTER_MAX_MS)
            delay = IDEM_BREAKER_RETRY_AFTER_MAX_MS;
        out->retry_after_ms = delay > 0 ? delay : 0;
        break;
    }
}

static size_t webhook_collect(void *h, idem_result_t *out, size_t max,
                              int timeout_ms)
{
    webhook_t *w = h;
    size_t n = 0;
    for (; n < max && w->ready_cnt; n++)
        out[n] = w->ready[--w->ready_cnt];
    char err[256];
    int wait = n ? 0 : timeout_ms;
    for (int turn = 0; turn < 2 && n < max; turn++) {
        pump(w);
        if (!idem_httpclient_pending(w->http))
            break;
        if (idem_httpclient_run(w->http, wait, err, sizeof(err)))
            transfers_failed(w, err);
        size_t room = max - n;
        if (room > w->scratch_cap)
            room = w->scratch_cap;
        size_t got = idem_httpclient_collect(w->http, w->scratch, room);
        for (size_t i = 0; i < got; i++)
            result_of(w, &w->scratch[i], &out[n++]);
        if (!got)
            break;
        wait = 0; /* slots were freed: start the queue, then return */
    }
    pump(w);
    return n;
}

static size_t webhook_inflight(void *h)
{
    webhook_t *w = h;
    return w->qcnt + idem_httpclient_pending(w->http) + w->ready_cnt;
}

/* Free request slots not yet promised to a queued record, as many as the
 * breaker lets go (its probes while half-open): what the loop may claim
 * and submit now (handler.h, room). While the breaker is open, one: its
 * OUTAGE result keeps the loop paused and not ready until the service is
 * probed again. */
static size_t webhook_room(void *h)
{
    webhook_t *w = h;
    size_t free_slots = idem_httpclient_room(w->http);
    size_t room = free_slots > w->qcnt ? free_slots - w->qcnt : 0;
    size_t allowed = idem_breaker_room(&w->breaker, idem_now_ms());
    if (!allowed)
        return room && !w->ready_cnt ? 1 : 0;
    return room < allowed ? room : allowed;
}

static void webhook_drain(void *h, int64_t deadline_ms)
{
    webhook_t *w = h;
    /* Not yet sent: abandoned now (their leases expire, unmarked). */
    w->qcnt = 0;
    char err[256];
    while (idem_httpclient_running(w->http)) {
        int64_t left = deadline_ms - idem_now_ms();
        if (left <= 0)
            break;
        if (idem_httpclient_run(w->http, left < 100 ? (int)left : 100, err,
                                sizeof(err)))
            break;
    }
    size_t dropped = idem_httpclient_abort(w->http, NULL);
    if (dropped)
        idem_log(IDEM_LOG_WARN,
                 "webhook: %zu requests abandoned at the drain deadline; "
                 "their records are not marked and will be sent again",
                 dropped);
}

static void webhook_stop(void *h)
{
    webhook_t *w = h;
    if (!w)
        return;
    idem_httpclient_destroy(w->http);
    free(w->queue);
    free(w->ready);
    free(w->scratch);
    free(w->aborted);
    for (size_t i = 0; i < w->fwd_cnt; i++)
        free(w->fwd[i]);
    free(w->fwd);
    free(w);
}

const idem_handler_ops_t idem_handler_webhook = {
    .api_version = IDEM_HANDLER_API_VERSION,
    .name = "webhook",
    .effect = IDEM_EFFECT_EXTERNAL,
    .doc = "POST each new record's value to webhook.url with an "
           "Idempotency-Key header (at least once)",
    .keys = webhook_keys,
    .validate = webhook_validate,
    .start = webhook_start,
    .submit = webhook_submit,
    .collect = webhook_collect,
    .inflight = webhook_inflight,
    .room = webhook_room,
    .drain = webhook_drain,
    .stop = webhook_stop,
};
