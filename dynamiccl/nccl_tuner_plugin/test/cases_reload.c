/* Tuner unit tests: reloads under concurrent readers, the environment, defaults and ABI versions. #included by test_tuner.c (one translation unit with the plugin sources). */
/* Readers on two threads while a writer reloads and applies: every decision is one of the
   decisions of an applied version (never garbage from a slot being rewritten). */
static _Atomic int g_stop;
static _Atomic uint64_t g_bad, g_reads;
static void* reader(void* arg) {
  void* ctx = arg;
  while (!atomic_load(&g_stop)) {
    float t[21];
    int nch;
    fill(t, 10);
    int cell = call(ctx, ncclFuncAllReduce, 64, t, &nch);
    /* odd versions: TREE/LL (0) with nch = 2; even: RING/SIMPLE (5) with nch = 4; none: 0 */
    if (!((cell == 0 && nch == 2) || (cell == 5 && nch == 4) || (cell == 0 && nch == 0)))
      atomic_fetch_add(&g_bad, 1);
    /* every 64 reads, give the writer a turn: valgrind runs one thread at a time and its lock is
       not fair, so two spinning readers could starve the writer for minutes on a loaded machine */
    if ((atomic_fetch_add(&g_reads, 1) & 63) == 63) sched_yield();
  }
  return NULL;
}

static int test_concurrent_reload(void) {
  reset(DCT_MODE_AGREE);
  void* c1 = init6(1);
  void* c2 = init6(2);
  atomic_store(&g_stop, 0);
  atomic_store(&g_bad, 0);
  atomic_store(&g_reads, 0);
  pthread_t th[2];
  pthread_create(&th[0], NULL, reader, c1);
  pthread_create(&th[1], NULL, reader, c2);
  char text[4096];
  for (int v = 1; v <= 200; v++) {
    size_t n = 0;
    for (int k = v > 8 ? v - 7 : 1; k <= v; k++)
      n += (size_t)snprintf(text + n, sizeof text - n, "version %d\n%s", k,
                            k % 2 ? "AllReduce 0 max TREE LL 2 0 *\n" : "AllReduce 0 max RING SIMPLE 4 0 *\n");
    write_file(text);
    if (dynamiccl_tuner_reload() != 1 || dynamiccl_tuner_apply_version((uint64_t)v) != 0) {
      atomic_store(&g_stop, 1);
      break;
    }
  }
  atomic_store(&g_stop, 1);
  pthread_join(th[0], NULL);
  pthread_join(th[1], NULL);
  TEST_ASSERT(atomic_load(&g_bad) == 0, "%llu bad decisions of %llu", (unsigned long long)atomic_load(&g_bad),
              (unsigned long long)atomic_load(&g_reads));
  TEST_ASSERT(dynamiccl_tuner_applied_version() == 200, "all applied");
  ncclTunerPlugin_v6.finalize(c1);
  ncclTunerPlugin_v6.finalize(c2);
  return 0;
}

/* A reader holding a tag whose slot was rewritten since must not use the new content. */
static int test_stale_tag_rejected(void) {
  reset(DCT_MODE_AGREE);
  write_file("version 1\nAllReduce 0 max TREE LL 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1 && dynamiccl_tuner_apply_version(1) == 0, "apply 1");
  void* ctx = init6(1);
  uint64_t tag = atomic_load(&dct_g.applied_tag);
  int slot = DCT_TAG_SLOT(tag);
  static dct_parsed_t p;
  char err[128];
  const char* other = "version 9\nAllReduce 0 max RING SIMPLE 0 0 *\n";
  TEST_ASSERT(dct_parse(other, strlen(other), &p, err, sizeof err) == 0, "%s", err);
  slot_write(slot, &p.v[0]); /* the slot is reused under the old tag */
  float t[21], ref[21];
  int nch;
  fill(t, 10);
  memcpy(ref, t, sizeof t);
  call(ctx, ncclFuncAllReduce, 64, t, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0, "used a rewritten slot");
  TEST_ASSERT(atomic_load(&((dct_ctx_t*)ctx)->retries) == DCT_LOOKUP_MAX_RETRIES, "retries counted");
  /* a fresh tag for the new content works */
  atomic_store(&dct_g.applied_tag, slot_tag(slot));
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 64, t, &nch) == 5, "new tag: RING/SIMPLE");
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

/* The background thread picks up a new file without any call from the test. */
static int test_reload_thread(void) {
  reset(DCT_MODE_IMMEDIATE);
  dynamiccl_tuner_configure(NULL, -1, 10);
  void* ctx = init6(1);
  TEST_ASSERT(dct_g.thread_running, "thread started at first init");
  write_file("version 11\nAllReduce 0 max RING LL 0 0 *\n");
  for (int i = 0; i < 300 && dynamiccl_tuner_applied_version() != 11; i++) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  TEST_ASSERT(dynamiccl_tuner_applied_version() == 11, "picked up by the thread");
  ncclTunerPlugin_v6.finalize(ctx);
  TEST_ASSERT(!dct_g.thread_running, "thread stopped at last finalize");
  dynamiccl_tuner_configure(NULL, -1, 0);
  return 0;
}

static int test_env(void) {
  reset(DCT_MODE_AGREE);
  dct_g.overrides = 0;
  dct_g.env_loaded = 0;
  setenv("DYNAMICCL_TUNER_CONFIG", "/nonexistent/x.conf", 1);
  setenv("DYNAMICCL_TUNER_APPLY", "bogus", 1);
  setenv("DYNAMICCL_TUNER_POLL_MS", "-5", 1);
  dct_g.mode = DCT_MODE_AGREE;
  dct_g.poll_ms = 0;
  dct_env_load();
  TEST_ASSERT(strcmp(dct_g.path, "/nonexistent/x.conf") == 0, "path from env");
  TEST_ASSERT(dct_g.mode == DCT_MODE_AGREE && dct_g.poll_ms == 0 && g_warns == 2, "bad values warned, defaults kept");
  dct_g.env_loaded = 0;
  setenv("DYNAMICCL_TUNER_APPLY", "Epoch", 1);
  setenv("DYNAMICCL_TUNER_POLL_MS", "250", 1);
  dct_env_load();
  TEST_ASSERT(dct_g.mode == DCT_MODE_EPOCH && dct_g.poll_ms == 250, "env values");
  unsetenv("DYNAMICCL_TUNER_CONFIG");
  unsetenv("DYNAMICCL_TUNER_APPLY");
  unsetenv("DYNAMICCL_TUNER_POLL_MS");
  setenv("XDG_RUNTIME_DIR", "/run/user/4242/", 1);
  setenv("SLURM_JOB_ID", "77", 1);
  dct_g.env_loaded = 0;
  dct_env_load();
  TEST_ASSERT(strcmp(dct_g.path, "/run/user/4242/dynamiccl/tuner-77.conf") == 0, "per-user, per-job default: %s",
              dct_g.path);
  unsetenv("XDG_RUNTIME_DIR");
  unsetenv("SLURM_JOB_ID");
  return 0;
}


/* The default path's directory must be this user's and not group/other-writable (issue 18 #8):
   a config planted in a squatted directory is refused and counted; fixing the mode loads it. */
static int test_default_dir_refused(void) {
  reset(DCT_MODE_IMMEDIATE);
  const char* tmp = getenv("TMPDIR");
  char base[256], dir[400];
  snprintf(base, sizeof base, "%s/dccl-xdg-%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  snprintf(dir, sizeof dir, "%s/dynamiccl", base);
  mkdir(base, 0700);
  mkdir(dir, 0700);
  chmod(dir, 0777);
  setenv("XDG_RUNTIME_DIR", base, 1);
  unsetenv("DYNAMICCL_TUNER_CONFIG");
  unsetenv("SLURM_JOB_ID");
  unsetenv("DYNAMICCL_JOB_ID");
  dct_g.overrides = 0;
  dct_g.env_loaded = 0;
  dct_env_load();
  snprintf(g_path, sizeof g_path, "%s/tuner.conf", dir);
  TEST_ASSERT(strcmp(dct_g.path, g_path) == 0, "default path %s", dct_g.path);
  write_file("version 1\nAllReduce 0 max RING SIMPLE 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == -1, "group/other-writable directory refused");
  TEST_ASSERT(dynamiccl_tuner_reload() == -1 && atomic_load(&dct_g.reload_errors) == 1, "counted once per streak");
  TEST_ASSERT(atomic_load(&dct_g.staged_version) == 0 && strstr(g_log, "writable by group or others"), "%s", g_log);
  chmod(dir, 0700);
  TEST_ASSERT(dynamiccl_tuner_reload() == 1 && atomic_load(&dct_g.staged_version) == 1, "private directory loaded");
  unlink(g_path);
  rmdir(dir);
  rmdir(base);
  unsetenv("XDG_RUNTIME_DIR");
  reset(DCT_MODE_IMMEDIATE);
  return 0;
}

/* ---- real NCCL paths (issue 23) ---- */

/* NCCL rounds the tuner's chunk down to the protocol grain and divides by it (enqueue.cc
   calcCollChunking): a chunk below the grain would be 0 there. */
static int test_chunk_rounded_to_protocol_grain(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 1\nAllReduce 0 max * * 0 1 *\nAllGather 0 max * * 0 18446744073709551615 *\n"
             "ReduceScatter 0 max * * 0 4096 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload: %s", dct_g.last_error);
  void* ctx = init6(1);
  const size_t grain[3] = {16, 1920, 512};
  for (int p = 0; p < 3; p++) {
    size_t chunk = 524288;
    ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, 1 << 20, NCCL_ALGO_RING, p, 1, &chunk);
    TEST_ASSERT(chunk == grain[p], "proto %d: chunk 1 -> %zu", p, chunk);
    chunk = 524288;
    ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllGather, 1 << 20, NCCL_ALGO_RING, p, 1, &chunk);
    TEST_ASSERT(chunk >= (1u << 30) && chunk < (1u << 30) + grain[p] && chunk % grain[p] == 0, "proto %d: huge -> %zu",
                p, chunk);
    chunk = 524288;
    ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncReduceScatter, 1 << 20, NCCL_ALGO_RING, p, 1, &chunk);
    TEST_ASSERT(chunk % grain[p] == 0 && chunk >= 4096 && chunk < 4096 + grain[p], "proto %d: 4096 -> %zu", p, chunk);
  }
  size_t chunk = 524288;
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, 1 << 20, NCCL_ALGO_RING, 7, 1, &chunk);
  TEST_ASSERT(chunk == 524288, "unknown protocol: NCCL's chunk");
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

/* NCCL's "collnet" tasks (CollNet, NVLS across nodes) use the tuner's channel budget unclamped: NCCL's
 * own count stands there; NVLS_TREE and single-node NVLS are clamped, so the budget is written. */
static int test_channels_only_where_nccl_clamps(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 1\nAllReduce 0 100 COLLNET_DIRECT * 32 0 *\nAllReduce 101 200 NVLS * 32 0 *\n"
             "AllReduce 201 300 COLLNET_CHAIN * 32 0 *\nAllReduce 301 400 NVLS_TREE * 32 0 *\n"
             "AllReduce 401 500 RING * 32 0 *\nAllReduce 501 600 * * 32 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  void* ctx = init6(1);
  float t[21];
  int nch;
  const size_t sizes[4] = {50, 150, 250, 350};
  const int algos[4] = {NCCL_ALGO_COLLNET_DIRECT, NCCL_ALGO_NVLS, NCCL_ALGO_COLLNET_CHAIN, NCCL_ALGO_NVLS_TREE};
  for (int i = 0; i < 4; i++) {        /* init6: 2 nodes */
    fill(t, 10);
    TEST_ASSERT(call(ctx, ncclFuncAllReduce, sizes[i], t, &nch) / 3 == algos[i], "algo %d forced", algos[i]);
    int want = algos[i] == NCCL_ALGO_NVLS_TREE ? 32 : 0;
    TEST_ASSERT(nch == want, "algo %d: channels %d (got %d)", algos[i], want, nch);
  }
  void* one = NULL;                    /* one node: NVLS is clamped, the budget is written */
  ncclTunerPlugin_v6.init(&one, 2, 8, 1, mock_logger, NULL, NULL);
  fill(t, 10);
  TEST_ASSERT(call(one, ncclFuncAllReduce, 150, t, &nch) / 3 == NCCL_ALGO_NVLS && nch == 32, "1-node NVLS: 32");
  ncclTunerPlugin_v6.finalize(one);
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 450, t, &nch) / 3 == NCCL_ALGO_RING && nch == 32, "RING: 32");
  fill(t, 10); /* '*' rule, cheapest cell is NVLS: no channels */
  for (int a = 0; a < 7; a++)
    for (int p = 0; p < 3; p++) t[a * 3 + p] = (a == NCCL_ALGO_NVLS) ? 1.0f + p : 50.0f;
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 550, t, &nch) / 3 == NCCL_ALGO_NVLS && nch == 0, "* on NVLS: none");
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

static int test_tuning_subsystem_flag(void) {
  TEST_ASSERT(NCCL_TUNING == 0x40, "NCCL_TUNING is 0x40 in nccl_common.h (0x2000 is NCCL_REG): %#x", NCCL_TUNING);
  return 0;
}

/* Tuner v4 has no communicator id: a version with communicator-specific rules is neither applied
   nor stamped; one without them is both. */
static int test_v4_version_stamp(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 3\nAllReduce 0 100 RING LL 0 0 0xabc\nAllReduce 0 100 TREE SIMPLE 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  void* six = init6(0xabc);
  TEST_ASSERT(dynamiccl_tuner_record_version(0xabc) == 3, "v6 only: stamped");
  void* c = NULL;
  ncclTunerPlugin_v4.init(8, 1, mock_logger, &c);
  TEST_ASSERT(dynamiccl_tuner_record_version(0) == 0, "v4 + comm rules: not stamped");
  float t[21], ref[21];
  int nch = 0;
  fill(t, 10);
  memcpy(ref, t, sizeof t);
  ncclTunerPlugin_v4.getCollInfo(c, ncclFuncAllReduce, 50, 1, (float**)t, 7, 3, 0, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0, "v4 + comm rules: not applied");
  write_file("version 4\nAllReduce 0 100 TREE SIMPLE 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload 2");
  TEST_ASSERT(dynamiccl_tuner_record_version(0) == 4, "no comm rules: stamped");
  fill(t, 10);
  ncclTunerPlugin_v4.getCollInfo(c, ncclFuncAllReduce, 50, 1, (float**)t, 7, 3, 0, &nch);
  TEST_ASSERT(argmin(t, 21) == 2, "and applied");
  ncclTunerPlugin_v4.destroy(c);
  ncclTunerPlugin_v6.finalize(six);
  return 0;
}

/* NCCL passes getChunkSize the bytes of one channel part (calcCollChunking with nChannels = 1),
   getCollInfo the collective's bytes: the rule is the one getCollInfo's size selects. */
static int test_chunk_rule_by_collective_size(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 1\nAllReduce 1048576 max RING SIMPLE 0 131072 *\nAllReduce 0 1048575 RING SIMPLE 0 8192 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  void* ctx = init6(1);
  float t[21];
  int nch;
  fill(t, 10);
  call(ctx, ncclFuncAllReduce, 8u << 20, t, &nch); /* 8 MiB collective */
  size_t chunk = 524288;
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, 512u << 10, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 1, &chunk);
  TEST_ASSERT(chunk == 131072, "8 MiB rule, not the 512 KiB part's: %zu", chunk);
  fill(t, 10);
  call(ctx, ncclFuncAllReduce, 4096, t, &nch);
  chunk = 524288;
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, 4096, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 1, &chunk);
  TEST_ASSERT(chunk == 8192, "small collective: %zu", chunk);
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

/* Tuner v7 (NCCL 2.32.6): v6's functions, larger constants. */
static int test_v7_table(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 1\nAllReduce 0 max RING SIMPLE 4 131072 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  ncclTunerConstants_v7_t k;
  memset(&k, 0, sizeof k);
  ncclNvlDomainInfo_v7_t nvl = {1, 8, 8};
  void* ctx = NULL;
  TEST_ASSERT(ncclTunerPlugin_v7.init(&ctx, 0x7, 8, 1, mock_logger, &nvl, &k) == ncclSuccess && ctx, "v7 init");
  float t[21];
  int nch = 0;
  fill(t, 10);
  ncclTunerPlugin_v7.getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float**)t, 7, 3, 0, &nch);
  TEST_ASSERT(argmin(t, 21) == 5 && nch == 4, "v7 decides");
  size_t chunk = 524288;
  ncclTunerPlugin_v7.getChunkSize(ctx, ncclFuncAllReduce, 1 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 4, &chunk);
  TEST_ASSERT(chunk == 131072, "v7 chunk");
  TEST_ASSERT(strcmp(ncclTunerPlugin_v7.name, "dynamiccl") == 0 && sizeof k.llMaxBws == 5 * 3 * sizeof(double),
              "v7 constants: 5 compute capabilities");
  ncclTunerPlugin_v7.finalize(ctx);
  return 0;
}

/* ---- DYNAMICCL_TUNER_CHAIN ---- */
