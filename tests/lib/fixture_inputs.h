/* fixture_inputs: helpers the inputs tests of more than one tier share
 * (static inline: each test file takes what it uses). */
#ifndef IDEM_FIXTURE_INPUTS_H
#define IDEM_FIXTURE_INPUTS_H

#include "input/envelope.h"

#include <librdkafka/rdkafka.h>
#include <string.h>

#define PAY "{\"user_id\":\"u1\",\"amount\":1.25,\"currency\":\"EUR\"}"

/* Parses PAY with one header (name, bytes, len). */
static inline int parse_with_header(const char *name, const void *v, size_t len,
                                    idem_envelope_t *env)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(1);
    rd_kafka_header_add(h, name, -1, v, (ssize_t)len);
    idem_reason_t reason;
    char err[256];
    int r = idem_envelope_parse(PAY, strlen(PAY), h, 1, 4096, env, &reason, err,
                                sizeof(err));
    rd_kafka_headers_destroy(h);
    return r;
}

#endif
