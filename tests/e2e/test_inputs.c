/* test_inputs (e2e): `produce --verbose` masks every secret. */
#include "conf/conf.h"
#include "input/envelope.h"
#include "harness.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAY "{\"user_id\":\"u1\",\"amount\":1.25,\"currency\":\"EUR\"}"

/* `produce -v` prints the effective settings: a key given with -X must
 * not be among them. */
Test(inputs, produce_verbose_masks_every_secret, .timeout = 60)
{
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    "127.0.0.1:1",
                    "-t",
                    "t",
                    "--count",
                    "1",
                    "-v",
                    "-X",
                    "message.timeout.ms=1000",
                    "-X",
                    "ssl.key.pem=-----BEGIN PRIVATE KEY-----TOPSECRETKEY",
                    "-X",
                    "sasl.password=TOPSECRETPASS",
                    NULL};
    char *out = NULL, *err = NULL;
    th_run(argv, &out, &err, 30000);
    cr_assert(out && err);
    cr_expect(strstr(out, "ssl.key.pem") || strstr(err, "ssl.key.pem"),
              "the setting is listed: %s%s", out, err);
    cr_expect_null(strstr(out, "TOPSECRET"), "%s", out);
    cr_expect_null(strstr(err, "TOPSECRET"), "%s", err);
    free(out);
    free(err);
}
