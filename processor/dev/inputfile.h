/* inputfile: the lines of `produce --input`: a regular file mapped whole
 * and read in place, anything else (stdin, a pipe) read line by line. */
#ifndef IDEM_INPUTFILE_H
#define IDEM_INPUTFILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    FILE *fp;        /* borrowed: the stream when nothing is mapped */
    const char *map; /* the mapped file, or NULL */
    size_t map_len;  /* its size when it was opened */
    size_t off;      /* the next line's first byte in map */
    char *line;      /* getline's buffer (streams) */
    size_t cap;
} idem_inputfile_t;

/* Starts reading fp (borrowed, must outlive *f). A regular file that is
 * not empty is mapped as it is now (lines appended later are not read);
 * anything else is read with getline. Never fails: a file that cannot be
 * mapped is read as a stream. */
void idem_inputfile_open(idem_inputfile_t *f, FILE *fp);

/* The next line without its end ("\n", "\r\n", any run of them) in *line,
 * its length returned: 0 for an empty line, -1 at the end of the input or
 * on a read error (ferror(fp) tells them apart for streams; a mapped file
 * has no read errors). *line is not NUL-terminated. A mapped line stays
 * valid until idem_inputfile_close(); a streamed one until the next call.
 * idem_inputfile_kept() says which. */
long idem_inputfile_next(idem_inputfile_t *f, const char **line);

/* 1 when the lines stay valid until idem_inputfile_close() (the file is
 * mapped), so that a producer may read them in place until it is flushed. */
int idem_inputfile_kept(const idem_inputfile_t *f);

/* Unmaps the file and frees the buffer; fp is left open. */
void idem_inputfile_close(idem_inputfile_t *f);

#endif
