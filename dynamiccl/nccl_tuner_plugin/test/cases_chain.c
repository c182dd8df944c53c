/* Tuner unit tests: DYNAMICCL_TUNER_CHAIN. #included by test_tuner.c (one translation unit with the plugin sources). */
/* DYNAMICCL_TUNER_CHAIN=<this binary's directory>/<rel> (tests run from any directory). */
static void set_chain(const char* rel) {
  static char buf[1024];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = '\0';
  char* slash = strrchr(buf, '/');
  snprintf(slash ? slash + 1 : buf, sizeof buf - (size_t)(slash ? slash + 1 - buf : 0), "%s", rel);
  setenv("DYNAMICCL_TUNER_CHAIN", buf, 1);
}

static int fake_counter(const char* name) {
  int* p = g_chain.dl ? (int*)dlsym(g_chain.dl, name) : NULL;
  return p ? *p : -1;
}

static void* init_chained(int abi, uint64_t comm, ncclTunerConstants_v7_t* k7, ncclTunerConstants_v5_t* k5) {
  void* ctx = NULL;
  if (abi == 7) ncclTunerPlugin_v7.init(&ctx, comm, 8, 2, mock_logger, NULL, k7);
  else if (abi == 6) ncclTunerPlugin_v6.init(&ctx, comm, 8, 2, mock_logger, NULL, k5);
  else if (abi == 5) ncclTunerPlugin_v5.init(&ctx, comm, 8, 2, mock_logger, NULL, k5);
  else ncclTunerPlugin_v4.init(8, 2, mock_logger, &ctx);
  return ctx;
}

/* Our rule decides where it matches; elsewhere the chained tuner does (table, channels, chunk). */
static int test_chain_decides_where_no_rule(void) {
  set_chain("libfakechain6.so");
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 1\nAllReduce 0 100 RING LL 0 4096 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  ncclTunerConstants_v5_t k;
  memset(&k, 0, sizeof k);
  k.baseLatencies[0][0] = 1.5;
  void* ctx = init_chained(6, 1, NULL, &k);
  TEST_ASSERT(ctx != NULL && fake_counter("fake_chain_inits") == 1, "chained init");
  TEST_ASSERT(k.baseLatencies[0][0] == 3.0, "the chained tuner tuned NCCL's constants");
  float t[21];
  int nch;
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 50, t, &nch) == 3 && nch == 0, "our rule");
  TEST_ASSERT(fake_counter("fake_chain_calls") == 0, "chain not asked when we decide");
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 5000, t, &nch) == 2 && nch == 3, "no rule: the chained tuner's");
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllGather, 50, t, &nch) == 2, "other function: chained");
  fill(t, 10);
  call(ctx, ncclFuncAllReduce, 50, t, &nch); /* getChunkSize follows its getCollInfo */
  size_t chunk = 524288;
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, 50, NCCL_ALGO_RING, NCCL_PROTO_LL, 1, &chunk);
  TEST_ASSERT(chunk == 4096, "our chunk");
  chunk = 524288;
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllGather, 5000, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 1, &chunk);
  TEST_ASSERT(chunk == 77 * 512, "chained chunk %zu", chunk);
  uint64_t cs[3];
  dynamiccl_tuner_chain_stats(cs);
  TEST_ASSERT(cs[0] == 3 && cs[1] == 0 && cs[2] == 0, "chain stats %llu %llu %llu", (unsigned long long)cs[0],
              (unsigned long long)cs[1], (unsigned long long)cs[2]);
  ncclTunerPlugin_v6.finalize(ctx);
  TEST_ASSERT(g_chain.dl == NULL, "unloaded at the last finalize");
  unsetenv("DYNAMICCL_TUNER_CHAIN");
  return 0;
}

/* NCCL opened us through one version, the chained tuner speaks another. */
static int test_chain_across_versions(void) {
  ncclTunerConstants_v7_t k7;
  ncclTunerConstants_v5_t k5;
  float t[21];
  int nch;
  /* v7 chained tuner behind a v6 context: constants converted both ways */
  set_chain("libfakechain7.so");
  reset(DCT_MODE_IMMEDIATE);
  memset(&k5, 0, sizeof k5);
  k5.baseLatencies[0][0] = 2.0;
  k5.llMaxBws[3][2] = 9.0;
  void* a = init_chained(6, 1, NULL, &k5);
  TEST_ASSERT(k5.baseLatencies[0][0] == 4.0 && k5.llMaxBws[3][2] == 9.0, "v7 chain on v6: %f", k5.baseLatencies[0][0]);
  fill(t, 10);
  TEST_ASSERT(call(a, ncclFuncAllReduce, 10, t, &nch) == 2 && nch == 3, "v7 chain decides");
  ncclTunerPlugin_v6.finalize(a);
  /* v5 chained tuner behind a v7 context */
  set_chain("libfakechain5.so");
  reset(DCT_MODE_IMMEDIATE);
  memset(&k7, 0, sizeof k7);
  k7.baseLatencies[0][0] = 1.0;
  k7.llMaxBws[4][1] = 5.0; /* the fifth compute capability survives */
  void* b = init_chained(7, 1, &k7, NULL);
  TEST_ASSERT(k7.baseLatencies[0][0] == 2.0 && k7.llMaxBws[4][1] == 5.0, "v5 chain on v7");
  size_t chunk = 1000;
  ncclTunerPlugin_v7.getChunkSize(b, ncclFuncAllReduce, 10, 0, 0, 1, &chunk);
  TEST_ASSERT(chunk == 1000, "v5 chain has no getChunkSize");
  /* its init fails for one communicator: that one runs without the chain, never fails */
  void* bad = init_chained(7, 0xbad, &k7, NULL);
  TEST_ASSERT(bad != NULL, "our init still succeeds");
  fill(t, 10);
  TEST_ASSERT(call(bad, ncclFuncAllReduce, 10, t, &nch) == 0 && nch == 0, "no chain there: NCCL's choice");
  uint64_t cs[3];
  dynamiccl_tuner_chain_stats(cs);
  TEST_ASSERT(cs[2] == 1, "refused counted");
  ncclTunerPlugin_v7.finalize(bad);
  ncclTunerPlugin_v7.finalize(b);
  /* a v4 chained tuner cannot serve a v6 communicator (no id/constants to give it) */
  set_chain("libfakechain4.so");
  reset(DCT_MODE_IMMEDIATE);
  void* c = init_chained(6, 1, NULL, &k5);
  fill(t, 10);
  TEST_ASSERT(call(c, ncclFuncAllReduce, 10, t, &nch) == 0, "v4 chain refused for v6");
  ncclTunerPlugin_v6.finalize(c);
  void* d = init_chained(4, 0, NULL, NULL);
  fill(t, 10);
  TEST_ASSERT(call(d, ncclFuncAllReduce, 10, t, &nch) == 2, "v4 chain serves v4");
  ncclTunerPlugin_v4.destroy(d);
  /* DynamICCL itself, or a library without a tuner table: no chain, warned */
  set_chain("../../libnccl-tuner-dynamiccl.so");
  reset(DCT_MODE_IMMEDIATE);
  void* e = init6(1);
  TEST_ASSERT(g_chain.dl == NULL && g_warns == 1, "self refused: %d warnings", g_warns);
  ncclTunerPlugin_v6.finalize(e);
  setenv("DYNAMICCL_TUNER_CHAIN", "/nonexistent/lib.so", 1);
  reset(DCT_MODE_IMMEDIATE);
  e = init6(1);
  TEST_ASSERT(e != NULL && g_chain.dl == NULL && g_warns >= 1, "missing library: warned, init succeeds");
  ncclTunerPlugin_v6.finalize(e);
  unsetenv("DYNAMICCL_TUNER_CHAIN");
  return 0;
}
