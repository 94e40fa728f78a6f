/* marktab_bench: ns per add and per find (hit and miss) of the member's
 * mark table and its bytes per mark, at N marks (default 1,000,000) with
 * SipHash-keyed ids as the loop makes them; median of 3 runs. Not a test:
 * built by `make bench`, run by hand: build/bench/marktab_bench [N]. */
#include "base/siphash.h"
#include "loop/marktab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static const uint8_t key[16] = {1, 2,  3,  4,  5,  6,  7,  8,
                                9, 10, 11, 12, 13, 14, 15, 16};

static idem_mark_t16 mark_of(uint64_t i)
{
    char id[32];
    int n = snprintf(id, sizeof(id), "payment-%llu", (unsigned long long)i);
    idem_mark_t16 m;
    idem_siphash24_128(key, id, (size_t)n, m.b); /* 12 B used, 4 B below */
    m.b[12] &= 0x7f;
    return m;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000;
    idem_mark_t16 *marks = malloc(2 * n * sizeof(*marks));
    if (!marks)
        return 1;
    for (size_t i = 0; i < 2 * n; i++)
        marks[i] = mark_of(i);
    double add[3], hit[3], miss[3], expire[3], bytes[3];
    size_t found = 0;
    for (int r = 0; r < 3; r++) {
        idem_marktab_t *t = idem_marktab_new();
        double t0 = now_ns();
        for (size_t i = 0; i < n; i++)
            if (idem_marktab_add(t, &marks[i], (int64_t)(i * 9 / n)) != 0)
                return 1;
        double t1 = now_ns();
        idem_mark_t16 out;
        for (size_t i = 0; i < n; i++)
            found += (size_t)idem_marktab_find(t, marks[i].b, &out);
        double t2 = now_ns();
        for (size_t i = n; i < 2 * n; i++)
            found += (size_t)idem_marktab_find(t, marks[i].b, &out);
        double t3 = now_ns();
        add[r] = (t1 - t0) / n;
        hit[r] = (t2 - t1) / n;
        miss[r] = (t3 - t2) / n;
        bytes[r] =
            (double)idem_marktab_bytes(t) / (double)idem_marktab_count(t);
        double t4 = now_ns();
        idem_marktab_expire(t, 1); /* the oldest of the 9 windows */
        expire[r] = (now_ns() - t4) / 1e6;
        if (idem_marktab_count(t) != n - n / 9 - (n % 9 != 0))
            fprintf(stderr, "marktab_bench: %zu left after expiry\n",
                    idem_marktab_count(t));
        idem_marktab_destroy(t);
    }
    if (found != 3 * n) {
        fprintf(stderr, "marktab_bench: %zu hits, want %zu\n", found, 3 * n);
        return 1;
    }
    qsort(add, 3, sizeof(double), cmp_double);
    qsort(hit, 3, sizeof(double), cmp_double);
    qsort(miss, 3, sizeof(double), cmp_double);
    qsort(expire, 3, sizeof(double), cmp_double);
    printf("marktab: %zu marks in 9 windows: add %.1f ns, find hit %.1f ns, "
           "find miss %.1f ns, expire a window %.2f ms (medians of 3), "
           "%.1f B/mark\n",
           n, add[1], hit[1], miss[1], expire[1], bytes[0]);
    free(marks);
    return 0;
}
