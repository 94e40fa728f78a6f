/* aofgate: whether a member may write to a Redis server it has not written
 * to yet (a restart, a failover): with AOF on, only once an AOF rewrite that
 * began after the server loaded has finished ok. Redis 7.0 can keep half of
 * a MULTI/EXEC block in an AOF cut by a host crash and replay it together
 * with the next transaction at the next load (docs/design.md, "A half
 * transaction in the AOF"); a rewrite writes the file anew from memory,
 * which never held that half. No Redis here: the store feeds it INFO and
 * BGREWRITEAOF's answers and acts on what it says (tests/unit). */
#ifndef IDEM_AOFGATE_H
#define IDEM_AOFGATE_H

#include <stddef.h>

/* What INFO persistence says (each 0 when the field is absent). */
typedef struct {
    int loading;           /* loading:1 (the server is still loading) */
    int aof_enabled;       /* aof_enabled:1 */
    int rewrite_running;   /* aof_rewrite_in_progress:1 */
    int rewrite_scheduled; /* aof_rewrite_scheduled:1 (after a BGSAVE) */
    int last_rewrite_ok;   /* aof_last_bgrewrite_status:ok */
    int known;             /* aof_enabled was there at all */
} idem_aofgate_info_t;

/* Copies the value of "name:" in an INFO reply (borrowed) into out, "" when
 * the field is absent. The store reads run_id and maxmemory_policy with it
 * too. */
void idem_aofgate_info_field(const char *info, const char *name, char *out,
                             size_t out_size);

/* Reads the fields above from an INFO reply (all sections or only
 * "persistence"); info is borrowed. */
void idem_aofgate_info_parse(const char *info, idem_aofgate_info_t *out);

typedef enum {
    IDEM_AOFGATE_OPEN = 0, /* writes allowed on this server */
    IDEM_AOFGATE_REWRITE,  /* send BGREWRITEAOF, then ask again */
    IDEM_AOFGATE_WAIT,     /* a rewrite runs (or the server loads): read
                              INFO again later */
    IDEM_AOFGATE_REFUSED,  /* the server refused BGREWRITEAOF */
} idem_aofgate_action_t;

/* The gate of one member's connection(s) (embedded: _init). */
typedef struct {
    char open_run_id[48]; /* the server writes are allowed on ("" none) */
    char run_id[48];      /* the server being made safe */
    int requested;        /* a rewrite that began after its load is known
                             (accepted, already running, or seen in INFO) */
    int rewrites;         /* BGREWRITEAOF sent for it */
} idem_aofgate_t;

void idem_aofgate_init(idem_aofgate_t *g);

/* What to do before writing to the server run_id (borrowed) whose INFO
 * persistence is info: OPEN once a rewrite that began after its load has
 * finished with status ok (or right away when AOF is off); WAIT while one
 * runs or the server is loading; REWRITE when none is known, the last one
 * failed or was refused. A new run_id starts over: every restart and every
 * failover is a new server. */
idem_aofgate_action_t idem_aofgate_step(idem_aofgate_t *g, const char *run_id,
                                        const idem_aofgate_info_t *info);

/* BGREWRITEAOF's answer for the server of the last step: status text, or an
 * error reply (is_error). "started", "scheduled" and "already in progress"
 * mean a rewrite after the load is coming: WAIT. Any other error (NOPERM,
 * an unknown or renamed command) is a refusal: REFUSED. reply borrowed. */
idem_aofgate_action_t idem_aofgate_reply(idem_aofgate_t *g, const char *reply,
                                         int is_error);

/* Whether writes to run_id are allowed without asking (the last step said
 * OPEN for it). */
int idem_aofgate_open(const idem_aofgate_t *g, const char *run_id);

const char *idem_aofgate_action2str(idem_aofgate_action_t a);

#endif
