/* test_broker (unit): the topic spec parser of the embedded broker. */
#include "dev/broker.h"
#include "testlib.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

Test(broker, topic_spec_parse)
{
    char name[64], err[256];
    int32_t p;
    cr_assert_eq(idem_broker_topic_spec_parse("pay.v1:12", name, sizeof(name),
                                              &p, err, sizeof(err)),
                 0);
    cr_assert_str_eq(name, "pay.v1");
    cr_assert_eq(p, 12);
    const char *bad[] = {"t", ":3", "t:", "t:0", "t:x", "t:3x", "a b:2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(idem_broker_topic_spec_parse(bad[i], name, sizeof(name),
                                                  &p, err, sizeof(err)),
                     -1, "%s", bad[i]);
}
