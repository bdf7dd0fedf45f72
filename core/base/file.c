/* file.c - opening the files of a model directory safely.
 *
 * A model directory is written by people and tools, and a name in it can
 * be a FIFO (open blocks for ever), a device (/dev/zero reads for ever) or
 * a directory. So every such file is opened without blocking, checked with
 * fstat to be a regular file (a symlink to one is fine: open follows it),
 * and read up to a limit. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/openat2.h>
#endif

#include "base/base.h"

const char *cn_file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "not a file";
}

/* One writer for the four files core writes whole (model.json, weights,
 * vocabularies, cached policies): each had its own copy of tmp + fsync +
 * rename. */
cn__fw_step cn__file_write_atomic(const char *path, const char *tmp,
                                  bool fresh, int (*fill)(FILE *f, void *ctx),
                                  void *ctx) {
  FILE *f;
  if (fresh) {
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL && fd >= 0) {
      int e = errno;
      close(fd);
      errno = e;
    }
  } else {
    f = fopen(tmp, "wb");
  }
  if (f == NULL) return CN__FW_CREATE;
  cn__fw_step step = CN__FW_OK;
  if (fill(f, ctx) != 0 || fflush(f) != 0 || ferror(f) ||
      fsync(fileno(f)) != 0)
    step = CN__FW_WRITE;
  int e = errno;
  if (fclose(f) != 0 && step == CN__FW_OK) {
    step = CN__FW_CLOSE;
    e = errno;
  }
  if (step == CN__FW_OK && rename(tmp, path) != 0) {
    step = CN__FW_RENAME;
    e = errno;
  }
  if (step != CN__FW_OK) unlink(tmp);
  errno = e;
  return step;
}

/* The callers that write a file whole all word its failure the same way;
 * one switch over the step, not one per caller. */
int cn__file_write_atomic_err(const char *path, const char *tmp, bool fresh,
                              int (*fill)(FILE *f, void *ctx), void *ctx,
                              cn_err *err) {
  switch (cn__file_write_atomic(path, tmp, fresh, fill, ctx)) {
  case CN__FW_OK:
    return 0;
  case CN__FW_CREATE:
    return cn_err_set(err, CN_E_IO, "%s: cannot create: %s", tmp,
                      strerror(errno));
  case CN__FW_WRITE:
  case CN__FW_CLOSE:
    return cn_err_set(err, CN_E_IO, "%s: write failed: %s", tmp,
                      strerror(errno));
  case CN__FW_RENAME:
    break;
  }
  return cn_err_set(err, CN_E_IO, "%s: cannot rename to %s: %s", tmp, path,
                    strerror(errno));
}

/* Does the open file fd lie inside the directory dirfd? Both as the
 * kernel names them now (/proc/self/fd): the fallback of a kernel without
 * openat2 (Linux < 5.6, or a seccomp filter that refuses it). */
static bool fd_inside(int dirfd, int fd) {
  char a[64], b[64], da[4096], fa[4096];
  snprintf(a, sizeof(a), "/proc/self/fd/%d", dirfd);
  snprintf(b, sizeof(b), "/proc/self/fd/%d", fd);
  ssize_t nd = readlink(a, da, sizeof(da) - 1);
  ssize_t nf = readlink(b, fa, sizeof(fa) - 1);
  if (nd <= 0 || nf <= 0) return false;
  da[nd] = fa[nf] = '\0';
  if (nd == 1 && da[0] == '/') return true;
  return nf > nd && strncmp(da, fa, (size_t)nd) == 0 && fa[nd] == '/';
}

/* rel opened below dirfd and never outside it: no absolute path, no ".."
 * past it, no symlink that leads out (RESOLVE_BENEATH, openat2(2)). -1
 * with errno EXDEV when it would leave. */
static int open_beneath(int dirfd, const char *rel, int flags) {
  if (rel[0] == '/') {
    errno = EXDEV;
    return -1;
  }
#if defined(__linux__) && defined(SYS_openat2)
  struct open_how how = {.flags = (unsigned long long)flags,
                         .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
  long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
  if (fd >= 0 || (errno != ENOSYS && errno != EPERM && errno != E2BIG))
    return (int)fd;
#endif
  int f = openat(dirfd, rel, flags);
  if (f >= 0 && !fd_inside(dirfd, f)) {
    close(f);
    errno = EXDEV;
    return -1;
  }
  return f;
}

int cn__open_regular_at(int dirfd, const char *rel, const char *path,
                        uint64_t max, int *fd_out, uint64_t *size,
                        cn_err *err) {
  struct stat sb;
  *fd_out = -1;
  /* O_NONBLOCK: opening a FIFO for reading waits for a writer without it */
  int fl = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  int fd = dirfd == AT_FDCWD ? open(path, fl) : open_beneath(dirfd, rel, fl);
  if (fd < 0 && errno == EXDEV)
    return cn_err_set(err, CN_E_BAD_MODEL, "'%s' leads outside the model "
                      "directory (an absolute path or symlink, or '..' past "
                      "it): every file of a model lies inside its directory",
                      path);
  if (fd < 0 || fstat(fd, &sb) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return cn_err_set(err, CN_E_IO, "%s: cannot open: %s", path,
                      strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return cn_err_set(err, CN_E_BAD_MODEL, "'%s' is not a regular file (%s)",
                      path, cn_file_kind(sb.st_mode));
  }
  if ((uint64_t)sb.st_size > max) {
    close(fd);
    return cn_err_set(err, CN_E_BAD_MODEL, "'%s' has %lld bytes; at most "
                      "%llu are read", path, (long long)sb.st_size,
                      (unsigned long long)max);
  }
  int f = fcntl(fd, F_GETFL);
  if (f >= 0) fcntl(fd, F_SETFL, f & ~O_NONBLOCK);
  *fd_out = fd;
  *size = (uint64_t)sb.st_size;
  return 0;
}

int cn__open_regular(const char *path, uint64_t max, int *fd_out,
                     uint64_t *size, cn_err *err) {
  return cn__open_regular_at(AT_FDCWD, path, path, max, fd_out, size, err);
}

int cn__read_regular(const char *path, uint64_t max, size_t extra,
                     char **buf, size_t *len, cn_err *err) {
  return cn__read_regular_at(AT_FDCWD, path, path, max, extra, buf, len, err);
}

int cn__read_regular_at(int dirfd, const char *rel, const char *path,
                        uint64_t max, size_t extra, char **buf, size_t *len,
                        cn_err *err) {
  int fd;
  uint64_t size;
  *buf = NULL;
  *len = 0;
  int rc = cn__open_regular_at(dirfd, rel, path, max, &fd, &size, err);
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
