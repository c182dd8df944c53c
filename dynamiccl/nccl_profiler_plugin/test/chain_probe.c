/* A profiler plugin that checks what it is given, for the DYNAMICCL_PROFILER_CHAIN tests: run as
 * NCCL's (the emulator's) only profiler and chained behind DynamICCL, it must count the same
 * events, and chained it must only ever see its own handles. Handles point into a static pool;
 * a stop or state for anything else, a parent that is not one of its handles, a KernelCh whose
 * parent is not a Coll/P2p of its own, or a second stop, is counted. The totals are printed at the
 * last finalize:
 *   chain_probe: starts=N stops=N states=N kch=N kch_parent_ok=N bad_handles=N foreign_parents=N double_stops=N
 * CHAIN_PROBE_MASK (decimal) is the activation mask it asks for (default Coll|P2p|KernelCh).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "nccl_profiler_abi.h"

#define PROBE_EXPORT __attribute__((visibility("default")))
#define POOL (1u << 20)

typedef struct {
  uint8_t type; /* log2 of the event type bit */
  _Atomic uint8_t stopped;
} probe_ev_t;

static probe_ev_t g_pool[POOL];
static _Atomic uint32_t g_next;
static _Atomic int g_refs;
static _Atomic uint64_t g_starts, g_stops, g_states, g_kch, g_kch_parent_ok, g_bad, g_foreign, g_double;
static int g_ctx;

static probe_ev_t* own(void* h) {
  probe_ev_t* e = h;
  return (e >= g_pool && e < g_pool + POOL) ? e : NULL;
}

static ncclResult_t probe_start(uint64_t type, void* parent, void** eHandle) {
  atomic_fetch_add(&g_starts, 1);
  probe_ev_t* p = own(parent);
  if (parent != NULL && p == NULL && type != ncclProfileProxyOp) atomic_fetch_add(&g_foreign, 1);
  if (type == ncclProfileKernelCh) {
    atomic_fetch_add(&g_kch, 1);
    if (p && (p->type == __builtin_ctzll(ncclProfileColl) || p->type == __builtin_ctzll(ncclProfileP2p)))
      atomic_fetch_add(&g_kch_parent_ok, 1);
  }
  probe_ev_t* e = &g_pool[atomic_fetch_add(&g_next, 1) % POOL];
  e->type = (uint8_t)__builtin_ctzll(type ? type : 1);
  atomic_store(&e->stopped, 0);
  *eHandle = e;
  return ncclSuccess;
}

#define PROBE_START(V)                                                                             \
  static ncclResult_t start_v##V(void* ctx, void** h, ncclProfilerEventDescr_v##V##_t* d) {       \
    (void)ctx;                                                                                     \
    return probe_start((uint64_t)d->type, d->parentObj, h);                                        \
  }
PROBE_START(4)
PROBE_START(5)
PROBE_START(6)
PROBE_START(7)

static ncclResult_t stop(void* h) {
  probe_ev_t* e = own(h);
  atomic_fetch_add(&g_stops, 1);
  if (e == NULL) atomic_fetch_add(&g_bad, 1);
  else if (atomic_exchange(&e->stopped, 1)) atomic_fetch_add(&g_double, 1);
  return ncclSuccess;
}

static ncclResult_t record(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) {
  (void)s, (void)a;
  atomic_fetch_add(&g_states, 1);
  if (own(h) == NULL) atomic_fetch_add(&g_bad, 1);
  return ncclSuccess;
}

/* For the unit tests (dlopen RTLD_NOLOAD): stops and states received so far. */
PROBE_EXPORT uint64_t chain_probe_calls(void) { return atomic_load(&g_stops) + atomic_load(&g_states); }

static int mask(void) {
  const char* v = getenv("CHAIN_PROBE_MASK");
  return v && *v ? atoi(v) : (ncclProfileColl | ncclProfileP2p | ncclProfileKernelCh);
}

static ncclResult_t init_v4(void** ctx, int* m, const char* n, uint64_t h, int nn, int nr, int r, ncclDebugLogger_t l) {
  (void)n, (void)h, (void)nn, (void)nr, (void)r, (void)l;
  atomic_fetch_add(&g_refs, 1);
  *ctx = &g_ctx;
  *m = mask();
  return ncclSuccess;
}

static ncclResult_t init_v5(void** ctx, uint64_t id, int* m, const char* n, int nn, int nr, int r, ncclDebugLogger_t l) {
  return init_v4(ctx, m, n, id, nn, nr, r, l);
}

static ncclResult_t fini(void* ctx) {
  if (ctx != &g_ctx) atomic_fetch_add(&g_bad, 1);
  if (atomic_fetch_sub(&g_refs, 1) != 1) return ncclSuccess;
  printf("chain_probe: starts=%llu stops=%llu states=%llu kch=%llu kch_parent_ok=%llu bad_handles=%llu "
         "foreign_parents=%llu double_stops=%llu\n",
         (unsigned long long)g_starts, (unsigned long long)g_stops, (unsigned long long)g_states,
         (unsigned long long)g_kch, (unsigned long long)g_kch_parent_ok, (unsigned long long)g_bad,
         (unsigned long long)g_foreign, (unsigned long long)g_double);
  fflush(stdout);
  return ncclSuccess;
}

#define PROBE_TABLE(V, INIT)                                                                                \
  PROBE_EXPORT const ncclProfiler_v##V##_t ncclProfiler_v##V = {                                           \
      .name = "chain_probe", .init = INIT, .startEvent = start_v##V, .stopEvent = stop,                     \
      .recordEventState = record, .finalize = fini};
PROBE_TABLE(7, init_v5)
PROBE_TABLE(6, init_v5)
PROBE_TABLE(5, init_v5)
PROBE_TABLE(4, init_v4)
