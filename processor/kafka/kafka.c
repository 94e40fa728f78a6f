/* kafka: what the processor's librdkafka clients share: setting
 * properties with our error text, creating a client, the settings of its
 * idempotent writers (DLQ, forward output), the kafka.* properties it
 * manages, their fatal errors, and check-config's reachability check. */
#include "kafka/kafka.h"
#include "kafka/retrytopic.h"
#include "base/log.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int idem_kafka_set(rd_kafka_conf_t *kc, const char *name, const char *value,
                   char *errstr, size_t errstr_size)
{
    char kerr[512];
    if (rd_kafka_conf_set(kc, name, value, kerr, sizeof(kerr)) ==
        RD_KAFKA_CONF_OK)
        return 0;
    snprintf(errstr, errstr_size, "kafka.%s: %s", name, kerr);
    return -1;
}

/* The librdkafka properties idemproc sets after the user's kafka.* ones
 * (consumer_new in pipeline.c, idem_kafka_writer_conf below): a kafka.*
 * value for them would be shown by check-config and then silently
 * replaced, so idem_conf_set refuses them. Aliases librdkafka accepts for
 * the same property are listed too. */
static const struct {
    const char *name;
    const char *instead; /* what to do instead, for the error */
} kafka_managed[] = {
    {"group.id", "use group.id"},
    {"enable.auto.commit",
     "idemproc commits finished offsets itself (commit.interval.ms)"},
    {"auto.commit.enable",
     "idemproc commits finished offsets itself (commit.interval.ms)"},
    {"enable.auto.offset.store",
     "idemproc stores an offset only when its record is finished"},
    {"enable.partition.eof", "the processor's loop relies on it being false"},
    {"log.queue", "use log.level and log.format"},
    {"enable.idempotence",
     "always true for the DLQ and output writers (no duplicates from "
     "retries)"},
    {"acks", "always all for the DLQ and output writers"},
    {"request.required.acks", "always all for the DLQ and output writers"},
    {"linger.ms", "the DLQ and output writers always use 5"},
    {"queue.buffering.max.ms", "the DLQ and output writers always use 5"},
    {"message.timeout.ms",
     "the DLQ and output writers always use 15000 (a longer outage pauses "
     "input and retries)"},
    {"delivery.timeout.ms",
     "the DLQ and output writers always use 15000 (a longer outage pauses "
     "input and retries)"},
    {"metadata.broker.list", "use kafka.bootstrap.servers"},
};

const char *idem_kafka_managed(const char *name)
{
    for (size_t i = 0; i < sizeof(kafka_managed) / sizeof(kafka_managed[0]);
         i++)
        if (!strcmp(kafka_managed[i].name, name))
            return kafka_managed[i].instead;
    return NULL;
}

int idem_kafka_user_set(const idem_conf_t *conf, const char *name)
{
    for (size_t i = 0; i < conf->kafka_cnt; i++)
        if (!strcmp(conf->kafka[i].name, name))
            return 1;
    return 0;
}

rd_kafka_conf_t *idem_kafka_writer_conf(const idem_conf_t *conf,
                                        int64_t max_bytes, char *errstr,
                                        size_t errstr_size)
{
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    char limit[32];
    snprintf(limit, sizeof(limit), "%" PRId64, max_bytes);
    if (idem_kafka_set(kc, "message.max.bytes", limit, errstr, errstr_size) ||
        idem_conf_apply_kafka(conf, kc, errstr, errstr_size) ||
        idem_kafka_set(kc, "enable.idempotence", "true", errstr, errstr_size) ||
        idem_kafka_set(kc, "acks", "all", errstr, errstr_size) ||
        idem_kafka_set(kc, "linger.ms", "5", errstr, errstr_size) ||
        idem_kafka_set(kc, "message.timeout.ms", "15000", errstr,
                       errstr_size)) {
        rd_kafka_conf_destroy(kc);
        return NULL;
    }
    rd_kafka_conf_set_log_cb(kc, idem_log_rdkafka);
    return kc;
}

rd_kafka_t *idem_kafka_new(rd_kafka_type_t type, rd_kafka_conf_t *kc,
                           const char *who, char *errstr, size_t errstr_size)
{
    char kerr[512];
    rd_kafka_t *rk = rd_kafka_new(type, kc, kerr, sizeof(kerr));
    if (!rk) {
        rd_kafka_conf_destroy(kc);
        snprintf(errstr, errstr_size, "%s: %s", who, kerr);
    }
    return rk;
}

int idem_kafka_fatal(rd_kafka_t *rk, const char *who, char *buf, size_t size)
{
    char why[400];
    if (rd_kafka_fatal_error(rk, why, sizeof(why)) ==
        RD_KAFKA_RESP_ERR_NO_ERROR)
        return 0;
    snprintf(buf, size, "%s: %s", who, why);
    return 1;
}

/* Prints the partition count of `topic` in md, or that it is missing.
 * Returns 1 when it exists, else 0. */
static int check_topic(const rd_kafka_metadata_t *md, const char *role,
                       const char *topic, FILE *out)
{
    for (int i = 0; i < md->topic_cnt; i++) {
        if (strcmp(md->topics[i].topic, topic) || md->topics[i].err)
            continue;
        fprintf(out, "check-config: kafka: %s topic %s: %d partition%s\n", role,
                topic, md->topics[i].partition_cnt,
                md->topics[i].partition_cnt == 1 ? "" : "s");
        return 1;
    }
    fprintf(out,
            "check-config: kafka: %s topic %s: not found (created on first "
            "use only where the cluster auto-creates topics)\n",
            role, topic);
    return 0;
}

int idem_kafka_check(const idem_conf_t *conf, int timeout_ms, FILE *out,
                     char *errstr, size_t errstr_size)
{
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    if (idem_conf_apply_kafka(conf, kc, errstr, errstr_size) ||
        idem_kafka_set(kc, "log_level", "0", errstr, errstr_size)) {
        rd_kafka_conf_destroy(kc);
        return -1;
    }
    rd_kafka_t *rk = idem_kafka_new(RD_KAFKA_PRODUCER, kc, "kafka check",
                                    errstr, errstr_size);
    if (!rk)
        return -1;
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, NULL, &md, timeout_ms);
    if (err) {
        snprintf(errstr, errstr_size,
                 "no Kafka broker reachable at %s within %d ms "
                 "(kafka.bootstrap.servers; --timeout-ms): %s",
                 conf->bootstrap_servers, timeout_ms, rd_kafka_err2str(err));
        rd_kafka_destroy(rk);
        return -1;
    }
    fprintf(out, "check-config: kafka: %d broker%s reachable at %s\n",
            md->broker_cnt, md->broker_cnt == 1 ? "" : "s",
            conf->bootstrap_servers);
    /* A member subscribed to a missing topic consumes nothing and says
     * nothing: that one is an error. A topic it writes may be created on
     * first use. */
    const char *missing = NULL;
    for (size_t i = 0; i < conf->input_topic_cnt; i++)
        if (conf->input_topic[i][0] != '^' &&
            !check_topic(md, "input", conf->input_topic[i], out) && !missing)
            missing = conf->input_topic[i];
    /* The topics this configuration writes (dlq.topic, a handler's
     * output; the relay's outbox.topic), named by their key. */
    const char *key, *topic;
    for (size_t i = 0; (topic = idem_conf_topic_written(conf, i, &key)); i++) {
        char role[64];
        snprintf(role, sizeof(role), "%.*s", (int)(strlen(key) - 6), key);
        check_topic(md, role, topic, out);
    }
    if (conf->retry_tiers) {
        idem_retrytopics_t *rt = idem_retrytopics_new(
            conf->input_topics, conf->retry_delays_ms, conf->retry_tiers);
        for (size_t i = 0; i < idem_retrytopics_count(rt); i++)
            check_topic(md, "retry", idem_retrytopics_at(rt, i), out);
        if (!missing &&
            idem_retrytopics_check_md(rt, md, errstr, errstr_size)) {
            idem_retrytopics_destroy(rt);
            rd_kafka_metadata_destroy(md);
            rd_kafka_destroy(rk);
            return -1;
        }
        idem_retrytopics_destroy(rt);
    }
    rd_kafka_metadata_destroy(md);
    rd_kafka_destroy(rk);
    if (missing) {
        snprintf(errstr, errstr_size,
                 "input topic \"%s\" does not exist at %s (create it, or "
                 "fix input.topics)",
                 missing, conf->bootstrap_servers);
        return -1;
    }
    return 0;
}

int idem_kafka_partition_count(rd_kafka_t *rk, const char *topic,
                               int timeout_ms, char *errstr, size_t errstr_size)
{
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, NULL, &md, timeout_ms);
    if (err) {
        snprintf(errstr, errstr_size, "topic %s: metadata: %s", topic,
                 rd_kafka_err2str(err));
        return -1;
    }
    int n = 0;
    for (int i = 0; i < md->topic_cnt; i++)
        if (!md->topics[i].err && !strcmp(md->topics[i].topic, topic))
            n = md->topics[i].partition_cnt;
    rd_kafka_metadata_destroy(md);
    return n;
}
