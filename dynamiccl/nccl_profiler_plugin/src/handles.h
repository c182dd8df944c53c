/* DynamICCL profiler plugin: the event handles' encoding (included by internal.h; not part of any ABI). */
#ifndef DYNAMICCL_HANDLES_H_
#define DYNAMICCL_HANDLES_H_

#include <stdint.h>

/* ---- event handles ----
   NCCL treats a handle as opaque and only tests it for NULL, so a handle is an encoded value,
   never a pointer: it names the communicator (an index into dccl_ctx_tab), the slot, the slot
   generation at start and, for KernelCh, the channel. A stop or child that arrives after its
   operation finished, was reaped, or its communicator was finalized (shared proxies of split
   communicators) decodes to a generation or table entry that no longer matches and is dropped
   (counted) instead of touching the slot's next occupant.
     bits 0-1 tag | 2-7 channel | 8-18 ctx index | 19 chained | 20-39 slot index | 40-63 generation
   The chained bit (DYNAMICCL_PROFILER_CHAIN, chain.h) marks a Coll/P2p or KernelCh handle whose
   chained plugin's handle is kept beside our slot: it sits next to the tag so that the hot paths'
   one tag test also routes chained handles to the chain (no extra test when not chained). */
#define DCCL_H_TAG_SLOT 1u
#define DCCL_H_TAG_KCH 2u
#define DCCL_H_TAG_DUMMY 3u /* alone: an untracked parent; with a KernelCh payload: its initial_sync phase */
#define DCCL_H_CTX_BITS 11
#define DCCL_MAX_CTX (1u << DCCL_H_CTX_BITS) /* live + recently finalized communicators */
#define DCCL_H_CHAINED (1u << 19)
#define DCCL_H_ROUTE(h) ((uint32_t)(h) & (3u | DCCL_H_CHAINED)) /* tag and chained bit: one AND */
#define DCCL_H_GEN_MASK ((1ull << 24) - 1)
#define DCCL_H_MAKE(tag, ch, ctx, slot, gen)                                                           \
  ((uint64_t)(tag) | ((uint64_t)(ch) << 2) | ((uint64_t)(ctx) << 8) | ((uint64_t)(slot) << 20) |     \
   (((uint64_t)(gen) & DCCL_H_GEN_MASK) << 40))
#define DCCL_H_TAG(h) ((uint32_t)(h) & 3u)
#define DCCL_H_CH(h) ((uint32_t)((h) >> 2) & 63u)
#define DCCL_H_CTX(h) ((uint32_t)((h) >> 8) & (DCCL_MAX_CTX - 1))
#define DCCL_H_SLOT(h) ((uint32_t)((h) >> 20) & ((1u << 20) - 1))
#define DCCL_H_GEN(h) ((uint64_t)(h) >> 40)

/* Handles of ours that name no slot of an operation: the dummy tag with the chained bit, bits 2-3
   saying which. Tag 0 is never ours but NULL, so with a chained profiler any 4-byte-aligned handle
   it gives out can go to NCCL as it is (chain.c, chain_handle).
     DCCL_H_CHAIN_MARK: an entry of the communicator's chain ring (chain.h): slot field the entry,
       generation its lap.
     DCCL_H_NET_MARK (net.h): a ProxyOp/ProxyStep of per-peer network timing. */
#define DCCL_H_MARK_BITS (0xFu | DCCL_H_CHAINED)
#define DCCL_H_NET_MARK (DCCL_H_CHAINED | 0x4u | DCCL_H_TAG_DUMMY)
#define DCCL_H_CHAIN_MARK (DCCL_H_CHAINED | 0x8u | DCCL_H_TAG_DUMMY)
#define DCCL_H_IS_CHAIN(h) (((uint32_t)(h) & DCCL_H_MARK_BITS) == DCCL_H_CHAIN_MARK)
#define DCCL_H_IS_NET(h) (((uint32_t)(h) & DCCL_H_MARK_BITS) == DCCL_H_NET_MARK)
struct dccl_chain;

#endif /* DYNAMICCL_HANDLES_H_ */
