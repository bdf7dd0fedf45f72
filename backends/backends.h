/* backends.h - opening a compute backend by name. server/ picks one per
 * worker; core/ only sees the cn_backend_ctx it is handed. */
#ifndef CANOPY_BACKENDS_H
#define CANOPY_BACKENDS_H

#include <stdbool.h>

#include "canopy_core.h"

typedef struct cn_backend_ctx cn_backend_ctx;

/* Opens a context of backend "cpu" or "cuda" (device: GPU ordinal). The
 * caller owns it and closes it with cn_backend_close. A backend that is
 * not built in, or has no device, is a clear error, never a crash. */
int cn_backend_open(const char *name, int device, cn_backend_ctx **out,
                    cn_err *err);
void cn_backend_close(cn_backend_ctx *bk);
/* Gives back the memory a context keeps for its next runs (cpu: spare run
 * arenas, up to 256 MiB); nothing for a backend that keeps none. */
void cn_backend_release(cn_backend_ctx *bk);
/* True when the context computes in device memory, asynchronously to the
 * host (cuda): the host can prepare a run while another computes. */
bool cn_backend_is_device(const cn_backend_ctx *bk);
/* Kernel launches issued on this context so far. */
long long cn_backend_kernels(const cn_backend_ctx *bk);
/* The context's counters so far (syncs, bytes each way, allocations,
 * launches; device_bytes: device memory it holds now). Zero on cpu. Read
 * it from the context's own thread, or accept a torn value. */
void cn_backend_get_counters(const cn_backend_ctx *bk,
                             cn_backend_counters *out);
/* Threads one product may use on the cpu backend (gemm.c). */
void cn_backend_cpu_threads(int n);

/* internal */
int cn__backend_cpu_open(cn_backend_ctx **out, cn_err *err);
/* The cuda module's probe for the tests (device allocations so far); -1
 * when the module is not loaded. */
long long cn__backend_cuda_device_allocs(const cn_backend_ctx *bk);

#endif
