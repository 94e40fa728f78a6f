/* retrytopic: delays, names and headers of the retry topics
 * (retrytopic.h). */
#include "kafka/retrytopic.h"
#include "base/log.h"
#include "base/util.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One item "<digits><unit>" of retry.topics (already trimmed, NUL-ended),
 * read by the one duration parser; here the unit is required. Returns the
 * delay in ms, or -1 with errstr. */
static int64_t delay_parse(const char *item, char *errstr, size_t errstr_size)
{
    const char *u = item;
    while (isdigit((unsigned char)*u))
        u++;
    int64_t ms = 0;
    int rc = u == item || !*u ? IDEM_DURATION_SYNTAX
                              : idem_duration_parse(item, 1, &ms);
    if (u == item)
        snprintf(errstr, errstr_size,
                 "retry.topics: \"%s\" is not a delay (digits and a unit: "
                 "200ms, 5s, 1m, 2h)",
                 item);
    else if (rc == IDEM_DURATION_SYNTAX)
        snprintf(errstr, errstr_size,
                 "retry.topics: \"%s\" %s (use ms, s, m, h or d)", item,
                 *u ? "has an unknown unit" : "needs a unit");
    else if (rc || ms <= 0 || ms > IDEM_RETRY_DELAY_MAX_MS) {
        snprintf(errstr, errstr_size,
                 "retry.topics: \"%s\" is out of range (1ms..7d)", item);
        return -1;
    }
    return rc ? -1 : ms;
}

int idem_retrytopic_parse(const char *spec, int64_t *delays_ms, size_t *n,
                          char *errstr, size_t errstr_size)
{
    *n = 0;
    if (!spec)
        return 0;
    const char *s = spec;
    while (*s == ' ' || *s == '\t')
        s++;
    if (!*s)
        return 0;
    char *copy = idem_xstrdup(spec);
    char *rest = copy;
    int rc = 0;
    for (char *t = strsep(&rest, ","); t; t = strsep(&rest, ",")) {
        while (*t == ' ' || *t == '\t')
            t++;
        size_t tl = strlen(t);
        while (tl && (t[tl - 1] == ' ' || t[tl - 1] == '\t'))
            t[--tl] = '\0';
        if (!*t) {
            snprintf(errstr, errstr_size, "retry.topics: empty delay in \"%s\"",
                     spec);
            rc = -1;
            break;
        }
        int64_t d = delay_parse(t, errstr, errstr_size);
        if (d < 0) {
            rc = -1;
            break;
        }
        if (*n == IDEM_RETRY_TIERS_MAX) {
            snprintf(errstr, errstr_size,
                     "retry.topics: more than %d delays in \"%s\"",
                     IDEM_RETRY_TIERS_MAX, spec);
            rc = -1;
            break;
        }
        if (*n && d <= delays_ms[*n - 1]) {
            char a[32];
            snprintf(errstr, errstr_size,
                     "retry.topics: \"%s\" is not longer than the delay "
                     "before it (%s): delays must ascend",
                     t, idem_retrytopic_label(delays_ms[*n - 1], a, sizeof(a)));
            rc = -1;
            break;
        }
        delays_ms[(*n)++] = d;
    }
    free(copy);
    if (rc)
        *n = 0;
    return rc;
}

const char *idem_retrytopic_label(int64_t ms, char *buf, size_t size)
{
    if (ms % 3600000 == 0)
        snprintf(buf, size, "%" PRId64 "h", ms / 3600000);
    else if (ms % 60000 == 0)
        snprintf(buf, size, "%" PRId64 "m", ms / 60000);
    else if (ms % 1000 == 0)
        snprintf(buf, size, "%" PRId64 "s", ms / 1000);
    else
        snprintf(buf, size, "%" PRId64 "ms", ms);
    return buf;
}

const char *idem_retrytopic_name(const char *input, int64_t ms, char *buf,
                                 size_t size)
{
    char label[32];
    snprintf(buf, size, "%s.retry.%s", input,
             idem_retrytopic_label(ms, label, sizeof(label)));
    return buf;
}

/* ------------------------------------------------------------- headers */

static const char *const own_headers[] = {
    IDEM_RETRY_H_ATTEMPT,   IDEM_RETRY_H_DUE_AT,
    IDEM_RETRY_H_ERROR,     IDEM_RETRY_H_TOPIC,
    IDEM_RETRY_H_PARTITION, IDEM_RETRY_H_OFFSET,
    IDEM_RETRY_H_TIMESTAMP, NULL};

int idem_retrytopic_header_is_own(const char *name)
{
    for (int i = 0; own_headers[i]; i++)
        if (!strcmp(name, own_headers[i]))
            return 1;
    return 0;
}

void idem_retrytopic_headers_strip(rd_kafka_headers_t *h)
{
    for (int i = 0; own_headers[i]; i++)
        rd_kafka_header_remove(h, own_headers[i]);
}

/* The last value of header `name` as a NUL-terminated copy in buf; 0, or
 * -1 when absent, empty or too long. */
static int hdr_text(const rd_kafka_headers_t *h, const char *name, char *buf,
                    size_t size)
{
    const void *v;
    size_t len;
    if (!h || rd_kafka_header_get_last(h, name, &v, &len) || !v || !len ||
        len >= size)
        return -1;
    memcpy(buf, v, len);
    buf[len] = '\0';
    return 0;
}

/* Header `name` as a decimal integer within [min, max]; 0 or -1. */
static int hdr_int(const rd_kafka_headers_t *h, const char *name, int64_t min,
                   int64_t max, int64_t *out)
{
    char b[32];
    if (hdr_text(h, name, b, sizeof(b)))
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(b, &end, 10);
    if (errno || *end || end == b || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int idem_retrytopic_info_read(const rd_kafka_headers_t *h,
                              idem_retry_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->partition = -1;
    info->offset = -1;
    info->timestamp = -1;
    info->due_ms = -1;
    int64_t v;
    if (!hdr_int(h, IDEM_RETRY_H_ATTEMPT, 1, 1000000, &v))
        info->attempts = (int)v;
    if (!hdr_int(h, IDEM_RETRY_H_DUE_AT, 0, INT64_MAX, &v))
        info->due_ms = v;
    int ok = 1;
    if (hdr_text(h, IDEM_RETRY_H_TOPIC, info->topic, sizeof(info->topic)))
        ok = 0;
    if (!hdr_int(h, IDEM_RETRY_H_PARTITION, 0, INT32_MAX, &v))
        info->partition = (int32_t)v;
    else
        ok = 0;
    if (!hdr_int(h, IDEM_RETRY_H_OFFSET, 0, INT64_MAX, &v))
        info->offset = v;
    else
        ok = 0;
    if (!hdr_int(h, IDEM_RETRY_H_TIMESTAMP, -1, INT64_MAX, &v))
        info->timestamp = v;
    else
        ok = 0;
    return ok ? 0 : -1;
}

static void hdr_num(rd_kafka_headers_t *h, const char *name, int64_t v)
{
    char num[32];
    snprintf(num, sizeof(num), "%" PRId64, v);
    rd_kafka_header_add(h, name, -1, num, -1);
}

rd_kafka_headers_t *idem_retrytopic_headers_new(const rd_kafka_headers_t *orig,
                                                const idem_retry_info_t *origin,
                                                int attempts, int64_t due_ms,
                                                const char *error)
{
    rd_kafka_headers_t *h;
    if (orig) {
        h = rd_kafka_headers_copy(orig);
        idem_retrytopic_headers_strip(h);
    } else {
        h = rd_kafka_headers_new(8);
    }
    hdr_num(h, IDEM_RETRY_H_ATTEMPT, attempts);
    hdr_num(h, IDEM_RETRY_H_DUE_AT, due_ms);
    rd_kafka_header_add(h, IDEM_RETRY_H_ERROR, -1, error, -1);
    rd_kafka_header_add(h, IDEM_RETRY_H_TOPIC, -1, origin->topic, -1);
    hdr_num(h, IDEM_RETRY_H_PARTITION, origin->partition);
    hdr_num(h, IDEM_RETRY_H_OFFSET, origin->offset);
    hdr_num(h, IDEM_RETRY_H_TIMESTAMP, origin->timestamp);
    return h;
}

/* -------------------------------------------------- a member's topics */

typedef struct {
    char *name;  /* "<input>.retry.<label>" */
    char *input; /* the input topic it retries */
    int tier;    /* 1.. */
} entry_t;

struct idem_retrytopics_s {
    entry_t *v;
    size_t cnt;
    int64_t delays[IDEM_RETRY_TIERS_MAX];
    size_t tiers;
};

idem_retrytopics_t *idem_retrytopics_new(const char *input_topics,
                                         const int64_t *delays_ms, size_t n)
{
    idem_retrytopics_t *rt = idem_xcalloc(1, sizeof(*rt));
    if (n > IDEM_RETRY_TIERS_MAX)
        n = IDEM_RETRY_TIERS_MAX;
    memcpy(rt->delays, delays_ms, n * sizeof(*delays_ms));
    rt->tiers = n;
    char *copy = idem_xstrdup(input_topics ? input_topics : "");
    char *rest = copy;
    size_t cap = 0;
    for (char *t = strsep(&rest, ","); t; t = strsep(&rest, ",")) {
        while (*t == ' ')
            t++;
        size_t tl = strlen(t);
        while (tl && t[tl - 1] == ' ')
            t[--tl] = '\0';
        if (!*t || *t == '^')
            continue;
        for (size_t k = 0; k < n; k++) {
            if (rt->cnt == cap) {
                cap = cap ? cap * 2 : 8;
                rt->v = idem_xrealloc(rt->v, cap * sizeof(*rt->v));
            }
            char name[512];
            idem_retrytopic_name(t, delays_ms[k], name, sizeof(name));
            entry_t *e = &rt->v[rt->cnt++];
            e->name = idem_xstrdup(name);
            e->input = idem_xstrdup(t);
            e->tier = (int)k + 1;
        }
    }
    free(copy);
    return rt;
}

void idem_retrytopics_destroy(idem_retrytopics_t *rt)
{
    if (!rt)
        return;
    for (size_t i = 0; i < rt->cnt; i++) {
        free(rt->v[i].name);
        free(rt->v[i].input);
    }
    free(rt->v);
    free(rt);
}

size_t idem_retrytopics_count(const idem_retrytopics_t *rt)
{
    return rt ? rt->cnt : 0;
}

const char *idem_retrytopics_at(const idem_retrytopics_t *rt, size_t i)
{
    return rt && i < rt->cnt ? rt->v[i].name : NULL;
}

int idem_retrytopics_tier(const idem_retrytopics_t *rt, const char *topic)
{
    for (size_t i = 0; rt && i < rt->cnt; i++)
        if (!strcmp(rt->v[i].name, topic))
            return rt->v[i].tier;
    return 0;
}

const char *idem_retrytopics_topic(const idem_retrytopics_t *rt,
                                   const char *input, int tier)
{
    for (size_t i = 0; rt && i < rt->cnt; i++)
        if (rt->v[i].tier == tier && !strcmp(rt->v[i].input, input))
            return rt->v[i].name;
    return NULL;
}

const char *idem_retrytopics_next(const idem_retrytopics_t *rt,
                                  const char *topic)
{
    for (size_t i = 0; rt && i < rt->cnt; i++) {
        if (rt->v[i].tier == 1 && !strcmp(rt->v[i].input, topic))
            return rt->v[i].name;
        if (!strcmp(rt->v[i].name, topic))
            return i + 1 < rt->cnt && rt->v[i + 1].tier == rt->v[i].tier + 1
                       ? rt->v[i + 1].name
                       : NULL;
    }
    return NULL;
}

int64_t idem_retrytopics_delay(const idem_retrytopics_t *rt, int tier)
{
    if (!rt || tier < 1 || (size_t)tier > rt->tiers)
        return 0;
    return rt->delays[tier - 1];
}

size_t idem_retrytopics_tiers(const idem_retrytopics_t *rt)
{
    return rt ? rt->tiers : 0;
}

/* The partition count of `topic` in md, 0 when it is not there. */
static int md_partitions(const rd_kafka_metadata_t *md, const char *topic)
{
    for (int i = 0; i < md->topic_cnt; i++)
        if (!md->topics[i].err && !strcmp(md->topics[i].topic, topic))
            return md->topics[i].partition_cnt;
    return 0;
}

int idem_retrytopics_check_md(const idem_retrytopics_t *rt,
                              const rd_kafka_metadata_t *md, char *errstr,
                              size_t errstr_size)
{
    for (size_t i = 0; rt && i < rt->cnt; i++) {
        int in = md_partitions(md, rt->v[i].input);
        if (!in)
            continue;
        int n = md_partitions(md, rt->v[i].name);
        if (!n) {
            snprintf(errstr, errstr_size,
                     "retry topic %s does not exist: create it with at least "
                     "%d partition%s, the partition count of input topic %s "
                     "(retry.topics)",
                     rt->v[i].name, in, in == 1 ? "" : "s", rt->v[i].input);
            return -1;
        }
        if (n < in) {
            snprintf(errstr, errstr_size,
                     "retry topic %s has %d partition%s, input topic %s has "
                     "%d: a copy goes to its record's partition number, so "
                     "every retry topic needs at least its input's partition "
                     "count (add partitions to %s)",
                     rt->v[i].name, n, n == 1 ? "" : "s", rt->v[i].input, in,
                     rt->v[i].name);
            return -1;
        }
    }
    return 0;
}

int idem_retrytopics_check(const idem_retrytopics_t *rt, rd_kafka_t *rk,
                           int timeout_ms, char *errstr, size_t errstr_size)
{
    if (!rt || !rt->cnt)
        return 0;
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, NULL, &md, timeout_ms);
    if (err) {
        idem_log_kv(IDEM_LOG_WARN,
                    "retry topics' partition counts not checked: no metadata",
                    "error", rd_kafka_err2str(err), NULL);
        return 0;
    }
    int rc = idem_retrytopics_check_md(rt, md, errstr, errstr_size);
    rd_kafka_metadata_destroy(md);
    return rc;
}
