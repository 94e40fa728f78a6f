/* offsets: the partitions a member holds and their positions (offsets.h). */
#include "loop/offsets.h"
#include "base/util.h"
#include "kafka/offreset.h"

#include <stdlib.h>
#include <string.h>

void idem_offsets_init(idem_offsets_t *o)
{
    memset(o, 0, sizeof(*o));
}

void idem_offsets_term(idem_offsets_t *o)
{
    for (size_t i = 0; i < o->cnt; i++)
        free(o->v[i].topic);
    free(o->v);
    memset(o, 0, sizeof(*o));
}

/* Whether pt is (topic, partition): the loop passes the partition's own
 * topic pointer most of the time, so the bytes are compared only when the
 * pointers differ. */
static int part_is(const idem_part_t *pt, const char *topic, int32_t partition)
{
    return pt->partition == partition &&
           (pt->topic == topic || !strcmp(pt->topic, topic));
}

idem_part_t *idem_offsets_find(idem_offsets_t *o, const char *topic,
                               int32_t partition)
{
    /* Records come in runs of one partition (a fetch is per partition),
     * and the loop looks up every record in hand several times a turn:
     * the partition found last is tried first. */
    if (o->hint < o->cnt && part_is(&o->v[o->hint], topic, partition))
        return &o->v[o->hint];
    for (size_t i = 0; i < o->cnt; i++)
        if (part_is(&o->v[i], topic, partition)) {
            o->hint = i;
            return &o->v[i];
        }
    return NULL;
}

idem_part_t *idem_offsets_add(idem_offsets_t *o, const char *topic,
                              int32_t partition)
{
    idem_part_t *pt = idem_offsets_find(o, topic, partition);
    if (pt)
        return pt;
    if (o->cnt == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 16;
        o->v = idem_xrealloc(o->v, o->cap * sizeof(*o->v));
    }
    pt = &o->v[o->cnt++];
    memset(pt, 0, sizeof(*pt));
    pt->topic = idem_xstrdup(topic);
    pt->partition = partition;
    pt->next_offset = -1;
    pt->committed = -1;
    pt->high_seen = -1;
    pt->saved = -1;
    pt->saving = -1;
    pt->start = -1;
    pt->fp.offset = -1;
    pt->fp.timestamp = -1;
    return pt;
}

void idem_offsets_remove(idem_offsets_t *o, const char *topic,
                         int32_t partition)
{
    idem_part_t *pt = idem_offsets_find(o, topic, partition);
    if (!pt)
        return;
    free(pt->topic);
    *pt = o->v[--o->cnt];
}

void idem_offsets_advance_begin(idem_offsets_t *o)
{
    for (size_t i = 0; i < o->cnt; i++)
        o->v[i].blocked = 0;
}

void idem_offsets_advance_rec(idem_part_t *pt, int64_t offset, int finished)
{
    if (!pt || pt->blocked)
        return;
    if (finished)
        pt->next_offset = offset + 1;
    else
        pt->blocked = 1;
}

int idem_offsets_advance_take(idem_part_t *pt, int64_t offset, int finished)
{
    if (!pt)
        return 0;
    if (!pt->blocked) {
        idem_offsets_advance_rec(pt, offset, finished);
        return finished;
    }
    return finished && offset < pt->next_offset;
}

int idem_offsets_below(const idem_part_t *pt, int64_t offset)
{
    return pt && offset < pt->next_offset;
}

static int in_subset(const idem_part_t *pt,
                     const rd_kafka_topic_partition_list_t *subset)
{
    return !subset ||
           rd_kafka_topic_partition_list_find(subset, pt->topic, pt->partition);
}

rd_kafka_topic_partition_list_t *
idem_offsets_commit_list(const idem_offsets_t *o,
                         const rd_kafka_topic_partition_list_t *subset,
                         int recommit)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    for (size_t i = 0; i < o->cnt; i++) {
        const idem_part_t *pt = &o->v[i];
        if (pt->saved < 0 || (pt->saved == pt->committed && !recommit))
            continue;
        if (!in_subset(pt, subset))
            continue;
        if (!l)
            l = rd_kafka_topic_partition_list_new(8);
        rd_kafka_topic_partition_t *e =
            rd_kafka_topic_partition_list_add(l, pt->topic, pt->partition);
        e->offset = pt->saved;
        /* ours, so an offset moved by another tool can be told apart */
        e->metadata = idem_xstrdup(IDEM_OFFRESET_META_MEMBER);
        e->metadata_size = strlen(IDEM_OFFRESET_META_MEMBER);
    }
    return l;
}

size_t idem_offsets_positions_due(const idem_offsets_t *o,
                                  const rd_kafka_topic_partition_list_t *subset,
                                  const char *cluster, idem_store_pos_t *pos)
{
    size_t n = 0;
    for (size_t i = 0; i < o->cnt; i++) {
        const idem_part_t *pt = &o->v[i];
        if (pt->next_offset < 0 || pt->next_offset == pt->saved)
            continue;
        if (!in_subset(pt, subset))
            continue;
        pos[n].topic = pt->topic;
        pos[n].partition = pt->partition;
        pos[n].offset = pt->next_offset;
        idem_posval_init(&pos[n].val, cluster);
        if (pt->fp.offset >= 0 && pt->fp.offset < pt->next_offset)
            pos[n].val.rec = pt->fp;
        n++;
    }
    return n;
}

idem_offsets_rewind_t idem_offsets_rewind_decide(const idem_part_t *pt,
                                                 int64_t redis, int64_t hold,
                                                 int reconnected,
                                                 int other_server)
{
    idem_offsets_rewind_t d = {0, -1, 0};
    if (redis < 0) {
        /* Gone (or not ours): Redis lost everything after the first
         * position this member wrote or read, effects included. Back to
         * that one. */
        if (reconnected && pt->checked && pt->saved >= 0) {
            d.behind = 1;
            d.forget = 1;
            if (pt->start >= 0 && hold >= 0 && pt->start < hold)
                d.rewind = pt->start;
        }
        return d;
    }
    /* Lost writes: what Redis acknowledged (the writes after a host
     * crash's last fsync, a lagging replica), or at the first look since
     * the assignment what Kafka had committed after them. */
    d.behind = (pt->saved >= 0 && redis < pt->saved) ||
               (!pt->checked && pt->committed >= 0 && redis < pt->committed);
    int rewind = pt->checked ? (other_server || redis < pt->saved) &&
                                   hold >= 0 && redis < hold
                             : hold < 0 || redis < hold;
    if (rewind)
        d.rewind = redis;
    return d;
}
