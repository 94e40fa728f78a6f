/* outboxkeys: the outbox relay's configuration keys (outbox.*). */
#ifndef IDEM_OUTBOXKEYS_H
#define IDEM_OUTBOXKEYS_H

#include "conf/conf.h"

extern const idem_conf_module_t idem_outbox_conf;

#endif
