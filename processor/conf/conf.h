/* conf: the configuration table, its sources (file, environment, --set) and
 * the effective configuration every command reads. */
#ifndef IDEM_CONF_H
#define IDEM_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <librdkafka/rdkafka.h>

#include "kafka/retrytopic.h"

/* The type of a configuration key declared outside the table (a handler's
 * keys, handler.h). */
typedef enum {
    IDEM_KEY_STR = 0,
    IDEM_KEY_INT,  /* int64 within [min, max] */
    IDEM_KEY_ENUM, /* one of enums[]; stored as its index (booleans:
                      {"false", "true"}) */
} idem_key_type_t;

/* A configuration key a handler declares (handler.h, ops->keys): the same
 * columns as the table's own rows, without a field (the value lives in the
 * conf, read with idem_conf_str / idem_conf_int). */
typedef struct {
    const char *name; /* "<handler>.<key>"; NULL ends a list */
    idem_key_type_t type;
    const char *def;      /* default as text; NULL = unset */
    int64_t min, max;     /* IDEM_KEY_INT range */
    const char *enums[6]; /* IDEM_KEY_ENUM names */
    int secret;           /* never printed or logged */
    int required;         /* required when its handler runs */
    const char *doc;      /* one line */
} idem_conf_key_t;

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
    char *input_topics; /* comma list; "^" prefix = regex subscription */
    char *dlq_topic;
    int dlq_headers_format; /* idem_dlq_headers_t */
    int64_t dlq_replay_max; /* dlq replay refuses records replayed this often */
    char *output_topic;     /* forward handler only */
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
    char *redis_prefix;
    int64_t redis_timeout_ms;
    int redis_allow_eviction; /* 1: tolerate an evicting maxmemory-policy */
    int redis_aof_rewrite;    /* 1: BGREWRITEAOF before writing to a new
                                 server with AOF on */
    int64_t redis_wait_replicas;
    int64_t redis_wait_timeout_ms;
    int64_t dedup_ttl_seconds;
    int64_t dedup_lease_ms;
    char *handler;           /* handler=<name>[:<arg>], a registered handler */
    int envelope_format;     /* idem_envelope_format_t */
    char *envelope_identity; /* ordered sources: value:/ptr, header:h, key */
    char *envelope_message_id; /* same syntax */
    int forward_processed_at;  /* 1: forward adds processed_at to objects */
    int64_t retry_max_attempts;
    int64_t retry_backoff_initial_ms;
    int64_t retry_backoff_max_ms;
    char *retry_topics; /* retry.topics as given ("" = blocking retries) */
    int64_t retry_delays_ms[IDEM_RETRY_TIERS_MAX]; /* parsed by finalize */
    size_t retry_tiers; /* 0: blocking retries (the default) */
    int64_t batch_max_messages;
    int64_t batch_max_wait_ms;
    int64_t commit_interval_ms;
    int64_t message_max_bytes;
    char *http_listen; /* host:port; empty = no HTTP server */
    int64_t health_stall_ms;
    int64_t stats_interval_ms;
    int64_t fetch_stall_ms;  /* 0: no fetch watch (fetchwatch.h) */
    char *fault_fetch_pause; /* development fault: TOPIC:PARTITION[:N] */
    int64_t fault_fetch_assign_fail; /* development fault: assigns refused */
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

    /* Handlers' keys (handler.h) that were set, by name, in set order. */
    struct idem_conf_kv *hkeys;
    size_t hkeys_cnt;
} idem_conf_t;

/* A new configuration holding the built-in defaults. Never NULL (aborts on
 * out-of-memory, as every allocation in this program does). */
idem_conf_t *idem_conf_new(void);
void idem_conf_destroy(idem_conf_t *conf);

/* Sets one key (table key, "kafka.<prop>", or "<key>.file" to read the value
 * from a file such as a mounted Kubernetes Secret). Validates type, range and
 * enum. Returns 0, or -1 with errstr naming the key and the problem. */
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

/* Prints the effective configuration as key=value lines, secrets masked. */
void idem_conf_dump(const idem_conf_t *conf, FILE *out);

/* Prints the table for `idemproc help config`. */
void idem_conf_print_help(FILE *out);

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
