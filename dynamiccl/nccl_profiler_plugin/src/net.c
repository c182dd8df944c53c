/* DynamICCL profiler plugin: per-peer network timing from ProxyOp/ProxyStep events (net.h has the
 * design). Runs on the operation's proxy thread; completion (dccl_net_emit) on whichever thread
 * completes the operation, after the DCCL_DONE_* RMW that orders it behind the proxy's writes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>
#include <unistd.h>

#include "net.h"

#define NET_GEN_BITS 21
#define NET_GEN_MASK ((1u << NET_GEN_BITS) - 1)

/* Step state -> its bucket in state_ns, per direction; -1: a state that is not timed. */
static inline int net_bucket(ncclProfilerEventState_t st) {
  switch (st) {
    case ncclProfilerProxyStepSendGPUWait: return 0;
    case ncclProfilerProxyStepSendPeerWait_v4: return 1;
    case ncclProfilerProxyStepSendWait: return 2;
    case ncclProfilerProxyStepRecvWait: return 0;
    case ncclProfilerProxyStepRecvFlushWait: return 1;
    case ncclProfilerProxyStepRecvGPUWait: return 2;
    default: return -1;
  }
}

static inline uint64_t net_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void* net_handle(uint32_t ctx_index, uint32_t slot, uint64_t gen, uint32_t entry, uint32_t step,
                               uint32_t is_step) {
  return (void*)(uintptr_t)(DCCL_H_NET_MARK | (is_step ? DCCL_H_NET_STEP : 0) | ((uint64_t)entry << 5) |
                            ((uint64_t)ctx_index << 8) | ((uint64_t)slot << 20) |
                            ((uint64_t)(step % DCCL_NET_STEP_SLOTS) << 40) |
                            ((gen & NET_GEN_MASK) << (40 + 3)));
}

static inline void net_stale(void) { atomic_fetch_add_explicit(&dccl_g.chain_stale, 1, memory_order_relaxed); }

/* The entry a ProxyOp/ProxyStep handle names while its operation is in flight, else NULL (counted). */
static inline dccl_net_peer_t* net_entry(uint64_t h) {
  dccl_ctx_t* ctx = atomic_load_explicit(&dccl_ctx_tab[DCCL_H_CTX(h)], memory_order_acquire);
  uint32_t i = DCCL_H_SLOT(h);
  if (ctx == NULL || ctx->net == NULL || i >= ctx->pool_size) goto stale;
  dccl_slot_t* s = &ctx->slots[i];
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
  if ((c & 1) || ((c >> 1) & NET_GEN_MASK) != (h >> 43)) goto stale;
  uint32_t e = ((uint32_t)h >> 5) & 7u;
  if (e >= s->net->n) goto stale;
  return &s->net->p[e];
stale:
  net_stale();
  return NULL;
}

/* ProxyOp: the (peer, direction) entry of its Coll/P2p. A PXN proxy op of another process has a
   parent we must not decode: its pid tells. */
void dccl_net_start_op(dccl_ctx_t* ctx, void** eHandle, void* parent, int pid, int peer, int isSend) {
  uint64_t p = (uint64_t)(uintptr_t)parent;
  if (p == 0 || DCCL_H_TAG(p) != DCCL_H_TAG_SLOT || (uint32_t)pid != ctx->pid) return;
  dccl_ctx_t* pctx;
  dccl_slot_t* s = handle_slot_ctx(p, &pctx);
  if (s == NULL || s->net == NULL || !handle_live(s, p)) {
    net_stale();
    return;
  }
  dccl_net_t* n = s->net;
  uint8_t dir = isSend ? 1 : 0;
  uint32_t e = 0;
  while (e < n->n && !(n->p[e].peer == peer && n->p[e].is_send == dir)) e++;
  if (e == n->n) {
    if (n->n == DCCL_NET_PEERS) {
      n->dropped++;
      return;
    }
    dccl_net_peer_t* x = &n->p[n->n++];
    memset(x, 0, offsetof(dccl_net_peer_t, step_ts));
    memset(x->step_state, -1, sizeof x->step_state);
    x->peer = peer;
    x->is_send = dir;
  }
  n->p[e].ops++;
  *eHandle = net_handle(DCCL_H_CTX(p), DCCL_H_SLOT(p), DCCL_H_GEN(p), e, 0, 0);
}

void dccl_net_start_step(void** eHandle, void* parent, int step) {
  uint64_t p = (uint64_t)(uintptr_t)parent;
  if (p == 0 || !DCCL_H_IS_NET(p) || (p & DCCL_H_NET_STEP)) return;
  dccl_net_peer_t* x = net_entry(p);
  if (x == NULL) return;
  uint32_t k = (uint32_t)step % DCCL_NET_STEP_SLOTS;
  x->steps++;
  x->step_state[k] = -1; /* untimed until its first state: no clock read here */
  *eHandle = (void*)(uintptr_t)((p & ~(7ull << 40)) | DCCL_H_NET_STEP | ((uint64_t)k << 40));
}

/* The time since the step's last change goes to the state it was in. */
static inline void net_close(dccl_net_peer_t* x, uint32_t k, uint64_t now) {
  int b = x->step_state[k];
  if (b >= 0 && now > x->step_ts[k]) x->state_ns[b] += now - x->step_ts[k];
  x->step_ts[k] = now;
}

ncclResult_t dccl_net_record(uint64_t h, ncclProfilerEventState_t eState, ncclProfilerEventStateArgs_v4_t* args) {
  int b = net_bucket(eState);
  if (!(h & DCCL_H_NET_STEP) || b < 0) return ncclSuccess; /* ProxyOp states, untimed states */
  dccl_net_peer_t* x = net_entry(h);
  if (x == NULL) return ncclSuccess;
  uint32_t k = (uint32_t)(h >> 40) & 7u;
  net_close(x, k, net_now());
  x->step_state[k] = (int8_t)b;
  if (args && (eState == ncclProfilerProxyStepSendWait || eState == ncclProfilerProxyStepRecvWait))
    x->bytes += args->proxyStep.transSize;
  return ncclSuccess;
}

ncclResult_t dccl_net_stop(uint64_t h) {
  if (!(h & DCCL_H_NET_STEP)) return ncclSuccess;
  dccl_net_peer_t* x = net_entry(h);
  if (x == NULL) return ncclSuccess;
  uint32_t k = (uint32_t)(h >> 40) & 7u;
  net_close(x, k, net_now());
  x->step_state[k] = -1;
  return ncclSuccess;
}

void dccl_net_emit(const dccl_slot_t* s) {
  const dccl_net_t* n = s->net;
  if (n == NULL) return;
  for (uint32_t i = 0; i < n->n; i++) {
    const dccl_net_peer_t* x = &n->p[i];
    dccl_peer_record_t r = {
        .kind = DCCL_KIND_PEER,
        .is_send = x->is_send,
        .parent_kind = s->rec.kind,
        .func = s->rec.func,
        .pid = s->rec.pid,
        .rank = s->rec.rank,
        .peer = x->peer,
        .comm_hash = s->rec.comm_hash,
        .seq_number = s->rec.seq_number,
        .proxy_ops = x->ops,
        .steps = x->steps,
        .bytes = x->bytes,
        .state_ns = {x->state_ns[0], x->state_ns[1], x->state_ns[2]},
        .enqueue_ns = s->rec.enqueue_ns,
        .reserved = {n->dropped},
    };
    dccl_event_record_t as_event;
    memcpy(&as_event, &r, sizeof r);
    if (dccl_ring_push(&dccl_g.ring, &as_event) != 0)
      atomic_fetch_add_explicit(&dccl_g.records_dropped_ring_full, 1, memory_order_relaxed);
  }
}
