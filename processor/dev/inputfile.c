/* inputfile: the lines of `produce --input` (inputfile.h). */
#include "dev/inputfile.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>

#define POPULATE_MAX ((uint64_t)1 << 30) /* bytes mapped at once */

void idem_inputfile_open(idem_inputfile_t *f, FILE *fp)
{
    memset(f, 0, sizeof(*f));
    f->fp = fp;
    struct stat st;
    if (fstat(fileno(fp), &st) || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        ftello(fp) != 0)
        return;
    /* Mapped at once up to POPULATE_MAX (a page fault every few lines
     * otherwise); a larger file is faulted in as it is read. */
    int populate = (uint64_t)st.st_size <= POPULATE_MAX ? MAP_POPULATE : 0;
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | populate,
                   fileno(fp), 0);
    if (m == MAP_FAILED)
        return;
    /* Read front to back once: read ahead, drop behind. */
    (void)madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
    f->map = m;
    f->map_len = (size_t)st.st_size;
}

/* len without the trailing "\n" and "\r" bytes of line. */
static size_t trim_end(const char *line, size_t len)
{
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    return len;
}

long idem_inputfile_next(idem_inputfile_t *f, const char **line)
{
    if (!f->map) {
        ssize_t n = getline(&f->line, &f->cap, f->fp);
        if (n < 0)
            return -1;
        *line = f->line;
        return (long)trim_end(f->line, (size_t)n);
    }
    if (f->off >= f->map_len)
        return -1;
    const char *start = f->map + f->off;
    size_t left = f->map_len - f->off;
    const char *nl = memchr(start, '\n', left);
    size_t n = nl ? (size_t)(nl - start) + 1 : left;
    f->off += n;
    *line = start;
    return (long)trim_end(start, n);
}

int idem_inputfile_kept(const idem_inputfile_t *f)
{
    return f->map != NULL;
}

void idem_inputfile_close(idem_inputfile_t *f)
{
    if (f->map)
        munmap((void *)f->map, f->map_len);
    free(f->line);
    memset(f, 0, sizeof(*f));
}
