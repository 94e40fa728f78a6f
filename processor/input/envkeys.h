/* envkeys: the input folder's configuration keys (envelope.*). */
#ifndef IDEM_ENVKEYS_H
#define IDEM_ENVKEYS_H

#include "conf/conf.h"

extern const idem_conf_module_t idem_envelope_conf;

#endif
