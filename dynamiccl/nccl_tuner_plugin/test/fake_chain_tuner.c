/* A stand-in for a platform tuner (test only): exports ncclTunerPlugin_v<CHAIN_ABI> (4, 5, 6 or 7).
   getCollInfo forces TREE/SIMPLE (cell 2) to 0 and 3 channels; getChunkSize (v6+) sets 77 * 512;
   init doubles the first base latency (a tuner may tune NCCL's constants) and fails for comm 0xbad. */
#include <string.h>

#include "nccl_tuner_abi.h"

#define EXPORT __attribute__((visibility("default")))
#ifndef CHAIN_ABI
#define CHAIN_ABI 6
#endif

static int g_ctx;
EXPORT int fake_chain_inits, fake_chain_finals, fake_chain_calls;

static ncclResult_t get_coll_info(void* ctx, ncclFunc_t f, size_t n, int pipe, float** table, int na, int np, int reg,
                                  int* nch) {
  (void)ctx, (void)f, (void)n, (void)pipe, (void)reg;
  fake_chain_calls++;
  float* t = (float*)table;
  if (na * np > 2 && t[2] >= 0) t[2] = 0.0f;
  if (nch) *nch = 3;
  return ncclSuccess;
}

static ncclResult_t finalize(void* ctx) {
  (void)ctx;
  fake_chain_finals++;
  return ncclSuccess;
}

#if CHAIN_ABI >= 6
static ncclResult_t get_chunk(void* ctx, ncclFunc_t f, size_t n, int a, int p, int nch, size_t* chunk) {
  (void)ctx, (void)f, (void)n, (void)a, (void)p, (void)nch;
  *chunk = 77 * 512;
  return ncclSuccess;
}
#endif

#if CHAIN_ABI == 4
static ncclResult_t init4(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFn, void** ctx) {
  (void)nRanks, (void)nNodes, (void)logFn;
  fake_chain_inits++;
  *ctx = &g_ctx;
  return ncclSuccess;
}
EXPORT const ncclTuner_v4_t ncclTunerPlugin_v4 = {"fake4", init4, get_coll_info, finalize};
#elif CHAIN_ABI == 7
static ncclResult_t init7(void** ctx, uint64_t comm, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFn,
                          ncclNvlDomainInfo_v7_t* nvl, ncclTunerConstants_v7_t* k) {
  (void)nRanks, (void)nNodes, (void)logFn, (void)nvl;
  if (comm == 0xbad) return ncclInternalError;
  fake_chain_inits++;
  if (k) k->baseLatencies[0][0] *= 2;
  *ctx = &g_ctx;
  return ncclSuccess;
}
EXPORT const ncclTuner_v7_t ncclTunerPlugin_v7 = {"fake7", init7, get_coll_info, finalize, get_chunk};
#else
static ncclResult_t init56(void** ctx, uint64_t comm, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFn,
                           ncclNvlDomainInfo_v5_t* nvl, ncclTunerConstants_v5_t* k) {
  (void)nRanks, (void)nNodes, (void)logFn, (void)nvl;
  if (comm == 0xbad) return ncclInternalError;
  fake_chain_inits++;
  if (k) k->baseLatencies[0][0] *= 2;
  *ctx = &g_ctx;
  return ncclSuccess;
}
#if CHAIN_ABI == 5
EXPORT const ncclTuner_v5_t ncclTunerPlugin_v5 = {"fake5", init56, get_coll_info, finalize};
#else
EXPORT const ncclTuner_v6_t ncclTunerPlugin_v6 = {"fake6", init56, get_coll_info, finalize, get_chunk};
#endif
#endif
