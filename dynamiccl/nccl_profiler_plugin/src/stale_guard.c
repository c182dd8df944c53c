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

/* The offset at record time t: the last window's median, moved by the drift since its middle. */
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

/* Sorts one half window in place; returns its median, and its middle half's width in *spread. */
static int64_t half_median(int64_t* w, int64_t* spread) {
  qsort(w, DCCL_GUARD_HALF, sizeof w[0], cmp_i64);
  *spread = w[3 * DCCL_GUARD_HALF / 4] - w[DCCL_GUARD_HALF / 4];
  return w[DCCL_GUARD_HALF / 2];
}

static double clamp_drift(int64_t d_off, uint64_t d_t) {
  double d = (double)d_off / (double)d_t;
  return d > DCCL_GUARD_MAX_DRIFT ? DCCL_GUARD_MAX_DRIFT : d < -DCCL_GUARD_MAX_DRIFT ? -DCCL_GUARD_MAX_DRIFT : d;
}

/* A full window: the offset at its middle from its halves' medians, the drift against an anchor at
   least DCCL_GUARD_DRIFT_BASE_NS older (the first window: its own halves); the first window also decides
   alignment. */
static void close_window(dccl_stale_guard_t* g, uint64_t t_end) {
  int64_t sa, sb;
  int64_t ma = half_median(g->window, &sa), mb = half_median(g->window + DCCL_GUARD_HALF, &sb);
  uint64_t ta = g->window_t0 + (g->window_th - g->window_t0) / 2, tb = g->window_th + (t_end - g->window_th) / 2;
  g->n = 0;
  if (g->state == DCCL_GUARD_LEARNING)
    g->state = (sa <= DCCL_GUARD_SPREAD_NS && sb <= DCCL_GUARD_SPREAD_NS) ? DCCL_GUARD_ON : DCCL_GUARD_OFF;
  if (g->state != DCCL_GUARD_ON) return;
  int64_t off = ma + (mb - ma) / 2;
  uint64_t mid = ta + (tb - ta) / 2;
  if (g->anchor_t_ns == 0) { /* the first window since learning began */
    g->drift = tb - ta >= DCCL_GUARD_DRIFT_BASE_NS ? clamp_drift(mb - ma, tb - ta) : 0.0;
    g->anchor_ns = off;
    g->anchor_t_ns = mid;
  } else if (mid - g->anchor_t_ns >= DCCL_GUARD_DRIFT_BASE_NS) {
    g->drift = clamp_drift(off - g->anchor_ns, mid - g->anchor_t_ns);
    g->anchor_ns = off;
    g->anchor_t_ns = mid;
  }
  g->offset_ns = off;
  g->offset_t_ns = mid;
  g->windows++;
}

/* One sample (cpu_end - gpu_end at enqueue time t). */
static void learn(dccl_stale_guard_t* g, int64_t tail, uint64_t t, int64_t predicted) {
  int on = g->state == DCCL_GUARD_ON;
  int64_t d = tail - predicted, bound = on ? DCCL_GUARD_ALIGN_NS : DCCL_GUARD_MAX_OFFSET_NS;
  if (d > bound || -d > bound) {
    if (++g->misses < DCCL_GUARD_WINDOW) return;
    g->state = on ? DCCL_GUARD_LEARNING : DCCL_GUARD_OFF; /* on: the clocks stepped, learn again */
    g->anchor_t_ns = 0;
    g->misses = 0;
    g->n = 0;
    return;
  }
  if (on) g->misses = 0;
  if (g->n == 0) g->window_t0 = t;
  if (g->n == DCCL_GUARD_HALF) g->window_th = t;
  g->window[g->n++] = tail;
  if (g->n == DCCL_GUARD_WINDOW) close_window(g, t);
}

int dccl_stale_guard_check(dccl_stale_guard_t* g, dccl_event_record_t* r) {
  if (g->state == DCCL_GUARD_OFF || !gpu_timed(r)) return 0;
  int64_t off = 0;
  int flag = 0;
  if (g->state == DCCL_GUARD_ON) {
    off = offset_at(g, r->enqueue_ns);
    g->checked++;
    flag = outside_host_interval(g, r, off);
  }
  learn(g, (int64_t)(r->cpu_end_ns - r->gpu_end_ns), r->enqueue_ns, off);
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
           "%llu offsets learned; %llu of %llu records untimed; %u records outside the learning bound)", names[g->state],
           (long long)(g->tol_ns / 1000), (long long)-g->offset_ns, g->drift * 1e6, (unsigned long long)g->windows,
           (unsigned long long)g->flagged, (unsigned long long)g->checked, g->misses);
}
