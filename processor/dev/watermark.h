/* watermark: notices records a broker dropped from the start of a
 * partition (retention, or the embedded broker's size limit) by watching
 * each partition's low watermark through a client of its own. */
#ifndef IDEM_WATERMARK_H
#define IDEM_WATERMARK_H

#include <stddef.h>
#include <stdint.h>

typedef struct idem_watermark_s idem_watermark_t;

/* Called for a partition whose earliest offset moved up since the last
 * check (or is above 0 at the first): `low` is the new earliest offset,
 * `dropped` how many records went since the last call (all of them, low,
 * at the first). Strings are borrowed for the call. */
typedef void idem_watermark_cb(const char *topic, int32_t partition,
                               int64_t low, int64_t dropped, void *opaque);

/* A watcher of every topic on `bootstrap` (borrowed). Its client logs
 * nothing. Returns NULL with errstr when the client cannot be created. */
idem_watermark_t *idem_watermark_new(const char *bootstrap, char *errstr,
                                     size_t errstr_size);

/* Reads the low watermark of every partition of every topic (the whole
 * check bounded by timeout_ms: partitions it did not reach wait for the
 * next check) and calls cb for those that moved up. Returns 0,
 * or -1 with errstr when the broker did not answer (nothing is called). */
int idem_watermark_check(idem_watermark_t *w, int timeout_ms,
                         idem_watermark_cb *cb, void *opaque, char *errstr,
                         size_t errstr_size);

/* NULL is a no-op. */
void idem_watermark_destroy(idem_watermark_t *w);

#endif
