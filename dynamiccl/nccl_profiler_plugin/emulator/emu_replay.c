/* The emulator's replay of NCCL's profiler call sequence for one operation (see nccl_emu.h). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dynamiccl_record.h"
#include "emu_internal.h"

/* The pTimer base pair (start, stop) channel 0 reports for op; records op's real times. */
static void emu_ptimers(emu_comm_t* c, const emu_coll_t* op, uint64_t* t0, uint64_t* t1) {
  *t0 = op->gpu_start_ns;
  *t1 = op->gpu_end_ns;
  if ((op->flags & EMU_F_STALE_PTIMER) && c->hist_n >= EMU_STALE_START_LAG) {
    *t0 = c->hist_start[(c->hist_n - EMU_STALE_START_LAG) % EMU_HIST];
    *t1 = c->hist_end[(c->hist_n - EMU_STALE_STOP_LAG) % EMU_HIST];
  }
  c->hist_start[c->hist_n % EMU_HIST] = op->gpu_start_ns;
  c->hist_end[c->hist_n % EMU_HIST] = op->gpu_end_ns;
  c->hist_n++;
}

/* ------------------------------------------------------------------------------------------ */
/* strings as NCCL passes them (static storage, like NCCL's)                                    */

static const char* const k_unknown = "Unknown";
static inline const char* s_func(int c) { return (c >= 0 && c < DCCL_FUNC_COUNT) ? dccl_func_names[c] : k_unknown; }
/* NCCL 2.27-2.30's ncclDatatypeToString has no ncclUint8 case: it passes "Unknown". */
static inline const char* s_dtype(int c) {
  return (c >= 0 && c < DCCL_DTYPE_COUNT && c != DCCL_DTYPE_NCCLUINT8) ? dccl_dtype_names[c] : k_unknown;
}
static inline const char* s_algo(int c) { return (c >= 0 && c < DCCL_ALGO_COUNT) ? dccl_algo_names[c] : k_unknown; }
static inline const char* s_proto(int c) {
  return (c >= 0 && c < DCCL_PROTO_COUNT) ? dccl_proto_names[c] : k_unknown;
}

/* ------------------------------------------------------------------------------------------ */
/* plugin calls, one descriptor type per ABI version (zero-initialised, as NCCL does)           */

/* One start through version V's descriptor and table. */
#define EMU_START_V(V, TYPE_T, c, hp, TYPE, PARENT, FILL)                    \
  do {                                                                       \
    ncclProfilerEventDescr_v##V##_t d;                                       \
    memset(&d, 0, sizeof d);                                                 \
    d.type = (TYPE_T)(TYPE);                                                 \
    d.parentObj = (PARENT);                                                  \
    d.rank = (c)->rank;                                                      \
    FILL;                                                                    \
    (c)->emu->t##V->startEvent((c)->ctx, (hp), &d);                          \
  } while (0)

/* v5+ events (API level): nothing on v4. */
#define EMU_START56(c, hp, TYPE, PARENT, FILL)                               \
  do {                                                                       \
    int v_ = (c)->emu->version;                                              \
    *(hp) = NULL;                                                            \
    if (v_ == 5) EMU_START_V(5, uint64_t, c, hp, TYPE, PARENT, FILL);        \
    else if (v_ == 6) EMU_START_V(6, uint64_t, c, hp, TYPE, PARENT, FILL);   \
    else if (v_ == 7) EMU_START_V(7, uint64_t, c, hp, TYPE, PARENT, FILL);   \
  } while (0)

/* Events of every version (v4's type is 8 bits). */
#define EMU_START(c, hp, TYPE, PARENT, FILL)                                 \
  do {                                                                       \
    *(hp) = NULL;                                                            \
    if ((c)->emu->version == 4) EMU_START_V(4, uint8_t, c, hp, TYPE, PARENT, FILL); \
    else EMU_START56(c, hp, TYPE, PARENT, FILL);                             \
  } while (0)

static inline void ev_stop(const struct emu* e, void* h) {
  if (h == NULL) return; /* NCCL skips stop/record for a NULL handle */
  if (e->version == 4)
    e->t4->stopEvent(h);
  else if (e->version == 5)
    e->t5->stopEvent(h);
  else if (e->version == 6)
    e->t6->stopEvent(h);
  else
    e->t7->stopEvent(h);
}

static inline void ev_record(const struct emu* e, void* h, ncclProfilerEventState_t st, uint64_t ptimer) {
  if (h == NULL) return;
  ncclProfilerEventStateArgs_v4_t a;
  memset(&a, 0, sizeof a);
  a.kernelCh.pTimer = ptimer;
  if (e->version == 4)
    e->t4->recordEventState(h, st, &a);
  else if (e->version == 5)
    e->t5->recordEventState(h, st, &a);
  else if (e->version == 6)
    e->t6->recordEventState(h, st, &a);
  else
    e->t7->recordEventState(h, st, &a);
}

/* The ceColl member exists in v6 and v7 only; EMU_START56 expands FILL for v5 too, so the fill
   goes through the v6 layout, whose ceColl prefix v7 keeps. */
#define EMU_CE_FILL(d, op) emu_ce_fill(&(d).type, (op))
static inline void emu_ce_fill(void* descr, const emu_coll_t* op) {
  ncclProfilerEventDescr_v6_t* d = descr;
  d->ceColl.seqNumber = op->seq_number;
  d->ceColl.func = s_func(op->func);
  d->ceColl.count = op->count;
  d->ceColl.root = op->root;
  d->ceColl.datatype = s_dtype(op->datatype);
  d->ceColl.syncStrategy = "UC";
}

static inline int is_p2p(const emu_coll_t* op) { return op->func == DCCL_FUNC_SEND || op->func == DCCL_FUNC_RECV; }

/* v7 KernelPhase children of one KernelCh, fired before its stop (NCCL 2.31 profiler thread):
   initial_sync [t0, t0 + EMU_SYNC_NS(ch)], compute, final_sync [t1 - 10, t1]. Returns the calls made. */
static uint64_t emu_phases(emu_comm_t* c, void* kch, uint8_t ch, uint64_t t0, uint64_t t1) {
  static const char* const names[3] = {"initial_sync", "compute", "final_sync"};
  uint64_t ts[4] = {t0, t0 + EMU_SYNC_NS(ch), t1 - 10, t1};
  uint64_t n = 0;
  for (int i = 0; i < 3; i++) {
    ncclProfilerEventDescr_v7_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileKernelPhase;
    d.parentObj = kch;
    d.rank = c->rank;
    d.kernelPhase.channelId = ch;
    d.kernelPhase.phaseId = (uint8_t)i;
    d.kernelPhase.phaseName = names[i];
    d.kernelPhase.pTimer = ts[i];
    void* h = NULL;
    c->emu->t7->startEvent(c->ctx, &h, &d);
    ev_record(c->emu, h, ncclProfilerKernelPhaseStop, ts[i + 1]);
    ev_stop(c->emu, h);
    n += 1 + 2 * (h != NULL);
  }
  return n;
}

/* EMU_F_NET: one channel's send and receive proxy ops, every step through its direction's states. */
static uint64_t emu_net_channel(emu_comm_t* c, void* coll, int ch, int mask) {
  static const ncclProfilerEventState_t k_states[2][3] = {
      {ncclProfilerProxyStepRecvWait, ncclProfilerProxyStepRecvFlushWait, ncclProfilerProxyStepRecvGPUWait},
      {ncclProfilerProxyStepSendGPUWait, ncclProfilerProxyStepSendPeerWait_v4, ncclProfilerProxyStepSendWait}};
  struct emu* e = c->emu;
  int n = c->nranks > 0 ? c->nranks : 1;
  uint64_t calls = 0;
  for (int send = 1; send >= 0; send--) {
    void* pop;
    EMU_START(c, &pop, ncclProfileProxyOp, coll, {
      d.proxyOp.pid = c->pid;
      d.proxyOp.channelId = (uint8_t)ch;
      d.proxyOp.peer = send ? (c->rank + 1) % n : (c->rank + n - 1) % n;
      d.proxyOp.nSteps = EMU_PROXY_STEPS;
      d.proxyOp.chunkSize = (int)EMU_NET_CHUNK;
      d.proxyOp.isSend = send;
    });
    calls++;
    for (int s = 0; s < EMU_PROXY_STEPS && (mask & ncclProfileProxyStep) && pop != NULL; s++) {
      void* step;
      EMU_START(c, &step, ncclProfileProxyStep, pop, d.proxyStep.step = s);
      for (int k = 0; k < 3; k++) {
        ncclProfilerEventState_t st = k_states[send][k];
        int sized = st == ncclProfilerProxyStepSendWait || st == ncclProfilerProxyStepRecvWait;
        ev_record(e, step, st, sized ? EMU_NET_CHUNK : 0); /* the args union: transSize */
      }
      ev_stop(e, step);
      calls += 1 + 4 * (step != NULL);
    }
    ev_stop(e, pop);
    calls += pop != NULL;
  }
  return calls;
}

/* The proxy-thread part of one operation: KernelCh per channel, plus proxy ops across nodes. */
void emu_replay_proxy(emu_comm_t* c, void* coll, const emu_coll_t* op, uint64_t* calls) {
  struct emu* e = c->emu;
  int mask = __atomic_load_n(&e->mask, __ATOMIC_RELAXED);
  void* kparent = (op->flags & EMU_F_NULL_KCH_PARENT) ? NULL : coll;
  uint64_t n = 0;
  int nch = op->n_channels < 0 ? 0 : (op->n_channels > 64 ? 64 : op->n_channels);
  /* A send/recv to self has no proxy ops and hence no proxy or KernelCh events
     (enqueue.cc addP2pToPlan: nProxyOps = selfSend ? 0 : 2). */
  if (is_p2p(op) && op->root == c->rank) nch = 0;
  if ((op->flags & EMU_F_CROSS_NODE) && (mask & (ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin))) {
    for (int ch = 0; ch < nch; ch++) {
      void* pop;
      EMU_START(c, &pop, ncclProfileProxyOp, coll, {
        d.proxyOp.pid = c->pid;
        d.proxyOp.channelId = (uint8_t)ch;
        d.proxyOp.peer = (c->rank + 1) % (c->nranks > 0 ? c->nranks : 1);
        d.proxyOp.nSteps = EMU_PROXY_STEPS;
        d.proxyOp.chunkSize = 1 << 17;
        d.proxyOp.isSend = 1;
      });
      n++;
      for (int s = 0; s < EMU_PROXY_STEPS && (mask & ncclProfileProxyStep); s++) {
        void* step;
        EMU_START(c, &step, ncclProfileProxyStep, pop, d.proxyStep.step = s);
        ev_record(e, step, ncclProfilerProxyStepSendGPUWait, 0);
        ev_record(e, step, ncclProfilerProxyStepSendWait, 0);
        ev_stop(e, step);
        n += 1 + 2 * (step != NULL) + (step != NULL);
      }
      ev_record(e, pop, ncclProfilerProxyOpInProgress_v4, 0);
      ev_stop(e, pop);
      n += 2 * (pop != NULL);
    }
    if (op->flags & EMU_F_PXN) {
      void* pop;
      EMU_START(c, &pop, ncclProfileProxyOp, EMU_FOREIGN_PARENT, {
        d.proxyOp.pid = c->pid + 100000; /* another process's proxy op (PXN) */
        d.proxyOp.channelId = 0;
        d.proxyOp.peer = 0;
        d.proxyOp.nSteps = 1;
        d.proxyOp.isSend = 0;
      });
      ev_stop(e, pop);
      n += 1 + (pop != NULL);
    }
  }
  if ((op->flags & EMU_F_NET) && (mask & ncclProfileProxyOp))
    for (int ch = 0; ch < nch; ch++) n += emu_net_channel(c, coll, ch, mask);
  if ((op->flags & EMU_F_CE) && e->version >= 6) nch = 0; /* copy engines: no kernel, no proxy */
  if ((mask & ncclProfileKernelCh) && !(op->flags & EMU_F_NO_KERNEL) && nch > 0) {
    int gpu = !(op->flags & EMU_F_NO_GPU_TIMER);
    uint64_t g0, g1;
    emu_ptimers(c, op, &g0, &g1);
    for (int ch = 0; ch < nch; ch++) {
      void* k;
      uint64_t t0 = gpu ? g0 + (uint64_t)ch : 0;
      uint64_t t1 = gpu ? g1 - (uint64_t)ch : 0;
      EMU_START(c, &k, ncclProfileKernelCh, kparent, {
        d.kernelCh.channelId = (uint8_t)ch;
        d.kernelCh.pTimer = t0;
      });
      if (e->version >= 7 && (mask & ncclProfileKernelPhase) && (op->flags & EMU_F_PHASES) && k != NULL)
        n += emu_phases(c, k, (uint8_t)ch, t0, t1);
      ev_record(e, k, ncclProfilerKernelChStop, t1);
      ev_stop(e, k);
      n += 1 + 2 * (k != NULL);
    }
  }
  *calls += n;
}

/* NCCL 2.29+ (ABI 6+) runs ncclBroadcast through its AllGatherV path: the task it becomes carries
   no profiler activation mask, so no Coll and no KernelCh event (enqueue.cc), unless
   NCCL_ALLGATHERV_ENABLE=0. */
static int bcast_without_event(const struct emu* e, const emu_coll_t* op) {
  if (e->version < 6 || op->func != DCCL_FUNC_BROADCAST || (op->flags & EMU_F_CE)) return 0;
  const char* v = getenv("NCCL_ALLGATHERV_ENABLE");
  return v == NULL || *v == '\0' || strtol(v, NULL, 10) != 0;
}

/* The application-thread part of one operation. Returns the Coll/P2p handle. */
void* emu_replay_app(emu_comm_t* c, const emu_coll_t* op) {
  struct emu* e = c->emu;
  int mask = __atomic_load_n(&e->mask, __ATOMIC_RELAXED);
  int p2p = is_p2p(op);
  int opBit = p2p ? ncclProfileP2p : ncclProfileColl;
  int childBits = ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin;
  void *group = NULL, *api = NULL, *coll = NULL, *kl = NULL;
  uint64_t n = 0;
  if (e->version >= 5) {
    if (mask) {
      EMU_START56(c, &group, ncclProfileGroupApi, NULL, {
        d.groupApi.graphCaptured = false;
        d.groupApi.groupDepth = 1;
      });
      n++;
    }
    int apiBit = p2p ? ncclProfileP2pApi : ncclProfileCollApi;
    if (mask & (apiBit | opBit | childBits)) {
      if (p2p) {
        EMU_START56(c, &api, ncclProfileP2pApi, group, {
          d.p2pApi.func = s_func(op->func);
          d.p2pApi.count = op->count;
          d.p2pApi.datatype = s_dtype(op->datatype);
        });
      } else {
        EMU_START56(c, &api, ncclProfileCollApi, group, {
          d.collApi.func = s_func(op->func);
          d.collApi.count = op->count;
          d.collApi.datatype = s_dtype(op->datatype);
          d.collApi.root = op->root;
        });
      }
      ev_stop(e, api);
      n += 1 + (api != NULL);
    }
    ev_record(e, group, ncclProfilerGroupEndApiStart, 0);
    n += (group != NULL);
    if (mask & ncclProfileKernelLaunch) {
      EMU_START56(c, &kl, ncclProfileKernelLaunch, group, d.kernelLaunch.stream = NULL);
      ev_stop(e, kl);
      n += 1 + (kl != NULL);
    }
  } else if (mask & (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | childBits)) {
    EMU_START(c, &group, ncclProfileGroup, NULL, (void)0);
    n++;
  }
  void* parent = (op->flags & EMU_F_NULL_PARENT) ? NULL : (e->version >= 5 ? api : group);
  int ce = (op->flags & EMU_F_CE) && e->version >= 6;
  if (!p2p && ((op->flags & EMU_F_NO_COLL_EVENT) || bcast_without_event(e, op))) {
    coll = NULL; /* the CollApi above was its only event */
  } else if (ce) { /* ncclLaunchCeColl: CeColl around the host-side launch, no Coll, no kernel */
    if (mask & (ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch)) {
      EMU_START56(c, &coll, ncclProfileCeColl, parent, {
        if (e->version >= 6) EMU_CE_FILL(d, op);
      });
      ev_stop(e, coll);
      n += 1 + (coll != NULL);
    }
    coll = NULL; /* nothing for the proxy side */
  } else if (mask & (opBit | childBits)) {
    if (p2p) {
      EMU_START(c, &coll, ncclProfileP2p, parent, {
        d.p2p.func = s_func(op->func);
        d.p2p.datatype = s_dtype(op->datatype);
        d.p2p.count = op->count;
        d.p2p.peer = op->root;
        d.p2p.nChannels = (uint8_t)op->n_channels;
      });
    } else {
#define EMU_COLL_FILL                                                                             \
  do {                                                                                            \
    d.coll.seqNumber = op->seq_number;                                                            \
    d.coll.func = s_func(op->func);                                                               \
    d.coll.count = op->count;                                                                     \
    d.coll.root = op->root;                                                                       \
    d.coll.datatype = s_dtype(op->datatype);                                                      \
    /* CollNet paths report nChannels = 0; their KernelCh children still come (emu_replay_proxy). */ \
    d.coll.nChannels = (op->flags & EMU_F_COLLNET) ? 0 : (uint8_t)op->n_channels;                 \
    d.coll.nWarps = (uint8_t)op->n_warps;                                                         \
    d.coll.algo = s_algo(op->algo);                                                               \
    d.coll.proto = s_proto(op->proto);                                                            \
  } while (0)
      if (e->version == 7) {
        ncclProfilerEventDescr_v7_t d;
        memset(&d, 0, sizeof d);
        d.type = ncclProfileColl;
        d.parentObj = parent;
        d.rank = c->rank;
        EMU_COLL_FILL;
        d.coll.userTag = (op->flags & EMU_F_TAGGED) ? EMU_USER_TAG(op) : 0;
        d.coll.isSymColl = (op->flags & EMU_F_SYMMETRIC) != 0;
        d.coll.kernelVariant = (op->flags & EMU_F_SYMMETRIC) ? "sym" : "default";
        coll = NULL;
        e->t7->startEvent(c->ctx, &coll, &d);
      } else {
        EMU_START(c, &coll, ncclProfileColl, parent, EMU_COLL_FILL);
      }
    }
    ev_stop(e, coll); /* "enqueued" */
    n += 1 + (coll != NULL);
  }
  ev_stop(e, group);
  n += (group != NULL);
  c->calls_app += n;
  return coll;
}
