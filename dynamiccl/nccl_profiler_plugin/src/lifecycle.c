/* DynamICCL NCCL profiler plugin: lifecycle (init/finalize, the communicator table, retired
 * communicators), the stale-slot reaper and the counters (the tuner link: tuner_link.c). Never on
 * the hot path: mutexes and allocation are fine here.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chain.h"
#include "net.h"

static uint64_t g_emitted_prev; /* ring pushes of earlier plugin lifetimes */
/* Set by the first successful init; from then on init never fails (NCCL unloads the library
   when init fails, and again at finalize, while our sender thread runs). */
static int g_init_succeeded;
static uint32_t g_ctx_next; /* round-robin index hint (lifecycle lock) */
static uint32_t g_ctx_serial;

/* ------------------------------------------------------------------------------------------ */
/* Stale-slot reaper (sender thread and finalize): emits operations whose children never came.  */

/* The reaper's claim on generation (c >> 1) (internal.h, the completion rule): refused when the slot
   was reused since `c` was read or an event's mark already completed it. */
static int reap_claim(dccl_slot_t* s, uint64_t c) {
  uint64_t gen = (c >> 1) & DCCL_H_GEN_MASK;
  uint64_t w = atomic_load_explicit(&s->done, memory_order_relaxed);
  do {
    if ((w & DCCL_H_GEN_MASK) != gen || (w & DCCL_DONE_BOTH) == DCCL_DONE_BOTH || (w & DCCL_DONE_REAPED)) return 0;
  } while (!atomic_compare_exchange_weak_explicit(&s->done, &w, w | DCCL_DONE_REAPED, memory_order_acq_rel,
                                                  memory_order_relaxed));
  return 1;
}

void dccl_reap_ctx_at(dccl_ctx_t* ctx, uint64_t mono_now_ns, uint64_t stale_ns) {
  for (uint32_t i = 0; i < ctx->pool_size; i++) {
    dccl_slot_t* s = &ctx->slots[i];
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if (c & 1) continue; /* finished, or allocated and not yet published */
    if (stale_ns != 0) {
      struct dccl_reap_seen* seen = &ctx->reap[i];
      if (seen->ctl != c) { /* first sight of this operation */
        seen->ctl = c;
        seen->ns = mono_now_ns;
        continue;
      }
      if (mono_now_ns < seen->ns || mono_now_ns - seen->ns < stale_ns) continue;
    }
    if (reap_claim(s, c)) {
      atomic_store_explicit(&s->ctl, c | 1, memory_order_release);
      atomic_fetch_add_explicit(&dccl_g.events_stale, 1, memory_order_relaxed);
      dccl_slot_finish(s, 1);
    }
  }
}

void dccl_reap_ctx(dccl_ctx_t* ctx, uint64_t now_ns, uint64_t stale_ns) {
  (void)now_ns;
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns(), stale_ns);
}

/* ------------------------------------------------------------------------------------------ */
/* init / finalize (not the hot path: mutexes and allocation are fine here)                     */

static void ctx_free(dccl_ctx_t* ctx) {
  if (ctx == NULL) return;
  dccl_chain_free(ctx);
  free(ctx->net);
  free(ctx->slots);
  free(ctx->p2p_seq);
  free(ctx->reap);
  free(ctx);
}


/* NCCL's NCCL_ALLGATHERV_ENABLE (default 1): with it, 2.29+ runs ncclBroadcast without a Coll
   event (dccl_ctx_t.api_bcast). An nccl.conf setting is not seen here. */
static int allgatherv_enabled(void) {
  const char* v = getenv("NCCL_ALLGATHERV_ENABLE");
  return v == NULL || *v == '\0' || strtol(v, NULL, 10) != 0;
}

static dccl_ctx_t* ctx_create(const dccl_config_t* cfg, uint64_t commId, const char* commName, int nNodes,
                              int nranks, int rank, int* mask, int abi) {
  dccl_ctx_t* ctx = aligned_alloc(64, (sizeof(dccl_ctx_t) + 63) & ~(size_t)63);
  if (ctx == NULL) return NULL;
  memset(ctx, 0, sizeof *ctx);
  size_t bytes = (size_t)cfg->pool_size * sizeof(dccl_slot_t);
  ctx->slots = aligned_alloc(64, bytes);
  ctx->p2p_seq = calloc(2 * (size_t)(nranks > 0 ? nranks : 1), sizeof(uint64_t));
  ctx->reap = calloc(cfg->pool_size, sizeof *ctx->reap);
  if (ctx->slots == NULL || ctx->p2p_seq == NULL || ctx->reap == NULL) {
    ctx_free(ctx);
    return NULL;
  }
  memset(ctx->slots, 0, bytes);
  if (cfg->event_mask & DCCL_NET_MASK) { /* per-peer network timing: an entry table per slot */
    ctx->net = calloc(cfg->pool_size, sizeof(dccl_net_t));
    if (ctx->net == NULL) {
      ctx_free(ctx);
      return NULL;
    }
    for (uint32_t i = 0; i < cfg->pool_size; i++) ctx->slots[i].net = &ctx->net[i];
  }
  /* Each communicator starts its generations elsewhere, so a handle of a retired communicator
     whose table index was reused is unlikely to name a live generation by chance. */
  uint64_t gen0 = (uint64_t)(++g_ctx_serial) << 12;
  for (uint32_t i = 0; i < cfg->pool_size; i++) {
    atomic_init(&ctx->slots[i].ctl, (gen0 << 1) | 1);
    ctx->slots[i].kagg.gen = DCCL_KAGG_NONE;
  }
  ctx->pool_size = cfg->pool_size;
  ctx->comm_hash = commId;
  ctx->rank = rank;
  ctx->nranks = nranks;
  ctx->nnodes = nNodes;
  ctx->pid = (uint32_t)getpid();
  ctx->record_mask = cfg->event_mask;
  ctx->local_mask = cfg->event_mask;
  ctx->mask_ptr = mask ? mask : &ctx->local_mask;
  ctx->min_bytes = cfg->min_bytes;
  ctx->sample = cfg->sample;
  ctx->abi_version = abi;
  ctx->api_bcast = abi >= 6 && (cfg->event_mask & ncclProfileColl) && allgatherv_enabled();
  if (commName) snprintf(ctx->name, sizeof ctx->name, "%s", commName);
  return ctx;
}

/* A free communicator-table index, or -1 (lifecycle lock). */
static int ctx_index_alloc(void) {
  for (uint32_t k = 0; k < DCCL_MAX_CTX; k++) {
    uint32_t i = (g_ctx_next + k) % DCCL_MAX_CTX;
    int used = atomic_load(&dccl_ctx_tab[i]) != NULL;
    for (dccl_ctx_t* c = dccl_g.ctxs; c && !used; c = c->next) used = (c->index == i); /* retired ones too */
    if (!used) {
      g_ctx_next = i + 1;
      return (int)i;
    }
  }
  return -1;
}

/* Retired communicators: their slot pools go once the late-stop grace is over (a handle reaches a
   pool only through the table entry cleared at finalize, so only a stop already past that load can
   still touch it), the small rest once announced or DCCL_GRAVE_MAX_MS old; everything when `all`.
   Caller holds lifecycle. */
static void retired_sweep(uint64_t now, int all) {
  dccl_ctx_t* doomed = NULL;
  dccl_slot_t* pools[64];
  int npools = 0;
  pthread_mutex_lock(&dccl_g.registry);
  for (dccl_ctx_t** p = &dccl_g.ctxs; *p;) {
    dccl_ctx_t* c = *p;
    uint64_t age = c->dead_ms ? now - c->dead_ms : 0;
    int graced = c->dead_ms && (all || age >= DCCL_GRAVE_MIN_MS);
    if (graced && c->slots != NULL && npools < 64) { /* the reaper then sees an empty pool */
      pools[npools++] = c->slots;
      c->slots = NULL;
      c->pool_size = 0;
    }
    if (!(graced && (all || c->announced_conn != 0 || age >= DCCL_GRAVE_MAX_MS))) {
      p = &c->next;
      continue;
    }
    *p = c->next;
    c->next = doomed;
    doomed = c;
  }
  pthread_mutex_unlock(&dccl_g.registry);
  while (npools > 0) free(pools[--npools]);
  while (doomed) {
    dccl_ctx_t* n = doomed->next;
    ctx_free(doomed);
    doomed = n;
  }
}

/* The record clock, chosen once per lifetime (clock.h): the TSC where it qualifies unless
   DYNAMICCL_CLOCK=0; its first anchor here, the sender refreshes it and a rate follows. */
static void clock_start(const dccl_config_t* cfg) {
  if (cfg->clock == DCCL_CLOCK_VDSO) return;
  int usable = dccl_tsc_usable();
  if (!dccl_clock_wants_tsc(cfg->clock, usable)) {
    if (cfg->clock == DCCL_CLOCK_TSC)
      DCCL_WARN("DynamICCL profiler: DYNAMICCL_CLOCK=1 needs an invariant TSC (constant_tsc, nonstop_tsc) and the "
                "tsc clocksource; using clock_gettime(CLOCK_REALTIME)");
    return;
  }
  dccl_tsc_anchor();
  atomic_store_explicit(&dccl_tsc.on, 1, memory_order_relaxed);
  DCCL_INFO("DynamICCL profiler: record clock: TSC anchored to CLOCK_REALTIME (DYNAMICCL_CLOCK=0 for clock_gettime)");
}

/* At the last finalize (no communicator, no reader): the next lifetime starts without a rate. */
static void clock_stop(void) {
  atomic_store_explicit(&dccl_tsc.on, 0, memory_order_relaxed);
  atomic_store_explicit(&dccl_tsc.mult, 0, memory_order_relaxed);
  dccl_tsc.rate_tsc = dccl_tsc.rate_mono = 0;
}

/* Init failed: before any success NCCL may disable the plugin; after one, report success with no
   context (this communicator is simply not profiled). */
static ncclResult_t init_refuse(ncclResult_t rc) {
  return g_init_succeeded ? ncclSuccess : rc;
}

ncclResult_t dccl_init_common(int abi, void** context, uint64_t commId, int* eActivationMask, const char* commName,
                                int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  if (context == NULL) return init_refuse(ncclInvalidArgument);
  *context = NULL;
  pthread_mutex_lock(&dccl_g.lifecycle);
  if (logfn) dccl_g.logfn = logfn;
  retired_sweep(dccl_monotonic_ms(), 0);
  dccl_config_t cfg;
  char err[512];
  ncclResult_t rc = ncclSuccess;
  dccl_ctx_t* ctx = NULL;
  int first = (dccl_g.refcount == 0);
  if (dccl_config_load(&cfg, err, sizeof err) != 0) {
    DCCL_WARN("DynamICCL profiler: invalid configuration: %s (profiler disabled for this communicator)", err);
    rc = ncclInvalidUsage;
    goto out;
  }
  if (first) {
    dccl_g.cfg = cfg;
    dccl_g.abi_version = abi;
    dccl_g.start_ns = dccl_now_ns();
    clock_start(&cfg);
    if (dccl_ring_init(&dccl_g.ring, cfg.ring_size) != 0) {
      DCCL_WARN("DynamICCL profiler: cannot allocate a ring of %u records", cfg.ring_size);
      rc = ncclSystemError;
      goto out;
    }
  }
  int index = ctx_index_alloc();
  ctx = index < 0 ? NULL : ctx_create(&cfg, commId, commName, nNodes, nranks, rank, eActivationMask, abi);
  if (ctx == NULL) {
    DCCL_WARN("DynamICCL profiler: cannot allocate %u event slots (or %u communicators are registered)", cfg.pool_size,
              DCCL_MAX_CTX);
    if (first) dccl_ring_free(&dccl_g.ring);
    rc = ncclSystemError;
    goto out;
  }
  ctx->index = (uint32_t)index;
  if (first && dccl_sender_start() != 0) {
    DCCL_WARN("DynamICCL profiler: cannot start the sender thread");
    ctx_free(ctx);
    ctx = NULL;
    dccl_ring_free(&dccl_g.ring);
    rc = ncclSystemError;
    goto out;
  }
  dccl_chain_attach(ctx, abi, commId, commName, nNodes, nranks, rank, logfn);
  int chain_mask = ctx->chain ? ctx->chain->mask : 0; /* NCCL must also emit what the chained plugin asked for */
  if (eActivationMask) __atomic_store_n(eActivationMask, cfg.event_mask | chain_mask, __ATOMIC_RELAXED);
  dccl_tuner_link(); /* NCCL loads the tuner after the profiler for the first communicator: retried later */
  pthread_mutex_lock(&dccl_g.registry);
  ctx->next = dccl_g.ctxs;
  dccl_g.ctxs = ctx;
  dccl_g.refcount++;
  atomic_store_explicit(&dccl_ctx_tab[ctx->index], ctx, memory_order_release);
  pthread_mutex_unlock(&dccl_g.registry);
  g_init_succeeded = 1;
  DCCL_INFO("DynamICCL profiler (v%d): comm %016llx \"%s\" rank %d/%d nodes %d, mask %d, pool %u, collector %s",
            abi, (unsigned long long)commId, ctx->name, rank, nranks, nNodes, cfg.event_mask, cfg.pool_size,
            dccl_g.cfg.collector);
out:
  pthread_mutex_unlock(&dccl_g.lifecycle);
  if (rc != ncclSuccess) {
    if (g_init_succeeded) DCCL_WARN("DynamICCL profiler: this communicator is not profiled (an earlier init succeeded)");
    return init_refuse(rc);
  }
  *context = ctx;
  return ncclSuccess;
}

/* Retire a communicator: off the handle table at once (its late stops are dropped), reaped,
   counters folded; its memory and registry entry stay until retired_sweep frees them. */
ncclResult_t dccl_finalize(void* context) {
  dccl_ctx_t* ctx = (dccl_ctx_t*)context;
  if (ctx == NULL) return ncclSuccess;
  pthread_mutex_lock(&dccl_g.lifecycle);
  pthread_mutex_lock(&dccl_g.registry);
  int found = 0;
  for (dccl_ctx_t* c = dccl_g.ctxs; c; c = c->next) found |= (c == ctx && c->dead_ms == 0);
  if (!found) { /* not ours, or finalized twice */
    pthread_mutex_unlock(&dccl_g.registry);
    pthread_mutex_unlock(&dccl_g.lifecycle);
    return ncclSuccess;
  }
  atomic_store_explicit(&dccl_ctx_tab[ctx->index], NULL, memory_order_release);
  dccl_chain_detach(ctx);
  dccl_reap_ctx_at(ctx, dccl_monotonic_ns(), 0); /* operations whose children never came */
  ctx->dead_ms = dccl_monotonic_ms();
  if (ctx->dead_ms == 0) ctx->dead_ms = 1;
  atomic_fetch_add(&dccl_g.events_dropped_pool_full, atomic_load(&ctx->dropped_pool_full));
  atomic_fetch_add(&dccl_g.sampled_out, atomic_load(&ctx->sampled_out));
  atomic_fetch_add(&dccl_g.colls_without_event, dccl_ctx_uncovered(ctx));
  int last = (--dccl_g.refcount == 0);
  pthread_mutex_unlock(&dccl_g.registry);
  if (last) {
    dccl_sender_stop(); /* final bounded flush (announces retired communicators too), then join */
    dccl_seq_base += atomic_load(&dccl_g.ring.enqueue_pos);
    g_emitted_prev += atomic_load(&dccl_g.ring.enqueue_pos);
    dccl_ring_free(&dccl_g.ring);
    dccl_tuner_unlink();
    clock_stop();
  }
  retired_sweep(dccl_monotonic_ms(), last);
  if (last) dccl_chain_unload(); /* after the sweep freed every communicator's chain state */
  pthread_mutex_unlock(&dccl_g.lifecycle);
  return ncclSuccess;
}

/* Counters for the STATS record. Takes the registry lock (sender thread, tests). */
void dccl_stats_snapshot(dccl_stats_record_t* out) {
  memset(out, 0, sizeof *out);
  out->kind = DCCL_KIND_STATS;
  out->pid = (uint32_t)getpid();
  out->time_ns = dccl_now_ns();
  uint64_t pool = atomic_load(&dccl_g.events_dropped_pool_full), sampled = atomic_load(&dccl_g.sampled_out);
  uint64_t uncovered = atomic_load(&dccl_g.colls_without_event);
  pthread_mutex_lock(&dccl_g.registry);
  for (dccl_ctx_t* c = dccl_g.ctxs; c; c = c->next) {
    if (c->dead_ms) continue; /* retired: folded into the globals at finalize */
    pool += atomic_load_explicit(&c->dropped_pool_full, memory_order_relaxed);
    sampled += atomic_load_explicit(&c->sampled_out, memory_order_relaxed);
    uncovered += dccl_ctx_uncovered(c);
  }
  uint64_t emitted = g_emitted_prev + (dccl_g.ring.seq ? atomic_load(&dccl_g.ring.enqueue_pos) : 0);
  pthread_mutex_unlock(&dccl_g.registry);
  out->events_dropped_pool_full = pool;
  out->records_dropped_ring_full = atomic_load(&dccl_g.records_dropped_ring_full);
  out->records_undelivered = atomic_load(&dccl_g.records_undelivered);
  out->records_sent = atomic_load(&dccl_g.records_sent);
  out->records_emitted = emitted;
  out->events_stale = atomic_load(&dccl_g.events_stale);
  out->reconnects = atomic_load(&dccl_g.reconnects);
  out->sampled_out = sampled;
  out->kernel_ch_rejected = atomic_load(&dccl_g.kch_dropped);
  out->kernel_ch_timing_suspect = atomic_load(&dccl_g.timing_suspect);
  out->colls_without_event = uncovered;
  out->reserved[1] = atomic_load(&dccl_g.chain_stale); /* wire_format.py: STATS reserved[1] */
}

/* Debug/test hook: a snapshot of the plugin's counters (same content as the STATS record). Not part of NCCL's ABI. */
DCCL_EXPORT void dynamicclProfilerStats(dccl_stats_record_t* out) {
  if (out) dccl_stats_snapshot(out);
}

