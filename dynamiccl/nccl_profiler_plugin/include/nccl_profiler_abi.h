/* NCCL profiler plugin ABI, versions 4, 5, 6 and 7, declared by DynamICCL.
 *
 * Written from the field lists in docs (nccl-plugin-abi.md §1.4-§1.7), not copied from NCCL.
 * NCCL does not install its profiler headers; every plugin carries its own declarations.
 * Only libc headers are needed (no CUDA, no NCCL).
 *
 * Layout notes:
 *   - v4 `type` is uint8_t, v5/v6 `type` is uint64_t; both are followed by a pointer, so the
 *     union starts at the same offset (24) in every version.
 *   - v5/v6 add `parentGroup` at the end of coll/p2p (the legacy Group parent); Coll's
 *     parentObj is the CollApi event in v5/v6 and the Group event in v4.
 *   - v6 adds copy-engine (CE) events; the function table is the same as v5.
 *   - v7 (NCCL 2.31+, profiler_v7.h) appends userTag to collApi/p2pApi/coll/p2p/ceColl,
 *     kernelVariant + isSymColl to coll (before userTag), and the KernelPhase event (type 1<<15,
 *     child of a KernelCh; its stop state 31 reuses the kernelCh state-args member).
 */
#ifndef DYNAMICCL_NCCL_PROFILER_ABI_H_
#define DYNAMICCL_NCCL_PROFILER_ABI_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- common NCCL types (nccl.h / nccl_common.h) ---- */
#include "nccl_common_abi.h"

/* Debug subsystem flag for profiler messages (NCCL_DEBUG_SUBSYS=PROFILE). */
#define NCCL_PROFILE 0x4000

typedef pid_t ncclPid_t;

/* ---- event type bits (one numbering for all versions) ---- */
enum {
  ncclProfileGroup = (1 << 0),
  ncclProfileColl = (1 << 1),
  ncclProfileP2p = (1 << 2),
  ncclProfileProxyOp = (1 << 3),
  ncclProfileProxyStep = (1 << 4),
  ncclProfileProxyCtrl = (1 << 5),
  ncclProfileKernelCh = (1 << 6),      /* v3+ */
  ncclProfileNetPlugin = (1 << 7),     /* v3+ */
  ncclProfileGroupApi = (1 << 8),      /* v5+ */
  ncclProfileCollApi = (1 << 9),       /* v5+ */
  ncclProfileP2pApi = (1 << 10),       /* v5+ */
  ncclProfileKernelLaunch = (1 << 11), /* v5+ */
  ncclProfileCeColl = (1 << 12),       /* v6 */
  ncclProfileCeSync = (1 << 13),       /* v6 */
  ncclProfileCeBatch = (1 << 14),      /* v6 */
  ncclProfileKernelPhase = (1 << 15),  /* v7: initial_sync / compute / final_sync of a KernelCh */
};

/* ---- event states (one numbering for all versions) ---- */
typedef enum {
  ncclProfilerProxyOpSendPosted = 0, /* 0-7 deprecated in v4 */
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,      /* args->kernelCh.pTimer = GPU stop time */
  ncclProfilerGroupStartApiStop = 23, /* v5+ */
  ncclProfilerGroupEndApiStart = 24,  /* v5+ */
  ncclProfilerCeCollStart = 25,       /* v6, never passed to recordEventState */
  ncclProfilerCeCollComplete = 26,
  ncclProfilerCeSyncStart = 27,
  ncclProfilerCeSyncComplete = 28,
  ncclProfilerCeBatchStart = 29,
  ncclProfilerCeBatchComplete = 30,
  ncclProfilerKernelPhaseStop = 31,   /* v7: args->kernelCh.pTimer = GPU stop time of the phase */
} ncclProfilerEventState_t;

typedef ncclProfilerEventState_t ncclProfilerEventState_v4_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v7_t;

/* State arguments (same union in v4, v5, v6). */
typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} ncclProfilerEventStateArgs_v4_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v5_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v6_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v7_t;

/* ---- union members shared by several versions ---- */
/* The head of the coll and ceColl descriptors (every version). */
#define DCCL_ABI_COLL_HEAD_ \
  uint64_t seqNumber;       \
  const char* func;         \
  void const* sendBuff;     \
  void* recvBuff;           \
  size_t count;             \
  int root;                 \
  const char* datatype;

#define DCCL_ABI_PROXY_MEMBERS_                                                                                   \
  struct {                                                                                                         \
    ncclPid_t pid;     /* originating process (PXN: may be another process) */                                     \
    uint8_t channelId;                                                                                             \
    int peer;                                                                                                      \
    int nSteps;                                                                                                    \
    int chunkSize;                                                                                                 \
    int isSend;                                                                                                    \
  } proxyOp;                                                                                                       \
  struct { int step; } proxyStep;                                                                                  \
  struct {                                                                                                         \
    uint8_t channelId;                                                                                             \
    uint64_t pTimer; /* GPU globaltimer at channel start */                                                        \
  } kernelCh;                                                                                                      \
  struct {                                                                                                         \
    int64_t id;                                                                                                    \
    void* data;                                                                                                    \
  } netPlugin;

/* ---- v4 (NCCL 2.27) ---- */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      DCCL_ABI_COLL_HEAD_
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    DCCL_ABI_PROXY_MEMBERS_
  };
} ncclProfilerEventDescr_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v4_t eState,
                                   ncclProfilerEventStateArgs_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

/* ---- v5 (NCCL 2.28), v6 (NCCL 2.29+), v7 (2.31+) ----
   The API/op members, with a tail each that v7 appends (empty before v7). */
#define DCCL_ABI_API_OP_MEMBERS_(COLLAPI_TAIL, P2PAPI_TAIL, COLL_TAIL, P2P_TAIL)                                 \
  struct {                                                                                                         \
    bool graphCaptured;                                                                                            \
    int groupDepth;                                                                                                \
  } groupApi;                                                                                                      \
  struct {                                                                                                         \
    const char* func;                                                                                              \
    size_t count;                                                                                                  \
    const char* datatype;                                                                                          \
    int root;                                                                                                      \
    void* stream;                                                                                                  \
    bool graphCaptured;                                                                                            \
    COLLAPI_TAIL                                                                                                   \
  } collApi;                                                                                                       \
  struct {                                                                                                         \
    const char* func;                                                                                              \
    size_t count;                                                                                                  \
    const char* datatype;                                                                                          \
    void* stream;                                                                                                  \
    bool graphCaptured;                                                                                            \
    P2PAPI_TAIL                                                                                                    \
  } p2pApi;                                                                                                        \
  struct { void* stream; } kernelLaunch;                                                                           \
  struct {                                                                                                         \
    DCCL_ABI_COLL_HEAD_                                                                                            \
    uint8_t nChannels;                                                                                             \
    uint8_t nWarps;                                                                                                \
    const char* algo;                                                                                              \
    const char* proto;                                                                                             \
    void* parentGroup; /* legacy (v4) parent */                                                                    \
    COLL_TAIL                                                                                                      \
  } coll;                                                                                                          \
  struct {                                                                                                         \
    const char* func;                                                                                              \
    void* buff;                                                                                                    \
    const char* datatype;                                                                                          \
    size_t count;                                                                                                  \
    int peer;                                                                                                      \
    uint8_t nChannels;                                                                                             \
    void* parentGroup;                                                                                             \
    P2P_TAIL                                                                                                       \
  } p2p;                                                                                                           \
  DCCL_ABI_PROXY_MEMBERS_

#define DCCL_ABI_V5_MEMBERS_ DCCL_ABI_API_OP_MEMBERS_(, , , )

/* v6 copy-engine members; v7 appends CECOLL_TAIL to ceColl. */
#define DCCL_ABI_CE_MEMBERS_(CECOLL_TAIL)                                                                         \
  struct {                                                                                                         \
    DCCL_ABI_COLL_HEAD_                                                                                            \
    const char* syncStrategy; /* "MC" / "UC" */                                                                    \
    bool intraBatchSync;                                                                                           \
    uint32_t batchSize;                                                                                            \
    uint32_t numBatches;                                                                                           \
    uint32_t ceSeqNum;                                                                                             \
    void* stream;                                                                                                  \
    CECOLL_TAIL                                                                                                    \
  } ceColl;                                                                                                        \
  struct {                                                                                                         \
    bool isComplete;                                                                                               \
    int nRanks;                                                                                                    \
  } ceCollSync;                                                                                                    \
  struct {                                                                                                         \
    int numOps;                                                                                                    \
    size_t totalBytes;                                                                                             \
    bool useIntraSync;                                                                                             \
  } ceCollBatch;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    DCCL_ABI_V5_MEMBERS_
  };
} ncclProfilerEventDescr_v5_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    DCCL_ABI_V5_MEMBERS_
    DCCL_ABI_CE_MEMBERS_()
  };
} ncclProfilerEventDescr_v6_t;

/* v5, v6 and v7 function tables: the same functions over each version's types. */
#define DCCL_PROFILER_TABLE_(V)                                                                                   \
  struct {                                                                                                         \
    const char* name;                                                                                              \
    ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,  \
                         int nranks, int rank, ncclDebugLogger_t logfn);                                           \
    ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v##V##_t* eDescr);            \
    ncclResult_t (*stopEvent)(void* eHandle);                                                                      \
    ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v##V##_t eState,                        \
                                     ncclProfilerEventStateArgs_v##V##_t* eStateArgs);                             \
    ncclResult_t (*finalize)(void* context);                                                                       \
  }

typedef DCCL_PROFILER_TABLE_(5) ncclProfiler_v5_t;

typedef DCCL_PROFILER_TABLE_(6) ncclProfiler_v6_t;

/* ---- v7 (NCCL 2.31+) ---- */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    /* userTag: the call's user tag (0 untagged; MSB set: reserved by NCCL) */
    DCCL_ABI_API_OP_MEMBERS_(uint64_t userTag;, uint64_t userTag;,
                             const char* kernelVariant; bool isSymColl; uint64_t userTag;, uint64_t userTag;)
    DCCL_ABI_CE_MEMBERS_(uint64_t userTag;)
    struct {
      uint8_t channelId;
      uint8_t phaseId; /* 0 initial_sync, 1 compute, 2 final_sync */
      const char* phaseName;
      uint64_t pTimer; /* GPU globaltimer at phase start */
    } kernelPhase;
  };
} ncclProfilerEventDescr_v7_t;

typedef DCCL_PROFILER_TABLE_(7) ncclProfiler_v7_t;

/* The union starts at the same offset in every version; the plugin relies on it only through
   these checks (each version still has its own entry points). */
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll) == 24, "v4 union offset");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll) == 24, "v5 union offset");
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, coll) == 24, "v6 union offset");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll) == 24, "v7 union offset");
/* v7 appends members: the v6 members keep their offsets (a v7 descriptor read as v6 is valid). */
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.parentGroup) ==
                   offsetof(ncclProfilerEventDescr_v6_t, coll.parentGroup), "v7 coll prefix");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, kernelCh.pTimer) ==
                   offsetof(ncclProfilerEventDescr_v6_t, kernelCh.pTimer), "v7 kernelCh");

#endif /* DYNAMICCL_NCCL_PROFILER_ABI_H_ */
