/* Unit tests for the DynamICCL tuner plugin. No GPU, no NCCL.
 *
 * The plugin sources are #included, a mock logger captures messages, and a table of tests runs
 * all (./test_tuner) or one by name (./test_tuner reload_keeps_last_good). Each test starts
 * from a reset global state and its own config file under $TMPDIR.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include "../src/control.c"
#include "../src/reload.c"
#include "../src/rules.c"
#include "../src/tuner.c"
#include "../src/chain.c"

#include "../../nccl_profiler_plugin/test/harness.h"
#include <sched.h>

static char g_path[512];

/* Back to a fresh process state (no thread, no contexts, no versions), config at g_path. */
static void reset(int mode) {
  dct_thread_stop();
  dct_chain_unload();
  dct_g.ctxs = NULL;
  dct_g.refcount = 0;
  for (int i = 0; i < DCT_NSLOTS; i++) {
    atomic_store(&dct_g.slots[i].seq, atomic_load(&dct_g.slots[i].seq) + 2); /* stale tags stay stale */
    dct_g.slots[i].used = 0;
    dct_g.slots[i].retired_ms = 0;
    memset(&dct_g.slots[i].v, 0, sizeof dct_g.slots[i].v);
  }
  atomic_store(&dct_g.applied_tag, 0);
  atomic_store(&dct_g.pending_tag, 0);
  atomic_store(&dct_g.applied_version, 0);
  atomic_store(&dct_g.staged_version, 0);
  atomic_store(&dct_g.oldest_version, 0);
  atomic_store(&dct_g.pending_version, 0);
  atomic_store(&dct_g.pending_at_ns, 0);
  dct_g.n_staged = 0;
  dct_g.prepared = -1;
  dct_g.high_water = 0;
  dct_g.have_ident = dct_g.had_file = dct_g.missing_logged = dct_g.error_streak = 0;
  dct_g.last_error[0] = '\0';
  _Atomic uint64_t* ctrs[] = {&dct_g.reloads,     &dct_g.reload_errors, &dct_g.files_missing, &dct_g.applies,
                              &dct_g.apply_refused, &dct_g.epoch_late, &dct_g.slots_exhausted, &dct_g.f_calls,
                              &dct_g.f_decisions, &dct_g.f_no_enabled, &dct_g.f_chunk_set, &dct_g.f_retries};
  for (size_t i = 0; i < sizeof ctrs / sizeof ctrs[0]; i++) atomic_store(ctrs[i], 0);
  dct_g.logfn = mock_logger;
  const char* tmp = getenv("TMPDIR");
  snprintf(g_path, sizeof g_path, "%s/dccl-tuner-test-%d.conf", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  unlink(g_path);
  dynamiccl_tuner_configure(g_path, mode, 0);
  g_log[0] = '\0';
  g_warns = 0;
}

/* Atomic replace, with a distinct mtime/inode every time. */
static void write_file(const char* text) {
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", g_path);
  FILE* f = fopen(tmp, "w");
  fputs(text, f);
  fclose(f);
  rename(tmp, g_path);
}

static void* init6(uint64_t comm) {
  void* ctx = NULL;
  ncclTunerPlugin_v6.init(&ctx, comm, 8, 2, mock_logger, NULL, NULL);
  return ctx;
}

/* A 7x3 table with distinct costs; returns the argmin cell (a*3+p) after getCollInfo, -1 if none. */
static void fill(float* t, float base) {
  for (int i = 0; i < 21; i++) t[i] = base + (float)i;
}
static int argmin(const float* t, int n) {
  int best = -1;
  for (int i = 0; i < n; i++)
    if (t[i] >= 0 && (best < 0 || t[i] < t[best])) best = i;
  return best;
}
static int call(void* ctx, int func, size_t nbytes, float* t, int* nch) {
  *nch = 0;
  ncclTunerPlugin_v6.getCollInfo(ctx, (ncclFunc_t)func, nbytes, 1, (float**)t, 7, 3, 0, nch);
  return argmin(t, 21);
}

/* ------------------------------------------------------------------------------------------ */

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

static const test_case_t k_tests[] = {
    {"parse_valid", test_parse_valid},
    {"parse_rejects", test_parse_rejects},
    {"no_config_leaves_table", test_no_config_leaves_table},
    {"forces_cell_never_revives", test_forces_cell_never_revives},
    {"first_match_and_comm", test_first_match_and_comm},
    {"chunk_size", test_chunk_size},
    {"agree_apply", test_agree_apply},
    {"reload_keeps_last_good", test_reload_keeps_last_good},
    {"epoch_mode", test_epoch_mode},
    {"slot_recycling", test_slot_recycling},
    {"concurrent_reload", test_concurrent_reload},
    {"stale_tag_rejected", test_stale_tag_rejected},
    {"reload_thread", test_reload_thread},
    {"env", test_env},
    {"default_dir_refused", test_default_dir_refused},
    {"chunk_rounded_to_protocol_grain", test_chunk_rounded_to_protocol_grain},
    {"channels_only_where_nccl_clamps", test_channels_only_where_nccl_clamps},
    {"tuning_subsystem_flag", test_tuning_subsystem_flag},
    {"v4_version_stamp", test_v4_version_stamp},
    {"chunk_rule_by_collective_size", test_chunk_rule_by_collective_size},
    {"v7_table", test_v7_table},
    {"chain_decides_where_no_rule", test_chain_decides_where_no_rule},
    {"chain_across_versions", test_chain_across_versions},
};

int main(int argc, char** argv) {
  int rc = run_tests(k_tests, sizeof k_tests / sizeof k_tests[0], argc, argv);
  unlink(g_path);
  return rc;
}
