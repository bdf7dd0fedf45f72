/* log.h - leveled, structured (logfmt) logging to stderr.
 *
 * CN_LOG checks the level before anything is formatted (redis serverLog),
 * so a debug line costs one comparison when debug is off. Lines are
 * written with a single write(2) and may come from any thread. */
#ifndef CANOPY_SERVER_LOG_H
#define CANOPY_SERVER_LOG_H

#include <stddef.h>

typedef enum {
  CN_LOG_ERROR = 0,
  CN_LOG_WARN,
  CN_LOG_INFO,
  CN_LOG_DEBUG
} cn_log_level;

extern int cn__log_level;

/* "error" | "warn" | "info" | "debug" -> level; -1 if unknown. */
int cn__log_parse_level(const char *name);
/* fmt is the rest of a logfmt line: `msg=... key=value ...`. A `%s`
 * right after `=` is a value, quoted and escaped when it needs (a name, a
 * version, a path, an id, client text: pass it as it is); one right after
 * the format's own `"` is escaped; one anywhere else is a literal piece
 * of the line, copied as it is (log.c). */
void cn__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* in, for a logfmt value: backslash and double quote escaped, a control
 * character as \n, \r, \t or \xHH, a byte that is not UTF-8 as \xHH (a
 * name never splits a line). */
void cn__log_escape(char *out, size_t cap, const char *in);
/* The offset of the first byte of s that is not well-formed UTF-8 (RFC
 * 3629), or -1 when s is all UTF-8. */
long cn__utf8_bad_at(const char *s);

#define CN_LOG(level, ...)                              \
  do {                                                  \
    if ((level) <= cn__log_level) cn__log((level), __VA_ARGS__); \
  } while (0)

#endif
