/* DynamICCL profiler plugin: the TSC record clock's anchor (clock.h has the design). Written only
 * by the lifecycle (first init) and the sender thread; read lock-free on NCCL's threads.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <string.h>

#include "internal.h"

dccl_tsc_clock_t dccl_tsc;

uint64_t dccl_tsc_now_ns(void) {
#if defined(__x86_64__)
  uint64_t t;
  if (dccl_tsc_convert(__rdtsc(), &t)) return t;
#endif
  return dccl_realtime_ns();
}

/* Does a whitespace-separated word occur in the cpuinfo "flags" line / a sysfs file? */
static int file_has_word(const char* path, const char* prefix, const char* word) {
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    if (prefix && strncmp(line, prefix, strlen(prefix)) != 0) continue;
    for (char* tok = strtok(line, " \t\n:"); tok && !found; tok = strtok(NULL, " \t\n:")) found = !strcmp(tok, word);
    if (prefix) break; /* the first CPU's flags line decides */
  }
  fclose(f);
  return found;
}

int dccl_tsc_usable_at(const char* cpuinfo_path, const char* clocksource_path) {
#if defined(__x86_64__)
  return file_has_word(cpuinfo_path, "flags", "constant_tsc") && file_has_word(cpuinfo_path, "flags", "nonstop_tsc") &&
         file_has_word(clocksource_path, NULL, "tsc");
#else
  (void)cpuinfo_path;
  (void)clocksource_path;
  return 0;
#endif
}

const char* dccl_cpuinfo_path = "/proc/cpuinfo";
const char* dccl_clocksource_path = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

int dccl_tsc_usable(void) { return dccl_tsc_usable_at(dccl_cpuinfo_path, dccl_clocksource_path); }

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void dccl_tsc_anchor_at(uint64_t tsc, uint64_t rt_ns, uint64_t mono_ns_now) {
  uint64_t mult = atomic_load_explicit(&dccl_tsc.mult, memory_order_relaxed);
  uint64_t max_ticks = atomic_load_explicit(&dccl_tsc.max_ticks, memory_order_relaxed);
  if (dccl_tsc.rate_tsc == 0 || tsc <= dccl_tsc.rate_tsc || mono_ns_now <= dccl_tsc.rate_mono) {
    dccl_tsc.rate_tsc = tsc; /* first anchor, or a counter that went backwards: start a new interval */
    dccl_tsc.rate_mono = mono_ns_now;
  } else if (mono_ns_now - dccl_tsc.rate_mono >= DCCL_TSC_MIN_RATE_NS) {
    unsigned __int128 m = ((unsigned __int128)(mono_ns_now - dccl_tsc.rate_mono) << 32) / (tsc - dccl_tsc.rate_tsc);
    /* 0.05 to 20 ns per tick (20 GHz to 50 MHz): anything else is no TSC rate; keep the old one */
    if (m >= ((unsigned __int128)1 << 32) / 20 && m <= ((unsigned __int128)20 << 32)) {
      mult = (uint64_t)m;
      max_ticks = (uint64_t)(((unsigned __int128)DCCL_TSC_MAX_AGE_NS << 32) / mult);
    }
    dccl_tsc.rate_tsc = tsc;
    dccl_tsc.rate_mono = mono_ns_now;
  }
  uint64_t s = atomic_load_explicit(&dccl_tsc.seq, memory_order_relaxed);
  atomic_store_explicit(&dccl_tsc.seq, s + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&dccl_tsc.tsc0, tsc, memory_order_relaxed);
  atomic_store_explicit(&dccl_tsc.rt0, rt_ns, memory_order_relaxed);
  atomic_store_explicit(&dccl_tsc.mult, mult, memory_order_relaxed);
  atomic_store_explicit(&dccl_tsc.max_ticks, max_ticks, memory_order_relaxed);
  atomic_store_explicit(&dccl_tsc.seq, s + 2, memory_order_release);
}

/* Readings as close together as this thread gets them: the pair of TSC reads around the two clock
   reads that is shortest of three (a preempted try is discarded), the TSC taken at its middle. */
void dccl_tsc_anchor(void) {
#if defined(__x86_64__)
  uint64_t best = UINT64_MAX, tsc = 0, rt = 0, mono = 0;
  for (int i = 0; i < 3; i++) {
    uint64_t a = __rdtsc();
    uint64_t r = dccl_realtime_ns(), m = mono_ns();
    uint64_t b = __rdtsc();
    if (b > a && b - a < best) {
      best = b - a;
      tsc = a + (b - a) / 2;
      rt = r;
      mono = m;
    }
  }
  if (best != UINT64_MAX) dccl_tsc_anchor_at(tsc, rt, mono);
#endif
}
