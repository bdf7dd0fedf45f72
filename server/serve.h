/* serve.h - the daemon's entry, `canopy serve`: the one declaration of
 * server/ that cli/main.c (which dispatches the subcommands) includes.
 * Returns the process exit status: 0 after a clean drain (or --help), 1
 * if it could not start (bad flags or configuration, a model, a backend,
 * the port). */
#ifndef CANOPY_SERVE_H
#define CANOPY_SERVE_H

int cn_cmd_serve(int argc, char **argv);

#endif
