/* envelope: parses and validates one record's value and headers into what
 * the handlers need, or a poison reason with a human-readable error. */
#include "input/envelope.h"

#include "input/envscan.h"
#include "base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define AMOUNT_MAX 1000000000.0 /* largest accepted amount, major units */

/* Parsing a record with jansson costs ~25 small allocations, and malloc and
 * free were the largest cost of the processing thread. While a record is
 * parsed, jansson's allocations come from a per-thread bump arena that is
 * reset after the record; everything else (other threads, other callers)
 * still uses malloc. free() of an arena pointer does nothing. */
#define ARENA_SIZE                                                             \
    (256 * 1024) /* a record needs a few KiB; larger ones                      \
                    spill over to malloc */

typedef struct {
    char *base;
    size_t used;
    int active;
} arena_t;

static _Thread_local arena_t arena;

static void *arena_malloc(size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (arena.active && arena.base && arena.used + size <= ARENA_SIZE) {
        void *ptr = arena.base + arena.used;
        arena.used += size;
        return ptr;
    }
    return malloc(size);
}

static void arena_free(void *ptr)
{
    char *c = ptr;
    if (arena.base && c >= arena.base && c < arena.base + ARENA_SIZE)
        return;
    free(ptr);
}

/* Starts the arena for one record. The allocator is installed on first
 * use; installing it late is harmless, since outside an active arena it is
 * malloc and free. Each thread has its own arena, made on its first use
 * and kept for the thread's life. */
static void arena_begin(void)
{
    static atomic_int installed;
    if (!atomic_exchange(&installed, 1))
        json_set_alloc_funcs(arena_malloc, arena_free);
    if (!arena.base)
        arena.base = malloc(ARENA_SIZE);
    arena.used = 0;
    arena.active = arena.base != NULL;
}

static void arena_end(void)
{
    arena.active = 0;
    arena.used = 0;
}

#define AMOUNT_MAX_CENTS 100000000000LL /* AMOUNT_MAX in minor units */

int idem_amount_parse(const char *text, size_t len, int64_t *minor,
                      char *errstr, size_t errstr_size)
{
    int shown = len > 64 ? 64 : (int)len; /* the literal, as quoted */
    size_t i = 0;
    int neg = 0;
    if (i < len && text[i] == '-')
        neg = 1, i++;
    /* value = S * 10^k with S the significant digits without trailing zeros
     * (at most 13 kept: with more the amount is either above the maximum or
     * has too many decimals, which k and the count tell), k = exponent -
     * fraction digits + trailing zeros. */
    int64_t sig = 0;
    long long sig_digits = 0, extra = 0; /* extra: digits past the 13 kept */
    long long zeros = 0;                 /* pending trailing zeros of S */
    long long k = 0;
    int any = 0, frac = 0;
    for (; i < len; i++) {
        char c = text[i];
        if (c == '.' && !frac) {
            frac = 1;
            continue;
        }
        if (c < '0' || c > '9')
            break;
        any = 1;
        if (frac)
            k--;
        if (c == '0') {
            if (sig_digits)
                zeros++;
            continue;
        }
        /* A nonzero digit: the pending zeros belong to S. */
        for (; zeros > 0; zeros--)
            if (sig_digits < 13)
                sig = sig * 10, sig_digits++;
            else
                extra++;
        if (sig_digits < 13)
            sig = sig * 10 + (c - '0'), sig_digits++;
        else
            extra++;
    }
    k += zeros; /* trailing zeros of S go to the exponent */
    if (i < len && (text[i] == 'e' || text[i] == 'E')) {
        i++;
        int eneg = 0;
        if (i < len && (text[i] == '+' || text[i] == '-'))
            eneg = text[i++] == '-';
        long long e = 0; /* capped far beyond any value's length */
        int edigits = 0;
        for (; i < len && text[i] >= '0' && text[i] <= '9'; i++, edigits++)
            if (e < 100000000000LL)
                e = e * 10 + (text[i] - '0');
        if (!edigits)
            any = 0;
        k += eneg ? -e : e;
    }
    if (!any || i != len) {
        snprintf(errstr, errstr_size, "amount: %.*s is not a number", shown,
                 text);
        return -1;
    }
    if (neg || (sig_digits == 0 && !extra)) {
        snprintf(errstr, errstr_size,
                 "amount: %.*s must be above 0 and at most %.0f", shown, text,
                 AMOUNT_MAX);
        return -1;
    }
    /* The last significant digit (kept or not) is at 10^k. */
    if (k < -2) {
        snprintf(errstr, errstr_size, "amount: %.*s has more than 2 decimals",
                 shown, text);
        return -1;
    }
    /* cents = S * 10^(k+2): at most 12 digits when in range. */
    long long scale = k + 2;
    int64_t cents = sig;
    int too_large = sig_digits + extra + scale > 12;
    for (long long j = 0; !too_large && j < scale; j++)
        cents *= 10;
    if (too_large || cents > AMOUNT_MAX_CENTS) {
        snprintf(errstr, errstr_size,
                 "amount: %.*s must be above 0 and at most %.0f", shown, text,
                 AMOUNT_MAX);
        return -1;
    }
    *minor = cents;
    return 0;
}

/* A small scanner over JSON that jansson has already accepted. */
static size_t skip_ws(const char *b, size_t len, size_t i)
{
    while (i < len &&
           (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
        i++;
    return i;
}

static size_t skip_string(const char *b, size_t len, size_t i)
{
    for (i++; i < len && b[i] != '"'; i++)
        if (b[i] == '\\')
            i++;
    return i + 1;
}

static size_t skip_value(const char *b, size_t len, size_t i)
{
    if (i < len && b[i] == '"')
        return skip_string(b, len, i);
    if (i < len && (b[i] == '{' || b[i] == '[')) {
        int depth = 0;
        while (i < len) {
            if (b[i] == '"') {
                i = skip_string(b, len, i);
                continue;
            }
            if (b[i] == '{' || b[i] == '[')
                depth++;
            else if ((b[i] == '}' || b[i] == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return i;
    }
    while (i < len && b[i] != ',' && b[i] != '}' && b[i] != ']' &&
           b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r')
        i++;
    return i;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Does the JSON string at b[i] (a key, escapes and all) equal name? */
static int key_equals(const char *b, size_t len, size_t i, const char *name)
{
    size_t n = 0, nlen = strlen(name);
    for (i++; i < len && b[i] != '"'; i++, n++) {
        int c = (unsigned char)b[i];
        if (c == '\\' && i + 1 < len) {
            char e = b[++i];
            if (e == 'u' && i + 4 < len) {
                int h[4];
                for (int j = 0; j < 4; j++)
                    h[j] = hexval(b[i + 1 + j]);
                c = h[0] < 0 || h[1] < 0 || h[2] < 0 || h[3] < 0
                        ? -1
                        : (h[0] << 12) | (h[1] << 8) | (h[2] << 4) | h[3];
                i += 4;
                if (c >= 0x80)
                    c = -1; /* never part of an ASCII name */
            } else {
                c = e == 'b'   ? '\b'
                    : e == 'f' ? '\f'
                    : e == 'n' ? '\n'
                    : e == 'r' ? '\r'
                    : e == 't' ? '\t'
                               : e; /* \" \\ \/ */
            }
        }
        if (n >= nlen || c != (unsigned char)name[n])
            return 0;
    }
    return n == nlen;
}

/* Finds the literal text of member `name` of the JSON object in buf (which
 * jansson has already accepted, so it is well-formed). Returns 1 with
 * *at, *at_len set, or 0 when not found. Needed because jansson keeps
 * numbers only as doubles or integers, and the amount rule is about the
 * digits as written. */
static int member_text(const char *b, size_t len, const char *name,
                       const char **at, size_t *at_len)
{
    size_t i = skip_ws(b, len, 0);
    if (i >= len || b[i] != '{')
        return 0;
    i = skip_ws(b, len, i + 1);
    while (i < len && b[i] == '"') {
        int match = key_equals(b, len, i, name);
        i = skip_ws(b, len, skip_string(b, len, i));
        if (i >= len || b[i] != ':')
            return 0;
        i = skip_ws(b, len, i + 1);
        size_t start = i;
        i = skip_value(b, len, i);
        if (match) {
            *at = b + start;
            *at_len = i - start;
            return 1;
        }
        i = skip_ws(b, len, i);
        if (i >= len || b[i] != ',')
            return 0;
        i = skip_ws(b, len, i + 1);
    }
    return 0;
}

/* A record's headers, taken from its message only when a header: source
 * is reached: rd_kafka_message_headers parses them on first use, which
 * costs as much as a small value's whole fast read. */
typedef struct {
    const rd_kafka_headers_t *h;
    rd_kafka_message_t *msg; /* not read yet (NULL: h is all there is) */
} hdrs_t;

static const rd_kafka_headers_t *hdrs_get(hdrs_t *x)
{
    if (x->msg) {
        rd_kafka_headers_t *h;
        x->h = rd_kafka_message_headers(x->msg, &h) ? NULL : h;
        x->msg = NULL;
    }
    return x->h;
}

/* Copies header `name` into out when present: its bytes, NULs included,
 * with their count in *out_len. Returns 1 when found, 0 when absent or
 * empty, -1 when too long. */
static int header_bytes(hdrs_t *hd, const char *name, char *out,
                        size_t out_size, size_t *out_len)
{
    const void *v;
    size_t sz;
    const rd_kafka_headers_t *headers = hdrs_get(hd);
    if (!headers || rd_kafka_header_get_last(headers, name, &v, &sz) != 0 || !v)
        return 0;
    if (sz >= out_size)
        return -1;
    memcpy(out, v, sz);
    out[sz] = '\0';
    *out_len = sz;
    return sz > 0 ? 1 : 0;
}

/* Reads optional string field `name` of obj into out. Returns 1 found,
 * 0 absent, -1 invalid (errstr filled). */
static int field_string(json_t *obj, const char *name, char *out,
                        size_t out_size, size_t *out_len, char *errstr,
                        size_t errstr_size)
{
    json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v)) {
        snprintf(errstr, errstr_size, "%s: must be a string", name);
        return -1;
    }
    size_t l = json_string_length(v);
    if (l == 0) {
        snprintf(errstr, errstr_size, "%s: must not be empty", name);
        return -1;
    }
    if (l >= out_size) {
        snprintf(errstr, errstr_size, "%s: longer than %zu bytes", name,
                 out_size - 1);
        return -1;
    }
    memcpy(out, json_string_value(v), l + 1);
    if (out_len)
        *out_len = l;
    return 1;
}

static int parse_ledger_fields(json_t *obj, const char *value, size_t len,
                               idem_envelope_t *out, char *errstr,
                               size_t errstr_size)
{
    int r = field_string(obj, "user_id", out->user_id, sizeof(out->user_id),
                         NULL, errstr, errstr_size);
    if (r < 0)
        return -1;
    if (r == 0) {
        snprintf(errstr, errstr_size, "user_id: missing");
        return -1;
    }
    json_t *amount = json_object_get(obj, "amount");
    if (!amount) {
        snprintf(errstr, errstr_size, "amount: missing");
        return -1;
    }
    if (!json_is_number(amount)) {
        snprintf(errstr, errstr_size, "amount: must be a JSON number");
        return -1;
    }
    /* The rule is about the digits as written, so the amount is read from
     * the record's own text, not from the double jansson made of it. */
    const char *text;
    size_t text_len;
    if (!member_text(value, len, "amount", &text, &text_len)) {
        snprintf(errstr, errstr_size, "amount: not found in the value's text");
        return -1;
    }
    if (idem_amount_parse(text, text_len, &out->amount_minor, errstr,
                          errstr_size))
        return -1;
    json_t *cur = json_object_get(obj, "currency");
    const char *c = json_is_string(cur) ? json_string_value(cur) : NULL;
    if (!c || json_string_length(cur) != 3 || c[0] < 'A' || c[0] > 'Z' ||
        c[1] < 'A' || c[1] > 'Z' || c[2] < 'A' || c[2] > 'Z') {
        snprintf(errstr, errstr_size,
                 "currency: must be 3 upper-case letters (ISO 4217)");
        return -1;
    }
    memcpy(out->currency, c, 4);
    return 0;
}

char *idem_envelope_set_member(const void *value, size_t len, const char *name,
                               const char *text, size_t *out_len)
{
    const char *v = value, *at;
    size_t at_len, tl = strlen(text), nl = strlen(name);
    char *out = idem_xmalloc(len + nl + tl + 8);
    size_t o = 0;
    if (member_text(v, len, name, &at, &at_len)) {
        memcpy(out, v, (size_t)(at - v));
        o = (size_t)(at - v);
        memcpy(out + o, text, tl);
        o += tl;
        size_t rest = len - (size_t)(at - v) - at_len;
        memcpy(out + o, at + at_len, rest);
        o += rest;
    } else {
        size_t close = len;
        while (close > 0 && v[close - 1] != '}')
            close--;
        close = close ? close - 1 : 0; /* the object's closing brace */
        size_t first = skip_ws(v, len, skip_ws(v, len, 0) + 1);
        int empty = first >= close;
        memcpy(out, v, close);
        o = close;
        o += (size_t)sprintf(out + o, "%s\"%s\":", empty ? "" : ",", name);
        memcpy(out + o, text, tl);
        o += tl;
        memcpy(out + o, v + close, len - close);
        o += len - close;
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

/* ------------------------------------------------ identity sources */

typedef enum { SRC_VALUE, SRC_HEADER, SRC_KEY } src_kind_t;

typedef struct {
    src_kind_t kind;
    char *arg;  /* JSON Pointer (value:) or header name (header:) */
    char *name; /* for messages: "idempotency_key", "event/id", "key" */
    int field;  /* value: a top-level member, scan field number; else -1 */
} src_t;

struct idem_envelope_rules_s {
    int format; /* idem_envelope_format_t */
    int need_ledger;
    size_t max_bytes;
    src_t *id, *mid;
    size_t id_cnt, mid_cnt;
    int id_default; /* the default list: today's message when none found */
    /* The fast read (envscan.c): the steps it follows (the value:
     * sources, user_id, amount, currency for the ledger, then the tokens of
     * the fields' pointers), names owned. 0 in `fast` when a value: source
     * points deeper than the top level, or the steps do not fit; fast_on:
     * the fast read is wanted at all (idem_envelope_rules_fast). */
    int fast, fast_on;
    idem_envscan_step_t steps[IDEM_ENVSCAN_STEPS_MAX];
    size_t nsteps;
    int f_user, f_amount, f_currency;
    char **fields; /* JSON Pointers extracted into envelopes' fields */
    size_t nfields;
    int fstep[IDEM_ENVELOPE_FIELDS_MAX]; /* the step of each field's value */
};

static void scan_plan(idem_envelope_rules_t *r);

/* Why `ptr` is no JSON Pointer (RFC 6901), or NULL when it is one. */
static const char *pointer_bad(const char *ptr)
{
    if (*ptr != '/')
        return "a JSON Pointer starts with '/'";
    for (const char *c = ptr; *c; c++)
        if (*c == '~' && c[1] != '0' && c[1] != '1')
            return "'~' must be followed by 0 or 1";
    return NULL;
}

/* Parses a comma list of sources into *out (NULL errstr: already checked).
 * Returns 0, or -1 with errstr naming `key`. */
static int sources_parse(const char *key, const char *list, src_t **out,
                         size_t *cnt, char *errstr, size_t errstr_size)
{
    *out = NULL;
    *cnt = 0;
    char *copy = idem_xstrdup(list ? list : "");
    char *rest = copy;
    int r = 0;
    for (char *t = strsep(&rest, ","); t; t = strsep(&rest, ",")) {
        while (*t == ' ' || *t == '\t')
            t++;
        size_t l = strlen(t);
        while (l && (t[l - 1] == ' ' || t[l - 1] == '\t'))
            t[--l] = '\0';
        if (!*t) {
            if (!*list)
                break; /* an empty list: no source */
            snprintf(errstr, errstr_size, "%s: empty source in \"%s\"", key,
                     list);
            r = -1;
            break;
        }
        src_t src = {.field = -1};
        if (!strcmp(t, "key")) {
            src.kind = SRC_KEY;
            src.arg = idem_xstrdup("");
            src.name = idem_xstrdup("key");
        } else if (!strncmp(t, "header:", 7) && t[7]) {
            src.kind = SRC_HEADER;
            src.arg = idem_xstrdup(t + 7);
            src.name = idem_xstrdup(t + 7);
        } else if (!strncmp(t, "value:", 6)) {
            const char *ptr = t + 6;
            const char *bad = pointer_bad(ptr);
            if (bad) {
                snprintf(errstr, errstr_size, "%s: \"%s\": %s (RFC 6901)", key,
                         t, bad);
                r = -1;
                break;
            }
            src.kind = SRC_VALUE;
            src.arg = idem_xstrdup(ptr);
            src.name = idem_xstrdup(ptr + 1);
        } else {
            snprintf(errstr, errstr_size,
                     "%s: unknown source \"%s\" (use value:/json/pointer, "
                     "header:NAME or key)",
                     key, t);
            r = -1;
            break;
        }
        *out = idem_xrealloc(*out, (*cnt + 1) * sizeof(**out));
        (*out)[(*cnt)++] = src;
    }
    free(copy);
    return r;
}

static void sources_free(src_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(s[i].arg);
        free(s[i].name);
    }
    free(s);
}

void idem_envelope_pointers_free(char **ptrs, size_t n)
{
    for (size_t i = 0; ptrs && i < n; i++)
        free(ptrs[i]);
    free(ptrs);
}

int idem_envelope_pointers_parse(const char *key, const char *list, char ***out,
                                 size_t *n, char *errstr, size_t errstr_size)
{
    *out = NULL;
    *n = 0;
    char *copy = idem_xstrdup(list ? list : "");
    char *rest = copy;
    int r = 0;
    for (char *t = strsep(&rest, ","); t; t = strsep(&rest, ",")) {
        while (*t == ' ' || *t == '\t')
            t++;
        size_t l = strlen(t);
        while (l && (t[l - 1] == ' ' || t[l - 1] == '\t'))
            t[--l] = '\0';
        const char *bad = NULL;
        char many[64];
        snprintf(many, sizeof(many), "more than %d pointers",
                 IDEM_ENVELOPE_FIELDS_MAX);
        if (!*t && !*n && !rest)
            break; /* an empty list */
        if (!*t)
            bad = "empty entry";
        else if (!(bad = pointer_bad(t)) && *n == IDEM_ENVELOPE_FIELDS_MAX)
            bad = many;
        for (size_t i = 0; !bad && i < *n; i++)
            if (!strcmp((*out)[i], t))
                bad = "listed twice";
        if (bad) {
            snprintf(errstr, errstr_size,
                     "%s: \"%s\": %s (comma list of "
                     "JSON Pointers, RFC 6901, e.g. /user_id,/event/id)",
                     key, t, bad);
            r = -1;
            break;
        }
        *out = idem_xrealloc(*out, (*n + 1) * sizeof(**out));
        (*out)[(*n)++] = idem_xstrdup(t);
    }
    free(copy);
    if (r) {
        idem_envelope_pointers_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return r;
}

int idem_envelope_rules_fields(idem_envelope_rules_t *r, const char *key,
                               const char *list, char *errstr,
                               size_t errstr_size)
{
    char **ptrs;
    size_t n;
    if (idem_envelope_pointers_parse(key, list, &ptrs, &n, errstr, errstr_size))
        return -1;
    if (n && r->format != IDEM_ENVELOPE_JSON) {
        snprintf(errstr, errstr_size,
                 "%s: needs envelope.format=json (with bytes the value is "
                 "not parsed)",
                 key);
        idem_envelope_pointers_free(ptrs, n);
        return -1;
    }
    idem_envelope_pointers_free(r->fields, r->nfields);
    r->fields = ptrs;
    r->nfields = n;
    scan_plan(r);
    return 0;
}

void idem_envelope_term(idem_envelope_t *env)
{
    if (!env)
        return;
    free(env->fields);
    env->fields = NULL;
    env->nfields = 0;
}

int idem_envelope_sources_check(const char *key, const char *list,
                                int allow_empty, char *errstr,
                                size_t errstr_size)
{
    src_t *s;
    size_t n;
    if (sources_parse(key, list, &s, &n, errstr, errstr_size))
        return -1;
    sources_free(s, n);
    if (!n && !allow_empty) {
        snprintf(errstr, errstr_size, "%s: needs at least one source", key);
        return -1;
    }
    return 0;
}

/* The step for member `name` (`len` bytes) of step `parent`'s value
 * (added when new), or -1 when there is no room. */
static int scan_step(idem_envelope_rules_t *r, int parent, const char *name,
                     size_t len)
{
    for (size_t i = 0; i < r->nsteps; i++)
        if (r->steps[i].parent == parent && r->steps[i].len == len &&
            !memcmp(r->steps[i].name, name, len))
            return (int)i;
    if (r->nsteps == IDEM_ENVSCAN_STEPS_MAX)
        return -1;
    char *copy = idem_xmalloc(len + 1);
    memcpy(copy, name, len);
    copy[len] = '\0';
    r->steps[r->nsteps] = (idem_envscan_step_t){copy, len, parent};
    return (int)r->nsteps++;
}

static int scan_field(idem_envelope_rules_t *r, const char *name)
{
    return scan_step(r, -1, name, strlen(name));
}

/* The step of the value at JSON Pointer `ptr` (its tokens decoded, one
 * step each), or -1 when there is no room or when pointer_get never finds
 * it (a token longer than its buffer). */
static int scan_pointer(idem_envelope_rules_t *r, const char *ptr)
{
    int step = -1;
    char tok[512];
    const char *p = ptr;
    while (*p == '/') {
        p++;
        size_t t = 0;
        for (; *p && *p != '/'; t++) {
            if (t + 1 >= sizeof(tok))
                return -1;
            if (*p == '~') {
                tok[t] = p[1] == '1' ? '/' : '~';
                p += 2;
            } else {
                tok[t] = *p++;
            }
        }
        if ((step = scan_step(r, step, tok, t)) < 0)
            return -1;
    }
    return step;
}

/* Decides whether the fast read can serve these rules: every value: source
 * a plain top-level member ("/name", no '/' or '~' after the first), the
 * fields' pointers any depth (a step per token, shared prefixes one step),
 * at most IDEM_ENVSCAN_STEPS_MAX steps in all. */
static void scan_plan(idem_envelope_rules_t *r)
{
    for (size_t i = 0; i < r->nsteps; i++)
        free((char *)r->steps[i].name);
    r->nsteps = 0;
    r->fast = r->fast_on && r->format == IDEM_ENVELOPE_JSON;
    src_t *lists[2] = {r->id, r->mid};
    size_t cnts[2] = {r->id_cnt, r->mid_cnt};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < cnts[l]; i++) {
            src_t *src = &lists[l][i];
            src->field = -1;
            if (src->kind != SRC_VALUE)
                continue;
            if (strchr(src->arg + 1, '/') || strchr(src->arg + 1, '~') ||
                (src->field = scan_field(r, src->arg + 1)) < 0)
                r->fast = 0;
        }
    if (r->need_ledger && ((r->f_user = scan_field(r, "user_id")) < 0 ||
                           (r->f_amount = scan_field(r, "amount")) < 0 ||
                           (r->f_currency = scan_field(r, "currency")) < 0))
        r->fast = 0;
    for (size_t i = 0; i < r->nfields; i++)
        if ((r->fstep[i] = scan_pointer(r, r->fields[i])) < 0)
            r->fast = 0;
}

idem_envelope_rules_t *idem_envelope_rules_new(int format, const char *identity,
                                               const char *message_id,
                                               int need_ledger,
                                               size_t max_bytes, char *errstr,
                                               size_t errstr_size)
{
    idem_envelope_rules_t *r = idem_xcalloc(1, sizeof(*r));
    r->format = format;
    r->need_ledger = need_ledger;
    r->max_bytes = max_bytes;
    r->id_default = !strcmp(identity, IDEM_ENVELOPE_IDENTITY_DEFAULT);
    r->fast_on = 1;
    if (sources_parse("envelope.identity", identity, &r->id, &r->id_cnt, errstr,
                      errstr_size) ||
        sources_parse("envelope.message.id", message_id, &r->mid, &r->mid_cnt,
                      errstr, errstr_size)) {
        idem_envelope_rules_destroy(r);
        return NULL;
    }
    if (!r->id_cnt) {
        snprintf(errstr, errstr_size,
                 "envelope.identity: needs at least one source");
        idem_envelope_rules_destroy(r);
        return NULL;
    }
    scan_plan(r);
    return r;
}

void idem_envelope_rules_fast(idem_envelope_rules_t *r, int on)
{
    r->fast_on = on;
    scan_plan(r);
}

void idem_envelope_rules_destroy(idem_envelope_rules_t *r)
{
    if (!r)
        return;
    sources_free(r->id, r->id_cnt);
    sources_free(r->mid, r->mid_cnt);
    idem_envelope_pointers_free(r->fields, r->nfields);
    for (size_t i = 0; i < r->nsteps; i++)
        free((char *)r->steps[i].name);
    free(r);
}

/* The JSON value at RFC 6901 pointer `ptr` in root, or NULL. */
static json_t *pointer_get(json_t *root, const char *ptr)
{
    json_t *cur = root;
    char tok[512];
    const char *p = ptr;
    while (cur && *p == '/') {
        p++;
        size_t t = 0;
        while (*p && *p != '/' && t + 1 < sizeof(tok)) {
            if (*p == '~') {
                tok[t++] = p[1] == '1' ? '/' : '~';
                p += 2;
            } else {
                tok[t++] = *p++;
            }
        }
        if (*p && *p != '/')
            return NULL; /* token longer than any key we look up */
        tok[t] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            if (!t || (t > 1 && tok[0] == '0'))
                return NULL;
            unsigned long i = strtoul(tok, &end, 10);
            cur = *end ? NULL : json_array_get(cur, i);
        } else {
            return NULL;
        }
    }
    return cur;
}

/* A field's number: d printed with the fewest of 15..17 significant digits
 * that strtod reads back as d. */
static void number_text(double d, char out[32])
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, 32, "%.*g", prec, d);
        if (strtod(out, NULL) == d)
            break;
    }
}

/* The rules' fields of `root` (NULL: none found) into one new block in
 * out->fields: the array, then each text NUL-terminated. Every value is
 * the one cjson.decode would give for the same bytes: strings decoded,
 * numbers as doubles (printed with the fewest digits that read back the
 * same), objects and arrays as compact JSON for the reader to decode. */
static void fields_extract(const idem_envelope_rules_t *rules, json_t *root,
                           idem_envelope_t *out)
{
    size_t n = rules->nfields;
    json_t *v[IDEM_ENVELOPE_FIELDS_MAX];
    char num[IDEM_ENVELOPE_FIELDS_MAX][32];
    char *dump[IDEM_ENVELOPE_FIELDS_MAX];
    size_t len[IDEM_ENVELOPE_FIELDS_MAX], total = 0;
    idem_field_type_t type[IDEM_ENVELOPE_FIELDS_MAX];
    for (size_t i = 0; i < n; i++) {
        v[i] = root ? pointer_get(root, rules->fields[i]) : NULL;
        dump[i] = NULL;
        len[i] = 0;
        switch (v[i] ? json_typeof(v[i]) : JSON_NULL) {
        case JSON_STRING:
            type[i] = IDEM_FIELD_STRING;
            len[i] = json_string_length(v[i]);
            break;
        case JSON_REAL:
        case JSON_INTEGER: {
            number_text(json_number_value(v[i]), num[i]);
            type[i] = IDEM_FIELD_NUMBER;
            len[i] = strlen(num[i]);
            break;
        }
        case JSON_TRUE:
            type[i] = IDEM_FIELD_TRUE;
            break;
        case JSON_FALSE:
            type[i] = IDEM_FIELD_FALSE;
            break;
        case JSON_OBJECT:
        case JSON_ARRAY:
            type[i] = IDEM_FIELD_JSON;
            dump[i] = json_dumps(v[i], JSON_COMPACT | JSON_ENCODE_ANY |
                                           JSON_REAL_PRECISION(17));
            len[i] = dump[i] ? strlen(dump[i]) : 0;
            break;
        default:
            type[i] = v[i] ? IDEM_FIELD_NULL : IDEM_FIELD_ABSENT;
            break;
        }
        total += len[i] + 1;
    }
    out->fields = idem_xmalloc(n * sizeof(*out->fields) + total);
    out->nfields = n;
    char *text = (char *)(out->fields + n);
    for (size_t i = 0; i < n; i++) {
        const char *src = type[i] == IDEM_FIELD_STRING ? json_string_value(v[i])
                          : type[i] == IDEM_FIELD_NUMBER ? num[i]
                          : dump[i]                      ? dump[i]
                                                         : "";
        memcpy(text, src, len[i]);
        text[len[i]] = '\0';
        out->fields[i] = (idem_envelope_field_t){type[i], text, len[i]};
        text += len[i] + 1;
        arena_free(dump[i]); /* jansson's allocator (the arena, mostly) */
    }
}

/* The value as read for the sources: jansson's tree (NULL with
 * envelope.format=bytes, or in the fast read), and the bytes it came from,
 * read again with integers kept as integers when a source finds a number
 * (the tree reads every number as a real). */
typedef struct {
    json_t *root;
    const void *value;
    size_t len;
    json_t *exact;    /* the second reading, made on first use */
    int exact_failed; /* jansson refused the second reading */
} doc_t;

/* The literal of the number at JSON Pointer `ptr` in the raw value, found
 * by the fast scan (its tokens decoded into one step each), into lit
 * (NUL-terminated). Returns 0, or -1 when the scan cannot tell (see
 * envscan.h: an array on the way, \u escapes, exponents, ...) or the value
 * there is not a number. */
static int number_literal(const void *value, size_t len, const char *ptr,
                          char *lit, size_t lit_size)
{
    idem_envscan_step_t steps[IDEM_ENVSCAN_STEPS_MAX];
    size_t n = 0, plen = strlen(ptr);
    char *names = idem_xmalloc(plen + 1), *w = names;
    const char *p = ptr;
    int rc = -1;
    while (*p == '/') {
        p++;
        char *start = w;
        while (*p && *p != '/') {
            if (*p == '~' && p[1]) {
                *w++ = p[1] == '1' ? '/' : '~';
                p += 2;
            } else {
                *w++ = *p++;
            }
        }
        if (n == IDEM_ENVSCAN_STEPS_MAX)
            goto out;
        steps[n] =
            (idem_envscan_step_t){start, (size_t)(w - start), (int)n - 1};
        n++;
    }
    idem_envscan_field_t f[IDEM_ENVSCAN_STEPS_MAX];
    if (!n || idem_envscan(value, len, steps, n, f) ||
        f[n - 1].kind != IDEM_ENVSCAN_NUMBER || f[n - 1].text_len >= lit_size)
        goto out;
    memcpy(lit, f[n - 1].text, f[n - 1].text_len);
    lit[f[n - 1].text_len] = '\0';
    rc = 0;
out:
    free(names);
    return rc;
}

/* A number at `ptr` as its decimal text when it is a JSON integer within
 * 64 bits (12345, -7; not 1.0, 1e3): a numeric identity such as
 * Debezium's is the same identity as its digits in a string. Returns 1
 * found, -1 otherwise (errstr). The tree reads every number as a real, so
 * the value is read again with integers kept; jansson refuses that reading
 * when any other integer of the value is beyond 64 bits, and then the
 * literal itself is read, as jansson would read it (strtoll). */
static int integer_text(doc_t *doc, const src_t *src, char *out,
                        size_t out_size, size_t *out_len, char *errstr,
                        size_t errstr_size)
{
    if (!doc->exact && !doc->exact_failed) {
        json_error_t jerr;
        doc->exact =
            json_loadb(doc->value, doc->len,
                       JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
        doc->exact_failed = !doc->exact;
    }
    long long i;
    if (doc->exact) {
        json_t *v = pointer_get(doc->exact, src->arg);
        if (!json_is_integer(v))
            goto invalid;
        i = (long long)json_integer_value(v);
    } else {
        char lit[32], *end;
        if (number_literal(doc->value, doc->len, src->arg, lit, sizeof(lit)))
            goto invalid;
        errno = 0;
        i = strtoll(lit, &end, 10);
        if (errno || *end)
            goto invalid; /* beyond 64 bits, a fraction */
    }
    *out_len = (size_t)snprintf(out, out_size, "%lld", i);
    return 1;
invalid:
    snprintf(errstr, errstr_size,
             "%s: must be a string or an integer (within 64 bits)", src->name);
    return -1;
}

/* Reads source `src` into out (its bytes and count). Returns 1 found,
 * 0 absent (or null / empty header), -1 invalid (errstr). */
static int source_read(const src_t *src, doc_t *doc, hdrs_t *headers,
                       const void *key, size_t key_len, char *out,
                       size_t out_size, size_t *out_len, char *errstr,
                       size_t errstr_size)
{
    switch (src->kind) {
    case SRC_KEY:
        if (!key || !key_len)
            return 0;
        if (key_len >= out_size) {
            snprintf(errstr, errstr_size, "key: longer than %zu bytes",
                     out_size - 1);
            return -1;
        }
        memcpy(out, key, key_len);
        out[key_len] = '\0';
        *out_len = key_len;
        return 1;
    case SRC_HEADER: {
        int h = header_bytes(headers, src->arg, out, out_size, out_len);
        if (h < 0)
            snprintf(errstr, errstr_size, "%s: header too long", src->name);
        return h;
    }
    case SRC_VALUE: {
        if (!doc->root)
            return 0; /* envelope.format=bytes: the value is not read */
        json_t *v = pointer_get(doc->root, src->arg);
        if (!v || json_is_null(v))
            return 0;
        if (json_is_number(v))
            return integer_text(doc, src, out, out_size, out_len, errstr,
                                errstr_size);
        if (!json_is_string(v)) {
            snprintf(errstr, errstr_size, "%s: must be a string", src->name);
            return -1;
        }
        size_t l = json_string_length(v);
        if (l == 0) {
            snprintf(errstr, errstr_size, "%s: must not be empty", src->name);
            return -1;
        }
        if (l >= out_size) {
            snprintf(errstr, errstr_size, "%s: longer than %zu bytes",
                     src->name, out_size - 1);
            return -1;
        }
        memcpy(out, json_string_value(v), l);
        out[l] = '\0';
        *out_len = l;
        return 1;
    }
    }
    return 0;
}

/* The first source of list[n] found, into out. 1, 0 or -1 (errstr). */
static int sources_first(const src_t *list, size_t n, doc_t *doc,
                         hdrs_t *headers, const void *key, size_t key_len,
                         char *out, size_t out_size, size_t *out_len,
                         char *errstr, size_t errstr_size)
{
    for (size_t i = 0; i < n; i++) {
        int r = source_read(&list[i], doc, headers, key, key_len, out, out_size,
                            out_len, errstr, errstr_size);
        if (r)
            return r;
    }
    return 0;
}

/* Empties an envelope (the byte arrays only up to their first byte: every
 * reader goes by the lengths or stops at that NUL). */
static void env_clear(idem_envelope_t *out)
{
    out->identity[0] = out->message_id[0] = out->user_id[0] = '\0';
    out->currency[0] = '\0';
    out->identity_len = out->message_id_len = 0;
    out->amount_minor = 0;
    out->json_object = 0;
}

/* The first source of list[n] found, from the fast read's fields f.
 * 1 found, 0 none, -1 when a source is not a plain good string (jansson's
 * read then gives the error). */
static int fast_first(const src_t *list, size_t n,
                      const idem_envscan_field_t *f, hdrs_t *headers,
                      const void *key, size_t key_len, char *out,
                      size_t out_size, size_t *out_len)
{
    char e[128];
    doc_t none = {NULL, NULL, 0, NULL, 0};
    for (size_t i = 0; i < n; i++) {
        if (list[i].kind != SRC_VALUE) {
            int r = source_read(&list[i], &none, headers, key, key_len, out,
                                out_size, out_len, e, sizeof(e));
            if (r)
                return r;
            continue;
        }
        const idem_envscan_field_t *v = &f[list[i].field];
        if (v->kind == IDEM_ENVSCAN_ABSENT || v->kind == IDEM_ENVSCAN_NULL)
            continue;
        if (v->kind == IDEM_ENVSCAN_NUMBER) {
            /* An integer jansson prints back the same (no fraction, no
             * "-0", at most 18 digits) is its own text; jansson's read
             * decides every other number. */
            const char *t = v->text;
            size_t l = v->text_len, d = t[0] == '-';
            if (l == d || l - d > 18 || (d && l == 2 && t[1] == '0') ||
                l >= out_size)
                return -1;
            for (size_t k = d; k < l; k++)
                if (t[k] < '0' || t[k] > '9')
                    return -1;
            memcpy(out, t, l);
            out[l] = '\0';
            *out_len = l;
            return 1;
        }
        if (v->kind != IDEM_ENVSCAN_STRING || v->str_len == 0 ||
            v->str_len >= out_size)
            return -1;
        idem_envscan_string(v, out);
        *out_len = v->str_len;
        return 1;
    }
    return 0;
}

/* The rules' fields from the fast read's f into one new block in
 * out->fields, exactly as fields_extract makes it from jansson's tree.
 * Returns 0, or -1 (nothing allocated) when a field is an object or an
 * array: jansson's read then prints it. */
static int fields_fast(const idem_envelope_rules_t *rules,
                       const idem_envscan_field_t *f, idem_envelope_t *out)
{
    size_t n = rules->nfields, total = 0;
    char num[IDEM_ENVELOPE_FIELDS_MAX][32];
    size_t len[IDEM_ENVELOPE_FIELDS_MAX];
    idem_field_type_t type[IDEM_ENVELOPE_FIELDS_MAX];
    for (size_t i = 0; i < n; i++) {
        const idem_envscan_field_t *v = &f[rules->fstep[i]];
        len[i] = 0;
        switch (v->kind) {
        case IDEM_ENVSCAN_STRING:
            type[i] = IDEM_FIELD_STRING;
            len[i] = v->str_len;
            break;
        case IDEM_ENVSCAN_NUMBER: {
            type[i] = IDEM_FIELD_NUMBER;
            const char *t = v->text;
            size_t digits = v->text_len - (t[0] == '-');
            if (digits <= 15 && !memchr(t, '.', v->text_len)) {
                /* An integer below 1e15: a double holds it exactly and
                 * %.15g prints its digits as written ("-0" too). */
                memcpy(num[i], t, v->text_len);
                num[i][v->text_len] = '\0';
                len[i] = v->text_len;
                break;
            }
            /* What jansson does with JSON_DECODE_INT_AS_REAL: strtod of
             * the literal (at most 300 bytes, no exponent: no overflow). */
            char lit[512];
            memcpy(lit, t, v->text_len);
            lit[v->text_len] = '\0';
            number_text(strtod(lit, NULL), num[i]);
            len[i] = strlen(num[i]);
            break;
        }
        case IDEM_ENVSCAN_TRUE:
            type[i] = IDEM_FIELD_TRUE;
            break;
        case IDEM_ENVSCAN_FALSE:
            type[i] = IDEM_FIELD_FALSE;
            break;
        case IDEM_ENVSCAN_NULL:
            type[i] = IDEM_FIELD_NULL;
            break;
        case IDEM_ENVSCAN_ABSENT:
            type[i] = IDEM_FIELD_ABSENT;
            break;
        default:
            return -1; /* an object or an array */
        }
        total += len[i] + 1;
    }
    out->fields = idem_xmalloc(n * sizeof(*out->fields) + total);
    out->nfields = n;
    char *text = (char *)(out->fields + n);
    for (size_t i = 0; i < n; i++) {
        if (type[i] == IDEM_FIELD_STRING)
            idem_envscan_string(&f[rules->fstep[i]], text);
        else if (type[i] == IDEM_FIELD_NUMBER)
            memcpy(text, num[i], len[i] + 1);
        else
            text[0] = '\0';
        out->fields[i] = (idem_envelope_field_t){type[i], text, len[i]};
        text += len[i] + 1;
    }
    return 0;
}

/* The fast read of a good record: one pass over the value (envscan.c) picks the
 * members the rules name. Returns 0 with `out` filled exactly as the
 * jansson read would, or -1 for anything else (a poison record, or one the
 * scan is not sure of): the caller then reads it with jansson, which
 * decides and explains. */
static int read_fast(const idem_envelope_rules_t *rules, const void *value,
                     size_t len, hdrs_t *headers, const void *key,
                     size_t key_len, idem_envelope_t *out)
{
    idem_envscan_field_t f[IDEM_ENVSCAN_STEPS_MAX];
    if (idem_envscan(value, len, rules->steps, rules->nsteps, f))
        return -1;
    int r = fast_first(rules->mid, rules->mid_cnt, f, headers, key, key_len,
                       out->message_id, sizeof(out->message_id),
                       &out->message_id_len);
    if (r < 0)
        return -1;
    if (!r)
        out->message_id_len = 0;
    if (fast_first(rules->id, rules->id_cnt, f, headers, key, key_len,
                   out->identity, sizeof(out->identity),
                   &out->identity_len) <= 0)
        return -1;
    if (rules->need_ledger) {
        const idem_envscan_field_t *u = &f[rules->f_user];
        const idem_envscan_field_t *a = &f[rules->f_amount];
        const idem_envscan_field_t *c = &f[rules->f_currency];
        char e[128];
        if (u->kind != IDEM_ENVSCAN_STRING || u->str_len == 0 ||
            u->str_len > IDEM_ENVELOPE_ID_MAX ||
            a->kind != IDEM_ENVSCAN_NUMBER ||
            idem_amount_parse(a->text, a->text_len, &out->amount_minor, e,
                              sizeof(e)) ||
            c->kind != IDEM_ENVSCAN_STRING || c->str_len != 3)
            return -1;
        idem_envscan_string(c, out->currency);
        if (out->currency[0] < 'A' || out->currency[0] > 'Z' ||
            out->currency[1] < 'A' || out->currency[1] > 'Z' ||
            out->currency[2] < 'A' || out->currency[2] > 'Z')
            return -1;
        idem_envscan_string(u, out->user_id);
    }
    if (rules->nfields && fields_fast(rules, f, out))
        return -1;
    out->json_object = 1;
    return 0;
}

static _Thread_local unsigned long fast_reads;

unsigned long idem_envelope_fast_reads(void)
{
    return fast_reads;
}

static int read_record(const idem_envelope_rules_t *rules, const void *value,
                       size_t len, hdrs_t *headers, const void *key,
                       size_t key_len, idem_envelope_t *out,
                       idem_reason_t *reason, char *errstr, size_t errstr_size)
{
    env_clear(out);
    if (len <= rules->max_bytes && rules->fast &&
        read_fast(rules, value, len, headers, key, key_len, out) == 0) {
        fast_reads++;
        return 0;
    }
    env_clear(out);
    if (len > rules->max_bytes) {
        *reason = IDEM_REASON_TOO_LARGE;
        snprintf(errstr, errstr_size,
                 "value is %zu bytes, above message.max.bytes %zu", len,
                 rules->max_bytes);
        return -1;
    }
    json_t *root = NULL;
    if (rules->format == IDEM_ENVELOPE_JSON) {
        if (!value || len == 0) {
            *reason = IDEM_REASON_NOT_JSON;
            snprintf(errstr, errstr_size, "empty value");
            return -1;
        }
        json_error_t jerr;
        arena_begin();
        /* Duplicate keys are refused: another parser that keeps the first
         * one would disagree with us about the same bytes. Integers are
         * decoded as reals so that a huge integer is a number (the amount
         * rule refuses it), not a parse error. */
        root = json_loadb(value, len,
                          JSON_DECODE_ANY | JSON_REJECT_DUPLICATES |
                              JSON_DECODE_INT_AS_REAL,
                          &jerr);
        if (!root) {
            arena_end();
            *reason = IDEM_REASON_NOT_JSON;
            snprintf(errstr, errstr_size, "not JSON: %s at byte %d", jerr.text,
                     jerr.position);
            return -1;
        }
        if (!json_is_object(root)) {
            *reason = IDEM_REASON_NOT_OBJECT;
            snprintf(errstr, errstr_size, "JSON value is not an object");
            json_decref(root);
            arena_end();
            return -1;
        }
        out->json_object = 1;
    }

    int r = -1;
    *reason = IDEM_REASON_INVALID_FIELD;
    doc_t doc = {root, value, len, NULL, 0};
    int have_mid =
        sources_first(rules->mid, rules->mid_cnt, &doc, headers, key, key_len,
                      out->message_id, sizeof(out->message_id),
                      &out->message_id_len, errstr, errstr_size);
    if (have_mid < 0)
        goto done;
    if (!have_mid)
        out->message_id_len = 0;
    int have_id = sources_first(rules->id, rules->id_cnt, &doc, headers, key,
                                key_len, out->identity, sizeof(out->identity),
                                &out->identity_len, errstr, errstr_size);
    if (have_id < 0)
        goto done;
    if (!have_id) {
        *reason = IDEM_REASON_NO_IDENTITY;
        if (rules->id_default)
            snprintf(errstr, errstr_size,
                     "neither idempotency_key nor "
                     "message_id in value or headers");
        else
            snprintf(errstr, errstr_size,
                     "no identity: none of %zu "
                     "envelope.identity sources found",
                     rules->id_cnt);
        goto done;
    }
    if (rules->need_ledger &&
        parse_ledger_fields(root, value, len, out, errstr, errstr_size))
        goto done;
    if (rules->nfields)
        fields_extract(rules, root, out);
    r = 0;
done:
    json_decref(doc.exact);
    if (root) {
        json_decref(root);
        arena_end();
    }
    return r;
}

int idem_envelope_read(const idem_envelope_rules_t *rules, const void *value,
                       size_t len, const rd_kafka_headers_t *headers,
                       const void *key, size_t key_len, idem_envelope_t *out,
                       idem_reason_t *reason, char *errstr, size_t errstr_size)
{
    hdrs_t hd = {headers, NULL};
    return read_record(rules, value, len, &hd, key, key_len, out, reason,
                       errstr, errstr_size);
}

int idem_envelope_read_msg(const idem_envelope_rules_t *rules,
                           rd_kafka_message_t *msg,
                           const rd_kafka_headers_t **headers,
                           idem_envelope_t *out, idem_reason_t *reason,
                           char *errstr, size_t errstr_size)
{
    hdrs_t hd = {NULL, msg};
    int r = read_record(rules, msg->payload, msg->payload ? msg->len : 0, &hd,
                        msg->key, msg->key ? msg->key_len : 0, out, reason,
                        errstr, errstr_size);
    *headers = hd.msg ? NULL : hd.h;
    return r;
}

int idem_envelope_parse(const void *value, size_t len,
                        const rd_kafka_headers_t *headers, int need_ledger,
                        size_t max_bytes, idem_envelope_t *out,
                        idem_reason_t *reason, char *errstr, size_t errstr_size)
{
    /* The default rules, made once per thread and kept. */
    static _Thread_local idem_envelope_rules_t *rules[2];
    need_ledger = need_ledger ? 1 : 0;
    if (!rules[need_ledger]) {
        char e[256];
        rules[need_ledger] = idem_envelope_rules_new(
            IDEM_ENVELOPE_JSON, IDEM_ENVELOPE_IDENTITY_DEFAULT,
            IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, need_ledger, 0, e, sizeof(e));
        if (!rules[need_ledger])
            abort(); /* the defaults are constants */
    }
    rules[need_ledger]->max_bytes = max_bytes;
    return idem_envelope_read(rules[need_ledger], value, len, headers, NULL, 0,
                              out, reason, errstr, errstr_size);
}
