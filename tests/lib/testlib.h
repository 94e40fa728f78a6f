/* testlib: helpers every test tier may use: the source tree, private temp
 * dirs and files, and parsers. Nothing here starts a server or a process,
 * so the unit tier links this and never the harness (tests/harness/). */
#ifndef IDEM_TESTLIB_H
#define IDEM_TESTLIB_H

#include <stddef.h>

/* Source tree root ($IDEMPROC_SRC, else "."). */
const char *th_src(void);

/* A new private temp dir (caller frees the string; th_rmrf removes it). */
char *th_tmpdir(void);
/* Removes a dir made by th_tmpdir and all below it; anything else is left
 * alone. */
void th_rmrf(const char *dir);

/* Reads a whole file; caller frees. NULL when missing. */
char *th_slurp(const char *path, size_t *len);

/* Writes text to path. 0 on success. */
int th_write_file(const char *path, const char *text);

/* Writes text to the file `name` in *dir, a th_tmpdir made on first use
 * (the caller removes it with th_rmrf and frees it). Returns the path: a
 * static buffer, valid until the next call; asserts that the write worked.
 */
const char *th_file_in(char **dir, const char *name, const char *text);

/* Value of the first sample line of `name` (with labels exactly as given,
 * e.g. "idemproc_records_total{outcome=\"processed\"}") in a Prometheus
 * text body; -1 when absent. */
double th_metric(const char *body, const char *name);

/* The processor's own verdict on a record (idem_envelope_parse with the
 * ledger fields), so generator tests check what the processor will do:
 * -1 for a valid payment with *env filled, else the poison reason. The
 * header values may be NULL (no such header). */
int th_classify(const char *value, size_t len, const char *hdr_mid,
                const char *hdr_ikey, size_t max_bytes, void *env);

#endif
