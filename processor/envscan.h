/* envscan: the fast path of reading an envelope: one pass over a JSON
 * object, within a strict subset of JSON, that picks out a few top-level
 * members, for records jansson would accept; anything it is not sure of is
 * left to the full jansson parse (envelope.c, docs/design.md "Reading a
 * record fast"). */
#ifndef IDEM_ENVSCAN_H
#define IDEM_ENVSCAN_H

#include <stddef.h>

#define IDEM_ENVSCAN_FIELDS_MAX 8 /* members one scan can pick out */
#define IDEM_ENVSCAN_STRING_MAX                                                \
    256 /* longest string kept (IDEM_ENVELOPE_ID_MAX) */

typedef enum {
    IDEM_ENVSCAN_ABSENT = 0, /* no such member */
    IDEM_ENVSCAN_NULL,       /* null */
    IDEM_ENVSCAN_STRING,     /* a string: bytes in str, str_len */
    IDEM_ENVSCAN_NUMBER,     /* a number: its literal text in num, num_len */
    IDEM_ENVSCAN_OTHER,      /* true, false, an object, an array, or a string
                                too long to keep */
} idem_envscan_kind_t;

typedef struct {
    idem_envscan_kind_t kind;
    char str[IDEM_ENVSCAN_STRING_MAX + 1]; /* NUL-terminated copy */
    size_t str_len;
    const char *num; /* borrowed from the scanned value */
    size_t num_len;
} idem_envscan_field_t;

/* Scans `value` (`len` bytes, borrowed) as a JSON object and fills
 * fields[i] for the top-level member names[i] (n <= IDEM_ENVSCAN_FIELDS_MAX,
 * plain names compared byte for byte). Returns 0 when the value is a JSON
 * object that jansson's json_loadb with JSON_REJECT_DUPLICATES |
 * JSON_DECODE_INT_AS_REAL accepts too; -1 when it is not, or when the scan
 * cannot tell cheaply (non-ASCII bytes, \u escapes, exponents, deep
 * nesting, many keys): the caller then parses with jansson, which gives
 * the verdict and the error text. Never allocates. */
int idem_envscan(const void *value, size_t len, const char *const *names,
                 const size_t *name_lens, size_t n,
                 idem_envscan_field_t *fields);

#endif
