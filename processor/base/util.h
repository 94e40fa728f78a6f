/* util: allocation that cannot fail, clocks, and small parsers shared by
 * every command. */
#ifndef IDEM_UTIL_H
#define IDEM_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Allocation: abort() on out-of-memory; there is no sane way to go on. */
void *idem_xmalloc(size_t size);
void *idem_xcalloc(size_t n, size_t size);
void *idem_xrealloc(void *ptr, size_t size);
char *idem_xstrdup(const char *s);

/* Monotonic clock in milliseconds / microseconds; wall clock in ms. */
int64_t idem_now_ms(void);
int64_t idem_now_us(void);
int64_t idem_wall_ms(void);
int64_t idem_wall_us(void); /* CLOCK_REALTIME in microseconds */

/* Formats wall-clock milliseconds as RFC 3339 UTC with milliseconds into
 * buf (at least 32 bytes). Returns buf. */
/* Writes v in decimal at p (no NUL: at most 20 bytes); returns the end.
 * For hot paths where snprintf costs. */
char *idem_put_u64(char *p, uint64_t v);

char *idem_rfc3339(int64_t wall_ms, char *buf, size_t size);

/* A fresh random UUID (libuuid) as 36 characters + NUL into out[37]. */
void idem_uuid(char out[37]);

/* A UUID derived from `len` bytes of data (name-based, SHA-1: version 5
 * in an idemproc name space): the same bytes always give the same id. */
void idem_uuid_stable(const void *data, size_t len, char out[37]);

/* Reads a duration: digits with an optional unit (ms, s, m, h, d, as
 * 1500ms, 30s, 5m, 2h, 7d); a bare number counts in `unit_ms` (1 for a
 * key in milliseconds, 1000 for one in seconds). Puts the value in units
 * of unit_ms in *out. Returns 0; IDEM_DURATION_SYNTAX when the text is not
 * a duration, IDEM_DURATION_FRACTION when it is not a whole number of
 * unit_ms (1500ms as seconds), IDEM_DURATION_RANGE past int64. */
#define IDEM_DURATION_SYNTAX   (-1)
#define IDEM_DURATION_FRACTION (-2)
#define IDEM_DURATION_RANGE    (-3)
int idem_duration_parse(const char *text, int64_t unit_ms, int64_t *out);

/* Levenshtein distance between a and b, for "did you mean" hints. */
size_t idem_edit_distance(const char *a, const char *b);

/* The one of names[n] closest to `word` when it is plausibly a typo of it
 * (at most 1 + strlen(word) / 4 edits), else NULL. Borrowed. */
const char *idem_closest_name(const char *word, const char *const *names,
                              size_t n);

/* Sleeps ms milliseconds (restarting on EINTR unless *stop becomes set;
 * stop may be NULL). */
void idem_sleep_ms(int64_t ms, volatile int *stop);

#endif
