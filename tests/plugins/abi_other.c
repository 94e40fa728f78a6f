/* abi_v1: a plugin built for plugin ABI version 1 (before `room` was
 * added): its table is shorter than this version's, so idemproc must
 * refuse it by its version, naming both, before it reads past the
 * version or calls anything of it. Every op aborts. */
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

const idemproc_plugin_t idemproc_plugin = {
    .abi_version = 1,
    .struct_size = offsetof(idemproc_plugin_t, room),
    .name = "abi_v1",
    .keys = NULL,
    .validate = never_validate,
    .start = never_start,
    .submit = never_submit,
    .collect = never_collect,
    .drain = never_drain,
    .stop = never_stop,
};
