/* test_log: the JSON line a log call writes: numbers as numbers, the
 * group and member of the process on every line. */
#include "base/log.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

static int pipefd[2];

static void log_init(void)
{
    cr_assert_eq(pipe2(pipefd, O_NONBLOCK), 0);
    idem_log_setup(IDEM_LOG_INFO, IDEM_LOG_JSON);
    idem_log_set_fd(pipefd[1]);
}

static void log_fini(void)
{
    idem_log_set_fd(STDERR_FILENO);
    idem_log_context(NULL, NULL);
    close(pipefd[0]);
    close(pipefd[1]);
}

TestSuite(log, .init = log_init, .fini = log_fini);

/* The one line written since the last call, parsed (caller decrefs). */
static json_t *read_line(void)
{
    char buf[8192];
    ssize_t n = read(pipefd[0], buf, sizeof(buf) - 1);
    cr_assert_gt(n, 0, "nothing logged");
    buf[n] = '\0';
    cr_assert_eq(buf[n - 1], '\n', "not one line: %s", buf);
    cr_assert_null(strchr(buf, '\n') == buf + n - 1 ? NULL : buf,
                   "more than one line: %s", buf);
    json_error_t err;
    json_t *o = json_loads(buf, 0, &err);
    cr_assert(o, "not JSON (%s): %s", err.text, buf);
    return o;
}

Test(log, numeric_fields_are_json_numbers)
{
    idem_log_kv(IDEM_LOG_INFO, "x", "topic", "orders", "partition", "3",
                "offset", "37", "rate", "12.5", "lag", "-1", NULL);
    json_t *o = read_line();
    cr_expect(json_is_string(json_object_get(o, "topic")));
    cr_expect(json_is_integer(json_object_get(o, "partition")));
    cr_expect_eq(json_integer_value(json_object_get(o, "offset")), 37);
    cr_expect(json_is_real(json_object_get(o, "rate")));
    cr_expect_eq(json_integer_value(json_object_get(o, "lag")), -1);
    json_decref(o);
}

Test(log, a_numeric_field_without_a_number_is_null_never_a_string)
{
    /* The progress line's lag is "?" until librdkafka's first
     * statistics; "01" and "1." are not JSON numbers. */
    idem_log_kv(IDEM_LOG_INFO, "x", "lag", "?", "offset", "01", "count", "1.",
                "records", NULL, NULL);
    json_t *o = read_line();
    cr_expect(json_is_null(json_object_get(o, "lag")));
    cr_expect(json_is_null(json_object_get(o, "offset")));
    cr_expect(json_is_null(json_object_get(o, "count")));
    cr_expect(json_is_null(json_object_get(o, "records")));
    json_decref(o);
}

Test(log, other_fields_stay_strings_even_when_they_look_like_numbers)
{
    /* A numeric identity or key is still an identity: one type per field. */
    idem_log_kv(IDEM_LOG_INFO, "x", "key", "12345", "message_id", "7", NULL);
    json_t *o = read_line();
    cr_expect_str_eq(json_string_value(json_object_get(o, "key")), "12345");
    cr_expect_str_eq(json_string_value(json_object_get(o, "message_id")), "7");
    json_decref(o);
}

Test(log, group_and_member_on_every_line_once)
{
    idem_log_context("payments", "idemproc-7f9c");
    idem_log(IDEM_LOG_INFO, "plain %d", 1);
    json_t *o = read_line();
    cr_expect_str_eq(json_string_value(json_object_get(o, "group")),
                     "payments");
    cr_expect_str_eq(json_string_value(json_object_get(o, "member")),
                     "idemproc-7f9c");
    json_decref(o);

    /* A call that names them itself (the "started" line) does not write
     * them twice: a JSON object with a duplicate name is ambiguous. */
    char buf[8192];
    idem_log_kv(IDEM_LOG_INFO, "started", "member", "idemproc-7f9c", "group",
                "payments", NULL);
    ssize_t n = read(pipefd[0], buf, sizeof(buf) - 1);
    cr_assert_gt(n, 0);
    buf[n] = '\0';
    char *first = strstr(buf, "\"group\"");
    cr_assert(first, "%s", buf);
    cr_expect_null(strstr(first + 1, "\"group\""), "twice: %s", buf);
    first = strstr(buf, "\"member\"");
    cr_assert(first, "%s", buf);
    cr_expect_null(strstr(first + 1, "\"member\""), "twice: %s", buf);
}

Test(log, no_context_no_fields)
{
    idem_log_kv(IDEM_LOG_INFO, "x", NULL);
    json_t *o = read_line();
    cr_expect_null(json_object_get(o, "group"));
    cr_expect_null(json_object_get(o, "member"));
    json_decref(o);
}
