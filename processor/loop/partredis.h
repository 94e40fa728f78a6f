/* partredis: partscope's Redis side (loop/partscope.h's seam) over the
 * real thing: the partition layout (redis/partstate.h), the store's
 * positions and connection, and the group's layout key (redis/layout.h). */
#ifndef IDEM_PARTREDIS_H
#define IDEM_PARTREDIS_H

#include <stddef.h>

#include "conf/conf.h"
#include "loop/partscope.h"
#include "redis/store.h"

/* Fills *out with the seam over store (borrowed; an effect registered,
 * idem_store_effect_register) and conf (borrowed); out->ctx is owned by the
 * seam and freed by out->destroy. 0, or -1 with errstr (no effect
 * registered: idem_partstate_new's error). */
int idem_partredis_open(idem_store_t *store, const idem_conf_t *conf,
                        idem_partscope_redis_t *out, char *errstr,
                        size_t errstr_size);

#endif
