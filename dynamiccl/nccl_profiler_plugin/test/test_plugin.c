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
#include "../src/clock.c"
#include "../src/plugin.c"
#include "../src/finish.c"
#include "../src/chain.c"
#include "../src/chain_kept.c"
#include "../src/chain_lifecycle.c"
#include "../src/net.c"
#include "../src/ring.c"
#include "../src/lifecycle.c"
#include "../src/tuner_link.c"
#include "../src/connect.c"
#include "../src/sender.c"
#include "../src/stale_guard.c"

#include "harness.h"

static void clear_env(void) {
  const char* vars[] = {"DYNAMICCL_COLLECTOR", "DYNAMICCL_EVENT_MASK", "DYNAMICCL_POOL_SIZE", "DYNAMICCL_RING_SIZE",
                        "DYNAMICCL_MIN_BYTES", "DYNAMICCL_SAMPLE",     "DYNAMICCL_FLUSH_MS",  "DYNAMICCL_STALE_MS", "DYNAMICCL_CLOCK", "DYNAMICCL_STALE_GUARD_US"};
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

/* A P2p start; returns its handle. */
static void* p2p_start_typed(void* ctx, const char* func, const char* dtype, size_t count, int peer, uint8_t nch) {
  ncclProfilerEventDescr_v6_t d = {.type = ncclProfileP2p,
                                   .p2p = {.func = func, .datatype = dtype, .count = count, .peer = peer, .nChannels = nch}};
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  return h;
}

/* One P2p (2 channels, KernelCh after its stop) with the given pTimers; returns its handle. */
static void* run_p2p(void* ctx, const char* func, int peer, uint64_t t0, uint64_t t1) {
  void* h = p2p_start_typed(ctx, func, "ncclInt32", 256, peer, 2);
  ncclProfiler_v6.stopEvent(h);
  for (uint8_t c = 0; c < 2 && h != NULL; c++) kch_stop(kch_start(ctx, h, c, t0 + c), t1 - c);
  return h;
}

#include "cases_events.c"
#include "cases_lifecycle.c"
#include "cases_real_paths.c"
#include "cases_chain.c"
#include "cases_net.c"
#include "cases_clock.c"
#include "cases_completion.c"
#include "cases_stale_guard.c"

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
    {"stop_in_reap_window", test_stop_in_reap_window},
    {"uint8_bytes", test_uint8_bytes},
    {"retired_comm_late_stop_and_announce", test_retired_comm_late_stop_and_announce},
    {"v7_user_tag_and_symmetric", test_v7_user_tag_and_symmetric},
    {"ce_collective_counted", test_ce_collective_counted},
    {"coverage_counted", test_coverage_counted},
    {"init_never_fails_after_success", test_init_never_fails_after_success},
    {"kch_order_guard", test_kch_order_guard},
    {"span_check_guard", test_span_check_guard},
    {"chain_handles", test_chain_handles},
    {"chain_child_under_other_comm", test_chain_child_under_other_comm},
    {"chain_kch_stop_at_state", test_chain_kch_stop_at_state},
    {"chain_handle_of_reused_index", test_chain_handle_of_reused_index},
    {"chain_forwards_only_its_types", test_chain_forwards_only_its_types},
    {"kernel_variant_hash", test_kernel_variant_hash},
    {"net_peers_and_stale", test_net_peers_and_stale},
    {"tsc_clock_anchor", test_tsc_clock_anchor},
    {"tsc_clock_live", test_tsc_clock_live},
    {"clock_choice", test_clock_choice},
    {"completion_marks_generation", test_completion_marks_generation},
    {"stale_guard_rule", test_stale_guard_rule},
    {"stale_guard_off_unless_aligned", test_stale_guard_off_unless_aligned},
    {"stale_guard_follows_drift", test_stale_guard_follows_drift},
    {"stale_guard_in_sender_drain", test_stale_guard_in_sender_drain},
    {"stale_guard_deep_queue", test_stale_guard_deep_queue},
    {"stale_guard_relearns_after_clock_step", test_stale_guard_relearns_after_clock_step},
};

int main(int argc, char** argv) {
  return run_tests(k_tests, sizeof k_tests / sizeof k_tests[0], argc, argv);
}
