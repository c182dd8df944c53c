/* DynamICCL profiler plugin: the stale-timestamp guard (stale_guard.h). Sender thread only. */
#include "stale_guard.h"

#include <stdio.h>
#include <stdlib.h>

void dccl_stale_guard_init(dccl_stale_guard_t* g, uint32_t tol_us) {
  *g = (dccl_stale_guard_t){.tol_ns = (int64_t)tol_us * 1000, .state = tol_us ? DCCL_GUARD_LEARNING : DCCL_GUARD_OFF};
}

/* The records whose times are a latency: GPU-timed COLL/P2P with every timestamp present. */
static int gpu_timed(const dccl_event_record_t* r) {
  return (r->kind == DCCL_KIND_COLL || r->kind == DCCL_KIND_P2P) && r->timing_source == DCCL_TIMING_KERNEL_GPU &&
         r->enqueue_ns != 0 && r->gpu_start_ns != 0 && r->gpu_end_ns >= r->gpu_start_ns && r->cpu_end_ns != 0;
}

static int cmp_i64(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return (x > y) - (x < y);
}

/* The offset at record time t: the last fit's, moved by the drift since its time. */
static int64_t offset_at(const dccl_stale_guard_t* g, uint64_t t) {
  return g->offset_ns + (int64_t)(g->drift * (double)(int64_t)(t - g->offset_t_ns));
}

/* The rule: GPU start no earlier than the enqueue, GPU stop no later than the host stop, on the host's
   clock (pTimer + offset), each within the tolerance. */
static int outside_host_interval(const dccl_stale_guard_t* g, const dccl_event_record_t* r, int64_t off) {
  int64_t start_early = (int64_t)(r->enqueue_ns - r->gpu_start_ns) - off;
  int64_t stop_late = (int64_t)(r->gpu_end_ns - r->cpu_end_ns) + off;
  return start_early > g->tol_ns || stop_late > g->tol_ns;
}

/* The half window of the ring starting `from` samples back, detrended by `drift` around the middle
   of its times (*mid): its second smallest value, and its middle half's width in *spread. Host stop -
   GPU stop = offset + the host's stop delay (>= 0), so the shortest delays give the offset, and a
   healthy record keeps both bounds whatever its own delay (a median put a deep queue's short-delay
   records 100 us outside); the second smallest survives one outlier. Without the detrend a low value
   of a drifting clock lies early in the half, not at its middle. */
static int64_t half_low(const dccl_stale_guard_t* g, uint32_t from, double drift, uint64_t* mid,
                        int64_t* spread) {
  int64_t w[DCCL_GUARD_HALF];
  uint64_t first = g->samples - from;
  uint64_t t0 = g->t[first % DCCL_GUARD_WINDOW], t1 = g->t[(first + DCCL_GUARD_HALF - 1) % DCCL_GUARD_WINDOW];
  *mid = t0 + (t1 - t0) / 2;
  for (uint32_t i = 0; i < DCCL_GUARD_HALF; i++) {
    uint32_t k = (uint32_t)((first + i) % DCCL_GUARD_WINDOW);
    w[i] = g->tail[k] - (int64_t)(drift * (double)(int64_t)(g->t[k] - *mid));
  }
  qsort(w, DCCL_GUARD_HALF, sizeof w[0], cmp_i64);
  *spread = w[3 * DCCL_GUARD_HALF / 4] - w[DCCL_GUARD_HALF / 4];
  return w[1];
}

static double clamp_drift(double d) {
  return d > DCCL_GUARD_MAX_DRIFT ? DCCL_GUARD_MAX_DRIFT : d < -DCCL_GUARD_MAX_DRIFT ? -DCCL_GUARD_MAX_DRIFT : d;
}

/* A fit over the last window: offset from the newer half, drift from both, twice (the second pass
   detrends with the first's drift); the first fit also decides alignment. */
static void fit(dccl_stale_guard_t* g) {
  uint64_t ta, tb;
  int64_t sa, sb, qa = 0, qb = 0;
  double drift = g->state == DCCL_GUARD_ON ? g->drift : 0.0;
  for (int pass = 0; pass < 2; pass++) {
    qa = half_low(g, DCCL_GUARD_WINDOW, drift, &ta, &sa);
    qb = half_low(g, DCCL_GUARD_HALF, drift, &tb, &sb);
    if (tb > ta) drift = clamp_drift((double)(qb - qa) / (double)(tb - ta));
  }
  if (g->state == DCCL_GUARD_LEARNING)
    g->state = (sa <= DCCL_GUARD_SPREAD_NS && sb <= DCCL_GUARD_SPREAD_NS) ? DCCL_GUARD_ON : DCCL_GUARD_OFF;
  if (g->state != DCCL_GUARD_ON) return;
  g->drift = drift;
  g->offset_ns = qb;
  g->offset_t_ns = tb;
  g->fits++;
}

/* One sample: host stop - GPU stop, measured at the host stop t (not the enqueue: a deep queue puts
   a second between the two). */
static void learn(dccl_stale_guard_t* g, int64_t tail, uint64_t t, int64_t predicted) {
  int on = g->state == DCCL_GUARD_ON;
  int64_t d = tail - predicted, bound = on ? DCCL_GUARD_ALIGN_NS : DCCL_GUARD_MAX_OFFSET_NS;
  if (d > bound || -d > bound) {
    if (++g->misses < DCCL_GUARD_WINDOW) return;
    g->state = on ? DCCL_GUARD_LEARNING : DCCL_GUARD_OFF; /* on: the clocks stepped, learn again */
    g->misses = 0;
    g->samples = 0;
    return;
  }
  if (on) g->misses = 0;
  g->tail[g->samples % DCCL_GUARD_WINDOW] = tail;
  g->t[g->samples % DCCL_GUARD_WINDOW] = t;
  g->samples++;
  if (g->samples >= DCCL_GUARD_WINDOW && g->samples % DCCL_GUARD_STEP == 0) fit(g);
}

int dccl_stale_guard_check(dccl_stale_guard_t* g, dccl_event_record_t* r) {
  if (g->state == DCCL_GUARD_OFF || !gpu_timed(r)) return 0;
  int64_t off = 0;
  int flag = 0;
  if (g->state == DCCL_GUARD_ON) {
    off = offset_at(g, r->cpu_end_ns);
    g->checked++;
    flag = outside_host_interval(g, r, off);
  }
  learn(g, (int64_t)(r->cpu_end_ns - r->gpu_end_ns), r->cpu_end_ns, off);
  if (flag) {
    r->timing_source = DCCL_TIMING_NONE;
    r->flags |= DCCL_FLAG_TIMING_SUSPECT;
    g->flagged++;
  }
  return flag;
}

void dccl_stale_guard_describe(const dccl_stale_guard_t* g, char* out, unsigned long cap) {
  static const char* const names[] = {"learning", "on", "off"};
  snprintf(out, cap, "stale-timestamp guard %s (tolerance %lld us; GPU clock = record clock %+lld ns, drift %+.1f ppm; "
           "%llu fits; %llu of %llu records untimed; %u records outside the learning bound)", names[g->state],
           (long long)(g->tol_ns / 1000), (long long)-g->offset_ns, g->drift * 1e6, (unsigned long long)g->fits,
           (unsigned long long)g->flagged, (unsigned long long)g->checked, g->misses);
}
