/* signals: the signal handlers and the shutdown watchdog every command
 * shares (signals.h). */
#include "cmd/signals.h"
#include "cmd/cmd.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile int stop_flag;
static volatile int abort_flag;
static idem_signals_opts_t opts;

/* SIGALRM after the first signal: shutdown overran its bound. Exit
 * without committing rather than be killed later. Async-signal-safe:
 * write and _exit only. */
static void on_watchdog(int sig)
{
    (void)sig;
    if (opts.watchdog_msg) {
        ssize_t w =
            write(STDERR_FILENO, opts.watchdog_msg, strlen(opts.watchdog_msg));
        w = write(STDERR_FILENO, "\n", 1);
        (void)w;
    }
    _exit(IDEM_EXIT_FAIL);
}

/* SIGTERM, SIGINT (SIGHUP for daemons), on whichever thread the kernel
 * picks (librdkafka's threads block signals): sets the flags, arms the
 * watchdog. */
static void on_stop(int sig)
{
    if (stop_flag) {
        if (opts.second_exits)
            _exit(128 + sig);
        abort_flag = 1;
        return;
    }
    stop_flag = 1;
    if (opts.watchdog_s)
        alarm(opts.watchdog_s);
}

void idem_signals_setup(const idem_signals_opts_t *o)
{
    opts = *o;
    stop_flag = 0;
    abort_flag = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (opts.daemon) {
        sigaction(SIGHUP, &sa, NULL);
        signal(SIGUSR1, SIG_IGN);
        signal(SIGUSR2, SIG_IGN);
        signal(SIGPIPE, SIG_IGN);
    }
    if (opts.watchdog_s) {
        sa.sa_handler = on_watchdog;
        sigaction(SIGALRM, &sa, NULL);
    }
}

volatile int *idem_signals_stop_flag(void)
{
    return &stop_flag;
}

volatile int *idem_signals_abort_flag(void)
{
    return &abort_flag;
}

void idem_signals_arm_watchdog(void)
{
    if (!stop_flag && opts.watchdog_s)
        alarm(opts.watchdog_s);
}
