/* watermark: notices records a broker dropped from the start of a
 * partition (retention, or the embedded broker's size limit) by watching
 * each partition's low watermark through a client of its own. */
#include "dev/watermark.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

struct idem_watermark_s {
    rd_kafka_t *rk;
    json_t *low; /* "topic\tpartition" -> last low watermark seen */
};

/* Log callback: the watcher stays silent (a broker being stopped is not
 * news to whoever stops it). Fires on librdkafka's threads. */
static void watermark_log_cb(const rd_kafka_t *rk, int level,
                             const char *facility, const char *buf)
{
    (void)rk;
    (void)level;
    (void)facility;
    (void)buf;
}

idem_watermark_t *idem_watermark_new(const char *bootstrap, char *errstr,
                                     size_t errstr_size)
{
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    char kerr[512];
    rd_kafka_conf_set_log_cb(kc, watermark_log_cb);
    if (rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, kerr,
                          sizeof(kerr)) != RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(kc, "client.id", "idemproc-watermark", kerr,
                          sizeof(kerr)) != RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "watermark: %s", kerr);
        rd_kafka_conf_destroy(kc);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, kerr, sizeof(kerr));
    if (!rk) {
        snprintf(errstr, errstr_size, "watermark: %s", kerr);
        rd_kafka_conf_destroy(kc);
        return NULL;
    }
    idem_watermark_t *w = idem_xcalloc(1, sizeof(*w));
    w->rk = rk;
    w->low = json_object();
    return w;
}

int idem_watermark_check(idem_watermark_t *w, int timeout_ms,
                         idem_watermark_cb *cb, void *opaque, char *errstr,
                         size_t errstr_size)
{
    const struct rd_kafka_metadata *md = NULL;
    int64_t deadline = idem_now_ms() + timeout_ms;
    rd_kafka_resp_err_t err =
        rd_kafka_metadata(w->rk, 1, NULL, &md, timeout_ms);
    if (err) {
        snprintf(errstr, errstr_size, "metadata: %s", rd_kafka_err2str(err));
        return -1;
    }
    for (int t = 0; t < md->topic_cnt; t++) {
        const struct rd_kafka_metadata_topic *mt = &md->topics[t];
        if (mt->err || mt->topic[0] == '_')
            continue; /* internal topics (__consumer_offsets) */
        for (int i = 0; i < mt->partition_cnt; i++) {
            int32_t part = mt->partitions[i].id;
            int64_t lo, hi;
            /* The whole check stays within timeout_ms: with a broker down,
             * a request per partition would otherwise block for minutes
             * (and the broker's fault schedule with it). */
            int64_t left = deadline - idem_now_ms();
            if (left <= 0)
                break;
            if (rd_kafka_query_watermark_offsets(w->rk, mt->topic, part, &lo,
                                                 &hi, (int)left))
                continue; /* try again at the next check */
            char key[512];
            snprintf(key, sizeof(key), "%s\t%" PRId32, mt->topic, part);
            json_t *seen = json_object_get(w->low, key);
            int64_t before = seen ? json_integer_value(seen) : 0;
            if (lo > before) {
                json_object_set_new(w->low, key, json_integer(lo));
                cb(mt->topic, part, lo, lo - before, opaque);
            }
        }
    }
    rd_kafka_metadata_destroy(md);
    return 0;
}

void idem_watermark_destroy(idem_watermark_t *w)
{
    if (!w)
        return;
    rd_kafka_destroy(w->rk);
    json_decref(w->low);
    free(w);
}
