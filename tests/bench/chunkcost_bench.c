/* chunkcost_bench: where a Redis's CPU goes per record for the partition
 * layout's chunk script (docs/design.md, "Redis Cluster mode", the bench
 * paragraph): the same ledger chunks sent in the shape one Redis gets them
 * and in the shape a cluster primary gets them, to one redis-server.
 *
 * The script is the product's own (redis/partchunk.lua with the ledger's
 * effect, composed as redis/partstate.c composes it). Every "request"
 * holds --per-chunk records for each of --partitions partitions (random
 * users of --users, three currencies, 16-byte marks); requests are sent
 * until --records records went. --shape picks how:
 *
 *   one      as on one Redis: a request's chunks in one call (at most
 *            4,096 records a call; more are pipelined calls), flag "0",
 *            the group's positions hash and layout key
 *   cluster  as on a cluster primary: one call per partition (flag "c":
 *            every key under the partition's tag, the ledger's balances
 *            sharded per partition, the EXISTS pre-reads), a request's
 *            calls pipelined in one write; works on a plain server and
 *            on a cluster-enabled one that owns every slot
 *
 * --no-exists removes the cluster shape's EXISTS pre-reads from the
 * script (a measurement only: the product must read them). Each call's
 * reply is checked (every chunk accepted, no record refused), else exit 1.
 * The server is FLUSHALLed first unless --keep; its CPU (INFO cpu,
 * used_cpu_user + used_cpu_sys) and INFO commandstats (reset first) are
 * read around the sends. Prints one line:
 *   chunkcost: shape S records N calls C records_per_call R cpu_us_per_record
 *   X script_us_per_record Y <command>=<calls per 1k records>/<µs per
 *   record> ...
 * where script_us is EVALSHA's own time less its commands' (Lua, argument
 * handling, the script's loops). Links idemproc's library objects for the
 * embedded scripts; not part of the product binary. */
#include "base/util.h"

#include <getopt.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

extern const char idem_partchunk_lua[];
extern const size_t idem_partchunk_lua_len;
extern const char idem_ledger_lua[];
extern const size_t idem_ledger_lua_len;

#define CALL_RECORDS 4096 /* as redis/partstate.c */
#define MAX_PARTS    1024
#define MAX_CMDS     64

static const char *const currencies[] = {"EUR", "USD", "TRY"};

typedef struct {
    const char *shape;
    int cluster; /* the cluster shape */
    int parts, per_chunk, users, no_exists, keep;
    long records;
    uint64_t rng;
    int64_t offset[MAX_PARTS]; /* each partition's position */
    char sha[41];
} bench_t;

static uint64_t rnd(bench_t *b)
{
    uint64_t z = (b->rng += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static void fail(const char *what, const redisContext *c, const redisReply *r)
{
    fprintf(stderr, "chunkcost_bench: %s: %s\n", what,
            c && c->err                         ? c->errstr
            : r && r->type == REDIS_REPLY_ERROR ? r->str
                                                : "unexpected reply");
    exit(1);
}

static redisReply *cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r || r->type == REDIS_REPLY_ERROR)
        fail(fmt, c, r);
    return r;
}

/* used_cpu_user + used_cpu_sys of INFO cpu, in µs. */
static double server_cpu_us(redisContext *c)
{
    redisReply *r = cmd(c, "INFO cpu");
    const char *u = strstr(r->str, "used_cpu_user:");
    const char *s = strstr(r->str, "used_cpu_sys:");
    double us = (u && s) ? (atof(u + 14) + atof(s + 13)) * 1e6 : 0;
    freeReplyObject(r);
    return us;
}

/* The composed chunk script, as redis/partstate.c composes it; without the
 * EXISTS pre-reads when asked (each becomes a call of tostring). */
static char *script(const bench_t *b)
{
    size_t n = 64 + idem_ledger_lua_len + idem_partchunk_lua_len;
    char *src = idem_xmalloc(n);
    snprintf(src, n, "local PER = 5\n%.*s\n%.*s", (int)idem_ledger_lua_len,
             idem_ledger_lua, (int)idem_partchunk_lua_len, idem_partchunk_lua);
    if (b->no_exists) {
        static const char from[] = "redis.call('EXISTS', ";
        static const char to[] = "tostring(";
        char *p;
        while ((p = strstr(src, from))) {
            memcpy(p, to, sizeof(to) - 1);
            memmove(p + sizeof(to) - 1, p + sizeof(from) - 1,
                    strlen(p + sizeof(from) - 1) + 1);
        }
    }
    return src;
}

/* A growing argv of one call. */
typedef struct {
    char **v;
    size_t *len;
    size_t n, cap;
} args_t;

static void arg(args_t *a, const void *s, size_t len)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 256;
        a->v = idem_xrealloc(a->v, a->cap * sizeof(*a->v));
        a->len = idem_xrealloc(a->len, a->cap * sizeof(*a->len));
    }
    a->v[a->n] = idem_xmalloc(len + 1);
    memcpy(a->v[a->n], s, len);
    a->v[a->n][len] = '\0';
    a->len[a->n++] = len;
}

static void args_str(args_t *a, const char *s)
{
    arg(a, s, strlen(s));
}

static void args_clear(args_t *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    a->n = 0;
}

static void stem(int p, char *buf, size_t size)
{
    snprintf(buf, size, "cc:st{g:t:%d}:", p);
}

/* Appends the EVALSHA of partitions [p0, p0 + k), per_chunk records each,
 * to the connection. */
static void call_append(bench_t *b, redisContext *c, args_t *a, int p0, int k)
{
    char buf[128], st[64];
    args_clear(a);
    args_str(a, "EVALSHA");
    args_str(a, b->sha);
    snprintf(buf, sizeof(buf), "%d", k + 2);
    args_str(a, buf);
    for (int i = 0; i < k; i++) {
        stem(p0 + i, st, sizeof(st));
        snprintf(buf, sizeof(buf), "%sepoch", st);
        args_str(a, buf);
    }
    if (b->cluster) {
        snprintf(buf, sizeof(buf), "cc:pos{g:t:%d}", p0);
        args_str(a, buf);
        stem(p0, st, sizeof(st));
        snprintf(buf, sizeof(buf), "%slayout", st);
        args_str(a, buf);
    } else {
        args_str(a, "cc:pos:g");
        args_str(a, "cc:layout:g");
    }
    const char *head[] = {"cc:", "g", "86400", "10800"};
    for (int i = 0; i < 4; i++)
        args_str(a, head[i]);
    snprintf(buf, sizeof(buf), "%d", k);
    args_str(a, buf);
    args_str(a, "67108864");
    uint8_t *marks = idem_xmalloc((size_t)b->per_chunk * 16 + 1);
    for (int i = 0; i < k; i++) {
        int p = p0 + i;
        stem(p, st, sizeof(st));
        args_str(a, st);
        args_str(a, "1");
        snprintf(buf, sizeof(buf), "%" PRId64, b->offset[p]);
        args_str(a, buf);
        b->offset[p] += b->per_chunk;
        snprintf(buf, sizeof(buf), "%" PRId64, b->offset[p]);
        args_str(a, buf);
        snprintf(buf, sizeof(buf), "t:%d", p);
        args_str(a, buf);
        snprintf(buf, sizeof(buf), "%d", b->per_chunk);
        args_str(a, buf);
        for (int q = 0; q < b->per_chunk; q++) {
            uint64_t x = rnd(b), y = rnd(b);
            memcpy(marks + q * 16, &x, 8);
            memcpy(marks + q * 16 + 8, &y, 8);
            marks[q * 16 + 12] &= 0x7f; /* not "moved" */
        }
        arg(a, marks, (size_t)b->per_chunk * 16);
    }
    free(marks);
    args_str(a, b->cluster ? "c" : "0");
    for (int i = 0; i < k * b->per_chunk; i++) {
        uint64_t x = rnd(b);
        args_str(a, currencies[x % 3]);
        snprintf(buf, sizeof(buf), "u%" PRIu64, (x >> 8) % (uint64_t)b->users);
        args_str(a, buf);
        snprintf(buf, sizeof(buf), "%" PRIu64, 1 + (x >> 40) % 100000);
        args_str(a, buf);
    }
    if (redisAppendCommandArgv(c, (int)a->n, (const char **)a->v, a->len) !=
        REDIS_OK)
        fail("append", c, NULL);
}

/* Reads one call's reply: every one of its k chunks accepted, no note. */
static void call_check(redisContext *c, int k)
{
    redisReply *r = NULL;
    if (redisGetReply(c, (void **)&r) != REDIS_OK || !r ||
        r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)k + 1)
        fail("chunk call", c, r);
    for (int i = 1; i <= k; i++)
        if (r->element[i]->type != REDIS_REPLY_STRING || r->element[i]->len)
            fail(r->element[i]->str ? r->element[i]->str : "chunk", NULL, NULL);
    freeReplyObject(r);
}

typedef struct {
    char name[32];
    double calls, usec;
} cmdstat_t;

/* INFO commandstats into st[]; the count. */
static int cmdstats(redisContext *c, cmdstat_t *st)
{
    redisReply *r = cmd(c, "INFO commandstats");
    int n = 0;
    for (const char *l = strstr(r->str, "cmdstat_"); l && n < MAX_CMDS;
         l = strstr(l + 1, "\ncmdstat_")) {
        if (*l == '\n')
            l++;
        double calls = 0, usec = 0;
        char name[32];
        if (sscanf(l, "cmdstat_%31[^:]:calls=%lf,usec=%lf", name, &calls,
                   &usec) == 3) {
            for (char *q = name; *q; q++)
                if (*q == '|') /* a subcommand's: config|resetstat */
                    *q = '_';
            snprintf(st[n].name, sizeof(st[n].name), "%s", name);
            st[n].calls = calls;
            st[n].usec = usec;
            n++;
        }
    }
    freeReplyObject(r);
    return n;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: chunkcost_bench --port P [--shape one|cluster] "
                 "[--partitions N] [--per-chunk N] [--records N] [--users N] "
                 "[--no-exists] [--keep] [--seed N]\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"port", required_argument, 0, 'p'},
        {"shape", required_argument, 0, 's'},
        {"partitions", required_argument, 0, 'n'},
        {"per-chunk", required_argument, 0, 'k'},
        {"records", required_argument, 0, 'r'},
        {"users", required_argument, 0, 'u'},
        {"seed", required_argument, 0, 'e'},
        {"no-exists", no_argument, 0, 'x'},
        {"keep", no_argument, 0, 'K'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    bench_t b = {.shape = "one",
                 .parts = 64,
                 .per_chunk = 15,
                 .users = 3000,
                 .records = 200000,
                 .rng = 7};
    int port = 0, o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'p':
            port = atoi(optarg);
            break;
        case 's':
            b.shape = optarg;
            break;
        case 'n':
            b.parts = atoi(optarg);
            break;
        case 'k':
            b.per_chunk = atoi(optarg);
            break;
        case 'r':
            b.records = atol(optarg);
            break;
        case 'u':
            b.users = atoi(optarg);
            break;
        case 'e':
            b.rng = strtoull(optarg, NULL, 10);
            break;
        case 'x':
            b.no_exists = 1;
            break;
        case 'K':
            b.keep = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    b.cluster = !strcmp(b.shape, "cluster");
    if (port <= 0 || (!b.cluster && strcmp(b.shape, "one")) || b.parts < 1 ||
        b.parts > MAX_PARTS || b.per_chunk < 1 || b.per_chunk > CALL_RECORDS ||
        b.users < 1 || b.records < 1) {
        usage(stderr);
        return 2;
    }
    redisContext *c = redisConnect("127.0.0.1", port);
    if (!c || c->err)
        fail("connect", c, NULL);
    if (!b.keep)
        freeReplyObject(cmd(c, "FLUSHALL"));
    char *src = script(&b);
    redisReply *r = cmd(c, "SCRIPT LOAD %s", src);
    snprintf(b.sha, sizeof(b.sha), "%s", r->str);
    freeReplyObject(r);
    free(src);
    /* Epochs at 1, positions at their keys' current offsets (0 when new:
     * --keep continues a previous run's). */
    for (int p = 0; p < b.parts; p++) {
        char st[64], k[96], f[32];
        stem(p, st, sizeof(st));
        snprintf(k, sizeof(k), "%sepoch", st);
        freeReplyObject(cmd(c, "SET %s 1", k));
        snprintf(k, sizeof(k), b.cluster ? "cc:pos{g:t:%d}" : "cc:pos:g", p);
        snprintf(f, sizeof(f), "t:%d", p);
        r = cmd(c, "HGET %s %s", k, f);
        b.offset[p] = r->type == REDIS_REPLY_STRING ? atoll(r->str) : 0;
        freeReplyObject(r);
        freeReplyObject(cmd(c, "HSET %s %s %" PRId64, k, f, b.offset[p]));
    }
    freeReplyObject(cmd(c, "HSET cc:layout:g layout partition from partition"));
    freeReplyObject(cmd(c, "CONFIG RESETSTAT"));
    double cpu0 = server_cpu_us(c);
    args_t a = {0};
    long sent = 0, calls = 0;
    int per_call = CALL_RECORDS / b.per_chunk;
    while (sent < b.records) {
        int pending = 0, sizes[MAX_PARTS];
        for (int p0 = 0; p0 < b.parts;) {
            int k = b.cluster                 ? 1
                    : b.parts - p0 < per_call ? b.parts - p0
                                              : per_call;
            call_append(&b, c, &a, p0, k);
            sizes[pending++] = k;
            p0 += k;
        }
        for (int i = 0; i < pending; i++)
            call_check(c, sizes[i]);
        calls += pending;
        sent += (long)b.parts * b.per_chunk;
    }
    double cpu = server_cpu_us(c) - cpu0;
    cmdstat_t st[MAX_CMDS];
    int n = cmdstats(c, st);
    double inner = 0, eval = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(st[i].name, "evalsha"))
            eval = st[i].usec;
        else if (strcmp(st[i].name, "info"))
            inner += st[i].usec;
    }
    printf("chunkcost: shape %s%s records %ld calls %ld records_per_call "
           "%.1f cpu_us_per_record %.3f script_us_per_record %.3f",
           b.shape, b.no_exists ? "-no-exists" : "", sent, calls,
           (double)sent / (double)calls, cpu / (double)sent,
           (eval - inner) / (double)sent);
    for (int i = 0; i < n; i++)
        if (strcmp(st[i].name, "info"))
            printf(" %s=%.1f/%.3f", st[i].name,
                   st[i].calls * 1000 / (double)sent,
                   st[i].usec / (double)sent);
    printf("\n");
    args_clear(&a);
    free(a.v);
    free(a.len);
    redisFree(c);
    return 0;
}
