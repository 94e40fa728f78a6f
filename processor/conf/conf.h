/* conf: the configuration table, its sources (file, environment, --set) and
 * the effective configuration every command reads. */
#ifndef IDEM_CONF_H
#define IDEM_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <librdkafka/rdkafka.h>

/* The type of a configuration key. */
typedef enum {
    IDEM_KEY_STR = 0,
    IDEM_KEY_INT,  /* int64 within [min, max]; a key named *.ms or
                      *.seconds is a duration: it also takes a unit
                      (1500ms, 30s, 5m, 2h, 7d; util.h) */
    IDEM_KEY_ENUM, /* one of enums[]; stored as its index (booleans:
                      {"false", "true"}) */
} idem_key_type_t;

struct idem_conf_s;
struct idem_conf_key_s;

/* A key's own check of its value (after type, range and enum), at the
 * moment it is set, so the error carries the file and line. `value` is
 * the text as given. Returns 0, or -1 with errstr naming the key. */
typedef int (*idem_conf_check_t)(const struct idem_conf_key_s *key,
                                 const char *value, char *errstr,
                                 size_t errstr_size);

/* flags of a key. Which commands read it: none of the two scope bits
 * means run's side (run, verify, check-config) only. */
#define IDEM_KEY_SECRET      0x01 /* never printed or logged */
#define IDEM_KEY_REQUIRED    0x02 /* finalize fails when unset or empty */
#define IDEM_KEY_OUTBOX      0x04 /* read by `idemproc outbox` too */
#define IDEM_KEY_OUTBOX_ONLY 0x08 /* read by `idemproc outbox` only */
#define IDEM_KEY_WRITES_TOPIC                                                  \
    0x10 /* names a topic the member produces                                  \
            to: never an input, checked with                                   \
            check-config --connect */

/* One configuration key, declared by the module that reads it (nginx's
 * ngx_command_t, librdkafka's rd_kafka_property). The first nine columns
 * are what handlers declare positionally; the rest default to 0. Use the
 * IDEM_CONF_* row macros below for one line per key. */
typedef struct idem_conf_key_s {
    const char *name; /* NULL ends a list; a "dev." prefix: development
                         only, left out of `help config` and the README */
    idem_key_type_t type;
    const char *def;      /* default as text; NULL = unset */
    int64_t min, max;     /* IDEM_KEY_INT range */
    const char *enums[6]; /* IDEM_KEY_ENUM names, index = stored value */
    int secret;           /* never printed or logged */
    int required;         /* required when its module is active */
    const char *doc;      /* one line */
    size_t offset;        /* of its field in idem_conf_t (IDEM_CONF_FIELD); 0:
                             kept as text, read with idem_conf_str/_int */
    unsigned flags;       /* IDEM_KEY_* (secret and required mirror theirs) */
    idem_conf_check_t check; /* NULL: type, range and enum only */
} idem_conf_key_t;

#define IDEM_CONF_FIELD(field) offsetof(struct idem_conf_s, field)

/* Row macros: name, field, default, [min, max,] flags, check, doc. */
#define IDEM_CONF_STR(name, field, def, flags, check, doc)                     \
    {                                                                          \
        name, IDEM_KEY_STR, def, 0, 0, {0}, !!((flags)&IDEM_KEY_SECRET),       \
            !!((flags)&IDEM_KEY_REQUIRED), doc, IDEM_CONF_FIELD(field),        \
            (flags), check                                                     \
    }
#define IDEM_CONF_INT(name, field, def, min, max, flags, check, doc)           \
    {                                                                          \
        name, IDEM_KEY_INT, def, min, max, {0}, 0, 0, doc,                     \
            IDEM_CONF_FIELD(field), (flags), check                             \
    }
/* enums last: IDEM_CONF_ENUM("log.format", log_format, "json", 0, "doc",
 * "json", "text"). */
#define IDEM_CONF_ENUM(name, field, def, flags, doc, ...)                      \
    {                                                                          \
        name, IDEM_KEY_ENUM, def, 0, 0, {__VA_ARGS__}, 0, 0, doc,              \
            IDEM_CONF_FIELD(field), (flags), NULL                              \
    }
#define IDEM_CONF_BOOL(name, field, def, flags, doc)                           \
    IDEM_CONF_ENUM(name, field, def, flags, doc, "false", "true")

typedef struct idem_conf_module_s idem_conf_module_t;

/* A module's part of the configuration: its keys and its cross-key
 * checks. The program lists its modules (idem_conf_module_at); the engine
 * here parses, validates type/range/enum, prints and documents from them
 * and knows none of them by name. */
struct idem_conf_module_s {
    const char *name; /* heading in help: "kafka", "handler=webhook" */
    const char *doc;  /* NULL, or one line under the heading */
    const idem_conf_key_t *keys; /* ending with {NULL}; may be NULL */
    unsigned flags;         /* IDEM_KEY_OUTBOX(_ONLY): the scopes its check runs
                               in (0: run's side only) */
    const char *key_prefix; /* NULL, or a prefix ("kafka.", "plugin.") under
                               which any key is this module's */
    const char *prefix_doc; /* help line of key_prefix<name> */
    /* Stores a key under key_prefix (the whole key). NULL: kept as text
     * (idem_conf_str). Returns 0, or -1 with errstr. */
    int (*prefix_set)(struct idem_conf_s *conf, const char *key,
                      const char *value, char *errstr, size_t errstr_size);
    /* Whether the module takes part in this configuration (a handler's
     * module: when it is the one selected). NULL: always. Required keys
     * and check apply only then; `help` marks the keys. */
    int (*active)(const idem_conf_module_t *m, const struct idem_conf_s *conf);
    /* Cross-key checks at finalize, in module order (may fill derived
     * fields, allocating with idem_conf_alloc). NULL: none. Returns 0 or
     * -1 with errstr naming the key. */
    int (*check)(const idem_conf_module_t *m, struct idem_conf_s *conf,
                 char *errstr, size_t errstr_size);
    const void *owner; /* the module's own, for its callbacks (a handler's
                          ops) */
    /* The value as check-config prints it (a URL's password hidden), into
     * buf or returned as is. NULL: as it is (secrets are masked anyway). */
    const char *(*show)(const idem_conf_key_t *key, const char *value,
                        char *buf, size_t size);
};

/* The i-th configuration module of this program (0, 1, ...), NULL past
 * the last. Defined by the program, not the engine (cmd/confmodules.c),
 * as nginx lists its modules in ngx_modules.c. */
const idem_conf_module_t *idem_conf_module_at(size_t i);

/* dlq.headers.format: which headers a dead letter gets. */
typedef enum {
    IDEM_DLQ_HEADERS_IDEMPROC = 0, /* dlq.* only */
    IDEM_DLQ_HEADERS_SPRING,       /* kafka_dlt-* only */
    IDEM_DLQ_HEADERS_BOTH
} idem_dlq_headers_t;

/* What the outbox relay does with a published row (outbox.after). */
typedef enum {
    IDEM_OUTBOX_AFTER_MARK = 0, /* set published_at */
    IDEM_OUTBOX_AFTER_DELETE
} idem_outbox_after_t;

/* Which command a configuration is for: the keys it requires and the
 * cross-key checks it gets. The consumer side (run, verify, check-config)
 * is the default; the outbox relay needs no group, topics or Redis. */
typedef enum {
    IDEM_CONF_SCOPE_PROCESSOR = 0,
    IDEM_CONF_SCOPE_OUTBOX
} idem_conf_scope_t;

/* The effective configuration. Fields are filled through the table in conf.c
 * (never assign them directly outside tests); strings are owned by the conf
 * and freed by idem_conf_destroy(). Unset optional strings are NULL. */
typedef struct idem_conf_s {
    idem_conf_scope_t scope; /* the command it is loaded for */
    char *bootstrap_servers; /* kafka.bootstrap.servers */
    char *group_id;
    char *input_topics; /* comma list as given; read input_topic[] */
    char **input_topic; /* input.topics parsed at finalize: trimmed names
                           ("^" prefix: a regex), NULL-terminated */
    size_t input_topic_cnt;
    char *dlq_topic;
    int dlq_headers_format; /* idem_dlq_headers_t */
    int64_t dlq_replay_max; /* dlq replay refuses records replayed this often */
    char *output_topic;     /* output.topic: forward declares it */
    char *member_id;        /* client.id, lease owner, log context */
    char *redis_url; /* redis[s]://[user[:pw]@]host:port/db, unix:///path */
    char *redis_username; /* ACL user; overrides the url's */
    char *redis_password; /* overrides the url's password */
    char *redis_tls_ca_file;
    char *redis_tls_cert_file;
    char *redis_tls_key_file;
    char *redis_tls_server_name;
    int redis_tls_verify;  /* 1 = verify the server (default) */
    char *redis_sentinels; /* host:port,... ; empty = no Sentinel */
    char *redis_sentinel_master;
    char *redis_sentinel_password;
    char *redis_cluster_nodes; /* host:port,... ; empty = not a cluster */
    char *redis_prefix;
    int64_t redis_timeout_ms;
    int redis_allow_eviction; /* 1: tolerate an evicting maxmemory-policy */
    int redis_aof_rewrite;    /* 1: BGREWRITEAOF before writing to a new
                                 server with AOF on */
    int64_t redis_wait_replicas;
    int64_t redis_wait_timeout_ms;
    int64_t dedup_ttl_seconds;
    int64_t dedup_lease_ms;
    int dedup_scope;              /* idem_dedup_scope_t (redis/rediskeys.c) */
    int64_t dedup_memory_max;     /* bytes of a member's partition tables */
    int64_t member_memory_max;    /* bytes of the member's RSS; 0: no bound */
    int64_t dedup_window_key_max; /* bytes of marks per window key part */
    int64_t dev_layout_read_ms;   /* the layout key's re-read interval */
    char *handler;           /* handler=<name>[:<arg>], a registered handler */
    int envelope_format;     /* idem_envelope_format_t */
    char *envelope_identity; /* ordered sources: value:/ptr, header:h, key */
    char *envelope_message_id; /* same syntax */
    int64_t retry_max_attempts;
    int64_t retry_backoff_initial_ms;
    int64_t retry_backoff_max_ms;
    char *retry_topics; /* retry.topics as given ("" = blocking retries) */
    int64_t *retry_delays_ms; /* retry_tiers delays, parsed by finalize */
    size_t retry_tiers;       /* 0: blocking retries (the default) */
    int64_t batch_max_messages;
    int64_t batch_max_wait_ms;
    int64_t commit_interval_ms;
    int64_t message_max_bytes;
    char *http_listen; /* host:port; empty = no HTTP server */
    int64_t health_stall_ms;
    int64_t stats_interval_ms;
    int64_t fetch_stall_ms;  /* 0: no fetch watch (fetchwatch.h) */
    char *fault_fetch_pause; /* dev.fault.fetch.pause: TOPIC:PARTITION[:N] */
    char *fault_member_rss_file;     /* dev.fault.member.rss.file */
    int64_t fault_fetch_assign_fail; /* dev.fault.fetch.assign.fail */
    int64_t progress_interval_ms;
    int64_t handler_max_consecutive_rejects; /* 0: off (rejectguard.h) */
    int log_level;                           /* idem_log_level_t */
    int log_format;                          /* idem_log_format_t */
    int64_t shutdown_timeout_ms;

    /* idemproc outbox only (see idem_conf_load_scope). */
    char *outbox_dsn;   /* libpq connection string or URI; secret */
    char *outbox_table; /* [schema.]table */
    char *outbox_topic; /* for rows whose topic is NULL; may be NULL */
    int64_t outbox_batch_max;
    int64_t outbox_poll_ms;
    int outbox_after; /* idem_outbox_after_t */

    /* kafka.<prop> pass-through, in the order they were set (later wins). */
    struct idem_conf_kv {
        char *name; /* librdkafka property name, without "kafka." */
        char *value;
    } * kafka;
    size_t kafka_cnt;

    /* Keys kept as text (offset 0: handlers' keys) that were set, by
     * name, in set order. */
    struct idem_conf_kv *hkeys;
    size_t hkeys_cnt;

    void **owned; /* what idem_conf_alloc handed out, freed with the conf */
    size_t owned_cnt;
} idem_conf_t;

/* A new configuration holding the built-in defaults. Never NULL (aborts on
 * out-of-memory, as every allocation in this program does). */
idem_conf_t *idem_conf_new(void);
void idem_conf_destroy(idem_conf_t *conf);

/* Zeroed memory owned by `conf` (freed by idem_conf_destroy), for what a
 * module's check derives from the keys. Never NULL. */
void *idem_conf_alloc(idem_conf_t *conf, size_t size);

/* A kafka.<prop> duration (prop ends in ".ms") given with a unit ("6s",
 * "2m"), written into buf as librdkafka's milliseconds ("6000"); *out is
 * buf then, else value itself (a bare number or anything else is
 * librdkafka's to judge: it would read "6s" as 6 ms). Returns 0, or -1 with
 * the error in errstr (digits then no unit, "1.5s"; past librdkafka's int
 * range). */
int idem_conf_kafka_duration(const char *prop, const char *value, char *buf,
                             size_t bufsz, const char **out, char *errstr,
                             size_t errstr_size);

/* Stores kafka.<prop> (without "kafka.") in conf->kafka, replacing an
 * earlier value: for the kafka module's prefix_set, which judges it. */
void idem_conf_kafka_store(idem_conf_t *conf, const char *prop,
                           const char *value);

/* Sets one key (a module's key, "kafka.<prop>", or "<key>.file" to read the
 * value from a file such as a mounted Kubernetes Secret). Validates type, range
 * and enum. Returns 0, or -1 with errstr naming the key and the problem. */
int idem_conf_set(idem_conf_t *conf, const char *key, const char *value,
                  char *errstr, size_t errstr_size);

/* Reads a Java-properties style file (key=value, '#' or '!' comments, blank
 * lines). Returns 0 or -1 with "FILE:LINE: ..." in errstr. */
int idem_conf_load_file(idem_conf_t *conf, const char *path, char *errstr,
                        size_t errstr_size);

/* Applies every IDEMPROC_<KEY> variable of `envp` (borrowed). */
int idem_conf_load_env(idem_conf_t *conf, char **envp, char *errstr,
                       size_t errstr_size);

/* Cross-key checks and the librdkafka check of every kafka.* property
 * (librdkafka's own error text is shown). Returns 0 or -1. */
int idem_conf_finalize(idem_conf_t *conf, char *errstr, size_t errstr_size);

/* idem_conf_finalize for the given scope: IDEM_CONF_SCOPE_OUTBOX requires
 * kafka.bootstrap.servers and outbox.dsn only and checks outbox.table. */
int idem_conf_finalize_scope(idem_conf_t *conf, idem_conf_scope_t scope,
                             char *errstr, size_t errstr_size);

/* The usual sequence of a command: defaults < file (may be NULL) < envp <
 * sets ("key=value" strings, borrowed), then finalize. Returns a conf the
 * caller destroys, or NULL with errstr filled. */
idem_conf_t *idem_conf_load(const char *path, char **envp, char **sets,
                            size_t set_cnt, char *errstr, size_t errstr_size);

/* What kind of configuration error it was, for a caller that acts on it
 * (as hiredis's err beside errstr): never learn it from the text. */
typedef enum {
    IDEM_CONF_OK = 0,
    IDEM_CONF_ERR_INVALID,  /* a value, key, file, variable or cross-key
                               check */
    IDEM_CONF_ERR_REQUIRED, /* a required key is not set */
} idem_conf_errclass_t;

typedef struct {
    idem_conf_errclass_t cls;
    char str[512]; /* one line naming the key (and file:line, variable) */
} idem_conf_err_t;

/* idem_conf_load_scope with the error's class: NULL with *err filled. */
idem_conf_t *idem_conf_load_err(const char *path, char **envp, char **sets,
                                size_t set_cnt, idem_conf_scope_t scope,
                                idem_conf_err_t *err);

/* idem_conf_load finalized for `scope`. */
idem_conf_t *idem_conf_load_scope(const char *path, char **envp, char **sets,
                                  size_t set_cnt, idem_conf_scope_t scope,
                                  char *errstr, size_t errstr_size);

/* Applies kafka.bootstrap.servers and every kafka.* pass-through property to
 * `kconf` (borrowed). Returns 0 or -1 with librdkafka's text. */
int idem_conf_apply_kafka(const idem_conf_t *conf, rd_kafka_conf_t *kconf,
                          char *errstr, size_t errstr_size);

/* Is librdkafka property `name` (without "kafka.") a secret whose value is
 * never printed or logged? The one list every command uses. */
int idem_conf_kafka_prop_is_secret(const char *name);

/* The i-th topic this configuration writes to (0, 1, ...): the value of
 * a key flagged IDEM_KEY_WRITES_TOPIC of an active module in conf->scope,
 * set and not empty (dlq.topic, output.topic), its key's name in *key
 * (may be NULL). NULL past the last. Borrowed. */
const char *idem_conf_topic_written(const idem_conf_t *conf, size_t i,
                                    const char **key);

/* Prints the effective configuration as key=value lines, secrets masked:
 * the keys of conf->scope's command (and of the handler selected), those
 * that differ from the default first under "# set (not the default)",
 * then the rest under "# defaults"; a development key or another
 * handler's only when set. */
void idem_conf_dump(const idem_conf_t *conf, FILE *out);

/* Prints the keys for `idemproc help config`, by module; development keys
 * (dev.*) are left out. */
void idem_conf_print_help(FILE *out);

/* The same with dev = 1: the development keys only (`help config-dev`). */
void idem_conf_print_help_dev(FILE *out, int dev);

/* Prints the README's configuration section (a Markdown table). */
void idem_conf_print_markdown(FILE *out);

/* The value of handler key `key` (declared in a handler's ops->keys): as
 * set, else its default; NULL when unset without a default or when no
 * handler declares `key` (a programming error, logged). Borrowed. */
const char *idem_conf_str(const idem_conf_t *conf, const char *key);

/* The value of an IDEM_KEY_INT (the number) or IDEM_KEY_ENUM (the index)
 * handler key; 0 when unset without a default. */
int64_t idem_conf_int(const idem_conf_t *conf, const char *key);

#endif
