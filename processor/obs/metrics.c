/* metrics: the process's Prometheus metrics (text format 0.0.4); counters and
 * gauges are lock-free atomics, histograms, the lag table and readiness sit
 * behind small mutexes so the HTTP thread always renders a consistent view. */
#include "obs/metrics.h"

#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "obs/procstat.h"

/* A relaxed read of an atomic field: a counter or gauge read
 * alone needs no order with the others. */
#define LOAD(field) atomic_load_explicit(&(field), memory_order_relaxed)

#ifndef IDEM_VERSION
#define IDEM_VERSION "unknown"
#endif

#define HIST_MAX_BOUNDS  20 /* upper bounds per histogram, +Inf excluded */
#define READY_REASON_MAX 256

/* Bucket upper bounds ("le"), ascending; +Inf is implicit. */
static const double latency_bounds[] = {
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025,
    0.05,   0.1,   0.25,   0.5,   1,      2.5,  5,     10};
static const double batch_bounds[] = {1,   10,   50,   100,  250,
                                      500, 1000, 2500, 5000, 10000};
/* Producer timestamp -> effect (and -> poll): fine steps around the issue's
 * 20 ms goal. */
static const double effect_bounds[] = {0.001, 0.002, 0.003, 0.005, 0.0075, 0.01,
                                       0.015, 0.02,  0.025, 0.03,  0.04,   0.05,
                                       0.075, 0.1,   0.25,  0.5,   1,      2.5};
static const double redis_bounds[] = {0.0001, 0.00025, 0.0005, 0.001,
                                      0.0025, 0.005,   0.01,   0.025,
                                      0.05,   0.1,     0.5,    1};

#define NBOUNDS(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(NBOUNDS(latency_bounds) <= HIST_MAX_BOUNDS &&
                   NBOUNDS(batch_bounds) <= HIST_MAX_BOUNDS &&
                   NBOUNDS(effect_bounds) <= HIST_MAX_BOUNDS &&
                   NBOUNDS(redis_bounds) <= HIST_MAX_BOUNDS,
               "a histogram has more bounds than HIST_MAX_BOUNDS");

typedef struct {
    const char *name; /* base name; _bucket/_sum/_count are appended */
    const char *help;
    const double *bounds;
    size_t nbounds;
    pthread_mutex_t lock;                  /* guards everything below */
    uint64_t buckets[HIST_MAX_BOUNDS + 1]; /* per bucket, not cumulative;
                                              the last one is (max, +Inf] */
    uint64_t count;
    double sum;
} histogram_t;

typedef struct {
    char *topic; /* owned */
    int32_t partition;
    int64_t lag;
} lag_entry_t;

typedef enum {
    REB_ASSIGN = 0,
    REB_REVOKE,
    REB_LOST,
    REB_CNT
} rebalance_event_t;

static const char *rebalance_names[REB_CNT] = {"assign", "revoke", "lost"};

/* Redis error classes (docs/design.md, "Error classes"); "other" last. */
const char *const idem_metrics_redis_classes[] = {
    "connection", "timeout", "oom",        "readonly",   "misconf",
    "noreplicas", "loading", "busy",       "masterdown", "auth",
    "noscript",   "wait",    "aofrewrite", "other",      NULL};
#define REDIS_CLASS_CNT 14

/* What became of an AOF rewrite a member waited for (store.c). */
static const char *const aof_rewrite_results[] = {"ok", "failed", "refused"};
#define AOF_REWRITE_RESULT_CNT 3

/* Why a position in Redis was not used (positions.c). */
const char *const idem_metrics_mismatch_reasons[] = {"cluster", "record",
                                                     "past-end", NULL};
#define MISMATCH_REASON_CNT 3

/* Webhook request classes: by status class, or what kept a response from
 * arriving ("resent": an attempt libcurl sent again itself after a reused
 * connection died unanswered); "error" last (the catch-all). */
const char *const idem_metrics_webhook_classes[] = {
    "1xx",     "2xx", "3xx",    "4xx",   "5xx", "connect",
    "timeout", "tls", "resent", "error", NULL};
#define WEBHOOK_CLASS_CNT 10

#define RETRY_TIERS_MAX 8

struct idem_metrics_s {
    _Atomic uint64_t outcomes[IDEM_OUTCOME_CNT];
    _Atomic uint64_t duplicates[IDEM_DUP_CNT];
    _Atomic uint64_t dlq[IDEM_REASON_CNT];
    _Atomic uint64_t retries;
    _Atomic uint64_t redis_errors[REDIS_CLASS_CNT];
    _Atomic uint64_t redis_behind;
    _Atomic uint64_t kafka_moved;
    _Atomic uint64_t aof_rewrites[AOF_REWRITE_RESULT_CNT];
    _Atomic uint64_t mismatches[MISMATCH_REASON_CNT];
    _Atomic int64_t redis_eviction_allowed;
    _Atomic int64_t group_config_mismatch;
    _Atomic uint64_t commits_ok;
    _Atomic uint64_t commits_error;
    _Atomic uint64_t rebalances[REB_CNT];

    _Atomic int64_t last_commit_wall_ms; /* 0 until the first good commit */
    _Atomic int64_t assigned;
    _Atomic int64_t paused;
    _Atomic int64_t inflight;
    _Atomic int64_t heartbeat_mono_ms; /* idem_now_ms() of the last beat */
    int64_t start_wall_ms;             /* set once in _new */

    histogram_t latency;
    histogram_t effect_latency;
    histogram_t fetch_latency;
    histogram_t batch;
    histogram_t redis;

    _Atomic int webhook_on; /* 1 once the webhook handler started */
    _Atomic uint64_t webhook_requests[WEBHOOK_CLASS_CNT];
    histogram_t webhook_latency;

    /* retry.topics: labels written once before the HTTP thread reads
     * them (retry_tiers is the release flag). */
    char retry_labels[RETRY_TIERS_MAX][16];
    _Atomic int retry_tiers; /* 0: retry topics off, nothing rendered */
    _Atomic uint64_t retry_topic[RETRY_TIERS_MAX];
    _Atomic int64_t retry_waiting;
    _Atomic int ordering_on; /* an external effect reports its ordering */
    _Atomic int64_t effects_inflight, keys_waiting, key_depth_hwm;
    _Atomic int64_t key_holds;    /* partitions paused behind busy keys */
    _Atomic uint64_t key_holds_n; /* such pauses since start */
    _Atomic int table_on;         /* dedup.scope=partition reports its tables */
    _Atomic int64_t table_bytes, table_marks, table_max;
    _Atomic uint64_t layout_refused_chunk, layout_refused_global;
    _Atomic int memb_on, memb_paused; /* member.memory.max is set; over it */
    _Atomic int64_t memb_max;
    _Atomic uint64_t memb_pauses;

    pthread_mutex_t lag_lock; /* guards lags, lag_cnt, lag_seen */
    lag_entry_t *lags;
    size_t lag_cnt;
    int lag_seen; /* 1 once a statistics document was parsed */
    /* The fetch watch's gauges (lag_entry_t.lag holds 0 or 1), under
     * lag_lock too. */
    lag_entry_t *stalled;
    size_t stalled_cnt;
    _Atomic int stall_on; /* 1 once the fetch watch started */
    _Atomic uint64_t stalls;
    _Atomic uint64_t stall_repairs;

    /* The script request Redis refused to end (under stuck_lock). */
    pthread_mutex_t stuck_lock;
    int stuck;             /* 1 while it is in flight */
    char stuck_topic[256]; /* its first record */
    int32_t stuck_partition;
    int64_t stuck_offset;
    size_t stuck_records; /* records in the request */
    _Atomic uint64_t unkillable;

    pthread_mutex_t ready_lock; /* guards ready, ready_reason */
    int ready;
    char ready_reason[READY_REASON_MAX];

    char *member_group; /* idemproc_member_info; NULL: not rendered */
    char *member_id;

    pthread_mutex_t cluster_lock;               /* guards the three below */
    idem_metrics_cluster_node_t *cluster_nodes; /* node strings owned */
    size_t cluster_cnt;
    uint64_t cluster_refreshes;
    int cluster_on; /* 1 once idem_metrics_cluster_set was called */

    idem_metrics_render_cb *extra_render; /* a command's own metrics */
    void *extra_opaque;
};

static void histogram_init(histogram_t *h, const char *name, const char *help,
                           const double *bounds, size_t nbounds)
{
    memset(h, 0, sizeof(*h));
    h->name = name;
    h->help = help;
    h->bounds = bounds;
    h->nbounds = nbounds;
    pthread_mutex_init(&h->lock, NULL);
}

/* The bucket of v: the first whose bound is >= v (Prometheus "le"
 * semantics), nbounds for +Inf. */
static size_t histogram_bucket(const histogram_t *h, double v)
{
    size_t i = 0;
    while (i < h->nbounds && v > h->bounds[i])
        i++;
    return i;
}

/* Adds one observation. NaN is dropped: it would poison _sum. */
static void histogram_observe(histogram_t *h, double v)
{
    if (isnan(v))
        return;
    size_t i = histogram_bucket(h, v);
    pthread_mutex_lock(&h->lock);
    h->buckets[i]++;
    h->count++;
    h->sum += v;
    pthread_mutex_unlock(&h->lock);
}

static void lags_free(lag_entry_t *lags, size_t cnt)
{
    for (size_t i = 0; i < cnt; i++)
        free(lags[i].topic);
    free(lags);
}

idem_metrics_t *idem_metrics_new(void)
{
    idem_metrics_t *m = idem_xcalloc(1, sizeof(*m));
    /* calloc zeroes the atomics; that is a valid initial state for lock-free
     * atomic integers on every platform we build on, but initialise them
     * explicitly so the intent is plain. */
    for (int i = 0; i < IDEM_OUTCOME_CNT; i++)
        atomic_init(&m->outcomes[i], 0);
    for (int i = 0; i < IDEM_DUP_CNT; i++)
        atomic_init(&m->duplicates[i], 0);
    for (int i = 0; i < IDEM_REASON_CNT; i++)
        atomic_init(&m->dlq[i], 0);
    for (int i = 0; i < REB_CNT; i++)
        atomic_init(&m->rebalances[i], 0);
    atomic_init(&m->retries, 0);
    for (int i = 0; i < REDIS_CLASS_CNT; i++)
        atomic_init(&m->redis_errors[i], 0);
    atomic_init(&m->redis_behind, 0);
    atomic_init(&m->kafka_moved, 0);
    for (int i = 0; i < AOF_REWRITE_RESULT_CNT; i++)
        atomic_init(&m->aof_rewrites[i], 0);
    for (int i = 0; i < MISMATCH_REASON_CNT; i++)
        atomic_init(&m->mismatches[i], 0);
    atomic_init(&m->redis_eviction_allowed, 0);
    atomic_init(&m->group_config_mismatch, 0);
    atomic_init(&m->commits_ok, 0);
    atomic_init(&m->commits_error, 0);
    atomic_init(&m->last_commit_wall_ms, 0);
    atomic_init(&m->assigned, 0);
    atomic_init(&m->paused, 0);
    atomic_init(&m->inflight, 0);
    atomic_init(&m->stall_on, 0);
    atomic_init(&m->stalls, 0);
    atomic_init(&m->stall_repairs, 0);
    atomic_init(&m->heartbeat_mono_ms, idem_now_ms());
    m->start_wall_ms = idem_wall_ms();

    histogram_init(&m->latency, "idemproc_processing_latency_seconds",
                   "Time from fetching a record to its outcome.",
                   latency_bounds, NBOUNDS(latency_bounds));
    histogram_init(&m->effect_latency, "idemproc_effect_latency_seconds",
                   "Time from a record's timestamp (the producer's "
                   "CreateTime) to its effect, for processed records, by "
                   "this host's clock.",
                   effect_bounds, NBOUNDS(effect_bounds));
    histogram_init(&m->fetch_latency, "idemproc_fetch_latency_seconds",
                   "Time from a record's timestamp (the producer's "
                   "CreateTime) to the loop polling it, for processed "
                   "records, by this host's clock.",
                   effect_bounds, NBOUNDS(effect_bounds));
    histogram_init(&m->batch, "idemproc_batch_size_records",
                   "Records per processed batch.", batch_bounds,
                   NBOUNDS(batch_bounds));
    histogram_init(&m->redis, "idemproc_redis_roundtrip_seconds",
                   "Duration of one (pipelined) Redis round trip.",
                   redis_bounds, NBOUNDS(redis_bounds));
    histogram_init(&m->webhook_latency, "idemproc_webhook_latency_seconds",
                   "Duration of one webhook request, connect included.",
                   latency_bounds, NBOUNDS(latency_bounds));
    atomic_init(&m->webhook_on, 0);
    atomic_init(&m->retry_tiers, 0);
    atomic_init(&m->retry_waiting, 0);
    atomic_init(&m->ordering_on, 0);
    atomic_init(&m->effects_inflight, 0);
    atomic_init(&m->keys_waiting, 0);
    atomic_init(&m->key_holds, 0);
    atomic_init(&m->key_holds_n, 0);
    atomic_init(&m->table_on, 0);
    atomic_init(&m->table_bytes, 0);
    atomic_init(&m->table_marks, 0);
    atomic_init(&m->table_max, 0);
    atomic_init(&m->layout_refused_chunk, 0);
    atomic_init(&m->layout_refused_global, 0);
    atomic_init(&m->memb_on, 0);
    atomic_init(&m->memb_paused, 0);
    atomic_init(&m->memb_max, 0);
    atomic_init(&m->memb_pauses, 0);
    atomic_init(&m->key_depth_hwm, 0);
    for (int i = 0; i < RETRY_TIERS_MAX; i++)
        atomic_init(&m->retry_topic[i], 0);
    for (int i = 0; i < WEBHOOK_CLASS_CNT; i++)
        atomic_init(&m->webhook_requests[i], 0);

    pthread_mutex_init(&m->lag_lock, NULL);
    pthread_mutex_init(&m->ready_lock, NULL);
    pthread_mutex_init(&m->stuck_lock, NULL);
    pthread_mutex_init(&m->cluster_lock, NULL);
    atomic_init(&m->unkillable, 0);
    m->ready = 0;
    snprintf(m->ready_reason, sizeof(m->ready_reason), "starting");
    return m;
}

static void cluster_nodes_free(idem_metrics_cluster_node_t *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free((char *)v[i].node);
    free(v);
}

void idem_metrics_destroy(idem_metrics_t *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->latency.lock);
    pthread_mutex_destroy(&m->effect_latency.lock);
    pthread_mutex_destroy(&m->fetch_latency.lock);
    pthread_mutex_destroy(&m->batch.lock);
    pthread_mutex_destroy(&m->redis.lock);
    pthread_mutex_destroy(&m->webhook_latency.lock);
    pthread_mutex_destroy(&m->lag_lock);
    pthread_mutex_destroy(&m->ready_lock);
    pthread_mutex_destroy(&m->stuck_lock);
    pthread_mutex_destroy(&m->cluster_lock);
    cluster_nodes_free(m->cluster_nodes, m->cluster_cnt);
    lags_free(m->lags, m->lag_cnt);
    lags_free(m->stalled, m->stalled_cnt);
    free(m->member_group);
    free(m->member_id);
    free(m);
}

static void counter_add(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static uint64_t counter_get(_Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

void idem_metrics_outcome_add(idem_metrics_t *m, idem_outcome_t o, uint64_t n)
{
    if ((unsigned)o < IDEM_OUTCOME_CNT)
        counter_add(&m->outcomes[o], n);
}

void idem_metrics_duplicate_add(idem_metrics_t *m, idem_dup_kind_t k,
                                uint64_t n)
{
    if ((unsigned)k < IDEM_DUP_CNT)
        counter_add(&m->duplicates[k], n);
}

void idem_metrics_dlq_add(idem_metrics_t *m, idem_reason_t r, uint64_t n)
{
    if ((unsigned)r < IDEM_REASON_CNT)
        counter_add(&m->dlq[r], n);
}

void idem_metrics_retry_add(idem_metrics_t *m, uint64_t n)
{
    counter_add(&m->retries, n);
}

void idem_metrics_redis_error_add(idem_metrics_t *m, const char *cls,
                                  uint64_t n)
{
    int i = 0;
    while (i < REDIS_CLASS_CNT - 1 &&
           !(cls && !strcmp(cls, idem_metrics_redis_classes[i])))
        i++;
    counter_add(&m->redis_errors[i], n);
}

void idem_metrics_redis_behind_add(idem_metrics_t *m, uint64_t n)
{
    counter_add(&m->redis_behind, n);
}

void idem_metrics_kafka_moved_add(idem_metrics_t *m, uint64_t n)
{
    counter_add(&m->kafka_moved, n);
}

void idem_metrics_redis_aof_rewrite_add(idem_metrics_t *m, const char *result)
{
    for (int i = 0; i < AOF_REWRITE_RESULT_CNT; i++)
        if (result && !strcmp(result, aof_rewrite_results[i]))
            counter_add(&m->aof_rewrites[i], 1);
}

void idem_metrics_position_mismatch_add(idem_metrics_t *m, const char *reason)
{
    for (int i = 0; i < MISMATCH_REASON_CNT; i++)
        if (reason && !strcmp(reason, idem_metrics_mismatch_reasons[i]))
            counter_add(&m->mismatches[i], 1);
}

void idem_metrics_redis_eviction_set(idem_metrics_t *m, int allowed)
{
    atomic_store_explicit(&m->redis_eviction_allowed, allowed ? 1 : 0,
                          memory_order_relaxed);
}

void idem_metrics_group_config_mismatch_set(idem_metrics_t *m, int64_t members)
{
    atomic_store_explicit(&m->group_config_mismatch, members,
                          memory_order_relaxed);
}

void idem_metrics_cluster_set(idem_metrics_t *m,
                              const idem_metrics_cluster_node_t *nodes,
                              size_t n, uint64_t refreshes)
{
    idem_metrics_cluster_node_t *v = idem_xcalloc(n ? n : 1, sizeof(*v));
    for (size_t i = 0; i < n; i++) {
        v[i] = nodes[i];
        v[i].node = idem_xstrdup(nodes[i].node ? nodes[i].node : "");
    }
    pthread_mutex_lock(&m->cluster_lock);
    idem_metrics_cluster_node_t *old = m->cluster_nodes;
    size_t old_cnt = m->cluster_cnt;
    m->cluster_nodes = v;
    m->cluster_cnt = n;
    m->cluster_refreshes = refreshes;
    m->cluster_on = 1;
    pthread_mutex_unlock(&m->cluster_lock);
    cluster_nodes_free(old, old_cnt);
}

void idem_metrics_commit_add(idem_metrics_t *m, int ok)
{
    if (ok) {
        counter_add(&m->commits_ok, 1);
        atomic_store_explicit(&m->last_commit_wall_ms, idem_wall_ms(),
                              memory_order_relaxed);
    } else {
        counter_add(&m->commits_error, 1);
    }
}

/* Unknown event names are ignored: a typo in the caller must not invent a
 * new series that no dashboard or alert knows about. */
void idem_metrics_rebalance_add(idem_metrics_t *m, const char *event)
{
    for (int i = 0; event && i < REB_CNT; i++)
        if (!strcmp(event, rebalance_names[i]))
            counter_add(&m->rebalances[i], 1);
}

void idem_metrics_latency_observe(idem_metrics_t *m, double seconds)
{
    histogram_observe(&m->latency, seconds);
}

void idem_metrics_effect_latency_observe(idem_metrics_t *m, double seconds)
{
    histogram_observe(&m->effect_latency, seconds);
}

void idem_metrics_fetch_latency_observe(idem_metrics_t *m, double seconds)
{
    histogram_observe(&m->fetch_latency, seconds);
}

void idem_metrics_batch_observe(idem_metrics_t *m, double records)
{
    histogram_observe(&m->batch, records);
}

void idem_metrics_redis_observe(idem_metrics_t *m, double seconds)
{
    histogram_observe(&m->redis, seconds);
}

/* ---- accumulators (one thread's, merged now and then) ----------------- */

/* One histogram's observations since the last merge, buckets as in
 * histogram_t. */
typedef struct {
    histogram_t *into; /* borrowed: the shared histogram, and its bounds */
    uint64_t buckets[HIST_MAX_BOUNDS + 1];
    uint64_t count;
    double sum;
} hist_acc_t;

struct idem_metrics_acc_s {
    idem_metrics_t *m; /* borrowed */
    uint64_t outcomes[IDEM_OUTCOME_CNT];
    int held; /* 1: something to merge */
    hist_acc_t latency;
    hist_acc_t effect_latency;
    hist_acc_t fetch_latency;
};

idem_metrics_acc_t *idem_metrics_acc_new(idem_metrics_t *m)
{
    idem_metrics_acc_t *a = idem_xcalloc(1, sizeof(*a));
    a->m = m;
    a->latency.into = &m->latency;
    a->effect_latency.into = &m->effect_latency;
    a->fetch_latency.into = &m->fetch_latency;
    return a;
}

void idem_metrics_acc_destroy(idem_metrics_acc_t *a)
{
    if (!a)
        return;
    idem_metrics_acc_merge(a);
    free(a);
}

static void hist_acc_observe(idem_metrics_acc_t *a, hist_acc_t *h, double v)
{
    if (isnan(v))
        return;
    h->buckets[histogram_bucket(h->into, v)]++;
    h->count++;
    h->sum += v;
    a->held = 1;
}

/* All of h into its histogram under one lock, then h is empty. */
static void hist_acc_merge(hist_acc_t *h)
{
    if (!h->count)
        return;
    histogram_t *into = h->into;
    pthread_mutex_lock(&into->lock);
    for (size_t i = 0; i <= into->nbounds; i++)
        into->buckets[i] += h->buckets[i];
    into->count += h->count;
    into->sum += h->sum;
    pthread_mutex_unlock(&into->lock);
    memset(h->buckets, 0, sizeof(h->buckets));
    h->count = 0;
    h->sum = 0;
}

void idem_metrics_acc_outcome_add(idem_metrics_acc_t *a, idem_outcome_t o,
                                  uint64_t n)
{
    if ((unsigned)o < IDEM_OUTCOME_CNT) {
        a->outcomes[o] += n;
        a->held = 1;
    }
}

void idem_metrics_acc_latency_observe(idem_metrics_acc_t *a, double seconds)
{
    hist_acc_observe(a, &a->latency, seconds);
}

void idem_metrics_acc_effect_latency_observe(idem_metrics_acc_t *a,
                                             double seconds)
{
    hist_acc_observe(a, &a->effect_latency, seconds);
}

void idem_metrics_acc_fetch_latency_observe(idem_metrics_acc_t *a,
                                            double seconds)
{
    hist_acc_observe(a, &a->fetch_latency, seconds);
}

void idem_metrics_acc_merge(idem_metrics_acc_t *a)
{
    if (!a->held)
        return;
    for (int i = 0; i < IDEM_OUTCOME_CNT; i++)
        if (a->outcomes[i]) {
            counter_add(&a->m->outcomes[i], a->outcomes[i]);
            a->outcomes[i] = 0;
        }
    hist_acc_merge(&a->latency);
    hist_acc_merge(&a->effect_latency);
    hist_acc_merge(&a->fetch_latency);
    a->held = 0;
}

void idem_metrics_webhook_enable(idem_metrics_t *m)
{
    atomic_store(&m->webhook_on, 1);
}

static int webhook_class_index(const char *cls)
{
    int i = 0;
    while (i < WEBHOOK_CLASS_CNT - 1 &&
           !(cls && !strcmp(cls, idem_metrics_webhook_classes[i])))
        i++;
    return i;
}

void idem_metrics_webhook_request_add(idem_metrics_t *m, const char *cls)
{
    counter_add(&m->webhook_requests[webhook_class_index(cls)], 1);
}

void idem_metrics_webhook_latency_observe(idem_metrics_t *m, double seconds)
{
    histogram_observe(&m->webhook_latency, seconds);
}

uint64_t idem_metrics_webhook_request_get(idem_metrics_t *m, const char *cls)
{
    return counter_get(&m->webhook_requests[webhook_class_index(cls)]);
}

void idem_metrics_assigned_set(idem_metrics_t *m, int64_t partitions)
{
    atomic_store_explicit(&m->assigned, partitions, memory_order_relaxed);
}

void idem_metrics_retry_tiers_enable(idem_metrics_t *m,
                                     const char *const labels[], size_t n)
{
    if (n > RETRY_TIERS_MAX)
        n = RETRY_TIERS_MAX;
    for (size_t i = 0; i < n; i++)
        snprintf(m->retry_labels[i], sizeof(m->retry_labels[i]), "%s",
                 labels[i]);
    atomic_store(&m->retry_tiers, (int)n);
}

void idem_metrics_retry_topic_add(idem_metrics_t *m, int tier, uint64_t n)
{
    if (tier >= 1 && tier <= RETRY_TIERS_MAX)
        counter_add(&m->retry_topic[tier - 1], n);
}

uint64_t idem_metrics_retry_topic_get(idem_metrics_t *m, int tier)
{
    if (tier < 1 || tier > RETRY_TIERS_MAX)
        return 0;
    return counter_get(&m->retry_topic[tier - 1]);
}

void idem_metrics_ordering_set(idem_metrics_t *m, int64_t inflight,
                               int64_t keys_waiting, int64_t depth_hwm)
{
    atomic_store_explicit(&m->effects_inflight, inflight, memory_order_relaxed);
    atomic_store_explicit(&m->keys_waiting, keys_waiting, memory_order_relaxed);
    atomic_store_explicit(&m->key_depth_hwm, depth_hwm, memory_order_relaxed);
    atomic_store_explicit(&m->ordering_on, 1, memory_order_relaxed);
}

void idem_metrics_key_holds_set(idem_metrics_t *m, int64_t partitions)
{
    int64_t was = atomic_exchange_explicit(&m->key_holds, partitions,
                                           memory_order_relaxed);
    if (partitions > was)
        atomic_fetch_add_explicit(&m->key_holds_n, (uint64_t)(partitions - was),
                                  memory_order_relaxed);
}

void idem_metrics_dedup_table_set(idem_metrics_t *m, int64_t bytes,
                                  int64_t marks, int64_t max_bytes)
{
    atomic_store_explicit(&m->table_bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&m->table_marks, marks, memory_order_relaxed);
    atomic_store_explicit(&m->table_max, max_bytes, memory_order_relaxed);
    atomic_store_explicit(&m->table_on, 1, memory_order_relaxed);
}

void idem_metrics_member_memory_set(idem_metrics_t *m, int64_t max_bytes,
                                    int paused)
{
    int was = atomic_exchange_explicit(&m->memb_paused, paused ? 1 : 0,
                                       memory_order_relaxed);
    if (paused && !was)
        atomic_fetch_add_explicit(&m->memb_pauses, 1, memory_order_relaxed);
    atomic_store_explicit(&m->memb_max, max_bytes, memory_order_relaxed);
    atomic_store_explicit(&m->memb_on, 1, memory_order_relaxed);
}

void idem_metrics_dedup_layout_refusals_set(idem_metrics_t *m, uint64_t chunk,
                                            uint64_t global)
{
    atomic_store_explicit(&m->layout_refused_chunk, chunk,
                          memory_order_relaxed);
    atomic_store_explicit(&m->layout_refused_global, global,
                          memory_order_relaxed);
}

void idem_metrics_retry_waiting_set(idem_metrics_t *m, int64_t partitions)
{
    atomic_store_explicit(&m->retry_waiting, partitions, memory_order_relaxed);
}

void idem_metrics_paused_set(idem_metrics_t *m, int64_t partitions)
{
    atomic_store_explicit(&m->paused, partitions, memory_order_relaxed);
}

void idem_metrics_inflight_set(idem_metrics_t *m, int64_t records)
{
    atomic_store_explicit(&m->inflight, records, memory_order_relaxed);
}

void idem_metrics_script_unkillable_set(idem_metrics_t *m, const char *topic,
                                        int32_t partition, int64_t offset,
                                        size_t records)
{
    counter_add(&m->unkillable, 1);
    pthread_mutex_lock(&m->stuck_lock);
    m->stuck = 1;
    snprintf(m->stuck_topic, sizeof(m->stuck_topic), "%s", topic);
    m->stuck_partition = partition;
    m->stuck_offset = offset;
    m->stuck_records = records;
    pthread_mutex_unlock(&m->stuck_lock);
}

void idem_metrics_script_unkillable_clear(idem_metrics_t *m)
{
    pthread_mutex_lock(&m->stuck_lock);
    m->stuck = 0;
    pthread_mutex_unlock(&m->stuck_lock);
}

uint64_t idem_metrics_script_unkillable_get(idem_metrics_t *m)
{
    return counter_get(&m->unkillable);
}

void idem_metrics_ready_set(idem_metrics_t *m, int ready, const char *reason)
{
    pthread_mutex_lock(&m->ready_lock);
    m->ready = ready ? 1 : 0;
    snprintf(m->ready_reason, sizeof(m->ready_reason), "%s",
             (!ready && reason) ? reason : "");
    pthread_mutex_unlock(&m->ready_lock);
}

int idem_metrics_ready_get(idem_metrics_t *m, char *reason, size_t reason_size)
{
    pthread_mutex_lock(&m->ready_lock);
    int ready = m->ready;
    if (reason && reason_size > 0)
        snprintf(reason, reason_size, "%s", m->ready_reason);
    pthread_mutex_unlock(&m->ready_lock);
    return ready;
}

void idem_metrics_heartbeat(idem_metrics_t *m)
{
    idem_metrics_heartbeat_at(m, idem_now_ms());
}

void idem_metrics_heartbeat_at(idem_metrics_t *m, int64_t mono_ms)
{
    atomic_store_explicit(&m->heartbeat_mono_ms, mono_ms, memory_order_relaxed);
}

int64_t idem_metrics_heartbeat_age_ms(idem_metrics_t *m)
{
    int64_t age = idem_now_ms() - LOAD(m->heartbeat_mono_ms);
    return age < 0 ? 0 : age;
}

/* Appends one lag entry to *lags (grown as needed). */
static void lags_push(lag_entry_t **lags, size_t *cnt, size_t *cap,
                      const char *topic, int32_t partition, int64_t lag)
{
    if (*cnt == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        *lags = idem_xrealloc(*lags, *cap * sizeof(**lags));
    }
    (*lags)[*cnt].topic = idem_xstrdup(topic);
    (*lags)[*cnt].partition = partition;
    (*lags)[*cnt].lag = lag;
    (*cnt)++;
}

/* Parses a decimal partition id ("0".."2147483647"); -1 when it is not one
 * (librdkafka's internal "-1" UA partition included). */
static int32_t partition_parse(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 0 || v > INT32_MAX)
        return -1;
    return (int32_t)v;
}

/* We read "consumer_lag" (high watermark minus the *committed* offset), not
 * "consumer_lag_stored": the pipeline commits explicit offsets after the
 * contiguous finished prefix and never calls rd_kafka_offsets_store(), so the
 * stored offset is not maintained, and the committed offset is what a
 * restarted member would resume from, i.e. the work really outstanding.
 * Partitions librdkafka knows from metadata but does not fetch for us carry
 * -1 and are skipped, as are partitions no longer desired (revoked). */
int idem_metrics_stats_json(idem_metrics_t *m, const char *json, size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    int rc = idem_metrics_stats_doc(m, root);
    json_decref(root);
    return rc;
}

int idem_stats_partitions(const json_t *root,
                          void (*fn)(void *opaque, const char *topic,
                                     int32_t partition, const json_t *part),
                          void *opaque)
{
    json_t *topics = json_object_get(root, "topics");
    if (!json_is_object(topics))
        return -1;
    int n = 0;
    const char *tname;
    json_t *topic;
    json_object_foreach(topics, tname, topic)
    {
        json_t *parts = json_object_get(topic, "partitions");
        if (!json_is_object(parts))
            continue;
        const char *pname;
        json_t *part;
        json_object_foreach(parts, pname, part)
        {
            int32_t partition = partition_parse(pname);
            if (partition < 0)
                continue;
            fn(opaque, tname, partition, part);
            n++;
        }
    }
    return n;
}

typedef struct {
    lag_entry_t *lags;
    size_t cnt, cap;
} lag_list_t;

/* A partition's consumer_lag into the list (idem_stats_partitions' fn). */
static void lag_collect(void *opaque, const char *topic, int32_t partition,
                        const json_t *part)
{
    lag_list_t *l = opaque;
    json_t *desired = json_object_get(part, "desired");
    if (desired && json_is_false(desired))
        return;
    json_t *lag = json_object_get(part, "consumer_lag");
    if (!json_is_integer(lag) || json_integer_value(lag) < 0)
        return;
    lags_push(&l->lags, &l->cnt, &l->cap, topic, partition,
              (int64_t)json_integer_value(lag));
}

int idem_metrics_stats_doc(idem_metrics_t *m, const json_t *root)
{
    if (!root || !json_is_object(root))
        return -1;
    lag_list_t l = {NULL, 0, 0};
    idem_stats_partitions(root, lag_collect, &l);
    lag_entry_t *lags = l.lags;
    size_t cnt = l.cnt;

    pthread_mutex_lock(&m->lag_lock);
    lag_entry_t *old = m->lags;
    size_t old_cnt = m->lag_cnt;
    m->lags = lags;
    m->lag_cnt = cnt;
    m->lag_seen = 1;
    pthread_mutex_unlock(&m->lag_lock);
    lags_free(old, old_cnt);
    return 0;
}

void idem_metrics_stalled_set(idem_metrics_t *m, const idem_metrics_stall_t *v,
                              size_t n)
{
    lag_entry_t *copy = NULL;
    size_t cnt = 0, cap = 0;
    for (size_t i = 0; i < n; i++)
        lags_push(&copy, &cnt, &cap, v[i].topic, v[i].partition,
                  v[i].stalled ? 1 : 0);
    pthread_mutex_lock(&m->lag_lock);
    lag_entry_t *old = m->stalled;
    size_t old_cnt = m->stalled_cnt;
    m->stalled = copy;
    m->stalled_cnt = cnt;
    pthread_mutex_unlock(&m->lag_lock);
    lags_free(old, old_cnt);
}

void idem_metrics_stall_enable(idem_metrics_t *m)
{
    atomic_store(&m->stall_on, 1);
}

void idem_metrics_stall_add(idem_metrics_t *m)
{
    atomic_fetch_add_explicit(&m->stalls, 1, memory_order_relaxed);
}

void idem_metrics_stall_repair_add(idem_metrics_t *m)
{
    atomic_fetch_add_explicit(&m->stall_repairs, 1, memory_order_relaxed);
}

uint64_t idem_metrics_outcome_get(idem_metrics_t *m, idem_outcome_t o)
{
    return (unsigned)o < IDEM_OUTCOME_CNT ? counter_get(&m->outcomes[o]) : 0;
}

uint64_t idem_metrics_duplicate_get(idem_metrics_t *m, idem_dup_kind_t k)
{
    return (unsigned)k < IDEM_DUP_CNT ? counter_get(&m->duplicates[k]) : 0;
}

uint64_t idem_metrics_dlq_get(idem_metrics_t *m, idem_reason_t r)
{
    return (unsigned)r < IDEM_REASON_CNT ? counter_get(&m->dlq[r]) : 0;
}

int64_t idem_metrics_lag_total(idem_metrics_t *m)
{
    pthread_mutex_lock(&m->lag_lock);
    int64_t total = m->lag_seen ? 0 : -1;
    for (size_t i = 0; i < m->lag_cnt; i++)
        total += m->lags[i].lag;
    pthread_mutex_unlock(&m->lag_lock);
    return total;
}

/* ---- rendering ---------------------------------------------------------- */

void idem_metrics_escape_label(const char *value, FILE *out)
{
    for (const char *p = value; *p; p++) {
        if (*p == '\\')
            fputs("\\\\", out);
        else if (*p == '"')
            fputs("\\\"", out);
        else if (*p == '\n')
            fputs("\\n", out);
        else
            fputc(*p, out);
    }
}

/* Writes v with the fewest digits that read back as the same double, so
 * bounds print as "0.0005" and sums are exact; +Inf/-Inf/NaN as Prometheus
 * spells them. */
static void put_double(FILE *out, double v)
{
    if (isnan(v)) {
        fputs("NaN", out);
        return;
    }
    if (isinf(v)) {
        fputs(v > 0 ? "+Inf" : "-Inf", out);
        return;
    }
    /* Like Go's strconv 'g' with shortest precision: no exponent for
     * integers below 1e21 ("10000", not "1e+04"). */
    int min_prec = 1;
    if (fabs(v) >= 1 && fabs(v) < 1e21)
        min_prec = (int)floor(log10(fabs(v))) + 1;
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, v);
        if (strtod(buf, NULL) == v) {
            if (prec < min_prec)
                snprintf(buf, sizeof(buf), "%.*g", min_prec, v);
            break;
        }
    }
    fputs(buf, out);
}

static void put_header(FILE *out, const char *name, const char *type,
                       const char *help)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample with at most one label (label NULL = none). */
static void put_u64(FILE *out, const char *name, const char *label,
                    const char *value, uint64_t v)
{
    fputs(name, out);
    if (label) {
        fprintf(out, "{%s=\"", label);
        idem_metrics_escape_label(value, out);
        fputs("\"}", out);
    }
    fprintf(out, " %" PRIu64 "\n", v);
}

static void put_i64(FILE *out, const char *name, int64_t v)
{
    fprintf(out, "%s %" PRId64 "\n", name, v);
}

/* A gauge and a counter of one sample without labels: the header and the
 * value. */
static void put_gauge(FILE *out, const char *name, const char *help, int64_t v)
{
    put_header(out, name, "gauge", help);
    put_i64(out, name, v);
}

static void put_counter(FILE *out, const char *name, const char *help,
                        uint64_t v)
{
    put_header(out, name, "counter", help);
    put_u64(out, name, NULL, NULL, v);
}

/* The cluster client's counters per node (idem_metrics_cluster_set). */
static void render_cluster(FILE *out, idem_metrics_t *m)
{
    static const struct {
        const char *name, *help;
        size_t off;
    } col[] = {
        {"idemproc_redis_cluster_requests_total",
         "Commands the member's cluster client sent to the node.",
         offsetof(idem_metrics_cluster_node_t, requests)},
        {"idemproc_redis_cluster_moved_total",
         "MOVED replies from the node (its slot moved: the map is patched).",
         offsetof(idem_metrics_cluster_node_t, moved)},
        {"idemproc_redis_cluster_ask_total",
         "ASK replies from the node (a slot migrating away from it).",
         offsetof(idem_metrics_cluster_node_t, ask)},
        {"idemproc_redis_cluster_tryagain_total",
         "TRYAGAIN replies from the node (keys split by a migration).",
         offsetof(idem_metrics_cluster_node_t, tryagain)},
        {"idemproc_redis_cluster_clusterdown_total",
         "CLUSTERDOWN replies from the node (a slot without a primary: "
         "the member pauses).",
         offsetof(idem_metrics_cluster_node_t, clusterdown)},
        {"idemproc_redis_cluster_connection_errors_total",
         "Connects to the node that failed and connections to it lost.",
         offsetof(idem_metrics_cluster_node_t, conn_errors)},
        {"idemproc_redis_cluster_timeouts_total",
         "Connects or replies of the node that took redis.timeout.ms.",
         offsetof(idem_metrics_cluster_node_t, timeouts)},
    };
    pthread_mutex_lock(&m->cluster_lock);
    if (!m->cluster_on) {
        pthread_mutex_unlock(&m->cluster_lock);
        return;
    }
    for (size_t c = 0; c < sizeof(col) / sizeof(col[0]); c++) {
        put_header(out, col[c].name, "counter", col[c].help);
        for (size_t i = 0; i < m->cluster_cnt; i++)
            put_u64(out, col[c].name, "node", m->cluster_nodes[i].node,
                    *(const uint64_t *)((const char *)&m->cluster_nodes[i] +
                                        col[c].off));
    }
    put_header(out, "idemproc_redis_cluster_slot_map_refreshes_total",
               "counter",
               "Reads of the whole slot map (CLUSTER SLOTS), the first "
               "included.");
    put_u64(out, "idemproc_redis_cluster_slot_map_refreshes_total", NULL, NULL,
            m->cluster_refreshes);
    pthread_mutex_unlock(&m->cluster_lock);
}

static void render_histogram(FILE *out, histogram_t *h)
{
    uint64_t buckets[HIST_MAX_BOUNDS + 1];
    pthread_mutex_lock(&h->lock);
    memcpy(buckets, h->buckets, sizeof(buckets));
    uint64_t count = h->count;
    double sum = h->sum;
    pthread_mutex_unlock(&h->lock);

    put_header(out, h->name, "histogram", h->help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= h->nbounds; i++) {
        cumulative += buckets[i];
        fprintf(out, "%s_bucket{le=\"", h->name);
        put_double(out, i < h->nbounds ? h->bounds[i] : INFINITY);
        fprintf(out, "\"} %" PRIu64 "\n", cumulative);
    }
    fprintf(out, "%s_sum ", h->name);
    put_double(out, sum);
    fprintf(out, "\n%s_count %" PRIu64 "\n", h->name, count);
}

/* One sample per partition of a gauge: name{topic,partition} value. */
static void render_parts(FILE *out, const char *name, const lag_entry_t *e,
                         size_t cnt)
{
    for (size_t i = 0; i < cnt; i++) {
        fprintf(out, "%s{topic=\"", name);
        idem_metrics_escape_label(e[i].topic, out);
        fprintf(out, "\",partition=\"%" PRId32 "\"} %" PRId64 "\n",
                e[i].partition, e[i].lag);
    }
}

static void render_lag(FILE *out, idem_metrics_t *m)
{
    put_header(out, "idemproc_consumer_lag_records", "gauge",
               "Records behind the partition high watermark, from the last "
               "committed offset (librdkafka statistics consumer_lag).");
    pthread_mutex_lock(&m->lag_lock);
    render_parts(out, "idemproc_consumer_lag_records", m->lags, m->lag_cnt);
    pthread_mutex_unlock(&m->lag_lock);
}

static void render_stalled(FILE *out, idem_metrics_t *m)
{
    put_header(out, "idemproc_partition_stalled", "gauge",
               "1 while an assigned partition, not paused by the member and "
               "behind its end, has not been fetched for fetch.stall.ms.");
    pthread_mutex_lock(&m->lag_lock);
    render_parts(out, "idemproc_partition_stalled", m->stalled, m->stalled_cnt);
    pthread_mutex_unlock(&m->lag_lock);
    put_counter(out, "idemproc_partition_stalls_total",
                "Stalled partitions found (assigned, not paused by the "
                "member, not fetched for fetch.stall.ms).",
                counter_get(&m->stalls));
    put_counter(out, "idemproc_partition_stall_repairs_total",
                "Repairs of stalled partitions (resume, then seek to the "
                "member's position).",
                counter_get(&m->stall_repairs));
}

static void render_unkillable(FILE *out, idem_metrics_t *m)
{
    put_counter(out, "idemproc_script_unkillable_total",
                "Script requests that ran past script.timeout.ms after they "
                "wrote, so Redis refused SCRIPT KILL (UNKILLABLE) and served "
                "no client until restarted.",
                counter_get(&m->unkillable));
    pthread_mutex_lock(&m->stuck_lock);
    if (m->stuck) {
        put_header(out, "idemproc_script_unkillable_offset", "gauge",
                   "While a script request Redis cannot end is in flight: "
                   "the offset of its first record (records: how many it "
                   "holds; 1: this is the record).");
        fputs("idemproc_script_unkillable_offset{topic=\"", out);
        idem_metrics_escape_label(m->stuck_topic, out);
        fprintf(out,
                "\",partition=\"%" PRId32 "\",records=\"%zu\"} %" PRId64 "\n",
                m->stuck_partition, m->stuck_records, m->stuck_offset);
    }
    pthread_mutex_unlock(&m->stuck_lock);
}

void idem_metrics_set_extra(idem_metrics_t *m, idem_metrics_render_cb *cb,
                            void *opaque)
{
    m->extra_render = cb;
    m->extra_opaque = opaque;
}

void idem_metrics_member_set(idem_metrics_t *m, const char *group,
                             const char *member)
{
    free(m->member_group);
    free(m->member_id);
    m->member_group = idem_xstrdup(group ? group : "");
    m->member_id = idem_xstrdup(member ? member : "");
}

void idem_metrics_render(idem_metrics_t *m, FILE *out)
{
    put_header(out, "idemproc_records_total", "counter",
               "Consumed records by final outcome.");
    for (int i = 0; i < IDEM_OUTCOME_CNT; i++)
        put_u64(out, "idemproc_records_total", "outcome",
                idem_outcome2str((idem_outcome_t)i),
                counter_get(&m->outcomes[i]));

    put_header(out, "idemproc_duplicates_total", "counter",
               "Duplicate records skipped, by kind (redelivery: same "
               "message_id; resend: same idempotency_key, new message_id).");
    for (int i = 0; i < IDEM_DUP_CNT; i++)
        put_u64(out, "idemproc_duplicates_total", "kind",
                idem_dup_kind2str((idem_dup_kind_t)i),
                counter_get(&m->duplicates[i]));

    put_header(out, "idemproc_dlq_records_total", "counter",
               "Records written to the dead-letter topic, by dlq.reason.");
    for (int i = 0; i < IDEM_REASON_CNT; i++)
        put_u64(out, "idemproc_dlq_records_total", "reason",
                idem_reason2str((idem_reason_t)i), counter_get(&m->dlq[i]));

    put_counter(out, "idemproc_retries_total",
                "Retries of retryable handler errors.",
                counter_get(&m->retries));

    int tiers = atomic_load(&m->retry_tiers);
    if (tiers) {
        put_header(out, "idemproc_retry_topic_records_total", "counter",
                   "Records written to a retry topic (retry.topics), by "
                   "tier (its delay).");
        for (int i = 0; i < tiers; i++)
            put_u64(out, "idemproc_retry_topic_records_total", "tier",
                    m->retry_labels[i], counter_get(&m->retry_topic[i]));
        put_gauge(out, "idemproc_retry_partitions_waiting",
                  "Retry topic partitions paused until their head record "
                  "is due.",
                  LOAD(m->retry_waiting));
    }

    if (LOAD(m->ordering_on)) {
        put_gauge(out, "idemproc_effects_in_flight",
                  "Records with an external effect's handler now.",
                  LOAD(m->effects_inflight));
        put_gauge(out, "idemproc_ordering_keys_waiting",
                  "Keys (ordering=key; partitions with ordering=partition) "
                  "with records in hand held back behind an earlier record "
                  "of theirs.",
                  LOAD(m->keys_waiting));
        put_gauge(out, "idemproc_ordering_key_depth_max",
                  "Most unfinished records of one key (or partition) in "
                  "hand at once since start: the deepest per-key queue.",
                  LOAD(m->key_depth_hwm));
        put_gauge(out, "idemproc_ordering_partitions_held",
                  "Partitions whose fetch is paused because their records "
                  "in hand all wait behind busy keys.",
                  LOAD(m->key_holds));
        put_counter(out, "idemproc_ordering_partition_holds_total",
                    "Times a partition's fetch paused because its records in "
                    "hand all waited behind busy keys.",
                    LOAD(m->key_holds_n));
    }

    if (LOAD(m->table_on)) {
        put_gauge(out, "idemproc_dedup_table_bytes",
                  "Bytes of the member's partition tables of dedup marks "
                  "(dedup.scope=partition).",
                  LOAD(m->table_bytes));
        put_gauge(out, "idemproc_dedup_table_marks",
                  "Dedup marks the member's partition tables hold.",
                  LOAD(m->table_marks));
        put_gauge(out, "idemproc_dedup_memory_max_bytes",
                  "dedup.memory.max: the bound of the partition tables; at "
                  "it, records that need a new mark wait (never evicted).",
                  LOAD(m->table_max));
        put_header(out, "idemproc_dedup_layout_refusals_total", "counter",
                   "Dedup scripts refused because the group's layout key "
                   "changed (script=chunk: partition chunks; "
                   "script=global: failed global requests after which the "
                   "key was found changed).");
        put_u64(out, "idemproc_dedup_layout_refusals_total", "script", "chunk",
                LOAD(m->layout_refused_chunk));
        put_u64(out, "idemproc_dedup_layout_refusals_total", "script", "global",
                LOAD(m->layout_refused_global));
    }
    if (LOAD(m->memb_on)) {
        put_gauge(out, "idemproc_member_memory_max_bytes",
                  "member.memory.max: the bound of the member's resident "
                  "memory.",
                  LOAD(m->memb_max));
        put_gauge(out, "idemproc_member_memory_paused",
                  "1 while fetching is paused because the member's "
                  "resident memory passed member.memory.max.",
                  LOAD(m->memb_paused));
        put_counter(out, "idemproc_member_memory_pauses_total",
                    "Times fetching paused because the member's resident "
                    "memory passed member.memory.max.",
                    LOAD(m->memb_pauses));
    }

    render_histogram(out, &m->latency);
    render_histogram(out, &m->effect_latency);
    render_histogram(out, &m->fetch_latency);
    render_histogram(out, &m->batch);
    render_histogram(out, &m->redis);

    if (atomic_load(&m->webhook_on)) {
        put_header(out, "idemproc_webhook_requests_total", "counter",
                   "Webhook requests sent, by result: the status class "
                   "of the response, or connect, timeout, tls, resent "
                   "(sent again by libcurl on a fresh connection), "
                   "error.");
        for (int i = 0; i < WEBHOOK_CLASS_CNT; i++)
            put_u64(out, "idemproc_webhook_requests_total", "class",
                    idem_metrics_webhook_classes[i],
                    counter_get(&m->webhook_requests[i]));
        render_histogram(out, &m->webhook_latency);
    }

    render_unkillable(out, m);

    put_header(out, "idemproc_redis_errors_total", "counter",
               "Failed Redis commands or connections, by class (all of them "
               "outages: the member pauses).");
    for (int i = 0; i < REDIS_CLASS_CNT; i++)
        put_u64(out, "idemproc_redis_errors_total", "class",
                idem_metrics_redis_classes[i],
                counter_get(&m->redis_errors[i]));
    put_counter(out, "idemproc_redis_position_behind_total",
                "Partitions whose position in Redis was behind the one it "
                "acknowledged or Kafka's committed offset (Redis lost "
                "writes); the member rewound them.",
                counter_get(&m->redis_behind));
    put_counter(out, "idemproc_kafka_offset_moved_total",
                "Partitions whose committed offset in Kafka was moved by "
                "another tool (not a member, not idemproc offsets reset); "
                "not honoured: the member started from Redis's position.",
                counter_get(&m->kafka_moved));
    put_header(out, "idemproc_redis_aof_rewrites_total", "counter",
               "AOF rewrites a member waited for before its first write to "
               "a new Redis server, by result (refused: BGREWRITEAOF was "
               "refused; the member writes nothing to that server).");
    for (int i = 0; i < AOF_REWRITE_RESULT_CNT; i++)
        put_u64(out, "idemproc_redis_aof_rewrites_total", "result",
                aof_rewrite_results[i], counter_get(&m->aof_rewrites[i]));
    put_header(out, "idemproc_position_mismatch_total", "counter",
               "Positions in Redis never used because they belong to "
               "another Kafka cluster (cluster), another incarnation of the "
               "topic (record) or lie past the partition's end (past-end).");
    for (int i = 0; i < MISMATCH_REASON_CNT; i++)
        put_u64(out, "idemproc_position_mismatch_total", "reason",
                idem_metrics_mismatch_reasons[i],
                counter_get(&m->mismatches[i]));
    put_gauge(out, "idemproc_redis_eviction_allowed",
              "1 while the member runs against an evicting "
              "maxmemory-policy because redis.allow.eviction=true.",
              LOAD(m->redis_eviction_allowed));
    put_gauge(out, "idemproc_group_config_mismatch",
              "Other live members of the group whose effect-defining "
              "settings (handler, its keys, envelope) differ from this "
              "member's, as of the last heartbeat.",
              LOAD(m->group_config_mismatch));

    put_header(out, "idemproc_commits_total", "counter",
               "Offset commits by result.");
    put_u64(out, "idemproc_commits_total", "result", "ok",
            counter_get(&m->commits_ok));
    put_u64(out, "idemproc_commits_total", "result", "error",
            counter_get(&m->commits_error));

    put_header(out, "idemproc_last_commit_timestamp_seconds", "gauge",
               "Unix time of the last successful offset commit (0: none "
               "yet).");
    fputs("idemproc_last_commit_timestamp_seconds ", out);
    put_double(out, (double)LOAD(m->last_commit_wall_ms) / 1000.0);
    fputc('\n', out);

    put_header(out, "idemproc_rebalances_total", "counter",
               "Consumer group rebalance events.");
    for (int i = 0; i < REB_CNT; i++)
        put_u64(out, "idemproc_rebalances_total", "event", rebalance_names[i],
                counter_get(&m->rebalances[i]));

    put_gauge(out, "idemproc_assigned_partitions",
              "Partitions currently assigned to this member.",
              LOAD(m->assigned));
    put_gauge(out, "idemproc_paused_partitions",
              "Assigned partitions currently paused (backpressure or "
              "infrastructure failure).",
              LOAD(m->paused));
    put_gauge(out, "idemproc_inflight_records",
              "Records fetched whose outcome is not final yet.",
              LOAD(m->inflight));

    render_lag(out, m);
    render_cluster(out, m);
    if (atomic_load(&m->stall_on))
        render_stalled(out, m);

    put_gauge(out, "idemproc_ready",
              "1 when the processor is ready (see /readyz), else 0.",
              idem_metrics_ready_get(m, NULL, 0));

    put_header(out, "idemproc_build_info", "gauge",
               "Build information; the value is always 1.");
    fputs("idemproc_build_info{version=\"", out);
    idem_metrics_escape_label(IDEM_VERSION, out);
    fputs("\",librdkafka=\"", out);
    idem_metrics_escape_label(rd_kafka_version_str(), out);
    fputs("\"} 1\n", out);

    put_header(out, "idemproc_start_time_seconds", "gauge",
               "Unix time the process started.");
    fputs("idemproc_start_time_seconds ", out);
    put_double(out, (double)m->start_wall_ms / 1000.0);
    fputc('\n', out);

    if (m->member_group) {
        put_header(out, "idemproc_member_info", "gauge",
                   "The member's consumer group (group.id) and id "
                   "(member.id); the value is always 1.");
        fputs("idemproc_member_info{group=\"", out);
        idem_metrics_escape_label(m->member_group, out);
        fputs("\",member=\"", out);
        idem_metrics_escape_label(m->member_id, out);
        fputs("\"} 1\n", out);
    }

    idem_procstat_t ps;
    idem_procstat_read(&ps);
    idem_procstat_render(&ps, out);

    if (m->extra_render)
        m->extra_render(m->extra_opaque, out);
}
