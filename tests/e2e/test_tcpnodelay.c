/* test_tcpnodelay: the embedded broker answers a produce request at once,
 * not after the client's delayed ACK (~40 ms when its sockets lack
 * TCP_NODELAY). */
#include "harness.h"

#include <criterion/criterion.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static th_broker_t broker;

static void fini(void)
{
    if (broker.pid > 0)
        th_broker_stop(&broker);
}

TestSuite(tcpnodelay, .fini = fini);

static int delivered;

static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    cr_expect_eq(m->err, 0, "%s", rd_kafka_err2str(m->err));
    delivered++;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

Test(tcpnodelay, produce_round_trip_to_the_embedded_broker_is_fast,
     .timeout = 60)
{
    const char *topics[] = {"--topic", "t:4", NULL};
    cr_assert_eq(th_broker_start(&broker, topics), 0);
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", broker.bootstrap, err,
                      sizeof(err));
    rd_kafka_conf_set(kc, "enable.idempotence", "true", err, sizeof(err));
    rd_kafka_conf_set(kc, "linger.ms", "5", err, sizeof(err));
    rd_kafka_conf_set_dr_msg_cb(kc, on_dr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
    cr_assert(rk, "%s", err);
    enum { ROUNDS = 21 };
    double took[ROUNDS + 1];
    /* Round 0 connects and gets a producer id: not counted. */
    for (int i = 0; i <= ROUNDS; i++) {
        delivered = 0;
        double t0 = now_ms();
        /* Ten keys: a request for several partitions, as a relay batch. */
        for (int k = 0; k < 10; k++) {
            char key[8];
            snprintf(key, sizeof(key), "k%d", k);
            cr_assert_eq(
                rd_kafka_producev(
                    rk, RD_KAFKA_V_TOPIC("t"), RD_KAFKA_V_KEY(key, strlen(key)),
                    RD_KAFKA_V_VALUE("v", 1),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
                0);
        }
        while (delivered < 10 && now_ms() - t0 < 20000)
            rd_kafka_poll(rk, 1);
        cr_assert_eq(delivered, 10);
        took[i] = now_ms() - t0;
    }
    rd_kafka_destroy(rk);
    qsort(took + 1, ROUNDS, sizeof(double), cmp_double);
    double median = took[1 + ROUNDS / 2];
    /* ~5 ms with TCP_NODELAY on a loaded machine, >= 40 ms without. */
    cr_expect_lt(median, 30.0, "median produce round trip %.1f ms", median);
}
