/* envelope: parses and validates one record's value and headers into what
 * the handlers need (identity, message_id, ledger fields), or a poison
 * reason with a human-readable error (README.md, "The envelope"). */
#ifndef IDEM_ENVELOPE_H
#define IDEM_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "base/outcome.h"

#define IDEM_ENVELOPE_ID_MAX 256 /* longest identity / message_id kept */
#define IDEM_ENVELOPE_FIELDS_MAX                                               \
    32 /* most JSON Pointers extracted per record                              \
        (idem_envelope_rules_fields) */

/* What a field a handler asked for (idem_envelope_rules_fields) held in the
 * record's JSON value. */
typedef enum {
    IDEM_FIELD_ABSENT = '-', /* no such member (or the value is no object) */
    IDEM_FIELD_STRING = 's', /* text: the string's bytes (escapes decoded) */
    IDEM_FIELD_NUMBER = 'n', /* text: the number as jansson read it, printed
                                so that strtod gives the same double back */
    IDEM_FIELD_TRUE = 't',
    IDEM_FIELD_FALSE = 'f',
    IDEM_FIELD_NULL = 'z',
    IDEM_FIELD_JSON = 'j', /* an object or array: text is its compact JSON */
} idem_field_type_t;

typedef struct {
    idem_field_type_t type;
    const char *text; /* NUL-terminated too; "" for the types without text */
    size_t len;
} idem_envelope_field_t;

/* identity and message_id are byte strings with a length: a header value
 * may hold NUL bytes, which are data, never an end (the arrays are also
 * NUL-terminated for printing, which stops at the first NUL). */
typedef struct {
    char identity[IDEM_ENVELOPE_ID_MAX + 1]; /* idempotency_key or message_id */
    size_t identity_len;
    char message_id[IDEM_ENVELOPE_ID_MAX + 1]; /* "" when absent */
    size_t message_id_len;
    /* ledger fields (filled when `need_ledger`) */
    char user_id[IDEM_ENVELOPE_ID_MAX + 1];
    char currency[4];
    int64_t amount_minor; /* amount in minor units (cents) */
    int json_object;      /* the value was parsed as a JSON object */
    /* The rules' fields (idem_envelope_rules_fields), in their order; NULL
     * and 0 when the rules ask for none. One heap block owned by the
     * envelope: idem_envelope_term frees it. */
    idem_envelope_field_t *fields;
    size_t nfields;
} idem_envelope_t;

/* Frees what idem_envelope_read allocated in env (its fields) and zeroes
 * them; the rest of env stays. NULL-safe, idempotent. */
void idem_envelope_term(idem_envelope_t *env);

/* envelope.format: how a record's value is read. */
typedef enum {
    IDEM_ENVELOPE_JSON = 0, /* a JSON object (identity sources may point in) */
    IDEM_ENVELOPE_BYTES     /* not parsed at all: any bytes, null included */
} idem_envelope_format_t;

/* The defaults of envelope.identity and envelope.message.id. */
#define IDEM_ENVELOPE_IDENTITY_DEFAULT                                         \
    "value:/idempotency_key,header:idempotency_key,value:/message_id,"         \
    "header:message_id"
#define IDEM_ENVELOPE_MESSAGE_ID_DEFAULT "value:/message_id,header:message_id"

/* How records are read (envelope.format, envelope.identity,
 * envelope.message.id, whether payment fields are required). */
typedef struct idem_envelope_rules_s idem_envelope_rules_t;

/* Checks the syntax of a source list (`key` names it in errstr): comma
 * separated value:<JSON Pointer, RFC 6901>, header:<name> or key; an empty
 * list only when allow_empty. Returns 0 or -1. */
int idem_envelope_sources_check(const char *key, const char *list,
                                int allow_empty, char *errstr,
                                size_t errstr_size);

/* A comma list of JSON Pointers (RFC 6901, each starting with '/'; blanks
 * around commas ignored) split into a new array of copies in *out, their
 * count in *n (0 for an empty list; at most IDEM_ENVELOPE_FIELDS_MAX, each
 * once). Returns 0, or -1 with errstr naming `key` and the pointer. Free
 * with idem_envelope_pointers_free(*out, *n). */
int idem_envelope_pointers_parse(const char *key, const char *list, char ***out,
                                 size_t *n, char *errstr, size_t errstr_size);
void idem_envelope_pointers_free(char **ptrs, size_t n);

/* Asks idem_envelope_read to extract the values at these JSON Pointers
 * (a list for idem_envelope_pointers_parse; `key` names it in errstr) into
 * each envelope's fields. Only with envelope.format=json. Returns 0 or -1
 * with errstr. */
int idem_envelope_rules_fields(idem_envelope_rules_t *r, const char *key,
                               const char *list, char *errstr,
                               size_t errstr_size);

/* New rules (format: idem_envelope_format_t of conf.h). Returns NULL with
 * errstr for a bad source list. */
idem_envelope_rules_t *idem_envelope_rules_new(int format, const char *identity,
                                               const char *message_id,
                                               int need_ledger,
                                               size_t max_bytes, char *errstr,
                                               size_t errstr_size);
void idem_envelope_rules_destroy(idem_envelope_rules_t *r); /* NULL ok */

/* How many records this thread's idem_envelope_read and _read_msg calls
 * took by the fast read (envscan.c), for tests that the fast read serves
 * the records they mean it to. */
unsigned long idem_envelope_fast_reads(void);

/* Reads one record by `rules`: value (`len` bytes, NULL for a null value),
 * headers and Kafka key (key_len 0: none), all borrowed. With
 * envelope.format=json the value must be a JSON object; with bytes it is
 * not parsed (value: sources are skipped). The identity is the first
 * source found (a value: source must be a non-empty JSON string, or a JSON
 * integer within 64 bits, which counts as its decimal text); the message
 * id likewise (none found: message_id_len 0). Same results as
 * idem_envelope_parse. With fields asked for (idem_envelope_rules_fields),
 * a good record's out->fields holds them: the caller owns that block and
 * frees it with idem_envelope_term (also before reading into `out` again).
 * A field never makes a record poison. */
int idem_envelope_read(const idem_envelope_rules_t *rules, const void *value,
                       size_t len, const rd_kafka_headers_t *headers,
                       const void *key, size_t key_len, idem_envelope_t *out,
                       idem_reason_t *reason, char *errstr, size_t errstr_size);

/* idem_envelope_read for a consumed message (borrowed): its value, key and
 * headers. The headers are parsed (rd_kafka_message_headers) only when a
 * header: source is reached; *headers gets them when they were, else NULL
 * (the caller reads them itself if it needs them). */
int idem_envelope_read_msg(const idem_envelope_rules_t *rules,
                           rd_kafka_message_t *msg,
                           const rd_kafka_headers_t **headers,
                           idem_envelope_t *out, idem_reason_t *reason,
                           char *errstr, size_t errstr_size);

/* Good JSON records are read by a fast path first (one pass, envscan.h)
 * and by jansson only when it is not sure; the results are the same. `on` 0
 * makes these rules read every record with jansson (tests compare the two).
 * Rules start with the fast path on where it applies. */
void idem_envelope_rules_fast(idem_envelope_rules_t *r, int on);

/* idem_envelope_read with the default rules (JSON object, the default
 * identity and message id sources). Parses `value` (borrowed, `len` bytes) with
 * the record's `headers` (borrowed, may be NULL). With need_ledger also
 * validates user_id, amount and currency. Returns 0 and fills `out` for a good
 * record; returns -1 for poison with *reason set and a one-line explanation in
 * errstr (for invalid-field it starts with the field name: "amount: ...").
 * `max_bytes` is message.max.bytes. */
int idem_envelope_parse(const void *value, size_t len,
                        const rd_kafka_headers_t *headers, int need_ledger,
                        size_t max_bytes, idem_envelope_t *out,
                        idem_reason_t *reason, char *errstr,
                        size_t errstr_size);

/* Converts the literal text of a JSON number (`len` bytes, as written in
 * the record) to minor units, exactly and without floating point: the
 * amount must be a whole number of cents (trailing zeros and exponents are
 * fine: 1.50, 1.500, 15e-1), above 0 and at most 1,000,000,000. Returns 0,
 * or -1 with errstr quoting the literal ("amount: 1.005 has more than 2
 * decimals"). */
int idem_amount_parse(const char *text, size_t len, int64_t *minor,
                      char *errstr, size_t errstr_size);

/* A copy of the JSON object `value` (`len` bytes, one idem_envelope_parse
 * accepted) with member `name` set to the JSON text `text`: its value
 * replaced where the member exists, else the member added last. Every
 * other byte is kept as it was (amounts keep their digits). Returns a new
 * NUL-terminated string the caller frees with free(), its length in
 * *out_len. */
char *idem_envelope_set_member(const void *value, size_t len, const char *name,
                               const char *text, size_t *out_len);

#endif
