/* cli.h - the canopy subcommands. Each returns the process exit status:
 * 0 ok, 1 could not start (bad flags, model, backend), 2 some inputs were
 * refused (canopy run). */
#ifndef CANOPY_CLI_H
#define CANOPY_CLI_H

int cn_cmd_run(int argc, char **argv);
int cn_cmd_model(int argc, char **argv);
int cn_cmd_policy(int argc, char **argv);
int cn_cmd_serve(int argc, char **argv);

/* Small flag helpers shared by the subcommands. */
/* If argv[*i] is --name, takes argv[*i + 1] as its value (or fails with a
 * message); returns 1 if matched, 0 if not, -1 on a missing value. */
int cn__flag_value(int argc, char **argv, int *i, const char *name,
                   const char **value);
int cn__parse_int(const char *flag, const char *s, long long min,
                  long long max, long long *out);
/* The cores this process may run on (its affinity mask, e.g. taskset). */
int cn__cpu_count(void);

#endif
