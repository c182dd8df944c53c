/* DynamICCL profiler plugin: NCCL's strings as wire codes, and the v7 kernel variant hash, each behind
 * a small lock-free cache keyed by the string's address (NCCL's strings are static). Included by
 * plugin.c only: the caches are that file's.
 */
#ifndef DYNAMICCL_CODES_H_
#define DYNAMICCL_CODES_H_

#include <stdint.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------------------------------ */
/* NCCL string -> wire code. The strings are static in NCCL, so a tiny direct-mapped cache of   */
/* (pointer << 8 | code) avoids strcmp after the first sight of each pointer.                   */

#define STRCACHE_SIZE 16
typedef struct {
  _Atomic uint64_t e[STRCACHE_SIZE];
} strcache_t;
static strcache_t g_func_cache, g_dtype_cache, g_algo_cache, g_proto_cache;

/* NCCL 2.27-2.30 name every datatype except ncclUint8, which it passes as "Unknown"
   (collectives.cc: ncclDatatypeToString has no ncclUint8 case): the only datatype it calls that. */
static const char k_dtype_unknown[] = "Unknown";

static __attribute__((noinline, cold)) uint8_t lookup_slow(strcache_t* c, const char* s, const char* const* names, int n) {
  uint8_t code = DCCL_UNKNOWN;
  for (int i = 0; i < n; i++) {
    if (strcmp(s, names[i]) == 0) {
      code = (uint8_t)i;
      break;
    }
  }
  if (code == DCCL_UNKNOWN && names == dccl_dtype_names && strcmp(s, k_dtype_unknown) == 0)
    code = DCCL_DTYPE_NCCLUINT8;
  uintptr_t p = (uintptr_t)s;
  if ((p >> 56) == 0) /* user-space pointers fit in 56 bits; otherwise just do not cache */
    atomic_store_explicit(&c->e[(p >> 3) & (STRCACHE_SIZE - 1)], ((uint64_t)p << 8) | code, memory_order_relaxed);
  return code;
}

static inline uint8_t lookup(strcache_t* c, const char* s, const char* const* names, int n) {
  if (s == NULL) return DCCL_UNKNOWN;
  uintptr_t p = (uintptr_t)s;
  uint64_t e = atomic_load_explicit(&c->e[(p >> 3) & (STRCACHE_SIZE - 1)], memory_order_relaxed);
  if ((e >> 8) == (uint64_t)p) return (uint8_t)(e & 0xff);
  return lookup_slow(c, s, names, n);
}

#define MAP_FUNC(s) lookup(&g_func_cache, (s), dccl_func_names, DCCL_FUNC_COUNT)
#define MAP_DTYPE(s) lookup(&g_dtype_cache, (s), dccl_dtype_names, DCCL_DTYPE_COUNT)
#define MAP_ALGO(s) lookup(&g_algo_cache, (s), dccl_algo_names, DCCL_ALGO_COUNT)
#define MAP_PROTO(s) lookup(&g_proto_cache, (s), dccl_proto_names, DCCL_PROTO_COUNT)

/* v7 kernelVariant: the 32-bit FNV-1a hash of its name (first 64 bytes; 0: none), so records can be
   grouped by kernel variant across ranks and runs without a string. NCCL's names are static, so a
   cache keyed by the whole pointer spares the hash: an entry is claimed by CAS (1 = being written)
   before its hash is stored, and a reader checks the pointer before and after reading the hash. */
#define VARIANT_CACHE 8
typedef struct {
  _Atomic uintptr_t p;
  _Atomic uint32_t h;
} variant_entry_t;
static variant_entry_t g_variant_cache[VARIANT_CACHE];

static __attribute__((noinline)) uint32_t variant_hash_slow(const char* s, uintptr_t p, uintptr_t seen) {
  uint32_t h = 2166136261u;
  for (int i = 0; i < 64 && s[i]; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
  h = h ? h : 1;
  variant_entry_t* e = &g_variant_cache[(p >> 3) & (VARIANT_CACHE - 1)];
  if (seen != 1 && atomic_compare_exchange_strong_explicit(&e->p, &seen, 1, memory_order_acq_rel, memory_order_relaxed)) {
    atomic_store_explicit(&e->h, h, memory_order_relaxed);
    atomic_store_explicit(&e->p, p, memory_order_release);
  }
  return h;
}

static inline uint32_t variant_hash(const char* s) {
  if (s == NULL) return 0;
  uintptr_t p = (uintptr_t)s;
  variant_entry_t* e = &g_variant_cache[(p >> 3) & (VARIANT_CACHE - 1)];
  uintptr_t seen = atomic_load_explicit(&e->p, memory_order_acquire);
  if (seen == p) {
    uint32_t h = atomic_load_explicit(&e->h, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&e->p, memory_order_relaxed) == p) return h;
  }
  return variant_hash_slow(s, p, seen);
}

#endif /* DYNAMICCL_CODES_H_ */
