/* flags.h - small flag helpers shared by the subcommands (cli/) and the
 * daemon's `canopy serve` (server/serve.c). */
#ifndef CANOPY_FLAGS_H
#define CANOPY_FLAGS_H

/* If argv[*i] is --name, takes argv[*i + 1] as its value (or fails with a
 * message); returns 1 if matched, 0 if not, -1 on a missing value. */
int cn__flag_value(int argc, char **argv, int *i, const char *name,
                   const char **value);
int cn__parse_int(const char *flag, const char *s, long long min,
                  long long max, long long *out);
/* The cores this process may run on (its affinity mask, e.g. taskset). */
int cn__cpu_count(void);

#endif
