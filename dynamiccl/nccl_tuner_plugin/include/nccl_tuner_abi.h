/* NCCL tuner plugin ABI, versions 4, 5, 6 and 7, declared by DynamICCL.
 *
 * Written from the field lists in nccl-plugin-abi.md §2.1-§2.3 (not copied from NCCL; NCCL does
 * not install its plugin headers, every plugin carries its own declarations). libc only.
 *
 * Layout notes (checked against NCCL 2.30's tuner_v{4,5,6}.h member order):
 *   - v4: name, init(nRanks, nNodes, logFn, void** ctx), getCollInfo(... regBuff, nChannels), destroy.
 *   - v5: name, init(void** ctx, commId, nRanks, nNodes, logFn, nvlDomainInfo, constants),
 *         getCollInfo (same as v4), finalize.
 *   - v6: v5's table + getChunkSize as the LAST member (after finalize), optional (may be NULL).
 *   - v7 (NCCL 2.32.6, tuner_v7.h): v6's function table; only the constants struct grows (5
 *     compute capabilities instead of 4 in the per-capability bandwidth tables).
 *   - The cost table is really float[numAlgo][numProto] cast to float**; numAlgo is 6 before
 *     NCCL 2.23 (no PAT) and 7 since; always bounds-check against the arguments.
 */
#ifndef DYNAMICCL_NCCL_TUNER_ABI_H_
#define DYNAMICCL_NCCL_TUNER_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include "../../nccl_profiler_plugin/include/nccl_common_abi.h"   /* ncclResult_t, log types: one definition */

/* Debug subsystem flag for tuner messages (NCCL_DEBUG_SUBSYS=TUNING; nccl_common.h ncclDebugLogSubSys:
   NCCL_TUNING = 0x40, 0x2000 is NCCL_REG). */
#define NCCL_TUNING 0x40

/* ncclFunc_t (nccl_common.h). The tuner is called for the first five only; AllGatherV comes as
   AllGather. */
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
  ncclFuncAlltoAll = 8,
  ncclFuncScatter = 9,
  ncclFuncGather = 10,
  ncclNumFuncs = 15
} ncclFunc_t;

#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_ALGO_PROTO_IGNORE (-1.0f)

#define NCCL_NUM_ALGORITHMS_V5 7
#define NCCL_NUM_PROTOCOLS_V5 3
#define NCCL_NUM_HW_LINKS_V5 3
#define NCCL_NUM_COMPCAPS_V5 4
#define NCCL_NUM_TUNING_SCALES_V5 3

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

/* NCCL's tuning constants; only the number of compute capabilities differs between versions. */
#define DCCL_TUNER_CONSTANTS_(NCOMPCAPS)                                              \
  struct {                                                                           \
    double baseLatencies[NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];             \
    double hwLatencies[NCCL_NUM_HW_LINKS_V5][NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];\
    double llMaxBws[NCOMPCAPS][NCCL_NUM_TUNING_SCALES_V5];                           \
    double perChMaxRingLL128Bws[NCOMPCAPS][NCCL_NUM_TUNING_SCALES_V5];               \
    double perChMaxTreeLL128Bws[NCOMPCAPS][NCCL_NUM_TUNING_SCALES_V5];               \
    double perChMaxTreeBws[NCOMPCAPS][NCCL_NUM_TUNING_SCALES_V5];                    \
    double perChMaxNVLSTreeBws[NCOMPCAPS][NCCL_NUM_TUNING_SCALES_V5];                \
  }

typedef DCCL_TUNER_CONSTANTS_(NCCL_NUM_COMPCAPS_V5) ncclTunerConstants_v5_t;

typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;
typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;

typedef ncclResult_t (*ncclTunerGetCollInfo_t)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                               float** collCostTable, int numAlgo, int numProto, int regBuff,
                                               int* nChannels);

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclTunerGetCollInfo_t getCollInfo;
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants);
  ncclTunerGetCollInfo_t getCollInfo;
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

/* v6 and v7 tables: v5's + getChunkSize (optional, may be NULL); they differ in init's types only. */
#define DCCL_TUNER_TABLE_V6_(V)                                                                            \
  struct {                                                                                                 \
    const char* name;                                                                                      \
    ncclResult_t (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,                    \
                         ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v##V##_t* nvlDomainInfo,         \
                         ncclTunerConstants_v##V##_t* constants);                                          \
    ncclTunerGetCollInfo_t getCollInfo;                                                                    \
    ncclResult_t (*finalize)(void* context);                                                               \
    ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,   \
                                 int nChannels, size_t* chunkSize);                                        \
  }

typedef DCCL_TUNER_TABLE_V6_(6) ncclTuner_v6_t;

#define NCCL_NUM_COMPCAPS_V7 5

typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v7_t;

typedef DCCL_TUNER_CONSTANTS_(NCCL_NUM_COMPCAPS_V7) ncclTunerConstants_v7_t;

typedef DCCL_TUNER_TABLE_V6_(7) ncclTuner_v7_t;

#endif /* DYNAMICCL_NCCL_TUNER_ABI_H_ */
