/* DynamICCL profiler plugin: the process-global state and slot completion (a finished Coll/P2p
 * slot becomes a record on the ring). Called from the hot path (the last stop of an operation)
 * and from the reaper; no allocation, no lock.
 */
#include "net.h"
#include "ring.h"

dccl_global_t dccl_g = {
    .lifecycle = PTHREAD_MUTEX_INITIALIZER,
    .registry = PTHREAD_MUTEX_INITIALIZER,
    .wake_mutex = PTHREAD_MUTEX_INITIALIZER,
    .wake_cond = PTHREAD_COND_INITIALIZER,
};
dccl_ctx_t* _Atomic dccl_ctx_tab[DCCL_MAX_CTX];

/* Build the record, push it, free the slot. The caller won the ctl "finished" bit. Only this
   generation's KernelCh aggregate counts (a stray late child of an earlier occupant never does). */
void dccl_slot_finish(dccl_slot_t* s, int stale) {
  uint32_t gen = (uint32_t)((atomic_load_explicit(&s->ctl, memory_order_acquire) >> 1) & DCCL_H_GEN_MASK);
  (void)atomic_load_explicit(&s->done, memory_order_acquire); /* pairs with the events' RMWs (the reaper's view) */
  dccl_slot_finish_gen(s, gen, stale);
}

/* The hot path's entry (slot_mark): the completing CAS on `done` (acq_rel) already ordered the other
   party's writes, and the caller knows the generation, so neither word is read again here. */
void dccl_slot_finish_gen(dccl_slot_t* s, uint32_t gen, int stale) {
  /* the KernelCh aggregate counts only when it is this generation's (dccl_kagg_t) */
  const dccl_kagg_t* a = &s->kagg;
  int mine = a->gen == gen;
  uint32_t seen = mine ? a->stopped : 0, suspect = mine && (a->flags & DCCL_KCH_SUSPECT);
  uint64_t gmin = mine ? a->gmin : UINT64_MAX, gmax = mine ? a->gmax : 0, sync = mine ? a->sync_ns : 0;
  int all_gpu = !(mine && (a->flags & DCCL_KCH_ZERO));
  s->rec.sync_wait_ns = sync;
  dccl_event_record_t* r = &s->rec;
  r->channels_seen = (uint16_t)seen;
  r->gpu_start_ns = (gmin == UINT64_MAX) ? 0 : gmin;
  r->gpu_end_ns = gmax;
  if (stale) {
    r->timing_source = DCCL_TIMING_NONE;
    r->flags |= DCCL_FLAG_STALE;
    r->cpu_end_ns = 0;
  } else if (s->expect_kch == 0) {
    r->timing_source = DCCL_TIMING_NONE;
    r->cpu_end_ns = 0;
  } else {
    r->cpu_end_ns = dccl_now_ns();
    r->timing_source = (seen >= s->expect_kch && all_gpu) ? DCCL_TIMING_KERNEL_GPU : DCCL_TIMING_KERNEL_CPU;
    if (dccl_g.cfg.span_check && gmin != UINT64_MAX && gmax > gmin && r->cpu_end_ns > r->enqueue_ns &&
        gmax - gmin > r->cpu_end_ns - r->enqueue_ns + DCCL_SPAN_SLACK_NS)
      suspect = 1; /* longer on the GPU than it existed on the host: another kernel's times */
    if (suspect) { /* no latency: the GPU times belong to other kernels and NCCL fired the KernelCh
                      events early, so cpu_end is no completion time either (internal.h) */
      r->timing_source = DCCL_TIMING_NONE;
      r->flags |= DCCL_FLAG_TIMING_SUSPECT;
      atomic_fetch_add_explicit(&dccl_g.timing_suspect, 1, memory_order_relaxed);
    }
  }
  if (dccl_ring_push_inline(&dccl_g.ring, r) != 0)
    atomic_fetch_add_explicit(&dccl_g.records_dropped_ring_full, 1, memory_order_relaxed);
  if (s->net) dccl_net_emit(s); /* its PEER records follow it (per-peer timing opted in) */
  atomic_store_explicit(&s->busy, 0, memory_order_release);
}
