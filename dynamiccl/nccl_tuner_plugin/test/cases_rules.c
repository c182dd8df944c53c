/* Tuner unit tests: the config grammar, rule matching, chunk sizes and agree(). #included by test_tuner.c (one translation unit with the plugin sources). */

static int test_parse_valid(void) {
  static dct_parsed_t p;
  char err[256];
  const char* text =
      "# dynamiccl tuner config\n"
      "version 3\n"
      "AllReduce 0 65535 RING LL 8 0 *   # trailing comment\n"
      "version 4 at 1767225600000000000\r\n"
      "\tAllGather\t1048576 max * SIMPLE 0 0 0x1f2e3d4c5b6a7988\n"
      "AllReduce 0 10 TREE * 2 131072 1F\n"
      "Broadcast 5 5 PAT LL128 64 0 *\n"
      "AllToAll 0 max * * 0 0 *\n";
  TEST_ASSERT(dct_parse(text, strlen(text), &p, err, sizeof err) == 0, "%s", err);
  TEST_ASSERT(p.n == 2 && p.v[0].version == 3 && p.v[1].version == 4, "versions");
  TEST_ASSERT(p.v[1].apply_at_ns == 1767225600000000000ull && p.v[0].apply_at_ns == 0, "at");
  const dct_version_t* v = &p.v[1];
  TEST_ASSERT(v->n_rules == 4, "n_rules %u", v->n_rules);
  /* grouped by function: Broadcast(0) first, then AllGather(2), AllReduce(4), AllToAll(5) */
  TEST_ASSERT(v->func_start[0] == 0 && v->func_start[1] == 1 && v->func_start[2] == 1 && v->func_start[3] == 2 &&
                  v->func_start[4] == 2 && v->func_start[5] == 3 && v->func_start[6] == 4,
              "func_start");
  TEST_ASSERT(v->rules[0].algo == NCCL_ALGO_PAT && v->rules[0].proto == NCCL_PROTO_LL128 && v->rules[0].nch == 64,
              "broadcast rule");
  TEST_ASSERT(v->rules[1].comm == 0x1f2e3d4c5b6a7988ull && !v->rules[1].any_comm && v->rules[1].algo == -1 &&
                  v->rules[1].max_bytes == UINT64_MAX,
              "allgather rule");
  TEST_ASSERT(v->rules[2].chunk == 131072 && v->rules[2].comm == 0x1f, "allreduce rule");
  /* an empty file is valid: no versions */
  TEST_ASSERT(dct_parse("", 0, &p, err, sizeof err) == 0 && p.n == 0, "empty");
  return 0;
}

static int test_parse_rejects(void) {
  static dct_parsed_t p;
  char err[256];
  const char* bad[] = {
      "AllReduce 0 1 RING LL 0 0 *\n",                    /* rule before version */
      "version 0\n",                                      /* version 0 */
      "version -1\n",                                     /* sign */
      "version 2\nversion 2\n",                           /* not increasing */
      "version 3\nversion 2\n",                           /* decreasing */
      "version 1 2\n",                                    /* bad version line */
      "version 1 at\n",                                   /* missing time */
      "version 9223372036854775808\n",                    /* 2^63 */
      "version 1\nAllreduce 0 1 RING LL 0 0 *\n",         /* case */
      "version 1\nAllReduce 0 1 ring LL 0 0 *\n",         /* algo case */
      "version 1\nAllReduce 0 1 RING LL 65 0 *\n",        /* channels > 64 */
      "version 1\nAllReduce 0 1 RING LL -1 0 *\n",        /* negative */
      "version 1\nAllReduce +1 1 RING LL 0 0 *\n",        /* sign */
      "version 1\nAllReduce 1_0 100 RING LL 0 0 *\n",     /* underscore */
      "version 1\nAllReduce 5 4 RING LL 0 0 *\n",         /* min > max */
      "version 1\nAllReduce 0 18446744073709551616 RING LL 0 0 *\n", /* 2^64 */
      "version 1\nAllReduce 0 1 RING LL 0 0 0x\n",        /* empty hex */
      "version 1\nAllReduce 0 1 RING LL 0 0 0x11112222333344445\n", /* 17 hex digits */
      "version 1\nAllReduce 0 1 RING LL 0 0\n",           /* 7 fields */
      "version 1\nAllReduce 0 1 RING LL 0 0 * x\n",       /* 9 fields */
      "version 1\nSendRecv 0 1 RING LL 0 0 *\n",          /* not a tuned collective */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    TEST_ASSERT(dct_parse(bad[i], strlen(bad[i]), &p, err, sizeof err) != 0, "accepted bad file %zu: %s", i, bad[i]);
  TEST_ASSERT(strstr(err, "line 2") != NULL, "error names the line: %s", err);
  /* limits: 9 versions, 257 rules */
  static char big[1 << 16];
  size_t n = 0;
  for (int v = 1; v <= 9; v++) n += (size_t)snprintf(big + n, sizeof big - n, "version %d\n", v);
  TEST_ASSERT(dct_parse(big, n, &p, err, sizeof err) != 0 && strstr(err, "versions"), "9 versions: %s", err);
  n = (size_t)snprintf(big, sizeof big, "version 1\n");
  for (int r = 0; r < 257; r++) n += (size_t)snprintf(big + n, sizeof big - n, "AllReduce %d %d * * 0 0 *\n", r, r);
  TEST_ASSERT(dct_parse(big, n, &p, err, sizeof err) != 0 && strstr(err, "rules"), "257 rules: %s", err);
  return 0;
}

static int test_no_config_leaves_table(void) {
  reset(DCT_MODE_IMMEDIATE);
  void* ctx = init6(1);
  float t[21], ref[21];
  fill(t, 10);
  memcpy(ref, t, sizeof t);
  int nch = 0;
  call(ctx, ncclFuncAllReduce, 4096, t, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0 && nch == 0, "table untouched without config");
  TEST_ASSERT(dynamiccl_tuner_reload() == 0, "absent file");
  call(ctx, ncclFuncAllReduce, 4096, t, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0 && nch == 0, "table untouched with absent file");
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

static int test_forces_cell_never_revives(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 1\n"
             "AllReduce 0 1000 RING LL 4 0 *\n"
             "AllReduce 1001 2000 * SIMPLE 0 0 *\n"
             "AllReduce 2001 3000 NVLS * 0 0 *\n"
             "AllGather 0 max PAT * 2 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload: %s", dct_g.last_error);
  TEST_ASSERT(dynamiccl_tuner_applied_version() == 1, "immediate applies");
  void* ctx = init6(1);
  float t[21];
  int nch;
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 500, t, &nch) == 1 * 3 + 0 && nch == 4 && t[3] == 0.0f, "RING/LL forced");
  /* the cell is -1: never revived, NCCL's choice stands */
  fill(t, 10);
  t[3] = -1.0f;
  float ref[21];
  memcpy(ref, t, sizeof t);
  call(ctx, ncclFuncAllReduce, 500, t, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0 && nch == 0, "-1 revived or table changed");
  /* proto-only: cheapest enabled SIMPLE cell; TREE/SIMPLE disabled -> RING/SIMPLE */
  fill(t, 10);
  t[0 * 3 + 2] = -1.0f;
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 1500, t, &nch) == 1 * 3 + 2, "cheapest enabled SIMPLE");
  for (int i = 0; i < 21; i++) TEST_ASSERT(t[i] == (i == 5 ? 0.0f : (i == 2 ? -1.0f : 10.0f + i)), "other cells");
  /* algo-only: NVLS row all -1 -> no decision */
  fill(t, 10);
  for (int p = 0; p < 3; p++) t[4 * 3 + p] = -1.0f;
  memcpy(ref, t, sizeof t);
  call(ctx, ncclFuncAllReduce, 2500, t, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0, "NVLS disabled: untouched");
  /* numAlgo = 6 (NCCL <= 2.22, no PAT): PAT rule cannot apply, nothing written out of bounds */
  float t6[19];
  for (int i = 0; i < 19; i++) t6[i] = 5.0f + (float)i;
  t6[18] = 1234.0f; /* sentinel right after the 6x3 table */
  nch = 0;
  ncclTunerPlugin_v6.getCollInfo(ctx, ncclFuncAllGather, 10, 1, (float**)t6, 6, 3, 0, &nch);
  TEST_ASSERT(t6[18] == 1234.0f && nch == 0 && argmin(t6, 18) == 0, "6-algo table");
  /* a rule for another size: untouched; unknown function: untouched */
  fill(t, 10);
  memcpy(ref, t, sizeof t);
  call(ctx, ncclFuncAllReduce, 5000, t, &nch);
  call(ctx, ncclFuncSend, 10, t, &nch);
  call(ctx, 42, 10, t, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0, "no rule: untouched");
  /* NULL arguments never crash */
  ncclTunerPlugin_v6.getCollInfo(NULL, ncclFuncAllReduce, 10, 1, (float**)t, 7, 3, 0, &nch);
  ncclTunerPlugin_v6.getCollInfo(ctx, ncclFuncAllReduce, 10, 1, NULL, 7, 3, 0, &nch);
  fill(t, 10);
  ncclTunerPlugin_v6.getCollInfo(ctx, ncclFuncAllReduce, 10, 1, (float**)t, 7, 3, 0, NULL);
  TEST_ASSERT(t[3] == 0.0f, "NULL nChannels still decides");
  dynamiccl_tuner_stats_t st;
  dynamiccl_tuner_stats(&st);
  TEST_ASSERT(st.decisions >= 3 && st.no_enabled_cell == 3 && st.contexts == 1, "stats %llu %llu",
              (unsigned long long)st.decisions, (unsigned long long)st.no_enabled_cell);
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

static int test_first_match_and_comm(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 5\n"
             "AllReduce 0 100 TREE LL 0 0 0xabc\n"
             "AllReduce 0 100 RING LL 0 0 *\n"
             "AllReduce 0 100 TREE SIMPLE 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  void* a = init6(0xabc);
  void* b = init6(0xdef);
  float t[21];
  int nch;
  fill(t, 10);
  TEST_ASSERT(call(a, ncclFuncAllReduce, 50, t, &nch) == 0, "comm-specific rule first");
  fill(t, 10);
  TEST_ASSERT(call(b, ncclFuncAllReduce, 50, t, &nch) == 3, "other comm: the first rule that matches");
  ncclTunerPlugin_v6.finalize(a);
  ncclTunerPlugin_v6.finalize(b);
  /* v4 has no commId: a version with a communicator-specific rule is not applied at all */
  void* c = NULL;
  ncclTunerPlugin_v4.init(8, 1, mock_logger, &c);
  fill(t, 10);
  float ref[21];
  memcpy(ref, t, sizeof t);
  nch = 0;
  ncclTunerPlugin_v4.getCollInfo(c, ncclFuncAllReduce, 50, 1, (float**)t, 7, 3, 0, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0, "v4: version with comm rules not applied");
  ncclTunerPlugin_v4.destroy(c);
  /* v5 table */
  void* d = NULL;
  ncclTunerPlugin_v5.init(&d, 0xabc, 8, 1, mock_logger, NULL, NULL);
  fill(t, 10);
  ncclTunerPlugin_v5.getCollInfo(d, ncclFuncAllReduce, 50, 1, (float**)t, 7, 3, 0, &nch);
  TEST_ASSERT(argmin(t, 21) == 0, "v5");
  ncclTunerPlugin_v5.finalize(d);
  TEST_ASSERT(dct_g.refcount == 0 && dct_g.ctxs == NULL, "all finalized");
  return 0;
}

static int test_chunk_size(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 1\nAllReduce 0 max RING SIMPLE 0 131072 *\nAllGather 0 max * * 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  void* ctx = init6(1);
  size_t chunk = 524288;
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, 1 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 8, &chunk);
  TEST_ASSERT(chunk == 131072, "chunk set: %zu", chunk);
  chunk = 524288;
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllReduce, 1 << 20, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 8, &chunk);
  TEST_ASSERT(chunk == 524288, "other algo: NCCL's chunk");
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllGather, 1 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 8, &chunk);
  TEST_ASSERT(chunk == 524288, "chunk 0: NCCL's chunk");
  ncclTunerPlugin_v6.getChunkSize(ctx, ncclFuncAllGather, 1 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 8, NULL);
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

static int test_agree_apply(void) {
  reset(DCT_MODE_AGREE);
  write_file("version 1\nAllReduce 0 max TREE LL 0 0 *\nversion 2\nAllReduce 0 max RING LL 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  TEST_ASSERT(dynamiccl_tuner_staged_version() == 2 && dynamiccl_tuner_oldest_version() == 1, "staged");
  TEST_ASSERT(dynamiccl_tuner_applied_version() == 0, "agree mode: nothing applied by a reload");
  void* ctx = init6(1);
  float t[21], ref[21];
  int nch;
  fill(t, 10);
  memcpy(ref, t, sizeof t);
  call(ctx, ncclFuncAllReduce, 64, t, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0, "staged but not applied: untouched");
  TEST_ASSERT(dynamiccl_tuner_apply_version(1) == 0 && dynamiccl_tuner_config_version(1) == 1, "apply 1");
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 64, t, &nch) == 0, "version 1: TREE/LL");
  TEST_ASSERT(dynamiccl_tuner_apply_version(2) == 0, "apply 2");
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 64, t, &nch) == 3, "version 2: RING/LL");
  TEST_ASSERT(dynamiccl_tuner_apply_version(9) == -1 && dynamiccl_tuner_applied_version() == 2, "9 not staged");
  TEST_ASSERT(strstr(dct_g.last_error, "not staged") != NULL, "error: %s", dct_g.last_error);
  /* prepare pins a version that a new file drops */
  TEST_ASSERT(dynamiccl_tuner_prepare_version(1) == 1, "prepare 1");
  write_file("version 2\nAllReduce 0 max RING LL 0 0 *\nversion 3\nAllReduce 0 max TREE SIMPLE 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1 && dynamiccl_tuner_oldest_version() == 2, "reload drops 1");
  TEST_ASSERT(dynamiccl_tuner_apply_version(1) == 0, "prepared version 1 still applicable");
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 64, t, &nch) == 0, "version 1 rules");
  TEST_ASSERT(dynamiccl_tuner_prepare_version(7) == 0 && dynamiccl_tuner_prepare_version(0) == 1, "prepare 7/0");
  TEST_ASSERT(dynamiccl_tuner_apply_version(0) == 0 && dynamiccl_tuner_config_version(1) == 0, "back to NCCL");
  fill(t, 10);
  memcpy(ref, t, sizeof t);
  call(ctx, ncclFuncAllReduce, 64, t, &nch);
  TEST_ASSERT(memcmp(t, ref, sizeof t) == 0, "version 0: untouched");
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

static int test_reload_keeps_last_good(void) {
  reset(DCT_MODE_IMMEDIATE);
  write_file("version 4\nAllReduce 0 max RING LL 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload");
  void* ctx = init6(1);
  const char* bad[] = {
      "version 5\nAllReduce 0 max RING LL 0 0\n",                         /* malformed */
      "version 3\nAllReduce 0 max TREE LL 0 0 *\n",                        /* goes back */
      "version 4\nAllReduce 0 max TREE LL 0 0 *\n",                        /* same number, other rules */
      "version 5\nAllReduce 0 max TREE LL 0 0 *\nversion 5\n",             /* duplicate */
      "\x01\x02garbage\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_file(bad[i]);
    TEST_ASSERT(dynamiccl_tuner_reload() == -1, "bad file %zu accepted", i);
    TEST_ASSERT(dynamiccl_tuner_staged_version() == 4 && dynamiccl_tuner_applied_version() == 4, "kept 4");
    float t[21];
    int nch;
    fill(t, 10);
    TEST_ASSERT(call(ctx, ncclFuncAllReduce, 64, t, &nch) == 3, "last good rules still used");
    TEST_ASSERT(dynamiccl_tuner_reload() == 0, "an unchanged bad file is not re-read");
  }
  TEST_ASSERT(g_warns == 1, "logged once per streak, got %d warnings", g_warns);
  dynamiccl_tuner_stats_t st;
  dynamiccl_tuner_stats(&st);
  TEST_ASSERT(st.reload_errors == 5 && st.reloads == 1, "counted: %llu", (unsigned long long)st.reload_errors);
  char msg[512];
  TEST_ASSERT(dynamiccl_tuner_last_error(msg, sizeof msg) > 0 && strstr(msg, g_path), "last error: %s", msg);
  /* file disappears: keep; comes back valid: load */
  unlink(g_path);
  TEST_ASSERT(dynamiccl_tuner_reload() == 0 && dynamiccl_tuner_applied_version() == 4, "missing: kept");
  write_file("version 6\nAllReduce 0 max TREE LL 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1 && dynamiccl_tuner_applied_version() == 6, "recovered");
  TEST_ASSERT(dynamiccl_tuner_last_error(msg, sizeof msg) == 0, "error cleared");
  /* an empty file resets to NCCL's choice, and versions still may not go back afterwards */
  write_file("# nothing\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1 && dynamiccl_tuner_applied_version() == 0, "reset");
  write_file("version 6\nAllReduce 0 max RING SIMPLE 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == -1 && dynamiccl_tuner_applied_version() == 0, "6 reused after reset");
  write_file("version 7\nAllReduce 0 max RING SIMPLE 0 0 *\n");
  TEST_ASSERT(dynamiccl_tuner_reload() == 1 && dynamiccl_tuner_applied_version() == 7, "7 after reset");
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

static int test_epoch_mode(void) {
  reset(DCT_MODE_EPOCH);
  char text[256];
  uint64_t now = dct_now_ns();
  snprintf(text, sizeof text,
           "version 1 at %llu\nAllReduce 0 max TREE LL 0 0 *\n"
           "version 2 at %llu\nAllReduce 0 max RING LL 0 0 *\n"
           "version 3\nAllReduce 0 max RING SIMPLE 0 0 *\n",
           (unsigned long long)(now - 1000000000ull), (unsigned long long)(now + 300000000ull));
  write_file(text);
  TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload: %s", dct_g.last_error);
  void* ctx = init6(1);
  float t[21];
  int nch;
  /* version 1's time has passed: late, applied at the next call */
  TEST_ASSERT(atomic_load(&dct_g.epoch_late) == 1, "late counted");
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 64, t, &nch) == 0 && dynamiccl_tuner_applied_version() == 1, "v1");
  epoch_refresh(0); /* what the reload thread does every poll */
  TEST_ASSERT(atomic_load(&dct_g.pending_version) == 2, "2 pending");
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 64, t, &nch) == 0, "still v1 before its time");
  struct timespec ts = {0, 350000000};
  nanosleep(&ts, NULL);
  fill(t, 10);
  TEST_ASSERT(call(ctx, ncclFuncAllReduce, 64, t, &nch) == 3 && dynamiccl_tuner_applied_version() == 2, "v2 at T");
  epoch_refresh(0);
  TEST_ASSERT(atomic_load(&dct_g.pending_tag) == 0, "version 3 has no epoch: never applied in epoch mode");
  TEST_ASSERT(dynamiccl_tuner_apply_version(3) == -1, "apply refused outside agree mode");
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}

/* Hundreds of new versions (each slot reused ~20 times): slots are recycled, tags stay valid, nothing is exhausted. */
static int test_slot_recycling(void) {
  reset(DCT_MODE_AGREE);
  void* ctx = init6(1);
  char text[4096];
  for (int v = 1; v <= 600; v++) {
    size_t n = 0;
    for (int k = v > 8 ? v - 7 : 1; k <= v; k++)
      n += (size_t)snprintf(text + n, sizeof text - n, "version %d\nAllReduce 0 max %s LL %d 0 *\n", k,
                            k % 2 ? "TREE" : "RING", k % 64 + 1);
    write_file(text);
    TEST_ASSERT(dynamiccl_tuner_reload() == 1, "reload %d: %s", v, dct_g.last_error);
    uint64_t target = (uint64_t)(v > 3 ? v - 3 : 1); /* apply a version behind the newest */
    TEST_ASSERT(dynamiccl_tuner_apply_version(target) == 0, "apply %llu", (unsigned long long)target);
    float t[21];
    int nch;
    fill(t, 10);
    int cell = call(ctx, ncclFuncAllReduce, 64, t, &nch);
    TEST_ASSERT(cell == (target % 2 ? 0 : 3) && nch == (int)(target % 64 + 1), "v%d decision", v);
  }
  dynamiccl_tuner_stats_t st;
  dynamiccl_tuner_stats(&st);
  TEST_ASSERT(st.slots_exhausted == 0 && st.reload_errors == 0, "no exhaustion");
  ncclTunerPlugin_v6.finalize(ctx);
  return 0;
}
