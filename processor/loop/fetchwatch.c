/* fetchwatch: the stalled-partition watch over librdkafka statistics
 * (fetchwatch.h; docs/design.md, "A partition assigned but never
 * fetched"). */
#include "loop/fetchwatch.h"
#include "base/log.h"
#include "loop/rebalance.h"
#include "base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAULT_TIMES_MAX   100  /* dev.fault.fetch.pause's TIMES */
#define QUERY_TIMEOUT_MS  2000 /* one watermark query (also bounds destroy) */
#define QUERY_PENDING_MAX 256  /* queries waiting; more wait a turn */

/* A partition whose end the broker is asked for, or was. */
typedef struct {
    char *topic; /* owned */
    int32_t partition;
    int64_t end; /* the answer; -1 before */
} query_t;

/* One partition the watch saw in the last document. */
typedef struct {
    char *topic; /* owned */
    int32_t partition;
    uint64_t seen;          /* generation of the last document naming it */
    int64_t ok_since_ms;    /* last time it was fetching, caught up, or not
                               ours to fetch */
    int64_t quiet_since_ms; /* since when it is caught up and idle (the
                               broker is asked after fetch.stall.ms); 0:
                               not quiet */
    int eager_said;         /* "restart the member" logged in this stall */
    int64_t last_next;      /* next_offset in the previous document */
    int stalled;            /* found stalled and repaired once */
    int64_t repaired_ms;    /* when the last repair was made */
    int unready;            /* still stalled after a repair */
    int repairs_tried;      /* repairs in this stall */
    int64_t asked_ms;       /* when its end was last asked of the broker */
    int64_t end_pending;    /* the broker's answer, trusted from the next
                               document on (the fetcher had time to act) */
    int64_t end_queried;    /* the broker's end, trusted; -1: none */
    char fetch_state[16];   /* as last seen, for the reason */
    int64_t lag;            /* end minus next_offset, as last seen */
    int64_t last_app;       /* app_offset in the previous document */
    int64_t fetchq;         /* fetchq_cnt, as last seen */
    int out;                /* a repair took it out of the assignment and
                               the assign back failed: assigned again every
                               stall_ms until librdkafka takes it */
} watch_entry_t;

struct idem_fetchwatch_s {
    int64_t stall_ms;
    rd_kafka_t *rk;
    idem_metrics_t *m;
    idem_fetchwatch_member_cb *member;
    void *opaque;
    watch_entry_t *v;
    size_t cnt, cap;
    uint64_t gen;
    int64_t now_ms; /* of the document being judged */
    uint64_t stalls, repairs, reassigns;
    /* Watermark queries (a partition that looks caught up may only not
     * know better: the statistics' high watermark comes from fetch
     * responses, so a partition not fetched keeps a stale one). They
     * block, so a thread of the watch makes them. */
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t cond;
    pthread_t thread;
    int thread_on, stop;
    query_t *asks, *answers;
    size_t ask_cnt, answer_cnt, answer_cap;
    uint64_t queries_started, queries_done; /* for tests */
    int was_unready;
    int closing; /* the member is leaving: judge and repair nothing */
    char reason[300];
    /* dev.fault.fetch.pause: the partition paused behind the member's back
     * (once), and how many of the repairs that follow are dropped. */
    char fault_topic[256];
    int32_t fault_partition;
    int fault_left;
    int fault_started;
    int fault_assign_left; /* dev.fault.fetch.assign.fail: assigns refused */
};

/* ------------------------------------------------------------ parsing */

static int64_t int_field(const json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    if (!json_is_integer(v))
        return -1;
    json_int_t x = json_integer_value(v);
    return x < 0 ? -1 : (int64_t)x; /* -1001: librdkafka's "invalid" */
}

typedef struct {
    void (*fn)(void *opaque, const idem_fetchwatch_part_t *part);
    void *opaque;
    int n;
} parse_ctx_t;

/* One partition object, if librdkafka fetches it for us ("desired"). */
static void parse_part(void *opaque, const char *topic, int32_t partition,
                       const json_t *part)
{
    parse_ctx_t *c = opaque;
    if (!json_is_true(json_object_get(part, "desired")))
        return;
    idem_fetchwatch_part_t p;
    p.partition = partition;
    p.topic = topic;
    const char *st = json_string_value(json_object_get(part, "fetch_state"));
    snprintf(p.fetch_state, sizeof(p.fetch_state), "%s", st ? st : "?");
    p.fetchq_cnt = int_field(part, "fetchq_cnt");
    p.next_offset = int_field(part, "next_offset");
    p.app_offset = int_field(part, "app_offset");
    p.hi_offset = int_field(part, "hi_offset");
    p.ls_offset = int_field(part, "ls_offset");
    p.consumer_lag = int_field(part, "consumer_lag");
    json_t *leader = json_object_get(part, "leader");
    p.leader = json_is_integer(leader) ? (int32_t)json_integer_value(leader)
                                       : 0; /* absent: not known lost */
    c->fn(c->opaque, &p);
    c->n++;
}

int idem_fetchwatch_parse(const json_t *root,
                          void (*fn)(void *opaque,
                                     const idem_fetchwatch_part_t *part),
                          void *opaque)
{
    parse_ctx_t c = {fn, opaque, 0};
    if (idem_stats_partitions(root, parse_part, &c) < 0)
        return -1;
    return c.n;
}

/* ------------------------------------------------------------- faults */

/* Splits "TOPIC:PARTITION[:TIMES]". Returns 0 or -1 with errstr. */
static int fault_parse(const char *value, char *topic, size_t topic_size,
                       int32_t *partition, int *times, char *errstr,
                       size_t errstr_size)
{
    const char *c1 = strchr(value, ':');
    char *end;
    if (!c1 || c1 == value || (size_t)(c1 - value) >= topic_size)
        goto bad;
    memcpy(topic, value, (size_t)(c1 - value));
    topic[c1 - value] = '\0';
    errno = 0;
    long p = strtol(c1 + 1, &end, 10);
    if (errno || end == c1 + 1 || p < 0 || p > INT32_MAX ||
        (*end && *end != ':'))
        goto bad;
    *partition = (int32_t)p;
    *times = 1;
    if (*end == ':') {
        const char *t = end + 1;
        long n = strtol(t, &end, 10);
        if (end == t || *end || n < 1 || n > FAULT_TIMES_MAX)
            goto bad;
        *times = (int)n;
    }
    return 0;
bad:
    snprintf(errstr, errstr_size,
             "dev.fault.fetch.pause: \"%s\" is not TOPIC:PARTITION or "
             "TOPIC:PARTITION:TIMES (TIMES 1..%d)",
             value, FAULT_TIMES_MAX);
    return -1;
}

int idem_fetchwatch_fault_check(const char *value, char *errstr,
                                size_t errstr_size)
{
    char topic[256];
    int32_t partition;
    int times;
    if (!value || !*value)
        return 0;
    return fault_parse(value, topic, sizeof(topic), &partition, &times, errstr,
                       errstr_size);
}

/* Whether e is the fault's partition. */
static int fault_partition(const idem_fetchwatch_t *fw, const char *topic,
                           int32_t partition)
{
    return fw->fault_topic[0] && partition == fw->fault_partition &&
           !strcmp(topic, fw->fault_topic);
}

/* The fault: pauses its partition inside librdkafka without telling the
 * member, what a lost fetch start looks like from outside. */
static void fault_pause(idem_fetchwatch_t *fw)
{
    fw->fault_started = 1;
    if (!fw->rk)
        return;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, fw->fault_topic, fw->fault_partition);
    idem_rebalance_pause(fw->rk, l, 1);
    rd_kafka_topic_partition_list_destroy(l);
    char part[16];
    snprintf(part, sizeof(part), "%" PRId32, fw->fault_partition);
    idem_log_kv(IDEM_LOG_WARN,
                "fault: partition paused behind the member's back", "topic",
                fw->fault_topic, "partition", part, NULL);
}

/* ------------------------------------------------- watermark queries */

/* The query thread: asks the broker for the high watermark of each
 * partition handed to it and leaves the answer for the next document. */
static void *query_main(void *arg)
{
    idem_fetchwatch_t *fw = arg;
    pthread_mutex_lock(&fw->lock);
    for (;;) {
        while (!fw->stop && fw->ask_cnt == 0)
            pthread_cond_wait(&fw->cond, &fw->lock);
        if (fw->stop)
            break;
        query_t q = fw->asks[--fw->ask_cnt];
        fw->queries_started++;
        pthread_mutex_unlock(&fw->lock);
        int64_t lo = -1, hi = -1;
        rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
            fw->rk, q.topic, q.partition, &lo, &hi, QUERY_TIMEOUT_MS);
        pthread_mutex_lock(&fw->lock);
        fw->queries_done++;
        if (err || hi < 0) {
            free(q.topic);
            continue;
        }
        q.end = hi;
        if (fw->answer_cnt == fw->answer_cap) {
            fw->answer_cap = fw->answer_cap ? fw->answer_cap * 2 : 16;
            fw->answers =
                idem_xrealloc(fw->answers, fw->answer_cap * sizeof(query_t));
        }
        fw->answers[fw->answer_cnt++] = q;
    }
    pthread_mutex_unlock(&fw->lock);
    return NULL;
}

/* Hands one partition to the query thread (dropped when QUERY_PENDING_MAX
 * wait: asked again fetch.stall.ms later). */
static void query_ask(idem_fetchwatch_t *fw, const char *topic,
                      int32_t partition)
{
    pthread_mutex_lock(&fw->lock);
    if (fw->ask_cnt < QUERY_PENDING_MAX) {
        fw->asks[fw->ask_cnt].topic = idem_xstrdup(topic);
        fw->asks[fw->ask_cnt].partition = partition;
        fw->asks[fw->ask_cnt].end = -1;
        fw->ask_cnt++;
        pthread_cond_signal(&fw->cond);
    }
    pthread_mutex_unlock(&fw->lock);
}

/* ------------------------------------------------------------ the watch */

idem_fetchwatch_t *idem_fetchwatch_new(int64_t stall_ms, rd_kafka_t *rk,
                                       idem_metrics_t *m,
                                       idem_fetchwatch_member_cb *member,
                                       void *opaque, const char *fault)
{
    idem_fetchwatch_t *fw = idem_xcalloc(1, sizeof(*fw));
    fw->stall_ms = stall_ms > 0 ? stall_ms : 1;
    fw->rk = rk;
    fw->m = m;
    fw->member = member;
    fw->opaque = opaque;
    if (m)
        idem_metrics_stall_enable(m);
    pthread_mutex_init(&fw->lock, NULL);
    pthread_cond_init(&fw->cond, NULL);
    fw->asks = idem_xcalloc(QUERY_PENDING_MAX, sizeof(*fw->asks));
    if (rk && pthread_create(&fw->thread, NULL, query_main, fw) == 0)
        fw->thread_on = 1;
    char e[300];
    if (fault && *fault &&
        fault_parse(fault, fw->fault_topic, sizeof(fw->fault_topic),
                    &fw->fault_partition, &fw->fault_left, e, sizeof(e)))
        fw->fault_topic[0] = '\0'; /* checked by finalize; never here */
    fw->fault_left--;              /* TIMES - 1 repairs dropped */
    return fw;
}

void idem_fetchwatch_stop(idem_fetchwatch_t *fw)
{
    if (!fw)
        return;
    fw->closing = 1;
    if (fw->thread_on) {
        pthread_mutex_lock(&fw->lock);
        fw->stop = 1;
        pthread_cond_signal(&fw->cond);
        pthread_mutex_unlock(&fw->lock);
        pthread_join(fw->thread, NULL); /* at most QUERY_TIMEOUT_MS */
        fw->thread_on = 0;
    }
}

void idem_fetchwatch_closing(idem_fetchwatch_t *fw)
{
    if (fw)
        fw->closing = 1;
}

void idem_fetchwatch_destroy(idem_fetchwatch_t *fw)
{
    if (!fw)
        return;
    idem_fetchwatch_stop(fw);
    pthread_mutex_destroy(&fw->lock);
    pthread_cond_destroy(&fw->cond);
    for (size_t i = 0; i < fw->ask_cnt; i++)
        free(fw->asks[i].topic);
    for (size_t i = 0; i < fw->answer_cnt; i++)
        free(fw->answers[i].topic);
    free(fw->asks);
    free(fw->answers);
    for (size_t i = 0; i < fw->cnt; i++)
        free(fw->v[i].topic);
    free(fw->v);
    free(fw);
}

static watch_entry_t *entry_get(idem_fetchwatch_t *fw, const char *topic,
                                int32_t partition)
{
    for (size_t i = 0; i < fw->cnt; i++)
        if (fw->v[i].partition == partition && !strcmp(fw->v[i].topic, topic))
            return &fw->v[i];
    if (fw->cnt == fw->cap) {
        fw->cap = fw->cap ? fw->cap * 2 : 16;
        fw->v = idem_xrealloc(fw->v, fw->cap * sizeof(*fw->v));
    }
    watch_entry_t *e = &fw->v[fw->cnt++];
    memset(e, 0, sizeof(*e));
    e->topic = idem_xstrdup(topic);
    e->partition = partition;
    e->ok_since_ms = fw->now_ms;
    e->last_next = -2; /* the first document always counts as a move */
    e->last_app = -2;
    e->end_pending = -1;
    e->end_queried = -1;
    return e;
}

/* The light repair: seek a started fetch to position (librdkafka refuses
 * a seek of a fetch that never started). Logs a failure. */
static void seek_one(idem_fetchwatch_t *fw, rd_kafka_topic_partition_list_t *l,
                     const char *part, int64_t position, const char *pos)
{
    if (position < 0)
        return;
    l->elems[0].offset = position;
    l->elems[0].err = RD_KAFKA_RESP_ERR_NO_ERROR;
    rd_kafka_error_t *ke = rd_kafka_seek_partitions(fw->rk, l, 0);
    /* Asynchronous (timeout 0): "in progress" is the good answer. */
    if (!ke &&
        (!l->elems[0].err || l->elems[0].err == RD_KAFKA_RESP_ERR__IN_PROGRESS))
        return;
    idem_log_kv(IDEM_LOG_WARN, "stalled partition: seek failed", "topic",
                l->elems[0].topic, "partition", part, "offset", pos, "error",
                ke ? rd_kafka_error_string(ke)
                   : rd_kafka_err2str(l->elems[0].err),
                NULL);
    rd_kafka_error_destroy(ke);
}

/* The assign half of the heavy repair (l borrowed; one partition).
 * dev.fault.fetch.assign.fail refuses it, also without a consumer. Returns 0,
 * or -1 (logged here or by rebalance.c). */
static int assign_back(idem_fetchwatch_t *fw,
                       const rd_kafka_topic_partition_list_t *l,
                       const char *part)
{
    if (fw->fault_assign_left > 0) {
        fw->fault_assign_left--;
        idem_log_kv(IDEM_LOG_WARN, "fault: assign refused", "topic",
                    l->elems[0].topic, "partition", part, NULL);
        return -1;
    }
    char errstr[512];
    return fw->rk && idem_rebalance_assign(fw->rk, l, errstr, sizeof(errstr))
               ? -1
               : 0;
}

/* The heavy repair: the partition leaves the assignment and comes back at
 * the member's position, so librdkafka stops its fetcher and starts it
 * again (what a lost fetch start needs). Cooperative only: this partition
 * alone (an eager assignment changes only whole, which the watch does not
 * do behind the member's back: see repair). Position: the member's, or,
 * where it knows none, RD_KAFKA_OFFSET_INVALID (the committed offset, as
 * the member assigned it). Pause states are kept by librdkafka across it;
 * the resume came first, before assign, the order that keeps a resume
 * from racing the fetch start. The member's own view (offsets, records in
 * hand) does not change: no rebalance callback fires. A partition an
 * earlier repair left out (e->out: unassigned, the assign refused) is only
 * assigned: an unassign of it would fail as "not assigned", forever.
 * Returns 0; 1 when the unassign failed (still assigned as it was); -1
 * when the partition is out of the assignment (e->out set: the member
 * must report not ready, and the next turn assigns it again). Failures
 * are logged (rebalance.c). Without a consumer (unit tests) only the
 * fault acts. */
static int reassign(idem_fetchwatch_t *fw, watch_entry_t *e,
                    rd_kafka_topic_partition_list_t *l, int64_t position,
                    const char *part)
{
    char errstr[512];
    l->elems[0].offset = position >= 0 ? position : RD_KAFKA_OFFSET_INVALID;
    if (!e->out && fw->rk &&
        idem_rebalance_unassign(fw->rk, l, errstr, sizeof(errstr)))
        return 1;
    e->out = 1;
    if (assign_back(fw, l, part))
        return -1;
    e->out = 0;
    return 0;
}

/* Whether a repair may be made now: not while the member is leaving
 * (rd_kafka_consumer_close serves this callback too) nor when librdkafka
 * says the assignment is lost (a rebalance callback is due that takes the
 * partitions away; an assign now would race it). */
static int repair_allowed(const idem_fetchwatch_t *fw)
{
    return !fw->closing && !(fw->rk && rd_kafka_assignment_lost(fw->rk));
}

/* Repairs a stalled partition so that its fetch goes on at `position` (the
 * offset after what the member holds, else the position the member
 * assigned it at; -1: the committed offset): nothing is skipped, and what
 * the member already holds is dropped again by the loop if fetched twice.
 * The first repair of a started fetch resumes and seeks; a fetch that
 * never started (or stopped), and every later repair, is resumed and
 * assigned again (cooperative), or, with an eager assignment, not
 * repaired: the member reports not ready and says to restart it. A
 * partition whose position Redis has not been read yet (mem->checked 0)
 * gets no heavy repair: it would start at a position not known to be
 * right. Failures are logged: the next document judges again. */
static void repair(idem_fetchwatch_t *fw, watch_entry_t *e,
                   const idem_fetchwatch_member_t *mem)
{
    int started = !strcmp(e->fetch_state, "active") ||
                  !strcmp(e->fetch_state, "offset-query") ||
                  !strcmp(e->fetch_state, "offset-wait");
    int heavy = !started || e->repairs_tried > 0;
    char part[16], pos[24];
    snprintf(part, sizeof(part), "%" PRId32, e->partition);
    snprintf(pos, sizeof(pos), "%" PRId64, mem->position);
    if (heavy && !mem->checked) {
        idem_log_kv(IDEM_LOG_INFO,
                    "stalled partition: its redis position is not read yet, "
                    "no repair",
                    "topic", e->topic, "partition", part, NULL);
        return;
    }
    int dropped = fw->fault_started && fw->fault_left > 0 &&
                  fault_partition(fw, e->topic, e->partition);
    if (heavy && !dropped && fw->rk && !idem_rebalance_cooperative(fw->rk)) {
        /* Eager: only the whole assignment could be given again, which
         * would race the rebalances the member handles. Not ready; not
         * counted as a repair. */
        e->unready = 1;
        if (!e->eager_said)
            idem_log_kv(IDEM_LOG_ERROR,
                        "stalled partition: eager assignment, not repaired "
                        "in place: restart the member",
                        "topic", e->topic, "partition", part, NULL);
        e->eager_said = 1;
        return;
    }
    fw->repairs++;
    if (fw->m)
        idem_metrics_stall_repair_add(fw->m);
    e->repairs_tried++;
    if (heavy)
        fw->reassigns++;
    if (dropped) {
        fw->fault_left--;
        idem_log_kv(IDEM_LOG_WARN, "fault: repair dropped", "topic", e->topic,
                    "partition", part, "repair",
                    heavy ? "resume, assign again" : "resume, seek", NULL);
        return;
    }
    if (!fw->rk && !heavy)
        return;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, e->topic, e->partition);
    if (fw->rk)
        idem_rebalance_pause(fw->rk, l, 0); /* logs a failure */
    int rc = 0;
    if (heavy)
        rc = reassign(fw, e, l, mem->position, part);
    else
        seek_one(fw, l, part, mem->position, pos);
    rd_kafka_topic_partition_list_destroy(l);
    if (rc < 0)
        e->unready = 1; /* unassigned and not assigned again (yet) */
    if (rc || !fw->rk)
        return;
    idem_log_kv(IDEM_LOG_INFO,
                heavy ? "stalled partition: resumed and assigned again"
                      : "stalled partition: resumed and sought",
                "topic", e->topic, "partition", part, "offset", pos, NULL);
}

static void stall_log(idem_log_level_t level, const char *msg,
                      const watch_entry_t *e, int64_t for_ms)
{
    char part[16], lag[24], secs[24], next[24], app[24], q[24];
    snprintf(part, sizeof(part), "%" PRId32, e->partition);
    snprintf(lag, sizeof(lag), "%" PRId64, e->lag);
    snprintf(secs, sizeof(secs), "%.1f", (double)for_ms / 1000.0);
    snprintf(next, sizeof(next), "%" PRId64, e->last_next);
    snprintf(app, sizeof(app), "%" PRId64, e->last_app);
    snprintf(q, sizeof(q), "%" PRId64, e->fetchq);
    idem_log_kv(level, msg, "topic", e->topic, "partition", part, "fetch_state",
                e->fetch_state, "lag", lag, "seconds", secs, "next_offset",
                next, "app_offset", app, "fetchq_cnt", q, NULL);
}

/* The partition fetches (or is not ours to fetch) at now: a stall it was
 * in is over, and its repairs start again from the light one. */
static void healthy(watch_entry_t *e, int64_t now)
{
    if (e->stalled)
        stall_log(IDEM_LOG_INFO, "stalled partition fetched again", e,
                  now - e->ok_since_ms);
    e->stalled = 0;
    e->unready = 0;
    e->repairs_tried = 0;
    e->eager_said = 0;
    e->out = 0; /* fetched: librdkafka has it */
    e->ok_since_ms = now;
}

/* Judges one partition of the document (idem_fetchwatch_parse's fn). */
static void judge(void *opaque, const idem_fetchwatch_part_t *p)
{
    idem_fetchwatch_t *fw = opaque;
    int64_t now = fw->now_ms;
    watch_entry_t *e = entry_get(fw, p->topic, p->partition);
    e->seen = fw->gen;
    idem_fetchwatch_member_t mem = {0, 0, -1, 0};
    if (fw->member)
        fw->member(fw->opaque, p->topic, p->partition, &mem);

    if (!fw->fault_started && mem.held && !mem.paused && p->app_offset >= 0 &&
        fault_partition(fw, p->topic, p->partition))
        fault_pause(fw);

    /* The broker's answer of the last turn counts now; an older one as
     * long as it is ahead of the statistics. */
    if (e->end_pending >= 0) {
        e->end_queried = e->end_pending;
        e->end_pending = -1;
    }
    int64_t end = p->ls_offset >= 0 ? p->ls_offset : p->hi_offset;
    if (e->end_queried > end)
        end = e->end_queried;
    e->lag = end >= 0 && p->next_offset >= 0 ? end - p->next_offset
                                             : p->consumer_lag;
    snprintf(e->fetch_state, sizeof(e->fetch_state), "%s", p->fetch_state);
    int moved = p->next_offset != e->last_next || p->app_offset != e->last_app;
    e->last_next = p->next_offset;
    e->last_app = p->app_offset;
    e->fetchq = p->fetchq_cnt;
    int active = !strcmp(p->fetch_state, "active");
    /* Fetched but not handed over: the fetcher is ahead of what the member
     * got, and (not moved) the member got nothing since the last
     * document. fetchq_cnt says nothing here: librdkafka forwards every
     * partition's fetch queue to the consumer's one queue and reports
     * that queue's count on each partition. */
    int held_back = p->app_offset >= 0 && p->next_offset >= 0 &&
                    p->app_offset < p->next_offset;
    /* Not ours to fetch, or fetching: the fetcher or the member moved
     * since the last document; or its leader is unknown (librdkafka
     * waits for the metadata; nothing to repair here). */
    if (!mem.held || mem.paused || moved || p->leader < 0) {
        healthy(e, now);
        e->quiet_since_ms = 0;
        e->end_queried = -1;
        return;
    }
    if (active && e->lag <= 0 && !held_back) {
        /* Quiet and caught up, as far as the statistics know: ask the
         * broker now and then whether there is more. */
        if (!e->quiet_since_ms)
            e->quiet_since_ms = now;
        if (now - e->quiet_since_ms >= fw->stall_ms && fw->thread_on &&
            now - e->asked_ms >= fw->stall_ms) {
            e->asked_ms = now;
            query_ask(fw, e->topic, e->partition);
        }
        healthy(e, now);
        return;
    }
    e->quiet_since_ms = 0;
    int64_t for_ms = now - e->ok_since_ms;
    if (for_ms < fw->stall_ms || !repair_allowed(fw))
        return; /* too early, or judged again with the next document */
    if (!e->stalled) {
        e->stalled = 1;
        fw->stalls++;
        if (fw->m)
            idem_metrics_stall_add(fw->m);
        stall_log(IDEM_LOG_WARN,
                  "partition assigned but not fetched: resuming it", e, for_ms);
    } else if (now - e->repaired_ms >= fw->stall_ms) {
        if (!e->unready)
            stall_log(IDEM_LOG_ERROR,
                      "partition still not fetched after a repair: not ready",
                      e, for_ms);
        e->unready = 1;
    } else {
        return; /* the last repair's effect is not judged yet */
    }
    e->repaired_ms = now;
    repair(fw, e, &mem);
}

int idem_fetchwatch_stats(idem_fetchwatch_t *fw, const json_t *root,
                          int64_t now_ms)
{
    if (fw->closing)
        return 0; /* leaving: nothing judged, nothing repaired */
    fw->gen++;
    fw->now_ms = now_ms;
    if (idem_fetchwatch_parse(root, judge, fw) < 0)
        return 0; /* not a statistics document: judge nothing */
    /* Partitions gone from the document are no longer ours, except a
     * stalled one the member still holds: assigned again by a repair, it
     * is away for a document or two, and its stall ends when it moves. */
    size_t keep = 0;
    for (size_t i = 0; i < fw->cnt; i++) {
        watch_entry_t *e = &fw->v[i];
        idem_fetchwatch_member_t mem = {0, 0, -1, 0};
        if (e->seen != fw->gen && e->stalled && fw->member)
            fw->member(fw->opaque, e->topic, e->partition, &mem);
        if (e->seen != fw->gen && !mem.held) {
            free(e->topic);
            continue;
        }
        /* Out of the assignment after a refused assign, the partition is
         * in no document (librdkafka no longer wants it): judge cannot
         * repair it, so it is assigned again here, as often as a stalled
         * one is repaired. */
        if (e->seen != fw->gen && e->out && !mem.paused &&
            now_ms - e->repaired_ms >= fw->stall_ms && repair_allowed(fw)) {
            e->repaired_ms = now_ms;
            repair(fw, e, &mem);
        }
        fw->v[keep++] = *e;
    }
    fw->cnt = keep;
    /* The broker's answers count from the next document on: the fetcher
     * gets a whole statistics period to fetch what was there. */
    pthread_mutex_lock(&fw->lock);
    for (size_t i = 0; i < fw->answer_cnt; i++) {
        query_t *q = &fw->answers[i];
        idem_fetchwatch_end_seen(fw, q->topic, q->partition, q->end);
        free(q->topic);
    }
    fw->answer_cnt = 0;
    pthread_mutex_unlock(&fw->lock);

    const watch_entry_t *unready = NULL;
    idem_metrics_stall_t *gauges =
        idem_xcalloc(fw->cnt ? fw->cnt : 1, sizeof(*gauges));
    for (size_t i = 0; i < fw->cnt; i++) {
        gauges[i].topic = fw->v[i].topic;
        gauges[i].partition = fw->v[i].partition;
        gauges[i].stalled = fw->v[i].stalled;
        if (fw->v[i].unready && !unready)
            unready = &fw->v[i];
    }
    if (fw->m)
        idem_metrics_stalled_set(fw->m, gauges, fw->cnt);
    free(gauges);
    if (unready)
        snprintf(fw->reason, sizeof(fw->reason),
                 "partition %s/%" PRId32
                 " not fetched (fetch_state %s, lag %" PRId64 ")",
                 unready->topic, unready->partition, unready->fetch_state,
                 unready->lag);
    int changed = (unready != NULL) != fw->was_unready;
    fw->was_unready = unready != NULL;
    return changed || unready; /* the reason may name another partition */
}

void idem_fetchwatch_end_seen(idem_fetchwatch_t *fw, const char *topic,
                              int32_t partition, int64_t end)
{
    for (size_t i = 0; i < fw->cnt; i++)
        if (fw->v[i].partition == partition && !strcmp(fw->v[i].topic, topic))
            fw->v[i].end_pending = end;
}

const char *idem_fetchwatch_not_ready(const idem_fetchwatch_t *fw)
{
    return fw && fw->was_unready ? fw->reason : NULL;
}

void idem_fetchwatch_forget(idem_fetchwatch_t *fw,
                            const rd_kafka_topic_partition_list_t *parts)
{
    if (!fw)
        return;
    size_t keep = 0;
    for (size_t i = 0; i < fw->cnt; i++) {
        watch_entry_t *e = &fw->v[i];
        if (rd_kafka_topic_partition_list_find(parts, e->topic, e->partition)) {
            free(e->topic);
            continue;
        }
        fw->v[keep++] = *e;
    }
    fw->cnt = keep;
}

void idem_fetchwatch_fault_assign(idem_fetchwatch_t *fw, int times)
{
    fw->fault_assign_left = times > 0 ? times : 0;
}

void idem_fetchwatch_queries(idem_fetchwatch_t *fw, uint64_t *started,
                             uint64_t *done)
{
    pthread_mutex_lock(&fw->lock);
    *started = fw->queries_started;
    *done = fw->queries_done;
    pthread_mutex_unlock(&fw->lock);
}

uint64_t idem_fetchwatch_stalls(const idem_fetchwatch_t *fw)
{
    return fw->stalls;
}

uint64_t idem_fetchwatch_repairs(const idem_fetchwatch_t *fw)
{
    return fw->repairs;
}

uint64_t idem_fetchwatch_reassigns(const idem_fetchwatch_t *fw)
{
    return fw->reassigns;
}
