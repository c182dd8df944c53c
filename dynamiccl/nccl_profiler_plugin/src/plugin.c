/* DynamICCL NCCL profiler plugin: event hot path, per-communicator contexts, ABI tables.
 *
 * Hot path (startEvent/stopEvent/recordEventState): no malloc, no locks, no syscalls except
 * clock_gettime(CLOCK_REALTIME) through the vDSO. Fixed slot pools per communicator; a full
 * pool gives a NULL handle and a counted drop. Finished records go to one process-wide
 * bounded MPMC ring (ring.c) that the sender thread (sender.c) drains.
 *
 * Handles are encoded values (handles.h, DCCL_H_*), never pointers: Coll/P2p (slot), KernelCh
 * (slot + channel) and a dummy for the parents we do not track (GroupApi/CollApi/P2pApi/
 * KernelLaunch/Group). Every stop or child is checked against the slot's current generation.
 *
 * NCCL strings as wire codes: codes.h. Completion (a finished slot becomes a record on the ring):
 * finish.c. Lifecycle (init/finalize, communicator table, tuner link, counters, the stale-slot
 * reaper): lifecycle.c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "chain.h"
#include "codes.h"
#include "kch.h"
#include "net.h"

#define ALLOC_PROBES 64 /* a start is refused when this many consecutive slots are busy */

/* ------------------------------------------------------------------------------------------ */
/* Slots                                                                                       */

static inline uint32_t slot_alloc(dccl_ctx_t* ctx) {
  /* The cursor is a hint (plain load/store): concurrent starters on one communicator are rare,
     and the CAS on `busy` arbitrates if they pick the same slot. Returns the index, or UINT32_MAX. */
  uint64_t idx = atomic_load_explicit(&ctx->cursor, memory_order_relaxed);
  uint32_t probes = ctx->pool_size < ALLOC_PROBES ? ctx->pool_size : ALLOC_PROBES;
  for (uint32_t i = 0; i < probes; i++) {
    uint32_t cur = (uint32_t)idx;
    dccl_slot_t* s = &ctx->slots[cur];
    idx = (idx + 1 == ctx->pool_size) ? 0 : idx + 1;
    uint32_t zero = 0;
    if (atomic_load_explicit(&s->busy, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong_explicit(&s->busy, &zero, 1, memory_order_acquire, memory_order_relaxed)) {
      atomic_store_explicit(&ctx->cursor, idx, memory_order_relaxed);
      return cur;
    }
  }
  return UINT32_MAX;
}



/* Start a Coll (kind COLL) or P2p (kind P2P). `root` is the peer for P2P. `children`: KernelCh
   stops this operation will get (0: it completes at its stopEvent). */
/* Out of line: the startEvent dispatcher then needs no callee-saved registers, so its most
   frequent case, KernelCh (nChannels per operation), runs without a prologue/epilogue. */
static __attribute__((noinline)) void start_op(dccl_ctx_t* ctx, void** eHandle, uint8_t kind, uint64_t seq, const char* func,
                            const char* datatype, size_t count, int root, uint8_t nChannels, uint8_t nWarps,
                            const char* algo, const char* proto, uint32_t children, uint64_t user_tag,
                            uint16_t flags, uint32_t variant) {
  uint8_t dt = MAP_DTYPE(datatype);
  uint64_t bytes = (uint64_t)count * (dt < DCCL_DTYPE_COUNT ? dccl_dtype_sizes[dt] : 0);
  if (bytes < ctx->min_bytes) return;
  if (ctx->sample > 1 && seq % ctx->sample != 0) {
    atomic_fetch_add_explicit(&ctx->sampled_out, 1, memory_order_relaxed);
    return;
  }
  /* The enqueue time is read before the slot claim, not after it: behind the claim's locked CAS on a
     slot line last touched a pool ago, the read waited for both (-4 ns per operation on the emulator,
     interleaved minima). A refused claim (pool full) wastes the read. */
  uint64_t now = dccl_now_ns();
  uint32_t idx = slot_alloc(ctx);
  if (idx == UINT32_MAX) {
    atomic_fetch_add_explicit(&ctx->dropped_pool_full, 1, memory_order_relaxed);
    return;
  }
  dccl_slot_t* s = &ctx->slots[idx];
  int mask = __atomic_load_n(ctx->mask_ptr, __ATOMIC_RELAXED);
  /* Every field assigned one by one (a compound literal compiles to a 128-byte zero fill, `rep stos`,
     then the same stores again). */
  dccl_event_record_t* r = &s->rec;
  r->kind = kind;
  r->func = MAP_FUNC(func);
  r->datatype = dt;
  r->algo = algo ? MAP_ALGO(algo) : DCCL_UNKNOWN;
  r->proto = proto ? MAP_PROTO(proto) : DCCL_UNKNOWN;
  r->n_channels = nChannels;
  r->n_warps = nWarps;
  r->timing_source = DCCL_TIMING_NONE;
  r->rank = ctx->rank;
  r->nranks = ctx->nranks;
  r->nnodes = ctx->nnodes;
  r->pid = ctx->pid;
  r->root = root;
  r->tuner_config_version = dccl_tuner_version(ctx->comm_hash); /* 0 without the DynamICCL tuner */
  r->channels_seen = 0;
  r->flags = flags;
  r->kernel_variant = variant;
  r->comm_hash = ctx->comm_hash;
  r->seq_number = seq;
  r->count = count;
  r->bytes = bytes;
  r->enqueue_ns = now;
  r->gpu_start_ns = 0;
  r->gpu_end_ns = 0;
  r->cpu_end_ns = 0;
  r->record_seq = 0;
  r->user_tag = user_tag;
  r->sync_wait_ns = 0;
  _Static_assert(sizeof(dccl_event_record_t) == 128, "every field of the record is assigned above");

  s->expect_kch = ((mask & ncclProfileKernelCh) && (ctx->record_mask & ncclProfileKernelCh)) ? children : 0;
  if (s->net) s->net->n = s->net->dropped = 0;
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_relaxed);
  uint64_t next = (c | 1) + 1; /* next generation, not finished */
  atomic_store_explicit(&s->done, ((next >> 1) & DCCL_H_GEN_MASK) | (s->expect_kch ? 0 : DCCL_DONE_KERNELS),
                        memory_order_relaxed);
  atomic_store_explicit(&s->ctl, next, memory_order_release);
  *eHandle = (void*)(uintptr_t)DCCL_H_MAKE(DCCL_H_TAG_SLOT, 0, ctx->index, idx, next >> 1);
}

/* CollNet Direct/Chain and multi-node NVLS report nChannels = 0 (enqueue.cc:
   scheduleCollTasksToPlan sets task->nChannels only outside its isCollnet branch) while their
   KernelCh children still arrive: such a record completes at its stopEvent (timing NONE) and the
   children, finding a finished generation, are dropped and counted. */
static inline void start_coll(dccl_ctx_t* ctx, void** eHandle, uint64_t seq, const char* func, const char* dtype,
                              size_t count, int root, uint8_t nCh, uint8_t nWarps, const char* algo,
                              const char* proto, uint64_t user_tag, int sym, const char* variant) {
  dccl_bump(&ctx->coll_events);
  if (!(ctx->record_mask & ncclProfileColl)) return;
  start_op(ctx, eHandle, DCCL_KIND_COLL, seq, func, dtype, count, root, nCh, nWarps, algo, proto, nCh, user_tag,
           sym ? DCCL_FLAG_SYMMETRIC : 0, variant_hash(variant));
}

static inline void start_p2p(dccl_ctx_t* ctx, void** eHandle, const char* func, const char* dtype, size_t count,
                             int peer, uint8_t nCh, uint64_t user_tag) {
  if (!(ctx->record_mask & ncclProfileP2p)) return;
  /* No seqNumber for P2P in the ABI: use the ordinal of this (send|recv, peer) pair on this
     rank, so Send #k from a to b pairs with Recv #k at b from a. */
  uint64_t seq = 0;
  uint8_t f = MAP_FUNC(func);
  if (peer >= 0 && peer < ctx->nranks) {
    uint64_t* ctr = &ctx->p2p_seq[(f == DCCL_FUNC_RECV ? ctx->nranks : 0) + peer];
    seq = __atomic_load_n(ctr, __ATOMIC_RELAXED);
    __atomic_store_n(ctr, seq + 1, __ATOMIC_RELAXED);
  }
  /* A send/recv to self has no proxy ops, hence no KernelCh children, though nChannels >= 1
     (enqueue.cc: addP2pToPlan, nProxyOps = selfSend ? 0 : 2): it completes at its stopEvent. */
  uint32_t children = peer == ctx->rank ? 0 : nCh;
  start_op(ctx, eHandle, DCCL_KIND_P2P, seq, func, dtype, count, peer, nCh, 0, NULL, NULL, children, user_tag, 0, 0);
}

/* A copy-engine collective (v6+, ncclLaunchCeColl): NCCL starts and stops its CeColl event around
   the host-side launch and runs no kernel, so the record is counted and enqueue-timed only. */
static inline void start_ce(dccl_ctx_t* ctx, void** eHandle, uint64_t seq, const char* func, const char* dtype,
                            size_t count, int root, uint64_t user_tag) {
  dccl_bump(&ctx->coll_events);
  if (!(ctx->record_mask & ncclProfileCeColl)) return;
  start_op(ctx, eHandle, DCCL_KIND_COLL, seq, func, dtype, count, root, 0, 0, NULL, NULL, 0, user_tag,
           DCCL_FLAG_COPY_ENGINE, 0);
}

/* A CollApi event on a communicator where NCCL runs broadcasts with no Coll event (ctx->api_bcast,
   NCCL 2.29+): a Broadcast call becomes an API-level record (enqueued at the call, stopped when
   NCCL has queued it; timing NONE, algo/proto UNKNOWN), counted as covered; a call that is no
   Broadcast keeps the dummy handle its Coll event's children need. Out of line: broadcasts only. */
static __attribute__((noinline)) void start_api(dccl_ctx_t* ctx, void** eHandle, const char* func,
                                                const char* dtype, size_t count, int root, uint64_t user_tag) {
  if (MAP_FUNC(func) != DCCL_FUNC_BROADCAST) {
    start_dummy(ctx, eHandle, ncclProfileCollApi);
    return;
  }
  dccl_bump(&ctx->api_colls);
  dccl_bump(&ctx->coll_events);
  uint64_t seq = ctx->api_bcast_seq++;
  start_op(ctx, eHandle, DCCL_KIND_COLL, seq, func, dtype, count, root, 0, 0, NULL, NULL, 0, user_tag,
           DCCL_FLAG_API_LEVEL, 0);
}

/* v7 KernelPhase, a child of a KernelCh fired before the KernelCh stops (profiler.cc:
   profilerFireKernelPhaseEvents): only phase 0, initial_sync, the channel's wait for its peers, is
   kept. Its handle is the parent's payload under the dummy tag, so its stopEvent is a no-op and
   its KernelPhaseStop state finds the channel (its start pTimer in ksync). */
static inline __attribute__((always_inline)) void start_phase(void** eHandle, void* parentObj, uint8_t phaseId, uint64_t pTimer) {
  uint64_t p = (uint64_t)(uintptr_t)parentObj;
  if (phaseId != 0 || DCCL_H_TAG(p) != DCCL_H_TAG_KCH) return; /* tag 0: NULL */
  dccl_slot_t* s = handle_slot(p);
  if (s == NULL) return; /* its communicator is gone */
  /* The channel's stamp still names the parent's generation: its KernelCh started and no later
     operation's did (ksync[ch] is then this channel's own; its stop checks the aggregate). */
  uint32_t ch = DCCL_H_CH(p);
  if (atomic_load_explicit(&s->kgen[ch], memory_order_relaxed) != (uint32_t)DCCL_H_GEN(p)) return;
  s->ksync[ch] = pTimer;
  *eHandle = (void*)(uintptr_t)((p & ~(uint64_t)3) | DCCL_H_TAG_DUMMY); /* (p never chained here: chain.c) */
}


/* One startEvent per ABI version; the member names used are the same in all of them. The v7
   extras (userTag, isSymColl) are expressions of `d`, constants before v7. */
/* KernelCh, the most frequent start (nChannels per operation), and v7's KernelPhase (3 per
   KernelCh, tested first) are taken before the out-of-line switch, so they run without the others'
   register saves. */
/* With DYNAMICCL_PROFILER_CHAIN the communicator's events go through chain.c, which calls fn##_core
   with our own parent handle and the chained plugin with its own (for the types NCCL would give the
   chained plugin alone, ctx->chain_types; the others take fn##_core alone). */
#define DCCL_DEFINE_START(fn, descr_t, COLL_TAG, COLL_SYM, COLL_VARIANT, P2P_TAG, CE_CASE, PHASE_FAST, API_FAST)        \
  __attribute__((noinline)) ncclResult_t fn##_rest(dccl_ctx_t* ctx, void** eHandle, descr_t* d);            \
  static inline __attribute__((always_inline)) ncclResult_t fn##_body(void* context, void** eHandle,        \
                                                                      descr_t* d);                          \
  static ncclResult_t fn(void* context, void** eHandle, descr_t* d) {                                       \
    if (eHandle == NULL) return ncclSuccess;                                                                 \
    *eHandle = NULL;                                                                                         \
    if (context == NULL || d == NULL) return ncclSuccess;                                                    \
    if (__builtin_expect(((dccl_ctx_t*)context)->chain != NULL, 0))                                          \
      return fn##_dispatch((dccl_ctx_t*)context, eHandle, d); /* chain.h */                                       \
    return fn##_body(context, eHandle, d); /* inlined: no second jump on the most frequent starts */         \
  }                                                                                                          \
  ncclResult_t fn##_core(void* context, void** eHandle, descr_t* d) { return fn##_body(context, eHandle, d); } \
  static inline __attribute__((always_inline)) ncclResult_t fn##_body(void* context, void** eHandle,        \
                                                                      descr_t* d) {                         \
    PHASE_FAST                                                                                               \
    if ((uint64_t)d->type == ncclProfileKernelCh)                                                            \
      start_kch(eHandle, d->parentObj, d->kernelCh.channelId, d->kernelCh.pTimer);                           \
    API_FAST                                                                                                 \
    else if ((uint64_t)d->type & DCCL_DUMMY_TYPES)                                                           \
      start_dummy((dccl_ctx_t*)context, eHandle, (uint64_t)d->type);                                         \
    else                                                                                                     \
      return fn##_rest((dccl_ctx_t*)context, eHandle, d); /* a tail call */                                  \
    return ncclSuccess;                                                                                      \
  }                                                                                                          \
  ncclResult_t fn##_rest(dccl_ctx_t* ctx, void** eHandle, descr_t* d) {                                     \
    switch ((uint64_t)d->type) {                                                                             \
      case ncclProfileColl:                                                                                  \
        start_coll(ctx, eHandle, d->coll.seqNumber, d->coll.func, d->coll.datatype, d->coll.count,           \
                   d->coll.root, d->coll.nChannels, d->coll.nWarps, d->coll.algo, d->coll.proto, (COLL_TAG),  \
                   (COLL_SYM), (COLL_VARIANT));                                                              \
        break;                                                                                               \
      case ncclProfileP2p:                                                                                   \
        start_p2p(ctx, eHandle, d->p2p.func, d->p2p.datatype, d->p2p.count, d->p2p.peer, d->p2p.nChannels,  \
                  (P2P_TAG));                                                                                \
        break;                                                                                               \
      CE_CASE                                                                                                \
      case ncclProfileProxyOp: /* per-peer network timing, opt-in (net.h) */                                \
        if (ctx->net)                                                                                        \
          dccl_net_start_op(ctx, eHandle, d->parentObj, d->proxyOp.pid, d->proxyOp.peer, d->proxyOp.isSend); \
        break;                                                                                               \
      case ncclProfileProxyStep:                                                                             \
        if (ctx->net) dccl_net_start_step(eHandle, d->parentObj, d->proxyStep.step);                         \
        break;                                                                                               \
      default: /* ProxyCtrl, NetPlugin, CeSync/CeBatch: not tracked. */                                      \
        break;                                                                                               \
    }                                                                                                        \
    return ncclSuccess;                                                                                      \
  }

#define DCCL_CE_CASE(TAG)                                                                                  \
  case ncclProfileCeColl:                                                                                  \
    start_ce(ctx, eHandle, d->ceColl.seqNumber, d->ceColl.func, d->ceColl.datatype, d->ceColl.count,       \
             d->ceColl.root, (TAG));                                                                       \
    break;

/* v7 KernelPhase: three per KernelCh where NCCL emits them, the most frequent v7 start, so it is tested
   first (an `if ... else` that the KernelCh test completes), before the out-of-line switch. */
#define DCCL_PHASE_FAST                                                                                    \
  if ((uint64_t)d->type == ncclProfileKernelPhase)                                                         \
    start_phase(eHandle, d->parentObj, d->kernelPhase.phaseId, d->kernelPhase.pTimer);                     \
  else

/* v6+: a Broadcast's CollApi event where ctx->api_bcast is set (start_api). NCCL's only collective
   name starting with 'B' is "Broadcast": one byte decides, inline, for the other calls. */
#define DCCL_API_FAST(TAG)                                                                                 \
  else if (__builtin_expect(((dccl_ctx_t*)context)->api_bcast, 0) && (uint64_t)d->type == ncclProfileCollApi && \
           d->collApi.func != NULL && d->collApi.func[0] == 'B')                                           \
    start_api((dccl_ctx_t*)context, eHandle, d->collApi.func, d->collApi.datatype, d->collApi.count,       \
              d->collApi.root, (TAG));

DCCL_DEFINE_START(dccl_start_v4, ncclProfilerEventDescr_v4_t, 0, 0, NULL, 0, , , )
DCCL_DEFINE_START(dccl_start_v5, ncclProfilerEventDescr_v5_t, 0, 0, NULL, 0, , , )
DCCL_DEFINE_START(dccl_start_v6, ncclProfilerEventDescr_v6_t, 0, 0, NULL, 0, DCCL_CE_CASE(0), , DCCL_API_FAST(0))
DCCL_DEFINE_START(dccl_start_v7, ncclProfilerEventDescr_v7_t, d->coll.userTag, d->coll.isSymColl, d->coll.kernelVariant,
                  d->p2p.userTag, DCCL_CE_CASE(d->ceColl.userTag), DCCL_PHASE_FAST, DCCL_API_FAST(d->collApi.userTag))

/* A Coll/P2p stopEvent ("enqueued"). A KernelCh stopEvent, chained or not, does nothing: NCCL
   records the KernelChStop state (with its pTimer) right before it (profiler.cc
   ncclProfilerStopKernelChEvent), and the channel is counted there (and a chained plugin's stop
   forwarded there, chain.c), so each channel's stop decodes its handle once. */
ncclResult_t dccl_stop_core(void* eHandle) {
  uint64_t h = (uint64_t)(uintptr_t)eHandle;
  if (DCCL_H_TAG(h) == DCCL_H_TAG_KCH) return ncclSuccess; /* the most frequent stop, chained or not */
  uint32_t route = DCCL_H_ROUTE(h);
  if (route != DCCL_H_TAG_SLOT) {
    if (route == DCCL_H_TAG_DUMMY) return ncclSuccess; /* an untracked parent or a KernelPhase */
    if (DCCL_H_TAG(h) == 0) { /* NULL, or the chained plugin's own handle (never ours: handles.h) */
      dccl_chain_stop_fn f = atomic_load_explicit(&dccl_chain_raw_stop, memory_order_relaxed);
      return h != 0 && f != NULL ? f(eHandle) : ncclSuccess;
    }
    if (route == (DCCL_H_TAG_DUMMY | DCCL_H_CHAINED)) /* a proxy event, or a chain ring entry (handles.h) */
      return DCCL_H_IS_NET(h) ? dccl_net_stop(h) : dccl_chain_stop(h);
    if (route == (DCCL_H_TAG_SLOT | DCCL_H_CHAINED)) return dccl_chain_op_stop(h);
    return h != 0 ? dccl_chain_stop(h) : ncclSuccess; /* the chained plugin's own, or a chained Coll/P2p */
  }
  dccl_slot_t* s = handle_slot(h);
  if (s == NULL || !handle_live(s, h)) return ncclSuccess; /* late: finished, reaped, or its comm is gone */
  slot_mark(s, h, DCCL_DONE_STOPPED);
  return ncclSuccess;
}

/* A v7 KernelPhaseStop: the longest initial_sync of the operation, while the KernelCh aggregate is
   still the handle's operation's (a late phase never writes another operation's timer). */
static inline void phase_stopped(uint64_t h, uint64_t t) {
  dccl_slot_t* s = handle_slot(h);
  if (s == NULL) return; /* its communicator is gone */
  /* The aggregate is still the phase's generation's: no later KernelCh start on this proxy thread
     reset it, so ksync[ch] is the one this phase's start wrote (a channel starts once per operation). */
  if (s->kagg.gen != (uint32_t)DCCL_H_GEN(h)) return;
  uint64_t st = s->ksync[DCCL_H_CH(h)];
  if (st != 0 && t >= st && t - st > s->kagg.sync_ns) s->kagg.sync_ns = t - st;
}

/* Tested in the order of frequency: KernelChStop (one per channel, unchained, then chained) first. */
ncclResult_t dccl_record_state_core(void* eHandle, ncclProfilerEventState_t eState,
                                    ncclProfilerEventStateArgs_v4_t* args) {
  uint64_t h = (uint64_t)(uintptr_t)eHandle;
  uint32_t route = DCCL_H_ROUTE(h);
  if (route == DCCL_H_TAG_KCH) {
    if (eState != ncclProfilerKernelChStop) return ncclSuccess;
    dccl_ctx_t* ctx;
    dccl_slot_t* s = handle_slot_ctx(h, &ctx);
    if (s == NULL) kch_reject(); /* its communicator is gone */
    else kch_stopped(ctx, s, h, args ? args->kernelCh.pTimer : 0);
    return ncclSuccess;
  }
  /* a chained KernelCh's (8 of 9 states with a chain) before the untracked parents' (1 of 9 either way) */
  if (route == (DCCL_H_TAG_KCH | DCCL_H_CHAINED)) return dccl_chain_kch_record(h, eState, args);
  if (route == DCCL_H_TAG_DUMMY) { /* an untracked parent, or (with a KernelCh payload) an initial_sync phase */
    if ((h >> 2) != 0 && eState == ncclProfilerKernelPhaseStop) phase_stopped(h, args ? args->kernelCh.pTimer : 0);
    return ncclSuccess;
  }
  if (DCCL_H_TAG(h) == 0) { /* NULL, or the chained plugin's own handle (a GroupApi's state) */
    dccl_chain_record_fn f = atomic_load_explicit(&dccl_chain_raw_record, memory_order_relaxed);
    return h != 0 && f != NULL ? f(eHandle, eState, args) : ncclSuccess;
  }
  if (route == (DCCL_H_TAG_DUMMY | DCCL_H_CHAINED)) /* a proxy event's (ProxyStep: the most frequent opt-in state) */
    return DCCL_H_IS_NET(h) ? dccl_net_record(h, eState, args) : dccl_chain_record(h, eState, args);
  if (__builtin_expect(route != DCCL_H_TAG_SLOT && h != 0, 0)) /* chained (chain.h) */
    return dccl_chain_record(h, eState, args);
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* ABI entry points                                                                            */

static ncclResult_t dccl_init_v4(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                                 int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return dccl_init_common(4, context, commHash, eActivationMask, commName, nNodes, nranks, rank, logfn);
}

/* v5, v6 and v7 share init's signature (commId first). */
#define DCCL_DEFINE_INIT(V)                                                                                  \
  static ncclResult_t dccl_init_v##V(void** context, uint64_t commId, int* eActivationMask, const char* commName, \
                                     int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {            \
    return dccl_init_common(V, context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn);     \
  }
DCCL_DEFINE_INIT(5)
DCCL_DEFINE_INIT(6)
DCCL_DEFINE_INIT(7)

/* NCCL tries v7 first (2.31+), then v6 (2.29-2.30), v5 (2.28), v4 (2.27). */
#define DCCL_DEFINE_TABLE(V)                                                                                 \
  DCCL_EXPORT const ncclProfiler_v##V##_t ncclProfiler_v##V = {                                             \
      .name = DCCL_PLUGIN_NAME,                                                                              \
      .init = dccl_init_v##V,                                                                                \
      .startEvent = dccl_start_v##V,                                                                         \
      .stopEvent = dccl_stop_core,                                                                           \
      .recordEventState = dccl_record_state_core,                                                            \
      .finalize = dccl_finalize,                                                                             \
  };
DCCL_DEFINE_TABLE(7)
DCCL_DEFINE_TABLE(6)
DCCL_DEFINE_TABLE(5)
DCCL_DEFINE_TABLE(4)
