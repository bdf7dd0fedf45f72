/* main.c - the canopy binary: one executable, several subcommands. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "canopy_version.h"
#include "cli.h"
#include "server/serve.h"

#ifndef CANOPY_VERSION
#define CANOPY_VERSION "dev"
#endif

/* "canopy 0.1.0 (git e509e55-dirty)": meson's project version and the
 * checkout's `git describe` at build time (cli/meson.build); empty when
 * the tree had no .git or git failed. */
static int version(void) {
  if (CANOPY_GIT_DESCRIBE[0] != '\0')
    printf("canopy %s (git %s)\n", CANOPY_VERSION, CANOPY_GIT_DESCRIBE);
  else
    printf("canopy %s (not built from a git checkout)\n", CANOPY_VERSION);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "canopy %s - an inference server for dynamic neural networks\n"
          "\n"
          "usage: canopy COMMAND [OPTIONS]\n"
          "\n"
          "commands:\n"
          "  run      run a model over a JSONL file of instances, batched\n"
          "  model    create (init) or describe (info) a model directory\n"
          "  policy   learn (train) or show a model's batching policy (FSM)\n"
          "  serve    the HTTP daemon: serve every model of a directory\n"
          "\n"
          "'canopy COMMAND --help' describes a command's options.\n",
          CANOPY_VERSION);
}

/* Standard input, output or error closed by whoever started the process
 * (`canopy serve >&- 2>&-`, a careless service wrapper): the next file
 * opened takes the lowest free descriptor, so libuv's own pipes landed on
 * 1 and 2, log lines went into them, and libuv aborted closing them at
 * exit. Each closed one is opened on /dev/null before anything else
 * opens a file. */
static void stdio_on_dev_null(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (n >= 0 && n != fd) {
      dup2(n, fd);
      close(n);
    }
  }
}

int main(int argc, char **argv) {
  stdio_on_dev_null();
  /* A peer or a log reader that goes away makes a write fail with EPIPE,
   * never kills the process: from the first instruction, so a daemon
   * whose stderr pipe closes while its models load lives on */
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    usage(stderr);
    return 1;
  }
  const char *cmd = argv[1];
  /* `canopy serve --version` (what a service manager or an image runs) is
   * `canopy --version`, whatever the command */
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--version") == 0) return version();
  if (strcmp(cmd, "run") == 0) return cn_cmd_run(argc - 1, argv + 1);
  if (strcmp(cmd, "model") == 0) return cn_cmd_model(argc - 1, argv + 1);
  if (strcmp(cmd, "policy") == 0) return cn_cmd_policy(argc - 1, argv + 1);
  if (strcmp(cmd, "serve") == 0) return cn_cmd_serve(argc - 1, argv + 1);
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
      strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0) return version();
  fprintf(stderr, "canopy: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 1;
}
