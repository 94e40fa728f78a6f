/* loopkeys: the consumer loop's configuration keys (batches, commits,
 * retries, health, the fetch watch and its development faults). */
#ifndef IDEM_LOOPKEYS_H
#define IDEM_LOOPKEYS_H

#include "conf/conf.h"

extern const idem_conf_module_t idem_loop_conf;

/* The consumer's prefetch bound in KiB: kafka.queued.max.messages.kbytes
 * when set, else IDEM_PREFETCH_KBYTES_DEFAULT (loop/membound.h). */
int64_t idem_loop_prefetch_kbytes(const idem_conf_t *conf);

#endif
