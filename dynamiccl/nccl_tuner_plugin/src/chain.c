/* DYNAMICCL_TUNER_CHAIN=/path/libnccl-tuner-x.so: a second tuner (the platform's: aws-ofi-nccl,
 * NCCL's example, a cloud vendor's) that decides whenever DynamICCL has no rule, so installing
 * DynamICCL never loses the platform's tuning. NCCL loads one tuner; this one forwards.
 *
 * Loaded once by the first init (lifecycle lock), unloaded by the last finalize. Each context
 * gets the chained tuner's own context, initialised through the same ABI version NCCL used for
 * DynamICCL when the chained library exports it, else through a neighbour whose constants
 * convert (v5/v6 share theirs; v7 has one more compute capability). A chained init that fails,
 * or a library that exports no usable table, leaves that communicator without a chain (warned).
 * The chain never makes a call fail: its errors are counted and NCCL's choice stands.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static struct {
  void* dl;
  int abi; /* version of the table below: 4..7, 0 none */
  const void* table;
  char path[DCT_PATH_MAX];
} g_chain;

static _Atomic uint64_t g_chain_refused; /* contexts left without their chain */

void dct_chain_load(void) {
  const char* p = getenv("DYNAMICCL_TUNER_CHAIN");
  if (p == NULL || *p == '\0' || g_chain.dl != NULL) return;
  void* dl = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) {
    DCT_WARN("DynamICCL tuner: DYNAMICCL_TUNER_CHAIN=%s cannot be loaded (%s); no chained tuner", p, dlerror());
    return;
  }
  static const char* const syms[] = {"ncclTunerPlugin_v7", "ncclTunerPlugin_v6", "ncclTunerPlugin_v5",
                                     "ncclTunerPlugin_v4"};
  for (int i = 0; i < 4; i++) {
    const void* t = dlsym(dl, syms[i]);
    if (t == NULL) continue;
    if (dlsym(dl, "dynamiccl_tuner_record_version") != NULL) break; /* ourselves */
    g_chain.dl = dl;
    g_chain.table = t;
    g_chain.abi = 7 - i;
    snprintf(g_chain.path, sizeof g_chain.path, "%s", p);
    DCT_INFO("DynamICCL tuner: chained tuner %s (%s, v%d) decides where no rule applies",
             ((const ncclTuner_v5_t*)t)->name ? ((const ncclTuner_v5_t*)t)->name : "?", p, g_chain.abi);
    return;
  }
  DCT_WARN("DynamICCL tuner: DYNAMICCL_TUNER_CHAIN=%s exports no tuner table v4..v7 (or is DynamICCL itself); "
           "no chained tuner", p);
  dlclose(dl);
}

void dct_chain_unload(void) {
  if (g_chain.dl) dlclose(g_chain.dl);
  memset(&g_chain, 0, sizeof g_chain);
}

/* The members v5 and v7 constants share (v7 has a fifth compute capability, left as it was when
   converting v5 -> v7). Copies the smaller of each pair of arrays. */
#define DCT_COPY_MIN(d, s, f) memcpy((d)->f, (s)->f, sizeof (d)->f < sizeof (s)->f ? sizeof (d)->f : sizeof (s)->f)
#define DCT_CONSTANTS_COPY(d, s)                                                                        \
  do {                                                                                                  \
    DCT_COPY_MIN(d, s, baseLatencies);                                                                  \
    DCT_COPY_MIN(d, s, hwLatencies);                                                                    \
    DCT_COPY_MIN(d, s, llMaxBws);                                                                       \
    DCT_COPY_MIN(d, s, perChMaxRingLL128Bws);                                                           \
    DCT_COPY_MIN(d, s, perChMaxTreeLL128Bws);                                                           \
    DCT_COPY_MIN(d, s, perChMaxTreeBws);                                                                \
    DCT_COPY_MIN(d, s, perChMaxNVLSTreeBws);                                                            \
  } while (0)
static void constants_7_to_5(ncclTunerConstants_v5_t* d, const ncclTunerConstants_v7_t* s) {
  DCT_CONSTANTS_COPY(d, s);
}
static void constants_5_to_7(ncclTunerConstants_v7_t* d, const ncclTunerConstants_v5_t* s) {
  DCT_CONSTANTS_COPY(d, s);
}

/* Which chained version serves a context NCCL opened through `our` (0: none). */
static int chain_version_for(int our) {
  int c = g_chain.abi;
  if (c == 0) return 0;
  if (our == 4) return c == 4 ? 4 : 0; /* v4 init has no communicator id or constants to pass */
  return c >= 5 ? c : 0;
}

static ncclResult_t chain_init_with(int ver, void** cctx, const dct_init_args_t* a) {
  if (ver == 4) return ((const ncclTuner_v4_t*)g_chain.table)->init(a->nranks, a->nnodes, a->logfn, cctx);
  if (ver == 7) {
    const ncclTuner_v7_t* t = g_chain.table;
    if (a->abi == 7 || a->constants == NULL)
      return t->init(cctx, a->comm, a->nranks, a->nnodes, a->logfn, a->nvl, a->constants);
    ncclTunerConstants_v7_t k; /* NCCL gave us v5/v6 constants */
    memset(&k, 0, sizeof k);
    constants_5_to_7(&k, a->constants);
    ncclResult_t r = t->init(cctx, a->comm, a->nranks, a->nnodes, a->logfn, a->nvl, &k);
    constants_7_to_5(a->constants, &k); /* the chained tuner may tune NCCL's constants */
    return r;
  }
  const ncclTuner_v5_t* t = g_chain.table; /* v5 and v6 share init's layout and types */
  if (a->abi != 7 || a->constants == NULL)
    return t->init(cctx, a->comm, a->nranks, a->nnodes, a->logfn, a->nvl, a->constants);
  ncclTunerConstants_v5_t k;
  constants_7_to_5(&k, a->constants);
  ncclResult_t r = t->init(cctx, a->comm, a->nranks, a->nnodes, a->logfn, a->nvl, &k);
  constants_5_to_7(a->constants, &k);
  return r;
}

void dct_chain_init(dct_ctx_t* ctx, const dct_init_args_t* a) {
  int ver = chain_version_for(a->abi);
  if (g_chain.abi == 0) return;
  if (ver == 0) {
    DCT_WARN("DynamICCL tuner: chained tuner %s (v%d) cannot serve a v%d communicator; NCCL decides where no rule "
             "applies", g_chain.path, g_chain.abi, a->abi);
    atomic_fetch_add(&g_chain_refused, 1);
    return;
  }
  void* cctx = NULL;
  if (chain_init_with(ver, &cctx, a) != ncclSuccess) {
    DCT_WARN("DynamICCL tuner: chained tuner %s failed its init for comm %016llx; NCCL decides where no rule applies",
             g_chain.path, (unsigned long long)a->comm);
    atomic_fetch_add(&g_chain_refused, 1);
    return;
  }
  const ncclTuner_v5_t* t5 = g_chain.table; /* getCollInfo is the second member in every version */
  ctx->chain_ctx = cctx;
  ctx->chain_coll = t5->getCollInfo;
  ctx->chain_fini = ver == 4 ? ((const ncclTuner_v4_t*)g_chain.table)->destroy : t5->finalize;
  ctx->chain_chunk = ver >= 6 ? ((const ncclTuner_v6_t*)g_chain.table)->getChunkSize : NULL;
}

void dct_chain_fini(dct_ctx_t* ctx) {
  if (ctx->chain_fini) ctx->chain_fini(ctx->chain_ctx);
  ctx->chain_coll = NULL;
  ctx->chain_fini = NULL;
  ctx->chain_chunk = NULL;
}

/* [0] calls forwarded, [1] of them not ncclSuccess (NCCL's choice kept), [2] contexts without their
   chain (refused or failed init). Live contexts and finalized ones. */
DCT_EXPORT void dynamiccl_tuner_chain_stats(uint64_t out[3]) {
  if (out == NULL) return;
  pthread_mutex_lock(&dct_g.lifecycle);
  out[0] = atomic_load(&dct_g.f_chain_calls);
  out[1] = atomic_load(&dct_g.f_chain_errors);
  for (dct_ctx_t* c = dct_g.ctxs; c; c = c->next) {
    out[0] += atomic_load(&c->chain_calls);
    out[1] += atomic_load(&c->chain_errors);
  }
  pthread_mutex_unlock(&dct_g.lifecycle);
  out[2] = atomic_load(&g_chain_refused);
}
