/* Profiler unit tests: the chained profiler (DYNAMICCL_PROFILER_CHAIN; #included by test_plugin.c
   after its helpers and cases_real_paths.c). */

/* libchain-probe.so beside this binary (make builds it there). */
static int probe_path(char* out, size_t len) {
  ssize_t n = readlink("/proc/self/exe", out, len - 32);
  if (n <= 0) return -1;
  out[n] = '\0';
  snprintf(strrchr(out, '/'), 32, "/libchain-probe.so");
  return 0;
}

/* The probe's counter of stops and states received (the probe is loaded by a chained init); *dl is
   its handle, for dlclose. */
typedef uint64_t (*probe_calls_fn)(void);
static probe_calls_fn probe_calls(const char* probe, void** dl) {
  *dl = dlopen(probe, RTLD_NOW | RTLD_NOLOAD);
  return *dl ? (probe_calls_fn)dlsym(*dl, "chain_probe_calls") : NULL;
}

/* A communicator of ours with the probe chained behind it. */
static dccl_ctx_t* init_chained(const char* probe, uint64_t hash) {
  setenv("DYNAMICCL_PROFILER_CHAIN", probe, 1);
  dccl_ctx_t* ctx = init6(hash, 0, 2);
  unsetenv("DYNAMICCL_PROFILER_CHAIN");
  return ctx;
}

/* A one-channel AllReduce started and stopped ("enqueued") on ctx: its handle. */
static void* coll_enqueued(void* ctx, uint64_t seq) {
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, seq, "AllReduce", "ncclFloat32", 1000, 1);
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  ncclProfiler_v6.stopEvent(h);
  return h;
}

/* DYNAMICCL_PROFILER_CHAIN (chain.c, chain.h). NCCL gets our own Coll/KernelCh handles with the
   chained bit, the chained plugin's kept beside our slot: our side still sees its own parents (the
   record completes with GPU timing), and the kept handle outlives our completion (a child still finds
   its parent) until the slot's next operation, after which an earlier handle reaches neither plugin
   and is counted. An untracked parent goes to NCCL as the chained plugin's own handle when that is
   4-byte aligned, and its stop reaches the chained plugin; otherwise a ring entry, which decodes to
   nothing once reused or after finalize. Needs libchain-probe.so beside this binary (make). */
static int test_chain_handles(void) {
  clear_env();
  char probe[4096];
  TEST_ASSERT(probe_path(probe, sizeof probe) == 0, "own path");
  setenv("DYNAMICCL_PROFILER_CHAIN", probe, 1);
  setenv("CHAIN_PROBE_MASK", "2114", 1); /* Coll | KernelCh | KernelLaunch */
  setenv("DYNAMICCL_POOL_SIZE", "1", 1);  /* every operation reuses slot 0 */
  dccl_ctx_t* ctx = init6(0xC4A1, 0, 2);
  unsetenv("DYNAMICCL_PROFILER_CHAIN");
  unsetenv("CHAIN_PROBE_MASK");
  unsetenv("DYNAMICCL_POOL_SIZE");
  TEST_ASSERT(ctx != NULL && ctx->chain != NULL, "chained (log: %s)", g_log);
  void* dl;
  probe_calls_fn calls = probe_calls(probe, &dl);
  TEST_ASSERT(calls != NULL, "the probe's counter");
  TEST_ASSERT(g_mask == (DCCL_DEFAULT_EVENT_MASK | 2114), "NCCL's mask has both plugins' events: %d", g_mask);
  dccl_event_record_t out[4];
  void* h = run_coll(ctx, 7, 4, 0, 1000, 9000);
  uint64_t hv = (uint64_t)(uintptr_t)h;
  TEST_ASSERT(DCCL_H_ROUTE(hv) == (DCCL_H_TAG_SLOT | DCCL_H_CHAINED), "our own handle, chained: %llx",
              (unsigned long long)hv);
  TEST_ASSERT(ring_take(out, 4) == 1, "one record");
  TEST_ASSERT(out[0].timing_source == DCCL_TIMING_KERNEL_GPU && out[0].channels_seen == 4 && out[0].seq_number == 7,
              "our side saw its own parent: timing %u channels %u", out[0].timing_source, out[0].channels_seen);
  uint64_t stale0 = atomic_load(&dccl_g.chain_stale);
  TEST_ASSERT(chain_kept(ctx, ctx->chain, hv) != 0, "the chained plugin's Coll handle outlives our record");
  uint64_t c0 = calls();
  kch_stop(kch_start(ctx, h, 5, 1), 2); /* a late child: ours refuses it, theirs gets its parent */
  TEST_ASSERT(calls() == c0 + 2 && atomic_load(&dccl_g.chain_stale) == stale0, "state and stop forwarded: %llu",
              (unsigned long long)(calls() - c0));
  run_coll(ctx, 8, 1, 0, 1000, 9000); /* slot 0's next operation */
  TEST_ASSERT(ring_take(out, 4) == 1, "its record");
  c0 = calls();
  ncclProfiler_v6.stopEvent(h);
  TEST_ASSERT(atomic_load(&dccl_g.chain_stale) == stale0 + 1 && calls() == c0, "an earlier occupant's: counted, not forwarded");
  TEST_ASSERT(ring_take(out, 4) == 0, "and not ours either");

  static uint32_t theirs[2]; /* a 4-byte-aligned handle of theirs, and one that is not */
  void* aligned = &theirs[0];
  void* odd = (char*)&theirs[1] + 1;
  TEST_ASSERT(chain_handle(ctx, DUMMY_HANDLE, aligned) == aligned, "theirs as it is");
  TEST_ASSERT(chain_handle(ctx, NULL, NULL) == NULL && chain_handle(ctx, DUMMY_HANDLE, NULL) == DUMMY_HANDLE, "ours");
  void* old = chain_handle(ctx, DUMMY_HANDLE, odd);
  TEST_ASSERT(DCCL_H_IS_CHAIN((uint64_t)(uintptr_t)old), "a ring entry for a handle that looks like ours");
  ncclProfilerEventDescr_v6_t g = {.type = ncclProfileGroupApi};
  void* api = NULL;
  ncclProfiler_v6.startEvent(ctx, &api, &g);
  TEST_ASSERT(api != NULL && (DCCL_H_TAG((uint64_t)(uintptr_t)api) == 0 || DCCL_H_IS_CHAIN((uint64_t)(uintptr_t)api)),
              "GroupApi: the probe's handle, or a ring entry");
  c0 = calls();
  ncclProfiler_v6.stopEvent(api);
  TEST_ASSERT(calls() == c0 + 1, "its stop reaches the chained plugin");
  for (uint32_t i = 0; i < DCCL_CHAIN_ENTRIES; i++) chain_put(ctx, DUMMY_HANDLE, odd);
  ncclProfiler_v6.stopEvent(old); /* its entry was reused */
  TEST_ASSERT(atomic_load(&dccl_g.chain_stale) == stale0 + 2, "a reused entry is counted");
  void* live = chain_handle(ctx, DUMMY_HANDLE, odd);
  void* kept = NULL;
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 9, "AllReduce", "ncclFloat32", 1000, 1);
  ncclProfiler_v6.startEvent(ctx, &kept, &d);
  ncclProfiler_v6.finalize(ctx);
  ncclProfiler_v6.stopEvent(live); /* after finalize */
  ncclProfiler_v6.stopEvent(kept);
  TEST_ASSERT(atomic_load(&dccl_g.chain_stale) == stale0 + 4, "stops after finalize are counted");
  if (dl) dlclose(dl);
  clear_env();
  return 0;
}

/* A KernelCh started with another chained communicator's context than its parent Coll's (NCCL passes
   the operation's own context, but a shared proxy must not lose it): ours counts it in the parent's
   slot as it would unchained, the chained plugin gets its parent, and its stop and state reach it. */
static int test_chain_child_under_other_comm(void) {
  clear_env();
  char probe[4096];
  TEST_ASSERT(probe_path(probe, sizeof probe) == 0, "own path");
  dccl_ctx_t* a = init_chained(probe, 0xA11);
  dccl_ctx_t* b = init_chained(probe, 0xB22);
  TEST_ASSERT(a && b && a->chain && b->chain, "both chained (log: %s)", g_log);
  void* dl;
  probe_calls_fn calls = probe_calls(probe, &dl);
  TEST_ASSERT(calls != NULL, "the probe's counter");
  void* h = coll_enqueued(a, 3);
  uint64_t stale0 = atomic_load(&dccl_g.chain_stale), c0 = calls();
  void* k = kch_start(b, h, 0, 100); /* b's context, a's parent */
  TEST_ASSERT(k != NULL && atomic_load(&dccl_g.chain_stale) == stale0, "started: stale %llu",
              (unsigned long long)(atomic_load(&dccl_g.chain_stale) - stale0));
  kch_stop(k, 200);
  TEST_ASSERT(calls() == c0 + 2, "its state and stop reached the chained plugin: %llu", (unsigned long long)(calls() - c0));
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1 && out[0].channels_seen == 1 && out[0].timing_source == DCCL_TIMING_KERNEL_GPU,
              "our record counted the channel: %u", out[0].channels_seen);
  ncclProfiler_v6.finalize(b);
  ncclProfiler_v6.finalize(a);
  if (dl) dlclose(dl);
  clear_env();
  return 0;
}

/* A chained KernelCh: NCCL calls its KernelChStop state and then its stopEvent, back to back on one
   thread (profiler.cc ncclProfilerStopKernelChEvent); the chained plugin gets both at the state (one
   decode of the handle), and the stopEvent that follows forwards nothing more. */
static int test_chain_kch_stop_at_state(void) {
  clear_env();
  char probe[4096];
  TEST_ASSERT(probe_path(probe, sizeof probe) == 0, "own path");
  dccl_ctx_t* ctx = init_chained(probe, 0xC4A2);
  TEST_ASSERT(ctx != NULL && ctx->chain != NULL, "chained (log: %s)", g_log);
  void* dl;
  probe_calls_fn calls = probe_calls(probe, &dl);
  TEST_ASSERT(calls != NULL, "the probe's counter");
  void* k = kch_start(ctx, coll_enqueued(ctx, 4), 0, 100);
  TEST_ASSERT(DCCL_H_ROUTE((uint64_t)(uintptr_t)k) == (DCCL_H_TAG_KCH | DCCL_H_CHAINED), "a kept KernelCh handle");
  uint64_t c0 = calls(), stale0 = atomic_load(&dccl_g.chain_stale);
  ncclProfilerEventStateArgs_v6_t a = {.kernelCh = {.pTimer = 200}};
  ncclProfiler_v6.recordEventState(k, ncclProfilerKernelChStop, &a);
  TEST_ASSERT(calls() == c0 + 2, "state and stop forwarded at the state: %llu", (unsigned long long)(calls() - c0));
  ncclProfiler_v6.stopEvent(k);
  TEST_ASSERT(calls() == c0 + 2 && atomic_load(&dccl_g.chain_stale) == stale0, "the stopEvent forwards nothing more");
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1 && out[0].timing_source == DCCL_TIMING_KERNEL_GPU, "our record");
  ncclProfiler_v6.finalize(ctx);
  if (dl) dlclose(dl);
  clear_env();
  return 0;
}

/* A chained handle whose communicator index now names an unchained communicator (a late event after
   its own communicator's index was reused): counted, never followed into a chained table it has not. */
static int test_chain_handle_of_reused_index(void) {
  clear_env();
  dccl_ctx_t* ctx = init6(0xC4A3, 0, 2);
  TEST_ASSERT(ctx != NULL && ctx->chain == NULL, "unchained");
  uint64_t op = DCCL_H_MAKE(DCCL_H_TAG_SLOT, 0, ctx->index, 0, 1) | DCCL_H_CHAINED;
  uint64_t kch = DCCL_H_MAKE(DCCL_H_TAG_KCH, 3, ctx->index, 0, 1) | DCCL_H_CHAINED;
  uint64_t stale0 = atomic_load(&dccl_g.chain_stale);
  ncclProfilerEventStateArgs_v6_t a = {.kernelCh = {.pTimer = 200}};
  ncclProfiler_v6.stopEvent((void*)(uintptr_t)op);
  ncclProfiler_v6.recordEventState((void*)(uintptr_t)op, ncclProfilerKernelChStop, &a);
  ncclProfiler_v6.recordEventState((void*)(uintptr_t)kch, ncclProfilerKernelChStop, &a);
  TEST_ASSERT(atomic_load(&dccl_g.chain_stale) == stale0 + 3, "each counted: %llu",
              (unsigned long long)(atomic_load(&dccl_g.chain_stale) - stale0));
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

/* Only the event types NCCL would give the chained plugin alone are forwarded (dccl_chain_types):
   with a Coll-only chained plugin, a KernelCh under our chained Coll is ours alone (no chained bit:
   its KernelChStop takes our own path, nothing reaches the chained plugin) and still times our record. */
static int test_chain_forwards_only_its_types(void) {
  TEST_ASSERT(dccl_chain_types(0) == 0, "nothing asked, nothing forwarded");
  uint64_t t = dccl_chain_types(ncclProfileColl);
  TEST_ASSERT((t & (ncclProfileColl | ncclProfileCollApi | ncclProfileGroupApi)) ==
                  (ncclProfileColl | ncclProfileCollApi | ncclProfileGroupApi) &&
                  !(t & (ncclProfileKernelCh | ncclProfileKernelPhase | ncclProfileProxyOp | ncclProfileP2p)),
              "Coll and its parents only: %llx", (unsigned long long)t);
  t = dccl_chain_types(ncclProfileKernelPhase);
  TEST_ASSERT((t & (ncclProfileKernelCh | ncclProfileColl | ncclProfileP2p)) ==
                  (ncclProfileKernelCh | ncclProfileColl | ncclProfileP2p),
              "a KernelPhase's ancestors: %llx", (unsigned long long)t);
  t = dccl_chain_types(ncclProfileNetPlugin);
  TEST_ASSERT((t & (ncclProfileProxyStep | ncclProfileProxyOp)) == (ncclProfileProxyStep | ncclProfileProxyOp) &&
                  !(t & ncclProfileKernelCh), "a NetPlugin's ancestors: %llx", (unsigned long long)t);
  clear_env();
  char probe[4096];
  TEST_ASSERT(probe_path(probe, sizeof probe) == 0, "own path");
  setenv("CHAIN_PROBE_MASK", "2", 1); /* Coll */
  dccl_ctx_t* ctx = init_chained(probe, 0xC4A4);
  unsetenv("CHAIN_PROBE_MASK");
  TEST_ASSERT(ctx != NULL && ctx->chain != NULL, "chained (log: %s)", g_log);
  void* dl;
  probe_calls_fn calls = probe_calls(probe, &dl);
  TEST_ASSERT(calls != NULL, "the probe's counter");
  void* h = coll_enqueued(ctx, 5);
  TEST_ASSERT(DCCL_H_ROUTE((uint64_t)(uintptr_t)h) == (DCCL_H_TAG_SLOT | DCCL_H_CHAINED), "the Coll is chained");
  uint64_t c0 = calls();
  void* k = kch_start(ctx, h, 0, 100);
  TEST_ASSERT(DCCL_H_ROUTE((uint64_t)(uintptr_t)k) == DCCL_H_TAG_KCH, "the KernelCh is ours alone: %llx",
              (unsigned long long)(uintptr_t)k);
  kch_stop(k, 200);
  TEST_ASSERT(calls() == c0, "nothing forwarded: %llu", (unsigned long long)(calls() - c0));
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1 && out[0].timing_source == DCCL_TIMING_KERNEL_GPU && out[0].channels_seen == 1,
              "our record is timed: %u", out[0].timing_source);
  ncclProfiler_v6.finalize(ctx);
  if (dl) dlclose(dl);
  clear_env();
  return 0;
}
