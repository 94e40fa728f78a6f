/* procstat: the process_* metrics Prometheus client libraries export
 * (CPU, memory, descriptors, start time), read from Linux's /proc.
 */
#ifndef IDEM_PROCSTAT_H
#define IDEM_PROCSTAT_H

#include <stdint.h>
#include <stdio.h>

/* One reading; a field that could not be read is -1 and its metric is left
 * out of the rendering (client_golang's process collector does the same). */
typedef struct {
    double cpu_seconds;        /* utime + stime */
    double start_time_seconds; /* Unix time */
    int64_t virtual_memory_bytes;
    int64_t resident_memory_bytes;
    int64_t open_fds;
    int64_t max_fds;                  /* the soft RLIMIT_NOFILE */
    int64_t virtual_memory_max_bytes; /* RLIMIT_AS; -1 when unlimited */
    int64_t threads;
} idem_procstat_t;

/* Parses the text of /proc/<pid>/stat (borrowed, NUL-terminated) with the
 * clock ticks per second, the page size and the boot time (Unix seconds,
 * /proc/stat's btime) into *ps's CPU, memory, thread and start fields.
 * Returns 0, or -1 when the text is not a stat line (those fields are -1
 * then). The command name may hold spaces and parentheses: fields are
 * counted from the last ')'. */
int idem_procstat_parse_stat(const char *text, long ticks, long page_size,
                             int64_t boot_time_s, idem_procstat_t *ps);

/* The btime line of /proc/stat's text (borrowed); -1 when absent. */
int64_t idem_procstat_parse_btime(const char *text);

/* The resident set in bytes from the text of /proc/<pid>/statm (borrowed;
 * its second field, in pages of page_size); -1 when it is not one. */
int64_t idem_procstat_parse_statm(const char *text, long page_size);

/* This process's resident set in bytes, from /proc/self/statm: cheap
 * enough for the loop to read every 100 ms. -1 when unreadable. */
int64_t idem_procstat_rss_bytes(void);

/* Reads this process's figures from /proc and getrlimit. Never fails:
 * what cannot be read is -1. */
void idem_procstat_read(idem_procstat_t *ps);

/* Writes the process_* metrics of ps in the Prometheus text format (each
 * with HELP and TYPE; -1 fields left out). */
void idem_procstat_render(const idem_procstat_t *ps, FILE *out);

#endif
