/* DynamICCL profiler plugin: per-peer network timing (opt-in: ProxyOp (128) in DYNAMICCL_EVENT_MASK,
 * ProxyStep (256) for the state times).
 *
 * NCCL's proxy thread reports each operation's network work as ProxyOp events (one per channel and
 * peer direction, parent: the Coll/P2p) with ProxyStep children whose states say what each step is
 * waiting for. The plugin folds them, per operation, into at most DCCL_NET_PEERS (peer, direction)
 * entries: proxy ops, steps, bytes (transSize at SendWait/RecvWait) and the time spent in each of the
 * three states of that direction (send: GPU wait, peer wait, wait; receive: wait, flush wait, GPU
 * wait), measured with CLOCK_MONOTONIC at each state change. When the operation completes, one PEER
 * record per entry follows its own record into the ring, so a slow link or NIC (one peer's wait
 * time) can be told from a slow rank (every peer's GPU wait). All of it runs on the operation's proxy
 * thread: plain stores, no lock, no allocation (the entries are allocated with the slots at init).
 *
 * Handles: DCCL_H_NET_MARK (handles.h) in bits 0-3 and 19, bit 4 set for a step, the entry index in bits
 * 5-7, the communicator and slot as in every handle, the step slot in bits 40-42 and the slot
 * generation's low 21 bits above; a proxy event that arrives after its
 * operation completed no longer matches and is counted (STATS reserved[1], with the chain's).
 */
#ifndef DYNAMICCL_NET_H_
#define DYNAMICCL_NET_H_

#include "internal.h"

#define DCCL_NET_MASK ncclProfileProxyOp
#define DCCL_NET_PEERS 8      /* (peer, direction) entries per operation; more are counted, not kept */
#define DCCL_NET_STEP_SLOTS 8 /* steps in flight per entry (NCCL_STEPS); step s uses slot s % 8 */
#define DCCL_H_NET_STEP 0x10u /* bit 4: a ProxyStep handle (else its ProxyOp) */

typedef struct dccl_net_peer {
  int32_t peer;
  uint8_t is_send;
  uint8_t pad[3];
  uint32_t ops, steps;
  uint64_t bytes;
  uint64_t state_ns[3];
  uint64_t step_ts[DCCL_NET_STEP_SLOTS];      /* CLOCK_MONOTONIC of the step's last state change */
  int8_t step_state[DCCL_NET_STEP_SLOTS];     /* its current state bucket (0-2), -1: none */
} dccl_net_peer_t;

typedef struct dccl_net {
  uint32_t n;       /* entries used by the current operation */
  uint32_t dropped; /* (peer, direction) pairs beyond DCCL_NET_PEERS */
  dccl_net_peer_t p[DCCL_NET_PEERS];
} dccl_net_t;

/* start (proxy thread), from the startEvent dispatcher */
void dccl_net_start_op(dccl_ctx_t* ctx, void** eHandle, void* parent, int pid, int peer, int isSend);
void dccl_net_start_step(void** eHandle, void* parent, int step);
ncclResult_t dccl_net_stop(uint64_t h);
ncclResult_t dccl_net_record(uint64_t h, ncclProfilerEventState_t eState, ncclProfilerEventStateArgs_v4_t* args);
/* completion (finish.c): the PEER records of a slot's operation, after its own record */
void dccl_net_emit(const dccl_slot_t* s);

#endif /* DYNAMICCL_NET_H_ */
