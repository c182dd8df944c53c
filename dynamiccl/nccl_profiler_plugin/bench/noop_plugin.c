/* A no-op NCCL profiler plugin: the baseline for benchmarks/plugin_overhead.py.
   Returns success and a dummy non-NULL handle for every event (so NCCL, or the emulator,
   makes every child call), and requests the same mask as DynamICCL: DYNAMICCL_EVENT_MASK if set (decimal),
   else its default (Coll|P2p|KernelCh). */
#include <stdlib.h>

#include "nccl_profiler_abi.h"

#define NOOP_EXPORT __attribute__((visibility("default")))
#define NOOP_DEFAULT_MASK (ncclProfileColl | ncclProfileP2p | ncclProfileKernelCh)
#define NOOP_MASK noop_mask()

static int noop_mask(void) {
  const char* v = getenv("DYNAMICCL_EVENT_MASK");
  return v && *v ? atoi(v) : NOOP_DEFAULT_MASK;
}

static int dummy_ctx, dummy_event;

static ncclResult_t init_v4(void** ctx, int* mask, const char* n, uint64_t h, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  (void)n, (void)h, (void)nn, (void)nr, (void)r, (void)l;
  *ctx = &dummy_ctx;
  *mask = NOOP_MASK;
  return ncclSuccess;
}
static ncclResult_t init_v5(void** ctx, uint64_t id, int* mask, const char* n, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  (void)id, (void)n, (void)nn, (void)nr, (void)r, (void)l;
  *ctx = &dummy_ctx;
  *mask = NOOP_MASK;
  return ncclSuccess;
}
static ncclResult_t start_v4(void* ctx, void** h, ncclProfilerEventDescr_v4_t* d) {
  (void)ctx, (void)d;
  *h = &dummy_event;
  return ncclSuccess;
}
static ncclResult_t start_v5(void* ctx, void** h, ncclProfilerEventDescr_v5_t* d) {
  (void)ctx, (void)d;
  *h = &dummy_event;
  return ncclSuccess;
}
static ncclResult_t start_v6(void* ctx, void** h, ncclProfilerEventDescr_v6_t* d) {
  (void)ctx, (void)d;
  *h = &dummy_event;
  return ncclSuccess;
}
static ncclResult_t start_v7(void* ctx, void** h, ncclProfilerEventDescr_v7_t* d) {
  (void)ctx, (void)d;
  *h = &dummy_event;
  return ncclSuccess;
}
static ncclResult_t stop(void* h) {
  (void)h;
  return ncclSuccess;
}
static ncclResult_t record(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) {
  (void)h, (void)s, (void)a;
  return ncclSuccess;
}
static ncclResult_t fini(void* ctx) {
  (void)ctx;
  return ncclSuccess;
}

NOOP_EXPORT const ncclProfiler_v7_t ncclProfiler_v7 = {
    .name = "noop", .init = init_v5, .startEvent = start_v7, .stopEvent = stop, .recordEventState = record,
    .finalize = fini};
NOOP_EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {
    .name = "noop", .init = init_v5, .startEvent = start_v6, .stopEvent = stop, .recordEventState = record,
    .finalize = fini};
NOOP_EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {
    .name = "noop", .init = init_v5, .startEvent = start_v5, .stopEvent = stop, .recordEventState = record,
    .finalize = fini};
NOOP_EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {
    .name = "noop", .init = init_v4, .startEvent = start_v4, .stopEvent = stop, .recordEventState = record,
    .finalize = fini};
