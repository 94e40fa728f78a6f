/* fake_partredis: a Redis side of our own behind partscope's seam
 * (loop/partscope.h), for the unit tests of partscope's decisions: per
 * partition an owner epoch, a position and the marks chunks appended, a
 * chunk script that checks epoch and position as partchunk.lua does, the
 * group's layout key, and a log of the calls in order. */
#ifndef IDEM_TEST_FAKE_PARTREDIS_H
#define IDEM_TEST_FAKE_PARTREDIS_H
#include "loop/partscope.h"

#include <stddef.h>
#include <stdint.h>

#define FAKE_PR_PARTS 4    /* partitions 0..3 of one topic */
#define FAKE_PR_MARKS 4096 /* marks held per partition */

typedef struct {
    uint8_t marks[FAKE_PR_MARKS][IDEM_PARTSTATE_MARK];
    int64_t window[FAKE_PR_MARKS];
    size_t n;
    int64_t epoch;    /* INCRs so far */
    int64_t position; /* the offset its position holds (-1: none) */
    int refuse_next;  /* the next chunk of it answers this rc (0: none) */
} fake_pr_part_t;

typedef struct {
    char topic[32];
    fake_pr_part_t part[FAKE_PR_PARTS];
    uint64_t connections; /* a change: a new connection (a new run_id) */
    int64_t now;          /* Redis's clock, seconds */
    int64_t wsec;         /* window length */
    int64_t recorded;     /* the recorded partition count (-1: none yet) */
    idem_layout_t layout; /* the group's layout key (now: set from `now`) */
    int down;             /* 1: every fallible call fails (an outage) */
    int chunks_down;      /* 1: chunks fails as a whole (-1) */
    const char *reject;   /* identity whose effect the script refuses */
    int honour;           /* the last honour_global */
    const char *effect_layout; /* the last effect_layout */
    /* Calls made, and a log of the Redis-side ones in order ("bump:in/0 "
     * "pos:in/0 load:in/0 chunks:1 ..."), each followed by a space. */
    int bumps, loads, chunk_calls, chunks_sent, layout_reads, switches;
    char log[4096];
} fake_partredis_t;

/* A seam over f (zeroed first, then topic "in", a connection, clock
 * 1,000,000 s, windows of 60 s, no recorded count, no positions, the layout
 * key "partition" since 0). ctx borrowed: no destroy. */
idem_partscope_redis_t fake_partredis_init(fake_partredis_t *f);

/* The marks Redis holds for partition p, appended as a chunk would: for
 * marks a previous owner wrote before this member loads. */
void fake_partredis_put(fake_partredis_t *f, int32_t p, const uint8_t *mark,
                        int64_t window);

/* Clears the call log. */
void fake_partredis_log_clear(fake_partredis_t *f);

#endif
