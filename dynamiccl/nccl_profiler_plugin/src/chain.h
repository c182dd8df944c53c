/* DynamICCL profiler plugin: forwarding to a second profiler plugin (DYNAMICCL_PROFILER_CHAIN=/path/lib.so).
 *
 * NCCL loads one profiler. With a chain, every call it makes to ours of an event type NCCL would give
 * the chained plugin alone (dccl_chain_types) is also made to the chained plugin (loaded at the first
 * init, same ABI version as NCCL loaded ours with), which keeps its own
 * context per communicator and its own event handles; a child's parentObj is translated, so each
 * plugin only ever sees its own handles. No allocation or lock on NCCL's threads.
 *
 * Where the chained plugin's handle is kept:
 *  - Coll/P2p and KernelCh events we track (26 of an eager AllReduce's 31 calls at 8 channels): in
 *    the chain's table beside our slot (op[slot], kch[slot][channel]), written after our start
 *    stamped the slot's (ctl) or channel entry's (gen) generation: on the frequent paths by the
 *    chained plugin's own startEvent, given the entry as its eHandle (zeroed first, after a release
 *    fence that orders our stamp before it), so its handle is never copied. NCCL gets our own handle
 *    with DCCL_H_CHAINED set. A later call reads the kept handle, then the stamp (acquire on the
 *    read orders it), and forwards only while the stamp still names the handle's generation: the
 *    stamps outlive our completion (a child arriving after our record was emitted still finds its
 *    parent) until the slot's next operation, and a handle of an earlier occupant never reaches the
 *    chained plugin (counted in chain_stale). A KernelCh's stop is forwarded at its KernelChStop
 *    state, which NCCL always calls right before it on the same thread (profiler.cc), so each
 *    channel's handle is decoded and checked once. A KernelCh start and its KernelChStop state take
 *    a path for the usual case (the operation live, the channel in range and new) with fewer tests
 *    and register saves; any other case goes to the general path, which decides afresh (nothing was
 *    written before it): chain.c dccl_start_vV_chain_kch, chain_kept.c dccl_chain_kch_record.
 *  - every other event (API events, KernelPhase, proxy events, and events we did not record): an
 *    entry of the communicator's chain ring holding both handles (ours, theirs), written with one
 *    atomic add and a seqlock stamp. An entry is reused after DCCL_CHAIN_ENTRIES later ring events
 *    of its communicator; a handle that old decodes to nothing (counted in chain_stale), as a stop
 *    after its communicator's finalize does. An event only one plugin answered needs no entry: the
 *    other plugin's handle is returned alone.
 */
#ifndef DYNAMICCL_CHAIN_H_
#define DYNAMICCL_CHAIN_H_

#include "internal.h"

#define DCCL_CHAIN_BITS 15
#define DCCL_CHAIN_ENTRIES (1u << DCCL_CHAIN_BITS)
#define DCCL_CHAIN_STAMP_MASK ((DCCL_H_GEN_MASK << DCCL_CHAIN_BITS) | (DCCL_CHAIN_ENTRIES - 1))
#define DCCL_CHAIN_STAMP_WRITING (1ull << 63)

typedef struct dccl_chain_entry {
  _Atomic uint64_t stamp; /* the ring cursor that wrote it (masked), DCCL_CHAIN_STAMP_WRITING while written */
  _Atomic uintptr_t ours;
  _Atomic uintptr_t theirs;
} dccl_chain_entry_t;

typedef ncclResult_t (*dccl_chain_stop_fn)(void* eHandle);
typedef ncclResult_t (*dccl_chain_record_fn)(void* eHandle, ncclProfilerEventState_t eState,
                                             ncclProfilerEventStateArgs_v4_t* args);

typedef struct dccl_chain {
  const void* table;             /* the chained plugin's ncclProfiler_v<abi>_t */
  void* ctx;                     /* its context for this communicator */
  dccl_chain_stop_fn stop;
  dccl_chain_record_fn record;
  int mask;                      /* the events it asked for at its init */
  _Atomic uintptr_t* op;         /* [pool_size]: its handle of the Coll/P2p in our slot */
  _Atomic uintptr_t* kch;        /* [pool_size * DCCL_MAX_CHANNELS]: its KernelCh handles */
  dccl_chain_entry_t* ring;      /* [DCCL_CHAIN_ENTRIES] */
  _Atomic uint64_t cursor __attribute__((aligned(64)));
} dccl_chain_t;

/* The event types NCCL emits to a profiler loaded alone whose init asked for `mask`: those it asked
   for and every ancestor of them (NCCL starts a parent whenever a child type is asked for: profiler.cc;
   nccl-plugin-abi.md 1.3), where unsure more rather than fewer. Only these are forwarded to the
   chained plugin (ctx->chain_types, chosen at its init), so it gets what it gets alone, not the events
   only our mask asked for (KernelPhase, proxy events, KernelCh for a Coll-only plugin). */
uint64_t dccl_chain_types(int mask);

/* lifecycle (lifecycle lock held): attach at init (after the context exists; nothing on failure
   but a warning), detach at finalize (calls the chained finalize), free with the context, unload
   at the last finalize. */
void dccl_chain_attach(dccl_ctx_t* ctx, int abi, uint64_t commId, const char* commName, int nNodes, int nranks,
                       int rank, ncclDebugLogger_t logfn);
void dccl_chain_detach(dccl_ctx_t* ctx);
void dccl_chain_free(dccl_ctx_t* ctx);
void dccl_chain_unload(void);

/* the chained plugin's stop and state for its own handles (chain_lifecycle.c sets them at load) */
extern _Atomic(dccl_chain_stop_fn) dccl_chain_raw_stop;
extern _Atomic(dccl_chain_record_fn) dccl_chain_raw_record;

/* The bits of a handle that say it is a kept (chained) Coll/P2p handle of communicator `index`: route and
   communicator index, compared in one test (ctx->chain_op_key, set at attach). */
#define DCCL_H_KEPT_OP_MASK (3u | DCCL_H_CHAINED | ((DCCL_MAX_CTX - 1) << 8))
#define DCCL_H_KEPT_OP_KEY(index) (DCCL_H_TAG_SLOT | DCCL_H_CHAINED | ((uint32_t)(index) << 8))

/* An event that reaches neither plugin: its handle's slot, channel entry or ring entry moved on, or its
   communicator is gone. */
static inline void chain_stale_count(void) { atomic_fetch_add_explicit(&dccl_g.chain_stale, 1, memory_order_relaxed); }

/* hot path: a chained handle (DCCL_H_CHAINED, or a ring handle) */
ncclResult_t dccl_chain_stop(uint64_t h);
/* a Coll/P2p of ours (DCCL_H_TAG_SLOT | DCCL_H_CHAINED) */
ncclResult_t dccl_chain_op_stop(uint64_t h);
ncclResult_t dccl_chain_record(uint64_t h, ncclProfilerEventState_t eState, ncclProfilerEventStateArgs_v4_t* args);
/* the most frequent of them: a KernelCh of ours (DCCL_H_TAG_KCH | DCCL_H_CHAINED), whose KernelChStop
   state also forwards the chained plugin's stop (its stopEvent then does nothing) */
ncclResult_t dccl_chain_kch_record(uint64_t h, ncclProfilerEventState_t eState, ncclProfilerEventStateArgs_v4_t* args);

/* plugin.c: our own start per version (no chain), and the chained starts (chain.c). A chained
   communicator's start goes from startEvent (dccl_start_vV_dispatch, inlined there) to its path in one
   tail call: KernelCh, the most frequent (chain_kch_type is 0 unless the chained plugin gets KernelCh;
   _chain_kch passes a parent that is no kept Coll/P2p of this communicator on to _chain); an untracked
   parent or a Coll/P2p whose parent is NCCL's NULL or the chained plugin's own handle (tag 0: nothing
   to translate; the masks are DCCL_DUMMY_TYPES and Coll | P2p where forwarded); any other to _chain. */
#define DCCL_DECLARE_START(V)                                                                               \
  ncclResult_t dccl_start_v##V##_core(void* context, void** eHandle, ncclProfilerEventDescr_v##V##_t* d);   \
  /* the part of _core after its inline cases: Coll, P2p, CeColl and the proxy events */                     \
  ncclResult_t dccl_start_v##V##_rest(dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d); \
  ncclResult_t dccl_start_v##V##_chain(dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d); \
  ncclResult_t dccl_start_v##V##_chain_kch(dccl_ctx_t* ctx, void** eHandle,                                \
                                           ncclProfilerEventDescr_v##V##_t* d);                             \
  ncclResult_t dccl_start_v##V##_chain_dummy(dccl_ctx_t* ctx, void** eHandle,                              \
                                             ncclProfilerEventDescr_v##V##_t* d);                           \
  ncclResult_t dccl_start_v##V##_chain_op(dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d); \
  static inline __attribute__((always_inline)) ncclResult_t dccl_start_v##V##_dispatch(                     \
      dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d) {                                \
    uint64_t type = (uint64_t)d->type;                                                                       \
    if (type == ctx->chain_kch_type) return dccl_start_v##V##_chain_kch(ctx, eHandle, d);                    \
    if (DCCL_H_TAG((uint64_t)(uintptr_t)d->parentObj) == 0) {                                                \
      if (type & ctx->chain_dummy_types) return dccl_start_v##V##_chain_dummy(ctx, eHandle, d);              \
      if (type & ctx->chain_op_types) return dccl_start_v##V##_chain_op(ctx, eHandle, d);                    \
    }                                                                                                        \
    return dccl_start_v##V##_chain(ctx, eHandle, d);                                                         \
  }
DCCL_DECLARE_START(4)
DCCL_DECLARE_START(5)
DCCL_DECLARE_START(6)
DCCL_DECLARE_START(7)
ncclResult_t dccl_stop_core(void* eHandle);
ncclResult_t dccl_record_state_core(void* eHandle, ncclProfilerEventState_t eState,
                                    ncclProfilerEventStateArgs_v4_t* args);

#endif /* DYNAMICCL_CHAIN_H_ */
