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
 * Alignment is learned, never assumed. A healthy record's host stop - GPU stop is the clock offset
 * plus the host's stop delay (>= 0). The guard keeps the last DCCL_GUARD_WINDOW of them; every
 * DCCL_GUARD_STEP records it takes the second smallest of each half window (detrended) as the offset at
 * that half's middle: the newer half's gives the offset, the two together the drift rate (the GPU clock
 * drifts against CLOCK_REALTIME: the H100 run's fell from 1.1 to 4.3 ms behind in 160 s, 20 ppm; the
 * H200's stayed 20-60 us ahead), and the offset is extrapolated to each record's host stop time. The
 * slope's base and the distance it is extrapolated over are both counted in records, so its error
 * stays about the estimate's noise whether records come 1000 a second or one every few seconds. With
 * the shortest delays as the offset, a healthy record keeps both bounds whatever its own delay.
 * The first window decides: the guard is on when its records ended within DCCL_GUARD_MAX_OFFSET_NS of
 * their host stops and the middle half of each half window lies within DCCL_GUARD_SPREAD_NS (a wall
 * clock); otherwise it stays off for the process (an emulator's simulated pTimers, a real-time
 * simulator's paced batches). Records of the first window are not checked. Later samples are records
 * within DCCL_GUARD_ALIGN_NS of the prediction (stale pTimers are mostly further); DCCL_GUARD_WINDOW
 * records in a row further away (a host clock step) send the guard back to learning. One offset per process (one GPU per process, as NCCL jobs run).
 */
#ifndef DCCL_STALE_GUARD_H
#define DCCL_STALE_GUARD_H

#include <stdint.h>

#include "dynamiccl_record.h"

/* 100 us: the offset's error (the host's shortest stop delays vary by about 10 us, the drift
   extrapolation adds a few) stays well inside it, while stale pTimers are whole kernels old (0.3 to
   67 ms on the NCCL 2.28.9 runs). DYNAMICCL_STALE_GUARD_US overrides, 0 = off. */
#define DCCL_DEFAULT_STALE_GUARD_US 100
#define DCCL_MAX_STALE_GUARD_US 1000000
#define DCCL_GUARD_WINDOW 64
#define DCCL_GUARD_HALF (DCCL_GUARD_WINDOW / 2)
#define DCCL_GUARD_STEP 8                       /* records between two fits */
#define DCCL_GUARD_MAX_OFFSET_NS 100000000ll    /* 100 ms: no GPU wall clock is set further from the host's */
#define DCCL_GUARD_SPREAD_NS 1000000ll          /* 1 ms: the middle half of a wall clock's half window */
#define DCCL_GUARD_ALIGN_NS 1000000ll           /* a later sample: within 1 ms of the prediction */
#define DCCL_GUARD_MAX_DRIFT 1e-3               /* 1000 ppm: a faster drift estimate is noise */

typedef enum { DCCL_GUARD_LEARNING = 0, DCCL_GUARD_ON = 1, DCCL_GUARD_OFF = 2 } dccl_guard_state_t;

typedef struct dccl_stale_guard {
  int64_t tol_ns;
  int64_t offset_ns;   /* host stop - GPU stop at offset_t_ns, shortest delays (GPU clock = record clock - offset) */
  uint64_t offset_t_ns;
  double drift;        /* d offset / d time */
  int64_t tail[DCCL_GUARD_WINDOW]; /* the last samples (host stop - GPU stop), a ring */
  uint64_t t[DCCL_GUARD_WINDOW];   /* and their host stop times */
  uint64_t samples;    /* samples since learning began (ring position = samples % DCCL_GUARD_WINDOW) */
  uint32_t misses;     /* GPU-timed records outside the learning bound (in a row, once on) */
  dccl_guard_state_t state;
  uint64_t checked;    /* records the rule was applied to */
  uint64_t flagged;    /* of which untimed */
  uint64_t fits;       /* offsets learned */
} dccl_stale_guard_t;

/* tol_us 0: off. */
void dccl_stale_guard_init(dccl_stale_guard_t* g, uint32_t tol_us);
/* Applies the rule to one record (any kind; only GPU-timed COLL/P2P records are looked at) and learns
   from it. Returns 1 when it untimed the record. No allocation, no lock, no system call. */
int dccl_stale_guard_check(dccl_stale_guard_t* g, dccl_event_record_t* r);
/* One line describing the guard's state (for the finalize log). */
void dccl_stale_guard_describe(const dccl_stale_guard_t* g, char* out, unsigned long cap);

#endif /* DCCL_STALE_GUARD_H */
