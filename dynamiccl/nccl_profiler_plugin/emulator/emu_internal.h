/* The emulator's internal types, shared by its API (nccl_emu.c) and its replay of NCCL's call
 * sequence (emu_replay.c). Not part of any ABI. */
#ifndef DCCL_EMU_INTERNAL_H_
#define DCCL_EMU_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl_emu.h"
#include "nccl_profiler_abi.h"

#define EMU_EXPORT __attribute__((visibility("default")))
#define EMU_MAX_COMMS 256
#define EMU_QUEUE_SIZE 512 /* app -> proxy hand-off, per communicator (power of two) */
#define EMU_PROXY_STEPS 2   /* ProxyStep events per ProxyOp when crossing nodes */
#define EMU_HIST 8           /* kernels remembered per communicator for EMU_F_STALE_PTIMER */
#define EMU_FOREIGN_PARENT ((void*)(uintptr_t)0xdead0000) /* a pointer from another process */

typedef struct {
  void* coll; /* Coll/P2p handle (may be NULL) */
  emu_coll_t op;
} emu_item_t;

typedef struct emu_comm {
  struct emu* emu;
  void* ctx;
  int threads;
  int rank;
  int nranks;
  int nnodes;
  pid_t pid;
  uint64_t calls_app;
  /* proxy hand-off (SPSC) */
  pthread_t proxy;
  emu_item_t* items;
  _Atomic uint64_t head __attribute__((aligned(64))); /* written by app */
  _Atomic uint64_t tail __attribute__((aligned(64))); /* written by proxy */
  _Atomic int stop;
  uint64_t calls_proxy __attribute__((aligned(64)));
  /* proxy side: the GPU times of the last EMU_HIST kernels (EMU_F_STALE_PTIMER) */
  uint64_t hist_start[EMU_HIST];
  uint64_t hist_end[EMU_HIST];
  uint64_t hist_n;
} emu_comm_t;

struct emu {
  void* dl;
  int version;
  const ncclProfiler_v4_t* t4;
  const ncclProfiler_v5_t* t5; /* v6 table has the same function-pointer layout, but we keep both typed */
  const ncclProfiler_v6_t* t6;
  const ncclProfiler_v7_t* t7;
  void (*stats)(void*);
  int mask; /* NCCL's process-global ncclProfilerEventMask */
  emu_comm_t* comms[EMU_MAX_COMMS];
  uint64_t calls_closed;
};

/* One operation's application-thread part (returns its Coll/P2p handle) and proxy-thread part. */
void* emu_replay_app(emu_comm_t* c, const emu_coll_t* op);
void emu_replay_proxy(emu_comm_t* c, void* coll, const emu_coll_t* op, uint64_t* calls);

#endif /* DCCL_EMU_INTERNAL_H_ */
