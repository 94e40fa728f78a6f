/* test_plugin (unit): a missing plugin file names the path and the reason. */
#include "conf/conf.h"
#include "effect/handler.h"
#include "testlib.h"
#include "effect/plugin.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <libgen.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

TestSuite(plugin);

Test(plugin, missing_file_gives_the_path_and_the_reason)
{
    char err[512] = "";
    cr_assert_null(idem_plugin_open("/nonexistent/dir/x.so", err, sizeof(err)));
    cr_expect(strstr(err, "handler=plugin:/nonexistent/dir/x.so: cannot load"),
              "%s", err);
    cr_expect(strstr(err, "No such file"), "%s", err);
    cr_assert_null(idem_plugin_open("", err, sizeof(err)));
    cr_expect(strstr(err, "no path"), "%s", err);
}
