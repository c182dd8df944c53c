/* Profiler unit tests: the shared ring and the plugin's lifetime across communicators
   (#included by test_plugin.c after its helpers). */

static int test_ring_full_counted(void) {
  clear_env();
  setenv("DYNAMICCL_RING_SIZE", "4", 1);
  void* ctx = init6(1, 0, 2);
  uint64_t before = atomic_load(&dccl_g.records_dropped_ring_full);
  for (int i = 0; i < 6; i++) run_coll(ctx, (uint64_t)i, 1, 0, 1, 2);
  TEST_ASSERT(atomic_load(&dccl_g.records_dropped_ring_full) == before + 2, "2 ring-full drops");
  dccl_event_record_t out[8];
  TEST_ASSERT(ring_take(out, 8) == 4, "4 kept");
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

static int test_two_comms_refcount(void) {
  clear_env();
  void* a = init6(1, 0, 2);
  void* b = init6(2, 1, 2);
  TEST_ASSERT(a && b && dccl_g.refcount == 2, "two comms");
  run_coll(a, 1, 1, 0, 1, 2);
  run_coll(b, 1, 1, 0, 1, 2);
  dccl_event_record_t out[4];
  TEST_ASSERT(ring_take(out, 4) == 2 && out[0].comm_hash != out[1].comm_hash, "per comm");
  ncclProfiler_v6.finalize(a);
  TEST_ASSERT(dccl_g.refcount == 1 && dccl_g.ring.seq != NULL, "ring alive");
  ncclProfiler_v6.finalize(b);
  TEST_ASSERT(dccl_g.refcount == 0 && dccl_g.ring.seq == NULL, "ring freed");
  return 0;
}
