/* devsim.h - a simulated device for the CPU tests, so the device path is
 * tested without a GPU: the cpu
 * backend's kernels behind a vtable with host_memory = false, so core
 * takes the path it takes on a GPU. Its memory is its own (malloc'd
 * blocks from a size-class pool, weights copied in), which core may only
 * reach through the backend's copies and fetch_rows; it counts what the
 * cuda backend counts (base.ctr): host waits, bytes each way, pool misses
 * and weight copies as allocations, and launches as the cuda backend
 * issues them (one kernel per compute call, a product with a bias one). */
#ifndef CANOPY_TEST_DEVSIM_H
#define CANOPY_TEST_DEVSIM_H

#include "backend.h"

/* A fresh simulated device (close it with cn_backend_close). */
cn_backend_ctx *devsim_open(void);
/* Of its counters: the argmax rows it sent to the host (the decoder's
 * control flow, not an answer) and the argmax calls (each a wait). */
long long devsim_argmax_bytes(const cn_backend_ctx *bk);
long long devsim_argmax_calls(const cn_backend_ctx *bk);
/* Uploads of index words made (copies), so far. */
long long devsim_uploads(const cn_backend_ctx *bk);
/* Of those, gemm_batched's pointer arrays staged on their own because an
 * operand was the identity (NULL), which the cuda backend replaces by a
 * device identity matrix in a copy of the arrays. */
long long devsim_rebuilds(const cn_backend_ctx *bk);

#endif
