/* DynamICCL NCCL tuner plugin: ABI tables (v7, v6, v5, v4), per-communicator contexts, hot path.
 *
 * Hot path (getCollInfo, getChunkSize): no allocation, no lock, no syscall. One acquire load of
 * the published tag, a seqlock-validated scan of the applied version's rules for this function,
 * then the cost table edit. In epoch mode, while a version waits for its time, one
 * clock_gettime(CLOCK_REALTIME) through the vDSO per call.
 *
 * Semantics (the reference is nccl_tuner_plugin/config.py:apply_rule; tests compare):
 *   - the first rule matching (function, nBytes in [min, max], communicator) is used;
 *   - among the cells its algo/proto allow that NCCL left enabled (cost >= 0), the cheapest one
 *     is set to 0.0 (NCCL's argmin then picks it); a -1 cell is never revived;
 *   - its channel count (if > 0) is written as NCCL's per-task channel budget unless the cell is
 *     CollNet (Direct, Chain) or NVLS on more than one node: those run as "collnet" tasks, whose
 *     budget NCCL uses without clamping it to the channels it built (enqueue.cc: isCollnet in
 *     getAlgoInfo's caller, scheduleCollTasksToPlan's isCollnet branch), so there NCCL's own count
 *     stands; Tree, Ring, PAT, NVLS_TREE and single-node NVLS are clamped to nMaxChannels[kind];
 *   - no rule, or no enabled cell allowed: nothing is touched (NCCL's choice stands);
 *   - getChunkSize (v6+) sets the rule's chunk (if > 0) when NCCL runs an (algo, proto) the rule
 *     allows, looked up by the size getCollInfo saw for that function; the chunk is rounded up to
 *     the protocol's grain (NCCL rounds it down to the grain and divides by the result) and capped
 *     at DCT_MAX_CHUNK; NCCL then clamps it to its buffer;
 *   - tuner v4 (NCCL 2.27) gives no communicator id: a version with communicator-specific rules
 *     cannot be applied as written there, so it is not applied at all (NCCL's choice stands and
 *     records carry version 0; see dynamiccl_tuner_record_version).
 *   Every entry point returns ncclSuccess (a non-success getCollInfo fails the collective).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static inline void ctr_inc(_Atomic uint64_t* c) {
  /* one writer per communicator (NCCL serializes calls on a communicator): no RMW needed */
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* Epoch mode: apply the pending version once its time has come. */
static inline void maybe_switch(void) {
  uint64_t pt = atomic_load_explicit(&dct_g.pending_tag, memory_order_acquire);
  if (__builtin_expect(pt == 0, 1)) return;
  int i = DCT_TAG_SLOT(pt);
  if (i < 0 || i >= DCT_NSLOTS) return;
  const dct_slot_t* s = &dct_g.slots[i];
  uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
  if (q != (pt & DCT_TAG_SEQ_MASK)) return;
  uint64_t at = s->v.apply_at_ns, ver = s->v.version;
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&s->seq, memory_order_relaxed) != q) return;
  if (dct_now_ns() < at) return;
  if (atomic_compare_exchange_strong(&dct_g.pending_tag, &pt, 0)) {
    atomic_store_explicit(&dct_g.applied_tag, pt, memory_order_release);
    atomic_store_explicit(&dct_g.applied_version, ver, memory_order_release);
    atomic_fetch_add_explicit(&dct_g.applies, 1, memory_order_relaxed);
  }
}

/* NCCL's chunk grain per protocol (device.h ncclProtoGrainSize: LL 16, LL128 1920, Simple 512). */
static const uint32_t k_proto_grain[3] = {16, 1920, 512};
#define DCT_MAX_CHUNK (UINT64_C(1) << 30) /* absurd values (2^64-1) stop here; NCCL clamps to its buffer */

/* The chunk NCCL may use for `proto`: 0 when the protocol is unknown (NCCL's chunk stands). */
static inline uint64_t chunk_for_proto(uint64_t chunk, int proto) {
  if (proto < 0 || proto >= 3) return 0;
  uint64_t g = k_proto_grain[proto];
  if (chunk > DCT_MAX_CHUNK) chunk = DCT_MAX_CHUNK;
  return (chunk + g - 1) / g * g;
}

/* Cells whose channel budget NCCL clamps to the channels it built: all but its "collnet" tasks
 * (CollNet Direct/Chain, and NVLS when the communicator spans nodes). */
static inline int nccl_clamps_channels(int algo, size_t nnodes) {
  if (algo == NCCL_ALGO_COLLNET_DIRECT || algo == NCCL_ALGO_COLLNET_CHAIN) return 0;
  return !(algo == NCCL_ALGO_NVLS && nnodes > 1);
}

/* The applied rule for (function, nBytes, communicator): 1 found (copied into *out), 0 none. */
static inline int find_rule(dct_ctx_t* ctx, int f, uint64_t nbytes, dct_rule_t* out) {
  maybe_switch();
  for (int tries = 0; tries < DCT_LOOKUP_MAX_RETRIES; tries++) {
    uint64_t tag = atomic_load_explicit(&dct_g.applied_tag, memory_order_acquire);
    if (tag == 0) return 0;
    int i = DCT_TAG_SLOT(tag);
    if (i < 0 || i >= DCT_NSLOTS) return 0;
    const dct_slot_t* s = &dct_g.slots[i];
    uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (q != (tag & DCT_TAG_SEQ_MASK)) { /* slot reused: the applied tag has moved on */
      ctr_inc(&ctx->retries);
      continue;
    }
    const dct_version_t* v = &s->v;
    int found = 0;
    int applicable = ctx->comm_known || !v->has_comm_rules;
    /* every index is clamped: a torn read (detected below) must still stay in bounds */
    uint32_t lo = v->bnd_start[f], hi = v->bnd_start[f + 1];
    if (hi > DCT_MAX_BND) hi = DCT_MAX_BND;
    if (applicable && lo < hi) {
      while (hi - lo > 1) { /* last boundary <= nbytes; bnd[first] is 0 */
        uint32_t mid = (lo + hi) / 2;
        if (v->bnd[mid] <= nbytes) lo = mid;
        else hi = mid;
      }
      uint32_t k = v->first[lo], end = v->func_start[f + 1];
      if (end > DCT_MAX_RULES) end = DCT_MAX_RULES;
      for (; k < end; k++) {
        const dct_rule_t* r = &v->rules[k];
        if (nbytes >= r->min_bytes && nbytes <= r->max_bytes && (r->any_comm || r->comm == ctx->comm)) {
          *out = *r;
          found = 1;
          break;
        }
      }
    }
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s->seq, memory_order_relaxed) == q) return found;
    ctr_inc(&ctx->retries);
  }
  return 0;
}

/* Live tuner-v4 contexts (lifecycle lock for writes). */
static _Atomic int g_v4_contexts;

static ncclResult_t dct_get_coll_info(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                      float** collCostTable, int numAlgo, int numProto, int regBuff,
                                      int* nChannels) {
  (void)numPipeOps;
  (void)regBuff;
  dct_ctx_t* ctx = (dct_ctx_t*)context;
  if (ctx == NULL) return ncclSuccess;
  ctr_inc(&ctx->calls);
  int f = dct_func_index((int)collType);
  if (f < 0 || collCostTable == NULL || numAlgo <= 0 || numProto <= 0) return ncclSuccess;
  ctx->last_bytes[f] = (uint64_t)nBytes;
  dct_rule_t r;
  if (!find_rule(ctx, f, (uint64_t)nBytes, &r)) goto chain;
  float* t = (float*)collCostTable; /* really float[numAlgo][numProto] */
  int a0 = 0, a1 = numAlgo, p0 = 0, p1 = numProto;
  if (r.algo >= 0) {
    a0 = r.algo;
    a1 = r.algo + 1 < numAlgo ? r.algo + 1 : numAlgo;
  }
  if (r.proto >= 0) {
    p0 = r.proto;
    p1 = r.proto + 1 < numProto ? r.proto + 1 : numProto;
  }
  int best = -1;
  float bc = INFINITY;
  for (int a = a0; a < a1; a++)
    for (int p = p0; p < p1; p++) {
      float c = t[a * numProto + p];
      if (c >= 0.0f && c < bc) {
        bc = c;
        best = a * numProto + p;
      }
    }
  if (best < 0) {
    ctr_inc(&ctx->no_enabled);
    goto chain;
  }
  t[best] = 0.0f;
  /* <= 64 by parse: NCCL's 8-bit budget */
  if (r.nch > 0 && nChannels != NULL && nccl_clamps_channels(best / numProto, ctx->nnodes)) *nChannels = r.nch;
  ctr_inc(&ctx->decisions);
  return ncclSuccess;
chain: /* no decision of ours: the chained tuner's, if any (its failure keeps NCCL's choice) */
  if (ctx->chain_coll != NULL) {
    ctr_inc(&ctx->chain_calls);
    if (ctx->chain_coll(ctx->chain_ctx, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, regBuff,
                        nChannels) != ncclSuccess)
      ctr_inc(&ctx->chain_errors);
  }
  return ncclSuccess;
}

static ncclResult_t dct_get_chunk_size(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                                       int nChannels, size_t* chunkSize) {
  dct_ctx_t* ctx = (dct_ctx_t*)context;
  if (ctx == NULL || chunkSize == NULL) return ncclSuccess;
  int f = dct_func_index((int)collType);
  if (f < 0) return ncclSuccess;
  /* NCCL passes the bytes of one channel part (enqueue.cc calcCollChunking callers); the rule is
     the one getCollInfo chose for this function, found by the size it saw. A part larger than that
     size belongs to another call: look up by the part then. */
  uint64_t key = ctx->last_bytes[f] >= (uint64_t)nBytes ? ctx->last_bytes[f] : (uint64_t)nBytes;
  dct_rule_t r;
  uint64_t c = 0;
  if (find_rule(ctx, f, key, &r) && r.chunk != 0 && (r.algo < 0 || r.algo == algo) && (r.proto < 0 || r.proto == proto))
    c = chunk_for_proto(r.chunk, proto);
  if (c == 0) { /* no chunk of ours: the chained tuner's, if any */
    if (ctx->chain_chunk != NULL) {
      ctr_inc(&ctx->chain_calls);
      size_t keep = *chunkSize;
      if (ctx->chain_chunk(ctx->chain_ctx, collType, nBytes, algo, proto, nChannels, chunkSize) != ncclSuccess) {
        ctr_inc(&ctx->chain_errors);
        *chunkSize = keep;
      }
    }
    return ncclSuccess;
  }
  *chunkSize = (size_t)c;
  ctr_inc(&ctx->chunk_set);
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* init / finalize (not the hot path). Never fail: a tuner init error fails communicator         */
/* creation; without a context the plugin just leaves NCCL's choices alone.                    */

static ncclResult_t init_common(int abi, void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                ncclDebugLogger_t logfn, void* nvl, void* constants) {
  if (context == NULL) return ncclSuccess;
  *context = NULL;
  pthread_mutex_lock(&dct_g.lifecycle);
  if (logfn && dct_g.logfn == NULL) dct_g.logfn = logfn;
  int first = (dct_g.refcount == 0);
  if (first) {
    dct_env_load();
    dct_chain_load();
    if (dct_thread_start() != 0)
      DCT_WARN("DynamICCL tuner: cannot start the reload thread; the config is read only by dynamiccl_tuner_reload()");
  }
  dct_ctx_t* ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) {
    DCT_WARN("DynamICCL tuner: out of memory; leaving NCCL's choices for comm %016llx", (unsigned long long)commId);
    if (first) {
      dct_thread_stop();
      dct_chain_unload();
    }
    pthread_mutex_unlock(&dct_g.lifecycle);
    return ncclSuccess;
  }
  ctx->comm = commId;
  ctx->nranks = nRanks;
  ctx->nnodes = nNodes;
  ctx->abi = abi;
  ctx->comm_known = abi >= 5;
  dct_init_args_t args = {abi, commId, nRanks, nNodes, logfn, nvl, constants};
  dct_chain_init(ctx, &args);
  ctx->next = dct_g.ctxs;
  dct_g.ctxs = ctx;
  dct_g.refcount++;
  if (abi == 4) {
    atomic_fetch_add(&g_v4_contexts, 1);
    DCT_INFO("DynamICCL tuner (v4): NCCL gives no communicator id; a version with communicator-specific rules is "
             "not applied (NCCL's choice stands, records carry version 0)");
  }
  pthread_mutex_lock(&dct_g.ctl);
  DCT_INFO("DynamICCL tuner (v%d): comm %016llx nranks %zu nnodes %zu, config %s, apply %s, poll %d ms", abi,
           (unsigned long long)commId, nRanks, nNodes, dct_g.path, dct_mode_name(dct_g.mode), dct_g.poll_ms);
  pthread_mutex_unlock(&dct_g.ctl);
  pthread_mutex_unlock(&dct_g.lifecycle);
  *context = ctx;
  return ncclSuccess;
}

static ncclResult_t dct_finalize(void* context) {
  dct_ctx_t* ctx = (dct_ctx_t*)context;
  if (ctx == NULL) return ncclSuccess;
  pthread_mutex_lock(&dct_g.lifecycle);
  int found = 0;
  for (dct_ctx_t** p = &dct_g.ctxs; *p; p = &(*p)->next) {
    if (*p == ctx) {
      *p = ctx->next;
      found = 1;
      break;
    }
  }
  if (!found) { /* not ours, or finalized twice: ignore */
    pthread_mutex_unlock(&dct_g.lifecycle);
    return ncclSuccess;
  }
  atomic_fetch_add(&dct_g.f_calls, atomic_load(&ctx->calls));
  atomic_fetch_add(&dct_g.f_decisions, atomic_load(&ctx->decisions));
  atomic_fetch_add(&dct_g.f_no_enabled, atomic_load(&ctx->no_enabled));
  atomic_fetch_add(&dct_g.f_chunk_set, atomic_load(&ctx->chunk_set));
  atomic_fetch_add(&dct_g.f_retries, atomic_load(&ctx->retries));
  atomic_fetch_add(&dct_g.f_chain_calls, atomic_load(&ctx->chain_calls));
  atomic_fetch_add(&dct_g.f_chain_errors, atomic_load(&ctx->chain_errors));
  dct_chain_fini(ctx);
  if (ctx->abi == 4) atomic_fetch_sub(&g_v4_contexts, 1);
  if (--dct_g.refcount == 0) {
    dct_thread_stop();
    dct_chain_unload();
  }
  pthread_mutex_unlock(&dct_g.lifecycle);
  free(ctx);
  return ncclSuccess;
}

static ncclResult_t dct_init_v6(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v6_t* nvl,
                                ncclTunerConstants_v6_t* constants) {
  return init_common(6, context, commId, nRanks, nNodes, logFunction, nvl, constants);
}

static ncclResult_t dct_init_v7(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v7_t* nvl,
                                ncclTunerConstants_v7_t* constants) {
  return init_common(7, context, commId, nRanks, nNodes, logFunction, nvl, constants);
}

static ncclResult_t dct_init_v5(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvl,
                                ncclTunerConstants_v5_t* constants) {
  return init_common(5, context, commId, nRanks, nNodes, logFunction, nvl, constants);
}

/* v4 has no communicator id: rules with a specific comm never match (comm 0). */
static ncclResult_t dct_init_v4(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context) {
  return init_common(4, context, 0, nRanks, nNodes, logFunction, NULL, NULL);
}

/* The version to stamp on profiler records for communicator comm_hash: the applied version, or 0
   when NCCL runs this tuner through v4 and the applied version has communicator-specific rules
   (then it is not applied: see find_rule). Lock-free; a torn read gives the applied version. */
DCT_EXPORT uint32_t dynamiccl_tuner_record_version(uint64_t comm_hash) {
  uint32_t v = dynamiccl_tuner_config_version(comm_hash);
  if (v == 0 || atomic_load_explicit(&g_v4_contexts, memory_order_relaxed) == 0) return v;
  uint64_t tag = atomic_load_explicit(&dct_g.applied_tag, memory_order_acquire);
  int i = DCT_TAG_SLOT(tag);
  if (tag == 0 || i < 0 || i >= DCT_NSLOTS) return v;
  const dct_slot_t* s = &dct_g.slots[i];
  uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
  uint32_t has_comm = s->v.has_comm_rules;
  atomic_thread_fence(memory_order_acquire);
  if (q != (tag & DCT_TAG_SEQ_MASK) || atomic_load_explicit(&s->seq, memory_order_relaxed) != q) return v;
  return has_comm ? 0 : v;
}

/* NCCL tries v7 first (2.32.6+), then v6 (2.30-2.32), v5 (2.28-2.29), v4 (2.27). v6 and v7 share
   their function table. */
#define DCT_DEFINE_TABLE_V6(V)                                                                        \
  DCT_EXPORT const ncclTuner_v##V##_t ncclTunerPlugin_v##V = {                                        \
      .name = DCT_PLUGIN_NAME,                                                                        \
      .init = dct_init_v##V,                                                                          \
      .getCollInfo = dct_get_coll_info,                                                               \
      .finalize = dct_finalize,                                                                       \
      .getChunkSize = dct_get_chunk_size,                                                             \
  };
DCT_DEFINE_TABLE_V6(7)
DCT_DEFINE_TABLE_V6(6)

DCT_EXPORT const ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = DCT_PLUGIN_NAME,
    .init = dct_init_v5,
    .getCollInfo = dct_get_coll_info,
    .finalize = dct_finalize,
};

DCT_EXPORT const ncclTuner_v4_t ncclTunerPlugin_v4 = {
    .name = DCT_PLUGIN_NAME,
    .init = dct_init_v4,
    .getCollInfo = dct_get_coll_info,
    .destroy = dct_finalize,
};
