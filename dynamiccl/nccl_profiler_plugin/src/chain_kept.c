/* DynamICCL profiler plugin: DYNAMICCL_PROFILER_CHAIN, the KernelCh states and Coll/P2p stops of our own
 * chained handles, whose chained plugin's handle is kept beside our slot (chain.h; their starts and every
 * other chained event: chain.c). One decode of the handle for both plugins.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "chain.h"
#include "kch.h"

/* KernelCh state of a chained KernelCh handle of ours. The kept handle is read first, as our
   KernelChStop may complete the operation; it is forwarded while the channel entry's generation stamp
   still names the handle's operation (implied while that operation is live: only its start stamped
   the entry), else counted. NCCL stops a KernelCh only right after its KernelChStop state, on the same
   thread and handle (profiler.cc, ncclProfilerStopKernelChEvent: recordEventState then stopEvent), so
   the chained plugin gets its stop here, after its state: the stopEvent that follows finds nothing
   left to do (dccl_stop_core), and the handle is decoded and checked once per channel, not twice. */
static __attribute__((noinline)) ncclResult_t chain_kch_record_slow(uint64_t h, ncclProfilerEventState_t eState,
                                                                    ncclProfilerEventStateArgs_v4_t* args) {
  dccl_ctx_t* ctx = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
  uint32_t i = DCCL_H_SLOT(h), ch = DCCL_H_CH(h);
  int kstop = eState == ncclProfilerKernelChStop;
  if (ctx == NULL || i >= ctx->pool_size || ctx->chain_kch == NULL) { /* gone, or its index reused unchained */
    if (kstop) kch_reject();
    chain_stale_count();
    return ncclSuccess;
  }
  dccl_slot_t* s = &ctx->slots[i];
  uintptr_t t = atomic_load_explicit(&ctx->chain_kch[(size_t)i * DCCL_MAX_CHANNELS + ch], memory_order_acquire);
  uint64_t o = h & ~(uint64_t)DCCL_H_CHAINED;
  if (kstop && handle_live(s, o)) {
    kch_stopped_live(ctx, s, o, args ? args->kernelCh.pTimer : 0);
  } else {
    if (kstop) kch_reject(); /* ours finished or was reaped (theirs may still be due its state) */
    if ((atomic_load_explicit(&s->kgen[ch], memory_order_relaxed) & DCCL_H_GEN_MASK) != DCCL_H_GEN(h)) {
      chain_stale_count(); /* the entry moved on to another operation: neither plugin's */
      return ncclSuccess;
    }
  }
  if (t == 0) return ncclSuccess;
  if (!kstop) return ctx->chain_record((void*)t, eState, args);
  ctx->chain_record((void*)t, eState, args);
  return ctx->chain_stop((void*)t);
}

/* The usual case, a KernelChStop of a live handle of a chained communicator, as chain_kch_record_slow
   does it, with fewer tests; any other goes there, which decides afresh (nothing was written before).
   The kept handle is read before our stop, as there; the liveness check just before it also stands for
   the entry's generation stamp (only the live operation's KernelCh start stamped the entry). */
ncclResult_t dccl_chain_kch_record(uint64_t h, ncclProfilerEventState_t eState, ncclProfilerEventStateArgs_v4_t* args) {
  dccl_ctx_t* ctx = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
  uint32_t i = DCCL_H_SLOT(h);
  if (__builtin_expect(ctx == NULL || eState != ncclProfilerKernelChStop || i >= ctx->pool_size ||
                       ctx->chain_kch == NULL, 0))
    return chain_kch_record_slow(h, eState, args);
  dccl_slot_t* s = &ctx->slots[i];
  if (__builtin_expect(!handle_live(s, h), 0)) return chain_kch_record_slow(h, eState, args);
  uintptr_t t = atomic_load_explicit(&ctx->chain_kch[(size_t)i * DCCL_MAX_CHANNELS + DCCL_H_CH(h)],
                                     memory_order_acquire);
  /* (h with its chained bit: handle_live and kch_stopped_live read only its channel, slot and generation) */
  kch_stopped_live(ctx, s, h, args ? args->kernelCh.pTimer : 0);
  if (t == 0) return ncclSuccess;
  ctx->chain_record((void*)t, eState, args);
  return ctx->chain_stop((void*)t);
}

/* The stop of a chained Coll/P2p handle of ours: one decode for both plugins. The kept handle is read
   before our stop, which may complete the operation (and free the slot for the next one); it is
   forwarded while the slot's generation is still the handle's, finished or not (chain_kept). */
ncclResult_t dccl_chain_op_stop(uint64_t h) {
  dccl_ctx_t* ctx = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
  uint32_t i = DCCL_H_SLOT(h);
  if (ctx == NULL || ctx->chain_op == NULL || i >= ctx->pool_size) goto stale; /* gone, or its index reused */
  dccl_slot_t* s = &ctx->slots[i];
  uintptr_t t = atomic_load_explicit(&ctx->chain_op[i], memory_order_acquire);
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
  if (((c >> 1) & DCCL_H_GEN_MASK) != DCCL_H_GEN(h)) goto stale; /* the slot's next operation: neither plugin's */
  if (!(c & 1)) slot_mark(s, h, DCCL_DONE_STOPPED);               /* ours, while in flight */
  return t ? ctx->chain_stop((void*)t) : ncclSuccess;
stale:
  chain_stale_count();
  return ncclSuccess;
}
