/* logfmt_test_util.h - a reference reader of logfmt lines (go-logfmt's
 * grammar), written apart from the daemon's formatter (server/log.c), for
 * the tests that check its lines. */
#ifndef CANOPY_TEST_LOGFMT_UTIL_H
#define CANOPY_TEST_LOGFMT_UTIL_H

/* The key=value pairs of one line, or -1 if it is not logfmt; *n_msg and
 * *n_level count the keys msg and level. */
int tu_logfmt_pairs(const char *line, int *n_msg, int *n_level);

#endif
