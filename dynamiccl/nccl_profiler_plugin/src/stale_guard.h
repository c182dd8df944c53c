/* DynamICCL profiler plugin: the stale-timestamp guard (rule "GPU inside host"). Runs on the sender
 * thread over every record it takes from the ring, never on NCCL's threads (no cost there).
 *
 * Rule: an operation's kernels start after it was enqueued and stop before the host sees them stop.
 * Where the GPU clock (KernelCh pTimers, %globaltimer) is the record clock (CLOCK_REALTIME) up to a
 * learned offset, a GPU-timed COLL/P2P record whose first start precedes its enqueue, or whose last
 * stop follows its host stop, by more than the tolerance carries another kernel's timestamps (NCCL
 * 2.28 after a send/recv to self fires KernelCh events with older kernels' pTimers, some of which keep
 * the channel's order and a short span, so the order guard and the span check pass them). Such a
 * record is sent untimed (NONE) with TIMING_SUSPECT, gpu_* kept as seen.
 *
 * Alignment is learned, never assumed: the offset (cpu_end - gpu_end of a healthy record) and its
 * drift come from windows of DCCL_GUARD_WINDOW GPU-timed records: the medians of the window's two
 * halves give the offset at the window's middle; the drift rate (the GPU clock drifts against
 * CLOCK_REALTIME: H100 1.1 -> 4.3 ms in 160 s, 20 ppm; H200 25 us in 150 s) is the offset's change
 * between window middles at least DCCL_GUARD_DRIFT_BASE_NS apart (the two halves of the first window
 * when they are), so bursts of records never make a slope of noise; the offset is extrapolated to each
 * record's enqueue time. The first window decides: the guard is on when its
 * records ended within DCCL_GUARD_MAX_OFFSET_NS of their host stops and the middle half of each half
 * window lies within DCCL_GUARD_SPREAD_NS (a wall clock); otherwise it stays off for the process (an
 * emulator's simulated pTimers, a real-time simulator's paced batches). Records of the first window are
 * not checked. Later windows take every GPU-timed record within DCCL_GUARD_ALIGN_NS of the prediction
 * (stale pTimers are mostly further; the medians ignore the rest); DCCL_GUARD_WINDOW records in a row
 * further away (a host clock step) send the guard back to learning.
 * One offset per process (one GPU per process, as NCCL jobs run).
 */
#ifndef DCCL_STALE_GUARD_H
#define DCCL_STALE_GUARD_H

#include <stdint.h>

#include "dynamiccl_record.h"

/* 100 us: 4x the spread of the host's KernelCh stop delay (5th to 50th percentile about 25 us on the
   H100 and H200 runs), so the learned offset's error never reaches it; stale pTimers are
   whole kernels old (0.2 to 300 ms on those runs). DYNAMICCL_STALE_GUARD_US overrides, 0 = off. */
#define DCCL_DEFAULT_STALE_GUARD_US 100
#define DCCL_MAX_STALE_GUARD_US 1000000
#define DCCL_GUARD_WINDOW 64
#define DCCL_GUARD_MAX_OFFSET_NS 100000000ll /* 100 ms: no GPU wall clock is set further from the host's */
#define DCCL_GUARD_SPREAD_NS 1000000ll       /* 1 ms: the middle half of a wall clock's window */
#define DCCL_GUARD_ALIGN_NS 1000000ll        /* a later window's samples: within 1 ms of the prediction */
#define DCCL_GUARD_MAX_DRIFT 1e-3            /* 1000 ppm: a faster drift estimate is noise */
#define DCCL_GUARD_HALF (DCCL_GUARD_WINDOW / 2)
#define DCCL_GUARD_DRIFT_BASE_NS 1000000000ull /* 1 s: medians 10 us apart in noise give 10 ppm at most */

typedef enum { DCCL_GUARD_LEARNING = 0, DCCL_GUARD_ON = 1, DCCL_GUARD_OFF = 2 } dccl_guard_state_t;

typedef struct dccl_stale_guard {
  int64_t tol_ns;
  int64_t offset_ns;   /* cpu_end - gpu_end of a healthy record at offset_t_ns (GPU clock = record clock - offset) */
  uint64_t offset_t_ns;/* the record time the offset was learned at (its window's middle) */
  double drift;        /* d offset / d time (0 until learned) */
  int64_t anchor_ns;   /* an earlier window's offset, and its time: the drift's base */
  uint64_t anchor_t_ns;
  int64_t window[DCCL_GUARD_WINDOW];
  uint64_t window_t0;  /* enqueue time of the window's first sample */
  uint64_t window_th;  /* and of its second half's first sample */
  uint32_t n;          /* samples in the window */
  uint32_t misses;     /* GPU-timed records outside the learning bound (in a row, once on) */
  dccl_guard_state_t state;
  uint64_t checked;    /* records the rule was applied to */
  uint64_t flagged;    /* of which untimed */
  uint64_t windows;    /* offsets learned */
} dccl_stale_guard_t;

/* tol_us 0: off. */
void dccl_stale_guard_init(dccl_stale_guard_t* g, uint32_t tol_us);
/* Applies the rule to one record (any kind; only GPU-timed COLL/P2P records are looked at) and learns
   from it. Returns 1 when it untimed the record. No allocation, no lock, no system call. */
int dccl_stale_guard_check(dccl_stale_guard_t* g, dccl_event_record_t* r);
/* One line describing the guard's state (for the finalize log). */
void dccl_stale_guard_describe(const dccl_stale_guard_t* g, char* out, unsigned long cap);

#endif /* DCCL_STALE_GUARD_H */
