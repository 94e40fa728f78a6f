/* test_liveness: how long a member's heartbeat lasts unrenewed (its Kafka
 * session), and the fingerprints' difference. */
#include "redis/liveness.h"

#include <criterion/criterion.h>

static idem_conf_t *conf_with(const char *set)
{
    char *sets[] = {"kafka.bootstrap.servers=127.0.0.1:9092", "group.id=g",
                    "input.topics=payments", "dlq.topic=payments.dlq",
                    (char *)set};
    char err[512] = "";
    idem_conf_t *c =
        idem_conf_load(NULL, NULL, sets, set ? 5 : 4, err, sizeof(err));
    cr_assert(c, "%s", err);
    return c;
}

Test(liveness, heartbeat_lasts_the_members_kafka_session)
{
    idem_conf_t *c = conf_with(NULL); /* librdkafka's default */
    cr_expect_eq(idem_liveness_ttl_ms(c), 45000);
    idem_conf_destroy(c);
    c = conf_with("kafka.session.timeout.ms=6000");
    cr_expect_eq(idem_liveness_ttl_ms(c), 6000);
    idem_conf_destroy(c);
    c = conf_with("kafka.session.timeout.ms=2m"); /* a unit, in ms */
    cr_expect_eq(idem_liveness_ttl_ms(c), 120000);
    idem_conf_destroy(c);
}

Test(liveness, heartbeat_outlives_three_beats)
{
    idem_conf_t *c = conf_with("kafka.session.timeout.ms=1000");
    cr_expect_eq(idem_liveness_ttl_ms(c), 3 * IDEM_LIVENESS_BEAT_MS);
    idem_conf_destroy(c);
}

Test(liveness, fingerprint_difference_names_the_keys)
{
    char buf[128];
    cr_expect_eq(idem_liveness_fp_diff("a=1\nb=2\n", "a=1\nb=3\nc=4\n", buf,
                                       sizeof(buf)),
                 2);
    cr_expect_str_eq(buf, "b,c");
}
