/* aofgate: no write on top of a half transaction in a cut AOF (aofgate.h). */
#include "redis/aofgate.h"

#include <stdio.h>
#include <string.h>

void idem_aofgate_info_field(const char *info, const char *name, char *out,
                             size_t out_size)
{
    out[0] = '\0';
    size_t nl = strlen(name);
    for (const char *l = info; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : l)
        if (!strncmp(l, name, nl) && l[nl] == ':') {
            size_t vl = strcspn(l + nl + 1, "\r\n");
            snprintf(out, out_size, "%.*s", (int)vl, l + nl + 1);
            return;
        }
}

static int info_flag(const char *info, const char *name, int *present)
{
    char v[32];
    idem_aofgate_info_field(info, name, v, sizeof(v));
    if (present)
        *present = v[0] != '\0';
    return !strcmp(v, "1");
}

void idem_aofgate_info_parse(const char *info, idem_aofgate_info_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!info)
        return;
    out->loading = info_flag(info, "loading", NULL);
    out->aof_enabled = info_flag(info, "aof_enabled", &out->known);
    out->rewrite_running = info_flag(info, "aof_rewrite_in_progress", NULL);
    out->rewrite_scheduled = info_flag(info, "aof_rewrite_scheduled", NULL);
    char st[32];
    idem_aofgate_info_field(info, "aof_last_bgrewrite_status", st, sizeof(st));
    out->last_rewrite_ok = !strcmp(st, "ok");
}

void idem_aofgate_init(idem_aofgate_t *g)
{
    memset(g, 0, sizeof(*g));
}

int idem_aofgate_open(const idem_aofgate_t *g, const char *run_id)
{
    return g->open_run_id[0] && run_id && !strcmp(g->open_run_id, run_id);
}

idem_aofgate_action_t idem_aofgate_step(idem_aofgate_t *g, const char *run_id,
                                        const idem_aofgate_info_t *info)
{
    if (!run_id)
        run_id = "";
    if (idem_aofgate_open(g, run_id))
        return IDEM_AOFGATE_OPEN;
    if (strcmp(g->run_id, run_id)) {
        /* Another server (or the same one restarted): nothing known. */
        snprintf(g->run_id, sizeof(g->run_id), "%s", run_id);
        g->requested = 0;
        g->rewrites = 0;
    }
    if (info->loading)
        return IDEM_AOFGATE_WAIT;
    if (!info->aof_enabled) {
        /* No AOF, nothing to replay. (A later CONFIG SET appendonly yes
         * makes Redis write the file anew from memory by itself.) */
        snprintf(g->open_run_id, sizeof(g->open_run_id), "%s", run_id);
        return IDEM_AOFGATE_OPEN;
    }
    if (info->rewrite_running || info->rewrite_scheduled) {
        /* A rewrite cannot run while the server loads: this one began after
         * the load, so its file holds no half transaction. */
        g->requested = 1;
        return IDEM_AOFGATE_WAIT;
    }
    if (g->requested && info->last_rewrite_ok) {
        snprintf(g->open_run_id, sizeof(g->open_run_id), "%s", run_id);
        return IDEM_AOFGATE_OPEN;
    }
    /* None known yet, or the last one failed (disk full, fork refused):
     * ask (again). */
    g->requested = 0;
    return IDEM_AOFGATE_REWRITE;
}

idem_aofgate_action_t idem_aofgate_reply(idem_aofgate_t *g, const char *reply,
                                         int is_error)
{
    if (!reply)
        reply = "";
    if (!is_error || strstr(reply, "already in progress")) {
        /* "Background append only file rewriting started" or "...
         * scheduled" (after the BGSAVE that runs), or another member's (or
         * Redis's own) rewrite that already runs. */
        g->requested = 1;
        g->rewrites += !is_error;
        return IDEM_AOFGATE_WAIT;
    }
    /* Nothing kept: the next step says REWRITE again, so an operator who
     * grants the command meanwhile is enough. */
    return IDEM_AOFGATE_REFUSED;
}

const char *idem_aofgate_action2str(idem_aofgate_action_t a)
{
    switch (a) {
    case IDEM_AOFGATE_OPEN:
        return "open";
    case IDEM_AOFGATE_REWRITE:
        return "rewrite";
    case IDEM_AOFGATE_WAIT:
        return "wait";
    case IDEM_AOFGATE_REFUSED:
        return "refused";
    }
    return "?";
}
