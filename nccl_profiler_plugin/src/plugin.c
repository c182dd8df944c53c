/* DynamICCL NCCL profiler plugin: event hot path, per-communicator contexts, ABI tables.
 *
 * Hot path (startEvent/stopEvent/recordEventState): no malloc, no locks, no syscalls except
 * clock_gettime(CLOCK_REALTIME) through the vDSO. Fixed slot pools per communicator; a full
 * pool gives a NULL handle and a counted drop. Finished records go to one process-wide
 * bounded MPMC ring that the sender thread (sender.c) drains.
 *
 * Handles are tagged pointers (NCCL treats them as opaque and only tests them for NULL):
 *   tag 0: dccl_slot_t*  (Coll or P2p; slots are 64-byte aligned)
 *   tag 1: dccl_kch_t*   (KernelCh child; entry->owner is its slot)
 *   tag 2: the static dummy handle (GroupApi/CollApi/P2pApi/KernelLaunch/Group: accepted, ignored)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"

dccl_global_t dccl_g = {
    .lifecycle = PTHREAD_MUTEX_INITIALIZER,
    .registry = PTHREAD_MUTEX_INITIALIZER,
    .wake_mutex = PTHREAD_MUTEX_INITIALIZER,
    .wake_cond = PTHREAD_COND_INITIALIZER,
};

#define TAG_MASK ((uintptr_t)7)
#define TAG_SLOT ((uintptr_t)0)
#define TAG_KCH ((uintptr_t)1)
#define TAG_DUMMY ((uintptr_t)2)
#define ALLOC_PROBES 64 /* a start is refused when this many consecutive slots are busy */

static uint64_t dccl_dummy_object __attribute__((aligned(8)));
#define DUMMY_HANDLE ((void*)((uintptr_t)&dccl_dummy_object | TAG_DUMMY))

/* Bit count without depending on -mpopcnt (baseline x86-64 would call libgcc). */
static inline uint32_t popcount64(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ull);
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (uint32_t)((x * 0x0101010101010101ull) >> 56);
}

/* Sum of ring pushes/record_seq of earlier plugin lifetimes (all comms finalized, then a new init). */
static uint64_t g_seq_base;
static uint64_t g_emitted_prev;

uint64_t dccl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t dccl_monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

/* ------------------------------------------------------------------------------------------ */
/* Ring: Vyukov bounded MPMC queue; the sender thread is the only consumer.                    */

int dccl_ring_init(dccl_ring_t* r, uint32_t size) {
  memset(r, 0, sizeof *r);
  r->seq = aligned_alloc(64, ((size_t)size * sizeof(uint64_t) + 63) & ~(size_t)63);
  r->recs = aligned_alloc(64, (size_t)size * sizeof(dccl_event_record_t));
  if (r->seq == NULL || r->recs == NULL) {
    free(r->seq);
    free(r->recs);
    r->seq = NULL;
    r->recs = NULL;
    return -1;
  }
  for (uint64_t i = 0; i < size; i++) atomic_init(&r->seq[i], i);
  memset(r->recs, 0, (size_t)size * sizeof(dccl_event_record_t)); /* touch every page now, not on the hot path */
  r->mask = size - 1;
  atomic_init(&r->enqueue_pos, 0);
  r->dequeue_pos = 0;
  return 0;
}

void dccl_ring_free(dccl_ring_t* r) {
  free(r->seq);
  free(r->recs);
  r->seq = NULL;
  r->recs = NULL;
}

int dccl_ring_push(dccl_ring_t* r, const dccl_event_record_t* rec) {
  uint64_t pos = atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
  for (;;) {
    uint64_t s = atomic_load_explicit(&r->seq[pos & r->mask], memory_order_acquire);
    int64_t diff = (int64_t)(s - pos);
    if (diff == 0) {
      if (atomic_compare_exchange_weak_explicit(&r->enqueue_pos, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed))
        break;
    } else if (diff < 0) {
      return -1; /* full */
    } else {
      pos = atomic_load_explicit(&r->enqueue_pos, memory_order_relaxed);
    }
  }
  dccl_event_record_t* dst = &r->recs[pos & r->mask];
  memcpy(dst, rec, sizeof *dst);
  dst->record_seq = g_seq_base + pos + 1;
  atomic_store_explicit(&r->seq[pos & r->mask], pos + 1, memory_order_release);
  return 0;
}

uint32_t dccl_ring_pop(dccl_ring_t* r, dccl_event_record_t* out, uint32_t max) {
  uint32_t n = 0;
  uint64_t pos = r->dequeue_pos;
  while (n < max) {
    uint64_t s = atomic_load_explicit(&r->seq[pos & r->mask], memory_order_acquire);
    if (s != pos + 1) break; /* empty, or the producer has not finished writing this cell */
    memcpy(&out[n++], &r->recs[pos & r->mask], sizeof *out);
    atomic_store_explicit(&r->seq[pos & r->mask], pos + r->mask + 1, memory_order_release);
    pos++;
  }
  r->dequeue_pos = pos;
  return n;
}

/* ------------------------------------------------------------------------------------------ */
/* NCCL string -> wire code. The strings are static in NCCL, so a tiny direct-mapped cache of   */
/* (pointer << 8 | code) avoids strcmp after the first sight of each pointer.                   */

#define STRCACHE_SIZE 16
typedef struct {
  _Atomic uint64_t e[STRCACHE_SIZE];
} strcache_t;
static strcache_t g_func_cache, g_dtype_cache, g_algo_cache, g_proto_cache;

static uint8_t lookup_slow(strcache_t* c, const char* s, const char* const* names, int n) {
  uint8_t code = DCCL_UNKNOWN;
  for (int i = 0; i < n; i++) {
    if (strcmp(s, names[i]) == 0) {
      code = (uint8_t)i;
      break;
    }
  }
  uintptr_t p = (uintptr_t)s;
  if ((p >> 56) == 0) /* user-space pointers fit in 56 bits; otherwise just do not cache */
    atomic_store_explicit(&c->e[(p >> 3) & (STRCACHE_SIZE - 1)], ((uint64_t)p << 8) | code, memory_order_relaxed);
  return code;
}

static inline uint8_t lookup(strcache_t* c, const char* s, const char* const* names, int n) {
  if (s == NULL) return DCCL_UNKNOWN;
  uintptr_t p = (uintptr_t)s;
  uint64_t e = atomic_load_explicit(&c->e[(p >> 3) & (STRCACHE_SIZE - 1)], memory_order_relaxed);
  if ((e >> 8) == (uint64_t)p) return (uint8_t)(e & 0xff);
  return lookup_slow(c, s, names, n);
}

#define MAP_FUNC(s) lookup(&g_func_cache, (s), dccl_func_names, DCCL_FUNC_COUNT)
#define MAP_DTYPE(s) lookup(&g_dtype_cache, (s), dccl_dtype_names, DCCL_DTYPE_COUNT)
#define MAP_ALGO(s) lookup(&g_algo_cache, (s), dccl_algo_names, DCCL_ALGO_COUNT)
#define MAP_PROTO(s) lookup(&g_proto_cache, (s), dccl_proto_names, DCCL_PROTO_COUNT)

/* ------------------------------------------------------------------------------------------ */
/* Slots                                                                                       */

static inline dccl_slot_t* slot_alloc(dccl_ctx_t* ctx) {
  /* The cursor is a hint (plain load/store): concurrent starters on one communicator are rare,
     and the CAS on `busy` arbitrates if they pick the same slot. */
  uint64_t idx = atomic_load_explicit(&ctx->cursor, memory_order_relaxed);
  uint32_t probes = ctx->pool_size < ALLOC_PROBES ? ctx->pool_size : ALLOC_PROBES;
  for (uint32_t i = 0; i < probes; i++) {
    dccl_slot_t* s = &ctx->slots[idx];
    idx = (idx + 1 == ctx->pool_size) ? 0 : idx + 1;
    uint32_t zero = 0;
    if (atomic_load_explicit(&s->busy, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong_explicit(&s->busy, &zero, 1, memory_order_acquire, memory_order_relaxed)) {
      atomic_store_explicit(&ctx->cursor, idx, memory_order_relaxed);
      return s;
    }
  }
  return NULL;
}

/* Build the record, push it, free the slot. The caller won the ctl "finished" bit. */
static void slot_finish(dccl_slot_t* s, int stale) {
  uint64_t m = atomic_load_explicit(&s->chmask, memory_order_acquire);
  uint32_t seen = (uint32_t)popcount64(m);
  uint64_t gmin = UINT64_MAX, gmax = 0;
  int all_gpu = 1;
  for (uint64_t bits = m; bits; bits &= bits - 1) {
    const dccl_kch_t* e = &s->ch[__builtin_ctzll(bits)];
    if (e->start_ptimer == 0 || e->stop_ptimer == 0) all_gpu = 0;
    if (e->start_ptimer != 0 && e->start_ptimer < gmin) gmin = e->start_ptimer;
    if (e->stop_ptimer > gmax) gmax = e->stop_ptimer;
  }
  dccl_event_record_t* r = &s->rec;
  r->channels_seen = (uint16_t)seen;
  r->gpu_start_ns = (gmin == UINT64_MAX) ? 0 : gmin;
  r->gpu_end_ns = gmax;
  if (stale) {
    r->timing_source = DCCL_TIMING_NONE;
    r->flags |= DCCL_FLAG_STALE;
    r->cpu_end_ns = 0;
  } else if (s->expect_kch == 0) {
    r->timing_source = DCCL_TIMING_NONE;
    r->cpu_end_ns = 0;
  } else {
    r->cpu_end_ns = dccl_now_ns();
    r->timing_source = (seen >= s->expect_kch && all_gpu) ? DCCL_TIMING_KERNEL_GPU : DCCL_TIMING_KERNEL_CPU;
  }
  if (dccl_ring_push(&dccl_g.ring, r) != 0)
    atomic_fetch_add_explicit(&dccl_g.records_dropped_ring_full, 1, memory_order_relaxed);
  atomic_store_explicit(&s->armed_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&s->busy, 0, memory_order_release);
}

static inline void slot_try_finish(dccl_slot_t* s) {
  uint64_t old = atomic_fetch_or_explicit(&s->ctl, 1, memory_order_acq_rel);
  if ((old & 1) == 0) slot_finish(s, 0);
}

void dccl_reap_ctx(dccl_ctx_t* ctx, uint64_t now_ns, uint64_t stale_ns) {
  for (uint32_t i = 0; i < ctx->pool_size; i++) {
    dccl_slot_t* s = &ctx->slots[i];
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if (c & 1) continue;
    uint64_t armed = atomic_load_explicit(&s->armed_ns, memory_order_acquire);
    if (armed == 0) continue;
    if (stale_ns != 0 && (now_ns < armed || now_ns - armed < stale_ns)) continue;
    /* Fails if the slot finished or was reused since `c` was read (generation in ctl). */
    if (atomic_compare_exchange_strong_explicit(&s->ctl, &c, c | 1, memory_order_acq_rel, memory_order_relaxed)) {
      atomic_fetch_add_explicit(&dccl_g.events_stale, 1, memory_order_relaxed);
      slot_finish(s, 1);
    }
  }
}

/* Start a Coll (kind COLL) or P2p (kind P2P). `root` is the peer for P2P. */
static inline void start_op(dccl_ctx_t* ctx, void** eHandle, uint8_t kind, uint64_t seq, const char* func,
                            const char* datatype, size_t count, int root, uint8_t nChannels, uint8_t nWarps,
                            const char* algo, const char* proto) {
  uint8_t dt = MAP_DTYPE(datatype);
  uint64_t bytes = (uint64_t)count * (dt < DCCL_DTYPE_COUNT ? dccl_dtype_sizes[dt] : 0);
  if (bytes < ctx->min_bytes) return;
  if (ctx->sample > 1 && seq % ctx->sample != 0) {
    atomic_fetch_add_explicit(&ctx->sampled_out, 1, memory_order_relaxed);
    return;
  }
  dccl_slot_t* s = slot_alloc(ctx);
  if (s == NULL) {
    atomic_fetch_add_explicit(&ctx->dropped_pool_full, 1, memory_order_relaxed);
    return;
  }
  uint64_t now = dccl_now_ns();
  int mask = __atomic_load_n(ctx->mask_ptr, __ATOMIC_RELAXED);
  s->rec = (dccl_event_record_t){
      .kind = kind,
      .func = MAP_FUNC(func),
      .datatype = dt,
      .algo = algo ? MAP_ALGO(algo) : DCCL_UNKNOWN,
      .proto = proto ? MAP_PROTO(proto) : DCCL_UNKNOWN,
      .n_channels = nChannels,
      .n_warps = nWarps,
      .timing_source = DCCL_TIMING_NONE,
      .rank = ctx->rank,
      .nranks = ctx->nranks,
      .nnodes = ctx->nnodes,
      .pid = ctx->pid,
      .root = root,
      .tuner_config_version = dccl_tuner_version(ctx->comm_hash), /* 0 without the DynamICCL tuner */
      .comm_hash = ctx->comm_hash,
      .seq_number = seq,
      .count = count,
      .bytes = bytes,
      .enqueue_ns = now,
  };
  s->expect_kch = ((mask & ncclProfileKernelCh) && (ctx->record_mask & ncclProfileKernelCh)) ? nChannels : 0;
  atomic_store_explicit(&s->stopped, 0, memory_order_relaxed);
  atomic_store_explicit(&s->chmask, 0, memory_order_relaxed);
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_relaxed);
  atomic_store_explicit(&s->ctl, (c | 1) + 1, memory_order_release); /* next generation, not finished */
  atomic_store_explicit(&s->armed_ns, now, memory_order_release);
  *eHandle = s;
}

static inline void start_coll(dccl_ctx_t* ctx, void** eHandle, uint64_t seq, const char* func, const char* dtype,
                              size_t count, int root, uint8_t nCh, uint8_t nWarps, const char* algo,
                              const char* proto) {
  if (!(ctx->record_mask & ncclProfileColl)) return;
  start_op(ctx, eHandle, DCCL_KIND_COLL, seq, func, dtype, count, root, nCh, nWarps, algo, proto);
}

static inline void start_p2p(dccl_ctx_t* ctx, void** eHandle, const char* func, const char* dtype, size_t count,
                             int peer, uint8_t nCh) {
  if (!(ctx->record_mask & ncclProfileP2p)) return;
  /* No seqNumber for P2P in the ABI: use the ordinal of this (send|recv, peer) pair on this
     rank, so Send #k from a to b pairs with Recv #k at b from a. */
  uint64_t seq = 0;
  uint8_t f = MAP_FUNC(func);
  if (peer >= 0 && peer < ctx->nranks) {
    uint64_t* ctr = &ctx->p2p_seq[(f == DCCL_FUNC_RECV ? ctx->nranks : 0) + peer];
    seq = __atomic_load_n(ctr, __ATOMIC_RELAXED);
    __atomic_store_n(ctr, seq + 1, __ATOMIC_RELAXED);
  }
  start_op(ctx, eHandle, DCCL_KIND_P2P, seq, func, dtype, count, peer, nCh, 0, NULL, NULL);
}

static inline void start_kch(void** eHandle, void* parentObj, uint8_t channelId, uint64_t pTimer) {
  uintptr_t p = (uintptr_t)parentObj;
  if (p == 0 || (p & TAG_MASK) != TAG_SLOT) return; /* NULL parent (dropped/sampled-out op) */
  dccl_slot_t* s = (dccl_slot_t*)p;
  if (channelId >= DCCL_MAX_CHANNELS ||
      (atomic_load_explicit(&s->chmask, memory_order_relaxed) & (1ull << channelId))) {
    atomic_fetch_add_explicit(&dccl_g.kch_dropped, 1, memory_order_relaxed);
    return;
  }
  dccl_kch_t* e = &s->ch[channelId];
  e->start_ptimer = pTimer;
  e->stop_ptimer = 0;
  *eHandle = (void*)((uintptr_t)e | TAG_KCH);
}

/* One startEvent per ABI version; the member names used are the same in all three. */
#define DCCL_DEFINE_START(fn, descr_t)                                                                       \
  static ncclResult_t fn(void* context, void** eHandle, descr_t* d) {                                       \
    dccl_ctx_t* ctx = (dccl_ctx_t*)context;                                                                  \
    if (eHandle == NULL) return ncclSuccess;                                                                 \
    *eHandle = NULL;                                                                                         \
    if (ctx == NULL || d == NULL) return ncclSuccess;                                                        \
    switch ((uint64_t)d->type) {                                                                             \
      case ncclProfileKernelCh:                                                                              \
        start_kch(eHandle, d->parentObj, d->kernelCh.channelId, d->kernelCh.pTimer);                         \
        break;                                                                                               \
      case ncclProfileColl:                                                                                  \
        start_coll(ctx, eHandle, d->coll.seqNumber, d->coll.func, d->coll.datatype, d->coll.count,           \
                   d->coll.root, d->coll.nChannels, d->coll.nWarps, d->coll.algo, d->coll.proto);            \
        break;                                                                                               \
      case ncclProfileP2p:                                                                                   \
        start_p2p(ctx, eHandle, d->p2p.func, d->p2p.datatype, d->p2p.count, d->p2p.peer, d->p2p.nChannels); \
        break;                                                                                               \
      case ncclProfileGroup:                                                                                 \
      case ncclProfileGroupApi:                                                                              \
      case ncclProfileCollApi:                                                                               \
      case ncclProfileP2pApi:                                                                                \
      case ncclProfileKernelLaunch:                                                                          \
        /* Parents we do not track: a non-NULL dummy so NCCL keeps starting the children. */               \
        *eHandle = DUMMY_HANDLE;                                                                             \
        break;                                                                                               \
      default:                                                                                               \
        /* ProxyOp (never dereferenced: under PXN its parentObj belongs to another process),             \
           ProxyStep, ProxyCtrl, NetPlugin, CE events: not tracked. */                                       \
        break;                                                                                               \
    }                                                                                                        \
    return ncclSuccess;                                                                                      \
  }

DCCL_DEFINE_START(dccl_start_v4, ncclProfilerEventDescr_v4_t)
DCCL_DEFINE_START(dccl_start_v5, ncclProfilerEventDescr_v5_t)
DCCL_DEFINE_START(dccl_start_v6, ncclProfilerEventDescr_v6_t)

static ncclResult_t dccl_stop(void* eHandle) {
  uintptr_t h = (uintptr_t)eHandle;
  if (h == 0) return ncclSuccess;
  switch (h & TAG_MASK) {
    case TAG_SLOT: {
      dccl_slot_t* s = (dccl_slot_t*)h;
      /* seq_cst store then load, against the KernelCh side's RMW then load: at least one side
         sees both conditions; the ctl bit makes sure only one finishes. */
      atomic_store_explicit(&s->stopped, 1, memory_order_seq_cst);
      if (s->expect_kch == 0 ||
          (uint32_t)popcount64(atomic_load_explicit(&s->chmask, memory_order_seq_cst)) >= s->expect_kch)
        slot_try_finish(s);
      break;
    }
    case TAG_KCH: {
      dccl_kch_t* e = (dccl_kch_t*)(h & ~TAG_MASK);
      dccl_slot_t* s = e->owner;
      uint64_t bit = 1ull << (e - s->ch);
      uint64_t m = atomic_fetch_or_explicit(&s->chmask, bit, memory_order_seq_cst) | bit;
      if ((uint32_t)popcount64(m) >= s->expect_kch && atomic_load_explicit(&s->stopped, memory_order_seq_cst))
        slot_try_finish(s);
      break;
    }
    default:
      break;
  }
  return ncclSuccess;
}

static ncclResult_t dccl_record_state(void* eHandle, ncclProfilerEventState_t eState,
                                      ncclProfilerEventStateArgs_v4_t* args) {
  uintptr_t h = (uintptr_t)eHandle;
  if ((h & TAG_MASK) == TAG_KCH && eState == ncclProfilerKernelChStop && args != NULL) {
    dccl_kch_t* e = (dccl_kch_t*)(h & ~TAG_MASK);
    e->stop_ptimer = args->kernelCh.pTimer;
  }
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* Tuner link (never on the hot path: init and the sender thread)                              */

static pthread_mutex_t g_tuner_link_lock = PTHREAD_MUTEX_INITIALIZER;

void dccl_tuner_link(void) {
  if (atomic_load(&dccl_g.tuner_version_fn)) return;
  pthread_mutex_lock(&g_tuner_link_lock);
  if (atomic_load(&dccl_g.tuner_version_fn)) goto out;
  /* NCCL's search order (nccl-plugin-abi.md §2.6): unset -> libnccl-tuner.so; else the value,
     then libnccl-tuner-<value>.so; "none" disables. */
  const char* v = getenv("NCCL_TUNER_PLUGIN");
  char names[2][512];
  int n = 0;
  if (v == NULL || *v == '\0') {
    snprintf(names[n++], sizeof names[0], "libnccl-tuner.so");
  } else if (strcasecmp(v, "none") != 0) {
    snprintf(names[n++], sizeof names[0], "%s", v);
    size_t len = strlen(v);
    if (strchr(v, '/') == NULL && !(strncmp(v, "lib", 3) == 0 && len > 3 && strcmp(v + len - 3, ".so") == 0))
      snprintf(names[n++], sizeof names[0], "libnccl-tuner-%s.so", v);
  }
  for (int i = 0; i < n; i++) {
    void* h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) continue;
    void* f = dlsym(h, "dynamiccl_tuner_config_version");
    if (f == NULL) { /* another tuner: records keep version 0 */
      dlclose(h);
      continue;
    }
    dccl_g.tuner_handle = h;
    atomic_store_explicit(&dccl_g.tuner_version_fn, (uintptr_t)f, memory_order_release);
    DCCL_INFO("DynamICCL profiler: records carry the applied config version of tuner %s", names[i]);
    goto out;
  }
out:
  pthread_mutex_unlock(&g_tuner_link_lock);
}

void dccl_tuner_unlink(void) {
  pthread_mutex_lock(&g_tuner_link_lock);
  atomic_store(&dccl_g.tuner_version_fn, 0);
  if (dccl_g.tuner_handle) dlclose(dccl_g.tuner_handle);
  dccl_g.tuner_handle = NULL;
  pthread_mutex_unlock(&g_tuner_link_lock);
}

/* ------------------------------------------------------------------------------------------ */
/* init / finalize (not the hot path: mutexes and allocation are fine here)                     */

static void ctx_free(dccl_ctx_t* ctx) {
  if (ctx == NULL) return;
  free(ctx->slots);
  free(ctx->p2p_seq);
  free(ctx);
}

static dccl_ctx_t* ctx_create(const dccl_config_t* cfg, uint64_t commId, const char* commName, int nNodes,
                              int nranks, int rank, int* mask, int abi) {
  dccl_ctx_t* ctx = aligned_alloc(64, (sizeof(dccl_ctx_t) + 63) & ~(size_t)63);
  if (ctx == NULL) return NULL;
  memset(ctx, 0, sizeof *ctx);
  size_t bytes = (size_t)cfg->pool_size * sizeof(dccl_slot_t);
  ctx->slots = aligned_alloc(64, bytes);
  ctx->p2p_seq = calloc(2 * (size_t)(nranks > 0 ? nranks : 1), sizeof(uint64_t));
  if (ctx->slots == NULL || ctx->p2p_seq == NULL) {
    ctx_free(ctx);
    return NULL;
  }
  memset(ctx->slots, 0, bytes);
  for (uint32_t i = 0; i < cfg->pool_size; i++) {
    dccl_slot_t* s = &ctx->slots[i];
    s->ctx = ctx;
    for (int c = 0; c < DCCL_MAX_CHANNELS; c++) s->ch[c].owner = s;
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
  if (commName) snprintf(ctx->name, sizeof ctx->name, "%s", commName);
  return ctx;
}

static ncclResult_t init_common(int abi, void** context, uint64_t commId, int* eActivationMask, const char* commName,
                                int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  if (context == NULL) return ncclInvalidArgument;
  *context = NULL;
  pthread_mutex_lock(&dccl_g.lifecycle);
  if (logfn) dccl_g.logfn = logfn;
  dccl_config_t cfg;
  char err[512];
  if (dccl_config_load(&cfg, err, sizeof err) != 0) {
    DCCL_WARN("DynamICCL profiler: invalid configuration: %s (profiler disabled for this communicator)", err);
    pthread_mutex_unlock(&dccl_g.lifecycle);
    return ncclInvalidUsage;
  }
  int first = (dccl_g.refcount == 0);
  if (first) {
    dccl_g.cfg = cfg;
    dccl_g.abi_version = abi;
    dccl_g.start_ns = dccl_now_ns();
    if (dccl_ring_init(&dccl_g.ring, cfg.ring_size) != 0) {
      DCCL_WARN("DynamICCL profiler: cannot allocate a ring of %u records", cfg.ring_size);
      pthread_mutex_unlock(&dccl_g.lifecycle);
      return ncclSystemError;
    }
  }
  dccl_ctx_t* ctx = ctx_create(&cfg, commId, commName, nNodes, nranks, rank, eActivationMask, abi);
  if (ctx == NULL) {
    DCCL_WARN("DynamICCL profiler: cannot allocate %u event slots", cfg.pool_size);
    if (first) dccl_ring_free(&dccl_g.ring);
    pthread_mutex_unlock(&dccl_g.lifecycle);
    return ncclSystemError;
  }
  if (first && dccl_sender_start() != 0) {
    DCCL_WARN("DynamICCL profiler: cannot start the sender thread");
    ctx_free(ctx);
    dccl_ring_free(&dccl_g.ring);
    pthread_mutex_unlock(&dccl_g.lifecycle);
    return ncclSystemError;
  }
  if (eActivationMask) __atomic_store_n(eActivationMask, cfg.event_mask, __ATOMIC_RELAXED);
  dccl_tuner_link(); /* NCCL loads the tuner after the profiler for the first communicator: retried later */
  pthread_mutex_lock(&dccl_g.registry);
  ctx->next = dccl_g.ctxs;
  dccl_g.ctxs = ctx;
  dccl_g.refcount++;
  pthread_mutex_unlock(&dccl_g.registry);
  DCCL_INFO("DynamICCL profiler (v%d): comm %016llx \"%s\" rank %d/%d nodes %d, mask %d, pool %u, collector %s",
            abi, (unsigned long long)commId, ctx->name, rank, nranks, nNodes, cfg.event_mask, cfg.pool_size,
            dccl_g.cfg.collector);
  pthread_mutex_unlock(&dccl_g.lifecycle);
  *context = ctx;
  return ncclSuccess;
}

static ncclResult_t dccl_finalize(void* context) {
  dccl_ctx_t* ctx = (dccl_ctx_t*)context;
  if (ctx == NULL) return ncclSuccess;
  pthread_mutex_lock(&dccl_g.lifecycle);
  pthread_mutex_lock(&dccl_g.registry);
  dccl_reap_ctx(ctx, dccl_now_ns(), 0); /* operations whose children never came */
  for (dccl_ctx_t** p = &dccl_g.ctxs; *p; p = &(*p)->next) {
    if (*p == ctx) {
      *p = ctx->next;
      break;
    }
  }
  atomic_fetch_add(&dccl_g.events_dropped_pool_full, atomic_load(&ctx->dropped_pool_full));
  atomic_fetch_add(&dccl_g.sampled_out, atomic_load(&ctx->sampled_out));
  int last = (--dccl_g.refcount == 0);
  pthread_mutex_unlock(&dccl_g.registry);
  if (last) {
    dccl_sender_stop(); /* final bounded flush, then join */
    g_seq_base += atomic_load(&dccl_g.ring.enqueue_pos);
    g_emitted_prev += atomic_load(&dccl_g.ring.enqueue_pos);
    dccl_ring_free(&dccl_g.ring);
    dccl_tuner_unlink();
  }
  pthread_mutex_unlock(&dccl_g.lifecycle);
  ctx_free(ctx);
  return ncclSuccess;
}

/* Counters for the STATS record. Takes the registry lock (sender thread, tests). */
void dccl_stats_snapshot(dccl_stats_record_t* out) {
  memset(out, 0, sizeof *out);
  out->kind = DCCL_KIND_STATS;
  out->pid = (uint32_t)getpid();
  out->time_ns = dccl_now_ns();
  uint64_t pool = atomic_load(&dccl_g.events_dropped_pool_full), sampled = atomic_load(&dccl_g.sampled_out);
  pthread_mutex_lock(&dccl_g.registry);
  for (dccl_ctx_t* c = dccl_g.ctxs; c; c = c->next) {
    pool += atomic_load_explicit(&c->dropped_pool_full, memory_order_relaxed);
    sampled += atomic_load_explicit(&c->sampled_out, memory_order_relaxed);
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
}

/* Debug/test hook: a snapshot of the plugin's counters (same content as the STATS record). Not part of NCCL's ABI. */
DCCL_EXPORT void dynamicclProfilerStats(dccl_stats_record_t* out) {
  if (out) dccl_stats_snapshot(out);
}

/* ------------------------------------------------------------------------------------------ */
/* ABI entry points                                                                            */

static ncclResult_t dccl_init_v4(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                                 int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return init_common(4, context, commHash, eActivationMask, commName, nNodes, nranks, rank, logfn);
}
static ncclResult_t dccl_init_v5(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                                 int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return init_common(5, context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn);
}
static ncclResult_t dccl_init_v6(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                                 int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return init_common(6, context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn);
}

DCCL_EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {
    .name = DCCL_PLUGIN_NAME,
    .init = dccl_init_v6,
    .startEvent = dccl_start_v6,
    .stopEvent = dccl_stop,
    .recordEventState = dccl_record_state,
    .finalize = dccl_finalize,
};

DCCL_EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {
    .name = DCCL_PLUGIN_NAME,
    .init = dccl_init_v5,
    .startEvent = dccl_start_v5,
    .stopEvent = dccl_stop,
    .recordEventState = dccl_record_state,
    .finalize = dccl_finalize,
};

DCCL_EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {
    .name = DCCL_PLUGIN_NAME,
    .init = dccl_init_v4,
    .startEvent = dccl_start_v4,
    .stopEvent = dccl_stop,
    .recordEventState = dccl_record_state,
    .finalize = dccl_finalize,
};
