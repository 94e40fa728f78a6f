/* plugin: loads a handler plugin (handler=plugin:PATH.so) with dlopen and
 * checks it speaks this idemproc's plugin ABI before anything else of it is
 * trusted. The contract a plugin implements is the public header
 * include/idemproc/plugin.h. */
#ifndef IDEM_PLUGIN_H
#define IDEM_PLUGIN_H

#include <stddef.h>

#include "idemproc/plugin.h"

typedef struct idem_plugin_s idem_plugin_t;

/* Loads the shared object at `path` (borrowed; a path without a '/' is
 * taken relative to the working directory, never searched for in the
 * system's library directories), finds IDEMPROC_PLUGIN_SYMBOL in it and
 * checks the table: its ABI version must be IDEMPROC_PLUGIN_ABI_VERSION,
 * its size at least this version's, its name set and its required ops
 * present. Returns the loaded plugin, or NULL with errstr naming the path
 * and the problem (dlopen's own text for a file that does not load, the
 * plugin's ABI version and ours on a mismatch). */
idem_plugin_t *idem_plugin_open(const char *path, char *errstr,
                                size_t errstr_size);

/* The plugin's table (borrowed: valid until idem_plugin_close). */
const idemproc_plugin_t *idem_plugin_table(const idem_plugin_t *pl);

/* The path it was loaded from (borrowed). */
const char *idem_plugin_path(const idem_plugin_t *pl);

/* Unloads it. Nothing of its table may be used afterwards. NULL is
 * ignored. */
void idem_plugin_close(idem_plugin_t *pl);

#endif
