/* Profiler unit tests: configuration, the event hot path, pools, threads (#included by
   test_plugin.c after its helpers). */
/* ------------------------------------------------------------------------------------------ */

static const char* fake_env_vals[16][2];
static const char* fake_get(const char* name) {
  for (int i = 0; i < 16 && fake_env_vals[i][0]; i++)
    if (strcmp(fake_env_vals[i][0], name) == 0) return fake_env_vals[i][1];
  return NULL;
}
static int parse_one(const char* name, const char* value, dccl_config_t* cfg, char* err) {
  memset(fake_env_vals, 0, sizeof fake_env_vals);
  fake_env_vals[0][0] = name;
  fake_env_vals[0][1] = value;
  return dccl_config_parse(cfg, fake_get, err, 256);
}

static int test_config_defaults(void) {
  dccl_config_t cfg;
  char err[256];
  memset(fake_env_vals, 0, sizeof fake_env_vals);
  TEST_ASSERT(dccl_config_parse(&cfg, fake_get, err, sizeof err) == 0, "%s", err);
  TEST_ASSERT(strcmp(cfg.collector, "unix:/tmp/dynamiccl.sock") == 0, "%s", cfg.collector);
  TEST_ASSERT(cfg.event_mask == 70, "%d", cfg.event_mask);
  TEST_ASSERT(cfg.pool_size == 1024 && cfg.ring_size == 65536 && cfg.min_bytes == 0 && cfg.sample == 1, "defaults");
  TEST_ASSERT(cfg.flush_ms == 100 && cfg.stale_ms == 10000, "timing defaults");
  TEST_ASSERT(cfg.stale_guard_us == 100, "stale-timestamp guard tolerance %u", cfg.stale_guard_us);
  return 0;
}

static int test_config_invalid(void) {
  dccl_config_t cfg;
  char err[256];
  struct { const char *name, *value; int ok; } cases[] = {
      {"DYNAMICCL_RING_SIZE", "1000", 0},        {"DYNAMICCL_RING_SIZE", "1024", 1},
      {"DYNAMICCL_POOL_SIZE", "0", 0},           {"DYNAMICCL_POOL_SIZE", "-5", 0},
      {"DYNAMICCL_POOL_SIZE", "12abc", 0},       {"DYNAMICCL_SAMPLE", "0", 0},
      {"DYNAMICCL_SAMPLE", "16", 1},             {"DYNAMICCL_EVENT_MASK", "0x46", 1},
      {"DYNAMICCL_EVENT_MASK", "99999", 0},      {"DYNAMICCL_FLUSH_MS", "0", 0},
      {"DYNAMICCL_COLLECTOR", "udp:x:1", 0},     {"DYNAMICCL_COLLECTOR", "tcp:host", 0},
      {"DYNAMICCL_COLLECTOR", "tcp:host:0", 0},  {"DYNAMICCL_COLLECTOR", "tcp:127.0.0.1:9000", 1},
      {"DYNAMICCL_COLLECTOR", "unix:", 0},       {"DYNAMICCL_MIN_BYTES", "18446744073709551615", 1},
      {"DYNAMICCL_MIN_BYTES", "18446744073709551616", 0}, {"DYNAMICCL_STALE_MS", " 250 ", 1},
      {"DYNAMICCL_EVENT_MASK", "32838", 1},      {"DYNAMICCL_EVENT_MASK", "65536", 0},
      {"DYNAMICCL_STALE_GUARD_US", "0", 1},      {"DYNAMICCL_STALE_GUARD_US", "1000001", 0},
      {"DYNAMICCL_STALE_GUARD_US", "-1", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    err[0] = '\0';
    int rc = parse_one(cases[i].name, cases[i].value, &cfg, err);
    TEST_ASSERT((rc == 0) == cases[i].ok, "%s=%s rc=%d err=%s", cases[i].name, cases[i].value, rc, err);
    if (!cases[i].ok) TEST_ASSERT(strstr(err, cases[i].name) != NULL, "message names the variable: %s", err);
  }
  TEST_ASSERT(parse_one("DYNAMICCL_EVENT_MASK", "0x46", &cfg, err) == 0 && cfg.event_mask == 0x46, "hex mask");
  return 0;
}

static int test_init_invalid_env_fails(void) {
  clear_env();
  setenv("DYNAMICCL_RING_SIZE", "1000", 1);
  void* ctx = (void*)1;
  ncclResult_t r = ncclProfiler_v6.init(&ctx, 1, &g_mask, "c", 1, 1, 0, mock_logger);
  TEST_ASSERT(r != ncclSuccess, "init must fail");
  TEST_ASSERT(ctx == NULL, "no context on failure");
  TEST_ASSERT(g_warns == 1 && strstr(g_log, "DYNAMICCL_RING_SIZE") != NULL, "message: %s", g_log);
  TEST_ASSERT(dccl_g.refcount == 0, "no comm registered");
  clear_env();
  return 0;
}

static int test_string_mapping(void) {
  TEST_ASSERT(MAP_FUNC("AllReduce") == DCCL_FUNC_ALLREDUCE, "AllReduce");
  TEST_ASSERT(MAP_FUNC("AllReduce") == DCCL_FUNC_ALLREDUCE, "cached AllReduce");
  TEST_ASSERT(MAP_FUNC("Send") == DCCL_FUNC_SEND, "Send");
  TEST_ASSERT(MAP_FUNC("SendRecv") == DCCL_FUNC_SENDRECV, "SendRecv");
  TEST_ASSERT(MAP_FUNC("Bogus") == DCCL_UNKNOWN, "unknown func");
  TEST_ASSERT(MAP_FUNC(NULL) == DCCL_UNKNOWN, "NULL func");
  TEST_ASSERT(MAP_DTYPE("ncclBfloat16") == DCCL_DTYPE_NCCLBFLOAT16, "bf16");
  TEST_ASSERT(MAP_ALGO("NVLS_TREE") == DCCL_ALGO_NVLS_TREE, "NVLS_TREE");
  TEST_ASSERT(MAP_ALGO("NVLS") == DCCL_ALGO_NVLS, "NVLS");
  TEST_ASSERT(MAP_PROTO("SIMPLE") == DCCL_PROTO_SIMPLE, "SIMPLE");
  /* same text at a different address maps the same */
  char buf[16];
  strcpy(buf, "LL128");
  TEST_ASSERT(MAP_PROTO(buf) == DCCL_PROTO_LL128, "copy of LL128");
  return 0;
}

static int test_ring_wraps_and_fills(void) {
  dccl_ring_t r;
  TEST_ASSERT(dccl_ring_init(&r, 4) == 0, "init");
  dccl_event_record_t rec, out[8];
  memset(&rec, 0, sizeof rec);
  uint64_t base = dccl_seq_base;
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 4; i++) {
      rec.seq_number = (uint64_t)(round * 4 + i);
      TEST_ASSERT(dccl_ring_push(&r, &rec) == 0, "push %d", i);
    }
    TEST_ASSERT(dccl_ring_push(&r, &rec) == -1, "full");
    TEST_ASSERT(dccl_ring_pop(&r, out, 8) == 4, "pop 4");
    for (int i = 0; i < 4; i++) {
      TEST_ASSERT(out[i].seq_number == (uint64_t)(round * 4 + i), "order");
      TEST_ASSERT(out[i].record_seq == base + (uint64_t)(round * 4 + i) + 1, "record_seq %llu",
                  (unsigned long long)out[i].record_seq);
    }
    TEST_ASSERT(dccl_ring_pop(&r, out, 8) == 0, "empty");
  }
  dccl_ring_free(&r);
  return 0;
}

static int test_coll_kernel_gpu_timing(void) {
  clear_env();
  void* ctx = init6(0xabcdef0123456789ull, 2, 8);
  TEST_ASSERT(ctx != NULL, "init: %s", g_log);
  TEST_ASSERT(g_mask == 70, "mask written: %d", g_mask);
  for (int order = 0; order < 2; order++) {
    uint64_t t0 = 1000000 + (uint64_t)order * 100000, t1 = t0 + 5000;
    run_coll(ctx, 41 + (uint64_t)order, 8, order, t0, t1);
    dccl_event_record_t out[4];
    TEST_ASSERT(ring_take(out, 4) == 1, "exactly one record (order %d)", order);
    dccl_event_record_t* r = &out[0];
    TEST_ASSERT(r->kind == DCCL_KIND_COLL && r->func == DCCL_FUNC_ALLREDUCE, "kind/func");
    TEST_ASSERT(r->datatype == DCCL_DTYPE_NCCLFLOAT32 && r->algo == DCCL_ALGO_RING && r->proto == DCCL_PROTO_LL128,
                "dtype/algo/proto");
    TEST_ASSERT(r->count == 1000 && r->bytes == 4000, "bytes %llu", (unsigned long long)r->bytes);
    TEST_ASSERT(r->n_channels == 8 && r->n_warps == 16 && r->channels_seen == 8, "channels");
    TEST_ASSERT(r->rank == 2 && r->nranks == 8 && r->nnodes == 2 && r->root == 3, "rank fields");
    TEST_ASSERT(r->comm_hash == 0xabcdef0123456789ull && r->seq_number == 41 + (uint64_t)order, "hash/seq");
    TEST_ASSERT(r->pid == (uint32_t)getpid(), "pid");
    TEST_ASSERT(r->gpu_start_ns == t0 && r->gpu_end_ns == t1, "gpu %llu..%llu", (unsigned long long)r->gpu_start_ns,
                (unsigned long long)r->gpu_end_ns);
    TEST_ASSERT(r->timing_source == DCCL_TIMING_KERNEL_GPU, "timing %d", r->timing_source);
    TEST_ASSERT(r->enqueue_ns > 1600000000000000000ull && r->cpu_end_ns >= r->enqueue_ns, "cpu times");
    TEST_ASSERT(r->flags == 0 && r->tuner_config_version == 0, "flags");
  }
  ncclProfiler_v6.finalize(ctx);
  TEST_ASSERT(dccl_g.refcount == 0, "refcount");
  return 0;
}

static int test_kernel_cpu_only(void) {
  clear_env();
  void* ctx = init6(1, 0, 2);
  run_coll(ctx, 0, 4, 0, 0, 0); /* pTimers 0 */
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1, "one record");
  TEST_ASSERT(out[0].timing_source == DCCL_TIMING_KERNEL_CPU && out[0].cpu_end_ns >= out[0].enqueue_ns, "cpu timing");
  TEST_ASSERT(out[0].gpu_start_ns == 0 && out[0].gpu_end_ns == 0 && out[0].channels_seen == 4, "no gpu");
  ncclProfiler_v6.finalize(ctx);
  return 0;
}

static int test_kernelch_disabled(void) {
  clear_env();
  setenv("DYNAMICCL_EVENT_MASK", "6", 1); /* Coll|P2p */
  void* ctx = init6(1, 0, 2);
  TEST_ASSERT(g_mask == 6, "mask");
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 5, "Broadcast", "ncclInt8", 10, 2);
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  TEST_ASSERT(h != NULL, "handle");
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 0, "nothing before stop");
  ncclProfiler_v6.stopEvent(h);
  TEST_ASSERT(ring_take(out, 2) == 1, "emitted at stop");
  TEST_ASSERT(out[0].timing_source == DCCL_TIMING_NONE && out[0].cpu_end_ns == 0 && out[0].bytes == 10, "none");
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

static int test_null_and_foreign_parents(void) {
  clear_env();
  void* ctx = init6(1, 0, 2);
  /* Coll with NULL parent: recorded normally */
  run_coll(ctx, 7, 2, 0, 100, 200);
  dccl_event_record_t out[4];
  TEST_ASSERT(ring_take(out, 4) == 1, "coll with NULL parent recorded");
  /* KernelCh with NULL parent, dummy parent (an API event) */
  void* k = kch_start(ctx, NULL, 0, 5);
  TEST_ASSERT(k == NULL, "NULL parent -> NULL handle");
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileCollApi;
  void* api = NULL;
  ncclProfiler_v6.startEvent(ctx, &api, &d);
  TEST_ASSERT(api != NULL, "API events get a dummy handle");
  TEST_ASSERT(kch_start(ctx, api, 0, 5) == NULL, "dummy parent -> NULL handle");
  ncclProfiler_v6.stopEvent(api);
  ncclProfiler_v6.recordEventState(api, ncclProfilerGroupEndApiStart, NULL);
  /* PXN: ProxyOp from another process with a foreign parentObj: never dereferenced */
  memset(&d, 0, sizeof d);
  d.type = ncclProfileProxyOp;
  d.parentObj = (void*)(uintptr_t)0xdead0000;
  d.proxyOp.pid = getpid() + 1;
  void* p = (void*)1;
  ncclProfiler_v6.startEvent(ctx, &p, &d);
  TEST_ASSERT(p == NULL, "ProxyOp not tracked");
  /* CE events (v6) */
  memset(&d, 0, sizeof d);
  d.type = ncclProfileCeColl;
  p = (void*)1;
  ncclProfiler_v6.startEvent(ctx, &p, &d);
  TEST_ASSERT(p == NULL, "CE -> NULL");
  /* NULL handles to stop/record and NULL context: success, no effect */
  TEST_ASSERT(ncclProfiler_v6.stopEvent(NULL) == ncclSuccess, "stop NULL");
  TEST_ASSERT(ncclProfiler_v6.recordEventState(NULL, ncclProfilerKernelChStop, NULL) == ncclSuccess, "record NULL");
  d = coll_descr(NULL, 1, "AllReduce", "ncclInt8", 1, 1);
  p = (void*)1;
  TEST_ASSERT(ncclProfiler_v6.startEvent(NULL, &p, &d) == ncclSuccess && p == NULL, "NULL context");
  TEST_ASSERT(ring_take(out, 4) == 0, "nothing recorded");
  ncclProfiler_v6.finalize(ctx);
  return 0;
}

static int test_pool_exhaustion(void) {
  clear_env();
  setenv("DYNAMICCL_POOL_SIZE", "4", 1);
  void* ctx = init6(1, 0, 2);
  void* h[6];
  for (int i = 0; i < 6; i++) {
    ncclProfilerEventDescr_v6_t d = coll_descr(NULL, (uint64_t)i, "AllReduce", "ncclInt8", 1, 1);
    h[i] = NULL;
    ncclProfiler_v6.startEvent(ctx, &h[i], &d);
  }
  for (int i = 0; i < 4; i++) TEST_ASSERT(h[i] != NULL, "slot %d", i);
  TEST_ASSERT(h[4] == NULL && h[5] == NULL, "pool full -> NULL");
  dccl_stats_record_t st;
  dccl_stats_snapshot(&st);
  TEST_ASSERT(st.events_dropped_pool_full == 2, "dropped %llu", (unsigned long long)st.events_dropped_pool_full);
  /* children of the dropped op: NULL parent, ignored */
  TEST_ASSERT(kch_start(ctx, h[4], 0, 1) == NULL, "child of dropped");
  /* complete one; its slot is reusable */
  ncclProfiler_v6.stopEvent(h[1]);
  kch_stop(kch_start(ctx, h[1], 0, 10), 20);
  dccl_event_record_t out[8];
  TEST_ASSERT(ring_take(out, 8) == 1 && out[0].seq_number == 1, "one record");
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 9, "AllReduce", "ncclInt8", 1, 1);
  void* again = NULL;
  ncclProfiler_v6.startEvent(ctx, &again, &d);
  TEST_ASSERT(DCCL_H_SLOT((uintptr_t)again) == DCCL_H_SLOT((uintptr_t)h[1]), "freed slot reused");
  TEST_ASSERT(again != h[1], "with a new generation");
  /* finalize emits the 4 in-flight operations as stale */
  ncclProfiler_v6.finalize(ctx);
  dccl_stats_snapshot(&st);
  TEST_ASSERT(st.events_stale >= 4, "stale at finalize %llu", (unsigned long long)st.events_stale);
  clear_env();
  return 0;
}

static int test_stale_reaper(void) {
  clear_env();
  void* ctx = init6(1, 0, 2);
  uint64_t stale0 = atomic_load(&dccl_g.events_stale);
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 3, "AllGather", "ncclFloat16", 8, 4);
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  ncclProfiler_v6.stopEvent(h);
  kch_stop(kch_start(ctx, h, 1, 111), 222); /* 1 of 4 channels, the rest lost */
  dccl_event_record_t out[4];
  TEST_ASSERT(ring_take(out, 4) == 0, "incomplete");
  uint64_t t0 = dccl_monotonic_ns();
  /* a realtime step; also the reaper's first sight of the operation (its age counts from here) */
  dccl_reap_ctx(ctx, dccl_now_ns() + 11ull * 1000000000ull, 10ull * 1000000000ull);
  TEST_ASSERT(ring_take(out, 4) == 0, "young slots are not reaped, whatever CLOCK_REALTIME says");
  dccl_reap_ctx_at(ctx, t0 + 9ull * 1000000000ull, 10ull * 1000000000ull);
  TEST_ASSERT(ring_take(out, 4) == 0, "seen in flight for 9 s: not yet");
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns() + 11ull * 1000000000ull, 10ull * 1000000000ull);
  TEST_ASSERT(ring_take(out, 4) == 1, "reaped");
  TEST_ASSERT(out[0].flags == DCCL_FLAG_STALE && out[0].timing_source == DCCL_TIMING_NONE, "stale flags");
  TEST_ASSERT(out[0].channels_seen == 1 && out[0].gpu_start_ns == 111 && out[0].gpu_end_ns == 222, "partial data");
  TEST_ASSERT(out[0].bytes == 16, "bytes");
  TEST_ASSERT(atomic_load(&dccl_g.events_stale) == stale0 + 1, "counted");
  /* a reaped slot is free again, and a second reap finds nothing */
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns() + 11ull * 1000000000ull, 10ull * 1000000000ull);
  TEST_ASSERT(ring_take(out, 4) == 0 && atomic_load(&dccl_g.events_stale) == stale0 + 1, "reaped once");
  ncclProfiler_v6.finalize(ctx);
  return 0;
}

static int test_sampling_and_min_bytes(void) {
  clear_env();
  setenv("DYNAMICCL_SAMPLE", "4", 1);
  setenv("DYNAMICCL_MIN_BYTES", "100", 1);
  void* ctx = init6(1, 0, 2);
  for (uint64_t s = 0; s < 8; s++) {
    ncclProfilerEventDescr_v6_t d = coll_descr(NULL, s, "AllReduce", "ncclFloat64", 16, 1); /* 128 B */
    void* h = NULL;
    ncclProfiler_v6.startEvent(ctx, &h, &d);
    TEST_ASSERT((h != NULL) == (s % 4 == 0), "seq %llu sampled", (unsigned long long)s);
    ncclProfiler_v6.stopEvent(h);
    kch_stop(kch_start(ctx, h, 0, 1), 2);
  }
  ncclProfilerEventDescr_v6_t small = coll_descr(NULL, 8, "AllReduce", "ncclFloat64", 12, 1); /* 96 B < 100 */
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &small);
  TEST_ASSERT(h == NULL, "below min bytes");
  dccl_event_record_t out[16];
  TEST_ASSERT(ring_take(out, 16) == 2, "two sampled");
  TEST_ASSERT(out[0].seq_number == 0 && out[1].seq_number == 4, "seq 0 and 4");
  dccl_stats_record_t st;
  dccl_stats_snapshot(&st);
  TEST_ASSERT(st.sampled_out >= 6, "sampled_out %llu", (unsigned long long)st.sampled_out);
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  return 0;
}

static int test_p2p(void) {
  clear_env();
  void* ctx = init6(77, 1, 4);
  for (int i = 0; i < 3; i++) TEST_ASSERT(run_p2p(ctx, i == 2 ? "Recv" : "Send", 3, 500, 900) != NULL, "p2p handle");
  dccl_event_record_t out[4];
  TEST_ASSERT(ring_take(out, 4) == 3, "three p2p");
  TEST_ASSERT(out[0].kind == DCCL_KIND_P2P && out[0].func == DCCL_FUNC_SEND && out[0].root == 3, "send to 3");
  TEST_ASSERT(out[0].algo == DCCL_UNKNOWN && out[0].proto == DCCL_UNKNOWN && out[0].bytes == 1024, "p2p fields");
  TEST_ASSERT(out[0].seq_number == 0 && out[1].seq_number == 1 && out[2].seq_number == 0, "per (func, peer) ordinal");
  TEST_ASSERT(out[2].func == DCCL_FUNC_RECV && out[2].timing_source == DCCL_TIMING_KERNEL_GPU, "recv");
  TEST_ASSERT(out[2].gpu_start_ns == 500 && out[2].gpu_end_ns == 900, "gpu");
  ncclProfiler_v6.finalize(ctx);
  return 0;
}

static int test_duplicate_and_bad_channel(void) {
  clear_env();
  void* ctx = init6(1, 0, 2);
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 0, "AllReduce", "ncclInt8", 1, 2);
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  ncclProfiler_v6.stopEvent(h);
  void* k0 = kch_start(ctx, h, 0, 10);
  kch_stop(k0, 20);
  uint64_t rejected = atomic_load(&dccl_g.kch_dropped);
  kch_stop(k0, 25); /* a second stop of channel 0 must not count as the second channel */
  dccl_event_record_t early[2];
  TEST_ASSERT(ring_take(early, 2) == 0 && atomic_load(&dccl_g.kch_dropped) == rejected + 1,
              "second stop of one channel refused and counted");
  TEST_ASSERT(kch_start(ctx, h, 0, 10) == NULL, "duplicate channel refused");
  TEST_ASSERT(kch_start(ctx, h, 64, 10) == NULL, "channel id >= 64 refused");
  kch_stop(kch_start(ctx, h, 5, 11), 30);
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1 && out[0].channels_seen == 2, "completed with channels 0 and 5");
  TEST_ASSERT(out[0].gpu_start_ns == 10 && out[0].gpu_end_ns == 30, "min/max");
  ncclProfiler_v6.finalize(ctx);
  return 0;
}

static int test_v4_and_v5_tables(void) {
  clear_env();
  int mask4 = 0;
  void* ctx = NULL;
  TEST_ASSERT(ncclProfiler_v4.init(&ctx, &mask4, NULL, 0x44, 1, 2, 1, mock_logger) == ncclSuccess, "v4 init");
  TEST_ASSERT(mask4 == 70, "v4 mask");
  ncclProfilerEventDescr_v4_t g;
  memset(&g, 0, sizeof g);
  g.type = ncclProfileGroup;
  void* group = NULL;
  ncclProfiler_v4.startEvent(ctx, &group, &g);
  TEST_ASSERT(group != NULL, "group handle");
  ncclProfilerEventDescr_v4_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileColl;
  d.parentObj = group;
  d.coll.seqNumber = 12;
  d.coll.func = "ReduceScatter";
  d.coll.datatype = "ncclBfloat16";
  d.coll.count = 64;
  d.coll.nChannels = 1;
  d.coll.nWarps = 8;
  d.coll.algo = "PAT";
  d.coll.proto = "SIMPLE";
  void* h = NULL;
  ncclProfiler_v4.startEvent(ctx, &h, &d);
  ncclProfiler_v4.stopEvent(h);
  ncclProfiler_v4.stopEvent(group);
  memset(&d, 0, sizeof d);
  d.type = ncclProfileKernelCh;
  d.parentObj = h;
  d.kernelCh.channelId = 0;
  d.kernelCh.pTimer = 5;
  void* k = NULL;
  ncclProfiler_v4.startEvent(ctx, &k, &d);
  ncclProfilerEventStateArgs_v4_t a = {.kernelCh = {.pTimer = 9}};
  ncclProfiler_v4.recordEventState(k, ncclProfilerKernelChStop, &a);
  ncclProfiler_v4.stopEvent(k);
  dccl_event_record_t out[2];
  TEST_ASSERT(ring_take(out, 2) == 1, "v4 record");
  TEST_ASSERT(out[0].comm_hash == 0x44 && out[0].func == DCCL_FUNC_REDUCESCATTER && out[0].bytes == 128, "v4 fields");
  TEST_ASSERT(out[0].algo == DCCL_ALGO_PAT && out[0].gpu_start_ns == 5 && out[0].gpu_end_ns == 9, "v4 timing");
  ncclProfiler_v4.finalize(ctx);

  int mask5 = 0;
  TEST_ASSERT(ncclProfiler_v5.init(&ctx, 0x55, &mask5, "five", 1, 2, 0, mock_logger) == ncclSuccess, "v5 init");
  ncclProfilerEventDescr_v5_t d5;
  memset(&d5, 0, sizeof d5);
  d5.type = ncclProfileColl;
  d5.coll.seqNumber = 3;
  d5.coll.func = "Reduce";
  d5.coll.datatype = "ncclUint64";
  d5.coll.count = 2;
  d5.coll.nChannels = 0; /* no channels: complete at stop */
  h = NULL;
  ncclProfiler_v5.startEvent(ctx, &h, &d5);
  ncclProfiler_v5.stopEvent(h);
  TEST_ASSERT(ring_take(out, 2) == 1 && out[0].comm_hash == 0x55 && out[0].bytes == 16, "v5 record");
  TEST_ASSERT(strcmp(ncclProfiler_v5.name, "dynamiccl") == 0, "name");
  ncclProfiler_v5.finalize(ctx);
  return 0;
}

typedef struct {
  void* ctx;
  int n;
  void** handles;
  _Atomic int produced;
  _Atomic int done;
} mt_state_t;

/* Proxy thread: waits for each Coll handle and replays its KernelCh children. */
static void* mt_proxy(void* arg) {
  mt_state_t* s = arg;
  for (int i = 0; i < s->n; i++) {
    while (atomic_load(&s->produced) <= i) sched_yield();
    void* h = s->handles[i];
    for (uint8_t c = 0; c < 8; c++) kch_stop(kch_start(s->ctx, h, c, 1000 + (uint64_t)i), 2000 + (uint64_t)i);
  }
  atomic_store(&s->done, 1);
  return NULL;
}

static int test_two_threads_every_record_once(void) {
  clear_env();
  setenv("DYNAMICCL_RING_SIZE", "65536", 1);
  mt_state_t s = {.n = 20000};
  s.ctx = init6(9, 0, 2);
  s.handles = calloc((size_t)s.n, sizeof(void*));
  pthread_t t;
  pthread_create(&t, NULL, mt_proxy, &s);
  uint8_t* seen = calloc((size_t)s.n, 1);
  int got = 0;
  dccl_event_record_t out[256];
  for (int i = 0; i < s.n; i++) {
    ncclProfilerEventDescr_v6_t d = coll_descr(NULL, (uint64_t)i, "AllReduce", "ncclInt8", 1, 8);
    void* h = NULL;
    ncclProfiler_v6.startEvent(s.ctx, &h, &d);
    while (h == NULL) { /* pool full: let the proxy catch up (a real NCCL would just lose it) */
      sched_yield();
      ncclProfiler_v6.startEvent(s.ctx, &h, &d);
    }
    s.handles[i] = h;
    atomic_store(&s.produced, i + 1);
    ncclProfiler_v6.stopEvent(h);
    uint32_t n = ring_take(out, 256);
    for (uint32_t j = 0; j < n; j++, got++) {
      TEST_ASSERT(out[j].seq_number < (uint64_t)s.n && !seen[out[j].seq_number], "dup/bad seq");
      seen[out[j].seq_number] = 1;
      TEST_ASSERT(out[j].gpu_start_ns == 1000 + out[j].seq_number && out[j].channels_seen == 8, "fields");
    }
  }
  pthread_join(t, NULL);
  for (uint32_t n; (n = ring_take(out, 256)) > 0;)
    for (uint32_t j = 0; j < n; j++, got++) {
      TEST_ASSERT(!seen[out[j].seq_number], "dup");
      seen[out[j].seq_number] = 1;
    }
  TEST_ASSERT(got == s.n, "got %d of %d", got, s.n);
  free(seen);
  free(s.handles);
  ncclProfiler_v6.finalize(s.ctx);
  clear_env();
  return 0;
}
