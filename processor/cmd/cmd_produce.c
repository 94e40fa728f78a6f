/* cmd_produce: `idemproc produce`, the idempotent producer of generated
 * payment traffic or of JSON lines from a file or stdin. */
#include "cmd/cmd.h"
#include "cmd/signals.h"
#include "conf/conf.h"
#include "dev/expect.h"
#include "dev/gen.h"
#include "dev/inputfile.h"
#include "dev/inputline.h"
#include "base/log.h"
#include "base/outcome.h"
#include "dev/producer.h"
#include "base/util.h"
#include "effect/handler.h"
#include "input/envelope.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

/* Set by the first SIGINT/SIGTERM: stop generating or reading, flush;
 * by the second: purge what is still queued and report it as failed
 * (signals.h). */
#define produce_stop  (*idem_signals_stop_flag())
#define produce_abort (*idem_signals_abort_flag())

void idem_cmd_produce_usage(FILE *out)
{
    fprintf(
        out,
        "usage: idemproc produce -b BOOTSTRAP -t TOPIC [options]\n"
        "       idemproc produce -c FILE [options]\n"
        "  Idempotent producer (enable.idempotence=true, acks=all). Sends "
        "generated\n"
        "  payment traffic, or JSON lines with --input. Exit 0 only when "
        "every message\n"
        "  was acknowledged; 1 otherwise (\"N of M messages failed: "
        "REASON\").\n\n"
        "options:\n"
        "  -b, --bootstrap LIST     bootstrap servers (host:port,...)\n"
        "  -t, --topic TOPIC        topic to write to\n"
        "  -c, --config FILE        the processor's configuration file (and "
        "IDEMPROC_*\n"
        "                           variables): kafka.bootstrap.servers, "
        "kafka.* (security),\n"
        "                           the topic from input.topics, "
        "message.max.bytes for\n"
        "                           --expect, log.format and log.level; -b, "
        "-t, -X win\n"
        "  --timeout SECONDS        give up on a broker that does not answer, "
        "and on\n"
        "                           each message not acknowledged, after this "
        "long\n"
        "                           (message.timeout.ms; default 30)\n"
        "  -X PROP=VALUE            librdkafka property (repeatable), e.g. "
        "-X linger.ms=20\n"
        "  -v, --verbose            print the effective librdkafka settings "
        "(secrets masked)\n"
        "  --rate R                 messages per second (0 = as fast as "
        "possible; default 0);\n"
        "                           adds a line with the rate reached and "
        "the time from\n"
        "                           each message's CreateTime to its "
        "acknowledgement\n\n"
        "generated traffic (deterministic: same seed and options, same "
        "bytes):\n"
        "  --count N                unique payments + poison records "
        "(default 1000)\n"
        "  --users N                user_id drawn from user-1..user-N "
        "(default 100)\n"
        "  --currencies LIST        e.g. TRY,EUR,USD (3 upper-case letters "
        "each; default EUR)\n"
        "  --seed S                 PRNG seed (default 1)\n"
        "  --duplicates F           0..1: adds round(F*count) copies of "
        "earlier valid\n"
        "                           payments, half redeliveries (same "
        "message_id), half\n"
        "                           resends (new message_id, same "
        "idempotency_key), some\n"
        "                           adjacent, some hundreds to thousands of "
        "records later\n"
        "  --poison F               0..1: round(F*count) of count are poison, "
        "cycling\n"
        "                           too-large, not-json, not-object, "
        "no-identity, invalid-field\n"
        "  --too-large-bytes N      size of too-large values (default: "
        "message.max.bytes + 1,\n"
        "                           of -c FILE, else the processor's "
        "default); a size not\n"
        "                           above the message.max.bytes -c sets is "
        "refused\n"
        "  --expect FILE            write the expected outcome (counts and "
        "ledger) as JSON;\n"
        "                           also with --input, judged with -c's "
        "envelope.*, handler\n"
        "                           and message.max.bytes (README, \"The "
        "expectation file\")\n\n"
        "JSON lines:\n"
        "  --input FILE|-           send each line of FILE (- = stdin); lines "
        "that are not\n"
        "                           JSON are sent as-is and counted, empty "
        "lines are\n"
        "                           skipped and counted\n"
        "  --key-field POINTER      where the key is: a JSON Pointer "
        "(/order/customer/id)\n"
        "                           or a top-level name (sku); a JSON object "
        "without a\n"
        "                           string or integer there is not sent "
        "(exit 1); default:\n"
        "                           order_id, else message_id, never "
        "refusing\n"
        "  --key-delimiter DELIM    a line KEY<DELIM>VALUE sends KEY as the "
        "key "
        "and VALUE\n"
        "                           (kcat -P -K's format; \\t is a tab); a "
        "line without\n"
        "                           DELIM is all value, keyed by --key-field\n"
        "  --add-message-id[=random|stable]\n"
        "                           add a message_id to objects that lack "
        "one: random, or\n"
        "                           stable = derived from the line's bytes, "
        "so a re-sent\n"
        "                           file counts as redeliveries (default "
        "random)\n"
        "  --no-envelope-headers    send key and value only, as kcat -P does: "
        "no\n"
        "                           message_id/idempotency_key headers (a "
        "consumer must\n"
        "                           read the identity from the value)\n\n"
        "The embedded broker keeps only about 5 MiB per partition: size "
        "partitions\n"
        "for large runs (idemproc broker --topic NAME:P).\n");
}

enum {
    OPT_COUNT = 256,
    OPT_RATE,
    OPT_USERS,
    OPT_CURRENCIES,
    OPT_SEED,
    OPT_DUPLICATES,
    OPT_POISON,
    OPT_TOO_LARGE,
    OPT_EXPECT,
    OPT_INPUT,
    OPT_KEY_FIELD,
    OPT_KEY_DELIMITER,
    OPT_ADD_MESSAGE_ID,
    OPT_NO_ENVELOPE_HEADERS,
    OPT_TIMEOUT,
};

enum { MID_NONE = 0, MID_RANDOM, MID_STABLE };

typedef struct {
    const char *bootstrap;
    const char *topic;
    char **props;
    size_t prop_cnt;
    int verbose;
    double rate;
    idem_gen_opts_t gen;
    const char *expect_path;
    const char *input_path;
    const char *key_field;
    char key_delim_buf[16]; /* --key-delimiter, escapes read */
    const char *key_delim;  /* key_delim_buf, or NULL */
    size_t key_delim_len;
    int add_message_id; /* MID_* */
    int no_headers;     /* --no-envelope-headers */
    const char *config_path;
    int64_t timeout_s;
    int timeout_set;
    int message_timeout_set; /* -X message.timeout.ms or delivery.timeout.ms */
    idem_conf_t *conf;       /* -c FILE and IDEMPROC_*, not finalized */
    char **kafka_props;      /* "name=value" from conf, owned */
    size_t kafka_prop_cnt;
    const char *gen_flag; /* a generator-only flag that was given */
    int too_large_set;    /* --too-large-bytes given */
} produce_args_t;

static int parse_i64(const char *flag, const char *s, int64_t min, int64_t max,
                     int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        fprintf(stderr,
                "idemproc produce: %s: bad value \"%s\" (%" PRId64 "..%" PRId64
                ")\n",
                flag, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *flag, const char *s, double min, double max,
                        double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= min && v <= max)) {
        fprintf(stderr, "idemproc produce: %s: bad value \"%s\" (%g..%g)\n",
                flag, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

/* Reads --key-delimiter's value into a->key_delim: its bytes, with \\t
 * for a tab and \\\\ for a backslash (as kcat -K takes it). Returns 0, or
 * -1 after one line on stderr. */
static int key_delim_parse(const char *s, produce_args_t *a)
{
    size_t n = 0;
    for (; *s; s++) {
        char c = *s;
        if (c == '\\' && (s[1] == 't' || s[1] == '\\'))
            c = *++s == 't' ? '\t' : '\\';
        if (n + 1 >= sizeof(a->key_delim_buf)) {
            fprintf(stderr,
                    "idemproc produce: --key-delimiter: longer than "
                    "%zu bytes\n",
                    sizeof(a->key_delim_buf) - 1);
            return -1;
        }
        a->key_delim_buf[n++] = c;
    }
    if (n == 0) {
        fprintf(stderr, "idemproc produce: --key-delimiter: empty\n");
        return -1;
    }
    a->key_delim_buf[n] = '\0';
    a->key_delim = a->key_delim_buf;
    a->key_delim_len = n;
    return 0;
}

/* Parses argv into *a. Returns 0, 1 after --help, or -1 after printing one
 * line naming the bad flag. a->props is allocated; the caller frees it. */
static int args_parse(int argc, char **argv, produce_args_t *a)
{
    static const struct option opts[] = {
        {"bootstrap", required_argument, 0, 'b'},
        {"topic", required_argument, 0, 't'},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {"count", required_argument, 0, OPT_COUNT},
        {"rate", required_argument, 0, OPT_RATE},
        {"users", required_argument, 0, OPT_USERS},
        {"currencies", required_argument, 0, OPT_CURRENCIES},
        {"seed", required_argument, 0, OPT_SEED},
        {"duplicates", required_argument, 0, OPT_DUPLICATES},
        {"poison", required_argument, 0, OPT_POISON},
        {"too-large-bytes", required_argument, 0, OPT_TOO_LARGE},
        {"expect", required_argument, 0, OPT_EXPECT},
        {"input", required_argument, 0, OPT_INPUT},
        {"key-field", required_argument, 0, OPT_KEY_FIELD},
        {"key-delimiter", required_argument, 0, OPT_KEY_DELIMITER},
        {"add-message-id", optional_argument, 0, OPT_ADD_MESSAGE_ID},
        {"no-envelope-headers", no_argument, 0, OPT_NO_ENVELOPE_HEADERS},
        {"config", required_argument, 0, 'c'},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {0, 0, 0, 0}};
    char errstr[256];
    int64_t v;
    int c;
    memset(a, 0, sizeof(*a));
    idem_gen_opts_init(&a->gen);
    a->timeout_s = 30;
    a->props = idem_xcalloc((size_t)argc, sizeof(*a->props));
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":b:t:X:c:vh", opts, NULL)) != -1) {
        const char *flag = argv[optind - 1];
        switch (c) {
        case 'b':
            a->bootstrap = optarg;
            break;
        case 't':
            a->topic = optarg;
            break;
        case 'X':
            if (!strchr(optarg, '=') || optarg[0] == '=') {
                fprintf(stderr,
                        "idemproc produce: -X: \"%s\" is not "
                        "property=value\n",
                        optarg);
                return -1;
            }
            /* The promise of this command; accepting and then replacing
             * them would be a silent surprise. */
            if (!strncmp(optarg, "acks=", 5) ||
                !strncmp(optarg, "request.required.acks=", 22) ||
                !strncmp(optarg, "enable.idempotence=", 19)) {
                fprintf(stderr,
                        "idemproc produce: -X %.*s: not configurable (produce "
                        "is always idempotent with acks=all)\n",
                        (int)strcspn(optarg, "="), optarg);
                return -1;
            }
            a->props[a->prop_cnt++] = optarg;
            if (!strncmp(optarg, "message.timeout.ms=", 19) ||
                !strncmp(optarg, "delivery.timeout.ms=", 20))
                a->message_timeout_set = 1;
            break;
        case 'c':
            a->config_path = optarg;
            break;
        case OPT_TIMEOUT:
            if (parse_i64("--timeout", optarg, 1, 86400, &a->timeout_s))
                return -1;
            a->timeout_set = 1;
            break;
        case 'v':
            a->verbose = 1;
            break;
        case 'h':
            idem_cmd_produce_usage(stdout);
            return 1;
        case OPT_COUNT:
            a->gen_flag = "--count";
            if (parse_i64("--count", optarg, 1, INT64_C(1000000000),
                          &a->gen.count))
                return -1;
            break;
        case OPT_RATE:
            if (parse_double("--rate", optarg, 0, 10000000, &a->rate))
                return -1;
            break;
        case OPT_USERS:
            a->gen_flag = "--users";
            if (parse_i64("--users", optarg, 1, INT64_C(1000000000),
                          &a->gen.users))
                return -1;
            break;
        case OPT_CURRENCIES:
            a->gen_flag = "--currencies";
            if (idem_gen_currencies_check(optarg, errstr, sizeof(errstr))) {
                fprintf(stderr, "idemproc produce: %s\n", errstr);
                return -1;
            }
            a->gen.currencies = optarg;
            break;
        case OPT_SEED:
            a->gen_flag = "--seed";
            if (parse_i64("--seed", optarg, 0, INT64_MAX, &v))
                return -1;
            a->gen.seed = (uint64_t)v;
            break;
        case OPT_DUPLICATES:
            a->gen_flag = "--duplicates";
            if (parse_double("--duplicates", optarg, 0, 1, &a->gen.duplicates))
                return -1;
            break;
        case OPT_POISON:
            a->gen_flag = "--poison";
            if (parse_double("--poison", optarg, 0, 1, &a->gen.poison))
                return -1;
            break;
        case OPT_TOO_LARGE:
            a->gen_flag = "--too-large-bytes";
            a->too_large_set = 1;
            if (parse_i64("--too-large-bytes", optarg, 1024, INT64_C(100000000),
                          &a->gen.too_large_bytes))
                return -1;
            break;
        case OPT_EXPECT:
            a->expect_path = optarg;
            break;
        case OPT_INPUT:
            a->input_path = optarg;
            break;
        case OPT_KEY_FIELD:
            if (!*optarg) {
                fprintf(stderr, "idemproc produce: --key-field: empty\n");
                return -1;
            }
            a->key_field = optarg;
            break;
        case OPT_KEY_DELIMITER:
            if (key_delim_parse(optarg, a))
                return -1;
            break;
        case OPT_ADD_MESSAGE_ID:
            if (!optarg || !strcmp(optarg, "random")) {
                a->add_message_id = MID_RANDOM;
            } else if (!strcmp(optarg, "stable")) {
                a->add_message_id = MID_STABLE;
            } else {
                fprintf(stderr,
                        "idemproc produce: --add-message-id: \"%s\" is not "
                        "random or stable\n",
                        optarg);
                return -1;
            }
            break;
        case OPT_NO_ENVELOPE_HEADERS:
            a->no_headers = 1;
            break;
        case ':':
            fprintf(stderr, "idemproc produce: missing value for %s\n", flag);
            return -1;
        default:
            if (optopt && optopt < 256)
                fprintf(stderr, "idemproc produce: unknown option -%c\n",
                        optopt);
            else
                fprintf(stderr, "idemproc produce: unknown option %s\n", flag);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "idemproc produce: unexpected argument \"%s\"\n",
                argv[optind]);
        return -1;
    }
    if (a->input_path && a->gen_flag) {
        fprintf(stderr,
                "idemproc produce: %s: only for generated traffic, not with "
                "--input\n",
                a->gen_flag);
        return -1;
    }
    if (!a->input_path &&
        (a->key_field || a->add_message_id || a->key_delim || a->no_headers)) {
        fprintf(stderr, "idemproc produce: %s: only with --input\n",
                a->key_field        ? "--key-field"
                : a->key_delim      ? "--key-delimiter"
                : a->add_message_id ? "--add-message-id"
                                    : "--no-envelope-headers");
        return -1;
    }
    return 0;
}

/* Loads the configuration file (-c) and the IDEMPROC_* environment the way
 * `run` does, without run's required keys, and fills what -b/-t/-X left
 * open: bootstrap servers, the topic (input.topics when it names exactly
 * one topic) and the kafka.* properties (before -X, so -X wins). Returns
 * 0, or -1 after one line on stderr. */
/* --too-large-bytes against the member's message.max.bytes. When -c or
 * IDEMPROC_* set it: by default one byte above it, and a size at or below
 * it is refused, since the member would apply those records instead of
 * dead-lettering them as too-large and the expectation would be wrong.
 * When they leave it at the default, a size at or below the default only
 * gets a warning: the member may lower it (`run --set
 * message.max.bytes=4096`, as the README's first session does). Returns 0
 * or -1 (printed). */
static int too_large_resolve(produce_args_t *a)
{
    idem_conf_t *defaults = idem_conf_new();
    int64_t dflt = defaults->message_max_bytes;
    idem_conf_destroy(defaults);
    int64_t limit = a->conf->message_max_bytes;
    const char *from =
        a->config_path ? a->config_path : "IDEMPROC_MESSAGE_MAX_BYTES";
    if (limit == dflt) {
        if (a->config_path && a->too_large_set &&
            a->gen.too_large_bytes <= dflt)
            fprintf(stderr,
                    "idemproc produce: warning: --too-large-bytes %" PRId64
                    " is not above message.max.bytes %" PRId64
                    " (the default; %s does not set it): too-large only for "
                    "a member run with a lower message.max.bytes\n",
                    a->gen.too_large_bytes, limit, from);
        return 0;
    }
    if (!a->too_large_set) {
        a->gen.too_large_bytes = limit + 1 < 1024 ? 1024 : limit + 1;
        return 0;
    }
    if (a->gen.too_large_bytes > limit)
        return 0;
    fprintf(stderr,
            "idemproc produce: --too-large-bytes %" PRId64
            ": not above the member's message.max.bytes %" PRId64
            " (%s): it would apply those records, not dead-letter them as "
            "too-large; use at least %" PRId64 ", or leave the flag out\n",
            a->gen.too_large_bytes, limit, from, limit + 1);
    return -1;
}

static int args_resolve(produce_args_t *a, char **envp)
{
    char errstr[512];
    a->conf = idem_conf_new();
    if ((a->config_path && idem_conf_load_file(a->conf, a->config_path, errstr,
                                               sizeof(errstr))) ||
        idem_conf_load_env(a->conf, envp, errstr, sizeof(errstr))) {
        fprintf(stderr, "idemproc produce: %s\n", errstr);
        return -1;
    }
    const idem_conf_t *c = a->conf;
    if (!a->bootstrap && c->bootstrap_servers && *c->bootstrap_servers)
        a->bootstrap = c->bootstrap_servers;
    if (!a->bootstrap || !*a->bootstrap) {
        fprintf(stderr, "idemproc produce: -b/--bootstrap is required (or -c "
                        "FILE with kafka.bootstrap.servers)\n");
        return -1;
    }
    if (!a->topic && c->input_topics && *c->input_topics) {
        if (strchr(c->input_topics, ',') || c->input_topics[0] == '^') {
            fprintf(stderr,
                    "idemproc produce: -t/--topic is required: input.topics "
                    "\"%s\" is not a single topic\n",
                    c->input_topics);
            return -1;
        }
        a->topic = c->input_topics;
    }
    if (!a->topic || !*a->topic) {
        fprintf(stderr, "idemproc produce: -t/--topic is required (or -c "
                        "FILE with input.topics)\n");
        return -1;
    }
    if (too_large_resolve(a))
        return -1;
    a->kafka_props = idem_xcalloc(c->kafka_cnt + 1, sizeof(*a->kafka_props));
    for (size_t i = 0; i < c->kafka_cnt; i++) {
        size_t n = strlen(c->kafka[i].name) + strlen(c->kafka[i].value) + 2;
        a->kafka_props[i] = idem_xmalloc(n);
        snprintf(a->kafka_props[i], n, "%s=%s", c->kafka[i].name,
                 c->kafka[i].value);
    }
    a->kafka_prop_cnt = c->kafka_cnt;
    return 0;
}

static void args_free(produce_args_t *a)
{
    for (size_t i = 0; i < a->kafka_prop_cnt; i++)
        free(a->kafka_props[i]);
    free(a->kafka_props);
    free(a->props);
    idem_conf_destroy(a->conf);
}

/* Paces sending at `rate` messages per second with a token bucket whose
 * burst is a hundredth of a second: after a stall (the process got no CPU)
 * it catches up by at most 10 ms of traffic at once, so the consumer sees
 * the rate, not a burst of the whole stall. In steady state it wakes about
 * every millisecond (the shortest wait) and sends what that millisecond
 * earned. Waits by serving delivery reports. */
typedef struct {
    double rate, tokens, burst;
    int64_t last_us;
} bucket_t;

static void bucket_init(bucket_t *b, double rate)
{
    b->rate = rate;
    b->burst = rate / 100 > 1 ? rate / 100 : 1;
    b->tokens = 1;
    b->last_us = idem_now_us();
}

static void bucket_take(bucket_t *b, idem_producer_t *p)
{
    if (b->rate <= 0)
        return;
    for (;;) {
        int64_t now = idem_now_us();
        b->tokens += (double)(now - b->last_us) * b->rate / 1e6;
        b->last_us = now;
        if (b->tokens > b->burst)
            b->tokens = b->burst;
        if (b->tokens >= 1 || produce_stop) {
            b->tokens -= 1;
            return;
        }
        /* Sleep, then serve the delivery reports that arrived meanwhile:
         * waiting inside rd_kafka_poll() would wake this thread for every
         * batch of reports (one per partition and linger.ms: ~13,000 a
         * second at 25,000 records/s on 64 partitions), which cost more
         * CPU than the sending itself. */
        int wait_ms = (int)ceil((1 - b->tokens) * 1000 / b->rate);
        idem_sleep_ms(wait_ms > 0 ? wait_ms : 1, idem_signals_stop_flag());
        idem_producer_poll(p, 0);
    }
}

/* A progress bar on stderr, only for a terminal. total <= 0: unknown. */
typedef struct {
    int on;
    int64_t last_ms, start_ms;
} progress_t;

static void progress_show(progress_t *pg, int64_t done, int64_t total,
                          int force)
{
    if (!pg->on)
        return;
    int64_t now = idem_now_ms();
    if (!force && now - pg->last_ms < 200)
        return;
    pg->last_ms = now;
    double secs = (double)(now - pg->start_ms) / 1000;
    double rate = secs > 0 ? (double)done / secs : 0;
    if (total > 0) {
        int width = 30, fill = (int)(done * width / total);
        char bar[32];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\r[%s] %3d%% %" PRId64 "/%" PRId64 " %.0f msgs/s ",
                bar, (int)(done * 100 / total), done, total, rate);
    } else {
        fprintf(stderr, "\r%" PRId64 " sent %.0f msgs/s ", done, rate);
    }
}

static void progress_end(progress_t *pg)
{
    if (pg->on)
        fprintf(stderr, "\r\033[K");
}

typedef struct {
    int64_t sent;     /* handed to the producer */
    int64_t first_us; /* monotonic time of the first and the last send */
    int64_t last_us;
    int64_t not_json; /* --input lines that are not JSON */
    int64_t empty;    /* --input lines skipped because they are empty */
    int64_t refused;  /* --input objects without --key-field: not sent */
} counts_t;

/* Counts one message about to be handed to the producer; with --rate (a
 * rate > 0) also the time of the first and the last send. */
static void counts_send(counts_t *cnt, double rate)
{
    if (rate > 0) {
        cnt->last_us = idem_now_us();
        if (cnt->sent == 0)
            cnt->first_us = cnt->last_us;
    }
    cnt->sent++;
}

static void produce_generated(produce_args_t *a, idem_gen_t *gen,
                              idem_producer_t *p, progress_t *pg, counts_t *cnt)
{
    bucket_t bucket;
    idem_gen_record_t rec;
    char errstr[256];
    int64_t total = idem_gen_total(gen);
    bucket_init(&bucket, a->rate);
    while (!produce_stop && idem_gen_next(gen, &rec)) {
        bucket_take(&bucket, p);
        counts_send(cnt, a->rate);
        idem_producer_send(p, rec.key, rec.key_len, rec.value, rec.value_len,
                           rec.hdr_message_id, rec.hdr_idempotency_key, errstr,
                           sizeof(errstr));
        idem_producer_poll(p, 0);
        progress_show(pg, cnt->sent, total, 0);
    }
}

/* The line's key when it starts with one and a->key_delim: *key and
 * *key_len, and the value after the delimiter in *value and *value_len.
 * Returns 0 when the line holds no delimiter (all of it is the value). */
static int split_key(const produce_args_t *a, const char *line, size_t len,
                     const char **key, size_t *key_len, const char **value,
                     size_t *value_len)
{
    if (!a->key_delim)
        return 0;
    const char *d = memmem(line, len, a->key_delim, a->key_delim_len);
    if (!d)
        return 0;
    *key = line;
    *key_len = (size_t)(d - line);
    *value = d + a->key_delim_len;
    *value_len = len - *key_len - a->key_delim_len;
    return 1;
}

/* Sends every non-empty line of in (borrowed; a mapped file's values are
 * read in place by librdkafka, so in must stay open until the producer is
 * flushed); each value sent is also judged by `expect` (may be NULL).
 * Returns 0, or -1 with errstr after a read error. */
static int produce_input(produce_args_t *a, idem_inputfile_t *in,
                         idem_producer_t *p, idem_expect_t *expect,
                         progress_t *pg, counts_t *cnt, char *errstr,
                         size_t errstr_size)
{
    bucket_t bucket;
    bucket_init(&bucket, a->rate);
    char *edited = NULL;
    size_t edited_cap = 0;
    const char *line;
    long len;
    char serr[256];
    idem_inputline_t il;
    idem_inputline_init(&il);
    const char *field = a->key_field ? a->key_field : "order_id";
    int64_t lineno = 0;
    while (!produce_stop && (len = idem_inputfile_next(in, &line)) >= 0) {
        lineno++;
        if (len == 0) {
            cnt->empty++;
            continue;
        }
        const char *value = line, *key = NULL;
        size_t value_len = (size_t)len, key_len = 0;
        int prefixed =
            split_key(a, line, (size_t)len, &key, &key_len, &value, &value_len);
        idem_inputline_read(&il, value, value_len, prefixed ? NULL : field);
        if (a->key_field && !prefixed && il.object && !il.key_found) {
            /* A key the user named and the line lacks would be a null
             * key: the record would land on any partition, out of order
             * with its siblings. */
            if (cnt->refused++ < 10)
                fprintf(stderr,
                        "idemproc produce: --input %s line %" PRId64
                        ": --key-field %s: no string or integer there; "
                        "line not sent\n",
                        a->input_path, lineno, a->key_field);
            continue;
        }
        if (!il.json)
            cnt->not_json++;
        const char *mid = il.message_id;
        char newmid[37];
        if (il.object && a->add_message_id && !il.has_message_id) {
            /* Insert the field textually after '{': re-serializing would
             * change the bytes (e.g. 12.30 would become 12.3). */
            if (a->add_message_id == MID_STABLE)
                idem_uuid_stable(value, value_len, newmid);
            else
                idem_uuid(newmid);
            const char *brace = memchr(value, '{', value_len);
            size_t pre = (size_t)(brace - value) + 1;
            if (value_len + 64 > edited_cap) {
                edited_cap = 2 * (value_len + 64);
                edited = idem_xrealloc(edited, edited_cap);
            }
            int n = snprintf(edited, edited_cap, "%.*s\"message_id\":\"%s\"%s",
                             (int)pre, value, newmid, il.members ? "," : "");
            memcpy(edited + n, value + pre, value_len - pre);
            value = edited;
            value_len = (size_t)n + (value_len - pre);
            mid = newmid;
        }
        if (!prefixed) {
            key = il.key ? il.key : mid;
            key_len = il.key ? il.key_len : mid ? strlen(mid) : 0;
        }
        bucket_take(&bucket, p);
        counts_send(cnt, a->rate);
        /* The envelope's headers, unless the user asked for none. */
        const char *hmid = a->no_headers ? NULL : mid;
        const char *hikey = a->no_headers ? NULL : il.idempotency_key;
        if (expect)
            idem_expect_add(expect, value, value_len, key, key_len, hmid,
                            hikey);
        if (value != edited && idem_inputfile_kept(in))
            idem_producer_send_kept(p, key, key_len, value, value_len, hmid,
                                    hikey, serr, sizeof(serr));
        else
            idem_producer_send(p, key, key_len, value, value_len, hmid, hikey,
                               serr, sizeof(serr));
        idem_producer_poll(p, 0);
        progress_show(pg, cnt->sent, 0, 0);
    }
    int failed = !idem_inputfile_kept(in) && ferror(in->fp);
    if (failed)
        snprintf(errstr, errstr_size, "--input %s: read error: %m",
                 a->input_path);
    idem_inputline_term(&il);
    free(edited);
    return failed ? -1 : 0;
}

/* The props for idem_producer_new: the configuration file's kafka.*
 * first, then -X (later wins), then message.timeout.ms from --timeout
 * unless -X set it. Returns a new array of borrowed strings; *cnt its
 * length. tbuf holds the timeout property. */
static char **producer_props(const produce_args_t *a, char *tbuf,
                             size_t tbuf_size, size_t *cnt)
{
    char **v = idem_xcalloc(a->kafka_prop_cnt + a->prop_cnt + 1, sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < a->kafka_prop_cnt; i++)
        v[n++] = a->kafka_props[i];
    for (size_t i = 0; i < a->prop_cnt; i++)
        v[n++] = a->props[i];
    if (!a->message_timeout_set || a->timeout_set) {
        snprintf(tbuf, tbuf_size, "message.timeout.ms=%" PRId64,
                 a->timeout_s * 1000);
        v[n++] = tbuf;
    }
    *cnt = n;
    return v;
}

/* Prints the one-line summary on stderr. */
static void summary_print(idem_gen_t *gen, const counts_t *cnt,
                          const idem_producer_stats_t *st, double secs)
{
    char extra[256];
    if (gen) {
        json_t *e = idem_gen_expect(gen);
        json_t *d = json_object_get(e, "duplicates");
        json_t *po = json_object_get(e, "poison");
        json_int_t poison = 0;
        const char *k;
        json_t *v;
        json_object_foreach(po, k, v) poison += json_integer_value(v);
        snprintf(extra, sizeof(extra),
                 "duplicates %" JSON_INTEGER_FORMAT
                 " (redelivery %" JSON_INTEGER_FORMAT
                 ", resend %" JSON_INTEGER_FORMAT
                 "), poison %" JSON_INTEGER_FORMAT,
                 json_integer_value(json_object_get(d, "redelivery")) +
                     json_integer_value(json_object_get(d, "resend")),
                 json_integer_value(json_object_get(d, "redelivery")),
                 json_integer_value(json_object_get(d, "resend")), poison);
        json_decref(e);
    } else {
        int n =
            snprintf(extra, sizeof(extra),
                     "not-json lines %" PRId64 ", empty lines skipped %" PRId64,
                     cnt->not_json, cnt->empty);
        if (cnt->refused)
            snprintf(extra + n, sizeof(extra) - (size_t)n,
                     ", refused %" PRId64 " (--key-field)", cnt->refused);
    }
    fprintf(stderr,
            "produce: sent %" PRId64 ", acked %" PRId64 ", failed %" PRId64
            ", %s, elapsed %.3fs, %.0f msgs/s%s\n",
            cnt->sent, st->acked, st->failed, extra, secs,
            secs > 0 ? (double)st->acked / secs : 0.0,
            produce_stop ? " (interrupted)" : "");
}

/* With --rate: prints how the pacing went, on stderr: the rate reached
 * from the first send to the last (without connecting and the final
 * flush), as a share of --rate, and the acknowledgement latency
 * (CreateTime -> delivery report: linger.ms, the produce request, the
 * broker's append). `make bench` checks its latency row's rate with it. */
static void pacing_print(const produce_args_t *a, const counts_t *cnt,
                         const idem_producer_t *p)
{
    double span = (double)(cnt->last_us - cnt->first_us) / 1e6;
    double reached =
        cnt->sent > 1 && span > 0 ? (double)(cnt->sent - 1) / span : 0.0;
    char target[64] = "";
    snprintf(target, sizeof(target), " (%.1f%% of --rate %.0f)",
             reached * 100 / a->rate, a->rate);
    int64_t p50 = idem_producer_ack_quantile_ms(p, 0.5);
    int64_t p99 = idem_producer_ack_quantile_ms(p, 0.99);
    int64_t max = idem_producer_ack_quantile_ms(p, 1.0);
    fprintf(stderr,
            "produce: send rate %.0f msgs/s over %.3fs%s; acknowledged "
            "after p50 %" PRId64 " ms, p99 %" PRId64 " ms, max %" PRId64
            " ms (CreateTime -> delivery report)\n",
            reached, span, target, p50, p99, max);
}

/* The expectation of --input lines, judged as the configured member will
 * read them: the config's envelope.* and message.max.bytes, payments and a
 * ledger for a handler that needs them, each identity's value for a
 * forward that copies values unchanged. *rules gets the rules the tally
 * borrows (the caller destroys them after it). NULL with errstr for a
 * configuration the member would refuse. */
static idem_expect_t *expect_new(const idem_conf_t *conf,
                                 idem_envelope_rules_t **rules, char *errstr,
                                 size_t errstr_size)
{
    const char *arg;
    const idem_handler_ops_t *ops =
        idem_handler_find(conf->handler, &arg, errstr, errstr_size);
    if (!ops)
        return NULL;
    *rules = idem_envelope_rules_new(
        conf->envelope_format, conf->envelope_identity,
        conf->envelope_message_id, ops->needs_payment,
        (size_t)conf->message_max_bytes, errstr, errstr_size);
    if (!*rules)
        return NULL;
    int flags = ops->needs_payment ? IDEM_EXPECT_LEDGER : 0;
    int as_sent = 0;
    if (ops->output && ops->output(conf, &as_sent) && as_sent)
        flags |= IDEM_EXPECT_OUTPUT;
    return idem_expect_new(*rules, flags);
}

int idem_cmd_produce(int argc, char **argv, char **envp)
{
    produce_args_t a;
    char errstr[512];
    int rc = args_parse(argc, argv, &a);
    if (rc == 0 && args_resolve(&a, envp))
        rc = -1;
    if (rc) {
        args_free(&a);
        return rc > 0 ? IDEM_EXIT_OK : IDEM_EXIT_USAGE;
    }
    idem_log_setup((idem_log_level_t)a.conf->log_level,
                   (idem_log_format_t)a.conf->log_format);
    idem_gen_t *gen = NULL;
    FILE *in = NULL;
    if (!a.input_path) {
        gen = idem_gen_new(&a.gen, errstr, sizeof(errstr));
        if (!gen) {
            fprintf(stderr, "idemproc produce: %s\n", errstr);
            args_free(&a);
            return IDEM_EXIT_USAGE;
        }
    } else if (!strcmp(a.input_path, "-")) {
        in = stdin;
    } else if (!(in = fopen(a.input_path, "r"))) {
        fprintf(stderr, "idemproc produce: --input: cannot open \"%s\": %m\n",
                a.input_path);
        args_free(&a);
        return IDEM_EXIT_USAGE;
    }
    size_t max_value = gen ? (size_t)a.gen.too_large_bytes : 1000000;
    size_t prop_cnt;
    char tprop[64];
    char **props = producer_props(&a, tprop, sizeof(tprop), &prop_cnt);
    idem_producer_t *p =
        idem_producer_new(a.bootstrap, a.topic, props, prop_cnt, max_value,
                          a.verbose ? stderr : NULL, errstr, sizeof(errstr));
    free(props);
    if (!p) {
        fprintf(stderr, "idemproc produce: %s\n", errstr);
        goto usage_fail;
    }
    /* Nothing reachable: one line after --timeout, instead of a failure per
     * message after message.timeout.ms. */
    if (idem_producer_wait_broker(p, (int)(a.timeout_s * 1000), errstr,
                                  sizeof(errstr))) {
        fprintf(stderr,
                "idemproc produce: no Kafka broker reachable at %s within "
                "%" PRId64 " s (--timeout): %s; nothing sent\n",
                a.bootstrap, a.timeout_s, errstr);
        idem_producer_destroy(p);
        idem_gen_destroy(gen);
        if (in && in != stdin)
            fclose(in);
        args_free(&a);
        return IDEM_EXIT_FAIL;
    }

    if (a.rate > 0) /* pacing_print reports it */
        idem_producer_ack_latency_on(p);

    idem_signals_opts_t so = {.second_exits = 0};
    idem_signals_setup(&so);

    idem_envelope_rules_t *rules = NULL;
    idem_expect_t *expect = NULL;
    if (in && a.expect_path &&
        !(expect = expect_new(a.conf, &rules, errstr, sizeof(errstr)))) {
        fprintf(stderr, "idemproc produce: --expect: %s\n", errstr);
        idem_producer_destroy(p);
        goto usage_fail;
    }
    progress_t pg = {.on = isatty(2), .start_ms = idem_now_ms()};
    counts_t cnt = {0};
    int64_t start_us = idem_now_us();
    int input_failed = 0;
    idem_inputfile_t lines;
    if (gen) {
        produce_generated(&a, gen, p, &pg, &cnt);
    } else {
        idem_inputfile_open(&lines, in);
        input_failed = produce_input(&a, &lines, p, expect, &pg, &cnt, errstr,
                                     sizeof(errstr));
    }
    /* Mapped lines are read in place until every message is delivered. */
    idem_producer_flush(p, idem_signals_abort_flag());
    if (!gen)
        idem_inputfile_close(&lines);
    progress_show(&pg, cnt.sent, gen ? idem_gen_total(gen) : 0, 1);
    progress_end(&pg);
    double secs = (double)(idem_now_us() - start_us) / 1e6;

    idem_producer_stats_t st;
    idem_producer_stats(p, &st);
    summary_print(gen, &cnt, &st, secs);
    if (a.rate > 0)
        pacing_print(&a, &cnt, p);

    rc = IDEM_EXIT_OK;
    if (input_failed) {
        fprintf(stderr, "idemproc produce: %s\n", errstr);
        rc = IDEM_EXIT_FAIL;
    }
    if (cnt.refused) {
        fprintf(stderr,
                "idemproc produce: %" PRId64
                " lines not sent: --key-field %s found nothing in them\n",
                cnt.refused, a.key_field);
        rc = IDEM_EXIT_FAIL;
    }
    if (a.expect_path) {
        json_t *doc = gen ? idem_gen_expect(gen) : idem_expect_json(expect);
        if (idem_expect_write(doc, a.expect_path, errstr, sizeof(errstr))) {
            fprintf(stderr, "idemproc produce: %s\n", errstr);
            rc = IDEM_EXIT_FAIL;
        }
        json_decref(doc);
    }
    if (st.failed || st.acked != cnt.sent) {
        int64_t failed = cnt.sent - st.acked;
        fprintf(stderr,
                "idemproc produce: %" PRId64 " of %" PRId64
                " messages failed: %s\n",
                failed, cnt.sent,
                st.first_error[0] ? st.first_error : "not acknowledged");
        rc = IDEM_EXIT_FAIL;
    }
    idem_expect_destroy(expect);
    idem_envelope_rules_destroy(rules);
    idem_producer_destroy(p);
    idem_gen_destroy(gen);
    if (in && in != stdin)
        fclose(in);
    args_free(&a);
    return rc;
usage_fail:
    idem_gen_destroy(gen);
    if (in && in != stdin)
        fclose(in);
    args_free(&a);
    return IDEM_EXIT_USAGE;
}
