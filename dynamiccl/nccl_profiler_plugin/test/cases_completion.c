/* Profiler unit tests: the completion rule (internal.h, DCCL_DONE_*). #included by test_plugin.c. */

/* A mark is taken only for the generation it names; a word the reaper claimed is finished by the
   reaper alone, and the events' marks that complete it later emit nothing. */
static int test_completion_marks_generation(void) {
  clear_env();
  setenv("DYNAMICCL_POOL_SIZE", "1", 1); /* every operation reuses slot 0 */
  void* ctx = init6(0x5107, 0, 2);
  unsetenv("DYNAMICCL_POOL_SIZE");
  TEST_ASSERT(ctx != NULL, "init: %s", g_log);
  dccl_event_record_t out[4];
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 1, "AllReduce", "ncclFloat32", 1000, 1);
  void* a = NULL;
  ncclProfiler_v6.startEvent(ctx, &a, &d);
  dccl_slot_t* s = handle_slot((uint64_t)(uintptr_t)a);
  TEST_ASSERT(s != NULL, "slot");
  /* the Coll stop of the slot's previous occupant, arriving after this one started */
  uint64_t prev = (uint64_t)(uintptr_t)a - (1ull << 40);
  slot_mark(s, prev, DCCL_DONE_STOPPED);
  TEST_ASSERT(!(atomic_load(&s->done) & DCCL_DONE_STOPPED), "a mark for another generation is refused");
  ncclProfiler_v6.stopEvent(a);
  TEST_ASSERT(atomic_load(&s->done) & DCCL_DONE_STOPPED, "its own stop marks it");
  kch_stop(kch_start(ctx, a, 0, 100), 200);
  TEST_ASSERT(ring_take(out, 4) == 1 && out[0].flags == 0 && out[0].channels_seen == 1, "completed once");

  /* the reaper claims the next operation, then its events complete it: one record, the reaper's */
  uint64_t stale0 = atomic_load(&dccl_g.events_stale);
  void* b = NULL;
  d.coll.seqNumber = 2;
  ncclProfiler_v6.startEvent(ctx, &b, &d);
  TEST_ASSERT(reap_claim(s, atomic_load(&s->ctl)), "the reaper's claim on an incomplete operation");
  TEST_ASSERT(!reap_claim(s, atomic_load(&s->ctl)), "claimed once");
  ncclProfiler_v6.stopEvent(b);
  kch_stop(kch_start(ctx, b, 0, 300), 400);
  TEST_ASSERT(ring_take(out, 4) == 0, "the events do not finish a claimed operation");
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns(), 0); /* finalize's reap: the claim is held, nothing else happens */
  TEST_ASSERT(ring_take(out, 4) == 0, "no second finisher");
  atomic_store(&s->ctl, atomic_load(&s->ctl) | 1); /* the rest of the reaper's step (dccl_reap_ctx_at) */
  dccl_slot_finish(s, 1);
  TEST_ASSERT(ring_take(out, 4) == 1 && (out[0].flags & DCCL_FLAG_STALE) && out[0].seq_number == 2, "reaper's record");

  /* an operation completed by its events is refused to the reaper */
  void* c = NULL;
  d.coll.seqNumber = 3;
  ncclProfiler_v6.startEvent(ctx, &c, &d);
  uint64_t ctl_c = atomic_load(&s->ctl);
  ncclProfiler_v6.stopEvent(c);
  kch_stop(kch_start(ctx, c, 0, 500), 600);
  TEST_ASSERT(!reap_claim(s, ctl_c), "complete: not the reaper's");
  TEST_ASSERT(ring_take(out, 4) == 1 && out[0].flags == 0 && out[0].seq_number == 3, "events' record");
  TEST_ASSERT(atomic_load(&dccl_g.events_stale) == stale0, "no stale count from the claims above");
  ncclProfiler_v6.finalize(ctx);
  return 0;
}
