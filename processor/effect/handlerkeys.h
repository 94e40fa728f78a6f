/* handlerkeys: the handlers' part of the configuration (conf.h). */
#ifndef IDEM_HANDLERKEYS_H
#define IDEM_HANDLERKEYS_H

#include <stddef.h>

#include "conf/conf.h"

/* The `handler` key and the check that it names a registered handler. */
extern const idem_conf_module_t idem_handler_conf;

/* The i-th registered handler's keys as a module, active only when that
 * handler is selected; NULL past the last. */
const idem_conf_module_t *idem_handler_conf_at(size_t i);

#endif
