/* A GPU-free emulator of NCCL 2.27-2.31's profiler call sequence, for testing and
 * benchmarking profiler plugins. It dlopens a plugin, resolves ncclProfiler_v7/v6/v5/v4 and
 * replays, per operation (real paths: a send/recv to self gets no proxy or KernelCh events;
 * CollNet reports nChannels = 0 while its KernelCh still come; ncclUint8 is named "Unknown"):
 *   application thread:  [v5/v6] GroupApi start -> CollApi|P2pApi start -> CollApi|P2pApi stop
 *                        -> GroupApi record(GroupEndApiStart) -> [KernelLaunch start/stop if in mask]
 *                        -> Coll|P2p start (parent = CollApi|P2pApi handle) -> Coll|P2p stop
 *                        -> GroupApi stop
 *                        [v4] Group start -> Coll|P2p start (parent = Group) -> stop -> Group stop
 *   proxy thread (or inline with threads=1), per channel c:
 *                        KernelCh start(pTimer = gpu_start_ns + c)
 *                        -> record(KernelChStop, pTimer = gpu_end_ns - c) -> KernelCh stop
 *                        [+ ProxyOp/ProxyStep events when the op crosses nodes]
 * Events are gated by the activation mask the plugin wrote in init, as NCCL does. Children
 * of a NULL parent handle are still started with parentObj = NULL (NCCL 2.28-2.30 behaviour).
 *
 * The batch API (emu_run_colls) does no allocation per operation: ~250-300 ns per 8-channel
 * collective with a no-op plugin on a small VM, so > 1M collectives/s.
 */
#ifndef DCCL_NCCL_EMU_H_
#define DCCL_NCCL_EMU_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* emu_coll_t.flags */
#define EMU_F_NULL_PARENT 0x1    /* Coll/P2p get parentObj = NULL (as after a dropped CollApi) */
#define EMU_F_NULL_KCH_PARENT 0x2 /* KernelCh get parentObj = NULL (as after a dropped Coll) */
#define EMU_F_NO_KERNEL 0x4      /* no KernelCh children (children lost: the plugin must reap) */
#define EMU_F_CROSS_NODE 0x8     /* ProxyOp (+ProxyStep) events per channel, if in the mask */
#define EMU_F_PXN 0x10           /* plus a ProxyOp from a foreign pid with a foreign parentObj */
#define EMU_F_NO_GPU_TIMER 0x20  /* KernelCh pTimers are 0 (host times only) */
#define EMU_F_COLLNET 0x40       /* CollNet/multi-node NVLS: Coll reports nChannels = 0, KernelCh still come */
#define EMU_F_TAGGED 0x80        /* v7: coll.userTag = EMU_USER_TAG(op) (else 0, untagged) */
#define EMU_F_SYMMETRIC 0x100    /* v7: isSymColl = 1, kernelVariant "sym" */
#define EMU_F_CE 0x200           /* v6+: a copy-engine collective (CeColl event, no Coll, no kernel) */
#define EMU_F_PHASES 0x400       /* v7 with KernelPhase in the mask: 3 phases per KernelCh */
#define EMU_F_STALE_PTIMER 0x800 /* NCCL 2.28 after a send/recv to self (device work counter ahead of the
                                   host's): KernelCh start pTimers are those of the kernel EMU_STALE_START_LAG
                                   operations back on this communicator, stop pTimers EMU_STALE_STOP_LAG back
                                   (as on an H100: start ~1.4 s, stop ~0.5 s before the enqueue) */
#define EMU_F_NO_COLL_EVENT 0x1000 /* a collective NCCL runs without a Coll event (several broadcast roots in
                                     one group, symmetric kernels before 2.31): CollApi only, no kernel */
#define EMU_F_NET 0x2000          /* per channel a send ProxyOp to rank+1 and a receive ProxyOp from rank-1, each with
                                    EMU_PROXY_STEPS ProxySteps through every timed state (send: GPU wait, peer wait,
                                    wait; receive: wait, flush wait, GPU wait), transSize EMU_NET_CHUNK at (Send|Recv)Wait */
#define EMU_NET_CHUNK (1u << 17)
#define EMU_STALE_START_LAG 6
#define EMU_STALE_STOP_LAG 2
#define EMU_SYNC_NS(ch) (100u + (ch)) /* initial_sync length of channel ch with EMU_F_PHASES */
#define EMU_USER_TAG(op) (0x5400000000000000ull | (op)->seq_number)

/* One operation. Codes are the wire-format enums (DCCL_FUNC_*, DCCL_DTYPE_*, ...); a code out of
   range is passed to the plugin as the string "Unknown". func Send/Recv makes a P2P operation
   whose peer is `root`. 64 bytes; mirrored by ctypes in tests and the simulator. */
typedef struct emu_coll {
  int32_t func;
  int32_t datatype;
  int32_t algo;
  int32_t proto;
  int32_t n_channels; /* 0..64 */
  int32_t n_warps;
  int32_t root;
  uint32_t flags;
  uint64_t count;
  uint64_t seq_number;
  uint64_t gpu_start_ns; /* channel c reports start pTimer gpu_start_ns + c */
  uint64_t gpu_end_ns;   /* channel c reports stop pTimer gpu_end_ns - c */
} emu_coll_t;

typedef struct emu emu_t;

/* Open a plugin and resolve ncclProfiler_v<abi_version> (4, 5, 6 or 7). NULL on error (emu_error). */
emu_t* emu_open(const char* plugin_path, int abi_version);
/* Message of the last failure in this process (open, init). */
const char* emu_error(void);
/* Initialise a communicator (calls the plugin's init). threads = 1 (KernelCh events inline on
   the caller's thread) or 2 (a proxy thread per communicator). Returns the comm id >= 0, or -1
   if init failed (emu_error() holds the plugin's last WARN message). */
int emu_comm_init(emu_t* emu, uint64_t comm_hash, const char* name, int nnodes, int nranks, int rank, int threads);
/* Replay n operations on a communicator. Returns 0, or -1 for a bad comm id. */
int emu_run_colls(emu_t* emu, int comm, const emu_coll_t* ops, int n);
/* Wait until the proxy thread has replayed everything queued. */
int emu_sync(emu_t* emu, int comm);
/* Stop the proxy thread and call the plugin's finalize. */
int emu_comm_finalize(emu_t* emu, int comm);
/* Finalize remaining comms and dlclose. */
void emu_close(emu_t* emu);
/* The activation mask the plugin wrote in init (process-global, like NCCL's). */
int emu_mask(const emu_t* emu);
const char* emu_plugin_name(const emu_t* emu);
/* Copy the plugin's dynamicclProfilerStats (128 bytes) into out; -1 if the plugin lacks it. */
int emu_plugin_stats(emu_t* emu, void* out);
/* Total plugin calls made so far (all comms). */
uint64_t emu_plugin_calls(const emu_t* emu);

#ifdef __cplusplus
}
#endif
#endif /* DCCL_NCCL_EMU_H_ */
