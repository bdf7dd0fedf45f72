/* cli.h - the canopy subcommands. Each returns the process exit status:
 * 0 ok, 1 could not start (bad flags, model, backend), 2 some inputs were
 * refused (canopy run). */
#ifndef CANOPY_CLI_H
#define CANOPY_CLI_H

#include "flags.h" /* the flag helpers the subcommands share */

int cn_cmd_run(int argc, char **argv);
int cn_cmd_model(int argc, char **argv);
int cn_cmd_policy(int argc, char **argv);
/* `canopy serve` is the daemon's: server/serve.h. */

#endif
