/* getCollInfo timing harness (benchmarks/tuner_getcollinfo.py loads it with ctypes).
 *
 * Calls a plugin's ncclTunerPlugin_v6.getCollInfo the way NCCL's ncclPrepareTasks does: a
 * freshly filled float[7][3] cost table per call (NCCL rebuilds it before every call), nChannels
 * starting at 0, nBytes cycling over the caller's sizes. The copy of the table is part of every
 * measured call, for the plugin and for the no-op baseline alike.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "nccl_tuner_abi.h"

#define EXPORT __attribute__((visibility("default")))

static char g_err[512];

EXPORT const char* dctb_error(void) { return g_err; }

static double now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Returns 0, the wall-clock and the thread-CPU ns per call (the latter excludes time this thread
   spent descheduled on a shared machine), or -1 (dctb_error()). *checksum depends on every decision. */
EXPORT int dctb_getcollinfo(const char* path, uint64_t comm, uint64_t calls, const uint64_t* sizes, int nsizes,
                            int func, double* ns_per_call, double* cpu_ns_per_call, uint64_t* checksum) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(g_err, sizeof g_err, "dlopen %s: %s", path, dlerror());
    return -1;
  }
  const ncclTuner_v6_t* t = (const ncclTuner_v6_t*)dlsym(h, "ncclTunerPlugin_v6");
  if (t == NULL) {
    snprintf(g_err, sizeof g_err, "%s does not export ncclTunerPlugin_v6", path);
    dlclose(h);
    return -1;
  }
  void* ctx = NULL;
  if (t->init(&ctx, comm, 16, 2, NULL, NULL, NULL) != ncclSuccess) {
    snprintf(g_err, sizeof g_err, "init failed");
    dlclose(h);
    return -1;
  }
  float base[21];
  for (int i = 0; i < 21; i++) base[i] = 10.0f + (float)((i * 7) % 21);
  base[6 * 3 + 0] = base[6 * 3 + 1] = -1.0f; /* some disabled cells, as NCCL leaves them */
  float table[21];
  uint64_t sum = 0;
  uint64_t warm = calls / 10 + 1000;
  double t0 = 0, c0 = 0;
  for (uint64_t i = 0; i < warm + calls; i++) {
    if (i == warm) {
      t0 = now_ns(CLOCK_MONOTONIC);
      c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    }
    memcpy(table, base, sizeof table);
    int nch = 0;
    t->getCollInfo(ctx, (ncclFunc_t)func, (size_t)sizes[i % (uint64_t)nsizes], 1, (float**)table, 7, 3, 0, &nch);
    sum += (uint64_t)nch + (table[3] == 0.0f) + 2u * (table[5] == 0.0f);
  }
  double t1 = now_ns(CLOCK_MONOTONIC), c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
  t->finalize(ctx);
  dlclose(h);
  *ns_per_call = (t1 - t0) / (double)calls;
  *cpu_ns_per_call = (c1 - c0) / (double)calls;
  *checksum = sum;
  return 0;
}
