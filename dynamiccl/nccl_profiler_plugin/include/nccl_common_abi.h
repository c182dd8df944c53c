/* Types every NCCL plugin ABI shares (nccl.h / nccl_common.h), written from
 * ../shared/reference/nccl-plugin-abi.md. Included by nccl_profiler_abi.h and, through a relative
 * path, by nccl_tuner_plugin/include/nccl_tuner_abi.h, so both plugins use one definition. */
#ifndef DYNAMICCL_NCCL_COMMON_ABI_H_
#define DYNAMICCL_NCCL_COMMON_ABI_H_

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

#endif /* DYNAMICCL_NCCL_COMMON_ABI_H_ */
