/* test_marktab: the member's table of one partition's marks, against a
 * plain reference model: add, find, remove, windows and their expiry,
 * tombstones, growth and shrinking. */
#include "loop/marktab.h"

#include <criterion/criterion.h>
#include <string.h>

/* A mark whose 12 hash bytes are built from id (sequential ids: the table
 * must not rely on the ids being random) and whose last 4 bytes are tail,
 * big-endian. */
static idem_mark_t16 mark_of(uint32_t id, uint32_t tail)
{
    idem_mark_t16 m;
    memset(&m, 0, sizeof(m));
    memcpy(m.b, &id, sizeof(id));
    m.b[11] = 0x5a;
    for (int i = 0; i < 4; i++)
        m.b[12 + i] = (uint8_t)(tail >> (24 - 8 * i));
    return m;
}

static uint32_t tail_of(const idem_mark_t16 *m)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | m->b[12 + i];
    return v;
}

static idem_marktab_t *tab;

static void setup(void)
{
    tab = idem_marktab_new();
    cr_assert_not_null(tab);
}

static void teardown(void)
{
    idem_marktab_destroy(tab);
}

TestSuite(marktab, .init = setup, .fini = teardown);

Test(marktab, add_find_remove_and_add_again)
{
    idem_mark_t16 a = mark_of(1, 0x1234), got;
    cr_expect_eq(idem_marktab_find(tab, a.b, &got), 0);
    cr_assert_eq(idem_marktab_add(tab, &a, 7), 0);
    cr_assert_eq(idem_marktab_find(tab, a.b, &got), 1);
    cr_expect_eq(memcmp(&got, &a, sizeof(a)), 0);
    cr_expect_eq(idem_marktab_count(tab), 1);
    idem_mark_t16 b = mark_of(2, 1);
    cr_expect_eq(idem_marktab_find(tab, b.b, NULL), 0, "another id");

    cr_expect_eq(idem_marktab_remove(tab, a.b, 8), 0, "not in window 8");
    cr_expect_eq(idem_marktab_remove(tab, b.b, 7), 0, "never added");
    cr_expect_eq(idem_marktab_remove(tab, a.b, 7), 1);
    cr_expect_eq(idem_marktab_find(tab, a.b, NULL), 0);
    cr_expect_eq(idem_marktab_count(tab), 0);
    cr_expect_eq(idem_marktab_remove(tab, a.b, 7), 0, "removed once only");

    idem_mark_t16 a2 = mark_of(1, 0x777);
    cr_assert_eq(idem_marktab_add(tab, &a2, 7), 0);
    cr_assert_eq(idem_marktab_find(tab, a.b, &got), 1);
    cr_expect_eq(tail_of(&got), 0x777);
    cr_expect_eq(idem_marktab_count(tab), 1);
}

Test(marktab, same_mark_in_same_window_is_replaced_not_doubled)
{
    idem_mark_t16 a = mark_of(3, 10), a2 = mark_of(3, 11), got;
    cr_assert_eq(idem_marktab_add(tab, &a, 1), 0);
    cr_assert_eq(idem_marktab_add(tab, &a2, 1), 0);
    cr_expect_eq(idem_marktab_count(tab), 1);
    cr_assert_eq(idem_marktab_find(tab, a.b, &got), 1);
    cr_expect_eq(tail_of(&got), 11);
    cr_expect_eq(idem_marktab_remove(tab, a.b, 1), 1);
    cr_expect_eq(idem_marktab_find(tab, a.b, NULL), 0);
}

Test(marktab, moved_flag_is_kept_and_replaced)
{
    idem_mark_t16 moved = mark_of(9, 0x80000000u), done = mark_of(9, 0x42);
    cr_expect(idem_mark_moved(&moved));
    cr_expect_not(idem_mark_moved(&done));
    idem_mark_t16 got;
    cr_assert_eq(idem_marktab_add(tab, &moved, 4), 0);
    cr_assert_eq(idem_marktab_find(tab, moved.b, &got), 1);
    cr_expect(idem_mark_moved(&got));
    cr_assert_eq(idem_marktab_add(tab, &done, 4), 0);
    cr_assert_eq(idem_marktab_find(tab, moved.b, &got), 1);
    cr_expect_not(idem_mark_moved(&got));
    cr_expect_eq(tail_of(&got), 0x42);
    /* A moved entry in a newer window is what find reports. */
    cr_assert_eq(idem_marktab_add(tab, &moved, 5), 0);
    cr_assert_eq(idem_marktab_find(tab, moved.b, &got), 1);
    cr_expect(idem_mark_moved(&got));
}

Test(marktab, a_mark_in_two_windows)
{
    idem_mark_t16 old = mark_of(5, 1), young = mark_of(5, 2), got;
    cr_assert_eq(idem_marktab_add(tab, &old, 10), 0);
    cr_assert_eq(idem_marktab_add(tab, &young, 12), 0);
    cr_expect_eq(idem_marktab_count(tab), 2);
    cr_assert_eq(idem_marktab_find(tab, old.b, &got), 1);
    cr_expect_eq(tail_of(&got), 2, "the newest window's mark");

    /* Taking back window 12's entry leaves window 10's. */
    cr_expect_eq(idem_marktab_remove(tab, old.b, 12), 1);
    cr_assert_eq(idem_marktab_find(tab, old.b, &got), 1);
    cr_expect_eq(tail_of(&got), 1);

    /* Expiring window 10 leaves window 12's. */
    cr_assert_eq(idem_marktab_add(tab, &young, 12), 0);
    idem_marktab_expire(tab, 11);
    cr_expect_eq(idem_marktab_count(tab), 1);
    cr_assert_eq(idem_marktab_find(tab, old.b, &got), 1);
    cr_expect_eq(tail_of(&got), 2);
    cr_expect_eq(idem_marktab_remove(tab, old.b, 10), 0, "window 10 is gone");
    idem_marktab_expire(tab, 13);
    cr_expect_eq(idem_marktab_find(tab, old.b, NULL), 0);
    cr_expect_eq(idem_marktab_count(tab), 0);
}

Test(marktab, expiry_drops_older_windows_only)
{
    for (uint32_t i = 0; i < 3000; i++) {
        idem_mark_t16 m = mark_of(i, i);
        cr_assert_eq(idem_marktab_add(tab, &m, 100 + i / 1000), 0);
    }
    cr_expect_eq(idem_marktab_count(tab), 3000);
    idem_marktab_expire(tab, 100); /* nothing older than 100 */
    cr_expect_eq(idem_marktab_count(tab), 3000);
    idem_marktab_expire(tab, 102);
    cr_expect_eq(idem_marktab_count(tab), 1000);
    for (uint32_t i = 0; i < 3000; i++) {
        idem_mark_t16 m = mark_of(i, i), got;
        int held = idem_marktab_find(tab, m.b, &got);
        cr_assert_eq(held, i >= 2000, "id %u", i);
        if (held)
            cr_assert_eq(tail_of(&got), i);
    }
    /* A window that comes back after expiry starts empty. */
    idem_mark_t16 m = mark_of(1, 1);
    cr_assert_eq(idem_marktab_add(tab, &m, 100), 0);
    cr_expect_eq(idem_marktab_count(tab), 1001);
}

Test(marktab, bytes_grow_and_shrink)
{
    size_t empty = idem_marktab_bytes(tab);
    for (uint32_t i = 0; i < 100000; i++) {
        idem_mark_t16 m = mark_of(i, 0);
        cr_assert_eq(idem_marktab_add(tab, &m, i < 99000 ? 1 : 2), 0);
    }
    size_t full = idem_marktab_bytes(tab);
    cr_expect_gt(full, empty + 100000 * 17, "%zu bytes", full);
    cr_expect_lt(full, empty + 100000 * 17 * 3, "%zu bytes", full);
    idem_marktab_expire(tab, 2);
    size_t after = idem_marktab_bytes(tab);
    cr_expect_eq(idem_marktab_count(tab), 1000);
    cr_expect_lt(after, full / 16, "%zu bytes after expiry", after);
    idem_marktab_expire(tab, 3);
    cr_expect_eq(idem_marktab_count(tab), 0);
    cr_expect_lt(idem_marktab_bytes(tab), empty + 1024);
    idem_marktab_clear(tab);
    cr_expect_eq(idem_marktab_bytes(tab), empty);
}

/* Adding and taking back marks, one after the other, reuses the slots:
 * the table does not fill with tombstones or grow. */
Test(marktab, tombstones_do_not_grow_the_table)
{
    idem_mark_t16 keep[40];
    for (uint32_t i = 0; i < 40; i++) {
        keep[i] = mark_of(1000000 + i, i);
        cr_assert_eq(idem_marktab_add(tab, &keep[i], 1), 0);
    }
    size_t bytes = idem_marktab_bytes(tab);
    for (uint32_t i = 0; i < 200000; i++) {
        idem_mark_t16 m = mark_of(i, i);
        cr_assert_eq(idem_marktab_add(tab, &m, 1), 0);
        if (i % 3 == 0)
            cr_assert_eq(idem_marktab_add(tab, &m, 1), 0, "re-add");
        cr_assert_eq(idem_marktab_remove(tab, m.b, 1), 1);
    }
    cr_expect_eq(idem_marktab_count(tab), 40);
    cr_expect_leq(idem_marktab_bytes(tab), bytes * 2, "%zu bytes, was %zu",
                  idem_marktab_bytes(tab), bytes);
    for (uint32_t i = 0; i < 40; i++)
        cr_expect_eq(idem_marktab_find(tab, keep[i].b, NULL), 1);
}

Test(marktab, too_many_live_windows_is_refused)
{
    for (int64_t w = 0; w < IDEM_MARKTAB_MAX_WINDOWS; w++) {
        idem_mark_t16 m = mark_of((uint32_t)w, 0);
        cr_assert_eq(idem_marktab_add(tab, &m, w), 0, "window %ld", (long)w);
    }
    idem_mark_t16 extra = mark_of(99999, 0);
    cr_expect_eq(idem_marktab_add(tab, &extra, 1000), -1);
    cr_expect_eq(idem_marktab_find(tab, extra.b, NULL), 0);
    cr_expect_eq(idem_marktab_add(tab, &extra, 3), 0, "a live window is fine");
    idem_marktab_expire(tab, 1);
    cr_expect_eq(idem_marktab_add(tab, &extra, 1000), 0, "a window freed");
}

/* The reference model: which (id, window) pairs are held, with the tail.
 * Windows advance over the run; ids come from a small pool so that adds,
 * re-adds and removes of the same marks keep meeting. */
#define MODEL_IDS     3000
#define MODEL_WINDOWS 128
static struct {
    uint8_t held[MODEL_IDS][MODEL_WINDOWS];
    uint32_t tail[MODEL_IDS][MODEL_WINDOWS];
} model;

static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static int model_find(uint32_t id, int64_t min_w, uint32_t *tail)
{
    for (int64_t w = MODEL_WINDOWS - 1; w >= min_w; w--) {
        if (model.held[id][w]) {
            *tail = model.tail[id][w];
            return 1;
        }
    }
    return 0;
}

Test(marktab, random_operations_match_a_reference_model)
{
    memset(&model, 0, sizeof(model));
    rng_state = 0x2545f4914f6cdd1dULL;
    int64_t cur = 0, min_w = 0;
    size_t count = 0;
    for (int op = 0; op < 100000; op++) {
        if (op % 1000 == 999 && cur + 1 < MODEL_WINDOWS)
            cur++;
        uint32_t id = rnd(MODEL_IDS);
        int64_t w = cur - (int64_t)rnd(3);
        if (w < min_w)
            w = min_w;
        uint32_t r = rnd(100), want_tail = 0;
        idem_mark_t16 m = mark_of(id, rnd(0xffffffffu));
        idem_mark_t16 got;
        if (r < 45) {
            cr_assert_eq(idem_marktab_add(tab, &m, w), 0);
            count += !model.held[id][w];
            model.held[id][w] = 1;
            model.tail[id][w] = tail_of(&m);
        } else if (r < 75) {
            int removed = idem_marktab_remove(tab, m.b, w);
            cr_assert_eq(removed, model.held[id][w], "op %d remove", op);
            count -= model.held[id][w];
            model.held[id][w] = 0;
        } else if (r < 99) {
            int held = model_find(id, min_w, &want_tail);
            cr_assert_eq(idem_marktab_find(tab, m.b, &got), held, "op %d", op);
            if (held)
                cr_assert_eq(tail_of(&got), want_tail, "op %d", op);
        } else if (cur - 4 > min_w) {
            int64_t to = cur - 4;
            for (uint32_t i = 0; i < MODEL_IDS; i++)
                for (int64_t x = min_w; x < to; x++) {
                    count -= model.held[i][x];
                    model.held[i][x] = 0;
                }
            min_w = to;
            idem_marktab_expire(tab, min_w);
        }
        cr_assert_eq(idem_marktab_count(tab), count, "op %d", op);
    }
    for (uint32_t id = 0; id < MODEL_IDS; id++) {
        uint32_t want_tail = 0;
        idem_mark_t16 m = mark_of(id, 0), got;
        int held = model_find(id, min_w, &want_tail);
        cr_assert_eq(idem_marktab_find(tab, m.b, &got), held, "id %u", id);
        if (held)
            cr_assert_eq(tail_of(&got), want_tail, "id %u", id);
    }
    cr_expect_gt(min_w, 50, "the run expired windows");
}
