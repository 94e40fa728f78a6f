/* probe: a test plugin whose answer each record's value chooses, so the
 * tests can drive every path of idemproc's plugin adapter:
 *   "done"      DONE
 *   "retry:N"   RETRY after N ms
 *   "reject"    REJECT with the headers it saw as the detail
 *               ("h=<count> <name>:<len|null> ...")
 *   "outage"    OUTAGE
 *   "hold"      no result until drain, which abandons it
 *   "refuse"    submit refuses the whole batch (-1, "probe: refused")
 *   "status42"  a status the interface does not have
 *   anything else DONE
 * While the file plugin.outage.flag exists, every record is OUTAGE.
 * Results come back newest first (plugin.order=oldest: in submit order),
 * at most plugin.per.collect (2) per collect, so the host must map each to
 * its record. With
 * plugin.bogus=true, the first collect also reports a record pointer it
 * was never given. With plugin.room=N, room() is N minus the records in
 * flight (held or not collected); without it, room() says no limit. */
#define _POSIX_C_SOURCE 200809L

#include <idemproc/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const idemproc_key_t keys[] = {
    {"bogus", "false", 0, 0, "true: report a record never submitted once"},
    {"per.collect", "2", 0, 0, "results a collect returns at most"},
    {"order", "newest", 0, 0, "newest or oldest result first"},
    {"outage.flag", NULL, 0, 0, "while this file exists: OUTAGE for all"},
    {"room", NULL, 0, 0, "records it can start at once (default: any)"},
    {NULL, NULL, 0, 0, NULL},
};

typedef struct {
    int bogus;
    size_t per_collect;
    int oldest_first;
    char flag[512];       /* "" = none */
    idemproc_result_t *q; /* finished, not collected: q[q_head..q_cnt) */
    size_t q_head, q_cnt, q_cap;
    size_t held; /* "hold" records in flight */
    long room;   /* plugin.room, -1: no limit */
} probe_t;

static int is(const idemproc_record_t *r, const char *text)
{
    return r->value && r->value_len == strlen(text) &&
           !memcmp(r->value, text, r->value_len);
}

static void *probe_start(const idemproc_host_t *host, char *errstr,
                         size_t errstr_size)
{
    (void)errstr;
    (void)errstr_size;
    probe_t *p = calloc(1, sizeof(*p));
    const char *b = host->config(host->opaque, "bogus");
    p->bogus = b && !strcmp(b, "true");
    const char *pc = host->config(host->opaque, "per.collect");
    p->per_collect = pc ? (size_t)atoi(pc) : 2;
    const char *o = host->config(host->opaque, "order");
    p->oldest_first = o && !strcmp(o, "oldest");
    const char *f = host->config(host->opaque, "outage.flag");
    snprintf(p->flag, sizeof(p->flag), "%s", f ? f : "");
    const char *room = host->config(host->opaque, "room");
    p->room = room ? atol(room) : -1;
    host->log(host->opaque, IDEMPROC_LOG_DEBUG, "probe started");
    return p;
}

static void headers_detail(const idemproc_record_t *r, char *out, size_t size)
{
    size_t at = (size_t)snprintf(out, size, "h=%zu", r->header_cnt);
    for (size_t i = 0; i < r->header_cnt && at < size; i++) {
        const idemproc_header_t *h = &r->headers[i];
        if (h->value)
            at += (size_t)snprintf(out + at, size - at, " %s:%zu", h->name,
                                   h->value_len);
        else
            at += (size_t)snprintf(out + at, size - at, " %s:null", h->name);
    }
}

static int probe_submit(void *state, const idemproc_record_t *const *recs,
                        size_t n, char *errstr, size_t errstr_size)
{
    probe_t *p = state;
    for (size_t i = 0; i < n; i++)
        if (is(recs[i], "refuse")) {
            snprintf(errstr, errstr_size, "probe: refused");
            return -1;
        }
    if (p->q_cnt + n > p->q_cap) {
        p->q_cap = (p->q_cnt + n) * 2;
        p->q = realloc(p->q, p->q_cap * sizeof(*p->q));
        if (!p->q)
            abort();
    }
    for (size_t i = 0; i < n; i++) {
        const idemproc_record_t *r = recs[i];
        if (is(r, "hold")) {
            p->held++;
            continue;
        }
        idemproc_result_t *res = &p->q[p->q_cnt++];
        memset(res, 0, sizeof(*res));
        res->rec = r;
        if (*p->flag && access(p->flag, F_OK) == 0) {
            res->status = IDEMPROC_OUTAGE;
            snprintf(res->detail, sizeof(res->detail), "probe: flag %.400s",
                     p->flag);
        } else if (is(r, "status42")) {
            res->status = (idemproc_status_t)42; /* not a status */
        } else if (is(r, "reject")) {
            res->status = IDEMPROC_REJECT;
            headers_detail(r, res->detail, sizeof(res->detail));
        } else if (is(r, "outage")) {
            res->status = IDEMPROC_OUTAGE;
            snprintf(res->detail, sizeof(res->detail), "probe: down");
        } else if (r->value && r->value_len > 6 &&
                   !memcmp(r->value, "retry:", 6)) {
            res->status = IDEMPROC_RETRY;
            res->retry_after_ms = atoi((const char *)r->value + 6);
            snprintf(res->detail, sizeof(res->detail), "probe: later");
        } else {
            res->status = IDEMPROC_DONE;
        }
    }
    return 0;
}

static size_t probe_collect(void *state, idemproc_result_t *out, size_t max,
                            int timeout_ms)
{
    probe_t *p = state;
    (void)timeout_ms;
    size_t k = 0;
    if (p->bogus && max) {
        static const idemproc_record_t never;
        memset(&out[k], 0, sizeof(out[k]));
        out[k].rec = &never;
        out[k++].status = IDEMPROC_DONE;
        p->bogus = 0;
    }
    while (k < max && k < p->per_collect && p->q_head < p->q_cnt)
        out[k++] = p->oldest_first ? p->q[p->q_head++] : p->q[--p->q_cnt];
    if (p->q_head == p->q_cnt)
        p->q_head = p->q_cnt = 0;
    return k;
}

static void probe_drain(void *state, int timeout_ms)
{
    probe_t *p = state;
    (void)timeout_ms;
    p->held = 0; /* abandoned: the host must forget them */
}

static void probe_stop(void *state)
{
    probe_t *p = state;
    free(p->q);
    free(p);
}

static size_t probe_room(void *state)
{
    probe_t *p = state;
    if (p->room < 0)
        return (size_t)-1;
    size_t busy = p->held + (p->q_cnt - p->q_head);
    return (size_t)p->room > busy ? (size_t)p->room - busy : 0;
}

const idemproc_plugin_t idemproc_plugin = {
    .abi_version = IDEMPROC_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(idemproc_plugin_t),
    .name = "probe",
    .keys = keys,
    .validate = NULL,
    .start = probe_start,
    .submit = probe_submit,
    .collect = probe_collect,
    .drain = probe_drain,
    .stop = probe_stop,
    .room = probe_room,
};
