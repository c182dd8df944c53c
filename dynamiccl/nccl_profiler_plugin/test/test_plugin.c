/* Unit tests for the DynamICCL profiler plugin. No GPU, no NCCL.
 *
 * NCCL style: the plugin sources are #included, a mock logger captures messages, and a table
 * of tests runs all (./test_plugin) or one by name (./test_plugin ring_wraps). The sender
 * thread is compiled out (DCCL_TESTING_NO_SENDER) so each test drains the ring itself;
 * the sender is covered by the emulator tests in tests/nccl_profiler_plugin/.
 */
#define _GNU_SOURCE
#define DCCL_TESTING_NO_SENDER 1
#include "../src/config.c"
#include "../src/plugin.c"
#include "../src/finish.c"
#include "../src/chain.c"
#include "../src/ring.c"
#include "../src/lifecycle.c"
#include "../src/connect.c"
#include "../src/sender.c"

#include "harness.h"

static void clear_env(void) {
  const char* vars[] = {"DYNAMICCL_COLLECTOR", "DYNAMICCL_EVENT_MASK", "DYNAMICCL_POOL_SIZE", "DYNAMICCL_RING_SIZE",
                        "DYNAMICCL_MIN_BYTES", "DYNAMICCL_SAMPLE",     "DYNAMICCL_FLUSH_MS",  "DYNAMICCL_STALE_MS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  setenv("DYNAMICCL_SPAN_CHECK", "0", 1); /* the unit tests' pTimers are made up; span_check_guard turns it on */
  g_log[0] = '\0';
  g_warns = 0;
}

static int g_mask; /* NCCL's process-global activation mask */

static void* init6(uint64_t hash, int rank, int nranks) {
  void* ctx = NULL;
  if (ncclProfiler_v6.init(&ctx, hash, &g_mask, "test-comm", 2, nranks, rank, mock_logger) != ncclSuccess) return NULL;
  return ctx;
}

static uint32_t ring_take(dccl_event_record_t* out, uint32_t max) { return dccl_ring_pop(&dccl_g.ring, out, max); }

static ncclProfilerEventDescr_v6_t coll_descr(void* parent, uint64_t seq, const char* func, const char* dtype,
                                              size_t count, uint8_t nch) {
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileColl;
  d.parentObj = parent;
  d.coll.seqNumber = seq;
  d.coll.func = func;
  d.coll.datatype = dtype;
  d.coll.count = count;
  d.coll.root = 3;
  d.coll.nChannels = nch;
  d.coll.nWarps = 16;
  d.coll.algo = "RING";
  d.coll.proto = "LL128";
  return d;
}

static void* kch_start(void* ctx, void* parent, uint8_t ch, uint64_t t0) {
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileKernelCh;
  d.parentObj = parent;
  d.kernelCh.channelId = ch;
  d.kernelCh.pTimer = t0;
  void* h = (void*)1;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  return h;
}

static void kch_stop(void* h, uint64_t t1) {
  ncclProfilerEventStateArgs_v6_t a = {.kernelCh = {.pTimer = t1}};
  ncclProfiler_v6.recordEventState(h, ncclProfilerKernelChStop, &a);
  ncclProfiler_v6.stopEvent(h);
}

/* One collective with nch channels; KernelCh before or after the Coll stop. */
static void* run_coll(void* ctx, uint64_t seq, uint8_t nch, int kernels_first, uint64_t t0, uint64_t t1) {
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, seq, "AllReduce", "ncclFloat32", 1000, nch);
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  if (!kernels_first) ncclProfiler_v6.stopEvent(h);
  for (uint8_t c = 0; c < nch; c++) {
    void* k = kch_start(ctx, h, c, t0 ? t0 + c : 0);
    kch_stop(k, t1 ? t1 - c : 0);
  }
  if (kernels_first) ncclProfiler_v6.stopEvent(h);
  return h;
}

/* One P2p (2 channels, KernelCh after its stop) with the given pTimers; returns its handle. */
static void* run_p2p(void* ctx, const char* func, int peer, uint64_t t0, uint64_t t1) {
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileP2p;
  d.p2p.func = func;
  d.p2p.datatype = "ncclInt32";
  d.p2p.count = 256;
  d.p2p.peer = peer;
  d.p2p.nChannels = 2;
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  ncclProfiler_v6.stopEvent(h);
  for (uint8_t c = 0; c < 2 && h != NULL; c++) kch_stop(kch_start(ctx, h, c, t0 + c), t1 - c);
  return h;
}

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
  dccl_reap_ctx(ctx, dccl_now_ns() + 11ull * 1000000000ull, 10ull * 1000000000ull); /* a realtime step */
  TEST_ASSERT(ring_take(out, 4) == 0, "young slots are not reaped, whatever CLOCK_REALTIME says");
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


/* ---- real NCCL paths (issue 23) ---- */

static void* p2p_start(void* ctx, const char* func, int peer, uint8_t nch) {
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileP2p;
  d.p2p.func = func;
  d.p2p.datatype = "ncclInt8";
  d.p2p.count = 4096;
  d.p2p.peer = peer;
  d.p2p.nChannels = nch;
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  return h;
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
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileCeColl;
  d.ceColl.seqNumber = 9;
  d.ceColl.func = "AllGather";
  d.ceColl.datatype = "ncclBfloat16";
  d.ceColl.count = 1000;
  d.ceColl.root = -1;
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

/* DYNAMICCL_PROFILER_CHAIN (chain.c): NCCL gets chain handles; our side still sees its own parents
   (the record completes with GPU timing); a handle whose ring entry was reused, or whose communicator
   was finalized, reaches neither plugin and is counted. Needs libchain-probe.so beside this binary (make). */
static int test_chain_handles(void) {
  clear_env();
  char probe[4096];
  ssize_t n = readlink("/proc/self/exe", probe, sizeof probe - 32);
  TEST_ASSERT(n > 0, "own path");
  probe[n] = '\0';
  snprintf(strrchr(probe, '/'), 32, "/libchain-probe.so");
  setenv("DYNAMICCL_PROFILER_CHAIN", probe, 1);
  setenv("CHAIN_PROBE_MASK", "2050", 1); /* Coll | KernelLaunch */
  dccl_event_record_t out[4];
  dccl_ctx_t* ctx = init6(0xC4A1, 0, 2);
  TEST_ASSERT(ctx != NULL && ctx->chain != NULL, "chained (log: %s)", g_log);
  TEST_ASSERT(g_mask == (DCCL_DEFAULT_EVENT_MASK | 2050), "NCCL's mask has both plugins' events: %d", g_mask);
  void* h = run_coll(ctx, 7, 4, 0, 1000, 9000);
  TEST_ASSERT(DCCL_H_IS_CHAIN((uint64_t)(uintptr_t)h), "a chain handle");
  TEST_ASSERT(ring_take(out, 4) == 1, "one record");
  TEST_ASSERT(out[0].timing_source == DCCL_TIMING_KERNEL_GPU && out[0].channels_seen == 4 && out[0].seq_number == 7,
              "our side saw its own parent: timing %u channels %u", out[0].timing_source, out[0].channels_seen);
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 8, "AllReduce", "ncclFloat32", 1000, 1);
  void* old = NULL;
  ncclProfiler_v6.startEvent(ctx, &old, &d);
  ncclProfilerEventDescr_v6_t g = {.type = ncclProfileGroupApi};
  for (uint32_t i = 0; i < DCCL_CHAIN_ENTRIES; i++) {
    void* x = NULL;
    ncclProfiler_v6.startEvent(ctx, &x, &g);
  }
  uint64_t stale0 = atomic_load(&dccl_g.chain_stale);
  ncclProfiler_v6.stopEvent(old); /* its entry was reused */
  TEST_ASSERT(atomic_load(&dccl_g.chain_stale) == stale0 + 1, "a reused entry is counted");
  TEST_ASSERT(ring_take(out, 4) == 0, "and reaches neither plugin (our Coll is still open)");
  void* live = NULL;
  ncclProfiler_v6.startEvent(ctx, &live, &g);
  ncclProfiler_v6.finalize(ctx);
  ncclProfiler_v6.stopEvent(live); /* after finalize */
  TEST_ASSERT(atomic_load(&dccl_g.chain_stale) == stale0 + 2, "a stop after finalize is counted");
  unsetenv("DYNAMICCL_PROFILER_CHAIN");
  unsetenv("CHAIN_PROBE_MASK");
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

static const test_case_t k_tests[] = {
    {"config_defaults", test_config_defaults},
    {"config_invalid", test_config_invalid},
    {"init_invalid_env_fails", test_init_invalid_env_fails},
    {"string_mapping", test_string_mapping},
    {"ring_wraps_and_fills", test_ring_wraps_and_fills},
    {"coll_kernel_gpu_timing", test_coll_kernel_gpu_timing},
    {"kernel_cpu_only", test_kernel_cpu_only},
    {"kernelch_disabled", test_kernelch_disabled},
    {"null_and_foreign_parents", test_null_and_foreign_parents},
    {"pool_exhaustion", test_pool_exhaustion},
    {"stale_reaper", test_stale_reaper},
    {"sampling_and_min_bytes", test_sampling_and_min_bytes},
    {"p2p", test_p2p},
    {"duplicate_and_bad_channel", test_duplicate_and_bad_channel},
    {"v4_and_v5_tables", test_v4_and_v5_tables},
    {"two_threads_every_record_once", test_two_threads_every_record_once},
    {"ring_full_counted", test_ring_full_counted},
    {"two_comms_refcount", test_two_comms_refcount},
    {"self_send_completes", test_self_send_completes},
    {"collnet_zero_channels_late_children", test_collnet_zero_channels_late_children},
    {"late_child_after_reap", test_late_child_after_reap},
    {"uint8_bytes", test_uint8_bytes},
    {"retired_comm_late_stop_and_announce", test_retired_comm_late_stop_and_announce},
    {"v7_user_tag_and_symmetric", test_v7_user_tag_and_symmetric},
    {"ce_collective_counted", test_ce_collective_counted},
    {"coverage_counted", test_coverage_counted},
    {"init_never_fails_after_success", test_init_never_fails_after_success},
    {"kch_order_guard", test_kch_order_guard},
    {"span_check_guard", test_span_check_guard},
    {"chain_handles", test_chain_handles},
    {"kernel_variant_hash", test_kernel_variant_hash},
};

int main(int argc, char** argv) {
  return run_tests(k_tests, sizeof k_tests / sizeof k_tests[0], argc, argv);
}
