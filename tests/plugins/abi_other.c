/* abi_other: a plugin built for another plugin ABI version than this
 * idemproc's, which idemproc must refuse by its version, naming both,
 * before it reads past the version or calls anything of it. Every op
 * aborts, so a host that trusted the table anyway fails the test loudly.
 *
 * The Makefile builds it twice, with -DABI_VERSION and -DPLUGIN_NAME:
 *   abi_v1    version 1 (before `room` was added): its table is shorter
 *             than this version's
 *   abi_next  IDEMPROC_PLUGIN_ABI_VERSION+1 (a newer idemproc/plugin.h
 *             than this idemproc's) */
#include <idemproc/plugin.h>

#include <stddef.h>
#include <stdlib.h>

static int never_validate(const idemproc_host_t *host, char *errstr,
                          size_t errstr_size)
{
    (void)host;
    (void)errstr;
    (void)errstr_size;
    abort();
}

static void *never_start(const idemproc_host_t *host, char *errstr,
                         size_t errstr_size)
{
    (void)host;
    (void)errstr;
    (void)errstr_size;
    abort();
}

static int never_submit(void *state, const idemproc_record_t *const *recs,
                        size_t n, char *errstr, size_t errstr_size)
{
    (void)state;
    (void)recs;
    (void)n;
    (void)errstr;
    (void)errstr_size;
    abort();
}

static size_t never_collect(void *state, idemproc_result_t *out, size_t max,
                            int timeout_ms)
{
    (void)state;
    (void)out;
    (void)max;
    (void)timeout_ms;
    abort();
}

static void never_drain(void *state, int timeout_ms)
{
    (void)state;
    (void)timeout_ms;
    abort();
}

static void never_stop(void *state)
{
    (void)state;
    abort();
}

#if !defined(ABI_VERSION) || !defined(PLUGIN_NAME)
#error "build with -DABI_VERSION=N -DPLUGIN_NAME='\"name\"' (see the Makefile)"
#endif

const idemproc_plugin_t idemproc_plugin = {
    .abi_version = ABI_VERSION,
#if ABI_VERSION == 1
    .struct_size = offsetof(idemproc_plugin_t, room), /* v1 ended there */
#else
    .struct_size = sizeof(idemproc_plugin_t),
#endif
    .name = PLUGIN_NAME,
    .keys = NULL,
    .validate = never_validate,
    .start = never_start,
    .submit = never_submit,
    .collect = never_collect,
    .drain = never_drain,
    .stop = never_stop,
};
