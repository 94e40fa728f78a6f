/* procstat: the process_* metrics Prometheus client libraries export
 * (CPU, memory, descriptors, start time), read from Linux's /proc.
 */
#include "obs/procstat.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static void procstat_unknown(idem_procstat_t *ps)
{
    ps->cpu_seconds = -1;
    ps->start_time_seconds = -1;
    ps->virtual_memory_bytes = -1;
    ps->resident_memory_bytes = -1;
    ps->open_fds = -1;
    ps->max_fds = -1;
    ps->virtual_memory_max_bytes = -1;
    ps->threads = -1;
}

int idem_procstat_parse_stat(const char *text, long ticks, long page_size,
                             int64_t boot_time_s, idem_procstat_t *ps)
{
    ps->cpu_seconds = -1;
    ps->start_time_seconds = -1;
    ps->virtual_memory_bytes = -1;
    ps->resident_memory_bytes = -1;
    ps->threads = -1;
    const char *p = strrchr(text, ')');
    if (!p || ticks <= 0 || page_size <= 0)
        return -1;
    p++;
    /* After the name: field 3 (state) on, see proc(5). We need 14 utime,
     * 15 stime, 20 num_threads, 22 starttime, 23 vsize, 24 rss. */
    unsigned long long f[25] = {0};
    int n = 3;
    char *end;
    while (*p == ' ')
        p++;
    if (!*p)
        return -1;
    p++; /* the state letter */
    for (n = 4; n <= 24; n++) {
        f[n] = strtoull(p, &end, 10);
        if (end == p)
            return -1;
        p = end;
    }
    ps->cpu_seconds = (double)(f[14] + f[15]) / (double)ticks;
    ps->threads = (int64_t)f[20];
    if (boot_time_s >= 0)
        ps->start_time_seconds =
            (double)boot_time_s + (double)f[22] / (double)ticks;
    ps->virtual_memory_bytes = (int64_t)f[23];
    ps->resident_memory_bytes = (int64_t)f[24] * page_size;
    return 0;
}

int64_t idem_procstat_parse_btime(const char *text)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (!strncmp(p, "btime ", 6))
            return strtoll(p + 6, NULL, 10);
    }
    return -1;
}

/* Reads a small /proc file into buf (NUL-terminated). 0 or -1. */
static int read_small(const char *path, char *buf, size_t size)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    size_t n = fread(buf, 1, size - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    return n ? 0 : -1;
}

static int64_t count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

/* btime from /proc/stat, line by line: its intr line alone can pass any
 * fixed buffer on a large machine. */
static int64_t read_btime(void)
{
    FILE *fp = fopen("/proc/stat", "r");
    if (!fp)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    int64_t bt = -1;
    while (bt < 0 && getline(&line, &cap, fp) > 0)
        bt = idem_procstat_parse_btime(line);
    free(line);
    fclose(fp);
    return bt;
}

int64_t idem_procstat_parse_statm(const char *text, long page_size)
{
    char *end;
    errno = 0;
    strtoll(text, &end, 10); /* size */
    if (end == text || errno)
        return -1;
    const char *p = end;
    long long pages = strtoll(p, &end, 10);
    if (end == p || errno || pages < 0 || page_size <= 0)
        return -1;
    return (int64_t)pages * page_size;
}

int64_t idem_procstat_rss_bytes(void)
{
    char buf[256];
    if (read_small("/proc/self/statm", buf, sizeof(buf)))
        return -1;
    return idem_procstat_parse_statm(buf, sysconf(_SC_PAGESIZE));
}

void idem_procstat_read(idem_procstat_t *ps)
{
    procstat_unknown(ps);
    char stat[2048];
    if (!read_small("/proc/self/stat", stat, sizeof(stat)))
        idem_procstat_parse_stat(stat, sysconf(_SC_CLK_TCK),
                                 sysconf(_SC_PAGESIZE), read_btime(), ps);
    ps->open_fds = count_fds();
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY)
        ps->max_fds = (int64_t)rl.rlim_cur;
    if (!getrlimit(RLIMIT_AS, &rl) && rl.rlim_cur != RLIM_INFINITY)
        ps->virtual_memory_max_bytes = (int64_t)rl.rlim_cur;
}

static void put_metric(FILE *out, const char *name, const char *type,
                       const char *help, const char *value)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, type,
            name, value);
}

static void put_int(FILE *out, const char *name, const char *help, int64_t v)
{
    char buf[32];
    if (v < 0)
        return;
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    put_metric(out, name, "gauge", help, buf);
}

void idem_procstat_render(const idem_procstat_t *ps, FILE *out)
{
    char buf[64];
    if (ps->cpu_seconds >= 0) {
        snprintf(buf, sizeof(buf), "%.2f", ps->cpu_seconds);
        put_metric(out, "process_cpu_seconds_total", "counter",
                   "Total user and system CPU time spent in seconds.", buf);
    }
    put_int(out, "process_open_fds", "Number of open file descriptors.",
            ps->open_fds);
    put_int(out, "process_max_fds", "Maximum number of open file descriptors.",
            ps->max_fds);
    put_int(out, "process_virtual_memory_bytes",
            "Virtual memory size in bytes.", ps->virtual_memory_bytes);
    put_int(out, "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            ps->virtual_memory_max_bytes);
    put_int(out, "process_resident_memory_bytes",
            "Resident memory size in bytes.", ps->resident_memory_bytes);
    if (ps->start_time_seconds >= 0) {
        snprintf(buf, sizeof(buf), "%.2f", ps->start_time_seconds);
        put_metric(out, "process_start_time_seconds", "gauge",
                   "Start time of the process since unix epoch in seconds.",
                   buf);
    }
    put_int(out, "process_threads", "Number of OS threads in the process.",
            ps->threads);
}
