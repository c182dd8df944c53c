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
  dccl_slot_finish_gen(s, (uint32_t)DCCL_H_GEN(h), 0);
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

/* The first KernelCh start of generation g on the slot (its proxy thread): the aggregate of an
   earlier generation is discarded (dccl_kagg_t). Out of line: once per operation. */
static inline __attribute__((always_inline)) void kagg_init(dccl_kagg_t* a, uint32_t g) {
  a->gen = g;
  a->stopped = 0;
  a->flags = 0;
  a->started = 0;
  a->stopmask = 0;
  a->gmin = UINT64_MAX;
  a->gmax = 0;
  a->sync_ns = 0;
}
static __attribute__((noinline)) void kagg_reset(dccl_slot_t* s, uint32_t g) { kagg_init(&s->kagg, g); }

/* The order guard at a KernelCh start (internal.h): a start pTimer before the latest collective
   stop the communicator saw on this channel makes the operation suspect. One relaxed load. */
static inline void kch_order(dccl_ctx_t* ctx, dccl_kagg_t* a, uint8_t ch, uint64_t pTimer) {
  uint64_t last = atomic_load_explicit(&ctx->last_stop[ch], memory_order_relaxed);
  if (__builtin_expect(pTimer != 0 && pTimer + DCCL_KCH_ORDER_SLACK_NS < last, 0)) a->flags |= DCCL_KCH_SUSPECT;
}

/* The channel's start once the checks passed (channel in range, s->kagg this generation g's, the channel
   not started in it): what its stop and children check (started bit, start pTimer, order guard, the
   channel's generation stamp, released last). Shared by our start and the chained one (chain.c). */
static inline __attribute__((always_inline)) void kch_begin(dccl_ctx_t* ctx, dccl_slot_t* s, uint8_t ch, uint64_t bit,
                                                            uint32_t g, uint64_t pTimer) {
  s->kagg.started |= bit;
  s->kstart[ch] = pTimer;
  kch_order(ctx, &s->kagg, ch, pTimer);
  atomic_store_explicit(&s->kgen[ch], g, memory_order_release);
}

/* A KernelCh start whose parent p names slot s of ctx (handle_live checked by the caller). */
static inline __attribute__((always_inline)) void start_kch_in(dccl_ctx_t* ctx, dccl_slot_t* s, uint64_t p,
                                                               void** eHandle, uint8_t channelId, uint64_t pTimer) {
  if (channelId >= DCCL_MAX_CHANNELS) {
    kch_reject();
    return;
  }
  uint32_t g = (uint32_t)DCCL_H_GEN(p);
  dccl_kagg_t* a = &s->kagg;
  if (__builtin_expect(a->gen != g, 0)) kagg_reset(s, g);
  uint64_t bit = 1ull << channelId;
  if (a->started & bit) { /* a second start of one channel */
    kch_reject();
    return;
  }
  kch_begin(ctx, s, channelId, bit, g, pTimer);
  *eHandle = (void*)(uintptr_t)((p & ~(uint64_t)3) | DCCL_H_TAG_KCH | ((uint64_t)channelId << 2)); /* (p never chained) */
}

/* Inlined into each version's startEvent: KernelCh is the most frequent start. */
static inline __attribute__((always_inline)) void start_kch(void** eHandle, void* parentObj, uint8_t channelId,
                                                            uint64_t pTimer) {
  uint64_t p = (uint64_t)(uintptr_t)parentObj;
  if (DCCL_H_TAG(p) != DCCL_H_TAG_SLOT) return; /* NULL (tag 0: a dropped/sampled-out op) or untracked */
  dccl_ctx_t* ctx;
  dccl_slot_t* s = handle_slot_ctx(p, &ctx);
  if (s == NULL || !handle_live(s, p)) {
    kch_reject();
    return;
  }
  start_kch_in(ctx, s, p, eHandle, channelId, pTimer);
}

/* A stopped channel whose pTimers are not both non-zero and in order (start st, stop t): no GPU
   timing (ZERO), and a stop before its start is another kernel's time (SUSPECT). */
static __attribute__((noinline, cold)) void kch_odd_stop(dccl_kagg_t* a, uint64_t st, uint64_t t) {
  if (st == 0 || t == 0) a->flags |= DCCL_KCH_ZERO;
  if (t != 0 && t < st) a->flags |= DCCL_KCH_SUSPECT;
  if (t > a->gmax) a->gmax = t;
  if (st != 0 && st < a->gmin) a->gmin = st;
}

/* KernelChStop of a live handle (handle_live checked by the caller). The aggregate is this
   generation's: its KernelCh start set it, and a later generation's reset could only come from a
   later KernelCh start on this same proxy thread, after the slot moved on (then h is not live). */
static inline void kch_stopped_live(dccl_ctx_t* ctx, dccl_slot_t* s, uint64_t h, uint64_t t) {
  uint32_t ch = DCCL_H_CH(h);
  dccl_kagg_t* a = &s->kagg;
  uint64_t bit = 1ull << ch;
  if (a->stopmask & bit) {
    kch_reject(); /* a second stop of one channel */
    return;
  }
  a->stopmask |= bit;
  uint64_t st = s->kstart[ch];
  /* t <= st - 1 (unsigned) is st == 0, t == 0 or t < st, each a rare case: one test for all three */
  if (__builtin_expect(t <= st - 1, 0)) {
    kch_odd_stop(a, st, t);
  } else {
    if (st < a->gmin) a->gmin = st;
    if (t > a->gmax) a->gmax = t;
  }
  /* a collective's stop advances its channel's order mark (never backwards: a late or suspect stop
     only loosens the guard); a group's sends and receives share channels and may overlap */
  if (s->rec.kind == DCCL_KIND_COLL && t > atomic_load_explicit(&ctx->last_stop[ch], memory_order_relaxed))
    atomic_store_explicit(&ctx->last_stop[ch], t, memory_order_relaxed);
  if (++a->stopped != s->expect_kch) return;
  slot_mark(s, h, DCCL_DONE_KERNELS);
}

/* KernelChStop: the channel's stop pTimer, the order mark, and the count (DCCL_DONE_*). */
static inline void kch_stopped(dccl_ctx_t* ctx, dccl_slot_t* s, uint64_t h, uint64_t t) {
  if (!handle_live(s, h)) kch_reject(); /* late: its operation finished or was reaped */
  else kch_stopped_live(ctx, s, h, t);
}

#endif /* DYNAMICCL_KCH_H_ */
