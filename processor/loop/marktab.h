/* marktab: one partition's dedup marks held by the member that owns the
 * partition (docs/design.md, "Dedup state layout": the member's table).
 *
 * A mark is 16 bytes: 12 B keyed hash of the identity (base/siphash.h),
 * then 4 B: the digest of the message id (top bit 0), or the "moved" flag
 * (top bit 1). The table does not interpret the last 4 bytes; by
 * convention they are big-endian, so the top bit is b[12] & 0x80
 * (idem_mark_moved). Marks belong to a window (int64: floor(t / W)); the
 * same 12 hash bytes may be held in several windows, once per window.
 *
 * Layout: open addressing with linear probing over one array of the
 * 16-byte marks and a parallel array of one control byte per slot (empty,
 * tombstone, or which of the live windows the mark belongs to: a small
 * table of at most IDEM_MARKTAB_MAX_WINDOWS windows with a count each).
 * So a slot is 17 bytes; the table grows (doubles) when live marks plus
 * tombstones pass 3/4 of the slots and shrinks after an expiry that leaves
 * it under 3/16 full. A mark costs 17 / load bytes: 22.7 B at 3/4, 45 B
 * right after doubling; 35.7 B per mark at 1M marks (2^21 slots), 23.8 B
 * at 1.5M (tests/bench/marktab_bench.c, docs/design.md). Expiring a window
 * costs a pass over the control bytes (1 B a slot) and nothing when no window
 * is old enough; a removal next to an empty slot leaves no tombstone.
 *
 * Not thread-safe: one partition's table is used by the loop's thread. */
#ifndef IDEM_MARKTAB_H
#define IDEM_MARKTAB_H

#include <stddef.h>
#include <stdint.h>

/* How many distinct windows can hold marks at once (a TTL spans 8 or 9). */
#define IDEM_MARKTAB_MAX_WINDOWS 254

typedef struct idem_marktab_s idem_marktab_t;
typedef struct {
    uint8_t b[16];
} idem_mark_t16;

/* 1 when the mark is a "moved" entry (top bit of its last 4 bytes). */
static inline int idem_mark_moved(const idem_mark_t16 *m)
{
    return (m->b[12] & 0x80) != 0;
}

/* An empty table (no slots allocated yet); NULL when out of memory.
 * Caller frees with idem_marktab_destroy. */
idem_marktab_t *idem_marktab_new(void);

/* Frees the table and its marks. NULL does nothing. */
void idem_marktab_destroy(idem_marktab_t *t);

/* Drops every mark and window and gives the slots' memory back. */
void idem_marktab_clear(idem_marktab_t *t);

/* 1 and *out filled (out may be NULL) when a mark with these 12 hash bytes
 * is held in any live window: the one of the newest window holding it;
 * else 0. */
int idem_marktab_find(const idem_marktab_t *t, const uint8_t id12[12],
                      idem_mark_t16 *out);

/* Adds the mark (copied) in window w, or replaces the last 4 bytes of the
 * mark with the same 12 hash bytes already in window w. Returns 0; -1 on
 * allocation failure or when w would be a window past
 * IDEM_MARKTAB_MAX_WINDOWS live ones (the table is unchanged then). */
int idem_marktab_add(idem_marktab_t *t, const idem_mark_t16 *m, int64_t w);

/* Takes back a mark added optimistically: the entry of these 12 hash bytes
 * in window w (its entries in other windows stay). Returns 1 if removed, 0
 * when there was none. */
int idem_marktab_remove(idem_marktab_t *t, const uint8_t id12[12], int64_t w);

/* Drops every window < min_w and its marks; may shrink the table (when
 * the smaller table cannot be allocated, it keeps the larger one). */
void idem_marktab_expire(idem_marktab_t *t, int64_t min_w);

/* Live marks (entries: a mark held in two windows counts twice). */
size_t idem_marktab_count(const idem_marktab_t *t);

/* Bytes of memory the table holds: the slots, the windows and itself. */
size_t idem_marktab_bytes(const idem_marktab_t *t);

#endif
