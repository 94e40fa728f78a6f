/* idemproc/plugin.h: the handler interface for effects loaded from a
 * shared object (handler=plugin:PATH.so). Self-contained: a plugin compiles
 * with only this header (cc -shared -fPIC -I processor/include) and never
 * links against idemproc; everything it needs from the host comes through
 * the idemproc_host_t it is given.
 *
 * A plugin is an external effect: idemproc claims each record with a lease
 * in Redis, hands the new ones to the plugin, and marks them done when the
 * plugin reports IDEMPROC_DONE. Duplicates never reach the plugin; an
 * effect that crashed before its mark may be repeated (at least once),
 * so make effects idempotent by the record's identity where you can.
 *
 * The host calls every function on one thread (its processing loop), so a
 * plugin needs no lock, and no call may block for long: submit hands work
 * over and returns; collect reports what finished.
 *
 * The plugin exports one symbol, IDEMPROC_PLUGIN_SYMBOL, a const
 * idemproc_plugin_t whose abi_version is IDEMPROC_PLUGIN_ABI_VERSION and
 * struct_size sizeof(idemproc_plugin_t) as compiled; the host refuses to
 * load any other (with both versions in the error), and one whose name,
 * start, submit, collect, drain or stop is missing (validate, keys and
 * room may be NULL), or whose key names are other than a-z, 0-9 and '.', or are
 * "file" or end in ".file" (plugin.<key>.file reads plugin.<key> from a
 * file). Example:
 * config/examples/ (built and run by `make test`). */
#ifndef IDEMPROC_PLUGIN_H
#define IDEMPROC_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 added `room`. */
#define IDEMPROC_PLUGIN_ABI_VERSION 2
#define IDEMPROC_PLUGIN_SYMBOL      "idemproc_plugin"

/* One record header. value NULL: a header without a value. */
typedef struct {
    const char *name; /* NUL-terminated */
    const void *value;
    size_t value_len;
} idemproc_header_t;

/* One record (all borrowed from the host). It stays valid, at the same
 * address, from submit until the host collected its result, or until drain
 * returns. Byte strings have lengths and may hold NUL bytes. */
typedef struct {
    const char *topic;
    int32_t partition;
    int64_t offset;
    int64_t timestamp; /* ms since the epoch; -1 when none */
    const void *key;   /* NULL when the record has no key */
    size_t key_len;
    const void *value; /* NULL for a null value */
    size_t value_len;
    const char *identity; /* the dedup identity, never empty */
    size_t identity_len;
    const char *message_id; /* message_id_len 0: none */
    size_t message_id_len;
    const idemproc_header_t *headers; /* in record order */
    size_t header_cnt;
} idemproc_record_t;

/* What became of a record. */
typedef enum {
    IDEMPROC_DONE = 0, /* the effect happened: idemproc marks it done */
    IDEMPROC_REJECT,   /* can never succeed: dead-lettered as
                          handler-rejected, `detail` in dlq.error */
    IDEMPROC_RETRY,    /* failed for now: tried again after retry_after_ms
                          (0: idemproc's backoff), at most
                          retry.max.attempts times, then max-retries */
    IDEMPROC_OUTAGE,   /* the service behind the effect is down: tried
                          again, not counted; input pauses meanwhile */
} idemproc_status_t;

typedef struct {
    const idemproc_record_t *rec; /* as submitted */
    idemproc_status_t status;
    int64_t retry_after_ms;
    char detail[512]; /* why (REJECT/RETRY/OUTAGE), NUL-terminated */
} idemproc_result_t;

enum {
    IDEMPROC_LOG_ERROR = 0,
    IDEMPROC_LOG_WARN,
    IDEMPROC_LOG_INFO,
    IDEMPROC_LOG_DEBUG
};

/* What the host offers a plugin (borrowed; valid until stop returns). */
typedef struct {
    uint32_t abi_version; /* the host's IDEMPROC_PLUGIN_ABI_VERSION */
    void *opaque;         /* the host's; pass it back */
    /* The value of one of the plugin's keys (see idemproc_key_t): as set
     * with plugin.<name>=..., else its default; NULL when unset. */
    const char *(*config)(void *opaque, const char *name);
    /* One log line through the host's logger (text or JSON lines). */
    void (*log)(void *opaque, int level, const char *message);
} idemproc_host_t;

/* A configuration key of the plugin: set as plugin.<name>=value in the
 * host's configuration (file, IDEMPROC_PLUGIN_<NAME>, --set); the host
 * rejects plugin.* keys the plugin does not declare and checks `required`.
 * Values are text; the plugin checks their syntax in validate. */
typedef struct {
    const char *name; /* without "plugin."; NULL ends the list */
    const char *def;  /* default, NULL = unset */
    int secret;       /* never printed or logged by the host */
    int required;
    const char *doc; /* one line, shown by check-config */
} idemproc_key_t;

typedef struct {
    uint32_t abi_version; /* IDEMPROC_PLUGIN_ABI_VERSION (first, always) */
    uint32_t struct_size; /* sizeof(idemproc_plugin_t) */
    const char *name;     /* for logs and check-config */
    const idemproc_key_t *keys; /* may be NULL */

    /* Checks the plugin's keys (host->config). 0, or -1 with errstr:
     * check-config reports it, run exits 2. May be NULL. */
    int (*validate)(const idemproc_host_t *host, char *errstr,
                    size_t errstr_size);
    /* Returns the plugin's state (non-NULL), or NULL with errstr (fatal). */
    void *(*start)(const idemproc_host_t *host, char *errstr,
                   size_t errstr_size);
    /* Takes recs[n], returns at once: 0, or -1 with errstr when it took
     * none because its service is down (the host backs off, submits them
     * again). Every record taken gets exactly one result. */
    int (*submit)(void *state, const idemproc_record_t *const *recs, size_t n,
                  char *errstr, size_t errstr_size);
    /* Writes up to `max` finished results into out[], waiting at most
     * timeout_ms for the first; returns how many. */
    size_t (*collect)(void *state, idemproc_result_t *out, size_t max,
                      int timeout_ms);
    /* Finishes what is in flight until deadline (ms from now), then
     * forgets the rest; afterwards it holds no record pointer. */
    void (*drain)(void *state, int timeout_ms);
    /* Frees the state. */
    void (*stop)(void *state);
    /* How many more records the plugin can start now (free connections,
     * slots of its service, ...): idemproc claims (leases) and submits at
     * most that many at a time, so no lease runs out while a record waits
     * in the plugin's own queue. 0: none now; idemproc collects and asks
     * again. NULL: no limit (submit takes any number). */
    size_t (*room)(void *state);
} idemproc_plugin_t;

#ifdef __cplusplus
}
#endif

#endif
