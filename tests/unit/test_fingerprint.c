/* test_fingerprint (unit): the effect settings a member publishes beside
 * its heartbeat (effect/fingerprint.h) and how two are compared
 * (idem_liveness_fp_diff, redis/liveness.h). */
#include "conf/conf.h"
#include "effect/fingerprint.h"
#include "redis/liveness.h"
#include "testlib.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *fingerprint_of(const char *handler, const char *extra)
{
    char h[256];
    snprintf(h, sizeof(h), "handler=%s", handler);
    char *sets[] = {"kafka.bootstrap.servers=127.0.0.1:9092",
                    "group.id=g",
                    "input.topics=payments",
                    "dlq.topic=payments.dlq",
                    "redis.url=redis://127.0.0.1:1/0",
                    h,
                    (char *)extra};
    char errstr[512];
    idem_conf_t *c =
        idem_conf_load(NULL, NULL, sets, extra ? 7 : 6, errstr, sizeof(errstr));
    cr_assert_not_null(c, "%s", errstr);
    char *fp = idem_effect_fingerprint(c);
    idem_conf_destroy(c);
    return fp;
}

Test(fingerprint, names_the_handler_and_hides_values)
{
    char *fp = fingerprint_of("forward", "output.topic=secret-topic-name");
    cr_expect(!strncmp(fp, "handler=forward\n", 16), "%s", fp);
    cr_expect(strstr(fp, "\noutput.topic=#"), "%s", fp);
    cr_expect(strstr(fp, "\nenvelope.identity=#"), "%s", fp);
    cr_expect_null(strstr(fp, "secret-topic-name"), "%s", fp);
    free(fp);
}

Test(fingerprint, a_script_is_compared_by_its_contents)
{
    char *dir = NULL;
    char a[600], b[600], c[600];
    const char *src = "function effect(rec) end\n";
    snprintf(a, sizeof(a), "script.file=%s", th_file_in(&dir, "a.lua", src));
    snprintf(b, sizeof(b), "script.file=%s", th_file_in(&dir, "b.lua", src));
    snprintf(c, sizeof(c), "script.file=%s",
             th_file_in(&dir, "c.lua",
                        "function effect(rec) return false, 'no' end\n"));
    char *fa = fingerprint_of("script", a), *fb = fingerprint_of("script", b),
         *fc = fingerprint_of("script", c);
    char keys[256];
    cr_expect_eq(idem_liveness_fp_diff(fa, fb, keys, sizeof(keys)), 0, "%s",
                 keys);
    cr_expect_eq(idem_liveness_fp_diff(fa, fc, keys, sizeof(keys)), 1);
    cr_expect_str_eq(keys, "script.file");
    free(fa);
    free(fb);
    free(fc);
    th_rmrf(dir);
    free(dir);
}

Test(fingerprint, different_handlers_differ_in_handler_and_their_keys)
{
    char *l = fingerprint_of("ledger", NULL);
    char *f = fingerprint_of("forward", "output.topic=out");
    char keys[512];
    int n = idem_liveness_fp_diff(l, f, keys, sizeof(keys));
    cr_expect_geq(n, 2, "%s", keys);
    cr_expect(!strncmp(keys, "handler,", 8), "%s", keys);
    cr_expect(strstr(keys, "output.topic"), "%s", keys);
    /* the same in the other direction, and with itself nothing */
    cr_expect_eq(idem_liveness_fp_diff(f, l, keys, sizeof(keys)), n);
    cr_expect_eq(idem_liveness_fp_diff(l, l, keys, sizeof(keys)), 0);
    cr_expect_str_eq(keys, "");
    free(l);
    free(f);
}

Test(fingerprint, diff_of_plain_lines)
{
    char keys[128];
    cr_expect_eq(
        idem_liveness_fp_diff("a=1\nb=2\n", "b=2\na=1\n", keys, sizeof(keys)),
        0);
    cr_expect_eq(idem_liveness_fp_diff("a=1\nb=2\n", "a=1\nb=3\nc=4\n", keys,
                                       sizeof(keys)),
                 2);
    cr_expect_str_eq(keys, "b,c");
    cr_expect_eq(idem_liveness_fp_diff("", "a=1\n", keys, sizeof(keys)), 1);
    cr_expect_str_eq(keys, "a");
}
