/* signals: the one signal and watchdog setup of every command (run,
 * outbox, produce, broker). */
#ifndef IDEM_SIGNALS_H
#define IDEM_SIGNALS_H

/* How a command stops. */
typedef struct {
    /* After the first stop signal (or idem_signals_arm_watchdog), exit 1
     * if the command is still running this many seconds later, writing
     * watchdog_msg (one line) to stderr: a hung broker or Redis call must
     * not outlive the orchestrator's patience. 0: no watchdog. */
    unsigned watchdog_s;
    const char *watchdog_msg;
    /* 1: a second stop signal exits at once with 128+signal, without a
     * final commit (run, outbox). 0: it sets the abort flag instead
     * (produce purges what is queued). */
    int second_exits;
    /* 1: SIGHUP stops like SIGTERM (there is no configuration reload, and
     * the default action would kill without a commit); SIGUSR1, SIGUSR2
     * and SIGPIPE are ignored, so a stray one cannot kill the process. */
    int daemon;
} idem_signals_opts_t;

/* Installs the handlers for SIGTERM and SIGINT (and what `o` adds) and
 * clears both flags. o is copied. Cannot fail. */
void idem_signals_setup(const idem_signals_opts_t *o);

/* Set by the first stop signal: the command finishes what is in hand and
 * returns. Process-global, the only such state of a command. */
volatile int *idem_signals_stop_flag(void);

/* Set by the second stop signal when second_exits is 0. */
volatile int *idem_signals_abort_flag(void);

/* Starts the watchdog without a signal (shutdown began for another reason,
 * a fatal producer error): the same bound applies. No-op after a signal
 * (it runs already) or without a watchdog. */
void idem_signals_arm_watchdog(void);

#endif
