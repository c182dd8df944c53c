/* A test-only NCCL profiler plugin that records every ABI call it receives, one line per call, so
 * tests/simulator/test_profiler_abi.py can check the call sequence the simulator drives through the
 * emulator (NCCL's order: GroupApi -> CollApi -> Coll -> KernelCh [+ ProxyOp across nodes]).
 *
 * Environment:
 *   DCCL_ABI_RECORD      file prefix; each process writes <prefix>.<pid> (required)
 *   DCCL_ABI_MASK        activation mask written in init (default: every event the emulator produces)
 *   DCCL_ABI_FAIL_INIT   if set, init logs a WARN through NCCL's logger and returns ncclInternalError
 *
 * Build (the test does this): cc -shared -fPIC -O1 -I nccl_profiler_plugin/include abi_recorder.c
 *   [-DONLY_V4] -o librecorder.so -lpthread
 * Not for production: it allocates per event and takes a lock per call.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"

typedef struct ev {
  uint64_t id;
  uint64_t type;
} ev_t;

typedef struct ctx {
  uint64_t id;
} ctx_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE* g_out = NULL;
static uint64_t g_next_ev = 1, g_next_ctx = 1;

static FILE* out(void) {
  if (g_out == NULL) {
    const char* prefix = getenv("DCCL_ABI_RECORD");
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", prefix ? prefix : "/tmp/dccl-abi-record", (int)getpid());
    g_out = fopen(path, "w");
  }
  return g_out;
}

#define EMIT(...)                          \
  do {                                     \
    pthread_mutex_lock(&g_lock);           \
    FILE* f_ = out();                      \
    if (f_) {                              \
      fprintf(f_, __VA_ARGS__);            \
      fflush(f_);                          \
    }                                      \
    pthread_mutex_unlock(&g_lock);         \
  } while (0)

static const char* s(const char* x) { return x ? x : "(null)"; }
static uint64_t pid_of(void* parent) { return parent ? ((ev_t*)parent)->id : 0; }

static ncclResult_t do_init(void** context, uint64_t commId, int* mask, const char* name, int nNodes, int nranks,
                            int rank, ncclDebugLogger_t logfn, int version) {
  if (getenv("DCCL_ABI_FAIL_INIT")) {
    if (logfn) logfn(NCCL_LOG_WARN, NCCL_PROFILE, __FILE__, __LINE__, "abi-recorder: init refused (test)");
    return ncclInternalError;
  }
  const char* m = getenv("DCCL_ABI_MASK");
  *mask = m ? (int)strtol(m, NULL, 0)
            : (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileKernelCh |
               ncclProfileGroupApi | ncclProfileCollApi | ncclProfileP2pApi);
  ctx_t* c = calloc(1, sizeof *c);
  if (c == NULL) return ncclSystemError;
  pthread_mutex_lock(&g_lock);
  c->id = g_next_ctx++;
  pthread_mutex_unlock(&g_lock);
  *context = c;
  EMIT("init|v%d|%" PRIu64 "|%" PRIu64 "|%s|%d|%d|%d|%d\n", version, c->id, commId, s(name), nNodes, nranks, rank,
       *mask);
  return ncclSuccess;
}

static ev_t* new_ev(uint64_t type) {
  ev_t* e = calloc(1, sizeof *e);
  if (e == NULL) return NULL;
  pthread_mutex_lock(&g_lock);
  e->id = g_next_ev++;
  pthread_mutex_unlock(&g_lock);
  e->type = type;
  return e;
}

/* Fields shared by v4/v5/v6 after the union start (same offsets, see nccl_profiler_abi.h). */
static void emit_common(ctx_t* c, ev_t* e, uint64_t type, void* parent, int rank, const ncclProfilerEventDescr_v5_t* d5,
                        const ncclProfilerEventDescr_v4_t* d4) {
  uint64_t cid = c ? c->id : 0;
  uint64_t par = pid_of(parent);
  if (type == ncclProfileColl) {
    if (d5)
      EMIT("start|%" PRIu64 "|%" PRIu64 "|Coll|%" PRIu64 "|%d|%" PRIu64 "|%s|%zu|%d|%s|%u|%u|%s|%s\n", cid, e->id, par,
           rank, d5->coll.seqNumber, s(d5->coll.func), d5->coll.count, d5->coll.root, s(d5->coll.datatype),
           d5->coll.nChannels, d5->coll.nWarps, s(d5->coll.algo), s(d5->coll.proto));
    else
      EMIT("start|%" PRIu64 "|%" PRIu64 "|Coll|%" PRIu64 "|%d|%" PRIu64 "|%s|%zu|%d|%s|%u|%u|%s|%s\n", cid, e->id, par,
           rank, d4->coll.seqNumber, s(d4->coll.func), d4->coll.count, d4->coll.root, s(d4->coll.datatype),
           d4->coll.nChannels, d4->coll.nWarps, s(d4->coll.algo), s(d4->coll.proto));
  } else if (type == ncclProfileP2p) {
    if (d5)
      EMIT("start|%" PRIu64 "|%" PRIu64 "|P2p|%" PRIu64 "|%d|%s|%zu|%d|%u\n", cid, e->id, par, rank, s(d5->p2p.func),
           d5->p2p.count, d5->p2p.peer, d5->p2p.nChannels);
    else
      EMIT("start|%" PRIu64 "|%" PRIu64 "|P2p|%" PRIu64 "|%d|%s|%zu|%d|%u\n", cid, e->id, par, rank, s(d4->p2p.func),
           d4->p2p.count, d4->p2p.peer, d4->p2p.nChannels);
  } else if (type == ncclProfileKernelCh) {
    uint8_t ch = d5 ? d5->kernelCh.channelId : d4->kernelCh.channelId;
    uint64_t t = d5 ? d5->kernelCh.pTimer : d4->kernelCh.pTimer;
    EMIT("start|%" PRIu64 "|%" PRIu64 "|KernelCh|%" PRIu64 "|%d|%u|%" PRIu64 "\n", cid, e->id, par, rank, ch, t);
  } else if (type == ncclProfileProxyOp) {
    int peer = d5 ? d5->proxyOp.peer : d4->proxyOp.peer;
    uint8_t ch = d5 ? d5->proxyOp.channelId : d4->proxyOp.channelId;
    int send = d5 ? d5->proxyOp.isSend : d4->proxyOp.isSend;
    EMIT("start|%" PRIu64 "|%" PRIu64 "|ProxyOp|%" PRIu64 "|%d|%u|%d|%d\n", cid, e->id, par, rank, ch, peer, send);
  } else if (type == ncclProfileCollApi && d5) {
    EMIT("start|%" PRIu64 "|%" PRIu64 "|CollApi|%" PRIu64 "|%d|%s|%zu|%s|%d\n", cid, e->id, par, rank,
         s(d5->collApi.func), d5->collApi.count, s(d5->collApi.datatype), d5->collApi.root);
  } else if (type == ncclProfileP2pApi && d5) {
    EMIT("start|%" PRIu64 "|%" PRIu64 "|P2pApi|%" PRIu64 "|%d|%s|%zu\n", cid, e->id, par, rank, s(d5->p2pApi.func),
         d5->p2pApi.count);
  } else if (type == ncclProfileGroupApi) {
    EMIT("start|%" PRIu64 "|%" PRIu64 "|GroupApi|%" PRIu64 "|%d\n", cid, e->id, par, rank);
  } else if (type == ncclProfileGroup) {
    EMIT("start|%" PRIu64 "|%" PRIu64 "|Group|%" PRIu64 "|%d\n", cid, e->id, par, rank);
  } else {
    EMIT("start|%" PRIu64 "|%" PRIu64 "|type%" PRIu64 "|%" PRIu64 "|%d\n", cid, e->id, type, par, rank);
  }
}

static ncclResult_t start_v5(void* context, void** h, ncclProfilerEventDescr_v5_t* d) {
  ev_t* e = new_ev(d->type);
  *h = e;
  if (e) emit_common(context, e, d->type, d->parentObj, d->rank, d, NULL);
  return ncclSuccess;
}

__attribute__((unused)) static ncclResult_t start_v6(void* context, void** h, ncclProfilerEventDescr_v6_t* d) {
  /* the v5 union members sit at the same offsets in v6 */
  return start_v5(context, h, (ncclProfilerEventDescr_v5_t*)d);
}

static ncclResult_t start_v4(void* context, void** h, ncclProfilerEventDescr_v4_t* d) {
  ev_t* e = new_ev(d->type);
  *h = e;
  if (e) emit_common(context, e, d->type, d->parentObj, d->rank, NULL, d);
  return ncclSuccess;
}

static ncclResult_t stop(void* h) {
  if (h) EMIT("stop|%" PRIu64 "\n", ((ev_t*)h)->id);
  return ncclSuccess;
}

static ncclResult_t record(void* h, ncclProfilerEventState_t st, ncclProfilerEventStateArgs_v4_t* a) {
  if (h) EMIT("record|%" PRIu64 "|%d|%" PRIu64 "\n", ((ev_t*)h)->id, (int)st, a ? a->kernelCh.pTimer : 0);
  return ncclSuccess;
}

static ncclResult_t finalize(void* context) {
  ctx_t* c = context;
  EMIT("finalize|%" PRIu64 "\n", c ? c->id : 0);
  free(c);
  return ncclSuccess;
}

__attribute__((unused)) static ncclResult_t init_v5(void** context, uint64_t commId, int* mask, const char* name,
                                                    int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return do_init(context, commId, mask, name, nNodes, nranks, rank, logfn, 5);
}

__attribute__((unused)) static ncclResult_t init_v6(void** context, uint64_t commId, int* mask, const char* name,
                                                    int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return do_init(context, commId, mask, name, nNodes, nranks, rank, logfn, 6);
}

static ncclResult_t init_v4(void** context, int* mask, const char* name, uint64_t commHash, int nNodes, int nranks,
                            int rank, ncclDebugLogger_t logfn) {
  return do_init(context, commHash, mask, name, nNodes, nranks, rank, logfn, 4);
}

__attribute__((visibility("default"))) const ncclProfiler_v4_t ncclProfiler_v4 = {
    "abi-recorder", init_v4, start_v4, stop, record, finalize};
#ifndef ONLY_V4
__attribute__((visibility("default"))) const ncclProfiler_v5_t ncclProfiler_v5 = {
    "abi-recorder", init_v5, start_v5, stop, record, finalize};
__attribute__((visibility("default"))) const ncclProfiler_v6_t ncclProfiler_v6 = {
    "abi-recorder", init_v6, start_v6, stop, record, finalize};
#endif
