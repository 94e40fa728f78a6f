/* cmd_broker: `idemproc broker`, the embedded in-memory development Kafka. */
#include "dev/broker.h"
#include "cmd/cmd.h"
#include "cmd/signals.h"
#include "dev/faults.h"
#include "base/util.h"
#include "dev/watermark.h"

#include <inttypes.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void idem_cmd_broker_usage(FILE *out)
{
    fprintf(
        out,
        "usage: idemproc broker [--brokers N] [--topic NAME:PARTITIONS]...\n"
        "                       [--faults FILE|-]\n"
        "  An embedded development Kafka (librdkafka's mock cluster) on "
        "127.0.0.1.\n"
        "  Prints its bootstrap servers as the first line on stdout and "
        "serves until\n"
        "  SIGTERM or SIGINT (exit 0).\n\n"
        "options:\n"
        "  --brokers N             number of brokers (1..32, default 1)\n"
        "  --topic NAME:PARTITIONS create a topic (repeatable); topics used "
        "without\n"
        "                          creating them are auto-created with 4 "
        "partitions\n"
        "  --faults FILE|-         apply the fault schedule in FILE (- = "
        "stdin; below)\n"
        "  -h, --help              this text\n\n"
        "limits of the mock cluster:\n"
        "  - state is in memory only: nothing persists, and every start "
        "listens on\n"
        "    new random ports;\n"
        "  - it keeps only about 5 MiB per partition and silently drops older "
        "records\n"
        "    beyond that (a warning on stderr says so), so size partitions "
        "for the\n"
        "    data (--topic NAME:P);\n"
        "  - it answers a fetch with no data only after fetch.wait.max.ms, so "
        "clients\n"
        "    should set fetch.wait.max.ms low (e.g. 10).\n\n");
    idem_faults_print_help(out);
}

/* Applies every fault of `f` due at `now_ms` (since the start), from
 * index *next on; logs each on stderr. Returns the ms until the next one
 * (-1 when none is left). */
static int64_t faults_apply_due(idem_broker_t *broker, const idem_faults_t *f,
                                size_t *next, int64_t now_ms)
{
    for (; *next < f->cnt && f->faults[*next].at_ms <= now_ms; (*next)++) {
        const idem_fault_t *x = &f->faults[*next];
        char what[512], err[512];
        idem_fault_format(x, what, sizeof(what));
        if (idem_fault_apply(broker, x, err, sizeof(err)))
            fprintf(stderr, "idemproc broker: fault +%lldms %s failed: %s\n",
                    (long long)now_ms, what, err);
        else
            fprintf(stderr, "idemproc broker: fault +%lldms %s\n",
                    (long long)now_ms, what);
        if (*next + 1 == f->cnt)
            fprintf(stderr, "idemproc broker: fault schedule done (%zu)\n",
                    f->cnt);
    }
    return *next < f->cnt ? f->faults[*next].at_ms - now_ms : -1;
}

/* idem_watermark_cb: the mock cluster drops a partition's oldest records
 * without a word when it passes its size limit; say it on stderr. */
static void broker_on_dropped(const char *topic, int32_t partition, int64_t low,
                              int64_t dropped, void *opaque)
{
    (void)opaque;
    fprintf(stderr,
            "idemproc broker: warning: %s [%" PRId32 "] dropped its %" PRId64
            " oldest records (earliest offset now %" PRId64
            "): this broker keeps about 5 MiB per partition; use more "
            "partitions (--topic %s:N) or smaller records\n",
            topic, partition, dropped, low, topic);
}

/* Names the flag getopt stopped at, as one usage line on stderr. */
static atomic_int watch_running = 1; /* cleared to stop watch_dropped */

/* The thread that looks for partitions that lost their oldest records
 * every 2 s (see broker_on_dropped). Its own thread, because one check can
 * take long when a broker is down (each of its partitions waits for the
 * timeout), and the fault schedule must stay on time. */
static void *watch_dropped(void *arg)
{
    idem_watermark_t *wm = arg;
    char errstr[512];
    while (atomic_load(&watch_running)) {
        for (int i = 0; i < 20 && atomic_load(&watch_running); i++)
            usleep(100000);
        if (atomic_load(&watch_running))
            idem_watermark_check(wm, 2000, broker_on_dropped, NULL, errstr,
                                 sizeof(errstr));
    }
    return NULL;
}

static int usage_error(int c, char **argv, const char *what)
{
    const char *flag = argv[optind - 1];
    if (c == '?' && optopt)
        fprintf(stderr, "idemproc broker: unknown option -%c\n", optopt);
    else
        fprintf(stderr, "idemproc broker: %s %s\n", what, flag);
    return IDEM_EXIT_USAGE;
}

int idem_cmd_broker(int argc, char **argv, char **envp)
{
    (void)envp;
    static const struct option opts[] = {{"brokers", required_argument, 0, 'n'},
                                         {"topic", required_argument, 0, 't'},
                                         {"faults", required_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    char errstr[512];
    int broker_cnt = 1;
    char **topics = idem_xcalloc((size_t)argc, sizeof(*topics));
    size_t topic_cnt = 0;
    const char *faults_path = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'n': {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (!*optarg || *end || n < 1 || n > 32) {
                fprintf(stderr,
                        "idemproc broker: --brokers: bad value \"%s\" "
                        "(1..32)\n",
                        optarg);
                free(topics);
                return IDEM_EXIT_USAGE;
            }
            broker_cnt = (int)n;
            break;
        }
        case 't': {
            char name[256];
            int32_t p;
            if (idem_broker_topic_spec_parse(optarg, name, sizeof(name), &p,
                                             errstr, sizeof(errstr))) {
                fprintf(stderr, "idemproc broker: %s\n", errstr);
                free(topics);
                return IDEM_EXIT_USAGE;
            }
            topics[topic_cnt++] = optarg;
            break;
        }
        case 'f':
            faults_path = optarg;
            break;
        case 'h':
            idem_cmd_broker_usage(stdout);
            free(topics);
            return IDEM_EXIT_OK;
        case ':':
            free(topics);
            return usage_error(c, argv, "missing value for");
        default:
            free(topics);
            return usage_error(c, argv, "unknown option");
        }
    }
    if (optind < argc) {
        fprintf(stderr, "idemproc broker: unexpected argument \"%s\"\n",
                argv[optind]);
        free(topics);
        return IDEM_EXIT_USAGE;
    }

    /* The schedule is read and checked before anything starts. */
    idem_faults_t *faults = NULL;
    if (faults_path) {
        faults = idem_faults_load(faults_path, errstr, sizeof(errstr));
        if (!faults || idem_faults_check(faults,
                                         strcmp(faults_path, "-") ? faults_path
                                                                  : "<stdin>",
                                         broker_cnt, errstr, sizeof(errstr))) {
            fprintf(stderr, "idemproc broker: --faults: %s\n", errstr);
            idem_faults_destroy(faults);
            free(topics);
            return IDEM_EXIT_USAGE;
        }
    }

    /* SIGTERM/SIGINT stop the broker (signals.h); a second one changes
     * nothing. */
    idem_signals_opts_t so = {.second_exits = 0};
    idem_signals_setup(&so);
    volatile int *stop = idem_signals_stop_flag();

    idem_broker_t *broker = idem_broker_new(broker_cnt, errstr, sizeof(errstr));
    if (!broker) {
        fprintf(stderr, "idemproc broker: %s\n", errstr);
        idem_faults_destroy(faults);
        free(topics);
        return IDEM_EXIT_FAIL;
    }
    for (size_t i = 0; i < topic_cnt; i++) {
        char name[256];
        int32_t p;
        idem_broker_topic_spec_parse(topics[i], name, sizeof(name), &p, errstr,
                                     sizeof(errstr));
        if (idem_broker_topic_create(broker, name, p, errstr, sizeof(errstr))) {
            fprintf(stderr, "idemproc broker: %s\n", errstr);
            idem_broker_destroy(broker);
            idem_faults_destroy(faults);
            free(topics);
            return IDEM_EXIT_USAGE;
        }
    }
    free(topics);

    printf("%s\n", idem_broker_bootstraps(broker));
    fflush(stdout);
    /* Every few seconds, on a thread of its own, look for partitions that
     * lost their oldest records (see watch_dropped). */
    /* Not while a fault schedule runs: with a broker down, the mock
     * cluster did not apply the next fault while librdkafka's watermark
     * query waited for that broker's partitions, even from a thread of its
     * own (faults/schedule_on_time_while_a_broker_is_down). */
    idem_watermark_t *wm =
        faults ? NULL
               : idem_watermark_new(idem_broker_bootstraps(broker), errstr,
                                    sizeof(errstr));
    pthread_t watcher;
    if (faults)
        fprintf(stderr, "idemproc broker: fault schedule: no warnings about "
                        "dropped records\n");
    else if (!wm)
        fprintf(stderr,
                "idemproc broker: %s (no warnings about dropped "
                "records)\n",
                errstr);
    else if (pthread_create(&watcher, NULL, watch_dropped, wm)) {
        fprintf(stderr, "idemproc broker: no thread for the dropped-records "
                        "warnings\n");
        idem_watermark_destroy(wm);
        wm = NULL;
    }
    int64_t start_ms = idem_now_ms();
    int64_t next_check = start_ms + 2000;
    size_t next = 0;
    while (!*stop) {
        int64_t wait = 200;
        if (faults) {
            int64_t due = faults_apply_due(broker, faults, &next,
                                           idem_now_ms() - start_ms);
            if (due >= 0 && due < wait)
                wait = due;
        }
        idem_sleep_ms(wait, stop);
        if (wm && !*stop && idem_now_ms() >= next_check) {
            idem_watermark_check(wm, 2000, broker_on_dropped, NULL, errstr,
                                 sizeof(errstr));
            next_check = idem_now_ms() + 2000;
        }
    }
    if (wm) {
        /* A check in progress against a broker that is down may take a
         * while: wait 3 s at most, then leave it to the exit. */
        atomic_store(&watch_running, 0);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 3;
        if (!pthread_timedjoin_np(watcher, NULL, &until))
            idem_watermark_destroy(wm);
    }
    idem_broker_destroy(broker);
    idem_faults_destroy(faults);
    return IDEM_EXIT_OK;
}
