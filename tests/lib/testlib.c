/* testlib: helpers every test tier may use (testlib.h). */
#include "testlib.h"
#include "input/envelope.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *th_src(void)
{
    const char *s = getenv("IDEMPROC_SRC");
    return s ? s : ".";
}

char *th_tmpdir(void)
{
    char tmpl[] = "/tmp/idemproc-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static int rm_one(const char *path, const struct stat *st, int type,
                  struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    remove(path);
    return 0; /* go on: remove what can be removed */
}

void th_rmrf(const char *dir)
{
    if (!dir || strncmp(dir, "/tmp/idemproc-test-", 19))
        return; /* never remove anything we did not create */
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *th_slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    size_t cap = 4096, n = 0, r;
    char *buf = malloc(cap);
    while ((r = fread(buf + n, 1, cap - n - 1, fp)) > 0) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    fclose(fp);
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

int th_write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    if (!fp)
        return -1;
    fputs(text, fp);
    return fclose(fp);
}

const char *th_file_in(char **dir, const char *name, const char *text)
{
    static char path[512];
    if (!*dir)
        *dir = th_tmpdir();
    cr_assert(*dir, "th_tmpdir failed");
    snprintf(path, sizeof(path), "%s/%s", *dir, name);
    cr_assert_eq(th_write_file(path, text), 0, "cannot write %s", path);
    return path;
}

double th_metric(const char *body, const char *name)
{
    size_t nl = strlen(name);
    for (const char *l = body; l && *l;
         l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (!strncmp(l, name, nl) && l[nl] == ' ')
            return strtod(l + nl + 1, NULL);
    }
    return -1;
}

int th_classify(const char *value, size_t len, const char *hdr_mid,
                const char *hdr_ikey, size_t max_bytes, void *env)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(2);
    if (hdr_mid)
        rd_kafka_header_add(h, "message_id", -1, hdr_mid, -1);
    if (hdr_ikey)
        rd_kafka_header_add(h, "idempotency_key", -1, hdr_ikey, -1);
    idem_reason_t reason;
    char err[256];
    int r = idem_envelope_parse(value, len, h, 1, max_bytes, env, &reason, err,
                                sizeof(err));
    rd_kafka_headers_destroy(h);
    return r == 0 ? -1 : (int)reason;
}
