/* parttables_bench: ns per record of the member's partition tables on the
 * loop's hot path (idem_parttables_ready, then idem_parttables_take, as
 * loop/partscope.c calls them for every partition-path record), with P
 * partitions of one input topic held (default 64) and records spread over
 * them round robin; also at 1,024 partitions, where a scan of the held
 * partitions would show. Medians of 3 runs. Not a test: built by `make
 * bench`, run by hand: build/bench/parttables_bench [P]. */
#include "base/siphash.h"
#include "loop/parttables.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MARKS_PER_PART 1024 /* held marks per partition (small: cache-warm) */
#define ROUNDS         200  /* lookups per held mark */

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const uint8_t key[16] = "bench-key-16byte";

/* One run at `parts` partitions: ns per (ready + take) of a held mark, so
 * the table answers "duplicate" and stays the same size throughout. */
static double run(int32_t parts, idem_mark_t16 *marks, size_t *dups)
{
    idem_parttables_t *t = idem_parttables_new(key, (size_t)1 << 40);
    if (!t)
        exit(1);
    /* a second topic held too, as a member reading a retry topic would */
    for (int32_t p = 0; p < parts; p++)
        if (idem_parttables_assign(t, "payments.retry1", p, 1) ||
            idem_parttables_assign(t, "payments", p, 1))
            exit(1);
    for (int32_t p = 0; p < parts; p++) {
        idem_parttables_loaded(t, "payments", p);
        if (idem_parttables_load(t, "payments", p, marks[0].b, MARKS_PER_PART,
                                 0))
            exit(1);
    }
    size_t n = (size_t)ROUNDS * MARKS_PER_PART;
    double t0 = now_ns();
    for (size_t i = 0; i < n; i++) {
        int32_t p = (int32_t)(i % (size_t)parts);
        int64_t epoch;
        uint32_t prior;
        if (!idem_parttables_ready(t, "payments", p, &epoch))
            exit(1);
        *dups +=
            idem_parttables_take(t, "payments", p, &marks[i % MARKS_PER_PART],
                                 0, &prior) == IDEM_PART_DUPLICATE;
    }
    double ns = (now_ns() - t0) / (double)n;
    idem_parttables_destroy(t);
    return ns;
}

int main(int argc, char **argv)
{
    int32_t parts = argc > 1 ? (int32_t)strtol(argv[1], NULL, 10) : 64;
    if (parts < 1)
        parts = 64;
    idem_mark_t16 marks[MARKS_PER_PART];
    for (size_t i = 0; i < MARKS_PER_PART; i++) {
        char id[32];
        int len = snprintf(id, sizeof(id), "payment-%zu", i);
        idem_siphash24_128(key, id, (size_t)len, marks[i].b);
        marks[i].b[12] &= 0x7f;
    }
    int32_t sizes[2] = {parts, 1024};
    for (int s = 0; s < 2; s++) {
        double ns[3];
        size_t dups = 0;
        for (int r = 0; r < 3; r++)
            ns[r] = run(sizes[s], marks, &dups);
        if (dups != 3 * (size_t)ROUNDS * MARKS_PER_PART) {
            fprintf(stderr, "parttables_bench: %zu duplicates, want %zu\n",
                    dups, 3 * (size_t)ROUNDS * MARKS_PER_PART);
            return 1;
        }
        qsort(ns, 3, sizeof(double), cmp_double);
        printf("parttables: %d partitions (and a retry topic's): ready + "
               "take %.1f ns per record (min %.1f, max %.1f; medians of 3)\n",
               sizes[s], ns[1], ns[0], ns[2]);
    }
    return 0;
}
