/* DynamICCL profiler plugin: DYNAMICCL_PROFILER_CHAIN, the event paths that forward every call to a
 * second profiler plugin (chain.h has the design; the KernelCh states and Coll/P2p stops of our kept
 * handles: chain_kept.c; loading, init and finalize: chain_lifecycle.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "chain.h"
#include "kch.h"
#include "net.h"

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

/* ------------------------------------------------------------------------------------------ */
/* The handles kept beside our slots (chain.h)                                                 */

/* Our own chained Coll/P2p or KernelCh handle (tag 1 or 2 with DCCL_H_CHAINED)? */
static inline int chain_is_kept(uint64_t h) {
  uint32_t r = DCCL_H_ROUTE(h);
  return r == (DCCL_H_TAG_SLOT | DCCL_H_CHAINED) || r == (DCCL_H_TAG_KCH | DCCL_H_CHAINED);
}

/* The chained plugin's handle kept for our own handle h (Coll/P2p or KernelCh of ctx), or 0 when
   the slot or channel entry has moved on to another operation (counted). */
static inline uintptr_t chain_kept(const dccl_ctx_t* ctx, const dccl_chain_t* c, uint64_t h) {
  uint32_t i = DCCL_H_SLOT(h);
  if (i >= ctx->pool_size) goto stale;
  const dccl_slot_t* s = &ctx->slots[i];
  uintptr_t t;
  uint32_t gen;
  if (DCCL_H_TAG(h) == DCCL_H_TAG_KCH) {
    t = atomic_load_explicit(&c->kch[(size_t)i * DCCL_MAX_CHANNELS + DCCL_H_CH(h)], memory_order_acquire);
    gen = atomic_load_explicit(&s->kgen[DCCL_H_CH(h)], memory_order_relaxed);
  } else {
    t = atomic_load_explicit(&c->op[i], memory_order_acquire);
    gen = (uint32_t)(atomic_load_explicit(&s->ctl, memory_order_relaxed) >> 1);
  }
  if ((gen & DCCL_H_GEN_MASK) == DCCL_H_GEN(h)) return t;
stale:
  atomic_fetch_add_explicit(&dccl_g.chain_stale, 1, memory_order_relaxed);
  return 0;
}

/* Keep the chained plugin's handle beside ours (after our start stamped the generation). */
static inline void chain_keep(dccl_chain_t* c, uint64_t ours, void* theirs) {
  uint32_t i = DCCL_H_SLOT(ours);
  _Atomic uintptr_t* at = DCCL_H_TAG(ours) == DCCL_H_TAG_KCH ? &c->kch[(size_t)i * DCCL_MAX_CHANNELS + DCCL_H_CH(ours)]
                                                             : &c->op[i];
  atomic_store_explicit(at, (uintptr_t)theirs, memory_order_release);
}

/* A handle the chained plugin gave out that can reach NCCL as it is: no handle of ours has tag 0
   (handles.h), so its stop and states go straight back. */
static inline int chain_raw_ok(uint64_t t) { return t != 0 && DCCL_H_TAG(t) == 0; }

/* A child's parent, split into the two plugins' handles: a chained handle of ours gives ours and
   the kept one, a ring handle its entry (a stale one two NULLs, as NCCL passes after a dropped
   parent), another handle of ours (a dummy, a proxy event) ours only, and anything else (the
   chained plugin's own handle, a PXN parent from another process) theirs only. */
static inline void chain_parent(dccl_ctx_t* ctx, void* p, void** ours, void** theirs) {
  uint64_t h = (uint64_t)(uintptr_t)p;
  *ours = *theirs = NULL;
  if (h == 0) return;
  if (chain_is_kept(h)) { /* its communicator's table (a parent of another communicator is decoded too) */
    dccl_ctx_t* pc = ctx;
    if (DCCL_H_CTX(h) != ctx->index) pc = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
    *ours = (void*)(uintptr_t)(h & ~(uint64_t)DCCL_H_CHAINED);
    if (pc != NULL && pc->chain != NULL) *theirs = (void*)chain_kept(pc, pc->chain, h);
    else chain_stale_count();
  } else if (DCCL_H_IS_CHAIN(h)) {
    uintptr_t o = 0, t = 0;
    if (chain_get(h, &o, &t) == NULL) o = t = 0;
    *ours = (void*)o;
    *theirs = (void*)t;
  } else if (DCCL_H_TAG(h) != 0) {
    *ours = p;
  } else {
    *theirs = p;
  }
}

/* The handle NCCL gets for an event both plugins were asked about: ours with the chained bit
   (theirs kept beside our slot), either one alone when the other needs nothing back (our dummy
   for an untracked parent: its stop and states do nothing), else a ring entry. */
static inline void* chain_handle(dccl_ctx_t* ctx, void* ours, void* theirs) {
  uint64_t o = (uint64_t)(uintptr_t)ours, t = (uint64_t)(uintptr_t)theirs;
  uint32_t tag = DCCL_H_TAG(o);
  if ((tag == DCCL_H_TAG_SLOT || tag == DCCL_H_TAG_KCH) && DCCL_H_CTX(o) == ctx->index) {
    chain_keep(ctx->chain, o, theirs); /* (a KernelCh under another communicator's parent takes the ring) */
    return (void*)(uintptr_t)(o | DCCL_H_CHAINED);
  }
  if (t == 0) return ours;
  if ((o == 0 || o == DCCL_H_TAG_DUMMY) && chain_raw_ok(t)) return theirs;
  return chain_put(ctx, ours, theirs);
}

/* A KernelCh start whose parent is a kept Coll/P2p handle of ours (the most frequent chained start):
   the parent decoded once for both plugins. Our start (or its refusal, counted as alone) goes to
   *ours; returns the chained plugin's parent (NULL, counted, when the slot moved on). */
static inline __attribute__((always_inline)) void* chain_kch_begin(dccl_ctx_t* ctx, uint64_t p, uint8_t ch, uint64_t pTimer, void** ours) {
  uint32_t i = DCCL_H_SLOT(p);
  if (i >= ctx->pool_size) { /* (the caller checked that p names this communicator) */
    chain_stale_count();
    return NULL;
  }
  dccl_slot_t* s = &ctx->slots[i];
  uintptr_t t = atomic_load_explicit(&ctx->chain_op[i], memory_order_acquire);
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
  if (((c >> 1) & DCCL_H_GEN_MASK) != DCCL_H_GEN(p)) { /* the slot's next operation: neither plugin's */
    kch_reject();
    chain_stale_count();
    return NULL;
  }
  if (c & 1) kch_reject(); /* ours finished (theirs still gets its parent) */
  else start_kch_in(ctx, s, p & ~(uint64_t)DCCL_H_CHAINED, ours, ch, pTimer);
  return (void*)t;
}

/* Our start with our parent, theirs with theirs. The descriptor is NCCL's per-call object, passed
   as non-const and used by nobody else during the call: its parentObj is swapped in place and
   restored before returning (a copy of the whole descriptor per start would cost more than the rest),
   except on the KernelCh path, where the chained start is a tail call (dccl_start_vV_chain_kch). */
/* The chained plugin's startEvent, cached in the context at attach (chain_lifecycle.c). */
#define CHAIN_START_FN(V, ctx) ((ncclResult_t(*)(void*, void**, ncclProfilerEventDescr_v##V##_t*))(ctx)->chain_start)
#define DCCL_DEFINE_CHAIN_START(V)                                                                          \
  /* A KernelCh under a kept Coll/P2p that ours refused (counted): theirs alone. */                         \
  static __attribute__((noinline)) ncclResult_t chain_kch_alone_v##V(dccl_ctx_t* ctx, void** eHandle,        \
                                                                      ncclProfilerEventDescr_v##V##_t* d,    \
                                                                      void* tp) {                            \
    void *parent = d->parentObj, *theirs = NULL;                                                             \
    d->parentObj = tp;                                                                                       \
    CHAIN_START_FN(V, ctx)(ctx->chain_ctx, &theirs, d);                                                      \
    d->parentObj = parent;                                                                                  \
    *eHandle = chain_handle(ctx, NULL, theirs);                                                              \
    return ncclSuccess;                                                                                     \
  }                                                                                                          \
  /* KernelCh under a kept Coll/P2p: ours goes straight to *eHandle, and the chained plugin writes its       \
     handle straight into the entry kept beside our channel (zeroed first: a plugin that declines an event \
     may leave its eHandle untouched). That entry is written and read only on the communicator's proxy       \
     thread (KernelCh start, KernelChStop state and stop all come from it), after our start stamped the     \
     channel entry's generation, so a reader that checks the stamp never takes an earlier occupant's. */  \
  static __attribute__((noinline)) ncclResult_t chain_kch_slow_v##V(dccl_ctx_t* ctx, void** eHandle,         \
                                                                     ncclProfilerEventDescr_v##V##_t* d) {  \
    uint64_t p = (uint64_t)(uintptr_t)d->parentObj;                                                          \
    uint8_t ch = d->kernelCh.channelId;                                                                      \
    void* ours = NULL;                                                                                       \
    void* tp = chain_kch_begin(ctx, p, ch, d->kernelCh.pTimer, &ours);                                       \
    uint64_t o = (uint64_t)(uintptr_t)ours; /* NULL or our KernelCh handle (slot of p, channel ch) */       \
    if (o == 0) return chain_kch_alone_v##V(ctx, eHandle, d, tp);                                            \
    _Atomic uintptr_t* kept = &ctx->chain_kch[(size_t)DCCL_H_SLOT(p) * DCCL_MAX_CHANNELS + ch];              \
    atomic_store_explicit(kept, 0, memory_order_relaxed);                                                    \
    atomic_thread_fence(memory_order_release); /* our stamp before their handle (chain_kept's order) */      \
    *eHandle = (void*)(uintptr_t)(o | DCCL_H_CHAINED);                                                       \
    /* A tail call, parentObj left as theirs: NCCL's KernelCh descriptor is a local of                      \
       ncclProfilerStartKernelChEvent, built for this one call and dead after it (profiler.cc, every        \
       release with KernelCh), so no register is saved to restore it. */                                    \
    d->parentObj = tp;                                                                                       \
    return CHAIN_START_FN(V, ctx)(ctx->chain_ctx, (void**)kept, d);                                          \
  }                                                                                                          \
  /* The usual KernelCh start under a kept Coll/P2p (the slot live, the channel in range and not started  \
     yet in this generation), as chain_kch_slow does it but with no call before the tail call (kagg_init  \
     inline): 2 register saves instead of 4. Any other case goes to chain_kch_slow, which decides afresh  \
     (only *eHandle was written before, and chain_kch_slow writes it on each of its paths). */             \
  ncclResult_t dccl_start_v##V##_chain_kch(dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d) { \
    uint64_t p = (uint64_t)(uintptr_t)d->parentObj;                                                          \
    if (((uint32_t)p & DCCL_H_KEPT_OP_MASK) != ctx->chain_op_key) /* no kept Coll/P2p of this communicator */ \
      return dccl_start_v##V##_chain(ctx, eHandle, d);                                                       \
    uint32_t i = DCCL_H_SLOT(p);                                                                             \
    uint64_t ch = d->kernelCh.channelId;                                                                     \
    if (__builtin_expect(i >= ctx->pool_size || ch >= DCCL_MAX_CHANNELS, 0))                                 \
      return chain_kch_slow_v##V(ctx, eHandle, d);                                                           \
    /* our KernelCh handle (start_kch_in's), p's chained bit kept: written first, so that eHandle needs no \
       register from here on (chain_kch_slow writes *eHandle on each of its paths) */                      \
    *eHandle = (void*)(uintptr_t)((p & ~(uint64_t)3) | DCCL_H_TAG_KCH | (ch << 2));                          \
    dccl_slot_t* s = &ctx->slots[i];                                                                         \
    /* their parent before our liveness check (chain_kch_begin's order) */                                  \
    uintptr_t tp = atomic_load_explicit(&ctx->chain_op[i], memory_order_acquire);                            \
    if (__builtin_expect(!handle_live(s, p), 0)) return chain_kch_slow_v##V(ctx, eHandle, d);                \
    uint32_t g = (uint32_t)DCCL_H_GEN(p);                                                                    \
    uint64_t bit = 1ull << ch;                                                                               \
    if (__builtin_expect(s->kagg.gen != g, 0)) kagg_init(&s->kagg, g); /* the operation's first channel */ \
    else if (__builtin_expect(s->kagg.started & bit, 0)) return chain_kch_slow_v##V(ctx, eHandle, d);        \
    d->parentObj = (void*)tp; /* theirs gets its own parent (a tail call: chain_kch_slow says why the       \
                                 descriptor is not restored) */                                             \
    kch_begin(ctx, s, ch, bit, g, d->kernelCh.pTimer);                                                       \
    _Atomic uintptr_t* kept = &ctx->chain_kch[(size_t)i * DCCL_MAX_CHANNELS + ch];                           \
    atomic_store_explicit(kept, 0, memory_order_relaxed);                                                    \
    atomic_thread_fence(memory_order_release); /* our stamp before their handle (chain_kept's order) */      \
    return CHAIN_START_FN(V, ctx)(ctx->chain_ctx, (void**)kept, d);                                          \
  }                                                                                                          \
  /* Any other start; `dummy`: an untracked parent (ours is the dummy, whatever its parent). Called with \
     a constant `dummy`, so each caller gets its own copy. */                                                \
  static __attribute__((noinline)) ncclResult_t chain_start_v##V(dccl_ctx_t* ctx, void** eHandle,            \
                                                                  ncclProfilerEventDescr_v##V##_t* d,        \
                                                                  int dummy) {                               \
    void *parent = d->parentObj, *po, *pt, *ours = NULL, *theirs = NULL;                                     \
    chain_parent(ctx, parent, &po, &pt);                                                                    \
    if (dummy) {                                                                                             \
      start_dummy(ctx, &ours, (uint64_t)d->type);                                                            \
    } else {                                                                                                 \
      d->parentObj = po;                                                                                     \
      dccl_start_v##V##_core(ctx, &ours, d);                                                                 \
    }                                                                                                        \
    d->parentObj = pt;                                                                                      \
    CHAIN_START_FN(V, ctx)(ctx->chain_ctx, &theirs, d);                                                      \
    d->parentObj = parent;                                                                                  \
    *eHandle = chain_handle(ctx, ours, theirs);                                                             \
    return ncclSuccess;                                                                                     \
  }                                                                                                          \
  /* An untracked parent (GroupApi, CollApi, ...) whose parent is NCCL's NULL or the chained plugin's own   \
     handle: ours is the dummy and needs no parent, theirs is the same descriptor, written straight to     \
     NCCL's eHandle; it goes to NCCL as it is unless it is NULL or looks like ours (chain_handle). */     \
  ncclResult_t dccl_start_v##V##_chain_dummy(dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d) { \
    void* ours;                                                                                              \
    start_dummy(ctx, &ours, (uint64_t)d->type);                                                              \
    CHAIN_START_FN(V, ctx)(ctx->chain_ctx, eHandle, d);                                                      \
    uint64_t t = (uint64_t)(uintptr_t)*eHandle;                                                              \
    if (__builtin_expect(!chain_raw_ok(t), 0)) *eHandle = chain_handle(ctx, ours, (void*)t); /* else as is */ \
    return ncclSuccess;                                                                                     \
  }                                                                                                          \
  /* A Coll/P2p whose parent is NCCL's NULL or the chained plugin's own handle (our start of these types    \
     reads no parent, so the descriptor goes to both plugins as it is): ours first, then theirs written     \
     straight into the entry kept beside our slot (zeroed first), as a tail call (NCCL ignores the result \
     codes of startEvent, stopEvent and recordEventState: profiler.cc). */                        \
  ncclResult_t dccl_start_v##V##_chain_op(dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d) { \
    dccl_start_v##V##_rest(ctx, eHandle, d); /* (_core's inline cases are other types) */                   \
    uint64_t o = (uint64_t)(uintptr_t)*eHandle; /* NULL or our Coll/P2p handle (ctx's own) */               \
    if (o == 0) {                                                                                            \
      CHAIN_START_FN(V, ctx)(ctx->chain_ctx, eHandle, d);                                                    \
      *eHandle = chain_handle(ctx, NULL, *eHandle);                                                          \
      return ncclSuccess;                                                                                   \
    }                                                                                                        \
    _Atomic uintptr_t* kept = &ctx->chain_op[DCCL_H_SLOT(o)];                                                \
    atomic_store_explicit(kept, 0, memory_order_relaxed);                                                    \
    atomic_thread_fence(memory_order_release); /* our stamp before their handle (chain_kept's order) */      \
    *eHandle = (void*)(uintptr_t)(o | DCCL_H_CHAINED);                                                       \
    return CHAIN_START_FN(V, ctx)(ctx->chain_ctx, (void**)kept, d);                                          \
  }                                                                                                          \
  /* An event of a type NCCL would not give the chained plugin alone (dccl_chain_types): ours only, and   \
     its handle never chained. A chained parent of ours (a KernelCh's Coll/P2p, a KernelPhase's KernelCh)  \
     is given to ours without the chained bit, the descriptor restored after. */                           \
  static __attribute__((noinline)) ncclResult_t chain_ours_only_v##V(dccl_ctx_t* ctx, void** eHandle,        \
                                                                      ncclProfilerEventDescr_v##V##_t* d) {  \
    void* parent = d->parentObj;                                                                             \
    uint64_t p = (uint64_t)(uintptr_t)parent;                                                                \
    if (!chain_is_kept(p)) return dccl_start_v##V##_core(ctx, eHandle, d);                                   \
    d->parentObj = (void*)(uintptr_t)(p & ~(uint64_t)DCCL_H_CHAINED);                                        \
    dccl_start_v##V##_core(ctx, eHandle, d);                                                                 \
    d->parentObj = parent;                                                                                  \
    return ncclSuccess;                                                                                     \
  }                                                                                                          \
  /* The starts dccl_start_vV_dispatch (chain.h) passes on. Tail calls: no path pays another's register     \
     saves. */                                                                                               \
  ncclResult_t dccl_start_v##V##_chain(dccl_ctx_t* ctx, void** eHandle, ncclProfilerEventDescr_v##V##_t* d) { \
    uint64_t type = (uint64_t)d->type;                                                                       \
    if (__builtin_expect(!(ctx->chain_types & type), 0)) /* a type it would not get alone: ours only */       \
      return chain_ours_only_v##V(ctx, eHandle, d);                                                          \
    if (type & DCCL_DUMMY_TYPES) return chain_start_v##V(ctx, eHandle, d, 1);                                \
    return chain_start_v##V(ctx, eHandle, d, 0);                                                             \
  }
DCCL_DEFINE_CHAIN_START(4)
DCCL_DEFINE_CHAIN_START(5)
DCCL_DEFINE_CHAIN_START(6)
DCCL_DEFINE_CHAIN_START(7)

/* A handle that is not ours (tag 0, chain_raw_ok): the chained plugin's own. */
static inline ncclResult_t chain_raw_stop(uint64_t h) {
  dccl_chain_stop_fn f = atomic_load_explicit(&dccl_chain_raw_stop, memory_order_relaxed);
  return f ? f((void*)(uintptr_t)h) : ncclSuccess;
}

ncclResult_t dccl_chain_stop(uint64_t h) {
  if (DCCL_H_TAG(h) == 0) return chain_raw_stop(h);
  if (chain_is_kept(h)) { /* ours (a KernelCh's stop does nothing: it counted at KernelChStop), then theirs */
    dccl_ctx_t* ctx = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
    if (ctx == NULL || ctx->chain == NULL) { /* gone, or its index reused by an unchained communicator */
      chain_stale_count();
      return ncclSuccess;
    }
    uintptr_t t = chain_kept(ctx, ctx->chain, h);
    if (DCCL_H_TAG(h) == DCCL_H_TAG_SLOT) dccl_stop_core((void*)(uintptr_t)(h & ~(uint64_t)DCCL_H_CHAINED));
    return t ? ctx->chain->stop((void*)t) : ncclSuccess;
  }
  if (!DCCL_H_IS_CHAIN(h)) return ncclSuccess; /* not a handle anyone issued */
  uintptr_t o, t;
  dccl_ctx_t* ctx = chain_get(h, &o, &t);
  if (ctx == NULL) return ncclSuccess;
  if (o) dccl_stop_core((void*)o);
  if (t) ctx->chain->stop((void*)t);
  return ncclSuccess;
}

ncclResult_t dccl_chain_record(uint64_t h, ncclProfilerEventState_t eState, ncclProfilerEventStateArgs_v4_t* args) {
  if (DCCL_H_TAG(h) == 0) { /* the chained plugin's own (chain_raw_ok) */
    dccl_chain_record_fn f = atomic_load_explicit(&dccl_chain_raw_record, memory_order_relaxed);
    return f ? f((void*)(uintptr_t)h, eState, args) : ncclSuccess;
  }
  if (chain_is_kept(h)) { /* the kept handle first: our KernelChStop may complete the operation */
    dccl_ctx_t* ctx = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
    if (ctx == NULL || ctx->chain == NULL) { /* gone, or its index reused by an unchained communicator */
      chain_stale_count();
      return ncclSuccess;
    }
    uintptr_t t = chain_kept(ctx, ctx->chain, h);
    if (DCCL_H_TAG(h) == DCCL_H_TAG_KCH) /* a Coll/P2p has no state we use */
      dccl_record_state_core((void*)(uintptr_t)(h & ~(uint64_t)DCCL_H_CHAINED), eState, args);
    return t ? ctx->chain->record((void*)t, eState, args) : ncclSuccess;
  }
  if (!DCCL_H_IS_CHAIN(h)) return ncclSuccess; /* not a handle anyone issued */
  uintptr_t o, t;
  dccl_ctx_t* ctx = chain_get(h, &o, &t);
  if (ctx == NULL) return ncclSuccess;
  if (o) dccl_record_state_core((void*)o, eState, args);
  if (t) ctx->chain->record((void*)t, eState, args);
  return ncclSuccess;
}
