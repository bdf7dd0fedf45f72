/* backends.c - the backend registry. */
#include <cblas.h>
#include <string.h>

#include "backend.h"
#include "backends.h"

int cn_backend_open(const char *name, int device, cn_backend_ctx **out,
                    cn_err *err) {
  if (strcmp(name, "cpu") == 0) return cn__backend_cpu_open(out, err);
  if (strcmp(name, "cuda") == 0) {
#ifdef CANOPY_HAVE_CUDA
    return cn__backend_cuda_open(device, out, err);
#else
    return cn_err_set(err, CN_E_BACKEND,
                      "backend 'cuda' is not built in: reconfigure with "
                      "'meson setup -Dcuda=enabled' on a machine with the "
                      "CUDA toolkit");
#endif
  }
  return cn_err_set(err, CN_E_BAD_CONFIG,
                    "unknown backend '%s' (expected cpu or cuda)", name);
}

void cn_backend_close(cn_backend_ctx *bk) {
  if (bk != NULL) bk->vt->close(bk);
}

long long cn_backend_kernels(const cn_backend_ctx *bk) { return bk->kernels; }

void cn_backend_cpu_threads(int n) {
  if (n >= 1) openblas_set_num_threads(n);
}
