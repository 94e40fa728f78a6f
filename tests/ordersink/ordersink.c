/* ordersink: an HTTP service for the ordering tests and the ordering bench
 * that judges the order in which a webhook member's requests arrive, per
 * Kafka key (X-Kafka-Key; a record without one counts under its partition,
 * X-Kafka-Partition; with --by-partition every request counts under its
 * partition: one at a time per partition is then the order judged). It
 * answers each POST after a delay drawn uniformly
 * from [--delay-min-ms, --delay-max-ms] (microsecond steps), with 503 for
 * --fail-percent of the requests (seeded), else 200, and counts:
 *
 *   violations  a request that arrived while an earlier request of its key
 *               was not answered yet (an update overtaking its create)
 *   reorders    a first success of an identity (Idempotency-Key) whose
 *               X-Kafka-Offset is below that of a success of its key
 *               already applied: a later record took effect first
 *   applied     identities answered 2xx (the first time)
 *   repeats     2xx answers to an identity already applied (at least once
 *               after a crash: the key lets the service drop them)
 *
 * With --hold-key K the requests of Kafka key K wait (unanswered) until
 * a GET /release; /stats then also counts hold_applied, the identities
 * of K applied.
 *
 * Prints its URL on the first line of stdout. GET /stats answers the
 * counts as one JSON object, with the span from the first request's
 * arrival to the last answer and the process's CPU time; so does SIGTERM
 * or SIGINT, on stdout, before it exits. Thread per connection (the
 * delays overlap), one lock over the tables (held for microseconds). */
#include <arpa/inet.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* One key (of a record) or one identity: open addressing, grown at half. */
typedef struct {
    char *name;
    int inflight;       /* key: requests not answered yet */
    int64_t max_offset; /* key: highest offset applied; -1 none */
    int applied;        /* identity: answered 2xx once */
} entry_t;

typedef struct {
    entry_t *v;
    size_t size, used;
} table_t;

typedef struct {
    int delay_min_us, delay_max_us;
    int fail_percent;
    int by_partition;     /* group requests by partition, not by key */
    const char *hold_key; /* --hold-key: its requests wait for /release */
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t released_cv;
    int released;
    uint64_t hold_applied;
    uint64_t rng;
    table_t keys, ids;
    uint64_t requests, ok, failed, violations, reorders, applied, repeats;
    int64_t first_us, last_us; /* first arrival, last answer (monotonic) */
    int shown;                 /* violations logged to stderr */
} sink_t;

typedef struct {
    char *body;
    size_t len;
} upload_t;

static volatile sig_atomic_t running = 1;

static void on_signal(int sig)
{
    (void)sig;
    running = 0;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* The entry named `name`, added when missing. Exits when out of memory
 * (a test service: nothing to save). */
static entry_t *table_get(table_t *t, const char *name)
{
    if (2 * (t->used + 1) > t->size) {
        table_t g = {NULL, t->size ? 2 * t->size : 1024, 0};
        if (!(g.v = calloc(g.size, sizeof(*g.v))))
            abort();
        for (size_t i = 0; i < t->size; i++)
            if (t->v[i].name) {
                size_t j = hash(t->v[i].name) & (g.size - 1);
                while (g.v[j].name)
                    j = (j + 1) & (g.size - 1);
                g.v[j] = t->v[i];
                g.used++;
            }
        free(t->v);
        *t = g;
    }
    size_t j = hash(name) & (t->size - 1);
    for (; t->v[j].name; j = (j + 1) & (t->size - 1))
        if (!strcmp(t->v[j].name, name))
            return &t->v[j];
    if (!(t->v[j].name = strdup(name)))
        abort();
    t->v[j].max_offset = -1;
    t->used++;
    return &t->v[j];
}

/* xorshift64*: the delays and the failures, reproducible by --seed. */
static uint64_t rng_next(sink_t *s)
{
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 2685821657736338717ULL;
}

static void stats_json(sink_t *s, char *out, size_t cap)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int64_t cpu = (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 +
                  ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
    pthread_mutex_lock(&s->lock);
    snprintf(out, cap,
             "{\"requests\":%" PRIu64 ",\"ok\":%" PRIu64 ",\"failed\":%" PRIu64
             ",\"violations\":%" PRIu64 ",\"reorders\":%" PRIu64
             ",\"applied\":%" PRIu64 ",\"repeats\":%" PRIu64
             ",\"hold_applied\":%" PRIu64 ",\"keys\":%zu,\"span_us\":%" PRId64
             ",\"cpu_us\":%" PRId64 "}",
             s->requests, s->ok, s->failed, s->violations, s->reorders,
             s->applied, s->repeats, s->hold_applied, s->keys.used,
             s->first_us ? s->last_us - s->first_us : 0, cpu);
    pthread_mutex_unlock(&s->lock);
}

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned status,
                              const char *body)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* The request's key: "k:<X-Kafka-Key>", or "p:<partition>" without one. */
static void key_of(const sink_t *s, struct MHD_Connection *conn, char *out,
                   size_t cap)
{
    const char *k =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Kafka-Key");
    const char *p =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Kafka-Partition");
    if (k && !s->by_partition)
        snprintf(out, cap, "k:%s", k);
    else
        snprintf(out, cap, "p:%s", p ? p : "?");
}

static enum MHD_Result on_post(sink_t *s, struct MHD_Connection *conn)
{
    char key[512];
    key_of(s, conn, key, sizeof(key));
    const char *id =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Idempotency-Key");
    const char *off_s =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Kafka-Offset");
    int64_t off = off_s ? strtoll(off_s, NULL, 10) : -1;
    const char *kk =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Kafka-Key");
    int held = s->hold_key && kk && !strcmp(kk, s->hold_key);

    pthread_mutex_lock(&s->lock);
    int64_t t = now_us();
    if (!s->first_us)
        s->first_us = t;
    s->requests++;
    entry_t *k = table_get(&s->keys, key);
    if (k->inflight > 0) {
        s->violations++;
        if (s->shown++ < 10)
            fprintf(stderr,
                    "ordersink: violation: %s offset %" PRId64
                    " arrived while %d of its key in flight\n",
                    key, off, k->inflight);
    }
    k->inflight++;
    uint64_t r = rng_next(s);
    int fail = s->fail_percent && (int)(r % 100) < s->fail_percent;
    int span = s->delay_max_us - s->delay_min_us;
    int delay =
        s->delay_min_us + (span ? (int)((r >> 8) % (uint64_t)(span + 1)) : 0);
    pthread_mutex_unlock(&s->lock);

    if (delay > 0) {
        struct timespec ts = {delay / 1000000, (long)(delay % 1000000) * 1000L};
        while (nanosleep(&ts, &ts))
            ;
    }

    pthread_mutex_lock(&s->lock);
    while (held && !s->released && running)
        pthread_cond_wait(&s->released_cv, &s->lock);
    if (fail) {
        s->failed++;
    } else {
        s->ok++;
        entry_t *e = table_get(&s->ids, id ? id : "");
        k = table_get(&s->keys, key); /* the table may have grown */
        if (e->applied) {
            s->repeats++;
        } else {
            e->applied = 1;
            s->applied++;
            s->hold_applied += (uint64_t)held;
            if (off >= 0 && off < k->max_offset)
                s->reorders++;
            if (off > k->max_offset)
                k->max_offset = off;
        }
    }
    k = table_get(&s->keys, key);
    k->inflight--; /* before the answer leaves: the next may come after */
    s->last_us = now_us();
    pthread_mutex_unlock(&s->lock);
    return answer(conn, fail ? 503 : 200, fail ? "try again" : "ok");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    (void)upload_data;
    sink_t *s = cls;
    if (!strcmp(method, "GET") && !strcmp(url, "/release")) {
        pthread_mutex_lock(&s->lock);
        s->released = 1;
        pthread_cond_broadcast(&s->released_cv);
        pthread_mutex_unlock(&s->lock);
        return answer(conn, 200, "released");
    }
    if (!strcmp(method, "GET")) {
        char js[1024];
        stats_json(s, js, sizeof(js));
        return answer(conn, 200, js);
    }
    upload_t *up = *con_cls;
    if (!up) { /* headers only so far */
        *con_cls = calloc(1, sizeof(upload_t));
        return *con_cls ? MHD_YES : MHD_NO;
    }
    if (*upload_data_size) { /* the body is not looked at */
        up->len += *upload_data_size;
        *upload_data_size = 0;
        return MHD_YES;
    }
    return on_post(s, conn);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    free(*con_cls);
    *con_cls = NULL;
}

static int usage(void)
{
    fprintf(stderr, "usage: ordersink [--delay-min-ms N] [--delay-max-ms N] "
                    "[--fail-percent P] [--seed S] [--by-partition] "
                    "[--hold-key K]\n");
    return 2;
}

int main(int argc, char **argv)
{
    static sink_t s = {.delay_max_us = 5000, .rng = 88172645463325252ULL};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--by-partition")) {
            s.by_partition = 1;
            continue;
        }
        if (i + 1 >= argc)
            return usage();
        double v = atof(argv[i + 1]);
        if (!strcmp(argv[i], "--delay-min-ms"))
            s.delay_min_us = (int)(v * 1000);
        else if (!strcmp(argv[i], "--delay-max-ms"))
            s.delay_max_us = (int)(v * 1000);
        else if (!strcmp(argv[i], "--fail-percent"))
            s.fail_percent = (int)v;
        else if (!strcmp(argv[i], "--hold-key"))
            s.hold_key = argv[i + 1];
        else if (!strcmp(argv[i], "--seed"))
            s.rng = (uint64_t)strtoull(argv[i + 1], NULL, 10) | 1;
        else
            return usage();
        i++;
    }
    if (s.delay_min_us < 0 || s.delay_max_us < s.delay_min_us ||
        s.fail_percent < 0 || s.fail_percent > 100)
        return usage();
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.released_cv, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0,
        NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sin, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
        NULL, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)1024, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "ordersink: cannot start the server\n");
        return 1;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("http://127.0.0.1:%u/hook\n", info ? info->port : 0);
    fflush(stdout);
    while (running)
        usleep(50 * 1000);
    pthread_mutex_lock(&s.lock); /* held requests end too */
    pthread_cond_broadcast(&s.released_cv);
    pthread_mutex_unlock(&s.lock);
    MHD_stop_daemon(d);
    char js[1024];
    stats_json(&s, js, sizeof(js));
    printf("%s\n", js);
    return 0;
}
