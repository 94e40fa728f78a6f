/* envscan: one pass over a JSON object envelope that picks out the values
 * at a few JSON Pointers, or says "ask jansson" (envscan.h). */
#include "input/envscan.h"

#include <stdint.h>
#include <string.h>

#define DEPTH_MAX  32  /* deeper values go to jansson (its limit: 2048) */
#define KEYS_MAX   256 /* keys of the open objects, for the duplicate check */
#define NUMBER_MAX 300 /* longer number literals may overflow a double */
#define NO_STEP    -2  /* a container no step goes into */

/* The scan accepts a strict subset of JSON (RFC 8259) and nothing else:
 * every text it accepts, jansson accepts too and reads the same way. What
 * is outside the subset is handed over, never judged here: any byte above
 * 0x7f (jansson checks UTF-8 strictly), control bytes (\v and \f are not
 * JSON whitespace), \u escapes (jansson refuses \u0000 and lone
 * surrogates), numbers with an exponent or longer than NUMBER_MAX (jansson
 * refuses a double that overflows), nesting deeper than DEPTH_MAX, more
 * than KEYS_MAX keys in the open objects, and duplicate keys (jansson's
 * JSON_REJECT_DUPLICATES then gives the error). A pointer that goes
 * through an array is handed over too (jansson's pointer reading decides
 * what an index is). A JSON library's own
 * parser costs several times more per record (docs/design.md, "Reading a
 * record fast"): this runs on every record. */
typedef struct {
    const unsigned char *b; /* the value */
    size_t len, i;          /* its length, the next byte */
    const idem_envscan_step_t *steps;
    size_t n;
    uint64_t parents; /* bit k: some step goes into step k's value */
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

/* The bytes of x that are not plain ('"', '\\', below 0x20, above 0x7f),
 * each marked by its top bit. The lowest mark is exact (the has-zero-byte
 * trick per class: its borrows can only mark bytes above a true one; a
 * byte above 0x7f marks itself), which is all plain_run reads. */
static inline uint64_t word_special(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101ULL, high = ones * 0x80;
    uint64_t q = x ^ (ones * '"'), bs = x ^ (ones * '\\');
    return (((x - ones * 0x20) & ~x) | ((q - ones) & ~q) | ((bs - ones) & ~bs) |
            x) &
           high;
}

/* The first byte at or after i (below len) that is not plain, or len:
 * eight bytes a step where the byte order lets the lowest mark name the
 * first of them, byte by byte otherwise and for the last few bytes. */
static inline size_t plain_run(const unsigned char *b, size_t i, size_t len)
{
#if defined(__GNUC__) && defined(__BYTE_ORDER__) &&                            \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (len - i >= 8) {
        uint64_t x;
        memcpy(&x, b + i, 8);
        uint64_t m = word_special(x);
        if (m)
            return i + (size_t)(__builtin_ctzll(m) >> 3);
        i += 8;
    }
#endif
    while (i < len && plain[b[i]])
        i++;
    return i;
}

/* The byte escape "\\c" stands for, or 0 when the scan does not read it
 * (\u, or no escape at all). */
static char unescape(unsigned char c)
{
    switch (c) {
    case '"':
        return '"';
    case '\\':
        return '\\';
    case '/':
        return '/';
    case 'b':
        return '\b';
    case 'f':
        return '\f';
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    default:
        return 0;
    }
}

static inline void skip_ws(scan_t *s)
{
    /* Most records hold no whitespace: one comparison says so. */
    size_t i = s->i;
    while (i < s->len && s->b[i] <= ' ' &&
           (s->b[i] == ' ' || s->b[i] == '\n' || s->b[i] == '\r' ||
            s->b[i] == '\t'))
        i++;
    s->i = i;
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
        size_t j = plain_run(b, i, s->len);
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
        char e = unescape(b[j + 1]);
        if (!e)
            return -1; /* \u, or not an escape */
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

static int scan_value(scan_t *s, int step);

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
 * (keys [first, nkeys) of s; *bloom has a bit per key). The object is the
 * value of step `node` (-1: the envelope object; NO_STEP: of none); sets
 * *step to the step the key names, or -1. Returns 0 or -1 (a duplicate,
 * or too many keys: hand over). */
static int scan_key(scan_t *s, int node, size_t first, uint64_t *bloom,
                    int *step)
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
    *step = -1;
    if (node != NO_STEP)
        for (size_t k = 0; k < s->n; k++)
            if (s->steps[k].len == len && s->steps[k].parent == node &&
                (!len || s->steps[k].name[0] == key[0]) &&
                !memcmp(s->steps[k].name, key, len)) {
                *step = (int)k;
                break;
            }
    return 0;
}

/* An object or an array at s->i (its bracket), the value of step `node`
 * (see scan_key). Returns 0 or -1. */
static int scan_container(scan_t *s, int node)
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
            int step = -1;
            if (is_map) {
                if (s->i >= s->len || s->b[s->i] != '"' ||
                    scan_key(s, node, first, &bloom, &step))
                    return -1;
                skip_ws(s);
                if (s->i >= s->len || s->b[s->i] != ':')
                    return -1;
                s->i++;
                skip_ws(s);
            }
            if (scan_value(s, step))
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

/* A value at s->i, the value of step `step` (-1: of none). Returns 0 or
 * -1. */
static int scan_value(scan_t *s, int step)
{
    if (s->i >= s->len)
        return -1;
    idem_envscan_field_t *f = step >= 0 ? &s->fields[step] : NULL;
    int inner = step >= 0 && (s->parents >> step & 1);
    size_t at = s->i;
    idem_envscan_kind_t kind;
    switch (s->b[s->i]) {
    case '{':
        if (scan_container(s, inner ? step : NO_STEP))
            return -1;
        kind = IDEM_ENVSCAN_OBJECT;
        break;
    case '[':
        /* A step into an array: jansson's pointer reading decides. */
        if (inner || scan_container(s, NO_STEP))
            return -1;
        kind = IDEM_ENVSCAN_ARRAY;
        break;
    case '"': {
        size_t len;
        int escaped;
        if (scan_string(s, NULL, 0, &len, &escaped))
            return -1;
        if (f) {
            f->text = (const char *)s->b + at + 1;
            f->text_len = s->i - at - 2;
            f->str_len = len;
        }
        kind = IDEM_ENVSCAN_STRING;
        break;
    }
    case 't':
        if (literal(s, "true", 4))
            return -1;
        kind = IDEM_ENVSCAN_TRUE;
        break;
    case 'f':
        if (literal(s, "false", 5))
            return -1;
        kind = IDEM_ENVSCAN_FALSE;
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
            f->text = num;
            f->text_len = num_len;
        }
        kind = IDEM_ENVSCAN_NUMBER;
        break;
    }
    }
    if (f)
        f->kind = kind;
    return 0;
}

int idem_envscan(const void *value, size_t len,
                 const idem_envscan_step_t *steps, size_t n,
                 idem_envscan_field_t *fields)
{
    if (!value || !len || n > IDEM_ENVSCAN_STEPS_MAX)
        return -1;
    static _Thread_local scan_t s;
    s.b = value;
    s.len = len;
    s.i = 0;
    s.steps = steps;
    s.n = n;
    s.parents = 0;
    s.fields = fields;
    s.depth = 0;
    s.nkeys = 0;
    s.keybuf_used = 0;
    for (size_t i = 0; i < n; i++) {
        fields[i].kind = IDEM_ENVSCAN_ABSENT;
        if (steps[i].parent >= 0 && steps[i].parent < (int)n)
            s.parents |= (uint64_t)1 << steps[i].parent;
    }
    skip_ws(&s);
    /* Not an object: jansson says which error. */
    if (s.i >= len || s.b[s.i] != '{' || scan_container(&s, -1))
        return -1;
    /* After the object only JSON whitespace (jansson's set) may follow. */
    skip_ws(&s);
    return s.i == len ? 0 : -1;
}

void idem_envscan_string(const idem_envscan_field_t *f, char *out)
{
    const char *t = f->text;
    if (f->str_len == f->text_len) {
        memcpy(out, t, f->text_len);
    } else {
        size_t o = 0;
        for (size_t i = 0; i < f->text_len; i++)
            out[o++] = t[i] == '\\' ? unescape((unsigned char)t[++i]) : t[i];
    }
    out[f->str_len] = '\0';
}
