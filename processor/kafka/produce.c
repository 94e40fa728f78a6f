/* produce: the one way idemproc's writers hand a message to librdkafka. */
#include "kafka/produce.h"

rd_kafka_resp_err_t idem_kafka_produce(rd_kafka_t *rk,
                                       const idem_kafka_msg_t *m, int poll_ms)
{
    int32_t partition = m->partitioned ? m->partition : RD_KAFKA_PARTITION_UA;
    for (;;) {
        rd_kafka_resp_err_t err;
        if (m->rkt)
            err = rd_kafka_producev(
                rk, RD_KAFKA_V_RKT(m->rkt), RD_KAFKA_V_PARTITION(partition),
                RD_KAFKA_V_MSGFLAGS(m->msgflags),
                RD_KAFKA_V_KEY(m->key, m->key ? m->key_len : 0),
                RD_KAFKA_V_VALUE(m->value, m->value_len),
                RD_KAFKA_V_HEADERS(m->headers), RD_KAFKA_V_OPAQUE(m->opaque),
                RD_KAFKA_V_END);
        else
            err = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(m->topic), RD_KAFKA_V_PARTITION(partition),
                RD_KAFKA_V_MSGFLAGS(m->msgflags),
                RD_KAFKA_V_KEY(m->key, m->key ? m->key_len : 0),
                RD_KAFKA_V_VALUE(m->value, m->value_len),
                RD_KAFKA_V_HEADERS(m->headers), RD_KAFKA_V_OPAQUE(m->opaque),
                RD_KAFKA_V_END);
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            return err;
        /* Delivery reports free queue space; serve them and retry. */
        rd_kafka_poll(rk, poll_ms);
    }
}

rd_kafka_headers_t *idem_kafka_envelope_headers(const char *message_id,
                                                const char *idempotency_key)
{
    if (!message_id && !idempotency_key)
        return NULL;
    rd_kafka_headers_t *h = rd_kafka_headers_new(2);
    if (message_id)
        rd_kafka_header_add(h, "message_id", -1, message_id, -1);
    if (idempotency_key)
        rd_kafka_header_add(h, "idempotency_key", -1, idempotency_key, -1);
    return h;
}
