/* test_store (unit): Redis error replies are classified by their code. */
#include "testlib.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
TestSuite(store);

Test(store, error_replies_are_classified_by_their_code)
{
    static const char *const cases[][2] = {
        {"OOM command not allowed when used memory > 'maxmemory'.", "oom"},
        {"READONLY You can't write against a read only replica.", "readonly"},
        {"MISCONF Redis is configured to save RDB snapshots", "misconf"},
        {"NOREPLICAS Not enough good replicas to write.", "noreplicas"},
        {"LOADING Redis is loading the dataset in memory", "loading"},
        {"BUSY Redis is busy running a script.", "busy"},
        {"MASTERDOWN Link with MASTER is down", "masterdown"},
        {"NOAUTH Authentication required.", "auth"},
        {"WRONGPASS invalid username-password pair", "auth"},
        {"NOPERM this user has no permissions", "auth"},
        /* An ACL refusal inside a script (Redis 7): an ERR reply. */
        {"ERR The user executing the script can't access at least one of "
         "the keys mentioned in the command arguments script: 0fc6, on "
         "@user_script:1.",
         "auth"},
        {"ERR The user executing the script can't run this command or "
         "subcommand script: 4b52, on @user_script:1.",
         "auth"},
        {"NOSCRIPT No matching script.", "noscript"},
        {"BUSYKEY Target key name already exists.", "other"},
        {"ERR something else", "other"},
        {"", "other"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        cr_expect_str_eq(idem_store_error_class(cases[i][0]), cases[i][1], "%s",
                         cases[i][0]);
    cr_expect_str_eq(idem_store_error_class(NULL), "other");
}

/* The global path's buckets in cluster mode: a fixed function (marks and
 * effect shards are named by it), tags that cannot equal a partition's. */
Test(store, global_buckets_are_stable_and_tagged_apart_from_partitions)
{
    idem_conf_t conf;
    memset(&conf, 0, sizeof(conf));
    conf.group_id = "g1";
    conf.redis_prefix = "idem:";
    /* CRC16/XMODEM("123456789") = 0x31C3 = 12739; 12739 % 64 = 3. */
    cr_assert_eq(idem_store_gbucket("123456789", 9), 3);
    int seen[IDEM_GBUCKETS] = {0};
    char id[32];
    for (int i = 0; i < 4096; i++) {
        int n = snprintf(id, sizeof(id), "evt-%d", i);
        int b = idem_store_gbucket(id, (size_t)n);
        cr_assert(b >= 0 && b < IDEM_GBUCKETS);
        seen[b]++;
    }
    for (int b = 0; b < IDEM_GBUCKETS; b++)
        cr_assert_gt(seen[b], 0, "bucket %d never used", b);
    char tag[64], key[128];
    idem_store_gbucket_tag(&conf, 7, tag, sizeof(tag));
    cr_assert_str_eq(tag, "{g1::07}");
    int len = idem_store_gmark_key(&conf, "123456789", 9, key, sizeof(key));
    cr_assert_str_eq(key, "idem:dedup{g1::03}:123456789");
    cr_assert_eq(len, (int)strlen(key));
}

Test(store, a_global_mark_key_keeps_an_identity_byte_for_byte)
{
    idem_conf_t conf;
    memset(&conf, 0, sizeof(conf));
    conf.group_id = "g1";
    conf.redis_prefix = "idem:";
    /* An identity with a NUL inside: the key carries all its bytes, in the
     * bucket of all of them (not of "ab", where a C string would stop). */
    const char id[] = {'a', 'b', '\0', 'c', 'd'};
    char key[128], tag[64], want[128];
    memset(key, 'x', sizeof(key));
    int len = idem_store_gmark_key(&conf, id, sizeof(id), key, sizeof(key));
    idem_store_gbucket_tag(&conf, idem_store_gbucket(id, sizeof(id)), tag,
                           sizeof(tag));
    int hl = snprintf(want, sizeof(want), "idem:dedup%s:", tag);
    memcpy(want + hl, id, sizeof(id));
    cr_assert_eq(len, hl + (int)sizeof(id));
    cr_assert_eq(memcmp(key, want, (size_t)len), 0);
    cr_assert_eq(key[len], '\0');
    cr_assert_neq(idem_store_gbucket(id, sizeof(id)), idem_store_gbucket(id, 2),
                  "choose an identity whose bucket differs from its prefix's");
    /* Too small a buffer: cut and terminated, the full length returned. */
    char small[24];
    cr_assert_eq(
        idem_store_gmark_key(&conf, id, sizeof(id), small, sizeof(small)), len);
    cr_assert_eq(small[sizeof(small) - 1], '\0');
}
