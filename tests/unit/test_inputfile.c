/* test_inputfile: the lines of `produce --input` (inputfile.c) are the
 * same whether the file is mapped or read as a stream (a pipe), a lone
 * "\r" inside a line is data, and a mapped file's lines stay valid until
 * it is closed. */
#include "dev/inputfile.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define TEXT "a\n\nb c\r\n\r\n{\"x\":1}\rz\nlast"

static const char *want[] = {"a", "", "b c", "", "{\"x\":1}\rz", "last"};
#define NWANT (sizeof(want) / sizeof(want[0]))

/* Reads every line of f into got[] (copied), returns their number. */
static size_t read_all(idem_inputfile_t *f, char got[][32], size_t max)
{
    size_t n = 0;
    const char *line;
    long len;
    while ((len = idem_inputfile_next(f, &line)) >= 0) {
        cr_assert_lt(n, max);
        cr_assert_lt(len, 32);
        memcpy(got[n], line, (size_t)len);
        got[n][len] = '\0';
        n++;
    }
    return n;
}

static void expect_lines(char got[][32], size_t n)
{
    cr_assert_eq(n, NWANT, "%zu lines, want %zu", n, NWANT);
    for (size_t i = 0; i < NWANT; i++)
        cr_expect_str_eq(got[i], want[i], "line %zu", i + 1);
}

Test(inputfile, regular_file_is_mapped_and_split_like_getline)
{
    FILE *fp = tmpfile();
    cr_assert_not_null(fp);
    fputs(TEXT, fp);
    fflush(fp);
    rewind(fp);
    idem_inputfile_t f;
    idem_inputfile_open(&f, fp);
    cr_expect(idem_inputfile_kept(&f), "a regular file is mapped");
    char got[16][32];
    expect_lines(got, read_all(&f, got, 16));
    idem_inputfile_close(&f);
    fclose(fp);
}

Test(inputfile, mapped_lines_stay_valid_until_close)
{
    FILE *fp = tmpfile();
    cr_assert_not_null(fp);
    fputs("first\nsecond\n", fp);
    fflush(fp);
    rewind(fp);
    idem_inputfile_t f;
    idem_inputfile_open(&f, fp);
    const char *l1, *l2;
    cr_assert_eq(idem_inputfile_next(&f, &l1), 5);
    cr_assert_eq(idem_inputfile_next(&f, &l2), 6);
    cr_expect_eq(idem_inputfile_next(&f, &l2), -1);
    cr_expect(!memcmp(l1, "first", 5), "the first line is still there");
    idem_inputfile_close(&f);
    fclose(fp);
}

Test(inputfile, pipe_is_streamed_with_the_same_lines)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    cr_assert_eq(write(fds[1], TEXT, strlen(TEXT)), (ssize_t)strlen(TEXT));
    close(fds[1]);
    FILE *fp = fdopen(fds[0], "r");
    cr_assert_not_null(fp);
    idem_inputfile_t f;
    idem_inputfile_open(&f, fp);
    cr_expect(!idem_inputfile_kept(&f), "a pipe cannot be mapped");
    char got[16][32];
    expect_lines(got, read_all(&f, got, 16));
    cr_expect(!ferror(fp));
    idem_inputfile_close(&f);
    fclose(fp);
}

Test(inputfile, empty_file_has_no_lines)
{
    FILE *fp = tmpfile();
    cr_assert_not_null(fp);
    idem_inputfile_t f;
    idem_inputfile_open(&f, fp);
    const char *line;
    cr_expect_eq(idem_inputfile_next(&f, &line), -1);
    idem_inputfile_close(&f);
    fclose(fp);
}
