/* layout: which dedup layout a group runs (docs/guarantees.md, "Changing
 * dedup.scope"), kept in the hash <prefix>layout:<group> {layout, since,
 * from}: absent = global since 0. dedup.scope is the layout a member
 * wants; the key says the one every member runs, and every dedup script
 * checks it atomically with its writes (redis/dedup_global.lua,
 * redis/partchunk.lua). The switch decision from the members' heartbeat
 * fingerprints is pure (idem_layout_decide) and unit-tested. */
#ifndef IDEM_LAYOUT_H
#define IDEM_LAYOUT_H

#include <hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"
#include "redis/store.h"

typedef enum {
    IDEM_LAYOUT_GLOBAL = 0, /* one mark key per identity */
    IDEM_LAYOUT_PARTITION,  /* the partition's chunks of marks */
} idem_layout_kind_t;

/* The key's contents. */
typedef struct {
    idem_layout_kind_t layout; /* what runs now (absent key: global) */
    idem_layout_kind_t from;   /* what ran before the last switch */
    int64_t since;             /* Redis TIME (s) of the last switch; 0 none */
    int64_t now;               /* Redis TIME (s) when read */
} idem_layout_t;

/* "global" or "partition". */
const char *idem_layout_kind2str(idem_layout_kind_t k);
/* 0 with *k, or -1 for any other text. */
int idem_layout_kind_parse(const char *s, idem_layout_kind_t *k);

/* <prefix>layout:<group.id> into buf. */
void idem_layout_key(const idem_conf_t *conf, char *buf, size_t size);

/* 1 while the marks of the layout before the last switch must still be
 * honoured at `now` (Redis seconds): the key switched within ttl_s. */
int idem_layout_honours(const idem_layout_t *l, int64_t ttl_s, int64_t now);

/* Fingerprint lines a member publishes in its heartbeat
 * (effect/fingerprint.c): the layouts this binary runs, and the one it
 * wants (its dedup.scope). */
#define IDEM_LAYOUT_FP_SUPPORTS "layouts"
#define IDEM_LAYOUT_FP_WANTS    "layout.wants"
#define IDEM_LAYOUT_FP_ALL      "global,partition"

/* What the live members' fingerprints fps[n] (one per member, this
 * member's included) allow: 1 when every one supports the layout key and
 * wants `want`, else 0 with the first member that does not (its index in
 * *blocker, may be NULL) and why in why[why_size] ("does not support the
 * layout key" or "wants global"). */
int idem_layout_decide(const char *const *fps, size_t n,
                       idem_layout_kind_t want, size_t *blocker, char *why,
                       size_t why_size);

/* The value of `key` in fingerprint fp ("key=value" lines) into buf, or
 * NULL when fp has no such line. */
const char *idem_layout_fp_get(const char *fp, const char *key, char *buf,
                               size_t size);

/* Reads the key and Redis's clock on c (borrowed). 0, or -1 with errstr
 * (Redis unreachable or an error reply: retriable). */
int idem_layout_read(redisContext *c, const idem_conf_t *conf,
                     idem_layout_t *out, char *errstr, size_t errstr_size);

/* Switches the key to `to` in one script, only if it still says
 * `expect` (compare and set); since = Redis TIME, from = expect. *out
 * gets the key after the call. Returns 1 when switched, 0 when the key
 * said otherwise (nothing written), -1 with errstr. `sha` (41 bytes, ""
 * at first) caches the script's digest (EVALSHA, as the documented ACL
 * allows). */
int idem_layout_switch(redisContext *c, const idem_conf_t *conf, char *sha,
                       idem_layout_kind_t expect, idem_layout_kind_t to,
                       idem_layout_t *out, char *errstr, size_t errstr_size);

/* The same two on the store's connection (its connect, AOF gate and error
 * classes; a failure drops the connection). */
int idem_layout_store_read(idem_store_t *s, const idem_conf_t *conf,
                           idem_layout_t *out, char *errstr,
                           size_t errstr_size);
int idem_layout_store_switch(idem_store_t *s, const idem_conf_t *conf,
                             char *sha, idem_layout_kind_t expect,
                             idem_layout_kind_t to, idem_layout_t *out,
                             char *errstr, size_t errstr_size);

#endif
