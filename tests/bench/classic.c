/* classic: the reference row of `make bench`: the classic per-message
 * exactly-once attempt, written the way most services write it. For every
 * record: parse the JSON value, `SET <prefix>dedup:<identity> <message_id>
 * NX EX <ttl>`, and when that set the key, `HINCRBY <prefix>ledger:<CUR>
 * <user_id> <cents>`; then commit the record's offset synchronously. One
 * consumer-group member (librdkafka), one hiredis connection, one request
 * at a time. Not part of the product: it only measures what the design
 * idemproc replaces can do on the same broker, Redis and machine.
 *
 * Poison records (not JSON, no identity, bad fields) are counted and
 * committed without a dead-letter write, which flatters this design a
 * little (1% of the bench's records).
 *
 * Runs until --seconds after its first record, --max records, or 2 s
 * without a record (topic drained), then prints one line:
 *   classic: records N new N duplicates N poison N seconds S rate R
 * (rate = records / seconds from the first record to the last one handled).
 * Exit 0, or 1 with a one-line error. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>

static volatile sig_atomic_t stop_flag = 0;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: classic -b BOOTSTRAP -t TOPIC -g GROUP -r HOST:PORT "
            "[options]\n"
            "  --prefix P     Redis key prefix (default classic:)\n"
            "  --ttl S        dedup mark TTL in seconds (default 86400)\n"
            "  --seconds S    stop S seconds after the first record "
            "(default 5)\n"
            "  --max N        stop after N records (default: no limit)\n"
            "  -X PROP=VALUE  librdkafka consumer property (repeatable)\n");
}

/* A string member of obj, or NULL. Borrowed from obj. */
static const char *member_str(json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    return json_is_string(v) && json_string_length(v) ? json_string_value(v)
                                                      : NULL;
}

/* A header's value as a NUL-terminated copy in buf, or NULL. */
static const char *header_str(rd_kafka_message_t *msg, const char *name,
                              char *buf, size_t size)
{
    rd_kafka_headers_t *h = NULL;
    const void *v = NULL;
    size_t len = 0;
    if (rd_kafka_message_headers(msg, &h) ||
        rd_kafka_header_get_last(h, name, &v, &len) || !v || !len ||
        len >= size)
        return NULL;
    memcpy(buf, v, len);
    buf[len] = '\0';
    return buf;
}

typedef struct {
    redisContext *redis;
    const char *prefix;
    long long ttl;
    uint64_t fresh, dups, poison;
} classic_t;

/* One record: 0 (handled; counts updated), or -1 with errstr (Redis
 * failed: the run is over). */
static int handle(classic_t *c, rd_kafka_message_t *msg, char *errstr,
                  size_t errstr_size)
{
    json_error_t jerr;
    json_t *v =
        msg->payload ? json_loadb(msg->payload, msg->len, 0, &jerr) : NULL;
    char idbuf[512], midbuf[512];
    const char *identity = NULL, *mid = NULL, *user = NULL, *cur = NULL;
    json_t *amount = NULL;
    if (json_is_object(v)) {
        identity = member_str(v, "idempotency_key");
        mid = member_str(v, "message_id");
        user = member_str(v, "user_id");
        cur = member_str(v, "currency");
        amount = json_object_get(v, "amount");
    }
    if (!identity)
        identity = header_str(msg, "idempotency_key", idbuf, sizeof(idbuf));
    if (!mid)
        mid = header_str(msg, "message_id", midbuf, sizeof(midbuf));
    if (!identity)
        identity = mid;
    if (!identity || !user || !cur || strlen(cur) != 3 ||
        !json_is_number(amount) || json_number_value(amount) <= 0) {
        c->poison++;
        json_decref(v);
        return 0;
    }
    long long cents = llround(json_number_value(amount) * 100);
    redisReply *r = redisCommand(c->redis, "SET %sdedup:%s %s NX EX %lld",
                                 c->prefix, identity, mid ? mid : "", c->ttl);
    if (!r) {
        snprintf(errstr, errstr_size, "redis: SET: %s", c->redis->errstr);
        json_decref(v);
        return -1;
    }
    int fresh = r->type == REDIS_REPLY_STATUS;
    int failed = r->type == REDIS_REPLY_ERROR;
    if (failed)
        snprintf(errstr, errstr_size, "redis: SET: %s", r->str);
    freeReplyObject(r);
    if (failed) {
        json_decref(v);
        return -1;
    }
    if (fresh) {
        r = redisCommand(c->redis, "HINCRBY %sledger:%s %s %lld", c->prefix,
                         cur, user, cents);
        failed = !r || r->type == REDIS_REPLY_ERROR;
        if (failed)
            snprintf(errstr, errstr_size, "redis: HINCRBY: %s",
                     r ? r->str : c->redis->errstr);
        freeReplyObject(r);
        c->fresh++;
    } else {
        c->dups++;
    }
    json_decref(v);
    return failed ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *boot = NULL, *topic = NULL, *group = NULL, *raddr = NULL;
    classic_t c = {.prefix = "classic:", .ttl = 86400};
    double seconds = 5;
    uint64_t max = 0;
    char errstr[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    enum { OPT_PREFIX = 256, OPT_TTL, OPT_SECONDS, OPT_MAX };
    static const struct option opts[] = {
        {"prefix", required_argument, 0, OPT_PREFIX},
        {"ttl", required_argument, 0, OPT_TTL},
        {"seconds", required_argument, 0, OPT_SECONDS},
        {"max", required_argument, 0, OPT_MAX},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "b:t:g:r:X:h", opts, NULL)) != -1) {
        switch (o) {
        case 'b':
            boot = optarg;
            break;
        case 't':
            topic = optarg;
            break;
        case 'g':
            group = optarg;
            break;
        case 'r':
            raddr = optarg;
            break;
        case 'X': {
            char *eq = strchr(optarg, '=');
            if (!eq) {
                fprintf(stderr, "classic: -X %s: expected PROP=VALUE\n",
                        optarg);
                return 2;
            }
            *eq = '\0';
            if (rd_kafka_conf_set(kc, optarg, eq + 1, errstr, sizeof(errstr)) !=
                RD_KAFKA_CONF_OK) {
                fprintf(stderr, "classic: -X %s: %s\n", optarg, errstr);
                return 2;
            }
            break;
        }
        case OPT_PREFIX:
            c.prefix = optarg;
            break;
        case OPT_TTL:
            c.ttl = atoll(optarg);
            break;
        case OPT_SECONDS:
            seconds = atof(optarg);
            break;
        case OPT_MAX:
            max = strtoull(optarg, NULL, 10);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!boot || !topic || !group || !raddr || c.ttl <= 0 || seconds <= 0) {
        usage(stderr);
        return 2;
    }
    char host[256];
    const char *colon = strrchr(raddr, ':');
    if (!colon || (size_t)(colon - raddr) >= sizeof(host)) {
        fprintf(stderr, "classic: -r %s: expected HOST:PORT\n", raddr);
        return 2;
    }
    memcpy(host, raddr, (size_t)(colon - raddr));
    host[colon - raddr] = '\0';
    c.redis = redisConnect(host, atoi(colon + 1));
    if (!c.redis || c.redis->err) {
        fprintf(stderr, "classic: redis %s: %s\n", raddr,
                c.redis ? c.redis->errstr : "out of memory");
        return 1;
    }

    const char *props[][2] = {{"bootstrap.servers", boot},
                              {"group.id", group},
                              {"enable.auto.commit", "false"},
                              {"auto.offset.reset", "earliest"}};
    for (size_t i = 0; i < sizeof(props) / sizeof(props[0]); i++)
        if (rd_kafka_conf_set(kc, props[i][0], props[i][1], errstr,
                              sizeof(errstr)) != RD_KAFKA_CONF_OK) {
            fprintf(stderr, "classic: %s: %s\n", props[i][0], errstr);
            return 2;
        }
    rd_kafka_t *rk =
        rd_kafka_new(RD_KAFKA_CONSUMER, kc, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "classic: %s\n", errstr);
        return 1;
    }
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(rk, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (err) {
        fprintf(stderr, "classic: subscribe %s: %s\n", topic,
                rd_kafka_err2str(err));
        return 1;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    int rc = 0;
    uint64_t records = 0;
    int64_t first = 0, last = 0, start = now_us();
    while (!stop_flag) {
        int64_t t = now_us();
        if (first &&
            (t - first >= (int64_t)(seconds * 1e6) || t - last >= 2000000))
            break;
        if (!first && t - start >= 60000000) {
            fprintf(stderr, "classic: no record within 60 s\n");
            rc = 1;
            break;
        }
        if (max && records >= max)
            break;
        rd_kafka_message_t *msg = rd_kafka_consumer_poll(rk, 100);
        if (!msg)
            continue;
        if (msg->err) {
            if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                fprintf(stderr, "classic: consume: %s\n",
                        rd_kafka_message_errstr(msg));
            rd_kafka_message_destroy(msg);
            continue;
        }
        if (!first)
            first = now_us();
        if (handle(&c, msg, errstr, sizeof(errstr))) {
            fprintf(stderr, "classic: %s\n", errstr);
            rd_kafka_message_destroy(msg);
            rc = 1;
            break;
        }
        err = rd_kafka_commit_message(rk, msg, 0 /* synchronous */);
        rd_kafka_message_destroy(msg);
        if (err) {
            fprintf(stderr, "classic: commit: %s\n", rd_kafka_err2str(err));
            rc = 1;
            break;
        }
        records++;
        last = now_us();
    }
    double secs = first && last > first ? (double)(last - first) / 1e6 : 0;
    printf("classic: records %" PRIu64 " new %" PRIu64 " duplicates %" PRIu64
           " poison %" PRIu64 " seconds %.3f rate %.0f\n",
           records, c.fresh, c.dups, c.poison, secs,
           secs > 0 ? (double)records / secs : 0);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    redisFree(c.redis);
    return rc;
}
