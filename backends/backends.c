/* backends.c - the backend registry. The cpu backend is linked in; the
 * cuda backend is a shared module loaded on first use (dlopen), so a
 * process that computes on the CPU maps no CUDA library: start-up and
 * memory as in a build without CUDA. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "cpu/gemm.h"

#ifdef CANOPY_HAVE_CUDA
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static void *cuda_handle;
static char cuda_error[512];

/* Where the module is: $CANOPY_CUDA_MODULE, else the build tree's (a
 * build run in place), else the installed one. */
static void cuda_load(void) {
  const char *env = getenv("CANOPY_CUDA_MODULE");
  const char *paths[] = {env && env[0] ? env : NULL,
                         CANOPY_CUDA_MODULE_BUILD,
                         CANOPY_CUDA_MODULE_INSTALL};
  size_t n = 0;
  for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
    if (paths[i] == NULL) continue;
    cuda_handle = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (cuda_handle != NULL) return;
    const char *e = dlerror();
    n += (size_t)snprintf(cuda_error + n,
                          n < sizeof(cuda_error) ? sizeof(cuda_error) - n : 0,
                          "%s%s", n ? "; " : "", e ? e : paths[i]);
    if (n >= sizeof(cuda_error)) n = sizeof(cuda_error) - 1;
    if (env && env[0] && i == 0) return; /* an explicit path only */
  }
}

static void *cuda_sym(const char *name, cn_err *err) {
  pthread_once(&cuda_once, cuda_load);
  if (cuda_handle == NULL) {
    if (err != NULL)
      cn_err_set(err, CN_E_BACKEND, "backend 'cuda': cannot load the CUDA "
                 "module (%s); set CANOPY_CUDA_MODULE to its path, or use "
                 "backend cpu", cuda_error);
    return NULL;
  }
  void *f = dlsym(cuda_handle, name);
  if (f == NULL && err != NULL)
    cn_err_set(err, CN_E_BACKEND, "backend 'cuda': the module has no %s",
               name);
  return f;
}

long long cn__backend_cuda_device_allocs(const cn_backend_ctx *bk) {
  long long (*f)(const cn_backend_ctx *) =
      (long long (*)(const cn_backend_ctx *))cuda_sym(
          "cn__backend_cuda_device_allocs", NULL);
  return f != NULL ? f(bk) : -1;
}
#endif

int cn_backend_open(const char *name, int device, cn_backend_ctx **out,
                    cn_err *err) {
  if (strcmp(name, "cpu") == 0) return cn__backend_cpu_open(out, err);
  if (strcmp(name, "cuda") == 0) {
#ifdef CANOPY_HAVE_CUDA
    int (*open)(int, cn_backend_ctx **, cn_err *) =
        (int (*)(int, cn_backend_ctx **, cn_err *))cuda_sym(
            "cn__backend_cuda_open", err);
    if (open == NULL) return CN_E_BACKEND;
    return open(device, out, err);
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

void cn_backend_release(cn_backend_ctx *bk) {
  if (bk != NULL && bk->vt->release != NULL) bk->vt->release(bk);
}

long long cn_backend_kernels(const cn_backend_ctx *bk) { return bk->kernels; }

bool cn_backend_is_device(const cn_backend_ctx *bk) {
  return !bk->vt->host_memory;
}

void cn_backend_get_counters(const cn_backend_ctx *bk,
                             cn_backend_counters *out) {
  *out = bk->ctr;
}

void cn_backend_cpu_threads(int n) {
  if (n < 1) return;
  cn__gemm_set_threads(n);
}
