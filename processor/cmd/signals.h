/* signals: how a long-running command (run, outbox) sets up its signals. */
#ifndef IDEM_SIGNALS_H
#define IDEM_SIGNALS_H

/* Installs on_stop (the command's own handler, with the run flag it sets)
 * for SIGTERM, SIGINT and SIGHUP, on_watchdog for SIGALRM, and ignores
 * SIGUSR1, SIGUSR2 and SIGPIPE. A hang-up stops cleanly like SIGTERM:
 * there is no configuration reload, and the default action would kill
 * without a commit. The user signals have no job: ignored, so a stray one
 * cannot kill the process. Cannot fail. */
void idem_signals_install(void (*on_stop)(int), void (*on_watchdog)(int));

#endif
