/* test_produce: idem_kafka_produce against a librdkafka producer whose
 * broker never answers (127.0.0.1:1): a full queue is waited out by
 * serving delivery reports, a refusal comes back with the headers still
 * the caller's; the envelope's headers. No broker is needed: nothing here
 * is ever delivered. */
#include "kafka/produce.h"

#include <criterion/criterion.h>
#include <string.h>

typedef struct {
    int reports;
    rd_kafka_resp_err_t last_err;
} dr_t;

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
    (void)rk;
    dr_t *d = opaque;
    d->reports++;
    d->last_err = msg->err;
}

/* A producer holding at most one message, each timing out after 300 ms. */
static rd_kafka_t *producer(dr_t *d)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    const char *kv[][2] = {{"bootstrap.servers", "127.0.0.1:1"},
                           {"queue.buffering.max.messages", "1"},
                           {"message.timeout.ms", "300"},
                           {"message.max.bytes", "2000"},
                           {"log_level", "0"}};
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
        cr_assert_eq(rd_kafka_conf_set(c, kv[i][0], kv[i][1], err, sizeof(err)),
                     RD_KAFKA_CONF_OK, "%s", err);
    rd_kafka_conf_set_opaque(c, d);
    rd_kafka_conf_set_dr_msg_cb(c, dr_cb);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof(err));
    cr_assert_not_null(rk, "%s", err);
    return rk;
}

Test(produce, full_queue_waits_for_delivery_reports)
{
    dr_t d = {0};
    rd_kafka_t *rk = producer(&d);
    idem_kafka_msg_t m = {.topic = "t",
                          .msgflags = RD_KAFKA_MSG_F_COPY,
                          .key = "k",
                          .key_len = 1,
                          .value = "v1",
                          .value_len = 2,
                          .headers = idem_kafka_envelope_headers("m1", "i1")};
    cr_assert_eq(idem_kafka_produce(rk, &m, 50), 0);
    cr_assert_eq(d.reports, 0);
    /* The queue holds one message: the second waits until the first's
     * delivery report (timed out) has been served. */
    m.value = "v2";
    m.headers = idem_kafka_envelope_headers("m2", NULL);
    cr_assert_eq(idem_kafka_produce(rk, &m, 50), 0);
    cr_assert_eq(d.reports, 1);
    cr_assert_eq(d.last_err, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
    rd_kafka_flush(rk, 5000);
    cr_assert_eq(d.reports, 2);
    rd_kafka_destroy(rk);
}

Test(produce, refusal_leaves_headers_to_the_caller)
{
    dr_t d = {0};
    rd_kafka_t *rk = producer(&d);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, "t", NULL);
    static char big[4000];
    idem_kafka_msg_t m = {.rkt = rkt,
                          .msgflags = RD_KAFKA_MSG_F_COPY,
                          .value = big,
                          .value_len = sizeof(big),
                          .headers = idem_kafka_envelope_headers("m", "i")};
    cr_assert_eq(idem_kafka_produce(rk, &m, 50),
                 RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    /* Still ours: destroying it is the caller's (a double free otherwise). */
    cr_assert_eq(rd_kafka_header_cnt(m.headers), 2);
    rd_kafka_headers_destroy(m.headers);
    cr_assert_eq(d.reports, 0);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
}

Test(produce, envelope_headers)
{
    cr_assert_null(idem_kafka_envelope_headers(NULL, NULL));
    const void *v;
    size_t n;
    rd_kafka_headers_t *h = idem_kafka_envelope_headers("m-1", "k-1");
    cr_assert_eq(rd_kafka_header_cnt(h), 2);
    cr_assert_eq(rd_kafka_header_get_last(h, "message_id", &v, &n), 0);
    cr_assert(n == 3 && !memcmp(v, "m-1", 3));
    cr_assert_eq(rd_kafka_header_get_last(h, "idempotency_key", &v, &n), 0);
    cr_assert(n == 3 && !memcmp(v, "k-1", 3));
    rd_kafka_headers_destroy(h);
    h = idem_kafka_envelope_headers(NULL, "k-2");
    cr_assert_eq(rd_kafka_header_cnt(h), 1);
    cr_assert_eq(rd_kafka_header_get_last(h, "message_id", &v, &n),
                 RD_KAFKA_RESP_ERR__NOENT);
    rd_kafka_headers_destroy(h);
}
