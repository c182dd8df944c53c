/* Floors for the benchmark's goals: the least any profiler doing the same job could add, measured on the
 * emulator beside the no-op (bench/noop_plugin.c) and ours in the same interleaved runs.
 *
 * Built twice (Makefile):
 *  - FLOOR_FWD (test/build/libnccl-profiler-fwd.so): every call made to FLOOR_FIRST's plugin, then to
 *    FLOOR_SECOND's (optional; both dlopen'ed at the first init, their tables for the ABI NCCL loaded this one
 *    with), with no handle translation: NCCL gets the first's handles and the second is given them too, so
 *    the second must ignore its handles (the no-op does). A chain with no bookkeeping at all:
 *    fwd(ours, noop) - fwd(ours) is what the chained no-op's own 31 calls per collective cost beside ours,
 *    the floor under DYNAMICCL_PROFILER_CHAIN's goal (chain_added_ns: ours chained against ours alone).
 *  - FLOOR_CLOCK (test/build/libnccl-profiler-noop-clock.so): the no-op plus the two
 *    clock_gettime(CLOCK_REALTIME) reads a record needs (enqueue at the Coll/P2p start, completion at
 *    its stop), so noop-clock - noop is the default record clock's share of ours.
 * Not a plugin to install: no checks beyond what the benchmark needs (a missing FLOOR_FIRST fails init).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nccl_profiler_abi.h"

#define FLOOR_EXPORT __attribute__((visibility("default")))

#if defined(FLOOR_FWD)
/* FLOOR_FIRST's and FLOOR_SECOND's tables for each version (the first init loads them). */
typedef struct {
  void* ctx[2];
} floor_ctx_t;
static const void* tabs[8][2];

static const void* child_table(const char* env, const char* sym) {
  const char* path = getenv(env);
  void* lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  const void* t = lib ? dlsym(lib, sym) : NULL;
  if (t == NULL && path && *path) fprintf(stderr, "floor_plugin: %s=%s has no %s\n", env, path, sym);
  return t;
}

/* Both plugins' init through `call` (a version's init, its arguments bound); the first is required. */
#define FLOOR_INIT_BOTH(V, T, CALL)                                                                         \
  do {                                                                                                      \
    if (tabs[V][0] == NULL) {                                                                               \
      tabs[V][0] = child_table("FLOOR_FIRST", "ncclProfiler_v" #V);                                        \
      tabs[V][1] = child_table("FLOOR_SECOND", "ncclProfiler_v" #V);                                       \
    }                                                                                                       \
    if (tabs[V][0] == NULL) return ncclInternalError;                                                       \
    floor_ctx_t* fc = calloc(1, sizeof *fc);                                                                \
    if (fc == NULL) return ncclInternalError;                                                               \
    int m2 = 0;                                                                                             \
    ncclResult_t rc = ((const T*)tabs[V][0])->CALL(&fc->ctx[0], mask);                                      \
    if (tabs[V][1]) ((const T*)tabs[V][1])->CALL(&fc->ctx[1], &m2);                                         \
    *mask |= m2;                                                                                            \
    *ctx = fc;                                                                                              \
    return rc;                                                                                              \
  } while (0)

#define init4(C, M) init(C, M, n, h, nn, nr, r, l)
#define init5(C, M) init(C, id, M, n, nn, nr, r, l)
static ncclResult_t init_v4(void** ctx, int* mask, const char* n, uint64_t h, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  FLOOR_INIT_BOTH(4, ncclProfiler_v4_t, init4);
}
#define FLOOR_FWD_VERSION(V)                                                                                \
  static ncclResult_t init_v##V(void** ctx, uint64_t id, int* mask, const char* n, int nn, int nr, int r,  \
                                ncclDebugLogger_t l) {                                                      \
    FLOOR_INIT_BOTH(V, ncclProfiler_v##V##_t, init5);                                                       \
  }
FLOOR_FWD_VERSION(5)
FLOOR_FWD_VERSION(6)
FLOOR_FWD_VERSION(7)

/* NCCL's handle is the first plugin's; the second gets the same arguments, its handle discarded and
   the first's handles given to it, so FLOOR_SECOND must be a plugin that ignores handles (the no-op). */
#define FLOOR_FWD_CALLS(V)                                                                                 \
  static ncclResult_t start_v##V(void* ctx, void** h, ncclProfilerEventDescr_v##V##_t* d) {               \
    floor_ctx_t* fc = ctx;                                                                                 \
    ncclResult_t rc = ((const ncclProfiler_v##V##_t*)tabs[V][0])->startEvent(fc->ctx[0], h, d);            \
    if (tabs[V][1]) {                                                                                      \
      void* scratch = NULL;                                                                                \
      ((const ncclProfiler_v##V##_t*)tabs[V][1])->startEvent(fc->ctx[1], &scratch, d);                     \
    }                                                                                                      \
    return rc;                                                                                             \
  }                                                                                                        \
  static ncclResult_t stop_v##V(void* h) {                                                                 \
    ncclResult_t rc = ((const ncclProfiler_v##V##_t*)tabs[V][0])->stopEvent(h);                            \
    if (tabs[V][1]) ((const ncclProfiler_v##V##_t*)tabs[V][1])->stopEvent(h);                              \
    return rc;                                                                                             \
  }                                                                                                        \
  static ncclResult_t record_v##V(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) { \
    ncclResult_t rc = ((const ncclProfiler_v##V##_t*)tabs[V][0])->recordEventState(h, s, a);               \
    if (tabs[V][1]) ((const ncclProfiler_v##V##_t*)tabs[V][1])->recordEventState(h, s, a);                 \
    return rc;                                                                                             \
  }                                                                                                        \
  static ncclResult_t fini_v##V(void* ctx) {                                                               \
    floor_ctx_t* fc = ctx;                                                                                 \
    ncclResult_t rc = ((const ncclProfiler_v##V##_t*)tabs[V][0])->finalize(fc->ctx[0]);                    \
    if (tabs[V][1]) ((const ncclProfiler_v##V##_t*)tabs[V][1])->finalize(fc->ctx[1]);                      \
    free(fc);                                                                                              \
    return rc;                                                                                             \
  }
FLOOR_FWD_CALLS(4)
FLOOR_FWD_CALLS(5)
FLOOR_FWD_CALLS(6)
FLOOR_FWD_CALLS(7)

#elif defined(FLOOR_CLOCK)
/* the no-op's mask (bench/noop_plugin.c): DYNAMICCL_EVENT_MASK, else Coll|P2p|KernelCh */
static int floor_mask(void) {
  const char* v = getenv("DYNAMICCL_EVENT_MASK");
  return v && *v ? atoi(v) : (ncclProfileColl | ncclProfileP2p | ncclProfileKernelCh);
}
static int dummy_ctx, dummy_event, dummy_op;
volatile uint64_t floor_clock_sink; /* the reads are kept */

static inline void floor_read(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  floor_clock_sink = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static ncclResult_t init_v4(void** ctx, int* mask, const char* n, uint64_t h, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  (void)n, (void)h, (void)nn, (void)nr, (void)r, (void)l;
  *ctx = &dummy_ctx;
  *mask = floor_mask();
  return ncclSuccess;
}
#define FLOOR_CLOCK_VERSION(V)                                                                              \
  static ncclResult_t init_v##V(void** ctx, uint64_t id, int* mask, const char* n, int nn, int nr, int r,  \
                                ncclDebugLogger_t l) {                                                      \
    (void)id;                                                                                               \
    return init_v4(ctx, mask, n, 0, nn, nr, r, l);                                                          \
  }
FLOOR_CLOCK_VERSION(5)
FLOOR_CLOCK_VERSION(6)
FLOOR_CLOCK_VERSION(7)

/* A Coll/P2p gets its own dummy, so its stop (the completion) is told from the others. */
#define FLOOR_CLOCK_CALLS(V)                                                                               \
  static ncclResult_t start_v##V(void* ctx, void** h, ncclProfilerEventDescr_v##V##_t* d) {               \
    (void)ctx;                                                                                             \
    int op = (uint64_t)d->type == ncclProfileColl || (uint64_t)d->type == ncclProfileP2p;                  \
    if (op) floor_read();                                                                                  \
    *h = op ? &dummy_op : &dummy_event;                                                                    \
    return ncclSuccess;                                                                                    \
  }                                                                                                        \
  static ncclResult_t stop_v##V(void* h) {                                                                 \
    if (h == &dummy_op) floor_read();                                                                      \
    return ncclSuccess;                                                                                    \
  }                                                                                                        \
  static ncclResult_t record_v##V(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) { \
    (void)h, (void)s, (void)a;                                                                             \
    return ncclSuccess;                                                                                    \
  }                                                                                                        \
  static ncclResult_t fini_v##V(void* ctx) {                                                               \
    (void)ctx;                                                                                             \
    return ncclSuccess;                                                                                    \
  }
FLOOR_CLOCK_CALLS(4)
FLOOR_CLOCK_CALLS(5)
FLOOR_CLOCK_CALLS(6)
FLOOR_CLOCK_CALLS(7)

#else
#error "build with -DFLOOR_FWD or -DFLOOR_CLOCK"
#endif

#define FLOOR_TABLE(V, INIT)                                                                                \
  FLOOR_EXPORT const ncclProfiler_v##V##_t ncclProfiler_v##V = {                                           \
      .name = "floor", .init = INIT, .startEvent = start_v##V, .stopEvent = stop_v##V,                     \
      .recordEventState = record_v##V, .finalize = fini_v##V};
FLOOR_TABLE(7, init_v7)
FLOOR_TABLE(6, init_v6)
FLOOR_TABLE(5, init_v5)
FLOOR_TABLE(4, init_v4)
