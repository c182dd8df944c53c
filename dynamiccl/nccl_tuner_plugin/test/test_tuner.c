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
#include "cases_rules.c"
#include "cases_reload.c"
#include "cases_chain.c"


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
