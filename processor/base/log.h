/* log: one-line structured logs on stderr (JSON by default, text for people).
 */
#ifndef IDEM_LOG_H
#define IDEM_LOG_H

#include <stdarg.h>

typedef enum {
    IDEM_LOG_DEBUG = 0,
    IDEM_LOG_INFO,
    IDEM_LOG_WARN,
    IDEM_LOG_ERROR,
} idem_log_level_t;

typedef enum {
    IDEM_LOG_JSON = 0,
    IDEM_LOG_TEXT,
} idem_log_format_t;

/* Process-wide logger settings; safe to call before any thread starts. */
void idem_log_setup(idem_log_level_t level, idem_log_format_t format);
const char *idem_log_level2str(idem_log_level_t level);
int idem_log_enabled(idem_log_level_t level);

/* The process's consumer group and member id (borrowed, copied; NULL or
 * "" drops the field): every JSON line then carries "group" and "member",
 * so lines of several members merged in one place tell whose they are.
 * Call before any thread logs. */
void idem_log_context(const char *group, const char *member);

/* Where lines go: STDERR_FILENO unless told (tests read them from a
 * pipe). */
void idem_log_set_fd(int fd);

/* Log one event. `fields` is a NULL-terminated list of key, value string
 * pairs (both borrowed) added as context, e.g.
 *   idem_log_kv(IDEM_LOG_WARN, "redis down", "error", errstr, NULL);
 * Values are JSON-escaped strings, but for the fields that are numbers by
 * name (offset, partition, lag, records, ...: idem_log_numeric_key): a
 * value that is a JSON number is written as one ("offset":37), and any
 * other value ("?" for a lag not known yet) as null, so a field has one
 * JSON type on every line. The whole line is written with one write(2) so
 * lines from several threads never interleave. */
void idem_log_kv(idem_log_level_t level, const char *msg, ...);

/* 1 when the field `key` is written as a JSON number (or null). */
int idem_log_numeric_key(const char *key);

/* printf-style message without context fields. */
void idem_log(idem_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* librdkafka log callback (rd_kafka_conf_set_log_cb) for every client of
 * this process: maps syslog levels to ours and names the client. Fires on
 * librdkafka's threads, or on the polling thread with log.queue. Warnings
 * about properties that do not apply to a client type (kafka.* keys are
 * given to every client) are demoted to debug. */
struct rd_kafka_s;
void idem_log_rdkafka(const struct rd_kafka_s *rk, int level,
                      const char *facility, const char *buf);

#endif
