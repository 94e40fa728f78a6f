/* cmd: the entry points of idemproc's subcommands (one cmd_<name>.c each).
 * Each returns the process exit code: 0 success, 1 runtime failure, 2 usage
 * or configuration error. `argv[0]` is the subcommand's name. */
#ifndef IDEM_CMD_H
#define IDEM_CMD_H

#include <stdio.h>

#include "conf/conf.h"

#define IDEM_EXIT_OK    0
#define IDEM_EXIT_FAIL  1
#define IDEM_EXIT_USAGE 2

int idem_cmd_run(int argc, char **argv, char **envp);
int idem_cmd_produce(int argc, char **argv, char **envp);
int idem_cmd_broker(int argc, char **argv, char **envp);
int idem_cmd_verify(int argc, char **argv, char **envp);
int idem_cmd_dlq(int argc, char **argv, char **envp);
int idem_cmd_outbox(int argc, char **argv, char **envp);
int idem_cmd_offsets(int argc, char **argv, char **envp);
int idem_cmd_layout(int argc, char **argv, char **envp);
int idem_cmd_state(int argc, char **argv, char **envp);
int idem_cmd_migrate(int argc, char **argv, char **envp);

/* Usage texts, printed by `idemproc help CMD` and `idemproc CMD --help`. */
void idem_cmd_run_usage(FILE *out);
void idem_cmd_produce_usage(FILE *out);
void idem_cmd_broker_usage(FILE *out);
void idem_cmd_verify_usage(FILE *out);
void idem_cmd_dlq_usage(FILE *out);
void idem_cmd_outbox_usage(FILE *out);
void idem_cmd_offsets_usage(FILE *out);
void idem_cmd_layout_usage(FILE *out);
void idem_cmd_state_usage(FILE *out);
void idem_cmd_migrate_usage(FILE *out);

/* check-config --for outbox --connect: what the relay needs, printed to
 * out: the brokers and outbox.topic, PostgreSQL and outbox.table. 0 when
 * all are there, 1 (IDEM_EXIT_FAIL) with the first problem on stderr. */
int idem_cmd_outbox_check(const idem_conf_t *conf, int timeout_ms, FILE *out);

/* check-config --connect in cluster mode (redis.cluster.nodes): each seed
 * reached or not, each primary of the slot map checked as a single Redis
 * is (connection with redis.url's user, password and TLS; SCRIPT LOAD;
 * maxmemory-policy) and in cluster_state ok, and every slot covered; one
 * line per node to out. 0 when all primaries pass and every slot has one,
 * 1 (IDEM_EXIT_FAIL) with each failure on stderr naming its node. */
int idem_cmd_cluster_check(const idem_conf_t *conf, FILE *out);

#endif
