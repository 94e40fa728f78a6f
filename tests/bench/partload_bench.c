/* partload_bench: the assignment-time load of one partition holding many
 * marks under dedup.scope=partition (docs/design.md, "Dedup state
 * layout"): what a member does before a newly assigned partition's first
 * record can be applied.
 *
 * First (not timed) it writes --marks N (1,000,000) marks into partition
 * --partition P (0) of the configuration's input topic through the
 * product's own chunk path (redis/partstate.h: the ledger's chunk script,
 * epoch and position checked, 1,024 records a chunk, 16 chunks pipelined
 * per write, one ledger increment of 1 per record under the user
 * "partload"), so the marks sit in Redis in whatever layout partstate.c
 * writes. Then, --reps R (3) times, it loads them as a new owner does:
 * the epoch's INCR, then idem_partstate_load (GETRANGE pieces of at most
 * 1 MiB) into a fresh loop/parttables.h table, timed from before the INCR
 * to the table marked loaded. Every load must hold exactly N marks, and
 * every seeded identity must be found as a duplicate (exit 1 otherwise).
 *
 * Prints one line:
 *   partload: marks N chunks C seed_s S load_ms MIN MEDIAN MAX pieces K
 *   table_bytes B bytes_per_mark X
 * Links idemproc's library objects; not part of the product binary. */
#include "base/util.h"
#include "conf/conf.h"
#include "loop/parttables.h"
#include "redis/layout.h"
#include "redis/partstate.h"
#include "redis/store.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The group runs the partition layout (the layout key; a fresh Redis: a
 * group that never ran switches with nothing of the global layout to
 * honour). 0, or -1 with errstr. */
static int switch_to_partition(idem_store_t *store, const idem_conf_t *conf,
                               char *errstr, size_t errstr_size)
{
    char sha[41] = "";
    idem_layout_t l;
    if (idem_layout_store_switch(store, conf, sha, IDEM_LAYOUT_GLOBAL,
                                 IDEM_LAYOUT_PARTITION, &l, errstr,
                                 errstr_size) < 0)
        return -1;
    if (l.layout != IDEM_LAYOUT_PARTITION) {
        snprintf(errstr, errstr_size, "dedup layout: not partition");
        return -1;
    }
    return 0;
}

#define CHUNK     1024 /* records per chunk, as the loop's largest */
#define PIPELINED 16   /* chunks per write */
#define MAX_SETS  32
#define MAX_REPS  9

typedef struct {
    char identity[32];
    char message_id[32];
} seed_rec_t;

/* The ledger effect's 5 arguments of a seeded record. */
static size_t seed_args(const void *rec, const char **argv, size_t *argvlen,
                        void *opaque)
{
    (void)opaque;
    const seed_rec_t *r = rec;
    const char *v[] = {r->identity, r->message_id, "EUR", "partload", "1"};
    for (int k = 0; k < 5; k++) {
        argv[k] = v[k];
        argvlen[k] = strlen(v[k]);
    }
    return 5;
}

typedef struct {
    idem_parttables_t *tabs;
    const char *topic;
    int32_t partition;
    int rc;
} feed_t;

static int feed(const uint8_t *marks, size_t n, int64_t window, void *opaque)
{
    feed_t *f = opaque;
    f->rc =
        idem_parttables_load(f->tabs, f->topic, f->partition, marks, n, window);
    return f->rc ? -1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Writes n marks into topic/partition through chunk scripts. 0, or -1. */
static int seed(idem_store_t *store, idem_partstate_t *ps,
                idem_parttables_t *tabs, const char *topic, int32_t partition,
                const seed_rec_t *recs, size_t n, size_t *chunks, char *errstr,
                size_t errstr_size)
{
    int64_t epoch;
    idem_store_pos_t pos = {.topic = topic, .partition = partition};
    idem_posval_init(&pos.val, NULL);
    if (idem_partstate_epoch_bump(ps, topic, partition, &epoch, errstr,
                                  errstr_size) ||
        idem_store_positions_save(store, &pos, 1, errstr, errstr_size))
        return -1;
    static const void *crec[PIPELINED * CHUNK];
    static uint8_t cmark[PIPELINED * CHUNK][16];
    static idem_partstate_result_t cres[PIPELINED * CHUNK];
    idem_partstate_chunk_t ch[PIPELINED];
    idem_store_pos_t cpos[PIPELINED];
    idem_partstate_result_t *cr[PIPELINED];
    int64_t cw[PIPELINED];
    int crc[PIPELINED];
    size_t done = 0;
    *chunks = 0;
    while (done < n) {
        /* As the loop sends them (loop/partscope.c): one partition's chunks
         * of one request all expect the position Redis holds before the
         * request, and only the last writes the new one (the script reads
         * the positions once, before any write). */
        size_t k = 0, from = done;
        for (; k < PIPELINED && done < n; k++) {
            size_t m = n - done < CHUNK ? n - done : CHUNK;
            for (size_t j = 0; j < m; j++) {
                const seed_rec_t *r = &recs[done + j];
                idem_mark_t16 mk;
                idem_parttables_mark(tabs, r->identity, strlen(r->identity),
                                     r->message_id, strlen(r->message_id), &mk);
                crec[k * CHUNK + j] = r;
                memcpy(cmark[k * CHUNK + j], mk.b, 16);
            }
            cpos[k] = (idem_store_pos_t){.topic = topic,
                                         .partition = partition,
                                         .offset = (int64_t)(done + m)};
            idem_posval_init(&cpos[k].val, NULL);
            ch[k] = (idem_partstate_chunk_t){
                .topic = topic,
                .partition = partition,
                .epoch = epoch,
                .expect_offset = (int64_t)from,
                .recs = crec + k * CHUNK,
                .marks = (const uint8_t(*)[16])(cmark + k * CHUNK),
                .n = m};
            cr[k] = cres + k * CHUNK;
            done += m;
        }
        ch[k - 1].newpos = &cpos[k - 1];
        if (idem_partstate_chunks(ps, ch, k, cr, cw, crc, errstr, errstr_size))
            return -1;
        for (size_t c = 0; c < k; c++) {
            if (crc[c])
                return -1; /* errstr names it */
            for (size_t j = 0; j < ch[c].n; j++)
                if (cr[c][j].outcome != IDEM_PARTSTATE_APPLIED) {
                    snprintf(errstr, errstr_size, "seed record refused: %s",
                             cr[c][j].detail);
                    return -1;
                }
        }
        *chunks += k;
    }
    return 0;
}

/* One timed load into a fresh table; checks it. Returns 0, or -1. */
static int load_once(idem_partstate_t *ps, const uint8_t key[16],
                     const char *topic, int32_t partition,
                     const seed_rec_t *recs, size_t n, double *ms,
                     size_t *pieces, size_t *bytes, char *errstr,
                     size_t errstr_size)
{
    idem_parttables_t *tabs = idem_parttables_new(key, SIZE_MAX);
    if (!tabs) {
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    int rc = -1;
    int64_t t0 = idem_now_us(), epoch;
    feed_t f = {tabs, topic, partition, 0};
    *pieces = 0; /* idem_partstate_load adds to it */
    if (idem_partstate_epoch_bump(ps, topic, partition, &epoch, errstr,
                                  errstr_size) ||
        idem_parttables_assign(tabs, topic, partition, epoch) ||
        idem_partstate_load(ps, topic, partition, 0, feed, &f, pieces, errstr,
                            errstr_size))
        goto out;
    idem_parttables_loaded(tabs, topic, partition);
    *ms = (double)(idem_now_us() - t0) / 1000.0;
    size_t held = idem_parttables_count(tabs, topic, partition);
    if (held != n) {
        snprintf(errstr, errstr_size, "loaded %zu marks, seeded %zu", held, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        idem_mark_t16 m;
        idem_parttables_mark(tabs, recs[i].identity, strlen(recs[i].identity),
                             "again", 5, &m);
        if (idem_parttables_take(tabs, topic, partition, &m, 0, NULL) !=
            IDEM_PART_DUPLICATE) {
            snprintf(errstr, errstr_size, "seeded %s not found after the load",
                     recs[i].identity);
            goto out;
        }
    }
    *bytes = idem_parttables_bytes(tabs);
    rc = 0;
out:
    idem_parttables_destroy(tabs);
    return rc;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: partload_bench -c FILE [--set k=v]... [--marks N] "
                 "[--partition P] [--reps R]\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},
        {"set", required_argument, 0, 's'},
        {"marks", required_argument, 0, 'n'},
        {"partition", required_argument, 0, 'p'},
        {"reps", required_argument, 0, 'r'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *path = NULL;
    char *sets[MAX_SETS];
    size_t nsets = 0, n = 1000000;
    int32_t partition = 0;
    int reps = 3, o;
    while ((o = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            path = optarg;
            break;
        case 's':
            if (nsets == MAX_SETS) {
                fprintf(stderr, "partload_bench: at most %d --set\n", MAX_SETS);
                return 2;
            }
            sets[nsets++] = optarg;
            break;
        case 'n':
            n = strtoul(optarg, NULL, 10);
            break;
        case 'p':
            partition = (int32_t)strtol(optarg, NULL, 10);
            break;
        case 'r':
            reps = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!path || n == 0 || partition < 0 || reps < 1 || reps > MAX_REPS) {
        usage(stderr);
        return 2;
    }
    char errstr[1024];
    idem_conf_t *conf =
        idem_conf_load(path, NULL, sets, nsets, errstr, sizeof(errstr));
    if (!conf) {
        fprintf(stderr, "partload_bench: %s\n", errstr);
        return 2;
    }
    const char *topic = conf->input_topics;
    extern const char idem_ledger_lua[];
    extern const size_t idem_ledger_lua_len;
    seed_rec_t *recs = idem_xcalloc(n, sizeof(*recs));
    for (size_t i = 0; i < n; i++) {
        snprintf(recs[i].identity, sizeof(recs[i].identity), "partload-%zu", i);
        snprintf(recs[i].message_id, sizeof(recs[i].message_id), "m-%zu", i);
    }
    idem_store_t *store = idem_store_new(conf, NULL);
    idem_partstate_t *ps = NULL;
    idem_parttables_t *tabs = NULL;
    uint8_t key[16];
    int rc = 1;
    size_t chunks = 0, pieces = 0, bytes = 0;
    double ms[MAX_REPS];
    if (!store ||
        idem_store_effect_register(store, idem_ledger_lua, idem_ledger_lua_len,
                                   5, seed_args, NULL, errstr,
                                   sizeof(errstr)) < 0 ||
        !(ps = idem_partstate_new(store, conf, errstr, sizeof(errstr))) ||
        idem_partstate_hashkey(ps, key, errstr, sizeof(errstr)) ||
        !(tabs = idem_parttables_new(key, SIZE_MAX)) ||
        switch_to_partition(store, conf, errstr, sizeof(errstr)))
        goto out;
    int64_t t0 = idem_now_us();
    if (seed(store, ps, tabs, topic, partition, recs, n, &chunks, errstr,
             sizeof(errstr)))
        goto out;
    double seed_s = (double)(idem_now_us() - t0) / 1e6;
    for (int r = 0; r < reps; r++)
        if (load_once(ps, key, topic, partition, recs, n, &ms[r], &pieces,
                      &bytes, errstr, sizeof(errstr)))
            goto out;
    qsort(ms, (size_t)reps, sizeof(double), cmp_double);
    printf("partload: marks %zu chunks %zu seed_s %.2f load_ms %.1f %.1f %.1f "
           "pieces %zu table_bytes %zu bytes_per_mark %.1f\n",
           n, chunks, seed_s, ms[0], ms[(reps - 1) / 2], ms[reps - 1], pieces,
           bytes, (double)bytes / (double)n);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "partload_bench: %s\n", errstr);
    idem_parttables_destroy(tabs);
    idem_partstate_destroy(ps);
    idem_store_destroy(store);
    idem_conf_destroy(conf);
    free(recs);
    return rc;
}
