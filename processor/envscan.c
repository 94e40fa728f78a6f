/* envscan: one pass over a JSON object envelope that picks out a few
 * top-level members, or says "ask jansson" (envscan.h). */
#include "envscan.h"

#include <stdint.h>
#include <string.h>

#define DEPTH_MAX  32  /* deeper values go to jansson (its limit: 2048) */
#define KEYS_MAX   256 /* keys of the open objects, for the duplicate check */
#define NUMBER_MAX 300 /* longer number literals may overflow a double */

/* The scan accepts a strict subset of JSON (RFC 8259) and nothing else:
 * every text it accepts, jansson accepts too and reads the same way. What
 * is outside the subset is handed over, never judged here: any byte above
 * 0x7f (jansson checks UTF-8 strictly), control bytes (\v and \f are not
 * JSON whitespace), \u escapes (jansson refuses \u0000 and lone
 * surrogates), numbers with an exponent or longer than NUMBER_MAX (jansson
 * refuses a double that overflows), nesting deeper than DEPTH_MAX, more
 * than KEYS_MAX keys in the open objects, and duplicate keys (jansson's
 * JSON_REJECT_DUPLICATES then gives the error). A JSON library's own
 * parser costs several times more per record (docs/design.md, "Reading a
 * record fast"): this runs on every record. */
typedef struct {
    const unsigned char *b; /* the value */
    size_t len, i;          /* its length, the next byte */
    const char *const *names;
    const size_t *name_lens;
    size_t n;
    idem_envscan_field_t *fields;
    int depth; /* objects and arrays open; the envelope object is 1 */
    const char *key[KEYS_MAX]; /* the keys of the open objects, decoded */
    size_t key_len[KEYS_MAX], nkeys;
    char keybuf[4096]; /* decoded keys that held escapes */
    size_t keybuf_used;
} scan_t;

/* The bytes a string holds as they are: printable ASCII but '"' and '\'. */
static const unsigned char plain[256] = {
#define P16 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1
    [0x20] = 1,
    1,
    0,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1, /* 0x22 '"' */
    [0x30] = P16,
    [0x40] = P16,
    [0x50] = 1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    0,
    1,
    1,
    1, /* 0x5c '\' */
    [0x60] = P16,
    [0x70] = P16,
#undef P16
};

static void skip_ws(scan_t *s)
{
    while (s->i < s->len && (s->b[s->i] == ' ' || s->b[s->i] == '\n' ||
                             s->b[s->i] == '\r' || s->b[s->i] == '\t'))
        s->i++;
}

/* The string that starts at s->i (its quote). Its decoded bytes go to
 * out as far as `room` allows (out may be NULL); *dlen is the decoded
 * length, *escaped whether any escape was in it (if not, the decoded bytes
 * are the input's, from s->b + the quote + 1). Returns 0 with s->i past
 * the closing quote, or -1 to hand over. */
static int scan_string(scan_t *s, char *out, size_t room, size_t *dlen,
                       int *escaped)
{
    const unsigned char *b = s->b;
    size_t i = s->i + 1, n = 0;
    *escaped = 0;
    for (;;) {
        size_t j = i;
        while (j < s->len && plain[b[j]])
            j++;
        if (out && n < room)
            memcpy(out + n, b + i, j - i < room - n ? j - i : room - n);
        n += j - i;
        if (j >= s->len)
            return -1; /* no closing quote */
        if (b[j] == '"') {
            s->i = j + 1;
            *dlen = n;
            return 0;
        }
        if (b[j] != '\\' || j + 1 >= s->len)
            return -1; /* a control byte, a byte above 0x7f, a '\' last */
        char e;
        switch (b[j + 1]) {
        case '"':
            e = '"';
            break;
        case '\\':
            e = '\\';
            break;
        case '/':
            e = '/';
            break;
        case 'b':
            e = '\b';
            break;
        case 'f':
            e = '\f';
            break;
        case 'n':
            e = '\n';
            break;
        case 'r':
            e = '\r';
            break;
        case 't':
            e = '\t';
            break;
        default:
            return -1; /* \u, or not an escape */
        }
        if (out && n < room)
            out[n] = e;
        n++;
        *escaped = 1;
        i = j + 2;
    }
}

/* A number: -?(0|[1-9][0-9]*)(.[0-9]+)?, no exponent, at most NUMBER_MAX
 * bytes. Returns 0 with its text in *num, *num_len, or -1. */
static int scan_number(scan_t *s, const char **num, size_t *num_len)
{
    const unsigned char *b = s->b;
    size_t i = s->i;
    if (i < s->len && b[i] == '-')
        i++;
    if (i < s->len && b[i] == '0') {
        i++;
    } else if (i < s->len && b[i] >= '1' && b[i] <= '9') {
        while (i < s->len && b[i] >= '0' && b[i] <= '9')
            i++;
    } else {
        return -1;
    }
    if (i < s->len && b[i] == '.') {
        size_t d = ++i;
        while (i < s->len && b[i] >= '0' && b[i] <= '9')
            i++;
        if (i == d)
            return -1;
    }
    if ((i < s->len && (b[i] == 'e' || b[i] == 'E')) || i - s->i > NUMBER_MAX)
        return -1;
    *num = (const char *)b + s->i;
    *num_len = i - s->i;
    s->i = i;
    return 0;
}

static int literal(scan_t *s, const char *word, size_t len)
{
    if (s->len - s->i < len || memcmp(s->b + s->i, word, len))
        return -1;
    s->i += len;
    return 0;
}

static int scan_value(scan_t *s, idem_envscan_field_t *f);

/* A key's bit in its object's bloom mask: from its length and its first
 * and last bytes, enough to tell apart the few keys of a typical record. */
static uint64_t key_bit(const char *key, size_t len)
{
    unsigned h = (unsigned)len * 7u;
    if (len)
        h += (unsigned char)key[0] * 3u + (unsigned char)key[len - 1];
    return (uint64_t)1 << (h & 63);
}

/* The key at s->i, decoded, kept for the duplicate check of its object
 * (keys [first, nkeys) of s; *bloom has a bit per key). Sets *f to the
 * field it names when it is a member of the envelope object. Returns 0 or
 * -1 (a duplicate, or too many keys: hand over). */
static int scan_key(scan_t *s, size_t first, uint64_t *bloom,
                    idem_envscan_field_t **f)
{
    size_t at = s->i, len;
    int escaped;
    if (scan_string(s, NULL, 0, &len, &escaped))
        return -1;
    const char *key = (const char *)s->b + at + 1;
    if (escaped) {
        size_t room = sizeof(s->keybuf) - s->keybuf_used;
        if (len > room)
            return -1;
        s->i = at;
        scan_string(s, s->keybuf + s->keybuf_used, room, &len, &escaped);
        key = s->keybuf + s->keybuf_used;
        s->keybuf_used += len;
    }
    /* Keys before it are compared only when its bloom bit was seen in
     * this object: a record's distinct keys are not compared pairwise. */
    uint64_t bit = key_bit(key, len);
    if (*bloom & bit)
        for (size_t k = first; k < s->nkeys; k++)
            if (s->key_len[k] == len && !memcmp(s->key[k], key, len))
                return -1;
    if (s->nkeys == KEYS_MAX)
        return -1;
    *bloom |= bit;
    s->key[s->nkeys] = key;
    s->key_len[s->nkeys++] = len;
    *f = NULL;
    if (s->depth == 1)
        for (size_t k = 0; k < s->n; k++)
            if (s->name_lens[k] == len && !memcmp(s->names[k], key, len)) {
                *f = &s->fields[k];
                break;
            }
    return 0;
}

/* An object or an array at s->i (its bracket). Returns 0 or -1. */
static int scan_container(scan_t *s)
{
    int is_map = s->b[s->i] == '{';
    char close = is_map ? '}' : ']';
    if (++s->depth > DEPTH_MAX)
        return -1;
    size_t first = s->nkeys, keybuf_used = s->keybuf_used;
    uint64_t bloom = 0;
    s->i++;
    skip_ws(s);
    if (s->i < s->len && s->b[s->i] == close) {
        s->i++;
    } else {
        for (;;) {
            idem_envscan_field_t *f = NULL;
            if (is_map) {
                if (s->i >= s->len || s->b[s->i] != '"' ||
                    scan_key(s, first, &bloom, &f))
                    return -1;
                skip_ws(s);
                if (s->i >= s->len || s->b[s->i] != ':')
                    return -1;
                s->i++;
                skip_ws(s);
            }
            if (scan_value(s, f))
                return -1;
            skip_ws(s);
            if (s->i >= s->len)
                return -1;
            if (s->b[s->i] == close) {
                s->i++;
                break;
            }
            if (s->b[s->i] != ',')
                return -1;
            s->i++;
            skip_ws(s);
        }
    }
    s->nkeys = first;
    s->keybuf_used = keybuf_used;
    s->depth--;
    return 0;
}

/* A value at s->i; f: the field it goes to (a wanted member of the
 * envelope object), or NULL. Returns 0 or -1. */
static int scan_value(scan_t *s, idem_envscan_field_t *f)
{
    if (s->i >= s->len)
        return -1;
    idem_envscan_kind_t kind;
    switch (s->b[s->i]) {
    case '{':
    case '[':
        if (scan_container(s))
            return -1;
        kind = IDEM_ENVSCAN_OTHER;
        break;
    case '"': {
        size_t len;
        int escaped;
        if (scan_string(s, f ? f->str : NULL, f ? IDEM_ENVSCAN_STRING_MAX : 0,
                        &len, &escaped))
            return -1;
        kind = IDEM_ENVSCAN_OTHER; /* too long to keep */
        if (f && len <= IDEM_ENVSCAN_STRING_MAX) {
            f->str[len] = '\0';
            f->str_len = len;
            kind = IDEM_ENVSCAN_STRING;
        }
        break;
    }
    case 't':
        if (literal(s, "true", 4))
            return -1;
        kind = IDEM_ENVSCAN_OTHER;
        break;
    case 'f':
        if (literal(s, "false", 5))
            return -1;
        kind = IDEM_ENVSCAN_OTHER;
        break;
    case 'n':
        if (literal(s, "null", 4))
            return -1;
        kind = IDEM_ENVSCAN_NULL;
        break;
    default: {
        const char *num;
        size_t num_len;
        if (scan_number(s, &num, &num_len))
            return -1;
        if (f) {
            f->num = num;
            f->num_len = num_len;
        }
        kind = IDEM_ENVSCAN_NUMBER;
        break;
    }
    }
    if (f)
        f->kind = kind;
    return 0;
}

int idem_envscan(const void *value, size_t len, const char *const *names,
                 const size_t *name_lens, size_t n,
                 idem_envscan_field_t *fields)
{
    if (!value || !len || n > IDEM_ENVSCAN_FIELDS_MAX)
        return -1;
    static _Thread_local scan_t s;
    s.b = value;
    s.len = len;
    s.i = 0;
    s.names = names;
    s.name_lens = name_lens;
    s.n = n;
    s.fields = fields;
    s.depth = 0;
    s.nkeys = 0;
    s.keybuf_used = 0;
    for (size_t i = 0; i < n; i++)
        fields[i].kind = IDEM_ENVSCAN_ABSENT;
    skip_ws(&s);
    /* Not an object: jansson says which error. */
    if (s.i >= len || s.b[s.i] != '{' || scan_container(&s))
        return -1;
    /* After the object only JSON whitespace (jansson's set) may follow. */
    skip_ws(&s);
    return s.i == len ? 0 : -1;
}
