/* emulate: replay NCCL's profiler call sequence against a plugin and time it.
 *
 *   emulate PLUGIN.so [--abi 4|5|6|7] [--flags EMU_F_*] [--colls N] [--warmup N] [--threads 1|2] [--comms K]
 *                     [--channels C] [--count ELEMS] [--reps R]
 *
 * Eager AllReduce (float32, RING/SIMPLE), one Coll + C KernelCh per operation, split
 * round-robin over K communicators in batches of 64. Prints one line per repetition and a
 * summary line:  ns_per_coll_median=... calls_per_coll=... [plugin stats]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dynamiccl_record.h"
#include "nccl_emu.h"

#define BATCH 64

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void usage(void) {
  fprintf(stderr,
          "usage: emulate PLUGIN.so [--abi 4|5|6|7] [--flags EMU_F_*] [--colls N] [--warmup N] [--threads 1|2] [--comms K]\n"
          "                         [--channels C] [--count ELEMS] [--reps R]\n");
}

/* Run n operations split over k comms; returns seconds. */
static double run(emu_t* e, const int* comms, int k, emu_coll_t* ops, long n, uint64_t* seq) {
  double t0 = now_s();
  for (long i = 0; i < n; i += BATCH) {
    int m = (int)((n - i) < BATCH ? (n - i) : BATCH);
    int comm = comms[(i / BATCH) % k];
    for (int j = 0; j < m; j++) {
      ops[j].seq_number = seq[comm]++;
      ops[j].gpu_start_ns = 1700000000000000000ull + ops[j].seq_number * 10000;
      ops[j].gpu_end_ns = ops[j].gpu_start_ns + 5000;
    }
    emu_run_colls(e, comm, ops, m);
  }
  for (int c = 0; c < k; c++) emu_sync(e, comms[c]);
  return now_s() - t0;
}

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    usage();
    return 2;
  }
  const char* path = argv[1];
  int abi = 6, threads = 1, k = 1, channels = 8, reps = 1;
  long colls = 200000, warmup = 20000;
  unsigned long long count = 1 << 20;
  unsigned flags = 0; /* emu_coll_t.flags of every operation (e.g. 0x400: v7 KernelPhase children) */
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    const char* v = (i + 1 < argc) ? argv[i + 1] : NULL;
    if (v == NULL) {
      usage();
      return 2;
    }
    if (!strcmp(a, "--abi")) abi = atoi(v);
    else if (!strcmp(a, "--colls")) colls = atol(v);
    else if (!strcmp(a, "--warmup")) warmup = atol(v);
    else if (!strcmp(a, "--threads")) threads = atoi(v);
    else if (!strcmp(a, "--comms")) k = atoi(v);
    else if (!strcmp(a, "--channels")) channels = atoi(v);
    else if (!strcmp(a, "--count")) count = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--reps")) reps = atoi(v);
    else if (!strcmp(a, "--flags")) flags = (unsigned)strtoul(v, NULL, 0);
    else {
      usage();
      return 2;
    }
    i++;
  }
  if (k < 1 || k > 64 || reps < 1 || reps > 1000 || colls < 1 || channels < 0 || channels > 64 ||
      (threads != 1 && threads != 2)) {
    usage();
    return 2;
  }
  emu_t* e = emu_open(path, abi);
  if (e == NULL) {
    fprintf(stderr, "emulate: %s\n", emu_error());
    return 1;
  }
  int comms[64];
  uint64_t seq[256] = {0};
  for (int c = 0; c < k; c++) {
    char name[32];
    snprintf(name, sizeof name, "emu-comm-%d", c);
    comms[c] = emu_comm_init(e, 0x1000u + (uint64_t)c, name, 1, 8, 0, threads);
    if (comms[c] < 0) {
      fprintf(stderr, "emulate: %s\n", emu_error());
      emu_close(e);
      return 1;
    }
  }
  emu_coll_t ops[BATCH];
  for (int j = 0; j < BATCH; j++) {
    ops[j] = (emu_coll_t){.func = DCCL_FUNC_ALLREDUCE, .datatype = DCCL_DTYPE_NCCLFLOAT32, .algo = DCCL_ALGO_RING,
                          .proto = DCCL_PROTO_SIMPLE, .n_channels = channels, .n_warps = 16, .root = 0,
                          .count = count, .flags = flags};
  }
  if (warmup > 0) run(e, comms, k, ops, warmup, seq);
  uint64_t calls0 = emu_plugin_calls(e);
  double* ns = calloc((size_t)reps, sizeof *ns);
  for (int r = 0; r < reps; r++) {
    double s = run(e, comms, k, ops, colls, seq);
    ns[r] = s * 1e9 / (double)colls;
    printf("rep %d: %.1f ns/coll\n", r, ns[r]);
  }
  double calls = (double)(emu_plugin_calls(e) - calls0) / ((double)colls * reps);
  qsort(ns, (size_t)reps, sizeof *ns, cmp_double);
  printf("emulate: plugin=%s abi=%d threads=%d comms=%d channels=%d colls=%ld reps=%d ns_per_coll_median=%.1f "
         "calls_per_coll=%.1f\n",
         emu_plugin_name(e), abi, threads, k, channels, colls, reps, ns[reps / 2], calls);
  free(ns);
  for (int c = 0; c < k; c++) emu_comm_finalize(e, comms[c]);
  dccl_stats_record_t st;
  if (emu_plugin_stats(e, &st) == 0) {
    printf("stats: records_emitted=%llu records_sent=%llu records_undelivered=%llu records_dropped_ring_full=%llu "
           "events_dropped_pool_full=%llu events_stale=%llu sampled_out=%llu\n",
           (unsigned long long)st.records_emitted, (unsigned long long)st.records_sent,
           (unsigned long long)st.records_undelivered, (unsigned long long)st.records_dropped_ring_full,
           (unsigned long long)st.events_dropped_pool_full, (unsigned long long)st.events_stale,
           (unsigned long long)st.sampled_out);
  }
  emu_close(e);
  return 0;
}
