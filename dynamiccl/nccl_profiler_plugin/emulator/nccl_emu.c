/* GPU-free emulator of NCCL's profiler call sequence. See nccl_emu.h. */
#define _GNU_SOURCE
#include "nccl_emu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dynamiccl_record.h"
#include "nccl_profiler_abi.h"
#include "emu_internal.h"

static char g_err[1024];
static pthread_mutex_t g_err_mutex = PTHREAD_MUTEX_INITIALIZER;

static void set_err(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&g_err_mutex);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  pthread_mutex_unlock(&g_err_mutex);
  va_end(ap);
}

EMU_EXPORT const char* emu_error(void) { return g_err; }

/* NCCL's logger stand-in: WARN goes to stderr and is kept for emu_error(); INFO only with
   NCCL_DEBUG=INFO. */
static char g_last_warn[1024];
static void emu_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                       ...) {
  (void)flags;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == NCCL_LOG_WARN) {
    pthread_mutex_lock(&g_err_mutex);
    snprintf(g_last_warn, sizeof g_last_warn, "%s", msg);
    pthread_mutex_unlock(&g_err_mutex);
    fprintf(stderr, "NCCL WARN %s:%d %s\n", file, line, msg);
  } else {
    const char* d = getenv("NCCL_DEBUG");
    if (d && (strcasecmp(d, "INFO") == 0 || strcasecmp(d, "TRACE") == 0))
      fprintf(stderr, "NCCL INFO %s\n", msg);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* proxy thread                                                                                */

static void* proxy_main(void* arg) {
  emu_comm_t* c = arg;
  uint64_t tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
  unsigned idle = 0;
  for (;;) {
    uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
    if (tail == head) {
      if (atomic_load_explicit(&c->stop, memory_order_acquire)) break;
      if (++idle < 2000) {
        sched_yield();
      } else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
      }
      continue;
    }
    idle = 0;
    while (tail != head) {
      emu_item_t* it = &c->items[tail & (EMU_QUEUE_SIZE - 1)];
      emu_replay_proxy(c, it->coll, &it->op, &c->calls_proxy);
      tail++;
      atomic_store_explicit(&c->tail, tail, memory_order_release);
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* public API                                                                                  */

EMU_EXPORT emu_t* emu_open(const char* plugin_path, int abi_version) {
  if (abi_version < 4 || abi_version > 7) {
    set_err("unsupported profiler ABI version %d (this emulator speaks 4, 5, 6, 7)", abi_version);
    return NULL;
  }
  /* The emulator's pTimers are simulated time, not the GPU's wall clock: the plugin's check of a KernelCh
     span against the host interval does not apply (unless the caller set DYNAMICCL_SPAN_CHECK itself). */
  setenv("DYNAMICCL_SPAN_CHECK", "0", 0);
  void* dl = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) {
    set_err("cannot load profiler plugin %s: %s", plugin_path, dlerror());
    return NULL;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclProfiler_v%d", abi_version);
  void* table = dlsym(dl, sym);
  if (table == NULL) {
    set_err("profiler plugin %s does not export %s", plugin_path, sym);
    dlclose(dl);
    return NULL;
  }
  emu_t* e = calloc(1, sizeof *e);
  if (e == NULL) {
    dlclose(dl);
    set_err("out of memory");
    return NULL;
  }
  e->dl = dl;
  e->version = abi_version;
  if (abi_version == 4) e->t4 = table;
  if (abi_version == 5) e->t5 = table;
  if (abi_version == 6) e->t6 = table;
  if (abi_version == 7) e->t7 = table;
  *(void**)&e->stats = dlsym(dl, "dynamicclProfilerStats");
  return e;
}

EMU_EXPORT int emu_comm_init(emu_t* e, uint64_t comm_hash, const char* name, int nnodes, int nranks, int rank,
                             int threads) {
  int id = -1;
  for (int i = 0; i < EMU_MAX_COMMS; i++) {
    if (e->comms[i] == NULL) {
      id = i;
      break;
    }
  }
  if (id < 0) {
    set_err("too many communicators (max %d)", EMU_MAX_COMMS);
    return -1;
  }
  emu_comm_t* c = aligned_alloc(64, (sizeof *c + 63) & ~(size_t)63);
  if (c == NULL) return -1;
  memset(c, 0, sizeof *c);
  c->emu = e;
  c->threads = threads == 2 ? 2 : 1;
  c->rank = rank;
  c->nranks = nranks;
  c->nnodes = nnodes;
  c->pid = getpid();
  g_last_warn[0] = '\0';
  ncclResult_t r;
  if (e->version == 4)
    r = e->t4->init(&c->ctx, &e->mask, name, comm_hash, nnodes, nranks, rank, emu_logger);
  else if (e->version == 5)
    r = e->t5->init(&c->ctx, comm_hash, &e->mask, name, nnodes, nranks, rank, emu_logger);
  else if (e->version == 6)
    r = e->t6->init(&c->ctx, comm_hash, &e->mask, name, nnodes, nranks, rank, emu_logger);
  else
    r = e->t7->init(&c->ctx, comm_hash, &e->mask, name, nnodes, nranks, rank, emu_logger);
  if (r != ncclSuccess) {
    set_err("profiler init failed (ncclResult %d): %s", (int)r, g_last_warn[0] ? g_last_warn : "(no message)");
    free(c);
    return -1;
  }
  if (c->threads == 2) {
    c->items = calloc(EMU_QUEUE_SIZE, sizeof(emu_item_t));
    if (c->items == NULL || pthread_create(&c->proxy, NULL, proxy_main, c) != 0) {
      set_err("cannot start the proxy thread");
      free(c->items);
      if (e->version == 4) e->t4->finalize(c->ctx);
      else if (e->version == 5) e->t5->finalize(c->ctx);
      else if (e->version == 6) e->t6->finalize(c->ctx);
      else e->t7->finalize(c->ctx);
      free(c);
      return -1;
    }
  }
  e->comms[id] = c;
  return id;
}

static emu_comm_t* get_comm(emu_t* e, int comm) {
  if (e == NULL || comm < 0 || comm >= EMU_MAX_COMMS) return NULL;
  return e->comms[comm];
}

EMU_EXPORT int emu_run_colls(emu_t* e, int comm, const emu_coll_t* ops, int n) {
  emu_comm_t* c = get_comm(e, comm);
  if (c == NULL) return -1;
  for (int i = 0; i < n; i++) {
    void* coll = emu_replay_app(c, &ops[i]);
    if (c->threads == 1) {
      emu_replay_proxy(c, coll, &ops[i], &c->calls_app);
      continue;
    }
    uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
    while (head - atomic_load_explicit(&c->tail, memory_order_acquire) >= EMU_QUEUE_SIZE) sched_yield();
    emu_item_t* it = &c->items[head & (EMU_QUEUE_SIZE - 1)];
    it->coll = coll;
    it->op = ops[i];
    atomic_store_explicit(&c->head, head + 1, memory_order_release);
  }
  return 0;
}

EMU_EXPORT int emu_sync(emu_t* e, int comm) {
  emu_comm_t* c = get_comm(e, comm);
  if (c == NULL) return -1;
  if (c->threads == 2) {
    uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
    while (atomic_load_explicit(&c->tail, memory_order_acquire) != head) sched_yield();
  }
  return 0;
}

EMU_EXPORT int emu_comm_finalize(emu_t* e, int comm) {
  emu_comm_t* c = get_comm(e, comm);
  if (c == NULL) return -1;
  if (c->threads == 2) {
    emu_sync(e, comm);
    atomic_store_explicit(&c->stop, 1, memory_order_release);
    pthread_join(c->proxy, NULL);
    free(c->items);
  }
  if (e->version == 4)
    e->t4->finalize(c->ctx);
  else if (e->version == 5)
    e->t5->finalize(c->ctx);
  else if (e->version == 6)
    e->t6->finalize(c->ctx);
  else
    e->t7->finalize(c->ctx);
  e->calls_closed += c->calls_app + c->calls_proxy + 2;
  e->comms[comm] = NULL;
  free(c);
  return 0;
}

EMU_EXPORT void emu_close(emu_t* e) {
  if (e == NULL) return;
  for (int i = 0; i < EMU_MAX_COMMS; i++)
    if (e->comms[i]) emu_comm_finalize(e, i);
  dlclose(e->dl);
  free(e);
}

EMU_EXPORT int emu_mask(const emu_t* e) { return __atomic_load_n(&e->mask, __ATOMIC_RELAXED); }

EMU_EXPORT const char* emu_plugin_name(const emu_t* e) {
  return e->version == 4 ? e->t4->name : e->version == 5 ? e->t5->name : e->version == 6 ? e->t6->name : e->t7->name;
}

EMU_EXPORT int emu_plugin_stats(emu_t* e, void* out) {
  if (e == NULL || e->stats == NULL) return -1;
  e->stats(out);
  return 0;
}

EMU_EXPORT uint64_t emu_plugin_calls(const emu_t* e) {
  uint64_t n = e->calls_closed;
  for (int i = 0; i < EMU_MAX_COMMS; i++)
    if (e->comms[i]) n += e->comms[i]->calls_app + 1 + __atomic_load_n(&e->comms[i]->calls_proxy, __ATOMIC_RELAXED);
  return n;
}
