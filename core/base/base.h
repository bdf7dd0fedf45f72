/* base.h - what every part of core/ uses (base/): sizes, the checked
 * allocators, a small random stream; errors are cn_err (canopy_core.h,
 * base/err.c). Includes nothing of core/ but the public header. */
#ifndef CANOPY_BASE_H
#define CANOPY_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "canopy_core.h"

#define CN_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define CN_MAX_TYPES 8
#define CN_MAX_TENSORS 32

/* splitmix64 (Steele et al. 2014): a tiny, well-mixed stream, for weight
 * init and Zobrist keys. */
static inline uint64_t cn__splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Checked allocation helpers: NULL on overflow or failure. */
void *cn__xcalloc(size_t n, size_t size);
void *cn__xrealloc(void *p, size_t n, size_t size);

/* A bump allocator kept across resets (arena.c): allocations live until
 * cn__arena_reset, which keeps the blocks for the next round, or
 * cn__arena_free. 16-byte aligned. Zero-initialise the struct. */
typedef struct cn_arena_block cn_arena_block;
typedef struct cn_arena {
  cn_arena_block *first, *cur, *last;
  size_t bytes; /* held in blocks */
} cn_arena;
void *cn__arena_alloc(cn_arena *a, size_t n);
void *cn__arena_calloc(cn_arena *a, size_t n, size_t size);
void cn__arena_reset(cn_arena *a);
void cn__arena_free(cn_arena *a);

/* CLOCK_MONOTONIC in milliseconds, microseconds (util.c; in seconds:
 * canopy_core.h's cn_now_s): for durations only (training limits, compile
 * and cell timings). */
double cn__now_ms(void);
double cn__now_us(void);

/* Numbers written without a bounds check each (f32fmt.c, jsonw.c): the
 * writers below copy in fixed sizes and may write up to CN__JSON_SCRATCH
 * bytes past the start of the last thing they write (never past that;
 * what lies beyond their result is overwritten by what comes next), so
 * the caller reserves that much beyond the text's bound. */
enum { CN__JSON_SCRATCH = 48 };
/* The n floats of x as a JSON array ("[a,b,c]", each as cn_f32_json
 * writes it) at p, which has room for 2 + n·(CN_JSON_FLOAT_MAX + 1) +
 * CN__JSON_SCRATCH bytes; returns the end (no NUL). Clears *finite if a
 * value is NaN or infinite (printed null). */
char *cn__f32_json_array(char *p, const float *x, int64_t n, int *finite);
/* The n bytes of s as a JSON string, escaped as cn_buf_string escapes
 * it, at p, which has room for 2 + 6·n bytes; returns the end (no NUL). */
char *cn__json_string_at(char *p, const char *s, size_t n);
/* The decimal digits of v at p (at most 20 bytes); returns the end. */
char *cn__json_int_at(char *p, long long v);

/* The files of a model directory (file.c). cn__open_regular opens path
 * without blocking and checks with fstat that it is a regular file (a
 * symlink to one is fine) of at most max bytes: otherwise err says
 * "'PATH' is not a regular file (a FIFO)" or gives the size. On success
 * *fd is open (blocking again) and *size is the file's size. */
int cn__open_regular(const char *path, uint64_t max, int *fd,
                     uint64_t *size, cn_err *err);
/* Reads the whole regular file (as cn__open_regular checks it) into *buf,
 * which has *len bytes, then `extra` spare bytes and a NUL. */
int cn__read_regular(const char *path, uint64_t max, size_t extra,
                     char **buf, size_t *len, cn_err *err);
/* The same for rel, relative to the open directory dirfd (a model's,
 * opened once: every file of one load comes from the same directory even
 * if a symlink to it flips meanwhile) and never outside it: an absolute
 * rel, '..' past dirfd or a symlink that leads out is refused (openat2
 * RESOLVE_BENEATH). path names the file in messages. dirfd
 * AT_FDCWD: path as cn__open_regular opens it. */
int cn__open_regular_at(int dirfd, const char *rel, const char *path,
                        uint64_t max, int *fd, uint64_t *size, cn_err *err);
int cn__read_regular_at(int dirfd, const char *rel, const char *path,
                        uint64_t max, size_t extra, char **buf, size_t *len,
                        cn_err *err);
/* "a directory", "a FIFO", ... for a stat st_mode: canopy_core.h's
 * cn_file_kind. */

/* Where cn__file_write_atomic stopped: the caller words the message. */
typedef enum {
  CN__FW_OK = 0,
  CN__FW_CREATE, /* tmp could not be created */
  CN__FW_WRITE,  /* fill, fflush or fsync of tmp failed */
  CN__FW_CLOSE,  /* fclose of tmp failed */
  CN__FW_RENAME, /* tmp could not be renamed over path */
} cn__fw_step;

/* Writes path once and whole: fill(f, ctx) writes the temporary file tmp
 * (named by the caller: path.tmp, or with a pid), which is flushed,
 * fsynced, closed and renamed over path, so a reader sees the old file or
 * the new one, never half of it. fill returns 0 or -1 (errno set). fresh:
 * whatever has the name tmp (a FIFO would block the open for ever) is
 * unlinked and tmp created anew (O_EXCL, 0644); otherwise fopen "wb".
 * Returns CN__FW_OK or the step that failed, with errno as that step left
 * it; tmp is removed on failure. */
cn__fw_step cn__file_write_atomic(const char *path, const char *tmp,
                                  bool fresh, int (*fill)(FILE *f, void *ctx),
                                  void *ctx);
/* cn__file_write_atomic with the failure worded into err (CN_E_IO): the
 * step and the file it failed on (tmp for creating, writing and closing;
 * tmp and path for the rename), and errno's text. Returns 0 or CN_E_IO. */
int cn__file_write_atomic_err(const char *path, const char *tmp, bool fresh,
                              int (*fill)(FILE *f, void *ctx), void *ctx,
                              cn_err *err);

#endif /* CANOPY_BASE_H */
