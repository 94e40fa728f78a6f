/* offreset: the rules of `idemproc offsets` without a broker or Redis: which
 * partitions --topic T[:P,...] selects, where a member starts a partition
 * (Redis's position if usable, else Kafka's committed offset, else
 * auto.offset.reset), and where each --to-* moves it (tests/unit). */
#ifndef IDEM_OFFRESET_H
#define IDEM_OFFRESET_H

#include <stddef.h>
#include <stdint.h>

/* One --topic T[:P,...]: a topic and, optionally, some of its partitions. */
typedef struct {
    char *topic;    /* owned */
    int32_t *parts; /* owned; NULL: every partition */
    size_t nparts;
} idem_offreset_sel_t;

/* Parses "T" or "T:P,P,..." into *out (caller clears it with
 * idem_offreset_sel_clear). Returns 0, or -1 with errstr naming the text. */
int idem_offreset_sel_parse(const char *spec, idem_offreset_sel_t *out,
                            char *errstr, size_t errstr_size);
void idem_offreset_sel_clear(idem_offreset_sel_t *sel);

/* Whether (topic, partition) is selected by sel[n]; n 0 selects all. */
int idem_offreset_sel_match(const idem_offreset_sel_t *sel, size_t n,
                            const char *topic, int32_t partition);

/* Whether every partition sel names exists: ids[n] are the partitions the
 * cluster has of sel->topic (any order). Returns 0, or -1 with errstr naming
 * the --topic, the missing partitions and the ones there are
 * ("--topic payments:7: payments has no partition 7 (it has 0-1)"). */
int idem_offreset_sel_check(const idem_offreset_sel_t *sel, const int32_t *ids,
                            size_t n, char *errstr, size_t errstr_size);

/* Where a member starts a partition, and from what. */
typedef enum {
    IDEM_OFFRESET_FROM_REDIS = 0, /* Redis's position, usable */
    IDEM_OFFRESET_FROM_KAFKA,     /* Kafka's committed offset */
    IDEM_OFFRESET_FROM_AUTO,      /* auto.offset.reset */
    IDEM_OFFRESET_FROM_NOWHERE,   /* Redis lost its state of the partition
                                     (idem_offreset_redis_lost): a member
                                     keeps it paused until a reset */
} idem_offreset_from_t;

/* Who committed an offset (idem_offreset_committed_by). */
typedef enum {
    IDEM_OFFRESET_BY_OTHER = 0, /* another tool (kafka-consumer-groups), or
                                   a member older than the metadata */
    IDEM_OFFRESET_BY_MEMBER,    /* a member's commit */
    IDEM_OFFRESET_BY_RESET,     /* idemproc offsets reset */
} idem_offreset_by_t;

/* Whether Redis lost everything of a partition: it holds no position at
 * all (redis < 0) while Kafka holds an offset (kafka >= 0) that a member
 * committed (by). Members write a position before their first effect and
 * before every commit, so that Redis once held one and lost it with every
 * effect after it, and no one can say how far back: the partition must not
 * start anywhere until `idemproc offsets reset` writes both sides. An
 * offset of another tool or of `offsets reset` (an upgrade from before the
 * metadata, a group new to idemproc) is not: Kafka's offset applies. */
int idem_offreset_redis_lost(int64_t redis, int64_t kafka,
                             idem_offreset_by_t by);

/* redis: Redis's position (-1 none), usable when redis_use; kafka: the
 * committed offset (-1 none), kafka_by who committed it; earliest:
 * auto.offset.reset is earliest (else latest); low, high the watermarks.
 * Returns the offset, *from says which; when Redis lost the partition
 * (idem_offreset_redis_lost) Kafka's offset with *from NOWHERE: a member
 * does not start there. */
int64_t idem_offreset_start(int64_t redis, int redis_use, int64_t kafka,
                            idem_offreset_by_t kafka_by, int earliest,
                            int64_t low, int64_t high,
                            idem_offreset_from_t *from);
const char *idem_offreset_from2str(idem_offreset_from_t from);

typedef enum {
    IDEM_OFFRESET_EARLIEST = 0,
    IDEM_OFFRESET_LATEST,
    IDEM_OFFRESET_OFFSET,   /* value: the offset */
    IDEM_OFFRESET_DATETIME, /* value: ms since the epoch */
    IDEM_OFFRESET_SHIFT,    /* value: added to the start (may be < 0) */
} idem_offreset_mode_t;

typedef struct {
    idem_offreset_mode_t mode;
    int64_t value;
} idem_offreset_to_t;

/* The new offset of a partition with watermarks low..high that starts at
 * current: always within [low, high] (an offset or a shift beyond them is
 * brought to the nearest end, as kafka-consumer-groups does). by_time is
 * the first offset with a timestamp at or after the datetime (-1: none,
 * the end), used by DATETIME only. */
int64_t idem_offreset_target(const idem_offreset_to_t *to, int64_t low,
                             int64_t high, int64_t current, int64_t by_time);

/* The timestamp to ask the broker for the offsets of a datetime at_ms:
 * at_ms, or 0 for a time before 1970. Kafka's ListOffsets reads the
 * timestamps -1 and -2 as "latest" and "earliest", so 1969-12-31T23:59:59.999Z
 * asked as it is would skip everything instead of reading everything. */
int64_t idem_offreset_time_query(int64_t at_ms);

/* The commit metadata a member commits its offsets with, and the prefix of
 * the one `offsets reset` commits with ("idemproc offsets reset <time>"):
 * how a member tells an offset of ours from one another tool moved. */
#define IDEM_OFFRESET_META_MEMBER "idemproc"
#define IDEM_OFFRESET_META_RESET  "idemproc offsets reset"

/* Who committed an offset, from its commit metadata (meta of len bytes,
 * borrowed; NULL for none). */
idem_offreset_by_t idem_offreset_committed_by(const void *meta, size_t len);

#endif
