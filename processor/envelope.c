/* envelope: parses and validates one record's value and headers into what
 * the handlers need, or a poison reason with a human-readable error. */
#include "envelope.h"

#include <jansson.h>
#include <math.h>
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

int idem_amount_to_minor(double amount, int64_t *minor, char *errstr,
                         size_t errstr_size)
{
    if (!isfinite(amount) || amount <= 0 || amount > AMOUNT_MAX) {
        snprintf(errstr, errstr_size,
                 "amount: %.17g must be above 0 and at most %.0f", amount,
                 AMOUNT_MAX);
        return -1;
    }
    double scaled = amount * 100.0;
    double rounded = nearbyint(scaled);
    /* A decimal with at most 2 places, parsed to the nearest double and
     * scaled, lands within a few units in the last place of an integer;
     * any further digit puts it measurably farther away. */
    double ulp = nextafter(fabs(scaled), INFINITY) - fabs(scaled);
    if (fabs(scaled - rounded) > 8 * ulp) {
        snprintf(errstr, errstr_size, "amount: %.17g has more than 2 decimals",
                 amount);
        return -1;
    }
    if (rounded < 1) {
        snprintf(errstr, errstr_size, "amount: %.17g is below 0.01", amount);
        return -1;
    }
    *minor = (int64_t)rounded;
    return 0;
}

/* Copies header `name` into out when present (as a string). Returns 1 when
 * found, 0 when absent, -1 when too long. */
static int header_string(const rd_kafka_headers_t *headers, const char *name,
                         char *out, size_t out_size)
{
    const void *v;
    size_t sz;
    if (!headers || rd_kafka_header_get_last(headers, name, &v, &sz) != 0 || !v)
        return 0;
    if (sz >= out_size)
        return -1;
    memcpy(out, v, sz);
    out[sz] = '\0';
    return sz > 0 ? 1 : 0;
}

/* Reads optional string field `name` of obj into out. Returns 1 found,
 * 0 absent, -1 invalid (errstr filled). */
static int field_string(json_t *obj, const char *name, char *out,
                        size_t out_size, char *errstr, size_t errstr_size)
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
    return 1;
}

static int parse_ledger_fields(json_t *obj, idem_envelope_t *out, char *errstr,
                               size_t errstr_size)
{
    int r = field_string(obj, "user_id", out->user_id, sizeof(out->user_id),
                         errstr, errstr_size);
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
    if (idem_amount_to_minor(json_number_value(amount), &out->amount_minor,
                             errstr, errstr_size))
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

int idem_envelope_parse(const void *value, size_t len,
                        const rd_kafka_headers_t *headers, int need_ledger,
                        size_t max_bytes, idem_envelope_t *out,
                        idem_reason_t *reason, char *errstr, size_t errstr_size)
{
    memset(out, 0, sizeof(*out));
    if (len > max_bytes) {
        *reason = IDEM_REASON_TOO_LARGE;
        snprintf(errstr, errstr_size,
                 "value is %zu bytes, above message.max.bytes %zu", len,
                 max_bytes);
        return -1;
    }
    if (!value || len == 0) {
        *reason = IDEM_REASON_NOT_JSON;
        snprintf(errstr, errstr_size, "empty value");
        return -1;
    }
    json_error_t jerr;
    arena_begin();
    json_t *root = json_loadb(value, len, JSON_DECODE_ANY, &jerr);
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

    int r = -1;
    *reason = IDEM_REASON_INVALID_FIELD;
    char key[IDEM_ENVELOPE_ID_MAX + 1] = "";
    int have_key = field_string(root, "idempotency_key", key, sizeof(key),
                                errstr, errstr_size);
    if (have_key < 0)
        goto done;
    int have_mid = field_string(root, "message_id", out->message_id,
                                sizeof(out->message_id), errstr, errstr_size);
    if (have_mid < 0)
        goto done;
    if (!have_key && (have_key = header_string(headers, "idempotency_key", key,
                                               sizeof(key))) < 0) {
        snprintf(errstr, errstr_size, "idempotency_key: header too long");
        goto done;
    }
    if (!have_mid &&
        (have_mid = header_string(headers, "message_id", out->message_id,
                                  sizeof(out->message_id))) < 0) {
        snprintf(errstr, errstr_size, "message_id: header too long");
        goto done;
    }
    if (have_key) {
        memcpy(out->identity, key, sizeof(out->identity));
    } else if (have_mid) {
        memcpy(out->identity, out->message_id, sizeof(out->identity));
    } else {
        *reason = IDEM_REASON_NO_IDENTITY;
        snprintf(errstr, errstr_size,
                 "neither idempotency_key nor message_id in value or headers");
        goto done;
    }
    if (need_ledger && parse_ledger_fields(root, out, errstr, errstr_size))
        goto done;
    r = 0;
done:
    json_decref(root);
    arena_end();
    return r;
}
