/* log: one-line structured logs on stderr (JSON by default, text for people).
 */
#include "base/log.h"

#include <librdkafka/rdkafka.h>

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static idem_log_level_t log_level = IDEM_LOG_INFO;
static idem_log_format_t log_format = IDEM_LOG_JSON;
static int log_fd = STDERR_FILENO;
static char log_group[256];  /* "" when not set */
static char log_member[256]; /* "" when not set */

static const char *level_names[] = {"debug", "info", "warn", "error"};

void idem_log_setup(idem_log_level_t level, idem_log_format_t format)
{
    log_level = level;
    log_format = format;
}

void idem_log_context(const char *group, const char *member)
{
    snprintf(log_group, sizeof(log_group), "%s", group ? group : "");
    snprintf(log_member, sizeof(log_member), "%s", member ? member : "");
}

void idem_log_set_fd(int fd)
{
    log_fd = fd;
}

/* The fields whose values are numbers wherever they are logged. A name
 * here is a promise about every call site: a field is one JSON type on
 * every line, or a log store that maps types from the first line it sees
 * (Elasticsearch, Loki's json stage) trips on the next. */
static const char *const numeric_keys[] = {
    "acknowledged_offset",
    "app_offset",
    "assigned",
    "attempts",
    "count",
    "dlq",
    "duplicate",
    "failed",
    "fetchq_cnt",
    "held",
    "high_watermark",
    "kafka_offset",
    "lag",
    "next_offset",
    "off",
    "offset",
    "partition",
    "processed",
    "published",
    "rate",
    "record_offset",
    "records",
    "records_in_hand",
    "redis_offset",
    "rejects",
    "seconds",
    "start_offset",
    NULL,
};

int idem_log_numeric_key(const char *key)
{
    for (size_t i = 0; numeric_keys[i]; i++)
        if (!strcmp(numeric_keys[i], key))
            return 1;
    return 0;
}

/* 1 when s is a number in JSON's grammar (RFC 8259 section 6): what can be
 * written unquoted. */
static int is_json_number(const char *s)
{
    if (*s == '-')
        s++;
    if (*s == '0')
        s++;
    else if (*s >= '1' && *s <= '9')
        while (*s >= '0' && *s <= '9')
            s++;
    else
        return 0;
    if (*s == '.') {
        s++;
        if (!(*s >= '0' && *s <= '9'))
            return 0;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!(*s >= '0' && *s <= '9'))
            return 0;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    return *s == '\0';
}

const char *idem_log_level2str(idem_log_level_t level)
{
    return level <= IDEM_LOG_ERROR ? level_names[level] : "?";
}

int idem_log_enabled(idem_log_level_t level)
{
    return level >= log_level;
}

/* Bounded line buffer: appends never overflow, the line is cut instead. */
typedef struct {
    char buf[8192];
    size_t len;
} line_t;

static void line_putc(line_t *l, char c)
{
    if (l->len < sizeof(l->buf) - 2) /* keep room for '\n' */
        l->buf[l->len++] = c;
}

static void line_puts(line_t *l, const char *s)
{
    while (*s)
        line_putc(l, *s++);
}

/* Appends `s` as the inside of a JSON string (RFC 8259 escaping). */
static void line_put_json(line_t *l, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            line_putc(l, '\\');
            line_putc(l, (char)c);
        } else if (c == '\n') {
            line_puts(l, "\\n");
        } else if (c == '\t') {
            line_puts(l, "\\t");
        } else if (c < 0x20) {
            char hex[8];
            snprintf(hex, sizeof(hex), "\\u%04x", c);
            line_puts(l, hex);
        } else {
            line_putc(l, (char)c);
        }
    }
}

static void line_put_time(line_t *l)
{
    struct timespec ts;
    struct tm tm;
    char t[40];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(t, sizeof(t), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(t + n, sizeof(t) - n, ".%03ldZ", ts.tv_nsec / 1000000);
    line_puts(l, t);
}

static void log_emit(idem_log_level_t level, const char *msg, va_list fields)
{
    line_t l = {.len = 0};
    const char *k, *v;

    if (log_format == IDEM_LOG_JSON) {
        line_puts(&l, "{\"ts\":\"");
        line_put_time(&l);
        line_puts(&l, "\",\"level\":\"");
        line_puts(&l, idem_log_level2str(level));
        line_puts(&l, "\",\"msg\":\"");
        line_put_json(&l, msg);
        line_putc(&l, '"');
        if (*log_group) {
            line_puts(&l, ",\"group\":\"");
            line_put_json(&l, log_group);
            line_putc(&l, '"');
        }
        if (*log_member) {
            line_puts(&l, ",\"member\":\"");
            line_put_json(&l, log_member);
            line_putc(&l, '"');
        }
        while ((k = va_arg(fields, const char *)) != NULL) {
            v = va_arg(fields, const char *);
            if ((*log_group && !strcmp(k, "group")) ||
                (*log_member && !strcmp(k, "member")))
                continue; /* written once, above */
            line_puts(&l, ",\"");
            line_put_json(&l, k);
            line_puts(&l, "\":");
            if (idem_log_numeric_key(k)) {
                line_puts(&l, v && is_json_number(v) ? v : "null");
                continue;
            }
            line_putc(&l, '"');
            line_put_json(&l, v ? v : "");
            line_putc(&l, '"');
        }
        line_putc(&l, '}');
    } else {
        line_put_time(&l);
        line_putc(&l, ' ');
        line_puts(&l, idem_log_level2str(level));
        line_putc(&l, ' ');
        line_puts(&l, msg);
        while ((k = va_arg(fields, const char *)) != NULL) {
            v = va_arg(fields, const char *);
            line_putc(&l, ' ');
            line_puts(&l, k);
            line_putc(&l, '=');
            line_puts(&l, v ? v : "");
        }
    }
    l.buf[l.len++] = '\n';
    ssize_t off = 0;
    while ((size_t)off < l.len) {
        ssize_t w = write(log_fd, l.buf + off, l.len - (size_t)off);
        if (w <= 0)
            break;
        off += w;
    }
}

void idem_log_kv(idem_log_level_t level, const char *msg, ...)
{
    va_list ap;
    if (!idem_log_enabled(level))
        return;
    va_start(ap, msg);
    log_emit(level, msg, ap);
    va_end(ap);
}

/* Forwards to log_emit with an empty field list. */
static void log_emit_nofields(idem_log_level_t level, const char *msg, ...)
{
    va_list ap;
    va_start(ap, msg);
    log_emit(level, msg, ap);
    va_end(ap);
}

void idem_log(idem_log_level_t level, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    if (!idem_log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_emit_nofields(level, msg, NULL);
}

void idem_log_rdkafka(const rd_kafka_t *rk, int level, const char *facility,
                      const char *buf)
{
    idem_log_level_t l = level <= 3   ? IDEM_LOG_ERROR
                         : level <= 4 ? IDEM_LOG_WARN
                         : level <= 6 ? IDEM_LOG_INFO
                                      : IDEM_LOG_DEBUG;
    if (!strcmp(facility, "CONFWARN"))
        l = IDEM_LOG_DEBUG;
    idem_log_kv(l, buf, "component", "librdkafka", "client",
                rk ? rd_kafka_name(rk) : "", "facility", facility, NULL);
}
