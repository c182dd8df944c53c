/* Profiler unit tests: the paths real NCCL takes (issue 23) and v7 fields (the chained profiler: cases_chain.c)
   (#included by test_plugin.c after its helpers). */
/* ---- real NCCL paths (issue 23) ---- */

static void* p2p_start(void* ctx, const char* func, int peer, uint8_t nch) {
  return p2p_start_typed(ctx, func, "ncclInt8", 4096, peer, nch);
}

/* enqueue.cc addP2pToPlan: nProxyOps = selfSend ? 0 : 2, so a send/recv to self gets no KernelCh
   although nChannels >= 1. Without the fix its slot waits for the reaper and a grouped
   all-to-all fills the pool. */
static int test_self_send_completes(void) {
  clear_env();
  setenv("DYNAMICCL_POOL_SIZE", "8", 1);
  void* ctx = init6(5, 1, 4);
  dccl_stats_record_t st;
  dccl_stats_snapshot(&st);
  uint64_t drops0 = st.events_dropped_pool_full;
  dccl_event_record_t out[64];
  for (int step = 0; step < 40; step++) { /* 5x the pool: every step must free its slots */
    void* s = p2p_start(ctx, "Send", 1, 2);
    void* r = p2p_start(ctx, "Recv", 1, 2);
    TEST_ASSERT(s != NULL && r != NULL, "step %d: pool not exhausted", step);
    ncclProfiler_v6.stopEvent(s);
    ncclProfiler_v6.stopEvent(r);
    TEST_ASSERT(ring_take(out, 64) == 2, "step %d: both self records at stop", step);
    TEST_ASSERT(out[0].timing_source == DCCL_TIMING_NONE && out[0].root == 1 && out[0].n_channels == 2, "fields");
  }
  /* a send to another peer still waits for its children */
  void* o = p2p_start(ctx, "Send", 2, 1);
  ncclProfiler_v6.stopEvent(o);
  TEST_ASSERT(ring_take(out, 64) == 0, "non-self waits for KernelCh");
  kch_stop(kch_start(ctx, o, 0, 10), 20);
  TEST_ASSERT(ring_take(out, 64) == 1 && out[0].timing_source == DCCL_TIMING_KERNEL_GPU, "then completes");
  dccl_stats_snapshot(&st);
  TEST_ASSERT(st.events_dropped_pool_full == drops0, "no drops %llu", (unsigned long long)st.events_dropped_pool_full);
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

/* CollNet Direct/Chain and multi-node NVLS: nChannels = 0 in the Coll descriptor, KernelCh
   children still arrive, after the slot completed and (pool of 1) was given to the next op.
   They must be refused, never lend their timestamps to the next occupant. */
static int test_collnet_zero_channels_late_children(void) {
  clear_env();
  setenv("DYNAMICCL_POOL_SIZE", "1", 1);
  void* ctx = init6(6, 0, 16);
  uint64_t rej0 = atomic_load(&dccl_g.kch_dropped);
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 1, "AllReduce", "ncclFloat32", 1 << 20, 0);
  d.coll.algo = "COLLNET_DIRECT";
  void* a = NULL;
  ncclProfiler_v6.startEvent(ctx, &a, &d);
  TEST_ASSERT(a != NULL, "collnet op");
  ncclProfiler_v6.stopEvent(a);
  dccl_event_record_t out[4];
  TEST_ASSERT(ring_take(out, 4) == 1 && out[0].algo == DCCL_ALGO_COLLNET_DIRECT, "completes at stop");
  TEST_ASSERT(out[0].n_channels == 0 && out[0].timing_source == DCCL_TIMING_NONE, "timing none");
  /* the next op takes the same (only) slot */
  d = coll_descr(NULL, 2, "AllReduce", "ncclFloat32", 1000, 2);
  void* b = NULL;
  ncclProfiler_v6.startEvent(ctx, &b, &d);
  TEST_ASSERT(b != NULL && DCCL_H_SLOT((uintptr_t)b) == DCCL_H_SLOT((uintptr_t)a), "slot reused");
  ncclProfiler_v6.stopEvent(b);
  /* a's children arrive now */
  for (uint8_t c = 0; c < 2; c++) {
    void* k = kch_start(ctx, a, c, 1);
    TEST_ASSERT(k == NULL, "late child of a refused");
  }
  TEST_ASSERT(ring_take(out, 4) == 0, "b not completed by a's children");
  kch_stop(kch_start(ctx, b, 0, 5000), 6000);
  kch_stop(kch_start(ctx, b, 1, 5001), 5999);
  TEST_ASSERT(ring_take(out, 4) == 1 && out[0].seq_number == 2, "b completes with its own children");
  TEST_ASSERT(out[0].gpu_start_ns == 5000 && out[0].gpu_end_ns == 6000 && out[0].channels_seen == 2, "b's timing");
  TEST_ASSERT(atomic_load(&dccl_g.kch_dropped) == rej0 + 2, "late children counted");
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

/* A child started before its op was reaped stops after the slot holds the next op. */
static int test_late_child_after_reap(void) {
  clear_env();
  setenv("DYNAMICCL_POOL_SIZE", "1", 1);
  void* ctx = init6(7, 0, 2);
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 1, "AllGather", "ncclFloat32", 1000, 2);
  void* a = NULL;
  ncclProfiler_v6.startEvent(ctx, &a, &d);
  ncclProfiler_v6.stopEvent(a);
  void* ka = kch_start(ctx, a, 0, 111);
  TEST_ASSERT(ka != NULL, "child of a");
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns(), 10ull * 1000000000ull); /* the reaper's first sight */
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns() + 20ull * 1000000000ull, 10ull * 1000000000ull);
  dccl_event_record_t out[4];
  TEST_ASSERT(ring_take(out, 4) == 1 && (out[0].flags & DCCL_FLAG_STALE), "a reaped");
  d = coll_descr(NULL, 2, "AllGather", "ncclFloat32", 1000, 1);
  void* b = NULL;
  ncclProfiler_v6.startEvent(ctx, &b, &d);
  TEST_ASSERT(b != NULL, "b in the same slot");
  ncclProfiler_v6.stopEvent(b);
  kch_stop(ka, 999999); /* a's child, late */
  TEST_ASSERT(ring_take(out, 4) == 0, "a's late child does not complete b");
  kch_stop(kch_start(ctx, b, 0, 1007000), 1008000); /* b's kernel runs after a's */
  TEST_ASSERT(ring_take(out, 4) == 1 && out[0].seq_number == 2, "b");
  TEST_ASSERT(out[0].gpu_start_ns == 1007000 && out[0].gpu_end_ns == 1008000 && out[0].flags == 0,
              "b's own timestamps %llu..%llu",
              (unsigned long long)out[0].gpu_start_ns, (unsigned long long)out[0].gpu_end_ns);
  ncclProfiler_v6.stopEvent(a); /* a second, late stop of a: no effect */
  TEST_ASSERT(ring_take(out, 4) == 0, "nothing");
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

/* A KernelChStop that passed its liveness check just before its operation was reaped and the slot
   given to the next operation (the reaper runs on the sender thread, the stop on the proxy thread):
   its count and timestamps must stay its own operation's, never complete the next occupant early.
   The window is reproduced by calling the stop's body (kch_stopped_live) after the reuse. */
static int test_stop_in_reap_window(void) {
  clear_env();
  setenv("DYNAMICCL_POOL_SIZE", "1", 1);
  void* ctx = init6(17, 0, 2);
  dccl_slot_t* slot = &((dccl_ctx_t*)ctx)->slots[0];
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 1, "AllReduce", "ncclFloat32", 1000, 2);
  void* a = NULL;
  ncclProfiler_v6.startEvent(ctx, &a, &d);
  ncclProfiler_v6.stopEvent(a);
  void* ka = kch_start(ctx, a, 0, 100);
  TEST_ASSERT(ka != NULL, "child of a");
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns(), 10ull * 1000000000ull);
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns() + 20ull * 1000000000ull, 10ull * 1000000000ull);
  dccl_event_record_t out[4];
  TEST_ASSERT(ring_take(out, 4) == 1 && (out[0].flags & DCCL_FLAG_STALE), "a reaped");
  d = coll_descr(NULL, 2, "AllReduce", "ncclFloat32", 1000, 2);
  void* b = NULL;
  ncclProfiler_v6.startEvent(ctx, &b, &d);
  TEST_ASSERT(b != NULL && DCCL_H_SLOT((uintptr_t)b) == DCCL_H_SLOT((uintptr_t)a), "b in a's slot");
  ncclProfiler_v6.stopEvent(b);
  kch_stopped_live((dccl_ctx_t*)ctx, slot, (uint64_t)(uintptr_t)ka, 200); /* a's stop, in the window */
  kch_stop(kch_start(ctx, b, 0, 5000), 6000);
  TEST_ASSERT(ring_take(out, 4) == 0, "b waits for its second channel (a's stop counted for b)");
  kch_stop(kch_start(ctx, b, 1, 5001), 5999);
  TEST_ASSERT(ring_take(out, 4) == 1 && out[0].seq_number == 2, "b completes with its own children");
  TEST_ASSERT(out[0].channels_seen == 2 && out[0].gpu_start_ns == 5000 && out[0].gpu_end_ns == 6000 &&
                  out[0].timing_source == DCCL_TIMING_KERNEL_GPU,
              "b's own timing: seen %u %llu..%llu", out[0].channels_seen, (unsigned long long)out[0].gpu_start_ns,
              (unsigned long long)out[0].gpu_end_ns);
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

/* NCCL unloads the library when init fails, and again at finalize: after one success, init never
   fails (success with a NULL context: that communicator is not profiled). */
static int test_init_never_fails_after_success(void) {
  clear_env();
  void* a = init6(8, 0, 2);
  TEST_ASSERT(a != NULL, "first init");
  setenv("DYNAMICCL_RING_SIZE", "1000", 1); /* invalid */
  void* b = (void*)1;
  ncclResult_t r = ncclProfiler_v6.init(&b, 9, &g_mask, "c", 1, 2, 1, mock_logger);
  TEST_ASSERT(r == ncclSuccess && b == NULL, "success with NULL context (r=%d)", (int)r);
  TEST_ASSERT(dccl_g.refcount == 1, "not registered");
  void* h = (void*)1;
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 1, "AllReduce", "ncclInt8", 1, 1);
  TEST_ASSERT(ncclProfiler_v6.startEvent(b, &h, &d) == ncclSuccess && h == NULL, "NULL context: no events");
  TEST_ASSERT(ncclProfiler_v6.finalize(b) == ncclSuccess, "finalize NULL");
  ncclProfiler_v6.finalize(a);
  /* a new lifetime (all finalized) still never fails */
  r = ncclProfiler_v6.init(&b, 10, &g_mask, "c", 1, 2, 1, mock_logger);
  TEST_ASSERT(r == ncclSuccess && b == NULL, "later lifetime too");
  clear_env();
  return 0;
}

/* NCCL 2.27-2.30 pass ncclUint8 as "Unknown" (ncclDatatypeToString has no case for it). */
static int test_uint8_bytes(void) {
  clear_env();
  void* ctx = init6(11, 0, 2);
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 1, "AllReduce", "Unknown", 777, 0);
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  ncclProfiler_v6.stopEvent(h);
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1, "record");
  TEST_ASSERT(out[0].bytes == 777 && out[0].datatype == DCCL_DTYPE_NCCLUINT8, "bytes %llu dtype %d",
              (unsigned long long)out[0].bytes, out[0].datatype);
  ncclProfiler_v6.finalize(ctx);
  return 0;
}

/* A split communicator sharing its parent's proxy can deliver KernelCh stops after its own
   finalize; a communicator shorter than one flush must still be announced (COMM record). */
static int test_retired_comm_late_stop_and_announce(void) {
  clear_env();
  void* parent = init6(12, 0, 2);
  void* child = init6(13, 0, 2);
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 1, "AllReduce", "ncclInt8", 64, 2);
  void* h = NULL;
  ncclProfiler_v6.startEvent(child, &h, &d);
  ncclProfiler_v6.stopEvent(h);
  void* k0 = kch_start(child, h, 0, 1);
  void* k1 = kch_start(child, h, 1, 1);
  ncclProfiler_v6.finalize(child); /* reaps h */
  dccl_event_record_t out[4];
  TEST_ASSERT(ring_take(out, 4) == 1 && (out[0].flags & DCCL_FLAG_STALE), "reaped at finalize");
  uint64_t rej0 = atomic_load(&dccl_g.kch_dropped);
  kch_stop(k0, 5); /* late, from the shared proxy: must not touch freed memory (ASan) */
  kch_stop(k1, 5);
  TEST_ASSERT(kch_start(child, h, 0, 1) == NULL, "late start refused");
  TEST_ASSERT(atomic_load(&dccl_g.kch_dropped) >= rej0 + 2, "late stops counted");
  TEST_ASSERT(ring_take(out, 4) == 0, "nothing emitted");
  int retired = 0;
  pthread_mutex_lock(&dccl_g.registry);
  for (dccl_ctx_t* c = dccl_g.ctxs; c; c = c->next) retired += (c == child && c->dead_ms != 0);
  pthread_mutex_unlock(&dccl_g.registry);
  TEST_ASSERT(retired == 1, "kept registered until announced (COMM record)");
  dccl_ctx_t* cc = (dccl_ctx_t*)child;
  retired_sweep(dccl_monotonic_ms() + DCCL_GRAVE_MIN_MS + 10, 0); /* grace over, not yet announced */
  TEST_ASSERT(cc->slots == NULL && cc->pool_size == 0 && cc->dead_ms != 0, "pool freed after the grace, ctx kept");
  kch_stop(k0, 5); /* still harmless */
  retired_sweep(dccl_monotonic_ms() + DCCL_GRAVE_MAX_MS + 10, 0);
  retired = 0;
  pthread_mutex_lock(&dccl_g.registry);
  for (dccl_ctx_t* c = dccl_g.ctxs; c; c = c->next) retired += (c->dead_ms != 0);
  pthread_mutex_unlock(&dccl_g.registry);
  TEST_ASSERT(retired == 0, "never announced: freed after DCCL_GRAVE_MAX_MS");
  dccl_stats_record_t st;
  dccl_stats_snapshot(&st); /* retired counters are not counted twice */
  ncclProfiler_v6.finalize(parent);
  TEST_ASSERT(dccl_g.ctxs == NULL, "all freed at the last finalize");
  return 0;
}

/* Profiler v7 (NCCL 2.31+): userTag and isSymColl reach the record; KernelPhase children of a
   KernelCh are accepted and ignored (NULL handle) without disturbing the record. */
static int test_v7_user_tag_and_symmetric(void) {
  clear_env();
  int mask7 = 0;
  void* ctx = NULL;
  TEST_ASSERT(ncclProfiler_v7.init(&ctx, 0x77, &mask7, "seven", 1, 2, 0, mock_logger) == ncclSuccess, "v7 init");
  ncclProfilerEventDescr_v7_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileColl;
  d.coll.seqNumber = 4;
  d.coll.func = "AllReduce";
  d.coll.datatype = "ncclFloat32";
  d.coll.count = 8;
  d.coll.nChannels = 1;
  d.coll.algo = "RING";
  d.coll.proto = "SIMPLE";
  d.coll.kernelVariant = "sym";
  d.coll.isSymColl = true;
  d.coll.userTag = 0x1234567890ull;
  void* h = NULL;
  ncclProfiler_v7.startEvent(ctx, &h, &d);
  ncclProfiler_v7.stopEvent(h);
  memset(&d, 0, sizeof d);
  d.type = ncclProfileKernelCh;
  d.parentObj = h;
  d.kernelCh.pTimer = 100;
  void* k = NULL;
  ncclProfiler_v7.startEvent(ctx, &k, &d);
  TEST_ASSERT(k != NULL, "kernelCh");
  memset(&d, 0, sizeof d);
  d.type = ncclProfileKernelPhase;
  d.parentObj = k;
  d.kernelPhase.phaseId = 0;
  d.kernelPhase.phaseName = "initial_sync";
  d.kernelPhase.pTimer = 101;
  void* ph = NULL;
  ncclProfiler_v7.startEvent(ctx, &ph, &d);
  TEST_ASSERT(ph != NULL && ph != k, "initial_sync phase tracked");
  ncclProfilerEventStateArgs_v7_t a = {.kernelCh = {.pTimer = 150}};
  ncclProfiler_v7.recordEventState(ph, ncclProfilerKernelPhaseStop, &a);
  ncclProfiler_v7.stopEvent(ph); /* the phase's stop is not the channel's */
  d.kernelPhase.phaseId = 1; /* compute: not kept */
  d.kernelPhase.pTimer = 150;
  void* ph1 = (void*)1;
  ncclProfiler_v7.startEvent(ctx, &ph1, &d);
  TEST_ASSERT(ph1 == NULL, "compute phase not tracked");
  a.kernelCh.pTimer = 170;
  ncclProfiler_v7.recordEventState(k, ncclProfilerKernelPhaseStop, &a); /* on the KernelCh handle: ignored */
  dccl_event_record_t none[1];
  TEST_ASSERT(ring_take(none, 1) == 0, "not complete before the KernelCh stop");
  a.kernelCh.pTimer = 200;
  ncclProfiler_v7.recordEventState(k, ncclProfilerKernelChStop, &a);
  ncclProfiler_v7.stopEvent(k);
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1, "record");
  TEST_ASSERT(out[0].user_tag == 0x1234567890ull && (out[0].flags & DCCL_FLAG_SYMMETRIC), "tag %llx flags %u",
              (unsigned long long)out[0].user_tag, out[0].flags);
  TEST_ASSERT(out[0].kernel_variant == variant_hash("sym") && out[0].kernel_variant != 0, "kernel variant %u",
              out[0].kernel_variant);
  TEST_ASSERT(out[0].gpu_start_ns == 100 && out[0].gpu_end_ns == 200, "timing");
  TEST_ASSERT(out[0].sync_wait_ns == 49, "initial_sync 101..150: %llu", (unsigned long long)out[0].sync_wait_ns);
  memset(&d, 0, sizeof d); /* P2p tag */
  d.type = ncclProfileP2p;
  d.p2p.func = "Send";
  d.p2p.datatype = "ncclInt8";
  d.p2p.count = 1;
  d.p2p.peer = 0; /* self: completes at stop */
  d.p2p.nChannels = 1;
  d.p2p.userTag = 42;
  h = NULL;
  ncclProfiler_v7.startEvent(ctx, &h, &d);
  ncclProfiler_v7.stopEvent(h);
  TEST_ASSERT(ring_take(out, 2) == 1 && out[0].user_tag == 42 && out[0].flags == 0, "p2p tag");
  ncclProfiler_v7.finalize(ctx);
  return 0;
}

/* Copy-engine collectives (v6+) have no Coll event: with CeColl in the mask they are counted. */
static int test_ce_collective_counted(void) {
  clear_env();
  setenv("DYNAMICCL_EVENT_MASK", "4166", 1); /* Coll|P2p|KernelCh|CeColl */
  void* ctx = init6(21, 0, 8);
  ncclProfilerEventDescr_v6_t d = {
      .type = ncclProfileCeColl,
      .ceColl = {.seqNumber = 9, .func = "AllGather", .datatype = "ncclBfloat16", .count = 1000, .root = -1}};
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  TEST_ASSERT(h != NULL, "CeColl handle");
  memset(&d, 0, sizeof d);
  d.type = ncclProfileCeSync;
  d.parentObj = h;
  void* sync = (void*)1;
  ncclProfiler_v6.startEvent(ctx, &sync, &d);
  TEST_ASSERT(sync == NULL, "CeSync not tracked");
  ncclProfiler_v6.stopEvent(h);
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1, "record at stop");
  TEST_ASSERT(out[0].kind == DCCL_KIND_COLL && out[0].func == DCCL_FUNC_ALLGATHER && out[0].bytes == 2000 &&
                  out[0].seq_number == 9 && out[0].flags == DCCL_FLAG_COPY_ENGINE &&
                  out[0].timing_source == DCCL_TIMING_NONE && out[0].algo == DCCL_UNKNOWN,
              "CE record fields");
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

/* Coverage: CollApi calls without a Coll/CeColl event are counted in STATS, for a live
   communicator and after its finalize (folded into the process counter). */
static int test_coverage_counted(void) {
  clear_env();
  setenv("DYNAMICCL_EVENT_MASK", "4166", 1); /* Coll|P2p|KernelCh|CeColl */
  dccl_stats_record_t st;
  dynamicclProfilerStats(&st);
  uint64_t before = st.colls_without_event;
  void* ctx = init6(23, 0, 8);
  ncclProfilerEventDescr_v6_t api;
  memset(&api, 0, sizeof api);
  api.type = ncclProfileCollApi;
  for (int i = 0; i < 3; i++) {
    void* h = NULL;
    ncclProfiler_v6.startEvent(ctx, &h, &api);
    TEST_ASSERT(h != NULL, "CollApi gets a dummy handle");
    ncclProfiler_v6.stopEvent(h);
  }
  run_coll(ctx, 1, 2, 0, 100, 200); /* call 1: a Coll event */
  ncclProfilerEventDescr_v6_t ce;
  memset(&ce, 0, sizeof ce);
  ce.type = ncclProfileCeColl;
  ce.ceColl.func = "AllGather";
  ce.ceColl.datatype = "ncclFloat32";
  ce.ceColl.count = 10;
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &ce); /* call 2: a CeColl event */
  ncclProfiler_v6.stopEvent(h);
  dynamicclProfilerStats(&st);
  TEST_ASSERT(st.colls_without_event == before + 1, "live: 3 calls, 2 events");
  ncclProfiler_v6.finalize(ctx);
  dynamicclProfilerStats(&st);
  TEST_ASSERT(st.colls_without_event == before + 1, "kept after finalize");
  clear_env();
  return 0;
}

/* NCCL 2.28 after a send/recv to self: KernelCh pTimers of older kernels. A start before the
   channel's last collective stop, or a stop before its start, gives NONE + TIMING_SUSPECT;
   in-order records, other communicators and overlapping sends/receives are left alone. */
static int test_kch_order_guard(void) {
  clear_env();
  void* ctx = init6(0x51, 0, 4);
  void* other = init6(0x52, 0, 4);
  const uint64_t T = 1000000000ull, gap = 100000, span = 30000;
  dccl_event_record_t out[8];
  for (uint64_t i = 0; i < 4; i++) run_coll(ctx, i, 4, 0, T + i * gap, T + i * gap + span);
  TEST_ASSERT(ring_take(out, 8) == 4, "four in-order records");
  for (int i = 0; i < 4; i++)
    TEST_ASSERT(out[i].timing_source == DCCL_TIMING_KERNEL_GPU && out[i].flags == 0 &&
                    out[i].gpu_start_ns == T + (uint64_t)i * gap && out[i].gpu_end_ns == T + (uint64_t)i * gap + span,
                "in order %d: timing %d flags %d", i, out[i].timing_source, out[i].flags);
  /* overlapping sends of one group (same channels) never trip it: P2P stops do not advance it */
  run_p2p(ctx, "Send", 1, T + 4 * gap, T + 4 * gap + span);
  run_p2p(ctx, "Send", 1, T + 4 * gap + 10, T + 4 * gap + span / 2);
  /* divergence: start of the kernel 3 back, stop of the one before */
  run_coll(ctx, 4, 4, 0, T + 1 * gap, T + 3 * gap + span);
  run_p2p(ctx, "Send", 1, T + 2 * gap, T + 3 * gap);            /* a send after it, also stale */
  run_coll(ctx, 5, 4, 1, T + 9 * gap, T + 9 * gap - 5); /* stops before it starts */
  run_coll(other, 0, 4, 0, T, T + span);             /* another communicator: its own order */
  TEST_ASSERT(ring_take(out, 8) == 6, "six records");
  TEST_ASSERT(out[0].flags == 0 && out[1].flags == 0 && out[0].timing_source == DCCL_TIMING_KERNEL_GPU &&
                  out[1].timing_source == DCCL_TIMING_KERNEL_GPU, "overlapping p2p not flagged");
  for (int i = 2; i < 5; i++)
    TEST_ASSERT(out[i].timing_source == DCCL_TIMING_NONE && out[i].flags == DCCL_FLAG_TIMING_SUSPECT &&
                    out[i].cpu_end_ns >= out[i].enqueue_ns,
                "suspect %d (kind %d): timing %d flags %d", i, out[i].kind, out[i].timing_source, out[i].flags);
  TEST_ASSERT(out[2].gpu_start_ns == T + gap && out[2].gpu_end_ns == T + 3 * gap + span, "pTimers kept as seen");
  TEST_ASSERT(out[5].comm_hash == 0x52 && out[5].flags == 0 && out[5].timing_source == DCCL_TIMING_KERNEL_GPU,
              "other comm unaffected");
  dccl_stats_record_t st;
  dccl_stats_snapshot(&st);
  TEST_ASSERT(st.kernel_ch_timing_suspect == 3, "STATS counter %llu", (unsigned long long)st.kernel_ch_timing_suspect);
  ncclProfiler_v6.finalize(other);
  ncclProfiler_v6.finalize(ctx);
  atomic_store(&dccl_g.timing_suspect, 0);
  return 0;
}

/* A KernelCh span longer than the operation existed on the host (enqueue to last KernelCh stop, + 20 us)
   is another kernel's times: NONE + TIMING_SUSPECT. Spans within the slack stay GPU-timed. */
static int test_span_check_guard(void) {
  clear_env();
  setenv("DYNAMICCL_SPAN_CHECK", "1", 1);
  void* ctx = init6(0x53, 0, 4);
  const uint64_t T = 1000000000ull;
  dccl_event_record_t out[4];
  run_coll(ctx, 0, 4, 0, T, T + 5000);                  /* 5 us: within the slack of any host interval */
  run_coll(ctx, 1, 4, 0, T + 100000, T + 100000 + 50000000ull); /* 50 ms on the GPU, microseconds on the host */
  TEST_ASSERT(ring_take(out, 4) == 2, "two records");
  TEST_ASSERT(out[0].timing_source == DCCL_TIMING_KERNEL_GPU && out[0].flags == 0, "short span kept: %d %d",
              out[0].timing_source, out[0].flags);
  TEST_ASSERT(out[1].timing_source == DCCL_TIMING_NONE && out[1].flags == DCCL_FLAG_TIMING_SUSPECT &&
                  out[1].gpu_end_ns - out[1].gpu_start_ns == 50000000ull,
              "long span refused: timing %d flags %d", out[1].timing_source, out[1].flags);
  ncclProfiler_v6.finalize(ctx);
  atomic_store(&dccl_g.timing_suspect, 0);
  clear_env();
  return 0;
}

/* v7 kernelVariant: a hash of the name, the same for the same name wherever it lives; two names that
   share a cache entry (pointers 64 bytes apart) each keep their own hash. */
static int test_kernel_variant_hash(void) {
  static char names[128] __attribute__((aligned(64)));
  snprintf(names, 64, "sym");
  snprintf(names + 64, 64, "default");
  char copy[8] = "sym";
  uint32_t fnv = 2166136261u;
  for (const char* c = "sym"; *c; c++) fnv = (fnv ^ (uint8_t)*c) * 16777619u;
  TEST_ASSERT(variant_hash(NULL) == 0, "none");
  for (int round = 0; round < 3; round++) { /* miss, hit, and after the other name took the entry */
    TEST_ASSERT(variant_hash(names) == fnv, "sym: %u", variant_hash(names));
    TEST_ASSERT(variant_hash(names + 64) != fnv && variant_hash(names + 64) != 0, "default");
    TEST_ASSERT(variant_hash(copy) == fnv, "another copy of the name");
  }
  return 0;
}
