/* fake_partredis: see fake_partredis.h. */
#include "fake_partredis.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void logf_(fake_partredis_t *f, const char *fmt, ...)
{
    size_t at = strlen(f->log);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->log + at, sizeof(f->log) - at, fmt, ap);
    va_end(ap);
    at = strlen(f->log);
    if (at + 1 < sizeof(f->log)) {
        f->log[at] = ' ';
        f->log[at + 1] = '\0';
    }
}

static fake_pr_part_t *part_of(fake_partredis_t *f, const char *topic,
                               int32_t partition)
{
    cr_assert_str_eq(topic, f->topic);
    cr_assert(partition >= 0 && partition < FAKE_PR_PARTS);
    return &f->part[partition];
}

static int down(fake_partredis_t *f, char *errstr, size_t errstr_size)
{
    if (f->down)
        snprintf(errstr, errstr_size, "redis: connection refused");
    return f->down;
}

static int hashkey(void *ctx, uint8_t key[16], char *errstr, size_t errstr_size)
{
    fake_partredis_t *f = ctx;
    if (down(f, errstr, errstr_size))
        return -1;
    memcpy(key, "0123456789abcdef", 16);
    return 0;
}

static uint64_t connections(void *ctx)
{
    return ((fake_partredis_t *)ctx)->connections;
}

static const char *run_id(void *ctx)
{
    (void)ctx;
    return "fake";
}

static int64_t window_seconds(void *ctx)
{
    return ((fake_partredis_t *)ctx)->wsec;
}

static int now_(void *ctx, int64_t *now, char *errstr, size_t errstr_size)
{
    fake_partredis_t *f = ctx;
    if (down(f, errstr, errstr_size))
        return -1;
    *now = f->now;
    return 0;
}

static int partitions(void *ctx, const char *topic, int64_t current,
                      int64_t *recorded, char *errstr, size_t errstr_size)
{
    fake_partredis_t *f = ctx;
    if (down(f, errstr, errstr_size))
        return -1;
    logf_(f, "count:%s", topic);
    if (f->recorded < 0)
        f->recorded = current;
    *recorded = f->recorded;
    return 0;
}

static int epoch_bump(void *ctx, const char *topic, int32_t partition,
                      int64_t *epoch, char *errstr, size_t errstr_size)
{
    fake_partredis_t *f = ctx;
    if (down(f, errstr, errstr_size))
        return -1;
    f->bumps++;
    logf_(f, "bump:%s/%d", topic, (int)partition);
    *epoch = ++part_of(f, topic, partition)->epoch;
    return 0;
}

static int positions_load(void *ctx, idem_store_pos_t *pos, size_t n,
                          char *errstr, size_t errstr_size)
{
    fake_partredis_t *f = ctx;
    if (down(f, errstr, errstr_size))
        return -1;
    for (size_t i = 0; i < n; i++) {
        logf_(f, "pos:%s/%d", pos[i].topic, (int)pos[i].partition);
        pos[i].offset = part_of(f, pos[i].topic, pos[i].partition)->position;
    }
    return 0;
}

static int load(void *ctx, const char *topic, int32_t partition,
                size_t piece_bytes, idem_partstate_marks_fn cb, void *opaque,
                size_t *pieces, char *errstr, size_t errstr_size)
{
    (void)piece_bytes;
    fake_partredis_t *f = ctx;
    if (down(f, errstr, errstr_size))
        return -1;
    f->loads++;
    logf_(f, "load:%s/%d", topic, (int)partition);
    fake_pr_part_t *p = part_of(f, topic, partition);
    if (pieces)
        *pieces = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (cb(p->marks[i], 1, p->window[i], opaque)) {
            snprintf(errstr, errstr_size, "stopped by the caller");
            return -1;
        }
        if (pieces)
            ++*pieces;
    }
    return 0;
}

static void honour_global(void *ctx, int on)
{
    ((fake_partredis_t *)ctx)->honour = on;
}

/* One chunk as partchunk.lua answers it: epoch, then position, checked
 * before any write; then each record's effect and mark. */
static int chunk_one(fake_partredis_t *f, const idem_partstate_chunk_t *ch,
                     idem_partstate_result_t *res, int64_t *window,
                     char *errstr, size_t errstr_size)
{
    fake_pr_part_t *p = part_of(f, ch->topic, ch->partition);
    if (p->refuse_next) {
        int rc = p->refuse_next;
        p->refuse_next = 0;
        snprintf(errstr, errstr_size, "%s/%d: refused (%d)", ch->topic,
                 (int)ch->partition, rc);
        return rc;
    }
    if (ch->epoch != p->epoch) {
        snprintf(errstr, errstr_size, "FENCED %s/%d: epoch %lld", ch->topic,
                 (int)ch->partition, (long long)p->epoch);
        return IDEM_PARTSTATE_FENCED;
    }
    if (ch->expect_offset != p->position) {
        snprintf(errstr, errstr_size, "POSITION %s/%d: %lld", ch->topic,
                 (int)ch->partition, (long long)p->position);
        return IDEM_PARTSTATE_POSITION;
    }
    *window = f->now / f->wsec;
    for (size_t i = 0; i < ch->n; i++) {
        const idem_record_t *r = ch->recs[i];
        memset(&res[i], 0, sizeof(res[i]));
        cr_assert_lt(p->n, FAKE_PR_MARKS);
        memcpy(p->marks[p->n], ch->marks[i], IDEM_PARTSTATE_MARK);
        p->window[p->n] = *window;
        if (f->reject && strlen(f->reject) == r->identity_len &&
            !memcmp(f->reject, r->identity, r->identity_len)) {
            res[i].outcome = IDEM_PARTSTATE_REJECTED;
            snprintf(res[i].detail, sizeof(res[i].detail), "refused");
            p->marks[p->n][12] = IDEM_PARTSTATE_MOVED;
            p->marks[p->n][13] = p->marks[p->n][14] = p->marks[p->n][15] = 0;
        } else {
            res[i].outcome = IDEM_PARTSTATE_APPLIED;
        }
        p->n++;
    }
    if (ch->newpos)
        p->position = ch->newpos->offset;
    return 0;
}

static int chunks(void *ctx, const idem_partstate_chunk_t *ch, size_t k,
                  idem_partstate_result_t *const *results, int64_t *windows,
                  int *rcs, char *errstr, size_t errstr_size)
{
    fake_partredis_t *f = ctx;
    f->chunk_calls++;
    logf_(f, "chunks:%zu", k);
    if (down(f, errstr, errstr_size))
        return -1;
    if (f->chunks_down) {
        snprintf(errstr, errstr_size, "redis: connection reset");
        return -1;
    }
    f->chunks_sent += (int)k;
    for (size_t c = 0; c < k; c++)
        rcs[c] =
            chunk_one(f, &ch[c], results[c], &windows[c], errstr, errstr_size);
    return 0;
}

static int layout_read(void *ctx, idem_layout_t *out, char *errstr,
                       size_t errstr_size)
{
    fake_partredis_t *f = ctx;
    if (down(f, errstr, errstr_size))
        return -1;
    f->layout_reads++;
    f->layout.now = f->now;
    *out = f->layout;
    return 0;
}

static int layout_switch(void *ctx, idem_layout_kind_t expect,
                         idem_layout_kind_t to, idem_layout_t *out,
                         char *errstr, size_t errstr_size)
{
    fake_partredis_t *f = ctx;
    if (down(f, errstr, errstr_size))
        return -1;
    logf_(f, "switch:%s", idem_layout_kind2str(to));
    f->layout.now = f->now;
    if (f->layout.layout != expect) {
        *out = f->layout;
        return 0;
    }
    f->switches++;
    f->layout.from = expect;
    f->layout.layout = to;
    f->layout.since = f->now;
    *out = f->layout;
    return 1;
}

static void effect_layout(void *ctx, const char *layout)
{
    ((fake_partredis_t *)ctx)->effect_layout = layout;
}

idem_partscope_redis_t fake_partredis_init(fake_partredis_t *f)
{
    memset(f, 0, sizeof(*f));
    snprintf(f->topic, sizeof(f->topic), "in");
    f->connections = 1;
    f->now = 1000000;
    f->wsec = 60;
    f->recorded = -1;
    for (int i = 0; i < FAKE_PR_PARTS; i++)
        f->part[i].position = -1;
    f->layout.layout = IDEM_LAYOUT_PARTITION;
    f->layout.from = IDEM_LAYOUT_GLOBAL;
    return (idem_partscope_redis_t){
        .hashkey = hashkey,
        .connections = connections,
        .run_id = run_id,
        .window_seconds = window_seconds,
        .now = now_,
        .partitions = partitions,
        .epoch_bump = epoch_bump,
        .positions_load = positions_load,
        .load = load,
        .honour_global = honour_global,
        .chunks = chunks,
        .layout_read = layout_read,
        .layout_switch = layout_switch,
        .effect_layout = effect_layout,
        .ctx = f,
    };
}

void fake_partredis_put(fake_partredis_t *f, int32_t p, const uint8_t *mark,
                        int64_t window)
{
    fake_pr_part_t *pp = &f->part[p];
    cr_assert_lt(pp->n, FAKE_PR_MARKS);
    memcpy(pp->marks[pp->n], mark, IDEM_PARTSTATE_MARK);
    pp->window[pp->n++] = window;
}

void fake_partredis_log_clear(fake_partredis_t *f)
{
    f->log[0] = '\0';
}
