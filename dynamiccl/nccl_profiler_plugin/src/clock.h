/* DynamICCL profiler plugin: the record clock (CLOCK_REALTIME nanoseconds), chosen once at the first init.
 *
 * The TSC (below) wherever it qualifies (unset DYNAMICCL_CLOCK, or 1): x86-64 with constant_tsc and
 * nonstop_tsc and the kernel's clocksource `tsc`, i.e. where clock_gettime's vDSO reads that same
 * counter, so the TSC clock is as good as what it would read and ~24 ns per operation cheaper (two
 * reads; the emulator's interleaved minima, Session 18). Elsewhere, and with DYNAMICCL_CLOCK=0:
 * clock_gettime(CLOCK_REALTIME) through the vDSO on every read.
 * The TSC clock: the TSC scaled to CLOCK_REALTIME with an anchor the sender thread refreshes at
 * every wake-up (DYNAMICCL_FLUSH_MS): ns = rt0 + (tsc - tsc0) * rate, the rate measured against
 * CLOCK_MONOTONIC between anchors (so it follows NTP's frequency correction; a CLOCK_REALTIME step
 * is taken at the next anchor). Used only where the TSC is invariant and the kernel's clocksource
 * is `tsc` (the vDSO then reads the same counter); a read falls back to clock_gettime while no rate
 * is known yet, while the anchor is being written, or when it is older than DCCL_TSC_MAX_AGE_NS.
 */
#ifndef DYNAMICCL_CLOCK_H_
#define DYNAMICCL_CLOCK_H_

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#define DCCL_TSC_MAX_AGE_NS 1000000000ull  /* extrapolate at most 1 s past an anchor */
#define DCCL_TSC_MIN_RATE_NS 10000000ull   /* a rate is measured over at least 10 ms */

/* DYNAMICCL_CLOCK: 0 and 1 are the variable's values, AUTO its default (unset). */
#define DCCL_CLOCK_VDSO 0u
#define DCCL_CLOCK_TSC 1u
#define DCCL_CLOCK_AUTO 2u

typedef struct dccl_tsc_clock {
  _Atomic int on;                 /* set at the first init on a qualifying host, unless DYNAMICCL_CLOCK=0 */
  _Atomic uint64_t seq;           /* seqlock: odd while the anchor is written */
  _Atomic uint64_t tsc0, rt0;     /* the anchor: a TSC reading and CLOCK_REALTIME at that moment */
  _Atomic uint64_t mult;          /* ns per tick << 32; 0 until a rate was measured */
  _Atomic uint64_t max_ticks;     /* DCCL_TSC_MAX_AGE_NS in ticks */
  uint64_t rate_tsc, rate_mono;   /* the sender's: where the current rate interval began */
} dccl_tsc_clock_t;

extern dccl_tsc_clock_t dccl_tsc;

/* Where the host's TSC readings are read (tests point them at injected files). */
extern const char* dccl_cpuinfo_path;
extern const char* dccl_clocksource_path;
/* 1 when this host's TSC may stand in for the vDSO clock (x86-64, constant_tsc and nonstop_tsc in the
   first CPU's flags, clocksource tsc), read from the two paths above. */
int dccl_tsc_usable(void);
/* Same, from the given /proc/cpuinfo and current_clocksource files (tests inject them). */
int dccl_tsc_usable_at(const char* cpuinfo_path, const char* clocksource_path);
/* The clock a DYNAMICCL_CLOCK setting (DCCL_CLOCK_*) gets on a host where the TSC is usable or not. */
static inline int dccl_clock_wants_tsc(uint32_t setting, int usable) {
  return setting != DCCL_CLOCK_VDSO && usable;
}
/* The sender's refresh (also the first anchor at init); a rate once two anchors are >= 10 ms apart. */
void dccl_tsc_anchor(void);
/* Same, from given readings (tests inject them). */
void dccl_tsc_anchor_at(uint64_t tsc, uint64_t rt_ns, uint64_t mono_ns);

static inline uint64_t dccl_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The TSC reading of tsc as CLOCK_REALTIME ns in *out; 0 when the anchor cannot be used. */
static inline int dccl_tsc_convert(uint64_t tsc, uint64_t* out) {
  uint64_t s = atomic_load_explicit(&dccl_tsc.seq, memory_order_acquire);
  uint64_t tsc0 = atomic_load_explicit(&dccl_tsc.tsc0, memory_order_relaxed);
  uint64_t rt0 = atomic_load_explicit(&dccl_tsc.rt0, memory_order_relaxed);
  uint64_t mult = atomic_load_explicit(&dccl_tsc.mult, memory_order_relaxed);
  uint64_t max_ticks = atomic_load_explicit(&dccl_tsc.max_ticks, memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  uint64_t d = tsc - tsc0; /* a reading before the anchor wraps to a huge value and is refused */
  if ((s & 1) || mult == 0 || d > max_ticks || atomic_load_explicit(&dccl_tsc.seq, memory_order_relaxed) != s)
    return 0;
  *out = rt0 + (uint64_t)(((unsigned __int128)d * mult) >> 32);
  return 1;
}

/* The TSC path of dccl_now_ns, out of line: inlined it measured no faster (+93.5 ns added per collective
   both ways, 41 interleaved rounds, Session 18) and would double the read at both call sites. */
uint64_t dccl_tsc_now_ns(void);

/* CLOCK_REALTIME ns for records. */
static inline uint64_t dccl_now_ns(void) {
  if (__builtin_expect(atomic_load_explicit(&dccl_tsc.on, memory_order_relaxed), 0)) return dccl_tsc_now_ns();
  return dccl_realtime_ns();
}

#endif /* DYNAMICCL_CLOCK_H_ */
