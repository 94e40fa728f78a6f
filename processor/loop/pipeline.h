/* pipeline: the processing loop of `idemproc run`: consume batches, dedup
 * and apply them through Redis, dead-letter poison, commit finished
 * prefixes, survive rebalances and infrastructure outages. */
#ifndef IDEM_PIPELINE_H
#define IDEM_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"
#include "obs/metrics.h"

typedef struct idem_pipeline_s idem_pipeline_t;

/* Creates the consumer, the DLQ producer (and the output producer for the
 * forward handler) and subscribes to input.topics. conf and m are borrowed
 * and must outlive the pipeline. Returns NULL with errstr. */
idem_pipeline_t *idem_pipeline_new(const idem_conf_t *conf, idem_metrics_t *m,
                                   char *errstr, size_t errstr_size);

/* Runs until *stop becomes non-zero (set from a signal handler), then
 * shuts down (docs/design.md, "Shutdown"): finishes the batch in hand, flushes
 * the DLQ, commits synchronously and leaves the group within
 * shutdown.timeout.ms. Returns 0 on a clean stop, -1 on a fatal error
 * (errstr), IDEM_PIPELINE_REFUSED when the Redis server's configuration is
 * unsafe (an evicting maxmemory-policy; errstr says why and how to fix
 * it). */
#define IDEM_PIPELINE_REFUSED (-2)
int idem_pipeline_run(idem_pipeline_t *p, volatile int *stop, char *errstr,
                      size_t errstr_size);

/* fn is called on the processing thread when shutdown begins, whatever
 * the cause (a signal, a fatal producer error): the command arms its
 * watchdog there. */
void idem_pipeline_on_shutdown(idem_pipeline_t *p, void (*fn)(void));

/* Where member.memory.max reads the member's RSS (bytes; -1: unknown):
 * fn(opaque) on the processing thread every 100 ms, instead of
 * /proc/self (idem_procstat_rss_bytes). For the development fault
 * dev.fault.member.rss.file, wired by the command (dev/faults.h); NULL
 * goes back to /proc/self. */
void idem_pipeline_rss_source(idem_pipeline_t *p, int64_t (*fn)(void *opaque),
                              void *opaque);

void idem_pipeline_destroy(idem_pipeline_t *p); /* NULL is a no-op */

#endif
