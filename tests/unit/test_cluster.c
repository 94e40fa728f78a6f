/* test_cluster (unit): the key slot of the Redis Cluster specification
 * (CRC16 and hash tags) and the client's refusals of a seed list, without
 * a server. */
#include "conf/conf.h"
#include "fixture_redisconn.h"
#include "redis/cluster.h"

#include <criterion/criterion.h>
#include <string.h>

TestSuite(cluster, .init = quiet);

static int slot_of(const char *key)
{
    return idem_cluster_keyslot(key, strlen(key));
}

/* The specification's CRC16 check value: "123456789" -> 0x31C3. */
Test(cluster, crc16_check_value)
{
    cr_assert_eq(slot_of("123456789"), 0x31C3 & 16383);
}

/* Slots Redis gives for these keys (its CLUSTER KEYSLOT documentation and
 * redis-cli; the it tier compares thousands of keys with a live node). */
Test(cluster, known_slots)
{
    cr_assert_eq(slot_of("foo"), 12182);
    cr_assert_eq(slot_of("bar"), 5061);
    cr_assert_eq(slot_of("hello"), 866);
    cr_assert_eq(slot_of("somekey"), 11058);
    cr_assert_eq(slot_of("foo{hash_tag}"), 2515);
    cr_assert_eq(slot_of("bar{hash_tag}"), 2515);
    cr_assert_eq(slot_of(""), 0);
}

/* The specification's hash tag rules, each example of its text. */
Test(cluster, hash_tags)
{
    /* Only what is between the first { and the first } after it. */
    cr_assert_eq(slot_of("{user1000}.following"), slot_of("user1000"));
    cr_assert_eq(slot_of("{user1000}.followers"), slot_of("user1000"));
    /* "foo{{bar}}zap": the tag is "{bar". */
    cr_assert_eq(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    /* "foo{bar}{zap}": the first tag only. */
    cr_assert_eq(slot_of("foo{bar}{zap}"), slot_of("bar"));
    /* "foo{}{bar}": an empty first tag hashes the whole key. */
    int whole = idem_cluster_keyslot("foo{}{bar}", 10);
    cr_assert_neq(whole, slot_of("bar"));
    cr_assert_eq(whole, slot_of("foo{}{bar}"));
    /* No closing brace: the whole key. */
    cr_assert_eq(slot_of("{abc"), idem_cluster_keyslot("{abc", 4));
    cr_assert_neq(slot_of("{abc"), slot_of("abc"));
    /* The partition-scoped layout's tags: a chunk's keys share one slot. */
    cr_assert_eq(slot_of("idem:{g:payments:7}:marks"),
                 slot_of("idem:{g:payments:7}:pos"));
    cr_assert_eq(slot_of("idem:{g:payments:7}:marks"), slot_of("g:payments:7"));
}

/* Bytes, not C strings: a NUL inside a key counts, and a tag is found
 * only within the length given. */
Test(cluster, lengths_not_strings)
{
    cr_assert_neq(idem_cluster_keyslot("a\0b", 3),
                  idem_cluster_keyslot("a", 1));
    cr_assert_eq(idem_cluster_keyslot("x{tag}", 4), slot_of("x{ta"));
    for (int i = 0; i < 1000; i++) {
        char k[32];
        int n = snprintf(k, sizeof(k), "key:%d", i);
        int s = idem_cluster_keyslot(k, (size_t)n);
        cr_assert(s >= 0 && s < IDEM_CLUSTER_SLOTS);
    }
}

Test(cluster, errclass_names)
{
    cr_assert_str_eq(idem_cluster_errclass2str(IDEM_CLUSTER_ERR_CLUSTERDOWN),
                     "clusterdown");
    cr_assert_str_eq(idem_cluster_errclass2str(IDEM_CLUSTER_ERR_CONNECTION),
                     "connection");
    cr_assert_str_eq(idem_cluster_errclass2str(IDEM_CLUSTER_ERR_TIMEOUT),
                     "timeout");
}

/* A seed list that does not parse is refused before any connect, naming
 * the seed. */
Test(cluster, bad_seeds_refused)
{
    char errstr[512];
    idem_conf_t *conf = conf_load(NULL, errstr, sizeof(errstr));
    cr_assert(conf, "%s", errstr);
    const char *bad[] = {"",
                         " , ",
                         "127.0.0.1",
                         "127.0.0.1:0",
                         "127.0.0.1:70000",
                         "host:6379,:6380",
                         "h:12x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        idem_cluster_err_t err;
        idem_cluster_t *cl = idem_cluster_new(conf, bad[i], &err);
        cr_assert_null(cl, "seeds \"%s\" accepted", bad[i]);
        cr_assert_eq(err.cls, IDEM_CLUSTER_ERR_SLOTS, "seeds \"%s\"", bad[i]);
        cr_assert(strstr(err.str, "seed"), "seeds \"%s\": %s", bad[i], err.str);
    }
    idem_cluster_destroy(NULL);
    idem_conf_destroy(conf);
}
