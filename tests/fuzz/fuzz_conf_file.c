/* fuzz_conf_file: the properties-file parser (idem_conf_load_file) and
 * finalize, on a file holding the input. */
#include "conf/conf.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz-conf", 0);
        if (fd < 0)
            return 0;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || pwrite(fd, data, size, 0) != (ssize_t)size)
        return 0;
    char err[512];
    idem_conf_t *conf = idem_conf_new();
    if (idem_conf_load_file(conf, path, err, sizeof(err)) == 0)
        idem_conf_finalize(conf, err, sizeof(err));
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        idem_conf_dump(conf, null);
        fclose(null);
    }
    idem_conf_destroy(conf);
    return 0;
}
