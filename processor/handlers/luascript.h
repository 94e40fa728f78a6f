/* luascript: the user's Lua effect of handler=script (script.file):
 * reading and checking it (syntax with file and line, Redis's sandbox
 * rules), the dedup script it is composed into, and one record's
 * arguments. Talks to no server: the handler registers the composed script
 * with the store (docs/design.md, "The script handler"). */
#ifndef IDEM_LUASCRIPT_H
#define IDEM_LUASCRIPT_H

#include <stddef.h>
#include <stdint.h>

#include "effect/handler.h"

typedef struct idem_luascript_s idem_luascript_t;

#define IDEM_LUASCRIPT_FILE_MAX                                                \
    (1024 * 1024) /* largest script.file accepted, bytes */

/* Arguments per record without script.fields: identity, message_id,
 * topic, key and value presence with partition, offset and timestamp (one
 * argument), key, value, headers. With script.fields, the fields' types
 * and one per field follow (idem_luascript_rec_args). */
#define IDEM_LUASCRIPT_REC_ARGS 7

/* What a Lua runtime error's rejection text starts with (the rest is
 * "FILE:LINE: message"); a rejection by `return false, "reason"` is the
 * reason alone. */
#define IDEM_LUASCRIPT_ERROR_PREFIX "lua error: "

/* Reads script.file `path` and checks it the way Redis will run it, with
 * the Lua 5.1 that Redis embeds: it must compile, and running its top
 * level (in a sandbox like Redis's: no globals may be created, redis.call
 * is refused outside effect) must leave a function `effect`. Returns the
 * script, or NULL with errstr "script.file: PATH:LINE: ..." (the line in
 * the user's file where Lua saw the error). `fields` is script.fields (a
 * comma list of JSON Pointers, NULL or "" for none): the effect reads
 * their values as rec.fields[POINTER]; a bad list fails with errstr
 * "script.fields: ...". */
idem_luascript_t *idem_luascript_load(const char *path, const char *fields,
                                      char *errstr, size_t errstr_size);
void idem_luascript_destroy(idem_luascript_t *sc); /* NULL is a no-op */

/* The dedup script sent to Redis (SCRIPT LOAD): idemproc's driver, then the
 * user's file unchanged, then one line that runs the batch. Borrowed,
 * NUL-terminated, lives as long as sc. */
const char *idem_luascript_source(const idem_luascript_t *sc);

/* Under dedup.scope=partition: the effect function the store frames
 * (idem_store_effect_register: the partition chunk script and the global
 * framing), `local function effect(base, stride, js, ksuf)` after the
 * driver and the user's file, with the contract of handlers/ledger.lua.
 * Its records' arguments are the identity and message id, then
 * idem_luascript_args's (idem_luascript_rec_args + 2 in all). ksuf, the
 * partition's hash tag in Redis Cluster mode, is appended to every idem.*
 * key (idem.key(name) returns the name so built). Borrowed, NUL-
 * terminated, lives as long as sc. */
const char *idem_luascript_effect(const idem_luascript_t *sc);

/* Redis Cluster mode (redis.cluster.nodes): reads script.file `path` and
 * looks for keys named literally that cannot be under the partition's
 * hash tag: an idem.* key with a "{" (idem.hincrby("bal{x}", ...)), and
 * the literal key of a plain redis.call/redis.pcall (redis.call("SET",
 * "k", ...); name it idem.key("k")). Keys computed at run time are
 * checked there (the record is rejected naming the key). Returns 0, or -1
 * with errstr "script.file: PATH:LINE: ...". */
int idem_luascript_cluster_check(const char *path, char *errstr,
                                 size_t errstr_size);

/* script.file as configured. Borrowed. */
const char *idem_luascript_path(const idem_luascript_t *sc);

/* Arguments per record (idem_store_script_register's per_record). */
size_t idem_luascript_rec_args(const idem_luascript_t *sc);

/* Copies msg (len bytes) to out (NUL-terminated, truncated to out_size)
 * with every "user_script:N:" (how Redis and Lua name the composed
 * script) replaced by "PATH:M:", M being the line in the user's file. */
void idem_luascript_where(const idem_luascript_t *sc, const char *msg,
                          size_t len, char *out, size_t out_size);

/* Scratch memory for records' arguments: blocks that never move, so every
 * argument written stays valid until the next reset. Zero-initialise. */
typedef struct idem_luascript_block_s idem_luascript_block_t;
typedef struct {
    idem_luascript_block_t *head;
} idem_luascript_scratch_t;

void idem_luascript_scratch_reset(idem_luascript_scratch_t *sb);
void idem_luascript_scratch_term(idem_luascript_scratch_t *sb);

/* Fills argv/argvlen[idem_luascript_rec_args(sc)] with rec's arguments
 * (the driver builds `rec` from them); they borrow from rec (its bytes and
 * rec->env->fields) and sb (numbers, flags, the packed headers, the
 * fields' types). Returns idem_luascript_rec_args(sc). */
size_t idem_luascript_args(const idem_luascript_t *sc, const idem_record_t *rec,
                           idem_luascript_scratch_t *sb, const char **argv,
                           size_t *argvlen);

#endif
