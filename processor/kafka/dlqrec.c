/* dlqrec: one dead letter as `idemproc dlq` sees it: decoding, filters,
 * times, output lines, stats and the headers of a replay. */
#include "kafka/dlqrec.h"
#include "base/util.h"

#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The last value of header `name` as a new string, or NULL. */
static char *hdr_dup(const rd_kafka_headers_t *h, const char *name)
{
    const void *v;
    size_t n;
    if (!h || rd_kafka_header_get_last(h, name, &v, &n) ||
        !v) /* a NULL value is as good as none */
        return NULL;
    char *s = idem_xmalloc(n + 1);
    memcpy(s, v, n);
    s[n] = '\0';
    return s;
}

/* Parses a whole decimal integer; returns 0 or -1. */
static int int64_parse(const char *s, int64_t *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end)
        return -1;
    *out = v;
    return 0;
}

static int64_t hdr_int(const rd_kafka_headers_t *h, const char *name,
                       int64_t dflt)
{
    char *s = hdr_dup(h, name);
    int64_t v;
    if (int64_parse(s, &v))
        v = dflt;
    free(s);
    return v;
}

/* A big-endian integer header of exactly `bytes` bytes (Spring's
 * encoding), or dflt. */
static int64_t hdr_be(const rd_kafka_headers_t *h, const char *name,
                      size_t bytes, int64_t dflt)
{
    const void *v;
    size_t n;
    if (!h || rd_kafka_header_get_last(h, name, &v, &n) || !v || n != bytes)
        return dflt;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++)
        x = x << 8 | ((const unsigned char *)v)[i];
    return bytes == 4 ? (int64_t)(int32_t)(uint32_t)x : (int64_t)x;
}

/* Fills what the dlq.* headers did not give from Spring's kafka_dlt-*
 * ones (dlq.headers.format=spring, or a DLQ a Spring application wrote). */
static void decode_spring(idem_dlqrec_t *r, const rd_kafka_headers_t *h)
{
    if (!r->orig_topic)
        r->orig_topic = hdr_dup(h, "kafka_dlt-original-topic");
    if (r->orig_partition < 0)
        r->orig_partition =
            (int32_t)hdr_be(h, "kafka_dlt-original-partition", 4, -1);
    if (r->orig_offset < 0)
        r->orig_offset = hdr_be(h, "kafka_dlt-original-offset", 8, -1);
    if (r->orig_timestamp < 0)
        r->orig_timestamp = hdr_be(h, "kafka_dlt-original-timestamp", 8, -1);
    if (!r->group)
        r->group = hdr_dup(h, "kafka_dlt-original-consumer-group");
    if (!r->error)
        r->error = hdr_dup(h, "kafka_dlt-exception-message");
    if (!r->reason) {
        char *fqcn = hdr_dup(h, "kafka_dlt-exception-fqcn");
        size_t pre = strlen("idemproc.");
        if (fqcn && !strncmp(fqcn, "idemproc.", pre)) {
            r->reason = idem_xstrdup(fqcn + pre);
            free(fqcn);
        } else {
            r->reason = fqcn; /* a Java exception class */
        }
    }
    if (!r->failed_at && r->timestamp >= 0) {
        char ts[40]; /* when the dead letter was written */
        r->failed_at = idem_xstrdup(idem_rfc3339(r->timestamp, ts, sizeof(ts)));
    }
}

void idem_dlqrec_decode(idem_dlqrec_t *r, const char *dlq_topic,
                        int32_t partition, int64_t offset, int64_t timestamp,
                        const void *key, size_t key_len, const void *value,
                        size_t value_len, const rd_kafka_headers_t *headers)
{
    memset(r, 0, sizeof(*r));
    r->dlq_topic = dlq_topic;
    r->partition = partition;
    r->offset = offset;
    r->timestamp = timestamp;
    r->key = key;
    r->key_len = key_len;
    r->value = value;
    r->value_len = value_len;
    r->headers = headers;
    r->reason = hdr_dup(headers, "dlq.reason");
    r->error = hdr_dup(headers, "dlq.error");
    r->orig_topic = hdr_dup(headers, "dlq.original.topic");
    r->group = hdr_dup(headers, "dlq.group");
    r->failed_at = hdr_dup(headers, "dlq.failed.at");
    r->replayed_from = hdr_dup(headers, "dlq.replayed.from");
    r->orig_partition = (int32_t)hdr_int(headers, "dlq.original.partition", -1);
    r->orig_offset = hdr_int(headers, "dlq.original.offset", -1);
    r->orig_timestamp = hdr_int(headers, "dlq.original.timestamp", -1);
    r->attempts = (int)hdr_int(headers, "dlq.attempts", 0);
    r->replay_count = (int)hdr_int(headers, "dlq.replay.count", 0);
    r->value_dropped = hdr_int(headers, "dlq.value.dropped", -1);
    decode_spring(r, headers);
    char err[128];
    if (!r->failed_at ||
        idem_dlqtime_parse(r->failed_at, 0, &r->failed_at_ms, err,
                           sizeof(err)) ||
        !strchr(r->failed_at, 'T')) /* not a relative time by accident */
        r->failed_at_ms = -1;
}

void idem_dlqrec_clear(idem_dlqrec_t *r)
{
    free(r->reason);
    free(r->error);
    free(r->orig_topic);
    free(r->group);
    free(r->failed_at);
    free(r->replayed_from);
    memset(r, 0, sizeof(*r));
}

void idem_dlqfilter_init(idem_dlqfilter_t *f)
{
    memset(f, 0, sizeof(*f));
    f->since_ms = INT64_MIN;
    f->until_ms = INT64_MAX;
}

static int str_eq(const char *want, const char *have)
{
    return have && !strcmp(want, have);
}

int idem_dlqfilter_match(const idem_dlqfilter_t *f, const idem_dlqrec_t *r)
{
    if (f->reason && !str_eq(f->reason, r->reason))
        return 0;
    if (f->topic && !str_eq(f->topic, r->orig_topic))
        return 0;
    if (f->group && !str_eq(f->group, r->group))
        return 0;
    if (f->key && (!r->key || strlen(f->key) != r->key_len ||
                   memcmp(f->key, r->key, r->key_len)))
        return 0;
    if (f->grep && (!r->value ||
                    !memmem(r->value, r->value_len, f->grep, strlen(f->grep))))
        return 0;
    if (f->since_ms != INT64_MIN || f->until_ms != INT64_MAX) {
        if (r->failed_at_ms < 0 || r->failed_at_ms < f->since_ms ||
            r->failed_at_ms >= f->until_ms)
            return 0;
    }
    return 1;
}

/* "90s", "15m", "2h", "7d", "1w", "500ms" ago. Returns 0 or -1. */
static int relative_parse(const char *s, int64_t now_ms, int64_t *out)
{
    char *end;
    if (!isdigit((unsigned char)*s))
        return -1;
    long long n = strtoll(s, &end, 10);
    int64_t unit;
    if (!strcmp(end, "ms"))
        unit = 1;
    else if (!strcmp(end, "s"))
        unit = 1000;
    else if (!strcmp(end, "m"))
        unit = 60000;
    else if (!strcmp(end, "h"))
        unit = 3600000;
    else if (!strcmp(end, "d"))
        unit = 86400000;
    else if (!strcmp(end, "w"))
        unit = 7 * 86400000LL;
    else
        return -1;
    if (n < 0 || n > INT64_MAX / unit / 2)
        return -1;
    *out = now_ms - n * unit;
    return 0;
}

/* Days in month mo (1..12) of year y, Gregorian. */
static int month_days(int y, int mo)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return mo == 2 && leap ? 29 : days[mo - 1];
}

/* Whether y-mo-d h:mi:sec names a moment that exists (timegm would roll
 * 2026-02-31 over into March): -1 with why, naming the value, or 0. A
 * leap second (23:59:60) exists. */
static int moment_check(const char *s, int y, int mo, int d, int h, int mi,
                        int sec, char *why, size_t why_size)
{
    if (mo < 1 || mo > 12) {
        snprintf(why, why_size, "\"%s\": no month %02d (01..12)", s, mo);
        return -1;
    }
    if (d < 1 || d > month_days(y, mo)) {
        snprintf(why, why_size, "\"%s\": no day %02d in %04d-%02d (%d days)", s,
                 d, y, mo, month_days(y, mo));
        return -1;
    }
    if (h > 23 || mi > 59 || sec > 60 || (sec == 60 && (h != 23 || mi != 59))) {
        snprintf(why, why_size,
                 "\"%s\": no time of day %02d:%02d:%02d (00:00:00..23:59:59)",
                 s, h, mi, sec);
        return -1;
    }
    return 0;
}

/* RFC 3339 date-time or a plain date (midnight UTC). Returns 0, -1 when s
 * is not written as one, -2 when it is but names no moment (why says so). */
static int rfc3339_parse(const char *s, int64_t *out, char *why,
                         size_t why_size)
{
    int y, mo, d, h = 0, mi = 0, sec = 0, n = 0;
    if (sscanf(s, "%4d-%2d-%2d%n", &y, &mo, &d, &n) != 3 || n != 10)
        return -1;
    const char *p = s + n;
    int64_t ms = 0, off_min = 0;
    if (*p) {
        if (*p != 'T' && *p != 't' && *p != ' ')
            return -1;
        p++;
        if (sscanf(p, "%2d:%2d:%2d%n", &h, &mi, &sec, &n) != 3 || n != 8)
            return -1;
        p += n;
        if (*p == '.') {
            int64_t scale = 100;
            p++;
            if (!isdigit((unsigned char)*p))
                return -1;
            for (; isdigit((unsigned char)*p); p++, scale /= 10)
                ms += (*p - '0') * scale;
        }
        if (*p == 'Z' || *p == 'z') {
            p++;
        } else if (*p == '+' || *p == '-') {
            int oh, om;
            if (sscanf(p + 1, "%2d:%2d%n", &oh, &om, &n) != 2 || n != 5 ||
                oh > 23 || om > 59)
                return -1;
            off_min = (oh * 60 + om) * (*p == '-' ? -1 : 1);
            p += 1 + n;
        } else {
            return -1; /* RFC 3339 requires the offset */
        }
        if (*p)
            return -1;
    }
    if (moment_check(s, y, mo, d, h, mi, sec, why, why_size))
        return -2;
    struct tm tm = {.tm_year = y - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = sec};
    time_t t = timegm(&tm);
    *out = ((int64_t)t - off_min * 60) * 1000 + ms;
    return 0;
}

int idem_dlqtime_parse(const char *s, int64_t now_ms, int64_t *out,
                       char *errstr, size_t errstr_size)
{
    if (s && !relative_parse(s, now_ms, out))
        return 0;
    int rc = s ? rfc3339_parse(s, out, errstr, errstr_size) : -1;
    if (rc == 0 || rc == -2)
        return rc ? -1 : 0;
    snprintf(errstr, errstr_size,
             "\"%s\" is not a time: use RFC 3339 (2026-11-30T16:00:00Z) or "
             "a duration ago (90s, 15m, 2h, 7d)",
             s ? s : "");
    return -1;
}

/* Length of p[0..max) cut back to a UTF-8 character boundary: by at most
 * 3 bytes, so a run of stray continuation bytes is still cut near max. */
static size_t utf8_cut(const unsigned char *p, size_t len, size_t max)
{
    if (len <= max)
        return len;
    size_t n = max;
    while (n > 0 && max - n < 3 && (p[n] & 0xC0) == 0x80) /* continues */
        n--;
    return (p[n] & 0xC0) == 0x80 ? max : n;
}

/* Sets name to the bytes as a JSON string, or name_hex when they are not
 * UTF-8. */
static void json_set_bytes(json_t *o, const char *name, const void *p, size_t n)
{
    json_t *s = json_stringn(p ? p : "", n);
    if (s) {
        json_object_set_new(o, name, s);
        return;
    }
    char *hex = idem_xmalloc(2 * n + 1);
    for (size_t i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)p)[i]);
    char key[64];
    snprintf(key, sizeof(key), "%s_hex", name);
    json_object_set_new(o, key, json_stringn(hex, 2 * n));
    free(hex);
}

static void json_set_str(json_t *o, const char *name, const char *v)
{
    if (v)
        json_set_bytes(o, name, v, strlen(v));
}

static int added_in_dlq(const char *name);

/* The bytes as a JSON string, or {"hex": ...} when they are not UTF-8. */
static json_t *json_string_or_hex(const void *p, size_t n)
{
    json_t *s = json_stringn(p, n);
    if (s)
        return s;
    char *hex = idem_xmalloc(2 * n + 1);
    for (size_t k = 0; k < n; k++)
        snprintf(hex + 2 * k, 3, "%02x", ((const unsigned char *)p)[k]);
    s = json_pack("{s:s%}", "hex", hex, 2 * n);
    free(hex);
    return s;
}

/* The original headers as [[name, value], ...]; a name or value that is not
 * UTF-8 as {"hex": ...} (a foreign producer's header name too: it used to
 * drop the whole header). */
static json_t *json_headers(const rd_kafka_headers_t *h)
{
    json_t *a = json_array();
    const char *name;
    const void *v;
    size_t n;
    for (size_t i = 0; h && !rd_kafka_header_get_all(h, i, &name, &v, &n);
         i++) {
        if (added_in_dlq(name))
            continue;
        json_t *pair = json_array();
        json_array_append_new(pair, json_string_or_hex(name, strlen(name)));
        json_array_append_new(pair, v ? json_string_or_hex(v, n) : json_null());
        json_array_append_new(a, pair);
    }
    return a;
}

void idem_dlqrec_print_json(const idem_dlqrec_t *r, long max_bytes, FILE *out)
{
    json_t *o = json_object();
    json_object_set_new(o, "dlq_partition", json_integer(r->partition));
    json_object_set_new(o, "dlq_offset", json_integer(r->offset));
    json_set_str(o, "reason", r->reason);
    json_set_str(o, "error", r->error);
    json_set_str(o, "failed_at", r->failed_at);
    json_set_str(o, "original_topic", r->orig_topic);
    if (r->orig_partition >= 0)
        json_object_set_new(o, "original_partition",
                            json_integer(r->orig_partition));
    if (r->orig_offset >= 0)
        json_object_set_new(o, "original_offset", json_integer(r->orig_offset));
    if (r->orig_timestamp >= 0) {
        char ts[40];
        json_object_set_new(
            o, "original_timestamp",
            json_string(idem_rfc3339(r->orig_timestamp, ts, sizeof(ts))));
    }
    json_set_str(o, "group", r->group);
    json_object_set_new(o, "attempts", json_integer(r->attempts));
    json_object_set_new(o, "replay_count", json_integer(r->replay_count));
    json_set_str(o, "replayed_from", r->replayed_from);
    if (r->identity)
        json_set_bytes(o, "identity", r->identity, r->identity_len);
    else if (r->identity_error)
        json_set_str(o, "identity_error", r->identity_error);
    json_object_set_new(o, "headers", json_headers(r->headers));
    if (r->key)
        json_set_bytes(o, "key", r->key, r->key_len);
    else
        json_object_set_new(o, "key", json_null());
    size_t shown = r->value_len;
    if (max_bytes >= 0)
        shown = utf8_cut(r->value, r->value_len, (size_t)max_bytes);
    json_set_bytes(o, "value", r->value, shown);
    json_object_set_new(o, "value_bytes",
                        json_integer((json_int_t)r->value_len));
    if (shown < r->value_len)
        json_object_set_new(o, "value_truncated", json_true());
    if (r->value_dropped >= 0)
        json_object_set_new(o, "value_dropped", json_integer(r->value_dropped));
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    fprintf(out, "%s\n", line);
    free(line);
    json_decref(o);
}

/* The length of the well-formed UTF-8 character at b[0..n) (RFC 3629: no
 * overlong forms, no surrogates, at most U+10FFFF), or 0 when there is
 * none. */
static size_t utf8_char(const unsigned char *b, size_t n)
{
    size_t len;
    unsigned min;
    unsigned c;
    if (b[0] < 0x80)
        return 1;
    if (b[0] >= 0xC2 && b[0] <= 0xDF)
        len = 2, min = 0x80, c = b[0] & 0x1F;
    else if (b[0] >= 0xE0 && b[0] <= 0xEF)
        len = 3, min = 0x800, c = b[0] & 0x0F;
    else if (b[0] >= 0xF0 && b[0] <= 0xF4)
        len = 4, min = 0x10000, c = b[0] & 0x07;
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((b[i] & 0xC0) != 0x80)
            return 0;
        c = c << 6 | (b[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    return len;
}

/* Writes bytes for a person's terminal: well-formed UTF-8 and printable
 * ASCII as they are; control characters (C0, DEL, C1) and every byte that
 * is not part of a well-formed UTF-8 character as \xNN, so a dead letter
 * can neither garble the terminal nor hide what it holds. */
static void text_bytes(const void *p, size_t n, FILE *out)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_char(b + i, n - i);
        int control = len == 1 ? b[i] < 0x20 || b[i] == 0x7f
                               : len == 2 && b[i] == 0xC2 && b[i + 1] < 0xA0;
        if (len && !control) {
            fwrite(b + i, 1, len, out);
            i += len;
            continue;
        }
        for (size_t k = 0; k < (len ? len : 1); k++)
            fprintf(out, "\\x%02x", b[i + k]);
        i += len ? len : 1;
    }
}

/* text_bytes of p[0..n) cut to max_bytes (-1: whole) on a character
 * boundary, saying how long it really was when cut. */
static void text_field(const void *p, size_t n, long max_bytes, FILE *out)
{
    size_t shown = n;
    if (max_bytes >= 0)
        shown = utf8_cut(p, n, (size_t)max_bytes);
    text_bytes(p, shown, out);
    if (shown < n)
        fprintf(out, " ... (%zu of %zu bytes)", shown, n);
}

/* A decoded dlq.* header for text (escaped like any other bytes), or
 * `missing` (printed as it is) when the header was not there. */
static void text_str(const char *v, const char *missing, long max_bytes,
                     FILE *out)
{
    if (v)
        text_field(v, strlen(v), max_bytes, out);
    else
        fputs(missing, out);
}

void idem_dlqrec_print_text(const idem_dlqrec_t *r, long max_bytes, FILE *out)
{
    fprintf(out, "%s/%" PRId32 "/%" PRId64 "  ", r->dlq_topic, r->partition,
            r->offset);
    text_str(r->reason, "(no reason)", max_bytes, out);
    fputs("  ", out);
    text_str(r->failed_at, "(no dlq.failed.at)", max_bytes, out);
    fputs("\n  error:    ", out);
    text_str(r->error, "", max_bytes, out);
    fputs("\n  original: ", out);
    text_str(r->orig_topic, "?", max_bytes, out);
    fprintf(out, "/%" PRId32 "/%" PRId64, r->orig_partition, r->orig_offset);
    if (r->orig_timestamp >= 0) {
        char ts[40];
        fprintf(out, " at %s", idem_rfc3339(r->orig_timestamp, ts, sizeof(ts)));
    }
    fputs(", group ", out);
    text_str(r->group, "?", max_bytes, out);
    fprintf(out, ", attempts %d, replays %d\n", r->attempts, r->replay_count);
    if (r->replayed_from) {
        fputs("  replayed from: ", out);
        text_str(r->replayed_from, "", max_bytes, out);
        fputc('\n', out);
    }
    if (r->identity) {
        fputs("  identity: ", out);
        text_field(r->identity, r->identity_len, max_bytes, out);
        fputc('\n', out);
    } else if (r->identity_error) {
        fprintf(out, "  identity: (none: %s)\n", r->identity_error);
    }
    const char *name;
    const void *v;
    size_t n;
    for (size_t i = 0;
         r->headers && !rd_kafka_header_get_all(r->headers, i, &name, &v, &n);
         i++) {
        if (added_in_dlq(name))
            continue;
        fputs("  header:   ", out);
        text_field(name, strlen(name), max_bytes, out);
        fputs(": ", out);
        if (v)
            text_field(v, n, max_bytes, out);
        else
            fputs("(null)", out);
        fputc('\n', out);
    }
    fputs("  key:      ", out);
    if (r->key)
        text_field(r->key, r->key_len, max_bytes, out);
    else
        fputs("(null)", out);
    fputs("\n  value:    ", out);
    text_field(r->value, r->value_len, max_bytes, out);
    if (r->value_dropped >= 0)
        fprintf(out, "(dropped: %" PRId64 " bytes, too large for the DLQ)",
                r->value_dropped);
    fputs("\n", out);
}

/* ---- stats ---- */

typedef struct {
    char *name;
    long count;
} tally_t;

#define NO_HEADER "(none)"  /* the tally of records without the header */
#define NO_VALUE  "(empty)" /* how text shows an empty value's tally */

typedef struct {
    int32_t partition;
    int64_t low, high;
} part_t;

struct idem_dlqstats_s {
    long written;
    long replays; /* dead letters of replayed records */
    tally_t *reasons, *topics;
    size_t reason_cnt, topic_cnt;
    char **originals; /* "topic/partition/offset", for the distinct count */
    size_t orig_cnt, orig_cap;
    int64_t oldest_ms, newest_ms;
    char oldest[64], newest[64];
    part_t *parts;
    size_t part_cnt;
};

idem_dlqstats_t *idem_dlqstats_new(void)
{
    idem_dlqstats_t *s = idem_xcalloc(1, sizeof(*s));
    s->oldest_ms = -1;
    s->newest_ms = -1;
    return s;
}

static void tallies_free(tally_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(t[i].name);
    free(t);
}

void idem_dlqstats_destroy(idem_dlqstats_t *s)
{
    if (!s)
        return;
    tallies_free(s->reasons, s->reason_cnt);
    tallies_free(s->topics, s->topic_cnt);
    for (size_t i = 0; i < s->orig_cnt; i++)
        free(s->originals[i]);
    free(s->originals);
    free(s->parts);
    free(s);
}

static void tally(tally_t **t, size_t *n, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp((*t)[i].name, name)) {
            (*t)[i].count++;
            return;
        }
    *t = idem_xrealloc(*t, (*n + 1) * sizeof(**t));
    (*t)[*n].name = idem_xstrdup(name);
    (*t)[*n].count = 1;
    (*n)++;
}

void idem_dlqstats_add(idem_dlqstats_t *s, const idem_dlqrec_t *r)
{
    s->written++;
    if (r->replay_count > 0)
        s->replays++;
    tally(&s->reasons, &s->reason_cnt, r->reason ? r->reason : NO_HEADER);
    tally(&s->topics, &s->topic_cnt, r->orig_topic ? r->orig_topic : NO_HEADER);
    char buf[600];
    if (r->orig_topic && r->orig_partition >= 0 && r->orig_offset >= 0)
        snprintf(buf, sizeof(buf), "%s/%" PRId32 "/%" PRId64, r->orig_topic,
                 r->orig_partition, r->orig_offset);
    else /* unknown original: each such dead letter counts once */
        snprintf(buf, sizeof(buf), "\x01%s/%" PRId32 "/%" PRId64, r->dlq_topic,
                 r->partition, r->offset);
    if (s->orig_cnt == s->orig_cap) {
        s->orig_cap = s->orig_cap ? 2 * s->orig_cap : 256;
        s->originals =
            idem_xrealloc(s->originals, s->orig_cap * sizeof(*s->originals));
    }
    s->originals[s->orig_cnt++] = idem_xstrdup(buf);
    if (r->failed_at_ms >= 0) {
        if (s->oldest_ms < 0 || r->failed_at_ms < s->oldest_ms) {
            s->oldest_ms = r->failed_at_ms;
            snprintf(s->oldest, sizeof(s->oldest), "%s", r->failed_at);
        }
        if (r->failed_at_ms > s->newest_ms) {
            s->newest_ms = r->failed_at_ms;
            snprintf(s->newest, sizeof(s->newest), "%s", r->failed_at);
        }
    }
}

void idem_dlqstats_partition(idem_dlqstats_t *s, int32_t partition, int64_t low,
                             int64_t high)
{
    s->parts = idem_xrealloc(s->parts, (s->part_cnt + 1) * sizeof(*s->parts));
    s->parts[s->part_cnt++] = (part_t){partition, low, high};
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static long distinct(idem_dlqstats_t *s)
{
    if (!s->orig_cnt)
        return 0; /* qsort's base may not be NULL, even for 0 elements */
    qsort(s->originals, s->orig_cnt, sizeof(*s->originals), str_cmp);
    long n = 0;
    for (size_t i = 0; i < s->orig_cnt; i++)
        if (i == 0 || strcmp(s->originals[i], s->originals[i - 1]))
            n++;
    return n;
}

static int tally_cmp(const void *a, const void *b)
{
    const tally_t *x = a, *y = b;
    if (x->count != y->count)
        return x->count < y->count ? 1 : -1;
    return strcmp(x->name, y->name);
}

static int64_t gone(const idem_dlqstats_t *s)
{
    int64_t n = 0;
    for (size_t i = 0; i < s->part_cnt; i++)
        n += s->parts[i].low;
    return n;
}

/* Rows of a table: an empty name as (empty), which would be a blank row;
 * *empty and *none are set when such rows were printed. */
static void tally_print(const tally_t *t, size_t n, int *empty, int *none,
                        FILE *out)
{
    for (size_t i = 0; i < n; i++) {
        const char *name = t[i].name[0] ? t[i].name : NO_VALUE;
        *empty |= !t[i].name[0];
        *none |= !strcmp(t[i].name, NO_HEADER);
        fprintf(out, "  %-18s %8ld\n", name, t[i].count);
    }
}

void idem_dlqstats_print(idem_dlqstats_t *s, const char *dlq_topic, FILE *out)
{
    if (!s->written) {
        fprintf(out, "dlq %s is empty: no dead letters in its %zu partitions",
                dlq_topic, s->part_cnt);
        if (gone(s))
            fprintf(out, " (%" PRId64 " earlier ones are gone)", gone(s));
        fputs("\n", out);
    } else {
        fprintf(out, "dlq %s: %ld dead letters, %ld distinct originals",
                dlq_topic, s->written, distinct(s));
        if (s->replays)
            fprintf(out, ", %ld of them replays that failed again", s->replays);
        fputs("\n", out);
        fprintf(out, "  oldest failed.at %s\n  newest failed.at %s\n",
                s->oldest_ms >= 0 ? s->oldest : "?",
                s->newest_ms >= 0 ? s->newest : "?");
    }
    for (size_t i = 0; i < s->part_cnt; i++)
        if (s->parts[i].low > 0)
            fprintf(out,
                    "  partition %" PRId32 " starts at offset %" PRId64
                    ": %" PRId64 " earlier dead letters are gone\n",
                    s->parts[i].partition, s->parts[i].low, s->parts[i].low);
    if (!s->written)
        return;
    if (s->reason_cnt)
        qsort(s->reasons, s->reason_cnt, sizeof(*s->reasons), tally_cmp);
    if (s->topic_cnt)
        qsort(s->topics, s->topic_cnt, sizeof(*s->topics), tally_cmp);
    int empty = 0, none = 0;
    fputs("by reason:\n", out);
    tally_print(s->reasons, s->reason_cnt, &empty, &none, out);
    if (empty)
        fputs("  (empty: dlq.reason is there but empty; --reason '' selects "
              "them)\n",
              out);
    if (none)
        fputs("  (none: no dlq.reason header, as in a dead letter another "
              "tool wrote)\n",
              out);
    empty = none = 0;
    fputs("by original topic:\n", out);
    tally_print(s->topics, s->topic_cnt, &empty, &none, out);
    if (empty)
        fputs("  (empty: dlq.original.topic is there but empty)\n", out);
    if (none)
        fputs("  (none: no dlq.original.topic header)\n", out);
}

void idem_dlqstats_print_json(idem_dlqstats_t *s, const char *dlq_topic,
                              FILE *out)
{
    json_t *o = json_object();
    json_object_set_new(o, "topic", json_string(dlq_topic));
    json_object_set_new(o, "written", json_integer(s->written));
    json_object_set_new(o, "distinct", json_integer(distinct(s)));
    json_object_set_new(o, "replays", json_integer(s->replays));
    json_object_set_new(o, "gone", json_integer(gone(s)));
    json_object_set_new(o, "oldest_failed_at",
                        s->oldest_ms >= 0 ? json_string(s->oldest)
                                          : json_null());
    json_object_set_new(o, "newest_failed_at",
                        s->newest_ms >= 0 ? json_string(s->newest)
                                          : json_null());
    json_t *by = json_object();
    for (size_t i = 0; i < s->reason_cnt; i++)
        json_object_set_new(by, s->reasons[i].name,
                            json_integer(s->reasons[i].count));
    json_object_set_new(o, "by_reason", by);
    by = json_object();
    for (size_t i = 0; i < s->topic_cnt; i++)
        json_object_set_new(by, s->topics[i].name,
                            json_integer(s->topics[i].count));
    json_object_set_new(o, "by_topic", by);
    json_t *parts = json_array();
    for (size_t i = 0; i < s->part_cnt; i++) {
        json_t *p = json_object();
        json_object_set_new(p, "partition",
                            json_integer(s->parts[i].partition));
        json_object_set_new(p, "low", json_integer(s->parts[i].low));
        json_object_set_new(p, "high", json_integer(s->parts[i].high));
        json_array_append_new(parts, p);
    }
    json_object_set_new(o, "partitions", parts);
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    fprintf(out, "%s\n", line);
    free(line);
    json_decref(o);
}

/* ---- replay ---- */

static int added_in_dlq(const char *name)
{
    return !strncmp(name, "dlq.", 4) || !strncmp(name, "kafka_dlt-", 10);
}

rd_kafka_headers_t *idem_dlqrec_replay_headers(const idem_dlqrec_t *r)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    const char *name;
    const void *v;
    size_t n;
    for (size_t i = 0;
         r->headers && !rd_kafka_header_get_all(r->headers, i, &name, &v, &n);
         i++)
        if (!added_in_dlq(name))
            rd_kafka_header_add(h, name, -1, v, v ? (ssize_t)n : 0);
    char buf[600];
    snprintf(buf, sizeof(buf), "%s/%" PRId32 "/%" PRId64, r->dlq_topic,
             r->partition, r->offset);
    rd_kafka_header_add(h, "dlq.replayed.from", -1, buf, -1);
    snprintf(buf, sizeof(buf), "%d", r->replay_count + 1);
    rd_kafka_header_add(h, "dlq.replay.count", -1, buf, -1);
    return h;
}

const char *idem_dlqrec_refusal(const idem_dlqrec_t *r, int64_t replay_max,
                                int has_target, char *buf, size_t size)
{
    if (r->replay_count >= replay_max)
        snprintf(buf, size,
                 "replayed %d times already (dlq.replay.max=%" PRId64
                 "): fix the cause, or raise dlq.replay.max",
                 r->replay_count, replay_max);
    else if (r->value_dropped >= 0)
        snprintf(buf, size,
                 "its value (%" PRId64
                 " bytes) was too large for the DLQ and is not here; the "
                 "original is at %s/%" PRId32 "/%" PRId64,
                 r->value_dropped, r->orig_topic ? r->orig_topic : "?",
                 r->orig_partition, r->orig_offset);
    else if (!has_target && !r->orig_topic)
        snprintf(buf, size, "no dlq.original.topic header (use --to TOPIC)");
    else
        return NULL;
    return buf;
}
