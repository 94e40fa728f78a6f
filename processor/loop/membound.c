/* membound: the member's process-level memory bound (membound.h). */
#include "loop/membound.h"

int64_t idem_membound_need(int64_t tables_max, int64_t prefetch_kbytes,
                           int64_t batch_max)
{
    return tables_max + 2 * prefetch_kbytes * 1024 + 4 * batch_max * 2048 +
           IDEM_MEMBOUND_FIXED_BYTES;
}

void idem_membound_init(idem_membound_t *mb, int64_t max,
                        int64_t prefetch_kbytes)
{
    mb->max = max;
    int64_t give_back = prefetch_kbytes * 1024;
    /* A bound too small for its prefetch was refused at start; keep the
     * resume point under max anyway. */
    if (give_back >= max / 2)
        give_back = max / 2;
    mb->resume_below = max - give_back;
    mb->over = 0;
    mb->pauses = 0;
    mb->last_rss = -1;
}

int idem_membound_update(idem_membound_t *mb, int64_t rss)
{
    if (mb->max <= 0 || rss < 0)
        return 0;
    mb->last_rss = rss;
    if (!mb->over && rss > mb->max) {
        mb->over = 1;
        mb->pauses++;
        return 1;
    }
    if (mb->over && rss < mb->resume_below) {
        mb->over = 0;
        return -1;
    }
    return 0;
}
