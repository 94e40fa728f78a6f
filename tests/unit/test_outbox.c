/* test_outbox (unit): the relay's configuration scope and error classes. */
#include "conf/conf.h"
#include "testlib.h"
#include "outbox/outbox.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
TestSuite(outbox);

#define UNPUBLISHED                                                            \
    "SELECT count(*) FROM idemproc_outbox WHERE published_at IS NULL AND "     \
    "error IS NULL"

/* Without a database or Kafka: the outbox scope needs no group, topics or
 * Redis, requires outbox.dsn, refuses table names that are not plain
 * identifiers; delivery errors split into the row's fault and outages. */
Test(outbox, configuration_scope_and_error_classes)
{
    char err[512];
    char *sets[] = {"kafka.bootstrap.servers=127.0.0.1:9092",
                    "outbox.dsn=host=db password=pw",
                    "outbox.table=app.Outbox_1"};
    idem_conf_t *c = idem_conf_load_scope(
        NULL, NULL, sets, 3, IDEM_CONF_SCOPE_OUTBOX, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(c->outbox_batch_max, 5000);
    cr_expect_eq(c->outbox_after, IDEM_OUTBOX_AFTER_MARK);
    cr_expect(c->member_id && *c->member_id);
    idem_conf_destroy(c);
    cr_expect_null(idem_conf_load(NULL, NULL, sets, 3, err, sizeof(err)),
                   "run still needs its group");
    const char *bad[] = {"x y", "1abc",  "a.b.c", "a;b",
                         "",    "\"q\"", ".a",    "a."};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char set[64];
        snprintf(set, sizeof(set), "outbox.table=%s", bad[i]);
        char *s2[] = {sets[0], sets[1], set};
        c = idem_conf_load_scope(NULL, NULL, s2, 3, IDEM_CONF_SCOPE_OUTBOX, err,
                                 sizeof(err));
        cr_expect_null(c, "outbox.table=%s accepted", bad[i]);
        cr_expect(strstr(err, "outbox.table"), "%s", err);
        idem_conf_destroy(c);
    }
    /* The default topic follows Kafka's rule for a name, checked once. */
    const char *badtopic[] = {"a b", "..", "t/x"};
    for (size_t i = 0; i < sizeof(badtopic) / sizeof(badtopic[0]); i++) {
        char set[64];
        snprintf(set, sizeof(set), "outbox.topic=%s", badtopic[i]);
        char *s2[] = {sets[0], sets[1], set};
        c = idem_conf_load_scope(NULL, NULL, s2, 3, IDEM_CONF_SCOPE_OUTBOX, err,
                                 sizeof(err));
        cr_expect_null(c, "outbox.topic=%s accepted", badtopic[i]);
        cr_expect(!strncmp(err, "outbox.topic: ", 14), "%s", err);
        idem_conf_destroy(c);
    }
    char okset[] = "outbox.topic=pay-ments_1.v2";
    char *s3[] = {sets[0], sets[1], okset};
    c = idem_conf_load_scope(NULL, NULL, s3, 3, IDEM_CONF_SCOPE_OUTBOX, err,
                             sizeof(err));
    cr_expect_not_null(c, "%s", err);
    idem_conf_destroy(c);
    char *nodsn[] = {sets[0]};
    cr_expect_null(idem_conf_load_scope(
        NULL, NULL, nodsn, 1, IDEM_CONF_SCOPE_OUTBOX, err, sizeof(err)));
    cr_expect(strstr(err, "outbox.dsn: required"), "%s", err);

    cr_expect(
        idem_outbox_err_is_permanent(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE));
    cr_expect(idem_outbox_err_is_permanent(RD_KAFKA_RESP_ERR_INVALID_RECORD));
    /* An unknown topic is also what a restarting broker reports for a
     * moment: an outage, retried, never a failed row. */
    cr_expect_not(
        idem_outbox_err_is_permanent(RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
    cr_expect_not(
        idem_outbox_err_is_permanent(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT));
    cr_expect_not(idem_outbox_err_is_permanent(RD_KAFKA_RESP_ERR__TRANSPORT));
    cr_expect_not(idem_outbox_err_is_permanent(
        RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION));
}

/* payments the ledger applies (amount in cents: a distinct power of 2). */
#define PAY(cents)                                                             \
    "'{\"event_type\": \"payment\", \"order_id\": \"O-" #cents                 \
    "\", \"user_id\": \"u-1\", \"amount\": " #cents                            \
    "e-2, \"currency\": \"EUR\"}'"
