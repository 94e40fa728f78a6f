/* parttables: a member's partition tables of dedup marks: path, mark,
 * lookup, settling, reset, expiry and the memory bound. */
#include "loop/parttables.h"
#include "base/siphash.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t epoch;
    int loaded;
    idem_marktab_t *tab;
} part_t;

/* One topic's partitions, indexed by partition number: a lookup is a
 * compare of the topic (a member reads one or a few) and an array index,
 * not a scan of every partition held (it runs twice per record). */
typedef struct {
    char *name;
    part_t **by_partition; /* [cap]; NULL: not held */
    int32_t cap;
} topic_t;

struct idem_parttables_s {
    uint8_t key[16];
    size_t memory_max;
    topic_t *topics;
    size_t ntopics, topics_cap;
};

idem_parttables_t *idem_parttables_new(const uint8_t key[16], size_t memory_max)
{
    idem_parttables_t *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    memcpy(t->key, key, 16);
    t->memory_max = memory_max;
    return t;
}

static void part_free(part_t *p)
{
    if (!p)
        return;
    idem_marktab_destroy(p->tab);
    free(p);
}

void idem_parttables_destroy(idem_parttables_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->ntopics; i++) {
        for (int32_t k = 0; k < t->topics[i].cap; k++)
            part_free(t->topics[i].by_partition[k]);
        free(t->topics[i].by_partition);
        free(t->topics[i].name);
    }
    free(t->topics);
    free(t);
}

/* Every held partition p of t, in topic then partition order. */
#define EACH_PART(t, p)                                                        \
    for (size_t ti_ = 0; ti_ < (t)->ntopics; ti_++)                            \
        for (int32_t k_ = 0; k_ < (t)->topics[ti_].cap; k_++)                  \
            if (((p) = (t)->topics[ti_].by_partition[k_]) != NULL)

static topic_t *topic_find(const idem_parttables_t *t, const char *topic)
{
    for (size_t i = 0; i < t->ntopics; i++)
        if (!strcmp(t->topics[i].name, topic))
            return &t->topics[i];
    return NULL;
}

idem_part_path_t idem_parttables_path(int from_retry_topic, int replayed,
                                      size_t key_len)
{
    if (from_retry_topic || replayed || key_len == 0)
        return IDEM_PART_PATH_GLOBAL;
    return IDEM_PART_PATH_PARTITION;
}

void idem_parttables_mark(const idem_parttables_t *t, const void *identity,
                          size_t identity_len, const void *message_id,
                          size_t message_id_len, idem_mark_t16 *out)
{
    uint8_t h[16];
    idem_siphash24_128(t->key, identity, identity_len, h);
    memcpy(out->b, h, 12);
    uint32_t d = (uint32_t)idem_siphash24(t->key, message_id, message_id_len) &
                 0x7fffffffu;
    out->b[12] = (uint8_t)(d >> 24);
    out->b[13] = (uint8_t)(d >> 16);
    out->b[14] = (uint8_t)(d >> 8);
    out->b[15] = (uint8_t)d;
}

static part_t *find(const idem_parttables_t *t, const char *topic,
                    int32_t partition)
{
    topic_t *tp = topic_find(t, topic);
    if (!tp || partition < 0 || partition >= tp->cap)
        return NULL;
    return tp->by_partition[partition];
}

/* The topic's entry, added when new. NULL when out of memory. */
static topic_t *topic_get(idem_parttables_t *t, const char *topic)
{
    topic_t *tp = topic_find(t, topic);
    if (tp)
        return tp;
    if (t->ntopics == t->topics_cap) {
        size_t cap = t->topics_cap ? 2 * t->topics_cap : 4;
        topic_t *nt = realloc(t->topics, cap * sizeof(*nt));
        if (!nt)
            return NULL;
        t->topics = nt;
        t->topics_cap = cap;
    }
    char *name = strdup(topic);
    if (!name)
        return NULL;
    tp = &t->topics[t->ntopics++];
    *tp = (topic_t){.name = name};
    return tp;
}

/* Makes room for partition number partition in tp. 0, or -1. */
static int topic_reserve(topic_t *tp, int32_t partition)
{
    if (partition < tp->cap)
        return 0;
    int32_t cap = tp->cap ? tp->cap : 8;
    while (cap <= partition)
        cap = cap > INT32_MAX / 2 ? INT32_MAX : 2 * cap;
    part_t **np = realloc(tp->by_partition, (size_t)cap * sizeof(*np));
    if (!np)
        return -1;
    memset(np + tp->cap, 0, (size_t)(cap - tp->cap) * sizeof(*np));
    tp->by_partition = np;
    tp->cap = cap;
    return 0;
}

int idem_parttables_assign(idem_parttables_t *t, const char *topic,
                           int32_t partition, int64_t epoch)
{
    if (partition < 0)
        return -1;
    part_t *p = find(t, topic, partition);
    if (!p) {
        topic_t *tp = topic_get(t, topic);
        if (!tp || topic_reserve(tp, partition))
            return -1;
        p = calloc(1, sizeof(*p));
        if (!p || !(p->tab = idem_marktab_new())) {
            free(p);
            return -1;
        }
        tp->by_partition[partition] = p;
    }
    idem_marktab_clear(p->tab);
    p->epoch = epoch;
    p->loaded = 0;
    return 0;
}

void idem_parttables_drop(idem_parttables_t *t, const char *topic,
                          int32_t partition)
{
    part_t *p = find(t, topic, partition);
    if (!p)
        return;
    part_free(p);
    topic_find(t, topic)->by_partition[partition] = NULL;
}

void idem_parttables_reset(idem_parttables_t *t, const char *topic,
                           int32_t partition)
{
    part_t *p = find(t, topic, partition);
    if (!p)
        return;
    idem_marktab_clear(p->tab);
    p->loaded = 0;
}

int idem_parttables_load(idem_parttables_t *t, const char *topic,
                         int32_t partition, const uint8_t *marks, size_t n,
                         int64_t w)
{
    part_t *p = find(t, topic, partition);
    if (!p)
        return -1;
    for (size_t i = 0; i < n; i++) {
        idem_mark_t16 m;
        memcpy(m.b, marks + 16 * i, 16);
        if (idem_marktab_add(p->tab, &m, w))
            return -1;
    }
    return idem_marktab_bytes(p->tab) > t->memory_max ? -2 : 0;
}

void idem_parttables_loaded(idem_parttables_t *t, const char *topic,
                            int32_t partition)
{
    part_t *p = find(t, topic, partition);
    if (p)
        p->loaded = 1;
}

int idem_parttables_ready(const idem_parttables_t *t, const char *topic,
                          int32_t partition, int64_t *epoch)
{
    const part_t *p = find(t, topic, partition);
    if (!p || !p->loaded)
        return 0;
    if (epoch)
        *epoch = p->epoch;
    return 1;
}

idem_part_lookup_t idem_parttables_take(idem_parttables_t *t, const char *topic,
                                        int32_t partition,
                                        const idem_mark_t16 *m, int64_t w,
                                        uint32_t *prior)
{
    part_t *p = find(t, topic, partition);
    if (!p || !p->loaded)
        return IDEM_PART_NOT_READY;
    idem_mark_t16 held;
    if (idem_marktab_find(p->tab, m->b, &held)) {
        if (idem_mark_moved(&held))
            return IDEM_PART_MOVED;
        if (prior)
            *prior = (uint32_t)held.b[12] << 24 | (uint32_t)held.b[13] << 16 |
                     (uint32_t)held.b[14] << 8 | held.b[15];
        return IDEM_PART_DUPLICATE;
    }
    return idem_marktab_add(p->tab, m, w) ? IDEM_PART_NOMEM : IDEM_PART_NEW;
}

int idem_parttables_settle(idem_parttables_t *t, const char *topic,
                           int32_t partition, const idem_mark_t16 *m,
                           int64_t w_taken, int64_t w_redis, int rejected)
{
    part_t *p = find(t, topic, partition);
    if (!p)
        return 0; /* revoked meanwhile: nothing to keep */
    if (!rejected && w_taken == w_redis)
        return 0;
    idem_marktab_remove(p->tab, m->b, w_taken);
    idem_mark_t16 k = *m;
    if (rejected) {
        k.b[12] = 0x80;
        k.b[13] = k.b[14] = k.b[15] = 0;
    }
    return idem_marktab_add(p->tab, &k, w_redis);
}

int64_t idem_parttables_min_window(int64_t now, int64_t window_s, int64_t ttl_s)
{
    int64_t x = now - ttl_s;
    int64_t q = x / window_s;
    if (x % window_s && x < 0)
        q--; /* floor, not truncation */
    return q;
}

void idem_parttables_expire(idem_parttables_t *t, int64_t min_w)
{
    part_t *p;
    EACH_PART(t, p)
    idem_marktab_expire(p->tab, min_w);
}

size_t idem_parttables_bytes(const idem_parttables_t *t)
{
    size_t b = 0;
    const part_t *p;
    EACH_PART(t, p)
    b += idem_marktab_bytes(p->tab);
    return b;
}

size_t idem_parttables_marks(const idem_parttables_t *t)
{
    size_t n = 0;
    const part_t *p;
    EACH_PART(t, p)
    n += idem_marktab_count(p->tab);
    return n;
}

int idem_parttables_full(const idem_parttables_t *t)
{
    return idem_parttables_bytes(t) >= t->memory_max;
}

size_t idem_parttables_count(const idem_parttables_t *t, const char *topic,
                             int32_t partition)
{
    const part_t *p = find(t, topic, partition);
    return p ? idem_marktab_count(p->tab) : 0;
}

idem_part_count_t idem_parttables_count_verdict(int64_t recorded,
                                                int64_t current)
{
    if (current <= 0)
        return IDEM_PART_COUNT_UNKNOWN;
    if (recorded < 0)
        return IDEM_PART_COUNT_RECORD;
    return recorded == current ? IDEM_PART_COUNT_SAME : IDEM_PART_COUNT_CHANGED;
}
