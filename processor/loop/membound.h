/* membound: the member's process-level memory bound (member.memory.max):
 * what a configuration must leave room for, and when the loop pauses its
 * fetching because the resident set passed the bound (docs/design.md,
 * "Memory bounds"). Pure arithmetic and a small state: no /proc here (the
 * loop reads RSS with idem_procstat_rss_bytes). */
#ifndef IDEM_MEMBOUND_H
#define IDEM_MEMBOUND_H

#include <stddef.h>
#include <stdint.h>

/* The consumer's prefetch bound (librdkafka's queued.max.messages.kbytes)
 * unless kafka.queued.max.messages.kbytes is set. */
#define IDEM_PREFETCH_KBYTES_DEFAULT "32768"

/* What a member holds besides its tables and its prefetch queue, measured
 * (tests/bench_member.sh: idle RSS with librdkafka's threads, the Redis
 * and HTTP clients, the record and scratch arrays): 32 MiB. */
#define IDEM_MEMBOUND_FIXED_BYTES (INT64_C(32) << 20)

/* Bytes a member needs at most, by its configuration: the tables'
 * dedup.memory.max (tables_max; 0 under dedup.scope=global), twice the
 * prefetch bound (prefetch_kbytes KiB: librdkafka keeps a fetch response
 * whole while any of its messages is alive, in its queue or in hand, so
 * its resident size reached about twice the configured bound), the
 * records in hand (4 x batch_max, 2 KiB each: the parsed envelope and
 * the record) and IDEM_MEMBOUND_FIXED_BYTES. */
int64_t idem_membound_need(int64_t tables_max, int64_t prefetch_kbytes,
                           int64_t batch_max);

typedef struct {
    int64_t max;          /* member.memory.max; 0: no bound */
    int64_t resume_below; /* fetching resumes under this RSS */
    int over;             /* paused: RSS passed max, not yet under resume */
    uint64_t pauses;      /* times over became 1 */
    int64_t last_rss;     /* the last reading (bytes; -1: none) */
} idem_membound_t;

/* A bound of max bytes (0: none) for a member whose prefetch bound is
 * prefetch_kbytes: fetching resumes once RSS is a prefetch bound under
 * max (what pausing gives back: librdkafka drops a paused partition's
 * prefetched records), at least under max. */
void idem_membound_init(idem_membound_t *mb, int64_t max,
                        int64_t prefetch_kbytes);

/* A reading of the resident set (bytes; < 0: unreadable, changes
 * nothing). Returns 1 when the member must now pause (RSS passed max), -1
 * when it may resume (RSS under resume_below), 0 when nothing changed. */
int idem_membound_update(idem_membound_t *mb, int64_t rss);

#endif
