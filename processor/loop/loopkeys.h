/* loopkeys: the consumer loop's configuration keys (batches, commits,
 * retries, health, the fetch watch and its development faults). */
#ifndef IDEM_LOOPKEYS_H
#define IDEM_LOOPKEYS_H

#include "conf/conf.h"

extern const idem_conf_module_t idem_loop_conf;

#endif
