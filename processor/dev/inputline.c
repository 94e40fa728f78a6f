/* inputline: reading one line of `produce --input` (inputline.h): the
 * envelope scan first, jansson for what the scan leaves. */
#include "dev/inputline.h"

#include "base/util.h"
#include "input/envscan.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

enum { F_MID, F_IKEY, F_KEY };

#define KEY_DEPTH_MAX 16 /* tokens of a --key-field pointer */
#define STEPS_MAX     (2 + KEY_DEPTH_MAX)

/* The tokens of key_field: a JSON Pointer ("/order/customer/id", RFC 6901
 * escapes decoded) or a member name ("sku" is "/sku"), written
 * NUL-terminated into buf (room for strlen(key_field) + KEY_DEPTH_MAX
 * bytes). Returns their number, or -1 when there are more than
 * KEY_DEPTH_MAX. */
static int key_tokens(const char *key_field, char *buf, const char **tok,
                      size_t *tok_len)
{
    if (*key_field != '/') {
        tok[0] = key_field;
        tok_len[0] = strlen(key_field);
        return 1;
    }
    int n = 0;
    const char *p = key_field;
    while (*p == '/') {
        if (n == KEY_DEPTH_MAX)
            return -1;
        p++;
        tok[n] = buf;
        while (*p && *p != '/') {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
                *buf++ = p[1] == '1' ? '/' : '~';
                p += 2;
            } else {
                *buf++ = *p++;
            }
        }
        tok_len[n] = (size_t)(buf - tok[n]);
        *buf++ = '\0';
        n++;
    }
    return n;
}

void idem_inputline_init(idem_inputline_t *il)
{
    memset(il, 0, sizeof(*il));
}

void idem_inputline_term(idem_inputline_t *il)
{
    free(il->buf);
    memset(il, 0, sizeof(*il));
}

void idem_inputline_fast(idem_inputline_t *il, int on)
{
    il->jansson_only = !on;
}

/* Room for three strings of at most len bytes each, integers as text and
 * their NULs: no string decodes longer than its line. */
static void reserve(idem_inputline_t *il, size_t len)
{
    size_t need = 3 * (len + 32);
    if (need > il->cap) {
        free(il->buf);
        il->buf = idem_xmalloc(need);
        il->cap = need;
    }
}

/* An integer literal jansson reads as a json_int_t and prints back the
 * same: no fraction, no "-0", at most 18 digits. */
static int plain_integer(const char *s, size_t n)
{
    size_t i = s[0] == '-';
    if (n == i || n - i > 18 || (n - i > 1 && s[i] == '0') ||
        (i && n == 2 && s[1] == '0'))
        return 0;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

/* The envelope scan's reading; 0, or -1 when jansson must decide. out[i]
 * gets steps[i]'s member as NUL-terminated text written at *at (NULL when
 * it is neither a string nor an integer); steps are message_id,
 * idempotency_key, then the key pointer's tokens if any, the last of which
 * is the key (out[F_KEY]). */
static int read_scan(idem_inputline_t *il, const char *line, size_t len,
                     const idem_envscan_step_t *steps, size_t nsteps,
                     const char **out, char **at)
{
    idem_envscan_field_t f[STEPS_MAX];
    if (idem_envscan(line, len, steps, nsteps, f))
        return -1;
    for (size_t i = 0; i < nsteps; i++) {
        if (i >= 2 && i + 1 < nsteps)
            continue; /* a step on the way to the key */
        if (f[i].kind == IDEM_ENVSCAN_NUMBER) {
            if (memchr(f[i].text, '.', f[i].text_len))
                continue; /* a real: jansson gives no text either */
            if (!plain_integer(f[i].text, f[i].text_len))
                return -1;
            memcpy(*at, f[i].text, f[i].text_len);
            (*at)[f[i].text_len] = '\0';
        } else if (f[i].kind == IDEM_ENVSCAN_STRING) {
            idem_envscan_string(&f[i], *at);
        } else {
            continue;
        }
        out[i < 2 ? i : F_KEY] = *at;
        *at += strlen(*at) + 1;
    }
    il->has_message_id = f[0].kind != IDEM_ENVSCAN_ABSENT;
    il->json = il->object = 1;
    return 0;
}

/* Value v (a string or an integer) as text at *at, or NULL. */
static const char *value_text(json_t *v, char **at)
{
    const char *s = *at;
    if (json_is_string(v))
        memcpy(*at, json_string_value(v), json_string_length(v) + 1);
    else if (json_is_integer(v))
        sprintf(*at, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else
        return NULL;
    *at += strlen(s) + 1;
    return s;
}

/* Member `name` of obj as text at *at, or NULL. */
static const char *member_text(json_t *obj, const char *name, char **at)
{
    return value_text(json_object_get(obj, name), at);
}

/* The value at tokens tok[n] of doc (objects by name, arrays by index), or
 * NULL. */
static json_t *tokens_get(json_t *doc, const char *const *tok,
                          const size_t *tok_len, int n)
{
    for (int i = 0; doc && i < n; i++) {
        if (json_is_object(doc)) {
            doc = json_object_getn(doc, tok[i], tok_len[i]);
        } else if (json_is_array(doc)) {
            char *end;
            if (!tok_len[i] || (tok_len[i] > 1 && tok[i][0] == '0') ||
                tok[i][0] < '0' || tok[i][0] > '9')
                return NULL;
            unsigned long k = strtoul(tok[i], &end, 10);
            doc = *end ? NULL : json_array_get(doc, k);
        } else {
            return NULL;
        }
    }
    return doc;
}

/* The line as jansson reads it (JSON_DECODE_ANY), or NULL. An integer
 * beyond 64 bits is JSON too but no key or id, like the scan has it; yet
 * jansson reads one only with JSON_DECODE_INT_AS_REAL, which makes every
 * integer of the line a real (no id). So each such literal alone is
 * blanked to the real 0.0 in a copy of the line, read again. */
static json_t *load_line(const char *line, size_t len)
{
    json_error_t jerr;
    json_t *doc = json_loadb(line, len, JSON_DECODE_ANY, &jerr);
    char *copy = NULL;
    while (!doc && json_error_code(&jerr) == json_error_numeric_overflow) {
        size_t end = (size_t)jerr.position, start = end;
        if (end > len)
            break;
        if (!copy) {
            copy = idem_xmalloc(len);
            memcpy(copy, line, len);
        }
        while (start > 0 && copy[start - 1] >= '0' && copy[start - 1] <= '9')
            start--;
        if (start > 0 && copy[start - 1] == '-')
            start--;
        /* a real's overflow (1e999) stays an error, as it was */
        if (end - start < 19 ||
            (start > 0 && memchr(".eE+", copy[start - 1], 4)))
            break;
        memset(copy + start, ' ', end - start);
        memcpy(copy + start, "0.0", 3);
        doc = json_loadb(copy, len, JSON_DECODE_ANY, &jerr);
    }
    free(copy);
    return doc;
}

static void read_jansson(idem_inputline_t *il, const char *line, size_t len,
                         const char *const *tok, const size_t *tok_len,
                         int ntok, const char **out, char **at)
{
    json_t *doc = load_line(line, len);
    if (!doc)
        return;
    il->json = 1;
    if (json_is_object(doc)) {
        il->object = 1;
        il->has_message_id = json_object_get(doc, "message_id") != NULL;
        out[F_MID] = member_text(doc, "message_id", at);
        out[F_IKEY] = member_text(doc, "idempotency_key", at);
        if (ntok > 0)
            out[F_KEY] = value_text(tokens_get(doc, tok, tok_len, ntok), at);
    }
    json_decref(doc);
}

void idem_inputline_read(idem_inputline_t *il, const char *line, size_t len,
                         const char *key_field)
{
    char *buf = il->buf;
    size_t cap = il->cap;
    int jansson_only = il->jansson_only;
    memset(il, 0, sizeof(*il));
    il->buf = buf;
    il->cap = cap;
    il->jansson_only = jansson_only;
    size_t klen = key_field ? strlen(key_field) : 0;
    reserve(il, len + klen + KEY_DEPTH_MAX);

    idem_envscan_step_t steps[STEPS_MAX] = {{"message_id", 10, -1},
                                            {"idempotency_key", 15, -1}};
    size_t nsteps = 2;
    const char *out[3] = {NULL, NULL, NULL};
    /* The key's tokens go at the end of the buffer, the strings read from
     * the line at its start. */
    const char *tok[KEY_DEPTH_MAX];
    size_t tok_len[KEY_DEPTH_MAX];
    int ntok = 0;
    if (key_field) {
        ntok = key_tokens(key_field, il->buf + il->cap - klen - KEY_DEPTH_MAX,
                          tok, tok_len);
        if (ntok < 0)
            ntok = 0; /* deeper than any key we look up: none found */
    }
    /* A key that is message_id or idempotency_key is that step (a scan
     * takes each member once): copied below. */
    int key_is_mid =
        ntok == 1 && tok_len[0] == 10 && !memcmp(tok[0], "message_id", 10);
    int key_is_ikey =
        ntok == 1 && tok_len[0] == 15 && !memcmp(tok[0], "idempotency_key", 15);
    if (ntok > 0 && !key_is_mid && !key_is_ikey) {
        for (int i = 0; i < ntok; i++) {
            steps[nsteps].name = tok[i];
            steps[nsteps].len = tok_len[i];
            steps[nsteps].parent = i == 0 ? -1 : (int)nsteps - 1;
            nsteps++;
        }
        /* the scan takes each member once: a first token that is one of
         * the ids is left to jansson */
        if (ntok > 1 &&
            ((tok_len[0] == 10 && !memcmp(tok[0], "message_id", 10)) ||
             (tok_len[0] == 15 && !memcmp(tok[0], "idempotency_key", 15))))
            nsteps = 0;
    }
    char *at = il->buf;
    if (!il->jansson_only && nsteps > 0 &&
        read_scan(il, line, len, steps, nsteps, out, &at) == 0) {
        il->scanned = 1;
        if (key_is_mid)
            out[F_KEY] = out[F_MID];
        else if (key_is_ikey)
            out[F_KEY] = out[F_IKEY];
    } else {
        out[F_MID] = out[F_IKEY] = out[F_KEY] = NULL;
        at = il->buf;
        read_jansson(il, line, len, tok, tok_len, ntok, out, &at);
        if (key_is_mid)
            out[F_KEY] = out[F_MID];
        else if (key_is_ikey)
            out[F_KEY] = out[F_IKEY];
    }
    if (il->object) {
        /* An object's first byte other than JSON whitespace is its '{'. */
        const char *brace = memchr(line, '{', len);
        size_t i = (size_t)(brace - line) + 1;
        while (i < len && (line[i] == ' ' || line[i] == '\t' ||
                           line[i] == '\n' || line[i] == '\r'))
            i++;
        il->members = i < len && line[i] != '}';
    }
    il->message_id = out[F_MID];
    il->idempotency_key = out[F_IKEY];
    il->key_found = out[F_KEY] != NULL;
    il->key = out[F_KEY] ? out[F_KEY] : out[F_MID];
    il->key_len = il->key ? strlen(il->key) : 0;
}
