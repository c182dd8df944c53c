/* DynamICCL NCCL profiler plugin: the record ring between the hot path (producers: whichever
 * NCCL thread finishes an operation) and the sender thread (its only consumer).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* CLOCK_MONOTONIC_COARSE (internal.h) */
#endif
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "ring.h"

/* record_seq base: ring pushes of earlier plugin lifetimes (all comms finalized, then a new init). */
uint64_t dccl_seq_base;

/* ------------------------------------------------------------------------------------------ */
/* Ring: Vyukov bounded MPMC queue; the sender thread is the only consumer.                    */

int dccl_ring_init(dccl_ring_t* r, uint32_t size) {
  memset(r, 0, sizeof *r);
  r->seq = aligned_alloc(64, ((size_t)size * sizeof(uint64_t) + 63) & ~(size_t)63);
  r->recs = aligned_alloc(64, (size_t)size * sizeof(dccl_event_record_t));
  if (r->seq == NULL || r->recs == NULL) {
    free(r->seq);
    free(r->recs);
    r->seq = NULL;
    r->recs = NULL;
    return -1;
  }
  for (uint64_t i = 0; i < size; i++) atomic_init(&r->seq[i], i);
  memset(r->recs, 0, (size_t)size * sizeof(dccl_event_record_t)); /* touch every page now, not on the hot path */
  r->mask = size - 1;
  atomic_init(&r->enqueue_pos, 0);
  r->dequeue_pos = 0;
  return 0;
}

void dccl_ring_free(dccl_ring_t* r) {
  free(r->seq);
  free(r->recs);
  r->seq = NULL;
  r->recs = NULL;
}

int dccl_ring_push(dccl_ring_t* r, const dccl_event_record_t* rec) { return dccl_ring_push_inline(r, rec); }

uint32_t dccl_ring_pop(dccl_ring_t* r, dccl_event_record_t* out, uint32_t max) {
  uint32_t n = 0;
  uint64_t pos = r->dequeue_pos;
  while (n < max) {
    uint64_t s = atomic_load_explicit(&r->seq[pos & r->mask], memory_order_acquire);
    if (s != pos + 1) break; /* empty, or the producer has not finished writing this cell */
    memcpy(&out[n++], &r->recs[pos & r->mask], sizeof *out);
    atomic_store_explicit(&r->seq[pos & r->mask], pos + r->mask + 1, memory_order_release);
    pos++;
  }
  r->dequeue_pos = pos;
  return n;
}
