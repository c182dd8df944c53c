/* A no-op tuner (exports ncclTunerPlugin_v6): the baseline of benchmarks/tuner_getcollinfo.py.
   Every call returns ncclSuccess without touching its arguments. */
#include "nccl_tuner_abi.h"

#define EXPORT __attribute__((visibility("default")))

static int g_dummy;

static ncclResult_t noop_init(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFn,
                              ncclNvlDomainInfo_v6_t* nvl, ncclTunerConstants_v6_t* constants) {
  (void)commId, (void)nRanks, (void)nNodes, (void)logFn, (void)nvl, (void)constants;
  *ctx = &g_dummy;
  return ncclSuccess;
}

static ncclResult_t noop_get_coll_info(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** table,
                                       int numAlgo, int numProto, int regBuff, int* nChannels) {
  (void)ctx, (void)collType, (void)nBytes, (void)numPipeOps, (void)table, (void)numAlgo, (void)numProto,
      (void)regBuff, (void)nChannels;
  return ncclSuccess;
}

static ncclResult_t noop_finalize(void* ctx) {
  (void)ctx;
  return ncclSuccess;
}

EXPORT const ncclTuner_v6_t ncclTunerPlugin_v6 = {
    .name = "noop",
    .init = noop_init,
    .getCollInfo = noop_get_coll_info,
    .finalize = noop_finalize,
    .getChunkSize = 0,
};
