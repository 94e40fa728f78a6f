/* posval: a position's cluster and record fingerprint (posval.h). */
#include "redis/posval.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A 64-bit multiply-xorshift mix, eight bytes a step: the loop hashes
 * every record that moves a partition's finished prefix, so this must cost
 * little next to the record's other work. Not cryptographic: it tells an
 * earlier incarnation's record from this one's, nobody forges them. */
#define MIX_K1 0x9e3779b97f4a7c15ULL
#define MIX_K2 0xbf58476d1ce4e5b9ULL

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v * MIX_K1;
    h = (h << 27) | (h >> 37);
    return h * MIX_K2 + 0x94d049bb133111ebULL;
}

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, size_t len)
{
    h = mix(h, (uint64_t)len);
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = mix(h, v);
    }
    uint64_t tail = 0;
    for (size_t i = 0; i < len; i++)
        tail |= (uint64_t)p[i] << (8 * i);
    return mix(h, tail);
}

uint64_t idem_posval_hash(const void *key, size_t key_len, const void *value,
                          size_t value_len)
{
    uint64_t h =
        hash_bytes(0x6964656d70726f63ULL, key ? key : "", key ? key_len : 0);
    h = hash_bytes(h, value ? value : "", value ? value_len : 0);
    h ^= h >> 31;
    return h * MIX_K1;
}

void idem_posval_init(idem_posval_t *v, const char *cluster)
{
    snprintf(v->cluster, sizeof(v->cluster), "%s", cluster ? cluster : "");
    v->rec.offset = -1;
    v->rec.timestamp = -1;
    v->rec.hash = 0;
}

size_t idem_posval_format(char *buf, size_t size, int64_t offset,
                          const idem_posval_t *v)
{
    const char *c = v->cluster[0] ? v->cluster : "-";
    int n =
        v->rec.offset >= 0
            ? snprintf(buf, size,
                       "%" PRId64 " %s %" PRId64 " %" PRId64 " %016" PRIx64,
                       offset, c, v->rec.offset, v->rec.timestamp, v->rec.hash)
            : snprintf(buf, size, "%" PRId64 " %s -", offset, c);
    if (n < 0 || (size_t)n >= size) {
        if (size)
            buf[0] = '\0';
        return 0;
    }
    return (size_t)n;
}

/* Reads a decimal int64 (optionally negative) at *p, up to a space or the
 * end; moves *p past it. 0, or -1 when there is none. */
static int read_i64(const char **p, const char *end, int64_t *out)
{
    const char *s = *p;
    int neg = s < end && *s == '-';
    if (neg)
        s++;
    if (s == end || *s < '0' || *s > '9')
        return -1;
    int64_t v = 0;
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        if (v > (INT64_MAX - (*s - '0')) / 10)
            return -1;
        v = v * 10 + (*s - '0');
    }
    *out = neg ? -v : v;
    *p = s;
    return 0;
}

/* The next space-separated word at *p: its start and length. */
static int read_word(const char **p, const char *end, const char **w,
                     size_t *wl)
{
    if (*p == end || **p != ' ')
        return -1;
    (*p)++;
    *w = *p;
    while (*p < end && **p != ' ')
        (*p)++;
    *wl = (size_t)(*p - *w);
    return *wl ? 0 : -1;
}

int idem_posval_parse(const char *text, size_t len, int64_t *offset,
                      idem_posval_t *v)
{
    idem_posval_init(v, NULL);
    const char *p = text, *end = text + len;
    if (read_i64(&p, end, offset) || *offset < 0)
        return -1;
    if (p == end)
        return 0; /* an older value: the offset alone */
    const char *w;
    size_t wl;
    if (read_word(&p, end, &w, &wl) || wl >= sizeof(v->cluster))
        return -1;
    if (!(wl == 1 && w[0] == '-'))
        snprintf(v->cluster, sizeof(v->cluster), "%.*s", (int)wl, w);
    if (read_word(&p, end, &w, &wl))
        return -1;
    if (wl == 1 && w[0] == '-')
        return p == end ? 0 : -1;
    const char *q = w;
    int64_t ro, ts;
    if (read_i64(&q, w + wl, &ro) || q != w + wl || ro < 0)
        return -1;
    if (read_word(&p, end, &w, &wl))
        return -1;
    q = w;
    if (read_i64(&q, w + wl, &ts) || q != w + wl)
        return -1;
    if (read_word(&p, end, &w, &wl) || wl != 16 || p != end)
        return -1;
    uint64_t h = 0;
    for (size_t i = 0; i < wl; i++) {
        char c = w[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (d < 0)
            return -1;
        h = h << 4 | (uint64_t)d;
    }
    v->rec.offset = ro;
    v->rec.timestamp = ts;
    v->rec.hash = h;
    return 0;
}

idem_posval_verdict_t idem_posval_judge(int64_t offset, const idem_posval_t *v,
                                        const idem_posval_now_t *now)
{
    if (v->cluster[0] && now->cluster && now->cluster[0] &&
        strcmp(v->cluster, now->cluster))
        return IDEM_POSVAL_CLUSTER;
    if (now->high >= 0 && offset > now->high)
        return IDEM_POSVAL_PAST_END;
    if (v->rec.offset < 0)
        return IDEM_POSVAL_USE; /* nothing more to compare */
    if (now->high >= 0 && v->rec.offset >= now->high)
        return IDEM_POSVAL_PAST_END; /* a record we read is not there */
    if (now->found) {
        if (now->got.offset == v->rec.offset &&
            now->got.timestamp == v->rec.timestamp &&
            now->got.hash == v->rec.hash)
            return IDEM_POSVAL_USE;
        return IDEM_POSVAL_RECORD;
    }
    /* Not read: below the start (retention), where nothing can be told
     * apart; used within the watermarks. */
    if (now->low >= 0 && v->rec.offset < now->low)
        return IDEM_POSVAL_USE;
    return IDEM_POSVAL_RECORD;
}

const char *idem_posval_verdict2str(idem_posval_verdict_t verdict)
{
    switch (verdict) {
    case IDEM_POSVAL_USE:
        return "use";
    case IDEM_POSVAL_CLUSTER:
        return "cluster";
    case IDEM_POSVAL_RECORD:
        return "record";
    case IDEM_POSVAL_PAST_END:
        return "past-end";
    }
    return "?";
}
