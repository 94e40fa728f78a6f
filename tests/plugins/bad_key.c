/* bad_key: a plugin declaring a key named "token.file", which could never
 * be set (plugin.token.file reads plugin.token from a file): idemproc must
 * refuse it at load, naming the problem. */
#include <idemproc/plugin.h>

#include <stddef.h>

static const idemproc_key_t keys[] = {
    {"token.file", NULL, 1, 0, "unreachable"},
    {NULL, NULL, 0, 0, NULL},
};

static void *bad_start(const idemproc_host_t *host, char *errstr,
                       size_t errstr_size)
{
    (void)host;
    (void)errstr;
    (void)errstr_size;
    return NULL;
}

static int bad_submit(void *state, const idemproc_record_t *const *recs,
                      size_t n, char *errstr, size_t errstr_size)
{
    (void)state;
    (void)recs;
    (void)n;
    (void)errstr;
    (void)errstr_size;
    return -1;
}

static size_t bad_collect(void *state, idemproc_result_t *out, size_t max,
                          int timeout_ms)
{
    (void)state;
    (void)out;
    (void)max;
    (void)timeout_ms;
    return 0;
}

static void bad_drain(void *state, int timeout_ms)
{
    (void)state;
    (void)timeout_ms;
}

static void bad_stop(void *state)
{
    (void)state;
}

const idemproc_plugin_t idemproc_plugin = {
    .abi_version = IDEMPROC_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(idemproc_plugin_t),
    .name = "bad_key",
    .keys = keys,
    .start = bad_start,
    .submit = bad_submit,
    .collect = bad_collect,
    .drain = bad_drain,
    .stop = bad_stop,
};
