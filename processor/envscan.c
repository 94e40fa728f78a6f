/* envscan: one SAX pass (yajl) over a JSON object envelope that picks out
 * a few top-level members, or says "ask jansson" (envscan.h). */
#include "envscan.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <yajl_parse.h>

#define DEPTH_MAX   32  /* deeper values go to jansson (its limit: 2048) */
#define KEYS_MAX    256 /* keys of the open objects, for the duplicate check */
#define NUMBER_MAX  300 /* longer number literals may overflow a double */
#define ARENA_BYTES 65536 /* yajl's handle, lexer and buffers for one scan */

/* yajl allocates its handle, lexer and buffers for every parse (it has no
 * reset). They come from a per-thread bump arena, emptied after each scan;
 * a block records its size in front for realloc. What does not fit goes to
 * malloc. */
typedef struct {
    _Alignas(16) unsigned char buf[ARENA_BYTES];
    size_t used;
} arena_t;

static _Thread_local arena_t *arena;

static int in_arena(const void *ptr)
{
    const unsigned char *p = ptr;
    return arena && p >= arena->buf && p < arena->buf + ARENA_BYTES;
}

static void *arena_malloc(void *ctx, size_t size)
{
    (void)ctx;
    size_t need = 16 + ((size + 15) & ~(size_t)15);
    if (arena && arena->used + need <= ARENA_BYTES) {
        unsigned char *p = arena->buf + arena->used;
        arena->used += need;
        memcpy(p, &size, sizeof(size));
        return p + 16;
    }
    return malloc(size);
}

static void arena_free(void *ctx, void *ptr)
{
    (void)ctx;
    if (ptr && !in_arena(ptr))
        free(ptr);
}

static void *arena_realloc(void *ctx, void *ptr, size_t size)
{
    if (!ptr)
        return arena_malloc(ctx, size);
    if (!in_arena(ptr))
        return realloc(ptr, size);
    size_t old;
    memcpy(&old, (unsigned char *)ptr - 16, sizeof(old));
    if (size <= old)
        return ptr;
    void *n = arena_malloc(ctx, size);
    if (n)
        memcpy(n, ptr, old);
    return n;
}

typedef struct {
    const char *const *names;
    const size_t *name_lens;
    size_t n;
    idem_envscan_field_t *fields;
    int depth;  /* containers open; the envelope object is depth 1 */
    int cur;    /* field of the top-level member whose value comes next */
    int closed; /* the envelope object ended */
    unsigned char is_map[DEPTH_MAX + 1];
    size_t key_start[DEPTH_MAX + 1]; /* first key of each open object */
    size_t keybuf_start[DEPTH_MAX + 1];
    uint64_t key_bloom[DEPTH_MAX + 1]; /* one bit per key of the open
                                          object (key_bit): only a key whose
                                          bit is set is compared */
    size_t key_off[KEYS_MAX], key_len[KEYS_MAX], nkeys;
    char keybuf[4096];
    size_t keybuf_used;
} scan_t;

/* A top-level member's value of `kind`: into its field if it is wanted. */
static void member_value(scan_t *s, idem_envscan_kind_t kind)
{
    if (s->depth == 1 && s->cur >= 0)
        s->fields[s->cur].kind = kind;
    if (s->depth == 1)
        s->cur = -1;
}

static int on_null(void *ctx)
{
    scan_t *s = ctx;
    if (!s->depth)
        return 0;
    member_value(s, IDEM_ENVSCAN_NULL);
    return 1;
}

static int on_boolean(void *ctx, int b)
{
    (void)b;
    scan_t *s = ctx;
    if (!s->depth)
        return 0;
    member_value(s, IDEM_ENVSCAN_OTHER);
    return 1;
}

/* jansson reads every number as a double here (JSON_DECODE_INT_AS_REAL)
 * and refuses one that overflows: literals that might are left to it. */
static int on_number(void *ctx, const char *num, size_t len)
{
    scan_t *s = ctx;
    if (!s->depth || len > NUMBER_MAX || memchr(num, 'e', len) ||
        memchr(num, 'E', len))
        return 0;
    if (s->depth == 1 && s->cur >= 0) {
        s->fields[s->cur].num = num;
        s->fields[s->cur].num_len = len;
    }
    member_value(s, IDEM_ENVSCAN_NUMBER);
    return 1;
}

static int on_string(void *ctx, const unsigned char *str, size_t len)
{
    scan_t *s = ctx;
    if (!s->depth)
        return 0;
    if (s->depth == 1 && s->cur >= 0) {
        idem_envscan_field_t *f = &s->fields[s->cur];
        if (len > IDEM_ENVSCAN_STRING_MAX) {
            member_value(s, IDEM_ENVSCAN_OTHER);
            return 1;
        }
        memcpy(f->str, str, len);
        f->str[len] = '\0';
        f->str_len = len;
    }
    member_value(s, IDEM_ENVSCAN_STRING);
    return 1;
}

static int open_container(scan_t *s, int is_map)
{
    if (!s->depth && !is_map)
        return 0; /* not an object: jansson says which error */
    if (s->depth)
        member_value(s, IDEM_ENVSCAN_OTHER);
    if (++s->depth > DEPTH_MAX)
        return 0;
    s->is_map[s->depth] = (unsigned char)is_map;
    s->key_start[s->depth] = s->nkeys;
    s->keybuf_start[s->depth] = s->keybuf_used;
    s->key_bloom[s->depth] = 0;
    return 1;
}

static int on_start_map(void *ctx)
{
    return open_container(ctx, 1);
}

static int on_start_array(void *ctx)
{
    return open_container(ctx, 0);
}

/* The end of the envelope object stops the parse (closed = 1): yajl 2.1
 * ignores an unfinished token after a complete value ({"a":1} "x), so
 * what follows is checked by the caller, from where yajl stopped. */
static int on_end(void *ctx)
{
    scan_t *s = ctx;
    s->nkeys = s->key_start[s->depth];
    s->keybuf_used = s->keybuf_start[s->depth];
    if (--s->depth == 0) {
        s->closed = 1;
        return 0;
    }
    return 1;
}

/* A key's bit in its object's bloom mask: from its length and its first
 * and last bytes, enough to tell apart the few keys of a typical record. */
static uint64_t key_bit(const unsigned char *key, size_t len)
{
    unsigned h = (unsigned)len * 7u;
    if (len)
        h += (unsigned)key[0] * 3u + key[len - 1];
    return (uint64_t)1 << (h & 63);
}

/* A key: refused when the object already has it (jansson's
 * JSON_REJECT_DUPLICATES then gives the error). The keys before it are
 * compared only when its bloom bit was seen in this object, so a record's
 * distinct keys are not compared pairwise. */
static int on_map_key(void *ctx, const unsigned char *key, size_t len)
{
    scan_t *s = ctx;
    uint64_t bit = key_bit(key, len);
    if (s->key_bloom[s->depth] & bit) {
        for (size_t i = s->key_start[s->depth]; i < s->nkeys; i++)
            if (s->key_len[i] == len &&
                !memcmp(s->keybuf + s->key_off[i], key, len))
                return 0;
    }
    if (s->nkeys == KEYS_MAX || s->keybuf_used + len > sizeof(s->keybuf))
        return 0;
    s->key_bloom[s->depth] |= bit;
    memcpy(s->keybuf + s->keybuf_used, key, len);
    s->key_off[s->nkeys] = s->keybuf_used;
    s->key_len[s->nkeys++] = len;
    s->keybuf_used += len;
    if (s->depth == 1) {
        s->cur = -1;
        for (size_t i = 0; i < s->n; i++)
            if (s->name_lens[i] == len && !memcmp(s->names[i], key, len)) {
                s->cur = (int)i;
                break;
            }
    }
    return 1;
}

static const yajl_callbacks callbacks = {
    .yajl_null = on_null,
    .yajl_boolean = on_boolean,
    .yajl_number = on_number,
    .yajl_string = on_string,
    .yajl_start_map = on_start_map,
    .yajl_map_key = on_map_key,
    .yajl_end_map = on_end,
    .yajl_start_array = on_start_array,
    .yajl_end_array = on_end,
};

/* Bytes where yajl and jansson might disagree: any non-ASCII byte (jansson
 * checks UTF-8 more strictly than yajl), \v and \f (whitespace to yajl, not
 * to JSON), and \u escapes (jansson refuses \u0000 and lone surrogates,
 * which yajl decodes). Eight bytes at a time: this runs on every record. */
#define ONES  0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static uint64_t has_byte(uint64_t v, unsigned char c)
{
    uint64_t x = v ^ (ONES * c);
    return (x - ONES) & ~x & HIGHS;
}

/* Whether a byte of v is below 0x20 or above 0x7f (exact: a byte's own
 * test never borrows from the bytes above it that are not hits). */
static uint64_t has_ctl_or_high(uint64_t v)
{
    return ((v - ONES * 0x20) | v) & HIGHS;
}

static int byte_needs_jansson(const unsigned char *b, size_t len, size_t j)
{
    return b[j] >= 0x80 || b[j] == '\v' || b[j] == '\f' ||
           (b[j] == '\\' && j + 1 < len && b[j + 1] == 'u');
}

static int needs_jansson(const unsigned char *b, size_t len)
{
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v;
        memcpy(&v, b + i, 8);
        /* Two tests a word on the usual record (no control byte, no
         * escape); the rare word that hits is looked at byte by byte. */
        if (has_ctl_or_high(v) || has_byte(v, '\\'))
            for (size_t j = i; j < i + 8; j++)
                if (byte_needs_jansson(b, len, j))
                    return 1;
    }
    for (; i < len; i++)
        if (byte_needs_jansson(b, len, i))
            return 1;
    return 0;
}

int idem_envscan(const void *value, size_t len, const char *const *names,
                 const size_t *name_lens, size_t n,
                 idem_envscan_field_t *fields)
{
    if (!value || !len || n > IDEM_ENVSCAN_FIELDS_MAX ||
        needs_jansson(value, len))
        return -1;
    if (!arena && !(arena = malloc(sizeof(*arena))))
        return -1;
    arena->used = 0;
    static _Thread_local scan_t s;
    s.names = names;
    s.name_lens = name_lens;
    s.n = n;
    s.fields = fields;
    s.depth = 0;
    s.cur = -1;
    s.closed = 0;
    s.nkeys = 0;
    s.keybuf_used = 0;
    for (size_t i = 0; i < n; i++)
        fields[i].kind = IDEM_ENVSCAN_ABSENT;
    yajl_alloc_funcs afs = {arena_malloc, arena_realloc, arena_free, NULL};
    yajl_handle h = yajl_alloc(&callbacks, &afs, &s);
    if (!h)
        return -1;
    int ok =
        yajl_parse(h, value, len) == yajl_status_client_canceled && s.closed;
    /* After the object only JSON whitespace (jansson's set) may follow. */
    const unsigned char *b = value;
    for (size_t i = ok ? yajl_get_bytes_consumed(h) : len; i < len; i++)
        if (b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r')
            ok = 0;
    yajl_free(h);
    return ok ? 0 : -1;
}
