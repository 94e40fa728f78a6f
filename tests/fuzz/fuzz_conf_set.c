/* fuzz_conf_set: `--set key=value` and IDEMPROC_<KEY> environment parsing
 * (idem_conf_load): each input line is one --set, and also, prefixed with
 * IDEMPROC_, one environment variable. */
#include "conf/conf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    char *lines[64], *env[65];
    size_t n = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l && n < 64;
         l = strtok_r(NULL, "\n", &save))
        lines[n++] = l;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(lines[i]);
        env[i] = malloc(len + 10);
        memcpy(env[i], "IDEMPROC_", 9);
        memcpy(env[i] + 9, lines[i], len + 1);
    }
    env[n] = NULL;
    char err[512];
    idem_conf_t *conf = idem_conf_load(NULL, NULL, lines, n, err, sizeof(err));
    FILE *null = fopen("/dev/null", "w");
    if (conf && null)
        idem_conf_dump(conf, null);
    idem_conf_destroy(conf);
    conf = idem_conf_load(NULL, env, NULL, 0, err, sizeof(err));
    if (conf && null)
        idem_conf_dump(conf, null);
    idem_conf_destroy(conf);
    if (null)
        fclose(null);
    for (size_t i = 0; i < n; i++)
        free(env[i]);
    free(text);
    return 0;
}
