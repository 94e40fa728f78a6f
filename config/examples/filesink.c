/* filesink: an example idemproc handler plugin. It appends one line per new
 * record to a file, "<identity> TAB <value> LF", and reports a record done
 * only once its line is on disk (fsync), so a record marked done in Redis
 * always has its line.
 *
 * Build (what `make` does):
 *   cc -std=c11 -O2 -fPIC -shared -Wl,--no-undefined \
 *      -I processor/include -o filesink.so config/examples/filesink.c
 * Run:
 *   handler=plugin:build/plugins/filesink.so
 *   plugin.output=/var/lib/events/payments.tsv
 *
 * What it shows: the table a plugin exports, its keys, validate/start/
 * submit/collect/drain/stop, and all four results: DONE (line written),
 * REJECT (a value or identity that cannot be one line: dead-lettered as
 * handler-rejected), RETRY (plugin.max.value.bytes exceeded while
 * plugin.oversize=retry, for the test of that path) and OUTAGE (the file
 * cannot be written: input pauses until it can).
 *
 * Delivery is at least once: a processor killed after the write and before
 * idemproc's done mark writes the line again after the restart, so whoever
 * reads the file keeps the first line of each identity. This plugin depends
 * on nothing but libc and idemproc/plugin.h. */
#define _POSIX_C_SOURCE 200809L

#include <idemproc/plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* plugin.output etc.: names without "plugin." (the host adds it). */
static const idemproc_key_t keys[] = {
    {"output", NULL, 0, 1, "the file lines are appended to (created 0644)"},
    {"fsync", "true", 0, 0,
     "true: a record is done only after fsync(2) of its line"},
    {"max.value.bytes", "65536", 0, 0,
     "longer values are refused (see plugin.oversize)"},
    {"oversize", "reject", 0, 0,
     "reject (dead letter at once) or retry (retry.max.attempts, then "
     "max-retries) for a value over plugin.max.value.bytes"},
    {NULL, NULL, 0, 0, NULL},
};

typedef struct {
    const idemproc_host_t *host;
    int fd;
    int fsync;
    size_t max_value;
    int oversize_retry;
    idemproc_result_t *done; /* results of submit, until collected */
    size_t done_cnt, done_cap, done_head;
    char *buf; /* the lines of one submit */
    size_t buf_len, buf_cap;
} sink_t;

/* A key's value; "" when unset. */
static const char *cfg(const idemproc_host_t *host, const char *name)
{
    const char *v = host->config(host->opaque, name);
    return v ? v : "";
}

/* Parses the keys; 0, or -1 with errstr naming the key. */
static int read_keys(const idemproc_host_t *host, int *fsync_on,
                     size_t *max_value, int *oversize_retry, char *errstr,
                     size_t errstr_size)
{
    const char *f = cfg(host, "fsync");
    if (!strcmp(f, "true") || !strcmp(f, "false")) {
        *fsync_on = !strcmp(f, "true");
    } else {
        snprintf(errstr, errstr_size,
                 "plugin.fsync: \"%s\" is not true or false", f);
        return -1;
    }
    const char *m = cfg(host, "max.value.bytes");
    char *end;
    errno = 0;
    unsigned long long v = strtoull(m, &end, 10);
    if (errno || end == m || *end || v == 0 || m[0] == '-') {
        snprintf(errstr, errstr_size,
                 "plugin.max.value.bytes: \"%s\" is not a positive number", m);
        return -1;
    }
    *max_value = (size_t)v;
    const char *o = cfg(host, "oversize");
    if (!strcmp(o, "reject") || !strcmp(o, "retry")) {
        *oversize_retry = !strcmp(o, "retry");
    } else {
        snprintf(errstr, errstr_size,
                 "plugin.oversize: \"%s\" is not reject or retry", o);
        return -1;
    }
    return 0;
}

static int sink_validate(const idemproc_host_t *host, char *errstr,
                         size_t errstr_size)
{
    int f, r;
    size_t m;
    if (read_keys(host, &f, &m, &r, errstr, errstr_size))
        return -1;
    if (!*cfg(host, "output")) {
        snprintf(errstr, errstr_size, "plugin.output: empty");
        return -1;
    }
    return 0;
}

static void *sink_start(const idemproc_host_t *host, char *errstr,
                        size_t errstr_size)
{
    sink_t *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    s->host = host;
    if (read_keys(host, &s->fsync, &s->max_value, &s->oversize_retry, errstr,
                  errstr_size)) {
        free(s);
        return NULL;
    }
    const char *file = cfg(host, "output");
    s->fd = open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (s->fd < 0) {
        snprintf(errstr, errstr_size, "plugin.output: %s: %s", file,
                 strerror(errno));
        free(s);
        return NULL;
    }
    char msg[600];
    snprintf(msg, sizeof(msg), "filesink: appending to %s (fsync %s)", file,
             s->fsync ? "on" : "off");
    host->log(host->opaque, IDEMPROC_LOG_INFO, msg);
    return s;
}

/* A free result slot at the end of the queue (grows it). NULL when out of
 * memory. */
static idemproc_result_t *result_add(sink_t *s, const idemproc_record_t *rec,
                                     idemproc_status_t status,
                                     const char *detail)
{
    if (s->done_cnt == s->done_cap) {
        size_t cap = s->done_cap ? s->done_cap * 2 : 64;
        idemproc_result_t *d = realloc(s->done, cap * sizeof(*d));
        if (!d)
            return NULL;
        s->done = d;
        s->done_cap = cap;
    }
    idemproc_result_t *r = &s->done[s->done_cnt++];
    memset(r, 0, sizeof(*r));
    r->rec = rec;
    r->status = status;
    if (detail)
        snprintf(r->detail, sizeof(r->detail), "%s", detail);
    return r;
}

static int buf_add(sink_t *s, const void *p, size_t n)
{
    if (s->buf_len + n > s->buf_cap) {
        size_t cap = (s->buf_len + n) * 2;
        char *b = realloc(s->buf, cap);
        if (!b)
            return -1;
        s->buf = b;
        s->buf_cap = cap;
    }
    memcpy(s->buf + s->buf_len, p, n);
    s->buf_len += n;
    return 0;
}

/* Why rec cannot be one line, or NULL when it can. */
static const char *line_problem(const idemproc_record_t *rec)
{
    if (memchr(rec->identity, '\n', rec->identity_len) ||
        memchr(rec->identity, '\t', rec->identity_len))
        return "filesink: the identity holds a tab or a newline";
    if (rec->value && memchr(rec->value, '\n', rec->value_len))
        return "filesink: the value holds a newline (one line per record)";
    return NULL;
}

/* Writes all of buf; 0 or errno. */
static int write_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t w = write(fd, buf, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Synchronous: every record's result is ready when submit returns. The
 * lines of one submit go out in one write and one fsync, in submit order
 * (which keeps each partition's order). */
static int sink_submit(void *state, const idemproc_record_t *const *recs,
                       size_t n, char *errstr, size_t errstr_size)
{
    sink_t *s = state;
    /* Room for every result first, so no record is left without one. */
    if (s->done_cnt + n > s->done_cap) {
        idemproc_result_t *d = realloc(s->done, (s->done_cnt + n) * sizeof(*d));
        if (!d) {
            snprintf(errstr, errstr_size, "out of memory");
            return -1;
        }
        s->done = d;
        s->done_cap = s->done_cnt + n;
    }
    size_t first = s->done_cnt;
    s->buf_len = 0;
    for (size_t i = 0; i < n; i++) {
        const idemproc_record_t *rec = recs[i];
        const char *problem = line_problem(rec);
        if (problem) {
            result_add(s, rec, IDEMPROC_REJECT, problem);
            continue;
        }
        if (rec->value_len > s->max_value) {
            char why[160];
            snprintf(why, sizeof(why),
                     "filesink: value of %zu bytes is over "
                     "plugin.max.value.bytes (%zu)",
                     rec->value_len, s->max_value);
            result_add(s, rec,
                       s->oversize_retry ? IDEMPROC_RETRY : IDEMPROC_REJECT,
                       why);
            continue;
        }
        if (buf_add(s, rec->identity, rec->identity_len) ||
            buf_add(s, "\t", 1) ||
            (rec->value_len && buf_add(s, rec->value, rec->value_len)) ||
            buf_add(s, "\n", 1)) {
            s->done_cnt = first;
            snprintf(errstr, errstr_size, "out of memory");
            return -1;
        }
        result_add(s, rec, IDEMPROC_DONE, NULL);
    }
    int err = s->buf_len ? write_all(s->fd, s->buf, s->buf_len) : 0;
    if (!err && s->buf_len && s->fsync && fsync(s->fd))
        err = errno;
    if (err) {
        /* Lines may be half written: they are written again (at least
         * once); the file reader keeps the first of each identity. */
        for (size_t i = first; i < s->done_cnt; i++)
            if (s->done[i].status == IDEMPROC_DONE) {
                s->done[i].status = IDEMPROC_OUTAGE;
                snprintf(s->done[i].detail, sizeof(s->done[i].detail),
                         "filesink: write: %s", strerror(err));
            }
    }
    return 0;
}

static size_t sink_collect(void *state, idemproc_result_t *out, size_t max,
                           int timeout_ms)
{
    sink_t *s = state;
    (void)timeout_ms; /* results are ready when submit returns */
    size_t k = 0;
    while (k < max && s->done_head < s->done_cnt)
        out[k++] = s->done[s->done_head++];
    if (s->done_head == s->done_cnt)
        s->done_head = s->done_cnt = 0;
    return k;
}

static void sink_drain(void *state, int timeout_ms)
{
    (void)state; /* nothing is ever in flight past submit */
    (void)timeout_ms;
}

static void sink_stop(void *state)
{
    sink_t *s = state;
    if (!s)
        return;
    close(s->fd);
    free(s->done);
    free(s->buf);
    free(s);
}

/* The one symbol idemproc looks for (IDEMPROC_PLUGIN_SYMBOL). */
const idemproc_plugin_t idemproc_plugin = {
    .abi_version = IDEMPROC_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(idemproc_plugin_t),
    .name = "filesink",
    .keys = keys,
    .validate = sink_validate,
    .start = sink_start,
    .submit = sink_submit,
    .collect = sink_collect,
    .drain = sink_drain,
    .stop = sink_stop,
};
