/* DynamICCL profiler plugin: shared internal declarations (not part of any ABI). */
#ifndef DYNAMICCL_INTERNAL_H_
#define DYNAMICCL_INTERNAL_H_

/* clock_gettime, CLOCK_MONOTONIC_COARSE (the inline clocks below): include this header first, or
   define _GNU_SOURCE before any system header. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "dynamiccl_record.h"
#include "nccl_profiler_abi.h"
#include "stale_guard.h"

#define DCCL_PLUGIN_NAME "dynamiccl"
#define DCCL_EXPORT __attribute__((visibility("default")))

/* ---- configuration defaults (documented in README.md; a test compares the two) ---- */
#define DCCL_DEFAULT_COLLECTOR "unix:/tmp/dynamiccl.sock"
#define DCCL_DEFAULT_EVENT_MASK (ncclProfileColl | ncclProfileP2p | ncclProfileKernelCh) /* 70 */
#define DCCL_DEFAULT_POOL_SIZE 1024
#define DCCL_DEFAULT_RING_SIZE 65536
#define DCCL_DEFAULT_MIN_BYTES 0
#define DCCL_DEFAULT_SAMPLE 1
#define DCCL_DEFAULT_FLUSH_MS 100
#define DCCL_DEFAULT_STALE_MS 10000
/* 1: a KernelCh span (last stop - first start pTimer) longer than the host interval from the
   operation's enqueue to its last KernelCh stop, plus DCCL_SPAN_SLACK_NS, is refused like a broken
   channel order: NCCL's pTimers are the GPU's wall clock, so no kernel outlasts that interval.
   0 for an emulated NCCL whose pTimers are simulated time (the emulator sets it). */
#define DCCL_DEFAULT_SPAN_CHECK 1
#define DCCL_SPAN_SLACK_NS 20000ull
/* record clock (clock.h): DCCL_CLOCK_AUTO (unset) the TSC where it is as good as the vDSO's own source,
   else clock_gettime; DYNAMICCL_CLOCK=0 forces clock_gettime, 1 asks for the TSC (a warning where unusable) */
#define DCCL_DEFAULT_CLOCK DCCL_CLOCK_AUTO

/* ---- limits ---- */
#define DCCL_MAX_CHANNELS 64           /* NCCL MAXCHANNELS: KernelCh channelId < 64 */
#define DCCL_MAX_POOL_SIZE (1 << 20)
#define DCCL_MIN_RING_SIZE 2
#define DCCL_MAX_RING_SIZE (1 << 24)
#define DCCL_MAX_FLUSH_MS 60000
#define DCCL_MAX_STALE_MS (24 * 3600 * 1000)
#define DCCL_MAX_SAMPLE 1000000000
#define DCCL_EVENT_MASK_ALL ((1 << 16) - 1) /* through v7's KernelPhase (1 << 15) */
#define DCCL_ADDR_MAX 256

/* ---- background sender timing ---- */
#define DCCL_RECONNECT_MIN_MS 100
#define DCCL_RECONNECT_MAX_MS 5000
#define DCCL_SEND_TIMEOUT_MS 1000   /* one frame may take at most this long to write */
#define DCCL_FINAL_FLUSH_MS 500     /* bounded final flush at the last finalize */
#define DCCL_STATS_INTERVAL_MS 1000
#define DCCL_CONNECT_TIMEOUT_MS 200

typedef struct dccl_config {
  char collector[DCCL_ADDR_MAX];
  int event_mask;
  uint32_t pool_size;
  uint32_t ring_size;
  uint64_t min_bytes;
  uint32_t sample;
  uint32_t flush_ms;
  uint32_t stale_ms;
  uint32_t span_check;
  uint32_t stale_guard_us; /* stale_guard.h: tolerance in us, 0 off */
  uint32_t clock;
} dccl_config_t;

/* Parse DYNAMICCL_* from the environment into *cfg. Returns 0, or -1 with a message in err. */
int dccl_config_load(dccl_config_t* cfg, char* err, size_t errlen);
/* Same, with an injected getenv (tests). */
int dccl_config_parse(dccl_config_t* cfg, const char* (*get)(const char* name), char* err, size_t errlen);

/* ---- events ---- */
struct dccl_ctx;
struct dccl_slot;

/* The KernelCh timing of one operation, aggregated as its channels stop: no per-channel record
   entry is kept, only what the record uses (earliest start and latest stop pTimer of the channels
   that stopped, their count, the longest initial_sync) and what the guards need (which channels
   started and stopped; each channel's start pTimer for the stop-before-start check; the channel's
   generation stamp for the chained plugin's kept handles and the KernelPhase children).
   Written only on the operation's proxy thread (every KernelCh event comes from it), and reset
   there, lazily, by the first KernelCh start of a generation (`gen` names the generation it holds):
   so a late event that passed its liveness check just before its operation was reaped and the slot
   given to the next operation still writes into its own generation's aggregate, which the next
   operation's first KernelCh start then discards; it never counts toward the next occupant.
   dccl_slot_finish uses it only when `gen` is the finishing generation. */
typedef struct dccl_kagg {
  uint32_t gen;               /* generation it holds (DCCL_KAGG_NONE: none yet) */
  uint32_t stopped;           /* KernelCh stops counted */
  uint32_t flags;             /* DCCL_KCH_SUSPECT | DCCL_KCH_ZERO */
  uint32_t pad_;
  uint64_t started;           /* bit c: channel c started (a second start is refused) */
  uint64_t stopmask;          /* bit c: channel c stopped (a second stop is refused) */
  uint64_t gmin;              /* earliest non-zero start pTimer of a stopped channel (UINT64_MAX: none) */
  uint64_t gmax;              /* latest stop pTimer */
  uint64_t sync_ns;           /* longest v7 initial_sync phase */
} dccl_kagg_t;
#define DCCL_KAGG_NONE UINT32_MAX /* never a generation (they are DCCL_H_GEN_MASK bits) */

/* KernelCh timing guard. A communicator's kernels run one after another on each channel, so an
   operation's KernelCh start pTimer on channel c cannot precede the latest KernelCh stop pTimer a
   collective of the same communicator reported on c. NCCL 2.28's proxy breaks this once its host
   and device per-channel work counters disagree (after a send/recv to self): it then fires
   KernelCh events with older kernels' timestamps. Such a child, or one whose stop precedes its
   start, makes the record untimed (NONE) with DCCL_FLAG_TIMING_SUSPECT: on the H100 those KernelCh
   events also fired ~0.05 ms after the enqueue, so the host's stop time is no completion time. Only collectives
   advance the per-channel stop (a group's sends and receives share channels and may overlap). */
#define DCCL_KCH_SUSPECT 2u
#define DCCL_KCH_ZERO 4u /* a stopped channel had a zero start or stop pTimer: no GPU timing */

/* Completion: two atomic RMWs per operation, whatever its channel count. The KernelCh events of
   one operation all come from its communicator's proxy thread (NCCL's profiler proxy progress), so
   the KernelCh aggregate (dccl_kagg_t) is plain loads/stores there; the
   stop that brings its count to expect_kch sets DCCL_DONE_KERNELS (set at the start when no
   KernelCh is expected), the Coll/P2p stop sets DCCL_DONE_STOPPED. `done` carries the slot
   generation in its low bits and every mark is a CAS that checks it, so a late event never marks
   the slot's next occupant. The RMW that completes both marks finishes the slot unless the reaper's
   DCCL_DONE_REAPED came first; the reaper sets REAPED only on an incomplete word of the generation
   it saw. So exactly one party finishes a generation, and it marks ctl finished with a plain store:
   no one else writes ctl until dccl_slot_finish frees the slot. Were the proxy assumption broken, a
   lost count would only make the record STALE. */
#define DCCL_DONE_STOPPED (1ull << 63)
#define DCCL_DONE_KERNELS (1ull << 62)
#define DCCL_DONE_REAPED (1ull << 61)
#define DCCL_DONE_BOTH (DCCL_DONE_STOPPED | DCCL_DONE_KERNELS)
#define DCCL_KCH_ORDER_SLACK_NS 1000 /* timer rounding of simulators; real violations are >= a kernel */

/* One in-flight Coll or P2p operation. Written by the starting thread, completed by whichever
   thread (proxy thread, application thread, reaper) makes the completion condition true. */
typedef struct dccl_slot {
  dccl_event_record_t rec;      /* prebuilt at start; timing fields filled at completion */
  _Atomic uint32_t busy;        /* 0 free, 1 allocated */
  uint32_t expect_kch;          /* KernelCh stops expected (0: complete at stopEvent) */
  _Atomic uint64_t ctl;         /* (generation << 1) | finished */
  _Atomic uint64_t done;        /* DCCL_DONE_* | generation (DCCL_H_GEN_MASK bits) */
  struct dccl_net* net;         /* per-peer network timing of this slot (net.h), NULL unless opted in */
  dccl_kagg_t kagg;             /* KernelCh timing of the generation kagg.gen (its proxy thread) */
  uint64_t kstart[DCCL_MAX_CHANNELS];      /* channel's start pTimer (valid while kagg.started has its bit) */
  _Atomic uint32_t kgen[DCCL_MAX_CHANNELS]; /* generation of the channel's last KernelCh start */
  uint64_t ksync[DCCL_MAX_CHANNELS];       /* channel's v7 initial_sync start pTimer (its phase's start) */
} __attribute__((aligned(64))) dccl_slot_t;

/* ---- event handles: encoded values, never pointers (handles.h) ---- */
#include "handles.h"

/* A finalized communicator stays registered (dead) for at least DCCL_GRAVE_MIN_MS so that late
   stops from a shared proxy find valid memory, and until its COMM record was announced (at most
   DCCL_GRAVE_MAX_MS), so a communicator shorter than one flush still gets its COMM record. */
#define DCCL_GRAVE_MIN_MS 1000
#define DCCL_GRAVE_MAX_MS 30000

typedef struct dccl_ctx {
  /* read-mostly */
  dccl_slot_t* slots;
  uint32_t pool_size;
  uint64_t comm_hash;
  int rank, nranks, nnodes;
  uint32_t pid;
  int* mask_ptr;                 /* NCCL's process-global activation mask */
  int record_mask;               /* which of Coll/P2p/KernelCh we record */
  int local_mask;                /* used when NCCL passes no mask pointer */
  uint64_t min_bytes;
  uint32_t sample;
  int abi_version;
  /* NCCL 2.29+ runs every ncclBroadcast through its AllGatherV path with no Coll event
     (enqueue.cc: the task it becomes has no activation mask): its CollApi event becomes an
     API-level record (DCCL_FLAG_API_LEVEL). Set at init: ABI >= 6, Coll recorded,
     NCCL_ALLGATHERV_ENABLE not 0. */
  int api_bcast;
  uint64_t api_bcast_seq;        /* ordinal of those broadcasts (the application thread's) */
  char name[88];
  uint64_t* p2p_seq;             /* [2 * nranks]: per (send|recv, peer) ordinal */
  struct dccl_chain* chain;      /* the chained profiler's state, NULL when not chained (chain.h) */
  _Atomic uintptr_t* chain_kch;  /* chain->kch, one load nearer for the chained KernelCh paths */
  ncclResult_t (*chain_stop)(void*); /* chain->stop and ->record, likewise */
  ncclResult_t (*chain_record)(void*, ncclProfilerEventState_t, ncclProfilerEventStateArgs_v4_t*);
  struct dccl_net* net;          /* [pool_size] per-peer network timing, NULL unless opted in (net.h) */
  /* [pool_size], the reaper's only (registry lock): the ctl value it last saw in flight in slot i
     and when (CLOCK_MONOTONIC). An operation's age counts from the reaper's first sight of it, so
     the hot path reads no clock for it: it is reaped between stale_ms and stale_ms + one sender
     period after its start. */
  struct dccl_reap_seen { uint64_t ctl, ns; }* reap;
  uint32_t index;                /* slot in dccl_ctx_tab (handles carry it) */
  /* chained: the route and communicator bits of a kept Coll/P2p handle of ours, DCCL_H_KEPT_OP_KEY (chain.h);
     else 0, which no handle's bits under that mask equal (in the padding after `index`) */
  uint32_t chain_op_key;
  uint64_t dead_ms;              /* CLOCK_MONOTONIC ms of finalize; 0 while live (registry lock) */
  struct dccl_ctx* next;         /* registry list (under dccl_g.registry) */
  uint64_t announced_conn;       /* sender: connection on which the COMM record was sent (registry lock) */
  /* (here, in the padding before `cursor`: the fields above keep their offsets) */
  uint64_t chain_types;          /* event types forwarded to the chained plugin (dccl_chain_types; 0: none) */
  uint64_t chain_kch_type;       /* ncclProfileKernelCh when among them, else 0 */
  uint64_t chain_dummy_types;    /* DCCL_DUMMY_TYPES among them */
  uint64_t chain_op_types;       /* Coll | P2p among them */
  _Atomic uintptr_t* chain_op;   /* chain->op, one load nearer for the chained Coll/P2p and KernelCh paths */
  void (*chain_start)(void);     /* the chained plugin's startEvent (its table's version), likewise */
  void* chain_ctx;               /* chain->ctx, likewise */
  /* written on the hot path */
  _Atomic uint64_t cursor __attribute__((aligned(64)));
  _Atomic uint64_t dropped_pool_full;
  _Atomic uint64_t sampled_out;
  /* Coverage (NCCL 2.28+: every collective call starts a CollApi event when Coll is in the mask):
     calls, and Coll/CeColl events started. Calls minus events are collectives NCCL ran without a
     Coll event. Relaxed load + store, no RMW: one application thread drives a communicator. */
  _Atomic uint64_t api_colls;
  _Atomic uint64_t coll_events;
  /* KernelCh timing guard: the latest collective KernelCh stop pTimer per channel (proxy thread) */
  _Atomic uint64_t last_stop[DCCL_MAX_CHANNELS] __attribute__((aligned(64)));
} dccl_ctx_t;

/* ---- the process-wide record ring (Vyukov bounded MPMC, one consumer; ring.c) ---- */
typedef struct dccl_ring {
  uint64_t mask;
  _Atomic uint64_t* seq;         /* per-cell sequence */
  dccl_event_record_t* recs;
  _Atomic uint64_t enqueue_pos __attribute__((aligned(64)));
  uint64_t dequeue_pos __attribute__((aligned(64)));  /* consumer only */
} dccl_ring_t;

int dccl_ring_init(dccl_ring_t* r, uint32_t size);
void dccl_ring_free(dccl_ring_t* r);
/* Copies *rec into the ring, setting rec->record_seq. Returns 0, or -1 if full. */
int dccl_ring_push(dccl_ring_t* r, const dccl_event_record_t* rec);
/* Pops up to max records into out. Single consumer. */
uint32_t dccl_ring_pop(dccl_ring_t* r, dccl_event_record_t* out, uint32_t max);

/* ---- process-global state ---- */
typedef struct dccl_global {
  pthread_mutex_t lifecycle;     /* init/finalize */
  pthread_mutex_t registry;      /* ctx list; shared with the sender thread */
  int refcount;
  dccl_ctx_t* ctxs;
  dccl_config_t cfg;             /* from the first init of this lifetime */
  dccl_ring_t ring;
  int abi_version;
  uint64_t start_ns;
  ncclDebugLogger_t logfn;
  /* sender thread */
  pthread_t thread;
  int thread_running;
  pthread_mutex_t wake_mutex;
  pthread_cond_t wake_cond;
  int stop_requested;
  /* counters (STATS record); hot-path ones are per ctx and folded in at finalize */
  _Atomic uint64_t events_dropped_pool_full;
  _Atomic uint64_t records_dropped_ring_full;
  _Atomic uint64_t records_undelivered;
  _Atomic uint64_t records_sent;
  _Atomic uint64_t events_stale;
  _Atomic uint64_t reconnects;
  _Atomic uint64_t sampled_out;
  _Atomic uint64_t kch_dropped;  /* KernelCh starts refused (bad channel id / duplicate) */
  _Atomic uint64_t timing_suspect; /* records whose KernelCh pTimers failed the order guard */
  _Atomic uint64_t colls_without_event; /* finalized communicators' CollApi calls without a Coll/CeColl */
  _Atomic uint64_t chain_stale;  /* chained-profiler or proxy-event handles that named a reused entry, a finished
                                    operation or a gone communicator */
  /* link to the DynamICCL tuner plugin (applied config version in every record) */
  _Atomic uintptr_t tuner_version_fn; /* uint32_t (*)(uint64_t comm_hash) in the tuner .so, or 0 */
  void* tuner_handle;                 /* dlopen(RTLD_NOLOAD) handle: keeps the tuner mapped */
} dccl_global_t;

extern dccl_global_t dccl_g;
extern dccl_ctx_t* _Atomic dccl_ctx_tab[DCCL_MAX_CTX];

/* dccl_now_ns(): CLOCK_REALTIME for record timestamps (the vDSO, or the TSC: clock.h) */
#include "clock.h"

/* Slot ages (the reaper, never the hot path): a clock step never reaps. */
static inline uint64_t dccl_monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t dccl_monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}
void dccl_stats_snapshot(dccl_stats_record_t* out);
/* Reap slots the reaper has seen in flight (same generation) since more than stale_ns before
   mono_now_ns (stale_ns 0: every busy slot, at once). A slot seen for the first time is only noted.
   Caller holds the registry lock. */
void dccl_reap_ctx_at(dccl_ctx_t* ctx, uint64_t mono_now_ns, uint64_t stale_ns);
/* The sender's entry: ages are measured on CLOCK_MONOTONIC now; now_ns (a CLOCK_REALTIME reading
   in older callers) is ignored so an NTP step cannot reap operations in flight. */
void dccl_reap_ctx(dccl_ctx_t* ctx, uint64_t now_ns, uint64_t stale_ns);
/* Complete a slot (the caller won the ctl "finished" bit); stale: reaped. finish.c */
void dccl_slot_finish(dccl_slot_t* s, int stale);
/* Same, for the generation gen the caller completed with its CAS on `done` (slot_mark). */
void dccl_slot_finish_gen(dccl_slot_t* s, uint32_t gen, int stale);

/* Tuner link (tuner_link.c): find the DynamICCL tuner NCCL loaded ($NCCL_TUNER_PLUGIN, dlopen with
   RTLD_NOLOAD, so nothing is loaded here) and its dynamiccl_tuner_config_version(); retried by the
   sender thread until found. dccl_tuner_version() is the hot-path read: one atomic load and, when
   linked, one call that is itself a single atomic load. */
#define DCCL_TUNER_LINK_RETRY_MS 1000
void dccl_tuner_link(void);
void dccl_tuner_unlink(void);
typedef uint32_t (*dccl_tuner_version_fn_t)(uint64_t comm_hash);
static inline uint32_t dccl_tuner_version(uint64_t comm_hash) {
  uintptr_t f = atomic_load_explicit(&dccl_g.tuner_version_fn, memory_order_acquire);
  return f ? ((dccl_tuner_version_fn_t)f)(comm_hash) : 0;
}

/* The slot a handle names (and its communicator in *out), or NULL when its communicator is gone
   (finalized, or not ours). */
static inline dccl_slot_t* handle_slot_ctx(uint64_t h, dccl_ctx_t** out) {
  dccl_ctx_t* ctx = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
  if (ctx == NULL) return NULL;
  uint32_t i = DCCL_H_SLOT(h);
  *out = ctx;
  if (i >= ctx->pool_size) return NULL;
  dccl_slot_t* s = &ctx->slots[i];
  if (s == NULL) __builtin_unreachable(); /* a pool of pool_size > 0 slots: the callers' NULL test is "gone" only */
  return s;
}

static inline dccl_slot_t* handle_slot(uint64_t h) {
  dccl_ctx_t* ctx;
  return handle_slot_ctx(h, &ctx);
}

/* Is the operation the handle was issued for still in flight in this slot? */
static inline int handle_live(const dccl_slot_t* s, uint64_t h) {
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
  /* not finished, and the generation's low bits match: one compare of (generation << 1) | finished */
  return (c & ((DCCL_H_GEN_MASK << 1) | 1)) == ((h >> 39) & (DCCL_H_GEN_MASK << 1));
}

/* A hot-path counter owned by one thread: a relaxed load and store, no locked RMW. */
static inline void dccl_bump(_Atomic uint64_t* c) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* Collectives a communicator ran without a Coll/CeColl event (calls still before their launch
   count until it). */
static inline uint64_t dccl_ctx_uncovered(dccl_ctx_t* c) {
  uint64_t api = atomic_load_explicit(&c->api_colls, memory_order_relaxed);
  uint64_t ev = atomic_load_explicit(&c->coll_events, memory_order_relaxed);
  return api > ev ? api - ev : 0;
}

/* lifecycle.c: init (every ABI version) and finalize */
ncclResult_t dccl_init_common(int abi, void** context, uint64_t commId, int* eActivationMask, const char* commName,
                              int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
ncclResult_t dccl_finalize(void* context);
extern uint64_t dccl_seq_base;

/* sender transport (connect.c): fds are non-blocking; -1 on failure (errno set) */
int dccl_connect_unix(const char* path);
int dccl_connect_tcp(const char* hostport);  /* -1 too while the name is still being resolved */
int dccl_send_all(int fd, const uint8_t* buf, size_t len, int timeout_ms);

/* sender thread (sender.c) */
int dccl_sender_start(void);
void dccl_sender_stop(void);

#define DCCL_LOG(level, ...)                                                                  \
  do {                                                                                         \
    if (dccl_g.logfn) dccl_g.logfn(level, NCCL_PROFILE, __FILE__, __LINE__, __VA_ARGS__);     \
  } while (0)
#define DCCL_WARN(...) DCCL_LOG(NCCL_LOG_WARN, __VA_ARGS__)
#define DCCL_INFO(...) DCCL_LOG(NCCL_LOG_INFO, __VA_ARGS__)

#endif /* DYNAMICCL_INTERNAL_H_ */
