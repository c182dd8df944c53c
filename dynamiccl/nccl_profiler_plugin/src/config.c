#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* DynamICCL profiler plugin: DYNAMICCL_* environment configuration (read in init only). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Strict unsigned integer: decimal (or 0x hex), no sign, no trailing junk, within [lo, hi]. */
static int parse_u64(const char* name, const char* s, uint64_t lo, uint64_t hi, uint64_t* out, char* err,
                     size_t errlen) {
  const char* p = s;
  while (*p == ' ' || *p == '\t') p++;
  if (*p == '\0' || *p == '-' || *p == '+') goto bad;
  errno = 0;
  char* end = NULL;
  unsigned long long v = strtoull(p, &end, 0);
  if (errno != 0 || end == p) goto bad;
  while (*end == ' ' || *end == '\t') end++;
  if (*end != '\0') goto bad;
  if (v < lo || v > hi) {
    snprintf(err, errlen, "%s=%s is out of range [%" PRIu64 ", %" PRIu64 "]", name, s, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
bad:
  snprintf(err, errlen, "%s=%s is not a non-negative integer", name, s);
  return -1;
}

static int valid_collector(const char* s, char* err, size_t errlen) {
  if (strlen(s) >= DCCL_ADDR_MAX) {
    snprintf(err, errlen, "DYNAMICCL_COLLECTOR is longer than %d characters", DCCL_ADDR_MAX - 1);
    return -1;
  }
  if (strncmp(s, "unix:", 5) == 0) {
    size_t n = strlen(s + 5);
    if (n == 0 || n >= 108) { /* sizeof(sockaddr_un.sun_path) */
      snprintf(err, errlen, "DYNAMICCL_COLLECTOR=%s: unix socket path must be 1..107 characters", s);
      return -1;
    }
    return 0;
  }
  if (strncmp(s, "tcp:", 4) == 0) {
    const char* hp = s + 4;
    const char* colon = strrchr(hp, ':');
    uint64_t port;
    char perr[64];
    if (colon == NULL || colon == hp || parse_u64("port", colon + 1, 1, 65535, &port, perr, sizeof perr) != 0) {
      snprintf(err, errlen, "DYNAMICCL_COLLECTOR=%s: expected tcp:HOST:PORT with PORT in 1..65535", s);
      return -1;
    }
    return 0;
  }
  snprintf(err, errlen, "DYNAMICCL_COLLECTOR=%s: expected unix:/path or tcp:host:port", s);
  return -1;
}

int dccl_config_parse(dccl_config_t* cfg, const char* (*get)(const char* name), char* err, size_t errlen) {
  uint64_t v;
  const char* s;
  memset(cfg, 0, sizeof *cfg);
  snprintf(cfg->collector, sizeof cfg->collector, "%s", DCCL_DEFAULT_COLLECTOR);
  cfg->event_mask = DCCL_DEFAULT_EVENT_MASK;
  cfg->pool_size = DCCL_DEFAULT_POOL_SIZE;
  cfg->ring_size = DCCL_DEFAULT_RING_SIZE;
  cfg->min_bytes = DCCL_DEFAULT_MIN_BYTES;
  cfg->sample = DCCL_DEFAULT_SAMPLE;
  cfg->flush_ms = DCCL_DEFAULT_FLUSH_MS;
  cfg->stale_ms = DCCL_DEFAULT_STALE_MS;
  cfg->span_check = DCCL_DEFAULT_SPAN_CHECK;
  cfg->stale_guard_us = DCCL_DEFAULT_STALE_GUARD_US;
  cfg->clock = DCCL_DEFAULT_CLOCK;

  if ((s = get("DYNAMICCL_COLLECTOR")) != NULL && *s != '\0') {
    if (valid_collector(s, err, errlen) != 0) return -1;
    snprintf(cfg->collector, sizeof cfg->collector, "%s", s);
  }
#define DCCL_GET_U(envname, lo, hi, field)                                        \
  if ((s = get(envname)) != NULL && *s != '\0') {                                 \
    if (parse_u64(envname, s, (lo), (hi), &v, err, errlen) != 0) return -1;       \
    cfg->field = v;                                                               \
  }
  DCCL_GET_U("DYNAMICCL_EVENT_MASK", 0, DCCL_EVENT_MASK_ALL, event_mask)
  DCCL_GET_U("DYNAMICCL_POOL_SIZE", 1, DCCL_MAX_POOL_SIZE, pool_size)
  DCCL_GET_U("DYNAMICCL_RING_SIZE", DCCL_MIN_RING_SIZE, DCCL_MAX_RING_SIZE, ring_size)
  DCCL_GET_U("DYNAMICCL_MIN_BYTES", 0, UINT64_MAX, min_bytes)
  DCCL_GET_U("DYNAMICCL_SAMPLE", 1, DCCL_MAX_SAMPLE, sample)
  DCCL_GET_U("DYNAMICCL_FLUSH_MS", 1, DCCL_MAX_FLUSH_MS, flush_ms)
  DCCL_GET_U("DYNAMICCL_STALE_MS", 1, DCCL_MAX_STALE_MS, stale_ms)
  DCCL_GET_U("DYNAMICCL_SPAN_CHECK", 0, 1, span_check)
  DCCL_GET_U("DYNAMICCL_STALE_GUARD_US", 0, DCCL_MAX_STALE_GUARD_US, stale_guard_us)
  DCCL_GET_U("DYNAMICCL_CLOCK", 0, 1, clock)
#undef DCCL_GET_U
  if ((cfg->ring_size & (cfg->ring_size - 1)) != 0) {
    snprintf(err, errlen, "DYNAMICCL_RING_SIZE=%u must be a power of two", cfg->ring_size);
    return -1;
  }
  return 0;
}

static const char* env_get(const char* name) { return getenv(name); }

int dccl_config_load(dccl_config_t* cfg, char* err, size_t errlen) {
  return dccl_config_parse(cfg, env_get, err, errlen);
}
