/* fixture_fetchwatch: helpers the fetchwatch tests of more than one tier share
 * (static inline: each test file takes what it uses). */
#ifndef IDEM_FIXTURE_FETCHWATCH_H
#define IDEM_FIXTURE_FETCHWATCH_H

#include "loop/fetchwatch.h"

#include <jansson.h>
#include <stdint.h>

/* The member's view in the tests: every partition held and fetching
 * unless listed. */
typedef struct {
    int paused_all;
    int32_t not_held; /* -1: none */
    int64_t position;
    int calls;
    int unchecked; /* Redis's positions not read yet */
} member_t;

static inline void member(void *opaque, const char *topic, int32_t partition,
                          idem_fetchwatch_member_t *out)
{
    (void)topic;
    member_t *mb = opaque;
    mb->calls++;
    out->held = partition != mb->not_held;
    out->paused = mb->paused_all;
    out->position = mb->position;
    out->checked = !mb->unchecked;
}

/* One partition object. */
static inline json_t *part_obj(const char *state, int64_t next, int64_t app,
                               int64_t hi, int64_t q, int leader)
{
    return json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:i}", "desired", 1,
                     "fetch_state", state, "next_offset", (json_int_t)next,
                     "app_offset", (json_int_t)app, "hi_offset", (json_int_t)hi,
                     "ls_offset", (json_int_t)hi, "fetchq_cnt", (json_int_t)q,
                     "consumer_lag", (json_int_t)-1, "leader", leader);
}

/* payments/3 alone, app_offset and leader given. */
static inline int feed_app(idem_fetchwatch_t *fw, const char *state,
                           int64_t next, int64_t app, int64_t hi, int64_t q,
                           int leader, int64_t now)
{
    json_t *d =
        json_pack("{s:{s:{s:{s:o}}}}", "topics", "payments", "partitions", "3",
                  part_obj(state, next, app, hi, q, leader));
    int rc = idem_fetchwatch_stats(fw, d, now);
    json_decref(d);
    return rc;
}

/* payments/3 alone, everything fetched handed over (app = next). */
static inline int feed(idem_fetchwatch_t *fw, const char *state, int64_t next,
                       int64_t hi, int64_t q, int64_t now)
{
    return feed_app(fw, state, next, next, hi, q, 1, now);
}

#endif
