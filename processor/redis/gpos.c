/* gpos: the global path's positions judged (gpos.h). */
#include "redis/gpos.h"

#include <string.h>

idem_gpos_verdict_t idem_gpos_judge(int64_t recorded, int64_t last, int64_t at,
                                    int64_t pos, int64_t *rewind)
{
    *rewind = -1;
    if (recorded < 0)
        return IDEM_GPOS_KEPT; /* nothing recorded: nothing to lose */
    if (last < 0 || at < 0)
        return IDEM_GPOS_GONE;
    if (last >= recorded)
        return IDEM_GPOS_KEPT;
    *rewind = pos >= 0 && pos < at ? pos : at;
    return IDEM_GPOS_BEHIND;
}

int idem_gpos_touch_due(int64_t finished, int64_t touched, int64_t touched_ms,
                        int64_t acked, int64_t now_ms, int force)
{
    if (acked < 0 || finished < 0 || finished <= touched)
        return 0;
    return force || touched_ms < 0 || now_ms - touched_ms >= IDEM_GPOS_TOUCH_MS;
}

int idem_gpos_stale(int64_t at_ms, int64_t now_ms, int64_t ttl_seconds)
{
    return at_ms >= 0 && now_ms - at_ms > ttl_seconds * 1000;
}

const char *idem_gpos_verdict2str(idem_gpos_verdict_t v)
{
    switch (v) {
    case IDEM_GPOS_KEPT:
        return "kept";
    case IDEM_GPOS_BEHIND:
        return "behind";
    case IDEM_GPOS_GONE:
        return "gone";
    }
    return "?";
}

int idem_gpos_record_bucket(const char *field, size_t len, const char *base,
                            size_t blen)
{
    if (len != blen + 4 || memcmp(field, base, blen) || field[blen] != ':' ||
        field[blen + 1] != 'g')
        return -1;
    char d1 = field[blen + 2], d2 = field[blen + 3];
    if (d1 < '0' || d1 > '9' || d2 < '0' || d2 > '9')
        return -1;
    return (d1 - '0') * 10 + (d2 - '0');
}
