/* inputline: what `produce --input` reads from one line: whether it is
 * JSON, and its key, message_id and idempotency_key. */
#ifndef IDEM_INPUTLINE_H
#define IDEM_INPUTLINE_H

#include <stddef.h>

/* One line's reading. The strings point into the reader's own buffer and
 * stay valid until the next idem_inputline_read() or _term(). */
typedef struct {
    int json;           /* the line is one JSON value (of any type) */
    int object;         /* ... and that value is an object */
    int members;        /* the object has at least one member */
    int has_message_id; /* the object has a member message_id (any type) */
    /* The key: the value at key_field, else message_id; a string
     * (decoded) or an integer (as jansson prints it). NULL: none. */
    const char *key;
    size_t key_len;
    int key_found; /* key_field held a string or an integer */
    /* message_id and idempotency_key (string or integer, as the key), NUL
     * terminated; NULL: none. */
    const char *message_id;
    const char *idempotency_key;
    int scanned; /* read by the envelope scan, without jansson (for tests) */
    char *buf;   /* private: the decoded strings */
    size_t cap;
    int jansson_only; /* private: idem_inputline_fast(il, 0) */
} idem_inputline_t;

void idem_inputline_init(idem_inputline_t *il);
void idem_inputline_term(idem_inputline_t *il);

/* The envelope scan reads the lines it is sure of (the default); `on` 0
 * makes this reader give every line to jansson, so that tests can compare
 * the two readings of the same line. Stays across reads. */
void idem_inputline_fast(idem_inputline_t *il, int on);

/* Reads `line` (`len` bytes, borrowed, no newline) into *il. key_field is
 * where the key is: a JSON Pointer (RFC 6901: "/order/customer/id",
 * "/items/0/sku") or a top-level member's name ("sku" is "/sku"); NULL:
 * none, the key is message_id. A
 * line is JSON when jansson reads it (JSON_DECODE_ANY); an integer too
 * large for 64 bits does not make it "not JSON" (RFC 8259 allows it), but
 * such a member is no key or id. The envelope scan (input/envscan.h) reads
 * the objects it is sure of at a fraction of jansson's cost; what it
 * leaves goes to jansson, with the same result. Never fails. */
void idem_inputline_read(idem_inputline_t *il, const char *line, size_t len,
                         const char *key_field);

#endif
