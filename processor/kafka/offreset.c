/* offreset: `idemproc offsets`'s rules (offreset.h). */
#include "kafka/offreset.h"
#include "base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int idem_offreset_sel_parse(const char *spec, idem_offreset_sel_t *out,
                            char *errstr, size_t errstr_size)
{
    memset(out, 0, sizeof(*out));
    const char *colon = strrchr(spec, ':');
    size_t tl = colon ? (size_t)(colon - spec) : strlen(spec);
    if (!tl) {
        snprintf(errstr, errstr_size, "--topic: \"%s\" names no topic", spec);
        return -1;
    }
    out->topic = idem_xmalloc(tl + 1);
    memcpy(out->topic, spec, tl);
    out->topic[tl] = '\0';
    if (!colon)
        return 0;
    const char *p = colon + 1;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && *end != ',')) {
            snprintf(errstr, errstr_size,
                     "--topic: \"%s\": partitions are numbers (T:0,1,2)", spec);
            idem_offreset_sel_clear(out);
            return -1;
        }
        out->parts =
            idem_xrealloc(out->parts, (out->nparts + 1) * sizeof(*out->parts));
        out->parts[out->nparts++] = (int32_t)v;
        if (!*end)
            return 0;
        p = end + 1;
    }
}

void idem_offreset_sel_clear(idem_offreset_sel_t *sel)
{
    free(sel->topic);
    free(sel->parts);
    memset(sel, 0, sizeof(*sel));
}

int idem_offreset_sel_match(const idem_offreset_sel_t *sel, size_t n,
                            const char *topic, int32_t partition)
{
    if (!n)
        return 1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(sel[i].topic, topic))
            continue;
        if (!sel[i].parts)
            return 1;
        for (size_t j = 0; j < sel[i].nparts; j++)
            if (sel[i].parts[j] == partition)
                return 1;
    }
    return 0;
}

static int has_id(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

/* Appends fmt to buf[size] at *len, cut at the end of buf. */
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    *len = w < 0 ? size : *len + (size_t)w;
}

int idem_offreset_sel_check(const idem_offreset_sel_t *sel, const int32_t *ids,
                            size_t n, char *errstr, size_t errstr_size)
{
    size_t missing = 0;
    for (size_t j = 0; j < sel->nparts; j++)
        missing += !has_id(ids, n, sel->parts[j]);
    if (!missing)
        return 0;
    size_t len = 0;
    append(errstr, errstr_size, &len, "--topic %s:", sel->topic);
    for (size_t j = 0; j < sel->nparts; j++)
        append(errstr, errstr_size, &len, "%s%" PRId32, j ? "," : "",
               sel->parts[j]);
    append(errstr, errstr_size, &len, ": %s has no partition%s", sel->topic,
           missing > 1 ? "s" : "");
    const char *sep = " ";
    for (size_t j = 0; j < sel->nparts; j++) {
        if (has_id(ids, n, sel->parts[j]))
            continue;
        append(errstr, errstr_size, &len, "%s%" PRId32, sep, sel->parts[j]);
        sep = ", ";
    }
    /* The partitions there are, as ranges in order: 0-23, or 0-3, 5. */
    append(errstr, errstr_size, &len, " (it has ");
    int32_t max = -1;
    for (size_t i = 0; i < n; i++)
        if (ids[i] > max)
            max = ids[i];
    sep = "";
    for (int32_t id = 0; id <= max; id++) {
        if (!has_id(ids, n, id))
            continue;
        int32_t last = id;
        while (last < max && has_id(ids, n, last + 1))
            last++;
        if (last > id)
            append(errstr, errstr_size, &len, "%s%" PRId32 "-%" PRId32, sep, id,
                   last);
        else
            append(errstr, errstr_size, &len, "%s%" PRId32, sep, id);
        sep = ", ";
        id = last;
    }
    append(errstr, errstr_size, &len, "%s)", n ? "" : "no partitions");
    return -1;
}

int idem_offreset_redis_lost(int64_t redis, int64_t kafka,
                             idem_offreset_by_t by)
{
    return redis < 0 && kafka >= 0 && by == IDEM_OFFRESET_BY_MEMBER;
}

int64_t idem_offreset_start(int64_t redis, int redis_use, int64_t kafka,
                            idem_offreset_by_t kafka_by, int earliest,
                            int64_t low, int64_t high,
                            idem_offreset_from_t *from)
{
    if (redis >= 0 && redis_use) {
        *from = IDEM_OFFRESET_FROM_REDIS;
        return redis;
    }
    if (idem_offreset_redis_lost(redis, kafka, kafka_by)) {
        *from = IDEM_OFFRESET_FROM_NOWHERE;
        return kafka;
    }
    if (kafka >= 0) {
        *from = IDEM_OFFRESET_FROM_KAFKA;
        return kafka;
    }
    *from = IDEM_OFFRESET_FROM_AUTO;
    return earliest ? low : high;
}

const char *idem_offreset_from2str(idem_offreset_from_t from)
{
    switch (from) {
    case IDEM_OFFRESET_FROM_REDIS:
        return "redis";
    case IDEM_OFFRESET_FROM_KAFKA:
        return "kafka";
    case IDEM_OFFRESET_FROM_AUTO:
        return "auto.offset.reset";
    case IDEM_OFFRESET_FROM_NOWHERE:
        return "paused:redis-lost";
    }
    return "?";
}

idem_offreset_by_t idem_offreset_committed_by(const void *meta, size_t len)
{
    size_t rl = strlen(IDEM_OFFRESET_META_RESET);
    if (meta && len >= rl && !memcmp(meta, IDEM_OFFRESET_META_RESET, rl))
        return IDEM_OFFRESET_BY_RESET;
    if (meta && len == strlen(IDEM_OFFRESET_META_MEMBER) &&
        !memcmp(meta, IDEM_OFFRESET_META_MEMBER, len))
        return IDEM_OFFRESET_BY_MEMBER;
    return IDEM_OFFRESET_BY_OTHER;
}

static int64_t clamp(int64_t v, int64_t low, int64_t high)
{
    return v < low ? low : v > high ? high : v;
}

int64_t idem_offreset_target(const idem_offreset_to_t *to, int64_t low,
                             int64_t high, int64_t current, int64_t by_time)
{
    switch (to->mode) {
    case IDEM_OFFRESET_EARLIEST:
        return low;
    case IDEM_OFFRESET_LATEST:
        return high;
    case IDEM_OFFRESET_OFFSET:
        return clamp(to->value, low, high);
    case IDEM_OFFRESET_DATETIME:
        return by_time < 0 ? high : clamp(by_time, low, high);
    case IDEM_OFFRESET_SHIFT: {
        /* no overflow: offsets and shifts are far below 2^62 */
        int64_t v = to->value < -(INT64_MAX / 2) ? -(INT64_MAX / 2)
                    : to->value > INT64_MAX / 2  ? INT64_MAX / 2
                                                 : to->value;
        return clamp(current + v, low, high);
    }
    }
    return current;
}

int64_t idem_offreset_time_query(int64_t at_ms)
{
    return at_ms < 0 ? 0 : at_ms;
}
