/* marktab: one partition's marks in the member, an open-addressing table
 * with window tags per slot (layout and costs in marktab.h). */
#include "loop/marktab.h"

#include <stdlib.h>
#include <string.h>

#define CTRL_EMPTY 0
#define CTRL_TOMB  1
#define CTRL_WIN0  2 /* ctrl = CTRL_WIN0 + index into wins[] */
#define MIN_SLOTS  16

typedef struct {
    int64_t w; /* the window */
    size_t n;  /* its live marks; 0 = this entry of wins[] is free */
} marktab_window_t;

struct idem_marktab_s {
    idem_mark_t16 *marks; /* slots; meaningful where ctrl >= CTRL_WIN0 */
    uint8_t *ctrl;        /* per slot: CTRL_EMPTY, CTRL_TOMB or a window */
    size_t slots;         /* 0 or a power of two */
    size_t live;          /* slots holding a mark */
    size_t tombs;         /* slots holding a tombstone */
    marktab_window_t *wins;
    size_t nwins; /* entries allocated in wins (<= MAX_WINDOWS) */
};

/* Slot of the 12 hash bytes: they are a keyed hash already, but mixing
 * keeps the table sane for any 12 bytes (tests, non-random ids). */
static size_t home_slot(const uint8_t id12[12], size_t mask)
{
    uint64_t a;
    uint32_t b;
    memcpy(&a, id12, 8);
    memcpy(&b, id12 + 8, 4);
    uint64_t x = a ^ ((uint64_t)b * UINT64_C(0x9e3779b97f4a7c15));
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return (size_t)x & mask;
}

idem_marktab_t *idem_marktab_new(void)
{
    return calloc(1, sizeof(idem_marktab_t));
}

void idem_marktab_clear(idem_marktab_t *t)
{
    free(t->marks);
    free(t->ctrl);
    free(t->wins);
    memset(t, 0, sizeof(*t));
}

void idem_marktab_destroy(idem_marktab_t *t)
{
    if (!t)
        return;
    idem_marktab_clear(t);
    free(t);
}

/* Index into wins[] of live window w, or -1. */
static int window_index(const idem_marktab_t *t, int64_t w)
{
    for (size_t k = 0; k < t->nwins; k++)
        if (t->wins[k].n > 0 && t->wins[k].w == w)
            return (int)k;
    return -1;
}

/* Index of live window w, or of a free entry for it (grown when needed);
 * -1 when every one of MAX_WINDOWS is live or on allocation failure. */
static int window_index_for_add(idem_marktab_t *t, int64_t w)
{
    int free_k = -1;
    for (size_t k = 0; k < t->nwins; k++) {
        if (t->wins[k].n > 0 && t->wins[k].w == w)
            return (int)k;
        if (t->wins[k].n == 0 && free_k < 0)
            free_k = (int)k;
    }
    if (free_k >= 0)
        return free_k;
    if (t->nwins >= IDEM_MARKTAB_MAX_WINDOWS)
        return -1;
    size_t n = t->nwins ? t->nwins * 2 : 4;
    if (n > IDEM_MARKTAB_MAX_WINDOWS)
        n = IDEM_MARKTAB_MAX_WINDOWS;
    marktab_window_t *wins = realloc(t->wins, n * sizeof(*wins));
    if (!wins)
        return -1;
    memset(wins + t->nwins, 0, (n - t->nwins) * sizeof(*wins));
    free_k = (int)t->nwins;
    t->wins = wins;
    t->nwins = n;
    return free_k;
}

/* Moves every live mark into a table of `slots` slots (a power of two
 * with room to spare), dropping the tombstones. -1 on allocation failure,
 * the table unchanged. */
static int rehash(idem_marktab_t *t, size_t slots)
{
    idem_mark_t16 *marks = malloc(slots * sizeof(*marks));
    uint8_t *ctrl = calloc(slots, 1);
    if (!marks || !ctrl) {
        free(marks);
        free(ctrl);
        return -1;
    }
    size_t mask = slots - 1;
    for (size_t i = 0; i < t->slots; i++) {
        if (t->ctrl[i] < CTRL_WIN0)
            continue;
        size_t j = home_slot(t->marks[i].b, mask);
        while (ctrl[j] != CTRL_EMPTY)
            j = (j + 1) & mask;
        ctrl[j] = t->ctrl[i];
        marks[j] = t->marks[i];
    }
    free(t->marks);
    free(t->ctrl);
    t->marks = marks;
    t->ctrl = ctrl;
    t->slots = slots;
    t->tombs = 0;
    return 0;
}

/* The smallest table (at least MIN_SLOTS) that holds n marks at most
 * half full. */
static size_t slots_to_fit(size_t n)
{
    size_t slots = MIN_SLOTS;
    while (slots / 2 < n)
        slots *= 2;
    return slots;
}

int idem_marktab_find(const idem_marktab_t *t, const uint8_t id12[12],
                      idem_mark_t16 *out)
{
    if (t->live == 0)
        return 0;
    size_t mask = t->slots - 1, found = SIZE_MAX;
    for (size_t i = home_slot(id12, mask); t->ctrl[i] != CTRL_EMPTY;
         i = (i + 1) & mask) {
        if (t->ctrl[i] < CTRL_WIN0 || memcmp(t->marks[i].b, id12, 12) != 0)
            continue;
        if (found == SIZE_MAX || t->wins[t->ctrl[i] - CTRL_WIN0].w >
                                     t->wins[t->ctrl[found] - CTRL_WIN0].w)
            found = i;
    }
    if (found == SIZE_MAX)
        return 0;
    if (out)
        *out = t->marks[found];
    return 1;
}

int idem_marktab_add(idem_marktab_t *t, const idem_mark_t16 *m, int64_t w)
{
    int k = window_index_for_add(t, w);
    if (k < 0)
        return -1;
    /* Keep at least a quarter of the slots empty so every probe ends. */
    if ((t->live + t->tombs + 1) * 4 > t->slots * 3) {
        size_t slots = t->slots ? t->slots : MIN_SLOTS;
        if ((t->live + 1) * 8 > slots * 3)
            slots *= 2; /* else the tombstones alone filled it */
        if (rehash(t, slots) != 0)
            return -1;
    }
    uint8_t c = (uint8_t)(CTRL_WIN0 + k);
    size_t mask = t->slots - 1, tomb = SIZE_MAX, i;
    for (i = home_slot(m->b, mask); t->ctrl[i] != CTRL_EMPTY;
         i = (i + 1) & mask) {
        if (t->ctrl[i] == CTRL_TOMB) {
            if (tomb == SIZE_MAX)
                tomb = i;
        } else if (t->ctrl[i] == c && memcmp(t->marks[i].b, m->b, 12) == 0) {
            t->marks[i] = *m; /* the same mark in the same window: replace */
            return 0;
        }
    }
    if (tomb != SIZE_MAX) {
        i = tomb;
        t->tombs--;
    }
    t->ctrl[i] = c;
    t->marks[i] = *m;
    t->live++;
    if (t->wins[k].n++ == 0)
        t->wins[k].w = w;
    return 0;
}

int idem_marktab_remove(idem_marktab_t *t, const uint8_t id12[12], int64_t w)
{
    int k = window_index(t, w);
    if (k < 0)
        return 0;
    uint8_t c = (uint8_t)(CTRL_WIN0 + k);
    size_t mask = t->slots - 1;
    for (size_t i = home_slot(id12, mask); t->ctrl[i] != CTRL_EMPTY;
         i = (i + 1) & mask) {
        if (t->ctrl[i] != c || memcmp(t->marks[i].b, id12, 12) != 0)
            continue;
        t->live--;
        t->wins[k].n--;
        if (t->ctrl[(i + 1) & mask] != CTRL_EMPTY) {
            t->ctrl[i] = CTRL_TOMB; /* a probe may pass through here */
            t->tombs++;
            return 1;
        }
        /* Nothing probes past an empty slot: this slot and the
         * tombstones just before it become empty. */
        t->ctrl[i] = CTRL_EMPTY;
        for (size_t j = (i - 1) & mask; t->ctrl[j] == CTRL_TOMB;
             j = (j - 1) & mask) {
            t->ctrl[j] = CTRL_EMPTY;
            t->tombs--;
        }
        return 1;
    }
    return 0;
}

void idem_marktab_expire(idem_marktab_t *t, int64_t min_w)
{
    uint8_t old[IDEM_MARKTAB_MAX_WINDOWS] = {0};
    int any = 0;
    for (size_t k = 0; k < t->nwins; k++) {
        if (t->wins[k].n > 0 && t->wins[k].w < min_w) {
            old[k] = 1;
            any = 1;
        }
    }
    if (!any)
        return;
    for (size_t i = 0; i < t->slots; i++) {
        if (t->ctrl[i] >= CTRL_WIN0 && old[t->ctrl[i] - CTRL_WIN0]) {
            t->ctrl[i] = CTRL_TOMB;
            t->live--;
            t->tombs++;
        }
    }
    for (size_t k = 0; k < t->nwins; k++)
        if (old[k])
            t->wins[k].n = 0;
    if (t->live == 0) { /* every slot is empty or a tombstone */
        free(t->marks);
        free(t->ctrl);
        t->marks = NULL;
        t->ctrl = NULL;
        t->slots = t->tombs = 0;
        return;
    }
    /* Shrink when under 3/16 full; else drop the tombstones once they
     * are a quarter of the slots. On failure the table stays as it is. */
    if (t->live * 16 < t->slots * 3 && slots_to_fit(t->live) < t->slots)
        (void)rehash(t, slots_to_fit(t->live));
    else if (t->tombs * 4 > t->slots)
        (void)rehash(t, t->slots);
}

size_t idem_marktab_count(const idem_marktab_t *t)
{
    return t->live;
}

size_t idem_marktab_bytes(const idem_marktab_t *t)
{
    return sizeof(*t) + t->slots * (sizeof(idem_mark_t16) + 1) +
           t->nwins * sizeof(marktab_window_t);
}
