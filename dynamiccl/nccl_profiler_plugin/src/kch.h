/* DynamICCL profiler plugin: the KernelCh hot path, the completion marks and the untracked parents'
 * dummy, shared by our own entry points (plugin.c) and the chained profiler's (chain.c), which
 * decode a handle once for both plugins. Every function here runs on NCCL's threads: no
 * allocation, no lock.
 */
#ifndef DYNAMICCL_KCH_H_
#define DYNAMICCL_KCH_H_

#include "internal.h"

/* One completion mark (DCCL_DONE_STOPPED or _KERNELS) for the generation `h` names; the mark that
   completes the word finishes the slot, once (internal.h: the completion rule). */
static inline void slot_mark(dccl_slot_t* s, uint64_t h, uint64_t part) {
  uint64_t w = atomic_load_explicit(&s->done, memory_order_relaxed);
  do {
    if ((w & DCCL_H_GEN_MASK) != DCCL_H_GEN(h) || (w & part)) return; /* a later occupant's, or marked already */
  } while (!atomic_compare_exchange_weak_explicit(&s->done, &w, w | part, memory_order_acq_rel, memory_order_relaxed));
  if ((w & DCCL_DONE_REAPED) || ((w | part) & DCCL_DONE_BOTH) != DCCL_DONE_BOTH) return;
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_relaxed);
  atomic_store_explicit(&s->ctl, c | 1, memory_order_release);
  dccl_slot_finish(s, 0);
}

#define DUMMY_HANDLE ((void*)(uintptr_t)DCCL_H_TAG_DUMMY)

/* Parents we do not track (Group, GroupApi, CollApi, P2pApi, KernelLaunch; NCCL's event types are
   single bits): a non-NULL dummy so NCCL keeps starting the children. Five of a collective's eleven
   starts in eager mode, so they are taken inline, before the out-of-line switch and its register saves. */
#define DCCL_DUMMY_TYPES \
  ((uint64_t)(ncclProfileGroup | ncclProfileGroupApi | ncclProfileCollApi | ncclProfileP2pApi | ncclProfileKernelLaunch))
static inline __attribute__((always_inline)) void start_dummy(dccl_ctx_t* ctx, void** eHandle, uint64_t type) {
  if (type == ncclProfileCollApi) dccl_bump(&ctx->api_colls); /* coverage: a collective call (dccl_ctx_uncovered) */
  *eHandle = DUMMY_HANDLE;
}

static inline void kch_reject(void) { atomic_fetch_add_explicit(&dccl_g.kch_dropped, 1, memory_order_relaxed); }

/* The order guard at a KernelCh start (internal.h, DCCL_KCH_*): one relaxed load. */
static inline uint32_t kch_order(dccl_ctx_t* ctx, const dccl_slot_t* s, uint8_t ch, uint64_t pTimer) {
  uint32_t f = s->rec.kind == DCCL_KIND_COLL ? DCCL_KCH_COLL : 0;
  uint64_t last = atomic_load_explicit(&ctx->last_stop[ch], memory_order_relaxed);
  if (pTimer != 0 && pTimer + DCCL_KCH_ORDER_SLACK_NS < last) f |= DCCL_KCH_SUSPECT;
  return f;
}

/* A collective's KernelCh stop advances its channel's order mark (never backwards: a late or
   suspect stop only loosens the guard). */
static inline void kch_order_stop(dccl_ctx_t* ctx, const dccl_kch_t* e, uint32_t ch, uint64_t pTimer) {
  if (!(e->order & DCCL_KCH_COLL)) return;
  if (pTimer > atomic_load_explicit(&ctx->last_stop[ch], memory_order_relaxed))
    atomic_store_explicit(&ctx->last_stop[ch], pTimer, memory_order_relaxed);
}

/* A KernelCh start whose parent p names slot s of ctx (handle_live checked by the caller). */
static inline __attribute__((always_inline)) void start_kch_in(dccl_ctx_t* ctx, dccl_slot_t* s, uint64_t p,
                                                               void** eHandle, uint8_t channelId, uint64_t pTimer) {
  if (channelId >= DCCL_MAX_CHANNELS) {
    kch_reject();
    return;
  }
  uint64_t started = atomic_load_explicit(&s->chmask, memory_order_relaxed);
  if (started & (1ull << channelId)) { /* a second start of one channel */
    kch_reject();
    return;
  }
  atomic_store_explicit(&s->chmask, started | (1ull << channelId), memory_order_relaxed);
  dccl_kch_t* e = &s->ch[channelId];
  e->start_ptimer = pTimer; /* stop_ptimer is written before DCCL_KCH_STOPPED, the only way it is read */
  e->sync_start = 0;
  e->sync_ns = 0;
  e->order = kch_order(ctx, s, channelId, pTimer);
  atomic_store_explicit(&e->gen, (uint32_t)DCCL_H_GEN(p), memory_order_release);
  *eHandle = (void*)(uintptr_t)((p & ~(uint64_t)3) | DCCL_H_TAG_KCH | ((uint64_t)channelId << 2));
}

/* Inlined into each version's startEvent: KernelCh is the most frequent start. */
static inline __attribute__((always_inline)) void start_kch(void** eHandle, void* parentObj, uint8_t channelId,
                                                            uint64_t pTimer) {
  uint64_t p = (uint64_t)(uintptr_t)parentObj;
  if (p == 0 || DCCL_H_TAG(p) != DCCL_H_TAG_SLOT) return; /* NULL (dropped/sampled-out op) or untracked */
  dccl_ctx_t* ctx;
  dccl_slot_t* s = handle_slot_ctx(p, &ctx);
  if (s == NULL || !handle_live(s, p)) {
    kch_reject();
    return;
  }
  start_kch_in(ctx, s, p, eHandle, channelId, pTimer);
}

/* KernelChStop of a live handle (handle_live checked by the caller). A live generation means this
   entry was stamped by this operation's start (the only way to get a KernelCh handle), so the
   entry's own stamp need not be checked again. */
static inline void kch_stopped_live(dccl_ctx_t* ctx, dccl_slot_t* s, uint64_t h, uint64_t t) {
  dccl_kch_t* e = &s->ch[DCCL_H_CH(h)];
  if (e->order & DCCL_KCH_STOPPED) {
    kch_reject(); /* a second stop of one channel */
    return;
  }
  uint32_t need = s->expect_kch;
  e->stop_ptimer = t;
  e->order |= DCCL_KCH_STOPPED;
  kch_order_stop(ctx, e, DCCL_H_CH(h), t);
  if (++s->kch_stopped != need) return;
  slot_mark(s, h, DCCL_DONE_KERNELS);
}

/* KernelChStop: the channel's stop pTimer, the order mark, and the count (DCCL_DONE_*). */
static inline void kch_stopped(dccl_ctx_t* ctx, dccl_slot_t* s, uint64_t h, uint64_t t) {
  if (!handle_live(s, h)) kch_reject(); /* late: its operation finished or was reaped */
  else kch_stopped_live(ctx, s, h, t);
}

#endif /* DYNAMICCL_KCH_H_ */
