/* envscan: the fast path of reading an envelope: one pass over a JSON
 * object, within a strict subset of JSON, that picks out the values at a
 * few JSON Pointers, for records jansson would accept; anything it is not
 * sure of is left to the full jansson parse (envelope.c, docs/design.md
 * "Reading a record fast"). */
#ifndef IDEM_ENVSCAN_H
#define IDEM_ENVSCAN_H

#include <stddef.h>

/* Steps (pointer tokens) one scan follows. */
#define IDEM_ENVSCAN_STEPS_MAX 64

typedef enum {
    IDEM_ENVSCAN_ABSENT = 0, /* no such member */
    IDEM_ENVSCAN_NULL,       /* null */
    IDEM_ENVSCAN_STRING,     /* a string: see text, text_len, str_len */
    IDEM_ENVSCAN_NUMBER,     /* a number: its literal in text, text_len */
    IDEM_ENVSCAN_TRUE,
    IDEM_ENVSCAN_FALSE,
    IDEM_ENVSCAN_OBJECT,
    IDEM_ENVSCAN_ARRAY,
} idem_envscan_kind_t;

/* One step of a JSON Pointer: the member `name` (`len` bytes, decoded: no
 * ~0 ~1 left) of the object that is the value of step `parent`, or of the
 * envelope object when parent is -1. The steps of all the pointers a scan
 * follows form a tree (a parent comes before its children; two steps with
 * the same parent and name are one). */
typedef struct {
    const char *name;
    size_t len;
    int parent;
} idem_envscan_step_t;

typedef struct {
    idem_envscan_kind_t kind;
    /* Borrowed from the scanned value: a string's bytes between its quotes
     * as written (escapes not decoded), or a number's literal. */
    const char *text;
    size_t text_len;
    /* A string's length decoded (every escape the scan reads is two bytes
     * for one: text_len when it holds none). */
    size_t str_len;
} idem_envscan_field_t;

/* Scans `value` (`len` bytes, borrowed) as a JSON object and fills
 * fields[i] with the value at steps[i] (n <= IDEM_ENVSCAN_STEPS_MAX; names
 * compared byte for byte). Returns 0 when the value is a JSON object that
 * jansson's json_loadb with JSON_REJECT_DUPLICATES |
 * JSON_DECODE_INT_AS_REAL accepts too; -1 when it is not, or when the scan
 * cannot tell cheaply (non-ASCII bytes, \u escapes, exponents, deep
 * nesting, many keys, a step's parent that is an array): the caller then
 * parses with jansson, which gives the verdict and the error text. Never
 * allocates. */
int idem_envscan(const void *value, size_t len,
                 const idem_envscan_step_t *steps, size_t n,
                 idem_envscan_field_t *fields);

/* Writes string field f's decoded bytes (f->str_len of them) and a NUL to
 * out (room for f->str_len + 1). */
void idem_envscan_string(const idem_envscan_field_t *f, char *out);

#endif
