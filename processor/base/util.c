/* util: allocation that cannot fail, clocks, and small parsers shared by
 * every command. */
#include "base/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uuid/uuid.h>

static void oom(size_t size)
{
    fprintf(stderr, "idemproc: out of memory allocating %zu bytes\n", size);
    abort();
}

void *idem_xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p)
        oom(size);
    return p;
}

void *idem_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        oom(n * size);
    return p;
}

void *idem_xrealloc(void *ptr, size_t size)
{
    void *p = realloc(ptr, size ? size : 1);
    if (!p)
        oom(size);
    return p;
}

char *idem_xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p)
        oom(strlen(s) + 1);
    return p;
}

int64_t idem_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t idem_now_ms(void)
{
    return idem_now_us() / 1000;
}

int64_t idem_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t idem_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

char *idem_rfc3339(int64_t wall_ms, char *buf, size_t size)
{
    time_t sec = (time_t)(wall_ms / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    size_t n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, size - n, ".%03dZ", (int)(wall_ms % 1000));
    return buf;
}

void idem_uuid(char out[37])
{
    uuid_t u;
    uuid_generate_random(u);
    uuid_unparse_lower(u, out);
}

void idem_uuid_stable(const void *data, size_t len, char out[37])
{
    /* Our own name space, so that the ids cannot collide with UUIDv5s that
     * other software derives from the same bytes. Never change it: the
     * ids of re-sent files would change with it. */
    static const uuid_t ns = {0x3f, 0x2c, 0x8e, 0x51, 0x6a, 0x0d, 0x4b, 0x7e,
                              0x9c, 0x11, 0x5d, 0x2a, 0xe4, 0x70, 0x93, 0xb6};
    uuid_t u;
    uuid_generate_sha1(u, ns, data, len);
    uuid_unparse_lower(u, out);
}

void idem_sleep_ms(int64_t ms, volatile int *stop)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        if (stop && *stop)
            break;
}

int idem_duration_parse(const char *text, int64_t unit_ms, int64_t *out)
{
    const char *u = text;
    while (isdigit((unsigned char)*u))
        u++;
    if (u == text)
        return IDEM_DURATION_SYNTAX;
    int64_t mult = !*u                ? unit_ms
                   : !strcmp(u, "ms") ? 1
                   : !strcmp(u, "s")  ? 1000
                   : !strcmp(u, "m")  ? 60000
                   : !strcmp(u, "h")  ? 3600000
                   : !strcmp(u, "d")  ? 86400000
                                      : 0;
    if (!mult)
        return IDEM_DURATION_SYNTAX;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end != u || v > (unsigned long long)(INT64_MAX / mult))
        return IDEM_DURATION_RANGE;
    int64_t ms = (int64_t)v * mult;
    if (ms % unit_ms)
        return IDEM_DURATION_FRACTION;
    *out = ms / unit_ms;
    return 0;
}

size_t idem_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t *row = idem_xcalloc(lb + 1, sizeof(*row));
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diag + cost;
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    size_t d = row[lb];
    free(row);
    return d;
}

const char *idem_closest_name(const char *word, const char *const *names,
                              size_t n)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t d = idem_edit_distance(word, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best_d <= 1 + strlen(word) / 4 ? best : NULL;
}

char *idem_put_u64(char *p, uint64_t v)
{
    char t[20];
    size_t n = 0;
    do {
        t[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = t[--n];
    return p;
}
