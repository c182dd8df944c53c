/* DynamICCL profiler plugin: DYNAMICCL_PROFILER_CHAIN, forwarding every call to a second profiler
 * plugin (chain.h has the design). Loading, init and finalize run under the lifecycle lock; the
 * event paths use only the communicator's chain ring.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chain.h"

/* The chained library, loaded at the first init of a plugin lifetime (lifecycle lock). */
static struct {
  void* dl;
  const void* table;
  int abi;
  int tried; /* 1 once this lifetime looked at DYNAMICCL_PROFILER_CHAIN (a failure is logged once) */
} g_chain;

/* ------------------------------------------------------------------------------------------ */
/* The ring: one atomic add and a seqlock-stamped write per chained event                      */

static inline void* chain_put(dccl_ctx_t* ctx, void* ours, void* theirs) {
  dccl_chain_t* c = ctx->chain;
  uint64_t n = atomic_fetch_add_explicit(&c->cursor, 1, memory_order_relaxed);
  uint32_t i = (uint32_t)n & (DCCL_CHAIN_ENTRIES - 1);
  dccl_chain_entry_t* e = &c->ring[i];
  atomic_store_explicit(&e->stamp, DCCL_CHAIN_STAMP_WRITING, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&e->ours, (uintptr_t)ours, memory_order_relaxed);
  atomic_store_explicit(&e->theirs, (uintptr_t)theirs, memory_order_relaxed);
  atomic_store_explicit(&e->stamp, n & DCCL_CHAIN_STAMP_MASK, memory_order_release);
  return (void*)(uintptr_t)(DCCL_H_MAKE(0, 0, ctx->index, i, n >> DCCL_CHAIN_BITS) | DCCL_H_CHAIN_MARK);
}

/* Both handles of a chain handle, and its communicator; NULL when the entry was reused or the
   communicator is gone (counted: the event reaches neither plugin). */
static inline dccl_ctx_t* chain_get(uint64_t h, uintptr_t* ours, uintptr_t* theirs) {
  dccl_ctx_t* ctx = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
  uint32_t i = DCCL_H_SLOT(h);
  if (ctx == NULL || ctx->chain == NULL || i >= DCCL_CHAIN_ENTRIES) goto stale;
  const dccl_chain_entry_t* e = &ctx->chain->ring[i];
  uint64_t want = ((DCCL_H_GEN(h) << DCCL_CHAIN_BITS) | i) & DCCL_CHAIN_STAMP_MASK;
  uint64_t s1 = atomic_load_explicit(&e->stamp, memory_order_acquire);
  *ours = atomic_load_explicit(&e->ours, memory_order_relaxed);
  *theirs = atomic_load_explicit(&e->theirs, memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  if (s1 != want || atomic_load_explicit(&e->stamp, memory_order_relaxed) != s1) goto stale;
  return ctx;
stale:
  atomic_fetch_add_explicit(&dccl_g.chain_stale, 1, memory_order_relaxed);
  return NULL;
}

/* A child's parent: a chain handle splits into the two plugins' handles (a stale one into two
   NULLs, as NCCL passes after a dropped parent); anything else (NULL, a PXN parent from another
   process) goes to both unchanged. */
static inline void chain_parent(void* p, void** ours, void** theirs) {
  uint64_t h = (uint64_t)(uintptr_t)p;
  *ours = *theirs = p;
  if (!DCCL_H_IS_CHAIN(h)) return;
  uintptr_t o = 0, t = 0;
  if (chain_get(h, &o, &t) == NULL) o = t = 0;
  *ours = (void*)o;
  *theirs = (void*)t;
}

/* Our start with our parent, theirs with theirs. The descriptor is NCCL's per-call object, passed
   as non-const and used by nobody else during the call: its parentObj is swapped in place and
   restored before returning (a copy of the whole descriptor per start would cost more than the rest). */
#define DCCL_DEFINE_CHAIN_START(V)                                                                          \
  ncclResult_t dccl_start_v##V##_chain(dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d) { \
    void *parent = d->parentObj, *po, *pt, *ours = NULL, *theirs = NULL;                                     \
    chain_parent(parent, &po, &pt);                                                                         \
    d->parentObj = po;                                                                                      \
    dccl_start_v##V##_core(ctx, &ours, d);                                                                  \
    d->parentObj = pt;                                                                                      \
    const ncclProfiler_v##V##_t* t = ctx->chain->table;                                                     \
    t->startEvent(ctx->chain->ctx, &theirs, d);                                                             \
    d->parentObj = parent;                                                                                  \
    *eHandle = (ours || theirs) ? chain_put(ctx, ours, theirs) : NULL;                                      \
    return ncclSuccess;                                                                                     \
  }
DCCL_DEFINE_CHAIN_START(4)
DCCL_DEFINE_CHAIN_START(5)
DCCL_DEFINE_CHAIN_START(6)
DCCL_DEFINE_CHAIN_START(7)

ncclResult_t dccl_chain_stop(uint64_t h) {
  uintptr_t o, t;
  dccl_ctx_t* ctx = chain_get(h, &o, &t);
  if (ctx == NULL) return ncclSuccess;
  if (o) dccl_stop_core((void*)o);
  if (t) ctx->chain->stop((void*)t);
  return ncclSuccess;
}

ncclResult_t dccl_chain_record(uint64_t h, ncclProfilerEventState_t eState, ncclProfilerEventStateArgs_v4_t* args) {
  uintptr_t o, t;
  dccl_ctx_t* ctx = chain_get(h, &o, &t);
  if (ctx == NULL) return ncclSuccess;
  if (o) dccl_record_state_core((void*)o, eState, args);
  if (t) ctx->chain->record((void*)t, eState, args);
  return ncclSuccess;
}

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

void dccl_chain_attach(dccl_ctx_t* ctx, int abi, uint64_t commId, const char* commName, int nNodes, int nranks,
                       int rank, ncclDebugLogger_t logfn) {
  const char* path = getenv("DYNAMICCL_PROFILER_CHAIN");
  if (path == NULL || *path == '\0') return;
  const void* table = chain_load(path, abi);
  if (table == NULL) return;
  dccl_chain_t* c = aligned_alloc(64, (sizeof *c + 63) & ~(size_t)63);
  dccl_chain_entry_t* ring = malloc(sizeof(dccl_chain_entry_t) * DCCL_CHAIN_ENTRIES);
  if (c == NULL || ring == NULL) {
    DCCL_WARN("DynamICCL profiler: DYNAMICCL_PROFILER_CHAIN: out of memory; communicator not chained");
    free(c);
    free(ring);
    return;
  }
  memset(c, 0, sizeof *c);
  for (uint32_t i = 0; i < DCCL_CHAIN_ENTRIES; i++) atomic_init(&ring[i].stamp, DCCL_CHAIN_STAMP_WRITING);
  c->table = table;
  c->ring = ring;
  if (chain_init(c, abi, commId, commName, nNodes, nranks, rank, logfn) != 0) {
    DCCL_WARN("DynamICCL profiler: the chained profiler's init failed for comm %016llx; not chained",
              (unsigned long long)commId);
    free(ring);
    free(c);
    return;
  }
  ctx->chain = c;
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
  free(ctx->chain);
  ctx->chain = NULL;
}

/* At the last finalize: no communicator refers to the library any more. */
void dccl_chain_unload(void) {
  if (g_chain.dl) dlclose(g_chain.dl);
  memset(&g_chain, 0, sizeof g_chain);
}
