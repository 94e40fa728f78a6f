/* plugin: dlopen of a handler plugin and the ABI check at load. */
#include "effect/plugin.h"
#include "base/util.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct idem_plugin_s {
    void *dl;
    const idemproc_plugin_t *table;
    char *path;
};

/* "handler=plugin:PATH: <what>" into errstr. */
static void err_set(char *errstr, size_t errstr_size, const char *path,
                    const char *what)
{
    snprintf(errstr, errstr_size, "handler=plugin:%s: %s", path, what);
}

/* Why key name `k` can never be set as plugin.<k>, or NULL when it can.
 * "<key>.file" reads <key>'s value from a file, so a name that is "file"
 * or ends in ".file" would be taken for that. */
static const char *key_name_problem(const char *k)
{
    size_t n = strlen(k);
    if (!n)
        return "declares a key with an empty name";
    if (!strcmp(k, "file") || (n > 5 && !strcmp(k + n - 5, ".file")))
        return "declares a key named \"file\" or \"*.file\", which cannot "
               "be set (plugin.<key>.file reads plugin.<key> from a file)";
    for (const char *c = k; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
              *c == '.'))
            return "declares a key name with other than a-z, 0-9 and '.' "
                   "(IDEMPROC_PLUGIN_<NAME> could not set it)";
    return NULL;
}

/* The checks after the ABI version matched: what this version requires of
 * a table. Returns NULL when it is usable, else what is wrong. */
static const char *table_problem(const idemproc_plugin_t *t)
{
    if (t->struct_size < sizeof(*t))
        return "its table is smaller than this ABI version's (struct_size)";
    if (!t->name || !*t->name)
        return "its table has no name";
    if (!t->start)
        return "its table has no start op";
    if (!t->submit)
        return "its table has no submit op";
    if (!t->collect)
        return "its table has no collect op";
    if (!t->drain)
        return "its table has no drain op";
    if (!t->stop)
        return "its table has no stop op";
    for (const idemproc_key_t *k = t->keys; k && k->name; k++) {
        const char *problem = key_name_problem(k->name);
        if (problem)
            return problem;
    }
    return NULL;
}

idem_plugin_t *idem_plugin_open(const char *path, char *errstr,
                                size_t errstr_size)
{
    if (!path || !*path) {
        err_set(errstr, errstr_size, "", "no path after plugin:");
        return NULL;
    }
    /* dlopen searches LD_LIBRARY_PATH and the system's directories for a
     * bare file name: a plugin named in a config file is a file, so a name
     * without a slash means the working directory. */
    size_t n = strlen(path) + 3;
    char *full = idem_xmalloc(n);
    snprintf(full, n, "%s%s", strchr(path, '/') ? "" : "./", path);
    /* RTLD_NOW: a symbol the plugin needs and nothing provides is an
     * error here, not a crash mid-stream. RTLD_LOCAL: its symbols stay
     * its own. */
    dlerror();
    void *dl = dlopen(full, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        char what[400];
        snprintf(what, sizeof(what), "cannot load: %s",
                 e ? e : "unknown dlopen error");
        err_set(errstr, errstr_size, path, what);
        free(full);
        return NULL;
    }
    dlerror();
    const idemproc_plugin_t *t = dlsym(dl, IDEMPROC_PLUGIN_SYMBOL);
    if (!t) {
        err_set(errstr, errstr_size, path,
                "not an idemproc plugin: it exports no symbol "
                "\"" IDEMPROC_PLUGIN_SYMBOL "\" (see idemproc/plugin.h)");
        dlclose(dl);
        free(full);
        return NULL;
    }
    /* abi_version is the table's first member in every version, so it can
     * be read before anything else of the table is trusted. */
    if (t->abi_version != IDEMPROC_PLUGIN_ABI_VERSION) {
        char what[200];
        snprintf(what, sizeof(what),
                 "built for plugin ABI version %u, but this idemproc "
                 "loads version %u: rebuild the plugin against this "
                 "idemproc's idemproc/plugin.h",
                 (unsigned)t->abi_version,
                 (unsigned)IDEMPROC_PLUGIN_ABI_VERSION);
        err_set(errstr, errstr_size, path, what);
        dlclose(dl);
        free(full);
        return NULL;
    }
    const char *problem = table_problem(t);
    if (problem) {
        err_set(errstr, errstr_size, path, problem);
        dlclose(dl);
        free(full);
        return NULL;
    }
    free(full);
    idem_plugin_t *pl = idem_xcalloc(1, sizeof(*pl));
    pl->dl = dl;
    pl->table = t;
    pl->path = idem_xstrdup(path);
    return pl;
}

const idemproc_plugin_t *idem_plugin_table(const idem_plugin_t *pl)
{
    return pl->table;
}

const char *idem_plugin_path(const idem_plugin_t *pl)
{
    return pl->path;
}

void idem_plugin_close(idem_plugin_t *pl)
{
    if (!pl)
        return;
    dlclose(pl->dl);
    free(pl->path);
    free(pl);
}
