/* gen: deterministic payment test traffic (valid payments, duplicates of
 * both kinds, poison of every reason) and the expectations it implies. */
#include "dev/gen.h"

#include "conf/conf.h"
#include "base/outcome.h"
#include "base/util.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* 2024-01-01T00:00:00Z: created_at is this plus one second per record, so
 * records never depend on the wall clock. */
#define GEN_BASE_TIME_MS     INT64_C(1704067200000)
#define GEN_FAR_MIN          300  /* far duplicates: primaries later, min */
#define GEN_FAR_SPAN         2700 /* ... plus up to this many */
#define GEN_MAX_AMOUNT_CENTS INT64_C(100000000)
/* Up to this many (currency, user) pairs the ledger is an array of sums;
 * beyond, a jansson object (a lookup a record: a tenth of generating). */
#define GEN_SUMS_MAX INT64_C(4000000)

/* Domains keep the random streams of different uses independent. */
enum { RNG_PAYMENT = 1, RNG_RESEND_ID, RNG_FAR, RNG_SEEDTAG };

/* A duplicate waiting for its turn: emitted once `due` primaries... have
 * been emitted (due = index among primaries of the last one before it). */
typedef struct {
    int64_t due;        /* emit after primary number `due` */
    int far;            /* 0 adjacent (wins ties), 1 far */
    int64_t seq;        /* FIFO among equals */
    int64_t primary;    /* primary number of the original payment */
    int64_t orig_index; /* stream index of the original */
    int64_t dupno;      /* n-th duplicate overall: picks kind and resend id */
} pending_t;

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf_t;

/* The fields of one payment, a pure function of (seed, primary number). */
typedef struct {
    char order_id[48];
    char message_id[37];
    char created_at[40];
    int64_t user;
    int64_t cents;
    const char *currency;
    int currency_idx; /* currency's index in currencies */
} payment_t;

struct idem_gen_s {
    idem_gen_opts_t opts;
    char *currencies_buf;
    char currencies[IDEM_GEN_CURRENCIES_MAX][4];
    int currency_cnt;
    char seedtag[8];

    int64_t n_primary, n_poison, n_valid, n_dup; /* planned totals */
    int64_t next_primary;                        /* primaries emitted so far */
    int64_t valid_seen;  /* valid primaries emitted so far */
    int64_t poison_seen; /* poison primaries emitted so far */
    int64_t dup_scheduled;
    int64_t index; /* records emitted so far */
    int64_t seq;

    pending_t *heap;
    size_t heap_len, heap_cap;

    /* what was emitted: the expectations */
    int64_t st_unique, st_dup[IDEM_DUP_CNT], st_poison[IDEM_REASON_CNT];
    json_t *ledger; /* {CUR: {user: cents}}, when sums is NULL */
    int64_t *sums;  /* [currency_idx * users + user - 1]: cents, or NULL */

    sbuf_t value;
    char key[64];
    char hdr_mid[37];
    char hdr_ikey[64];
};

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* A random stream for (seed, domain, n): independent per use and record. */
static uint64_t rng_state(const idem_gen_t *g, int domain, int64_t n)
{
    uint64_t s = g->opts.seed;
    uint64_t a = splitmix64(&s);
    s = a ^ ((uint64_t)domain << 56) ^
        ((uint64_t)n * UINT64_C(0xD6E8FEB86659FD93));
    splitmix64(&s);
    return s;
}

/* Writes the n low nibbles of v as lower-case hex, most significant
 * first. */
static char *hex_put(char *out, uint64_t v, int n)
{
    static const char digit[] = "0123456789abcdef";
    for (int i = n - 1; i >= 0; i--)
        out[i] = digit[(v >> (4 * (n - 1 - i))) & 0xF];
    return out + n;
}

/* A UUIDv4-formatted string from the stream s. */
static void rng_uuid(uint64_t *s, char out[37])
{
    uint64_t hi = splitmix64(s), lo = splitmix64(s);
    hi = (hi & ~UINT64_C(0xF000)) | UINT64_C(0x4000);       /* version 4 */
    lo = (lo & ~(UINT64_C(3) << 62)) | (UINT64_C(2) << 62); /* variant 10 */
    char *o = hex_put(out, hi >> 32, 8);
    *o++ = '-';
    o = hex_put(o, hi >> 16, 4);
    *o++ = '-';
    o = hex_put(o, hi, 4);
    *o++ = '-';
    o = hex_put(o, lo >> 48, 4);
    *o++ = '-';
    o = hex_put(o, lo, 12);
    *o = '\0';
}

static void sbuf_reset(sbuf_t *b)
{
    b->len = 0;
    if (b->buf)
        b->buf[0] = '\0';
}

static void sbuf_reserve(sbuf_t *b, size_t more)
{
    if (b->len + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 512;
    while (cap < b->len + more + 1)
        cap *= 2;
    b->buf = idem_xrealloc(b->buf, cap);
    b->cap = cap;
}

static void sbuf_printf(sbuf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sbuf_printf(sbuf_t *b, const char *fmt, ...)
{
    /* Formats once into the room there is; only a text that does not fit
     * is formatted a second time. */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if ((size_t)n >= b->cap - b->len) {
        sbuf_reserve(b, (size_t)n);
        va_start(ap, fmt);
        vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* Appends s; the payment's fields are built from these two and not with
 * printf, whose parsing of the format was the larger part of generating a
 * record. */
static void sbuf_puts(sbuf_t *b, const char *s)
{
    size_t n = strlen(s);
    sbuf_reserve(b, n);
    memcpy(b->buf + b->len, s, n + 1);
    b->len += n;
}

/* Appends v in decimal, at least `digits` digits (zero-padded). The
 * payment's numbers (user, cents) are never negative. */
static void sbuf_putuint(sbuf_t *b, uint64_t v, int digits)
{
    char t[24];
    int n = 0;
    do {
        t[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v || n < digits);
    sbuf_reserve(b, (size_t)n);
    while (n)
        b->buf[b->len++] = t[--n];
    b->buf[b->len] = '\0';
}

static void sbuf_putn(sbuf_t *b, char c, size_t n)
{
    sbuf_reserve(b, n);
    memset(b->buf + b->len, c, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

void idem_gen_opts_init(idem_gen_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->seed = 1;
    opts->count = 1000;
    opts->users = 100;
    opts->currencies = "EUR";
    /* One source of truth for the limit: the processor's own default. */
    idem_conf_t *conf = idem_conf_new();
    opts->too_large_bytes = conf->message_max_bytes + 1;
    idem_conf_destroy(conf);
}

/* Splits list into g->currencies (g may be NULL to only check). */
static int currencies_parse(idem_gen_t *g, const char *list, char *errstr,
                            size_t errstr_size)
{
    int cnt = 0;
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        int ok = n == 3;
        for (size_t i = 0; ok && i < 3; i++)
            ok = p[i] >= 'A' && p[i] <= 'Z';
        if (!ok) {
            snprintf(errstr, errstr_size,
                     "--currencies: \"%.*s\" is not 3 upper-case letters",
                     (int)(n > 32 ? 32 : n), p);
            return -1;
        }
        if (cnt == IDEM_GEN_CURRENCIES_MAX) {
            snprintf(errstr, errstr_size,
                     "--currencies: more than %d currencies",
                     IDEM_GEN_CURRENCIES_MAX);
            return -1;
        }
        if (g) {
            memcpy(g->currencies[cnt], p, 3);
            g->currencies[cnt][3] = '\0';
        }
        cnt++;
        if (!end)
            break;
        p = end + 1;
    }
    if (g)
        g->currency_cnt = cnt;
    return 0;
}

int idem_gen_currencies_check(const char *list, char *errstr,
                              size_t errstr_size)
{
    return currencies_parse(NULL, list, errstr, errstr_size);
}

idem_gen_t *idem_gen_new(const idem_gen_opts_t *opts, char *errstr,
                         size_t errstr_size)
{
    if (opts->count < 1 || opts->count > INT64_C(1000000000)) {
        snprintf(errstr, errstr_size,
                 "--count: %" PRId64 " out of range (1..1000000000)",
                 opts->count);
        return NULL;
    }
    if (opts->users < 1 || opts->users > INT64_C(1000000000)) {
        snprintf(errstr, errstr_size,
                 "--users: %" PRId64 " out of range (1..1000000000)",
                 opts->users);
        return NULL;
    }
    if (!(opts->duplicates >= 0 && opts->duplicates <= 1)) {
        snprintf(errstr, errstr_size, "--duplicates: %g out of range (0..1)",
                 opts->duplicates);
        return NULL;
    }
    if (!(opts->poison >= 0 && opts->poison <= 1)) {
        snprintf(errstr, errstr_size, "--poison: %g out of range (0..1)",
                 opts->poison);
        return NULL;
    }
    if (opts->too_large_bytes < 1024 ||
        opts->too_large_bytes > INT64_C(100000000)) {
        snprintf(errstr, errstr_size,
                 "--too-large-bytes: %" PRId64
                 " out of range (1024..100000000)",
                 opts->too_large_bytes);
        return NULL;
    }
    idem_gen_t *g = idem_xcalloc(1, sizeof(*g));
    if (currencies_parse(g, opts->currencies ? opts->currencies : "EUR", errstr,
                         errstr_size)) {
        free(g);
        return NULL;
    }
    g->opts = *opts;
    g->currencies_buf =
        idem_xstrdup(opts->currencies ? opts->currencies : "EUR");
    g->opts.currencies = g->currencies_buf;
    uint64_t s = rng_state(g, RNG_SEEDTAG, 0);
    snprintf(g->seedtag, sizeof(g->seedtag), "%06" PRIX64,
             splitmix64(&s) & 0xFFFFFF);
    g->n_primary = opts->count;
    g->n_poison = llround((double)opts->count * opts->poison);
    g->n_valid = g->n_primary - g->n_poison;
    g->n_dup = g->n_valid ? llround((double)opts->count * opts->duplicates) : 0;
    if (opts->users * g->currency_cnt <= GEN_SUMS_MAX)
        g->sums = idem_xcalloc((size_t)(opts->users * g->currency_cnt),
                               sizeof(*g->sums));
    else
        g->ledger = json_object();
    return g;
}

int64_t idem_gen_total(const idem_gen_t *gen)
{
    return gen->n_primary + gen->n_dup;
}

/* Min-heap on (due, far, seq). */
static int pending_less(const pending_t *a, const pending_t *b)
{
    if (a->due != b->due)
        return a->due < b->due;
    if (a->far != b->far)
        return a->far < b->far;
    return a->seq < b->seq;
}

static void heap_push(idem_gen_t *g, pending_t p)
{
    if (g->heap_len == g->heap_cap) {
        g->heap_cap = g->heap_cap ? g->heap_cap * 2 : 64;
        g->heap = idem_xrealloc(g->heap, g->heap_cap * sizeof(*g->heap));
    }
    size_t i = g->heap_len++;
    g->heap[i] = p;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pending_less(&g->heap[i], &g->heap[up]))
            break;
        pending_t t = g->heap[i];
        g->heap[i] = g->heap[up];
        g->heap[up] = t;
        i = up;
    }
}

static pending_t heap_pop(idem_gen_t *g)
{
    pending_t top = g->heap[0];
    g->heap[0] = g->heap[--g->heap_len];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < g->heap_len && pending_less(&g->heap[l], &g->heap[m]))
            m = l;
        if (r < g->heap_len && pending_less(&g->heap[r], &g->heap[m]))
            m = r;
        if (m == i)
            break;
        pending_t t = g->heap[i];
        g->heap[i] = g->heap[m];
        g->heap[m] = t;
        i = m;
    }
    return top;
}

/* Primaries are spread evenly: primary i is poison when the running quota
 * floor((i+1)*P/N) steps up at i. */
static int primary_is_poison(const idem_gen_t *g, int64_t i)
{
    return (i + 1) * g->n_poison / g->n_primary >
           i * g->n_poison / g->n_primary;
}

static void payment_make(const idem_gen_t *g, int64_t primary, payment_t *p)
{
    uint64_t s = rng_state(g, RNG_PAYMENT, primary);
    snprintf(p->order_id, sizeof(p->order_id), "ORD-%s-%08" PRId64, g->seedtag,
             primary + 1);
    rng_uuid(&s, p->message_id);
    idem_rfc3339(GEN_BASE_TIME_MS + primary * 1000, p->created_at,
                 sizeof(p->created_at));
    p->user = 1 + (int64_t)(splitmix64(&s) % (uint64_t)g->opts.users);
    uint64_t r = splitmix64(&s);
    /* mostly everyday amounts, one in eight up to the 1,000,000.00 cap */
    if (r % 8 == 0)
        p->cents = 1 + (int64_t)((r >> 3) % (uint64_t)GEN_MAX_AMOUNT_CENTS);
    else
        p->cents = 1 + (int64_t)((r >> 3) % 100000);
    p->currency_idx = (int)(splitmix64(&s) % (uint64_t)g->currency_cnt);
    p->currency = g->currencies[p->currency_idx];
}

/* Appends the payment's JSON object without its closing brace; fields can
 * be left out or replaced by the poison makers. */
enum {
    PAY_NO_IDENTITY = 1,
    PAY_NO_USER = 2,
    PAY_AMOUNT_RAW = 4, /* amount text comes from `amount` */
};

static void payment_json_open(sbuf_t *b, const payment_t *p,
                              const char *message_id, int flags,
                              const char *amount, const char *currency)
{
    sbuf_puts(b, "{");
    if (!(flags & PAY_NO_IDENTITY)) {
        sbuf_puts(b, "\"message_id\":\"");
        sbuf_puts(b, message_id);
        sbuf_puts(b, "\",\"idempotency_key\":\"payment-");
        sbuf_puts(b, p->order_id);
        sbuf_puts(b, "\",");
    }
    sbuf_puts(b, "\"event_type\":\"payment.captured\",\"created_at\":\"");
    sbuf_puts(b, p->created_at);
    sbuf_puts(b, "\",\"version\":1,\"order_id\":\"");
    sbuf_puts(b, p->order_id);
    sbuf_puts(b, "\",");
    if (!(flags & PAY_NO_USER)) {
        sbuf_puts(b, "\"user_id\":\"user-");
        sbuf_putuint(b, (uint64_t)p->user, 1);
        sbuf_puts(b, "\",");
    }
    sbuf_puts(b, "\"amount\":");
    if (flags & PAY_AMOUNT_RAW) {
        sbuf_puts(b, amount);
    } else {
        sbuf_putuint(b, (uint64_t)(p->cents / 100), 1);
        sbuf_puts(b, ".");
        sbuf_putuint(b, (uint64_t)(p->cents % 100), 2);
    }
    sbuf_puts(b, ",\"currency\":\"");
    sbuf_puts(b, currency ? currency : p->currency);
    sbuf_puts(b, "\"");
}

static void payment_json(sbuf_t *b, const payment_t *p, const char *message_id)
{
    payment_json_open(b, p, message_id, 0, NULL, NULL);
    sbuf_puts(b, "}");
}

static void record_headers(idem_gen_t *g, idem_gen_record_t *rec,
                           const char *message_id, const payment_t *p)
{
    snprintf(g->hdr_mid, sizeof(g->hdr_mid), "%s", message_id);
    snprintf(g->hdr_ikey, sizeof(g->hdr_ikey), "payment-%s", p->order_id);
    rec->hdr_message_id = g->hdr_mid;
    rec->hdr_idempotency_key = g->hdr_ikey;
    /* The key is the order_id, also of a record sent without these
     * headers (poison without identity). */
    rec->key_len = strlen(p->order_id);
    memcpy(g->key, p->order_id, rec->key_len + 1);
    rec->key = g->key;
}

/* Builds poison number k (reasons cycle too-large, not-json, not-object,
 * no-identity, invalid-field; each cycles through its flavours). */
static void poison_make(idem_gen_t *g, const payment_t *p, int64_t k,
                        idem_gen_record_t *rec)
{
    sbuf_t *b = &g->value;
    int reason = (int)(k % 5);
    int variant = (int)((k / 5) % 60);
    char amount[64];
    rec->kind = IDEM_GEN_POISON;
    rec->reason = reason;
    record_headers(g, rec, p->message_id, p);
    switch (reason) {
    case IDEM_REASON_TOO_LARGE: {
        variant = 0;
        payment_json_open(b, p, p->message_id, 0, NULL, NULL);
        const char *pad_open = ",\"padding\":\"", *pad_close = "\"}";
        size_t fixed = b->len + strlen(pad_open) + strlen(pad_close);
        size_t want = (size_t)g->opts.too_large_bytes;
        sbuf_printf(b, "%s", pad_open);
        sbuf_putn(b, 'x', want > fixed ? want - fixed : 0);
        sbuf_printf(b, "%s", pad_close);
        break;
    }
    case IDEM_REASON_NOT_JSON:
        variant %= 2;
        if (variant == 0) { /* truncated in the middle */
            payment_json(b, p, p->message_id);
            b->len /= 2;
            b->buf[b->len] = '\0';
        } else { /* well-formed but invalid UTF-8 in a string */
            payment_json_open(b, p, p->message_id, PAY_NO_USER, NULL, NULL);
            sbuf_printf(b, ",\"user_id\":\"user-\xff\xfe%" PRId64 "\"}",
                        p->user);
        }
        break;
    case IDEM_REASON_NOT_OBJECT:
        variant %= 3;
        if (variant == 0)
            sbuf_printf(b, "[\"payment-%s\",%" PRId64 ".%02" PRId64 "]",
                        p->order_id, p->cents / 100, p->cents % 100);
        else if (variant == 1)
            sbuf_printf(b, "\"payment-%s\"", p->order_id);
        else
            sbuf_printf(b, "%" PRId64 ".%02" PRId64, p->cents / 100,
                        p->cents % 100);
        break;
    case IDEM_REASON_NO_IDENTITY:
        variant = 0;
        payment_json_open(b, p, NULL, PAY_NO_IDENTITY, NULL, NULL);
        sbuf_printf(b, "}");
        rec->hdr_message_id = NULL;
        rec->hdr_idempotency_key = NULL;
        break;
    default: /* IDEM_REASON_INVALID_FIELD */
        variant %= 6;
        switch (variant) {
        case 0: /* amount as a string */
            snprintf(amount, sizeof(amount), "\"%" PRId64 ".%02" PRId64 "\"",
                     p->cents / 100, p->cents % 100);
            payment_json_open(b, p, p->message_id, PAY_AMOUNT_RAW, amount,
                              NULL);
            break;
        case 1: /* three decimals */
            snprintf(amount, sizeof(amount), "%" PRId64 ".%02" PRId64 "5",
                     p->cents / 100, p->cents % 100);
            payment_json_open(b, p, p->message_id, PAY_AMOUNT_RAW, amount,
                              NULL);
            break;
        case 2: /* zero */
            payment_json_open(b, p, p->message_id, PAY_AMOUNT_RAW, "0.00",
                              NULL);
            break;
        case 3: /* negative */
            snprintf(amount, sizeof(amount), "-%" PRId64 ".%02" PRId64,
                     p->cents / 100, p->cents % 100);
            payment_json_open(b, p, p->message_id, PAY_AMOUNT_RAW, amount,
                              NULL);
            break;
        case 4: { /* lower-case currency */
            char cur[4];
            for (int i = 0; i < 4; i++)
                cur[i] =
                    (char)(p->currency[i] ? p->currency[i] - 'A' + 'a' : '\0');
            payment_json_open(b, p, p->message_id, 0, NULL, cur);
            break;
        }
        default: /* user_id missing */
            payment_json_open(b, p, p->message_id, PAY_NO_USER, NULL, NULL);
            break;
        }
        sbuf_printf(b, "}");
        break;
    }
    rec->variant = variant;
    g->st_poison[reason]++;
}

static void ledger_add(idem_gen_t *g, const payment_t *p)
{
    if (g->sums) {
        g->sums[p->currency_idx * g->opts.users + p->user - 1] += p->cents;
        return;
    }
    json_t *cur = json_object_get(g->ledger, p->currency);
    if (!cur) {
        cur = json_object();
        json_object_set_new(g->ledger, p->currency, cur);
    }
    char user[32];
    snprintf(user, sizeof(user), "user-%" PRId64, p->user);
    json_t *sum = json_object_get(cur, user);
    if (sum)
        json_integer_set(sum, json_integer_value(sum) + p->cents);
    else
        json_object_set_new(cur, user, json_integer(p->cents));
}

/* Emits primary number g->next_primary: a valid payment (scheduling its
 * duplicates) or a poison record. */
static void primary_emit(idem_gen_t *g, idem_gen_record_t *rec)
{
    int64_t i = g->next_primary++;
    payment_t p;
    payment_make(g, i, &p);
    if (primary_is_poison(g, i)) {
        poison_make(g, &p, g->poison_seen++, rec);
        return;
    }
    payment_json(&g->value, &p, p.message_id);
    record_headers(g, rec, p.message_id, &p);
    rec->kind = IDEM_GEN_PAYMENT;
    g->st_unique++;
    ledger_add(g, &p);
    /* Duplicates are spread evenly over valid payments, the same way. */
    int64_t v = g->valid_seen++;
    int64_t copies =
        (v + 1) * g->n_dup / g->n_valid - v * g->n_dup / g->n_valid;
    for (int64_t c = 0; c < copies; c++) {
        pending_t d = {.primary = i,
                       .orig_index = g->index,
                       .dupno = g->dup_scheduled++,
                       .seq = g->seq++};
        d.far = (int)((d.dupno / 2) % 2);
        if (d.far) {
            uint64_t s = rng_state(g, RNG_FAR, d.dupno);
            d.due = i + GEN_FAR_MIN + (int64_t)(splitmix64(&s) % GEN_FAR_SPAN);
        } else {
            d.due = i;
        }
        heap_push(g, d);
    }
}

static void duplicate_emit(idem_gen_t *g, const pending_t *d,
                           idem_gen_record_t *rec)
{
    payment_t p;
    payment_make(g, d->primary, &p);
    int kind = (int)(d->dupno % 2) ? IDEM_DUP_RESEND : IDEM_DUP_REDELIVERY;
    char mid[37];
    if (kind == IDEM_DUP_RESEND) {
        uint64_t s = rng_state(g, RNG_RESEND_ID, d->dupno);
        rng_uuid(&s, mid);
    } else {
        memcpy(mid, p.message_id, sizeof(mid));
    }
    payment_json(&g->value, &p, mid);
    record_headers(g, rec, mid, &p);
    rec->kind = IDEM_GEN_DUPLICATE;
    rec->dup_kind = kind;
    rec->variant = d->far;
    rec->original_index = d->orig_index;
    g->st_dup[kind]++;
}

int idem_gen_next(idem_gen_t *gen, idem_gen_record_t *rec)
{
    memset(rec, 0, sizeof(*rec));
    rec->original_index = -1;
    sbuf_reset(&gen->value);
    sbuf_reserve(&gen->value, 0);
    int more_primaries = gen->next_primary < gen->n_primary;
    if (gen->heap_len &&
        (!more_primaries || gen->heap[0].due < gen->next_primary)) {
        pending_t d = heap_pop(gen);
        duplicate_emit(gen, &d, rec);
    } else if (more_primaries) {
        primary_emit(gen, rec);
    } else {
        return 0;
    }
    rec->value = gen->value.buf;
    rec->value_len = gen->value.len;
    rec->index = gen->index++;
    return 1;
}

/* The ledger as {CUR: {user: cents}} (a new reference): every user with a
 * payment (cents are at least 1, so a sum of 0 means none). */
static json_t *ledger_json(const idem_gen_t *gen)
{
    if (!gen->sums)
        return json_incref(gen->ledger);
    json_t *ledger = json_object();
    for (int c = 0; c < gen->currency_cnt; c++) {
        const int64_t *sum = gen->sums + c * gen->opts.users;
        json_t *cur = NULL;
        for (int64_t u = 0; u < gen->opts.users; u++) {
            if (!sum[u])
                continue;
            if (!cur) {
                cur = json_object();
                json_object_set_new(ledger, gen->currencies[c], cur);
            }
            char user[32];
            snprintf(user, sizeof(user), "user-%" PRId64, u + 1);
            json_object_set_new(cur, user, json_integer(sum[u]));
        }
    }
    return ledger;
}

json_t *idem_gen_expect(const idem_gen_t *gen)
{
    json_t *dups = json_object();
    for (int k = 0; k < IDEM_DUP_CNT; k++)
        json_object_set_new(dups, idem_dup_kind2str(k),
                            json_integer(gen->st_dup[k]));
    json_t *poison = json_object();
    for (int r = 0; r < IDEM_REASON_CNT; r++)
        json_object_set_new(poison, idem_reason2str(r),
                            json_integer(gen->st_poison[r]));
    return json_pack("{sI sI so so so sI}", "sent", (json_int_t)gen->index,
                     "unique", (json_int_t)gen->st_unique, "duplicates", dups,
                     "poison", poison, "ledger", ledger_json(gen), "applied",
                     (json_int_t)gen->st_unique);
}

int idem_gen_expect_fwrite(const idem_gen_t *gen, FILE *fp, char *errstr,
                           size_t errstr_size)
{
    json_t *e = idem_gen_expect(gen);
    int rc = json_dumpf(e, fp, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(e);
    if (rc || fputc('\n', fp) == EOF || fflush(fp)) {
        snprintf(errstr, errstr_size, "--expect: write failed");
        return -1;
    }
    return 0;
}

int idem_gen_expect_write(const idem_gen_t *gen, const char *path, char *errstr,
                          size_t errstr_size)
{
    if (!strcmp(path, "-"))
        return idem_gen_expect_fwrite(gen, stdout, errstr, errstr_size);
    FILE *fp = fopen(path, "w");
    if (!fp) {
        snprintf(errstr, errstr_size, "--expect: cannot write \"%s\": %m",
                 path);
        return -1;
    }
    int rc = idem_gen_expect_fwrite(gen, fp, errstr, errstr_size);
    if (fclose(fp) && !rc) {
        snprintf(errstr, errstr_size, "--expect: cannot write \"%s\": %m",
                 path);
        rc = -1;
    }
    return rc;
}

void idem_gen_destroy(idem_gen_t *gen)
{
    if (!gen)
        return;
    json_decref(gen->ledger);
    free(gen->sums);
    free(gen->heap);
    free(gen->value.buf);
    free(gen->currencies_buf);
    free(gen);
}
