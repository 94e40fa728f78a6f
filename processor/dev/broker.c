/* broker: an in-memory development Kafka (librdkafka's mock cluster) that
 * tests and `idemproc broker` start in-process. */
#include "dev/broker.h"
#include "dev/tcpnodelay.h"

#include "base/log.h"
#include "base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

struct idem_broker_s {
    rd_kafka_t *rk; /* owns the mock cluster's bookkeeping; never connects */
    rd_kafka_mock_cluster_t *mcluster;
    int broker_cnt;
};

idem_broker_t *idem_broker_new(int broker_cnt, char *errstr, size_t errstr_size)
{
    if (broker_cnt < 1 || broker_cnt > 32) {
        snprintf(errstr, errstr_size, "--brokers: %d out of range (1..32)",
                 broker_cnt);
        return NULL;
    }
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set_log_cb(conf, idem_log_rdkafka);
    /* The handle only hosts the cluster; keep it from logging that it has
     * no bootstrap servers of its own. */
    rd_kafka_conf_set(conf, "log_level", "4", NULL, 0);
    char kerr[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, kerr, sizeof(kerr));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        snprintf(errstr, errstr_size, "broker: %s", kerr);
        return NULL;
    }
    idem_tcpnodelay_enable(); /* no 40 ms delayed-ACK stall per request */
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, broker_cnt);
    if (!mc) {
        rd_kafka_destroy(rk);
        snprintf(errstr, errstr_size,
                 "broker: cannot start a mock cluster of %d brokers",
                 broker_cnt);
        return NULL;
    }
    idem_broker_t *b = idem_xcalloc(1, sizeof(*b));
    b->rk = rk;
    b->mcluster = mc;
    b->broker_cnt = broker_cnt;
    return b;
}

int idem_broker_topic_create(idem_broker_t *broker, const char *topic,
                             int32_t partitions, char *errstr,
                             size_t errstr_size)
{
    int rf = broker->broker_cnt < 3 ? broker->broker_cnt : 3;
    rd_kafka_resp_err_t err =
        rd_kafka_mock_topic_create(broker->mcluster, topic, partitions, rf);
    if (err) {
        snprintf(errstr, errstr_size, "--topic %s:%" PRId32 ": %s", topic,
                 partitions, rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

int idem_broker_topic_spec_parse(const char *spec, char *name, size_t size,
                                 int32_t *partitions, char *errstr,
                                 size_t errstr_size)
{
    const char *colon = strrchr(spec, ':');
    size_t nl = colon ? (size_t)(colon - spec) : 0;
    if (!colon || nl == 0 || nl >= size || nl > 249) {
        snprintf(errstr, errstr_size, "--topic: \"%s\" is not NAME:PARTITIONS",
                 spec);
        return -1;
    }
    for (size_t i = 0; i < nl; i++) {
        char c = spec[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
            snprintf(errstr, errstr_size,
                     "--topic: bad topic name in \"%s\" (use [a-zA-Z0-9._-])",
                     spec);
            return -1;
        }
    }
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || p < 1 || p > 10000) {
        snprintf(errstr, errstr_size,
                 "--topic: bad partition count in \"%s\" (1..10000)", spec);
        return -1;
    }
    memcpy(name, spec, nl);
    name[nl] = '\0';
    *partitions = (int32_t)p;
    return 0;
}

const char *idem_broker_bootstraps(const idem_broker_t *broker)
{
    return rd_kafka_mock_cluster_bootstraps(broker->mcluster);
}

rd_kafka_mock_cluster_t *idem_broker_mock(idem_broker_t *broker)
{
    return broker->mcluster;
}

void idem_broker_destroy(idem_broker_t *broker)
{
    if (!broker)
        return;
    rd_kafka_mock_cluster_destroy(broker->mcluster);
    rd_kafka_destroy(broker->rk);
    free(broker);
}
