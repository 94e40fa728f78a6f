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
