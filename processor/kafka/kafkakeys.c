/* kafkakeys: the configuration keys of the topics a member reads and
 * writes (brokers, group, input, DLQ, retry topics, kafka.* pass-through)
 * and their checks: the kafka folder's part of the configuration
 * (conf.h). */
#include "kafka/kafka.h"
#include "kafka/retrytopic.h"
#include "base/util.h"

#include <ctype.h>
#include <inttypes.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Stores kafka.<prop>. Refuses a property idemproc sets itself, and lets
 * librdkafka judge the value now, so that the error carries the file and
 * line (or variable) it came from; cross-property checks happen later in
 * rd_kafka_new. */
static int kafka_set(idem_conf_t *conf, const char *key, const char *value,
                     char *errstr, size_t errstr_size)
{
    const char *prop = key + 6; /* after "kafka." */
    const char *instead = idem_kafka_managed(prop);
    /* The outbox relay owns its producer: how long it lingers and how long
     * it waits for an acknowledgement are the user's (an undelivered row
     * is simply published again). */
    if (instead && conf->scope == IDEM_CONF_SCOPE_OUTBOX &&
        (!strcmp(prop, "linger.ms") || !strcmp(prop, "message.timeout.ms")))
        instead = NULL;
    if (instead) {
        snprintf(errstr, errstr_size,
                 "kafka.%s: set by idemproc itself, not configurable (%s)",
                 prop, instead);
        return -1;
    }
    char ms[24];
    if (idem_conf_kafka_duration(prop, value, ms, sizeof(ms), &value, errstr,
                                 errstr_size))
        return -1;
    rd_kafka_conf_t *scratch = rd_kafka_conf_new();
    char kerr[512];
    rd_kafka_conf_res_t res =
        rd_kafka_conf_set(scratch, prop, value, kerr, sizeof(kerr));
    rd_kafka_conf_destroy(scratch);
    if (res != RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "kafka.%s: %s", prop, kerr);
        return -1;
    }
    idem_conf_kafka_store(conf, prop, value);
    return 0;
}

#define REGEX_SIZE_MAX 1000 /* copies of a subexpression a regex may make */

/* An upper bound of how many copies of a subexpression compiling `re`
 * makes: glibc's regcomp copies the operand of '+' once and of {m,n} n
 * times, and nested or stacked repetitions multiply (`^a+++...` with 40
 * '+' asks for 2^40 copies: gigabytes and minutes). The product of every
 * repetition's factor bounds it whatever the nesting. */
static double regex_size_bound(const char *re)
{
    double bound = 1;
    for (const char *p = re; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
        } else if (*p == '[') { /* a bracket expression: no operators */
            const char *q = p + 1;
            if (*q == '^')
                q++;
            if (*q == ']')
                q++;
            while (*q && *q != ']')
                q++;
            if (!*q)
                break;
            p = q;
        } else if (*p == '+') {
            bound *= 2;
        } else if (*p == '{') {
            char *end;
            double m = strtod(p + 1, &end), n = m;
            if (*end == ',')
                n = end[1] == '}' ? m + 1 : strtod(end + 1, &end);
            double f = (n > m ? n : m) + 1;
            bound *= f >= 1 ? f : 1; /* (not a count: regcomp refuses it) */
        }
        if (bound > 1e12)
            return bound;
    }
    return bound;
}

/* Whether input entry `entry` (a name, or "^regex" as librdkafka takes
 * it) would consume `topic`. Returns 1, 0, or -1 with errstr for a regex
 * that does not compile. POSIX extended syntax is close enough to
 * librdkafka's for this safety check. */
static int topic_matches(const char *entry, const char *topic, char *errstr,
                         size_t errstr_size)
{
    if (*entry != '^')
        return !strcmp(entry, topic);
    if (regex_size_bound(entry) > REGEX_SIZE_MAX) {
        snprintf(errstr, errstr_size,
                 "input.topics: regex \"%s\" repeats too much (nested or "
                 "stacked +, {m,n}: at most %d copies in all)",
                 entry, REGEX_SIZE_MAX);
        return -1;
    }
    regex_t re;
    int rc = regcomp(&re, entry, REG_EXTENDED | REG_NOSUB);
    if (rc) {
        char msg[128];
        regerror(rc, &re, msg, sizeof(msg));
        snprintf(errstr, errstr_size, "input.topics: bad regex \"%s\": %s",
                 entry, msg);
        return -1;
    }
    int hit = regexec(&re, topic, 0, NULL, 0) == 0;
    regfree(&re);
    return hit;
}

/* Whether `name` is one of the comma-listed topics of `list`. */
static int topic_listed(const char *list, const char *name)
{
    size_t nl = strlen(name);
    for (const char *t = list; *t;) {
        while (*t == ' ' || *t == ',')
            t++;
        const char *e = t;
        while (*e && *e != ',')
            e++;
        const char *te = e;
        while (te > t && te[-1] == ' ')
            te--;
        if ((size_t)(te - t) == nl && !memcmp(t, name, nl))
            return 1;
        t = e;
    }
    return 0;
}

/* retry.topics: the delays, and topic names that cannot clash with the
 * input, DLQ or output topics (a record would be consumed twice, or a
 * dead letter retried). */

/* group.id goes into Redis key names: a ':' would make two groups' dedup
 * keys collide. */
static int group_id_check(const idem_conf_key_t *key, const char *value,
                          char *errstr, size_t errstr_size)
{
    (void)key;
    if (!strchr(value, ':'))
        return 0;
    snprintf(errstr, errstr_size,
             "group.id: \"%s\" may not contain ':' (it is part of the Redis "
             "dedup keys)",
             value);
    return -1;
}

static int retry_topics_check(const idem_conf_key_t *key, const char *value,
                              char *errstr, size_t errstr_size)
{
    (void)key;
    int64_t delays[IDEM_RETRY_TIERS_MAX];
    size_t n;
    return idem_retrytopic_parse(value, delays, &n, errstr, errstr_size);
}

/* clang-format off */
static const idem_conf_key_t kafka_keys[] = {
    IDEM_CONF_STR("kafka.bootstrap.servers", bootstrap_servers, NULL, IDEM_KEY_REQUIRED | IDEM_KEY_OUTBOX, NULL,
        "Kafka brokers, host:port[,host:port...]"),
    IDEM_CONF_STR("group.id", group_id, NULL, IDEM_KEY_REQUIRED, group_id_check,
        "consumer group; also scopes the dedup marks in Redis"),
    IDEM_CONF_STR("input.topics", input_topics, NULL, IDEM_KEY_REQUIRED, NULL,
        "comma list of topics to consume; a ^ prefix makes one a regex"),
    IDEM_CONF_STR("dlq.topic", dlq_topic, NULL, IDEM_KEY_REQUIRED | IDEM_KEY_WRITES_TOPIC, NULL,
        "dead-letter topic for poison records"),
    IDEM_CONF_ENUM("dlq.headers.format", dlq_headers_format, "idemproc", 0,
        "headers of a dead letter: idemproc (dlq.*), spring (the kafka_dlt-* of Spring for Apache Kafka), or both",
        "idemproc", "spring", "both"),
    IDEM_CONF_INT("dlq.replay.max", dlq_replay_max, "3", 0, 1000000, 0, NULL,
        "dlq replay refuses a dead letter already replayed this many times"),
    IDEM_CONF_STR("retry.topics", retry_topics, NULL, 0, retry_topics_check,
        "non-blocking retries: comma list of ascending delays (200ms, 5s, 1m, 2h); a record failing retriably goes to INPUT.retry.DELAY, tier by tier, then to the DLQ as max-retries; unset: retry in place (blocking, retry.max.attempts)"),
    IDEM_CONF_STR("member.id", member_id, NULL, IDEM_KEY_OUTBOX, NULL,
        "this member's name: client.id, lease owner, logs (default hostname-pid)"),
    {.name = NULL},
};
/* clang-format on */

/* 0 when name is a topic name Kafka takes (1 to 249 of [a-zA-Z0-9._-],
 * not "." or ".."), else -1 with errstr naming key: a broker refuses any
 * other, and a member subscribed to one would consume nothing. */
static int topic_name_check(const char *key, const char *name, char *errstr,
                            size_t errstr_size)
{
    size_t len = strlen(name);
    int ok = len >= 1 && len <= 249 && strcmp(name, ".") && strcmp(name, "..");
    for (const char *c = name; ok && *c; c++)
        ok = isalnum((unsigned char)*c) || *c == '.' || *c == '_' || *c == '-';
    if (ok)
        return 0;
    snprintf(errstr, errstr_size,
             "%s: \"%.*s\" is not a valid Kafka topic name (1 to 249 of "
             "a-z A-Z 0-9 . _ -)",
             key, len > 260 ? 260 : (int)len, name);
    return -1;
}

/* input.topics, parsed once into conf->input_topic[]: trimmed, none
 * empty, each a valid name (a regex excepted), none that is (or whose regex
 * matches) a topic the member writes (a dead letter or an output would be
 * consumed again as input). */
static int input_topics_parse(idem_conf_t *conf, char *errstr,
                              size_t errstr_size)
{
    size_t cap = 1;
    for (const char *c = conf->input_topics; *c; c++)
        cap += *c == ',';
    char **v = idem_conf_alloc(conf, (cap + 1) * sizeof(*v));
    size_t n = 0;
    for (const char *t = conf->input_topics;;) {
        const char *e = strchr(t, ',');
        size_t len = e ? (size_t)(e - t) : strlen(t);
        const char *a = t, *b = t + len;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (a == b) {
            snprintf(errstr, errstr_size,
                     "input.topics: empty topic name in \"%s\"",
                     conf->input_topics);
            return -1;
        }
        char *name = idem_conf_alloc(conf, (size_t)(b - a) + 1);
        memcpy(name, a, (size_t)(b - a));
        if (*name != '^' &&
            topic_name_check("input.topics", name, errstr, errstr_size))
            return -1;
        v[n++] = name;
        if (!e)
            break;
        t = e + 1;
    }
    conf->input_topic = v;
    conf->input_topic_cnt = n;
    const char *wkey, *written;
    for (size_t w = 0; (written = idem_conf_topic_written(conf, w, &wkey)); w++)
        if (topic_name_check(wkey ? wkey : "topic", written, errstr,
                             errstr_size))
            return -1;
    for (size_t i = 0; i < n; i++) {
        const char *t = v[i], *key, *out;
        for (size_t w = 0; (out = idem_conf_topic_written(conf, w, &key));
             w++) {
            int hit = topic_matches(t, out, errstr, errstr_size);
            if (hit < 0)
                return -1;
            if (hit) {
                size_t role = strlen(key) - strlen(".topic");
                snprintf(errstr, errstr_size,
                         "input.topics: \"%s\" %s the %.*s topic \"%s\"", t,
                         *t == '^' ? "matches" : "is also", (int)role, key,
                         out);
                return -1;
            }
        }
    }
    return 0;
}

/* retry.topics: the delays, and topic names that cannot clash with the
 * input or a topic the member writes (a record would be consumed twice,
 * or a dead letter retried). */
static int retry_topics_finalize(idem_conf_t *conf, char *errstr,
                                 size_t errstr_size)
{
    conf->retry_delays_ms = idem_conf_alloc(
        conf, IDEM_RETRY_TIERS_MAX * sizeof(*conf->retry_delays_ms));
    if (idem_retrytopic_parse(conf->retry_topics, conf->retry_delays_ms,
                              &conf->retry_tiers, errstr, errstr_size))
        return -1;
    if (!conf->retry_tiers)
        return 0;
    if (strchr(conf->input_topics, '^')) {
        snprintf(errstr, errstr_size,
                 "retry.topics: not possible with a regex in input.topics "
                 "(\"%s\"): retry topics are named after each input topic",
                 conf->input_topics);
        return -1;
    }
    idem_retrytopics_t *rt = idem_retrytopics_new(
        conf->input_topics, conf->retry_delays_ms, conf->retry_tiers);
    int r = 0;
    for (size_t i = 0; !r && i < idem_retrytopics_count(rt); i++) {
        const char *name = idem_retrytopics_at(rt, i);
        char clash[128] = "";
        const char *key, *out;
        if (strlen(name) > 249)
            snprintf(clash, sizeof(clash),
                     "longer than the 249 characters Kafka allows:");
        for (size_t w = 0;
             !*clash && (out = idem_conf_topic_written(conf, w, &key)); w++)
            if (!strcmp(name, out))
                snprintf(clash, sizeof(clash), "the %s", key);
        if (!*clash && topic_listed(conf->input_topics, name))
            snprintf(clash, sizeof(clash), "also in input.topics");
        if (*clash) {
            snprintf(errstr, errstr_size,
                     "retry.topics: the retry topic \"%s\" is %s", name, clash);
            r = -1;
        }
    }
    idem_retrytopics_destroy(rt);
    return r;
}

static int kafka_conf_check(const idem_conf_module_t *m, idem_conf_t *conf,
                            char *errstr, size_t errstr_size)
{
    (void)m;
    if (conf->scope == IDEM_CONF_SCOPE_PROCESSOR &&
        (input_topics_parse(conf, errstr, errstr_size) ||
         retry_topics_finalize(conf, errstr, errstr_size)))
        return -1;
    if (!conf->member_id || !*conf->member_id) {
        char host[128] = "idemproc";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        char id[192];
        snprintf(id, sizeof(id), "%s-%ld", host, (long)getpid());
        free(conf->member_id);
        conf->member_id = idem_xstrdup(id);
    }
    /* Let librdkafka judge every pass-through property now, so a typo is a
     * configuration error (exit 2) and not a runtime failure. */
    rd_kafka_conf_t *kconf = rd_kafka_conf_new();
    int r = idem_conf_apply_kafka(conf, kconf, errstr, errstr_size);
    rd_kafka_conf_destroy(kconf);
    return r;
}

const idem_conf_module_t idem_kafka_conf = {
    .name = "kafka",
    .doc = "the brokers, the group, the topics read and written",
    .keys = kafka_keys,
    .flags = IDEM_KEY_OUTBOX,
    .key_prefix = "kafka.",
    .prefix_doc = "passed to librdkafka unchanged (see its CONFIGURATION.md), "
                  "except the ones idemproc sets itself (an error says what "
                  "to use instead)",
    .prefix_set = kafka_set,
    .check = kafka_conf_check,
};
