/* test_procstat: /proc/<pid>/stat and /proc/stat parsed as the process_*
 * metrics need them, and their rendering. */
#include "obs/procstat.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* A real line (proc(5)), with a command name holding ") (" and spaces. */
static const char *stat_line =
    "4242 (idem (x) y) S 1 4242 4242 0 -1 4194560 2518 0 0 0 "
    "150 50 0 0 20 0 7 0 123400 104857600 2560 18446744073709551615 "
    "1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";

Test(procstat, parses_cpu_memory_threads_and_start)
{
    idem_procstat_t ps;
    cr_assert_eq(
        idem_procstat_parse_stat(stat_line, 100, 4096, 1700000000, &ps), 0);
    cr_expect_float_eq(ps.cpu_seconds, 2.0, 1e-9); /* (150 + 50) / 100 */
    cr_expect_eq(ps.threads, 7);
    cr_expect_float_eq(ps.start_time_seconds, 1700000000 + 1234.0, 1e-6);
    cr_expect_eq(ps.virtual_memory_bytes, 104857600);
    cr_expect_eq(ps.resident_memory_bytes, 2560 * 4096);
}

Test(procstat, refuses_what_is_not_a_stat_line)
{
    idem_procstat_t ps;
    cr_expect_eq(idem_procstat_parse_stat("", 100, 4096, 0, &ps), -1);
    cr_expect_eq(idem_procstat_parse_stat("1 (x) S 1 2", 100, 4096, 0, &ps),
                 -1);
    cr_expect_float_eq(ps.cpu_seconds, -1, 1e-9);
    cr_expect_eq(ps.resident_memory_bytes, -1);
}

Test(procstat, btime)
{
    cr_expect_eq(idem_procstat_parse_btime("cpu  1 2 3\nintr 5 6\n"
                                           "btime 1764547200\nprocesses 9\n"),
                 1764547200);
    cr_expect_eq(idem_procstat_parse_btime("cpu 1\n"), -1);
}

Test(procstat, reads_this_process)
{
    idem_procstat_t ps;
    idem_procstat_read(&ps);
    cr_expect_gt(ps.resident_memory_bytes, 0);
    cr_expect_geq(ps.open_fds, 3); /* stdin, stdout, stderr at least */
    cr_expect_geq(ps.cpu_seconds, 0);
    cr_expect_gt(ps.start_time_seconds, 1.6e9);
    cr_expect_geq(ps.threads, 1);
}

Test(procstat, renders_unknown_fields_as_absent)
{
    idem_procstat_t ps = {.cpu_seconds = 1.5,
                          .start_time_seconds = -1,
                          .virtual_memory_bytes = -1,
                          .resident_memory_bytes = 4096,
                          .open_fds = 9,
                          .max_fds = -1,
                          .virtual_memory_max_bytes = -1,
                          .threads = -1};
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_procstat_render(&ps, fp);
    fclose(fp);
    cr_expect(strstr(buf, "# TYPE process_cpu_seconds_total counter\n"
                          "process_cpu_seconds_total 1.50\n"),
              "%s", buf);
    cr_expect(strstr(buf, "\nprocess_resident_memory_bytes 4096\n"), "%s", buf);
    cr_expect(strstr(buf, "\nprocess_open_fds 9\n"), "%s", buf);
    cr_expect_null(strstr(buf, "process_start_time_seconds"), "%s", buf);
    cr_expect_null(strstr(buf, "process_max_fds"), "%s", buf);
    free(buf);
}

Test(procstat, statm_gives_the_resident_set)
{
    /* size resident shared text lib data dt, in pages (proc(5)). */
    cr_expect_eq(
        idem_procstat_parse_statm("25600 2560 512 100 0 3000 0\n", 4096),
        2560 * 4096);
    cr_expect_eq(idem_procstat_parse_statm("", 4096), -1);
    cr_expect_eq(idem_procstat_parse_statm("25600", 4096), -1);
    cr_expect_eq(idem_procstat_parse_statm("x y", 4096), -1);
}

Test(procstat, reads_its_own_resident_set)
{
    int64_t rss = idem_procstat_rss_bytes();
    cr_expect_gt(rss, 0);
}
