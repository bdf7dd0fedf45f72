/* file.c - opening the files of a model directory safely.
 *
 * A model directory is written by people and tools, and a name in it can
 * be a FIFO (open blocks for ever), a device (/dev/zero reads for ever) or
 * a directory. So every such file is opened without blocking, checked with
 * fstat to be a regular file (a symlink to one is fine: open follows it),
 * and read up to a limit. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

const char *cn__file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "not a file";
}

int cn__open_regular(const char *path, uint64_t max, int *fd_out,
                     uint64_t *size, cn_err *err) {
  struct stat sb;
  *fd_out = -1;
  /* O_NONBLOCK: opening a FIFO for reading waits for a writer without it */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 || fstat(fd, &sb) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return cn_err_set(err, CN_E_IO, "%s: cannot open: %s", path,
                      strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return cn_err_set(err, CN_E_BAD_MODEL, "'%s' is not a regular file (%s)",
                      path, cn__file_kind(sb.st_mode));
  }
  if ((uint64_t)sb.st_size > max) {
    close(fd);
    return cn_err_set(err, CN_E_BAD_MODEL, "'%s' has %lld bytes; at most "
                      "%llu are read", path, (long long)sb.st_size,
                      (unsigned long long)max);
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  *fd_out = fd;
  *size = (uint64_t)sb.st_size;
  return 0;
}

int cn__read_regular(const char *path, uint64_t max, size_t extra,
                     char **buf, size_t *len, cn_err *err) {
  int fd;
  uint64_t size;
  *buf = NULL;
  *len = 0;
  int rc = cn__open_regular(path, max, &fd, &size, err);
  if (rc != 0) return rc;
  char *b = malloc((size_t)size + extra + 1);
  if (b == NULL) {
    close(fd);
    return cn_err_set(err, CN_E_NOMEM, "%s: no memory for %llu bytes", path,
                      (unsigned long long)size);
  }
  /* at most the size fstat gave: a file that grows meanwhile is cut there */
  size_t got = 0;
  while (got < size) {
    ssize_t k = read(fd, b + got, (size_t)size - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      free(b);
      close(fd);
      return cn_err_set(err, CN_E_IO, "%s: read error: %s", path,
                        strerror(e));
    }
    if (k == 0) break; /* it shrank: what is there is what it holds */
    got += (size_t)k;
  }
  close(fd);
  b[got] = '\0';
  *buf = b;
  *len = got;
  return 0;
}
