/* run_pool.h - an ordered pool of threads for `canopy run --jobs N`:
 * items go in in order, are worked on by any of N threads at once, and
 * come back out in the order they went in. */
#ifndef CANOPY_RUN_POOL_H
#define CANOPY_RUN_POOL_H

/* The work done on one item, by thread `thread` (0 .. threads - 1), so the
 * caller can keep per-thread state (a backend context) indexed by it. */
typedef void (*cn__pool_fn)(void *ctx, int thread, void *item);

typedef struct cn__pool cn__pool;

/* A pool of `threads` threads holding at most `depth` items between
 * submit and take. threads <= 1 starts no thread: submit does the work
 * itself, in the caller's thread (thread 0). NULL: no memory or no
 * thread could start. The pool owns no item.
 *
 * An item's work is fn, or with finish != NULL two halves: each thread
 * (the caller's, without threads) holds one started item and starts the
 * next before it finishes the held one, so the device computes one item
 * while the host prepares the next. A thread with no
 * next item at hand finishes what it holds at once. */
cn__pool *cn__pool_new(int threads, int depth, cn__pool_fn fn,
                       cn__pool_fn finish, void *ctx);
/* Items submitted and not yet taken back. */
int cn__pool_pending(const cn__pool *p);
/* Queues an item; the caller must first take one back if pending == depth
 * (returns -1 then, and queues nothing). */
int cn__pool_submit(cn__pool *p, void *item);
/* The oldest item not yet taken back, once its work is done (waits for
 * it); NULL when nothing is pending. */
void *cn__pool_take(cn__pool *p);
/* Stops and joins the threads. Items still pending are finished first;
 * the caller should have taken them back (to free them). */
void cn__pool_free(cn__pool *p);

#endif
