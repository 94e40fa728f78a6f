/* signals: the signal setup run and outbox share (signals.h). */
#include "cmd/signals.h"

#include <signal.h>
#include <string.h>

void idem_signals_install(void (*on_stop)(int), void (*on_watchdog)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = on_watchdog;
    sigaction(SIGALRM, &sa, NULL);
    signal(SIGUSR1, SIG_IGN);
    signal(SIGUSR2, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
}
