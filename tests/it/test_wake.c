/* test_wake (it): librdkafka queue events and a Redis reply in flight end
 * the wait. */
#include "conf/conf.h"
#include "input/envelope.h"
#include "harness.h"
#include "ledgerrun.h"
#include "redis/store.h"
#include "loop/wake.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAIT_LONG_MS 10000 /* "until it happens": far beyond any real wait */

static int reports;

static void count_report(rd_kafka_t *rk, const rd_kafka_message_t *m,
                         void *opaque)
{
    (void)rk;
    (void)m;
    (void)opaque;
    reports++;
}

/* A producer on a mock cluster of its own (in this process): each message
 * it writes comes back as a delivery report on its main queue, the event
 * the loop waits for on the DLQ producer. */
static rd_kafka_t *mock_producer(void)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    cr_assert_eq(
        rd_kafka_conf_set(c, "test.mock.num.brokers", "1", err, sizeof(err)),
        RD_KAFKA_CONF_OK, "%s", err);
    cr_assert_eq(rd_kafka_conf_set(c, "log_level", "0", err, sizeof(err)),
                 RD_KAFKA_CONF_OK, "%s", err);
    rd_kafka_conf_set_dr_msg_cb(c, count_report);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof(err));
    cr_assert(rk, "%s", err);
    return rk;
}

Test(wake, a_queue_event_wakes_once_until_the_queue_is_served)
{
    idem_wake_t w;
    char err[256];
    cr_assert_eq(idem_wake_init(&w, err, sizeof(err)), 0, "%s", err);
    rd_kafka_t *a = mock_producer(), *b = mock_producer();
    int bit_a = idem_wake_add(&w, rd_kafka_queue_get_main(a));
    int bit_b = idem_wake_add(&w, rd_kafka_queue_get_main(b));
    cr_expect_eq(bit_a, 2);
    cr_expect_eq(bit_b, 4);
    reports = 0;

    cr_assert_eq(rd_kafka_producev(b, RD_KAFKA_V_TOPIC("t"),
                                   RD_KAFKA_V_VALUE("v", 1), RD_KAFKA_V_END),
                 RD_KAFKA_RESP_ERR_NO_ERROR);
    int why = 0;
    for (int i = 0; i < 10 && !(why & bit_b); i++)
        why |= idem_wake_wait(&w, -1, WAIT_LONG_MS);
    cr_expect(why & bit_b, "the delivery report did not wake the wait (%d)",
              why);
    cr_expect(!(why & IDEM_WAKE_FD));
    /* The event is there until served; served, nothing wakes the wait. */
    cr_expect_eq(rd_kafka_poll(b, 0), 1);
    cr_expect_eq(reports, 1);
    cr_expect_eq(idem_wake_wait(&w, -1, 20), 0);

    idem_wake_term(&w); /* before the clients: it holds their queues */
    rd_kafka_destroy(a);
    rd_kafka_destroy(b);
}

Test(wake, at_most_four_queues)
{
    idem_wake_t w;
    char err[256];
    cr_assert_eq(idem_wake_init(&w, err, sizeof(err)), 0, "%s", err);
    rd_kafka_t *rk = mock_producer();
    for (int i = 0; i < IDEM_WAKE_QUEUES_MAX; i++)
        cr_expect_eq(idem_wake_add(&w, rd_kafka_queue_get_main(rk)), 2 << i);
    cr_expect_eq(idem_wake_add(&w, rd_kafka_queue_get_main(rk)), 0);
    cr_expect_eq(idem_wake_add(&w, NULL), 0);
    idem_wake_term(&w);
    rd_kafka_destroy(rk);
}

#define PAY "{\"user_id\":\"u1\",\"amount\":1,\"currency\":\"EUR\"}"

/* The store side of the loop's wait: a descriptor only while a request is
 * in flight and its reply unread, readable once Redis answered. */
Test(wake, a_redis_reply_in_flight_ends_the_wait, .timeout = 60)
{
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    char err[512] = "";
    idem_conf_t *conf = th_ledger_conf(&r);
    idem_store_t *s = idem_store_new(conf, NULL);
    th_ledger_t *l = th_ledger_start(conf, s);
    cr_expect_eq(idem_store_reply_fd(s), -1, "not connected");
    cr_assert_eq(idem_store_connect(s, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(idem_store_reply_fd(s), -1, "no request in flight");

    rd_kafka_headers_t *h = rd_kafka_headers_new(1);
    rd_kafka_header_add(h, "idempotency_key", -1, "k1", 2);
    idem_envelope_t e;
    idem_reason_t reason;
    cr_assert_eq(idem_envelope_parse(PAY, strlen(PAY), h, 1, 4096, &e, &reason,
                                     err, sizeof(err)),
                 0, "%s", err);
    rd_kafka_headers_destroy(h);
    const idem_envelope_t *envs[1] = {&e};
    cr_assert_eq(th_ledger_send(l, envs, 1, err, sizeof(err)), 0, "%s", err);
    int fd = idem_store_reply_fd(s);
    cr_assert_geq(fd, 0, "a request is in flight");

    idem_wake_t w;
    cr_assert_eq(idem_wake_init(&w, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(idem_wake_wait(&w, fd, WAIT_LONG_MS), IDEM_WAKE_FD);
    idem_wake_term(&w);

    idem_store_result_t res[1];
    cr_assert_eq(th_ledger_recv(l, res, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(res[0].mark, IDEM_MARK_NEW);
    cr_expect_eq(idem_store_reply_fd(s), -1, "the reply was read");
    th_ledger_stop(l);
    idem_store_destroy(s);
    idem_conf_destroy(conf);
    th_redis_stop(&r);
}
