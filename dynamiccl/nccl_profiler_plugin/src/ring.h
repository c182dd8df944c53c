/* DynamICCL profiler plugin: the ring push, inline for the completion path (finish.c); ring.c has
 * the ring's other functions and dccl_ring_push, the same push out of line.
 */
#ifndef DYNAMICCL_RING_H_
#define DYNAMICCL_RING_H_

#include <string.h>

#include "internal.h"

/* Copies *rec into the ring, setting rec->record_seq. Returns 0, or -1 if full. */
static inline int dccl_ring_push_inline(dccl_ring_t* r, const dccl_event_record_t* rec) {
  uint64_t pos = atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
  for (;;) {
    uint64_t s = atomic_load_explicit(&r->seq[pos & r->mask], memory_order_acquire);
    int64_t diff = (int64_t)(s - pos);
    if (diff == 0) {
      if (atomic_compare_exchange_weak_explicit(&r->enqueue_pos, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed))
        break;
    } else if (diff < 0) {
      return -1; /* full */
    } else {
      pos = atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
    }
  }
  dccl_event_record_t* dst = &r->recs[pos & r->mask];
  memcpy(dst, rec, sizeof *dst);
  dst->record_seq = dccl_seq_base + pos + 1;
  atomic_store_explicit(&r->seq[pos & r->mask], pos + 1, memory_order_release);
  return 0;
}

#endif /* DYNAMICCL_RING_H_ */
