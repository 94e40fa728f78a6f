/* test_dlq (unit): the dead-letter headers, Spring's byte by byte. */
#include "kafka/dlq.h"
#include "testlib.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

TestSuite(dlq);

static const unsigned char *hraw(const rd_kafka_headers_t *h, const char *name,
                                 size_t *n)
{
    const void *v;
    cr_assert_eq(rd_kafka_header_get_last(h, name, &v, n), 0, "no %s", name);
    return v;
}

static void hstr_eq(const rd_kafka_headers_t *h, const char *name,
                    const char *want)
{
    size_t n;
    const unsigned char *v = hraw(h, name, &n);
    cr_expect(n == strlen(want) && !memcmp(v, want, n),
              "%s is \"%.*s\", not \"%s\"", name, (int)n, (const char *)v,
              want);
}

/* The headers Spring for Apache Kafka's DeadLetterPublishingRecoverer
 * writes, as its source gives them (DeadLetterPublishingRecoverer
 * .maybeAddOriginalHeaders and .addExceptionInfoHeaders; names from
 * KafkaHeaders.DLT_*, each "kafka_" + "dlt-..."):
 *   kafka_dlt-original-topic        record.topic() in UTF-8
 *   kafka_dlt-original-partition    ByteBuffer.allocate(4).putInt(partition)
 *   kafka_dlt-original-offset       ByteBuffer.allocate(8).putLong(offset)
 *   kafka_dlt-original-timestamp    ByteBuffer.allocate(8).putLong(timestamp)
 *   kafka_dlt-original-timestamp-type  TimestampType.toString(): CreateTime,
 *                                   LogAppendTime or NoTimestampType
 *   kafka_dlt-original-consumer-group  the group.id in UTF-8 (since 2.8)
 *   kafka_dlt-exception-fqcn        exception class name in UTF-8
 *   kafka_dlt-exception-message     exception message in UTF-8
 *   kafka_dlt-exception-stacktrace  the stack trace in UTF-8
 * A Java ByteBuffer is big-endian unless told otherwise, so the integers
 * are big-endian two's complement. */
Test(dlq, spring_headers_byte_by_byte)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(12);
    idem_dlq_spring_headers(h, "payments", 0x01020304, 0x05060708090A0B0CLL,
                            1796083200123LL, RD_KAFKA_TIMESTAMP_CREATE_TIME,
                            "test-group", "not-json", "not JSON: at byte 3");
    hstr_eq(h, "kafka_dlt-original-topic", "payments");
    size_t n;
    const unsigned char *p = hraw(h, "kafka_dlt-original-partition", &n);
    cr_assert_eq(n, 4);
    /* int 0x01020304, most significant byte first */
    cr_expect_eq(p[0], 0x01);
    cr_expect_eq(p[1], 0x02);
    cr_expect_eq(p[2], 0x03);
    cr_expect_eq(p[3], 0x04);
    p = hraw(h, "kafka_dlt-original-offset", &n);
    cr_assert_eq(n, 8);
    /* long 0x05060708090A0B0C, most significant byte first */
    const unsigned char off[8] = {0x05, 0x06, 0x07, 0x08,
                                  0x09, 0x0A, 0x0B, 0x0C};
    for (int i = 0; i < 8; i++)
        cr_expect_eq(p[i], off[i], "offset byte %d is %02x", i, p[i]);
    p = hraw(h, "kafka_dlt-original-timestamp", &n);
    cr_assert_eq(n, 8);
    /* 1796083200123 ms (2026-12-01T00:00:00.123Z) = 0x000001A22EE6B07B */
    const unsigned char ts[8] = {0x00, 0x00, 0x01, 0xA2,
                                 0x2E, 0xE6, 0xB0, 0x7B};
    for (int i = 0; i < 8; i++)
        cr_expect_eq(p[i], ts[i], "timestamp byte %d is %02x", i, p[i]);
    hstr_eq(h, "kafka_dlt-original-timestamp-type", "CreateTime");
    hstr_eq(h, "kafka_dlt-original-consumer-group", "test-group");
    hstr_eq(h, "kafka_dlt-exception-fqcn", "idemproc.not-json");
    hstr_eq(h, "kafka_dlt-exception-message", "not JSON: at byte 3");
    hstr_eq(h, "kafka_dlt-exception-stacktrace",
            "idemproc.not-json: not JSON: at byte 3");
    rd_kafka_headers_destroy(h);

    /* A negative value (no timestamp: -1) is two's complement, all ones;
     * the other timestamp types keep Kafka's names. */
    h = rd_kafka_headers_new(12);
    idem_dlq_spring_headers(h, "t", -1, -1, -1,
                            RD_KAFKA_TIMESTAMP_NOT_AVAILABLE, "g",
                            "max-retries", "x");
    p = hraw(h, "kafka_dlt-original-timestamp", &n);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(p[i], 0xFF);
    hstr_eq(h, "kafka_dlt-original-timestamp-type", "NoTimestampType");
    rd_kafka_headers_destroy(h);
    h = rd_kafka_headers_new(12);
    idem_dlq_spring_headers(h, "t", 0, 0, 0, RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME,
                            "g", "max-retries", "x");
    hstr_eq(h, "kafka_dlt-original-timestamp-type", "LogAppendTime");
    rd_kafka_headers_destroy(h);
}
