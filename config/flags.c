/* flags.c - flag parsing shared by the subcommands (cli/) and `canopy
 * serve` (server/serve.c). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flags.h"

int cn__flag_value(int argc, char **argv, int *i, const char *name,
                   const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0) return 0;
  if (a[n] == '=') { /* --name=value */
    *value = a + n + 1;
    return 1;
  }
  if (a[n] != '\0') return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "canopy: %s needs a value\n", name);
    return -1;
  }
  *value = argv[++*i];
  return 1;
}

int cn__parse_int(const char *flag, const char *s, long long min,
                  long long max, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min || v > max) {
    fprintf(stderr, "canopy: %s: '%s' is not an integer in [%lld, %lld]\n",
            flag, s, min, max);
    return -1;
  }
  *out = v;
  return 0;
}

/* The cores this process may run on: its affinity mask (taskset, a
 * container's cpuset), else the cores online. */
int cn__cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}
