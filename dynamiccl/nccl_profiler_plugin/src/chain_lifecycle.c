/* DynamICCL profiler plugin: DYNAMICCL_PROFILER_CHAIN's lifecycle (chain.h has the design): loading
 * the chained library, its init and finalize per communicator, and the state they allocate. All of
 * it runs under the lifecycle lock; nothing here is on NCCL's event paths.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chain.h"
#include "kch.h"

/* The chained library, loaded at the first init of a plugin lifetime (lifecycle lock). */
static struct {
  void* dl;
  const void* table;
  int abi;
  int tried; /* 1 once this lifetime looked at DYNAMICCL_PROFILER_CHAIN (a failure is logged once) */
} g_chain;

/* Its stop and state for the handles it gave out alone (chain.c: chain_handle), the same for every
   communicator. Set at load; the library stays mapped for the process (dccl_chain_unload), so a
   late event forwarded while the last finalize runs still finds its code. */
_Atomic(dccl_chain_stop_fn) dccl_chain_raw_stop;
_Atomic(dccl_chain_record_fn) dccl_chain_raw_record;

/* ------------------------------------------------------------------------------------------ */
/* Lifecycle (lifecycle lock)                                                                  */

/* The chained library's table of NCCL's version `abi`, or NULL (logged). Refuses our own library:
   it would forward to itself forever. */
static const void* chain_load(const char* path, int abi) {
  if (g_chain.tried) return g_chain.abi == abi ? g_chain.table : NULL;
  g_chain.tried = 1;
  char sym[32];
  snprintf(sym, sizeof sym, "ncclProfiler_v%d", abi); /* the version NCCL loaded us with */
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const void* table = dl ? dlsym(dl, sym) : NULL;
  if (dl == NULL) {
    DCCL_WARN("DynamICCL profiler: DYNAMICCL_PROFILER_CHAIN: cannot load %s: %s; not chained", path, dlerror());
    return NULL;
  }
  Dl_info mine, theirs;
  int self = table && dladdr((void*)&chain_load, &mine) && dladdr(table, &theirs) && mine.dli_fbase == theirs.dli_fbase;
  if (table == NULL || self) {
    DCCL_WARN("DynamICCL profiler: DYNAMICCL_PROFILER_CHAIN: %s %s; not chained", path,
              self ? "is this plugin" : "does not export the profiler ABI NCCL loaded this plugin with");
    dlclose(dl);
    return NULL;
  }
  g_chain.dl = dl;
  g_chain.table = table;
  g_chain.abi = abi;
  const ncclProfiler_v5_t* t5 = table; /* stop and state sit at the same place in every version */
  atomic_store_explicit(&dccl_chain_raw_stop, t5->stopEvent, memory_order_relaxed);
  atomic_store_explicit(&dccl_chain_raw_record, (dccl_chain_record_fn)t5->recordEventState, memory_order_relaxed);
  DCCL_INFO("DynamICCL profiler: chained to %s (%s, v%d)", path, *(const char* const*)table, abi);
  return table;
}

/* The chained plugin's init for this communicator; 0 and its context in c->ctx on success. */
static int chain_init(dccl_chain_t* c, int abi, uint64_t commId, const char* commName, int nNodes, int nranks,
                      int rank, ncclDebugLogger_t logfn) {
  ncclResult_t r;
  if (abi == 4) {
    const ncclProfiler_v4_t* t = c->table;
    c->stop = t->stopEvent;
    c->record = t->recordEventState;
    r = t->init(&c->ctx, &c->mask, commName, commId, nNodes, nranks, rank, logfn);
  } else { /* v5, v6 and v7 tables share their layout up to the descriptor types */
    const ncclProfiler_v5_t* t = c->table;
    c->stop = t->stopEvent;
    c->record = (dccl_chain_record_fn)t->recordEventState;
    r = t->init(&c->ctx, commId, &c->mask, commName, nNodes, nranks, rank, logfn);
  }
  return r == ncclSuccess && c->ctx != NULL ? 0 : -1;
}

uint64_t dccl_chain_types(int mask) {
  const uint64_t m = (uint32_t)mask;
  const uint64_t kch = ncclProfileKernelCh | ncclProfileKernelPhase; /* a KernelPhase's parent is its KernelCh */
  const uint64_t step = ncclProfileProxyStep | ncclProfileNetPlugin; /* a NetPlugin's parent is its ProxyStep */
  const uint64_t op = ncclProfileProxyOp | step;
  const uint64_t task = kch | op; /* a Coll/P2p's children */
  const uint64_t ce = ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch;
  if (m == 0) return 0;
  uint64_t t = m | ncclProfileGroup | ncclProfileGroupApi; /* asked for (unknown bits too); groups: any bit */
  if (m & (ncclProfileCollApi | ncclProfileColl | task | ce)) t |= ncclProfileCollApi;
  if (m & (ncclProfileP2pApi | ncclProfileP2p | task)) t |= ncclProfileP2pApi;
  if (m & (ncclProfileColl | task)) t |= ncclProfileColl;
  if (m & (ncclProfileP2p | task)) t |= ncclProfileP2p;
  if (m & ce) t |= ce;
  if (m & kch) t |= ncclProfileKernelCh;
  if (m & op) t |= ncclProfileProxyOp;
  if (m & step) t |= ncclProfileProxyStep;
  return t;
}

void dccl_chain_attach(dccl_ctx_t* ctx, int abi, uint64_t commId, const char* commName, int nNodes, int nranks,
                       int rank, ncclDebugLogger_t logfn) {
  const char* path = getenv("DYNAMICCL_PROFILER_CHAIN");
  if (path == NULL || *path == '\0') return;
  const void* table = chain_load(path, abi);
  if (table == NULL) return;
  dccl_chain_t* c = aligned_alloc(64, (sizeof *c + 63) & ~(size_t)63);
  dccl_chain_entry_t* ring = malloc(sizeof(dccl_chain_entry_t) * DCCL_CHAIN_ENTRIES);
  _Atomic uintptr_t* op = calloc(ctx->pool_size, sizeof *op);
  /* Line-aligned: a slot's first 8 channels share one cache line (calloc's 16-byte alignment split them
     over two, and the table is cold where each operation's KernelCh starts touch it). */
  size_t kch_bytes = (size_t)ctx->pool_size * DCCL_MAX_CHANNELS * sizeof(uintptr_t);
  _Atomic uintptr_t* kch = aligned_alloc(64, kch_bytes);
  if (kch != NULL) memset((void*)kch, 0, kch_bytes);
  if (c == NULL || ring == NULL || op == NULL || kch == NULL) {
    DCCL_WARN("DynamICCL profiler: DYNAMICCL_PROFILER_CHAIN: out of memory; communicator not chained");
    free(c);
    free(ring);
    free(op);
    free(kch);
    return;
  }
  memset(c, 0, sizeof *c);
  for (uint32_t i = 0; i < DCCL_CHAIN_ENTRIES; i++) atomic_init(&ring[i].stamp, DCCL_CHAIN_STAMP_WRITING);
  c->table = table;
  c->ring = ring;
  c->op = op;
  c->kch = kch;
  if (chain_init(c, abi, commId, commName, nNodes, nranks, rank, logfn) != 0) {
    DCCL_WARN("DynamICCL profiler: the chained profiler's init failed for comm %016llx; not chained",
              (unsigned long long)commId);
    free(ring);
    free(op);
    free(kch);
    free(c);
    return;
  }
  ctx->chain = c;
  ctx->chain_types = dccl_chain_types(c->mask);
  ctx->chain_kch_type = ctx->chain_types & ncclProfileKernelCh;
  ctx->chain_dummy_types = ctx->chain_types & DCCL_DUMMY_TYPES;
  ctx->chain_op_types = ctx->chain_types & (ncclProfileColl | ncclProfileP2p);
  ctx->chain_kch = kch;
  ctx->chain_op = op;
  ctx->chain_op_key = DCCL_H_KEPT_OP_KEY(ctx->index);
  ctx->chain_ctx = c->ctx;
  /* startEvent sits at the same place in every version's table (its descriptor type differs) */
  ctx->chain_start = abi == 4 ? (void (*)(void))((const ncclProfiler_v4_t*)table)->startEvent
                              : (void (*)(void))((const ncclProfiler_v5_t*)table)->startEvent;
  ctx->chain_stop = c->stop;
  ctx->chain_record = c->record;
}

/* After the context left the handle table (no event reaches either plugin any more): the chained
   plugin's finalize for this communicator. */
void dccl_chain_detach(dccl_ctx_t* ctx) {
  if (ctx->chain == NULL) return;
  ncclResult_t (*fin)(void*) = g_chain.abi == 4 ? ((const ncclProfiler_v4_t*)ctx->chain->table)->finalize
                                                : ((const ncclProfiler_v5_t*)ctx->chain->table)->finalize;
  fin(ctx->chain->ctx);
}

void dccl_chain_free(dccl_ctx_t* ctx) {
  if (ctx->chain == NULL) return;
  free(ctx->chain->ring);
  free((void*)ctx->chain->op);
  free((void*)ctx->chain->kch);
  free(ctx->chain);
  ctx->chain = NULL;
  ctx->chain_types = ctx->chain_kch_type = ctx->chain_dummy_types = ctx->chain_op_types = 0;
  ctx->chain_kch = ctx->chain_op = NULL;
  ctx->chain_op_key = 0;
  ctx->chain_start = NULL;
  ctx->chain_ctx = NULL;
  ctx->chain_stop = NULL;
  ctx->chain_record = NULL;
}

/* At the last finalize: no communicator refers to the library any more. It is not unloaded: a
   stop of one of its own handles (chain_handle) needs no communicator of ours to be forwarded, so
   one racing this finalize must still find its code (a later lifetime's dlopen of the same path
   gets the same mapping). */
void dccl_chain_unload(void) { memset(&g_chain, 0, sizeof g_chain); }
