/* hooksink: the scripted HTTP server of the tests (tests/hooksrv.c) as a
 * program, for the benchmark: answers every POST with one status after a
 * fixed delay, prints its URL on the first line of stdout, and on SIGTERM
 * or SIGINT prints how many requests it answered. */
#include "../hooksrv.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t running = 1;

static void on_signal(int sig)
{
    (void)sig;
    running = 0;
}

int main(int argc, char **argv)
{
    th_hook_reply_t reply = {.status = 200, .delay_ms = 5};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--delay-ms") && i + 1 < argc) {
            reply.delay_ms = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--status") && i + 1 < argc) {
            reply.status = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: hooksink [--delay-ms N] [--status S]\n");
            return 2;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    th_hook_t *h = th_hook_start(reply, 0);
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
    th_hook_stop(h);
    return 0;
}
