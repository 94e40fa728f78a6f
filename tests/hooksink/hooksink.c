/* hooksink: the scripted HTTP server of the tests (tests/harness/hooksrv.c) as
 * a program, for the benchmark: answers every POST with one status after a
 * fixed delay, prints its URL on the first line of stdout, and on SIGTERM
 * or SIGINT prints how many requests it answered (with --record, also how
 * many distinct Idempotency-Keys, and the first keys answered 2xx twice). */
#include "../harness/hooksrv.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t running = 1;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void on_signal(int sig)
{
    (void)sig;
    running = 0;
}

int main(int argc, char **argv)
{
    th_hook_reply_t reply = {.status = 200, .delay_ms = 5};
    int rec = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--record")) {
            rec = 1;
            continue;
        }
        if (!strcmp(argv[i], "--delay-ms") && i + 1 < argc) {
            reply.delay_ms = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--status") && i + 1 < argc) {
            reply.status = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: hooksink [--delay-ms N] [--status S] "
                            "[--record]\n");
            return 2;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    th_hook_t *h = th_hook_start(reply, rec);
    if (!h) {
        fprintf(stderr, "hooksink: cannot start the server\n");
        return 1;
    }
    printf("%s\n", th_hook_url(h));
    fflush(stdout);
    while (running)
        usleep(100 * 1000);
    fprintf(stderr, "hooksink: %zu requests, %zu answered 2xx\n",
            th_hook_count(h), th_hook_count_2xx(h));
    if (rec) {
        size_t acks, keys = th_hook_keys_acked(h, "", &acks);
        fprintf(stderr, "hooksink: %zu keys acknowledged, %zu repeats\n", keys,
                acks - keys);
        size_t n, m = 0, shown = 0;
        th_hook_req_t *q = th_hook_requests(h, &n);
        char **ok = calloc(n ? n : 1, sizeof(*ok));
        for (size_t i = 0; i < n; i++)
            if (q[i].key && q[i].status / 100 == 2)
                ok[m++] = q[i].key;
        qsort(ok, m, sizeof(*ok), cmp_str);
        for (size_t i = 1; i < m && shown < 10; i++)
            if (!strcmp(ok[i], ok[i - 1]) &&
                (i < 2 || strcmp(ok[i], ok[i - 2]))) {
                fprintf(stderr, "hooksink: repeated: %s\n", ok[i]);
                shown++;
            }
        free(ok);
        th_hook_requests_free(q, n);
    }
    th_hook_stop(h);
    return 0;
}
