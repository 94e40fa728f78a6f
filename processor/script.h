/* script: the user's Lua effect of handler=script (script.file): reading
 * and checking it (syntax with file and line, Redis's sandbox rules), the
 * dedup script it is composed into, the arguments of one record and what
 * the script answers for it. Talks to no server: the handler sends the
 * composed script through the store. */
#ifndef IDEM_SCRIPT_H
#define IDEM_SCRIPT_H

#include <stddef.h>
#include <stdint.h>

typedef struct idem_script_s idem_script_t;

#define IDEM_SCRIPT_FILE_MAX                                                   \
    (1024 * 1024) /* largest script.file accepted, bytes */

/* Reads script.file `path` and checks it the way Redis will run it, with
 * the Lua 5.1 that Redis embeds: it must compile, and running its top
 * level (in a sandbox like Redis's: no globals may be created, redis.call
 * is refused outside effect) must leave a function `effect`. Returns the
 * script, or NULL with errstr "script.file: PATH:LINE: ..." (the line in
 * the user's file where Lua saw the error). */
idem_script_t *idem_script_load(const char *path, char *errstr,
                                size_t errstr_size);
void idem_script_destroy(idem_script_t *sc); /* NULL is a no-op */

/* The dedup script sent to Redis (SCRIPT LOAD): idemproc's driver, then the
 * user's file unchanged, then one line that runs the batch. Borrowed,
 * NUL-terminated, lives as long as sc. */
const char *idem_script_source(const idem_script_t *sc);

/* script.file as configured. Borrowed. */
const char *idem_script_path(const idem_script_t *sc);

/* Copies msg (len bytes) to out (NUL-terminated, truncated to out_size)
 * with every "user_script:N:" (how Redis and Lua name the composed
 * script) replaced by "PATH:M:", M being the line in the user's file. */
void idem_script_where(const idem_script_t *sc, const char *msg, size_t len,
                       char *out, size_t out_size);

/* One record as the script's `rec` sees it. All borrowed. key and value
 * are NULL when the record has none (rec.key / rec.value are then nil);
 * a header value is NULL for a header without a value (false in Lua). */
typedef struct {
    const char *identity;
    size_t identity_len;
    const char *message_id; /* "" or NULL: none (rec.message_id nil) */
    size_t message_id_len;
    const char *topic;
    int32_t partition;
    int64_t offset;
    int64_t timestamp; /* ms since the epoch; -1: none (nil) */
    const void *key;
    size_t key_len;
    const void *value;
    size_t value_len;
    size_t header_cnt;
    const char *const *header_names; /* header_cnt names, NUL-terminated */
    const void *const *header_values;
    const size_t *header_lens;
} idem_script_rec_t;

/* The script's arguments for one record, in the order the driver reads
 * them: identity, message_id, topic, partition, offset, timestamp, flags,
 * key, value, then name and value of each header. */
#define IDEM_SCRIPT_REC_ARGS(header_cnt) (9 + 2 * (size_t)(header_cnt))

/* Scratch one record's numeric arguments and flags live in while its
 * arguments are in use. */
typedef struct {
    char partition[16];
    char offset[24];
    char timestamp[24];
    char *flags; /* "kv" + one character per header; grown as needed */
    size_t flags_cap;
} idem_script_scratch_t;

void idem_script_scratch_term(idem_script_scratch_t *sb);

/* Fills argv/argvlen (room for IDEM_SCRIPT_REC_ARGS(rec->header_cnt)
 * entries) with rec's arguments; they borrow from rec and from sb, which
 * must outlive their use. Returns the number of arguments. */
size_t idem_script_rec_args(const idem_script_rec_t *rec,
                            idem_script_scratch_t *sb, const char **argv,
                            size_t *argvlen);

/* What the script answered for one record. */
typedef enum {
    IDEM_SCRIPT_APPLIED = 0, /* effect ran and the done mark was set */
    IDEM_SCRIPT_DUPLICATE,   /* a done mark existed: prior message id */
    IDEM_SCRIPT_BUSY,        /* another handler's lease holds the identity */
    IDEM_SCRIPT_REJECTED,    /* effect returned false, "reason" */
    IDEM_SCRIPT_FAILED,      /* effect raised a Lua runtime error */
} idem_script_verdict_t;

/* Reads one reply string (str, len bytes) of the script. For DUPLICATE,
 * *detail / *detail_len is the prior message id; for REJECTED and FAILED
 * the reason or error text (FAILED: still with "user_script:N:", see
 * idem_script_where); for BUSY the mark found. They point into str. */
idem_script_verdict_t idem_script_verdict(const char *str, size_t len,
                                          const char **detail,
                                          size_t *detail_len);

#endif
