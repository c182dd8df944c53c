/* DynamICCL tuner plugin: staged/applied versions, control functions, the reload thread.
 *
 * Nothing here runs on NCCL's hot path. The reload (reload.c, with the environment settings: the reload thread, or
 * dynamiccl_tuner_reload() on the caller's thread) reads and parses the file without holding the
 * control lock, then, under the control lock, copies new versions into free preallocated table slots (seqlock write)
 * and publishes tags. getCollInfo (tuner.c) only loads a published tag and reads its slot.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

dct_slot_t dct_slot_storage[DCT_NSLOTS];

dct_global_t dct_g = {
    .slots = dct_slot_storage,
    .ctl = PTHREAD_MUTEX_INITIALIZER,
    .reload_lock = PTHREAD_MUTEX_INITIALIZER,
    .lifecycle = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .path = "", /* dct_env_load: DYNAMICCL_TUNER_CONFIG or the per-user default */
    .mode = DCT_MODE_AGREE,
    .poll_ms = DCT_DEFAULT_POLL_MS,
    .prepared = -1,
};

uint64_t dct_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t dct_monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

const char* dct_mode_name(int mode) {
  switch (mode) {
    case DCT_MODE_AGREE: return "agree";
    case DCT_MODE_EPOCH: return "epoch";
    case DCT_MODE_IMMEDIATE: return "immediate";
    default: return "?";
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Slots and tags (ctl lock held)                                                              */

void dct_set_error(const char* msg) {
  snprintf(dct_g.last_error, sizeof dct_g.last_error, "%s", msg);
}

static int slot_referenced(int i) {
  if (dct_g.prepared == i) return 1;
  for (int k = 0; k < dct_g.n_staged; k++)
    if (dct_g.staged[k] == i) return 1;
  uint64_t a = atomic_load(&dct_g.applied_tag), p = atomic_load(&dct_g.pending_tag);
  return (a && DCT_TAG_SLOT(a) == i) || (p && DCT_TAG_SLOT(p) == i);
}

/* Mark slots nobody refers to any more as retired. */
static void retire_unreferenced(void) {
  uint64_t now = dct_monotonic_ms();
  for (int i = 0; i < DCT_NSLOTS; i++)
    if (dct_g.slots[i].used && !slot_referenced(i)) {
      dct_g.slots[i].used = 0;
      dct_g.slots[i].retired_ms = now;
    }
}

/* A free slot, preferring ones retired longest ago (beyond the grace period when possible); -1 if
   none. `taken` marks slots already chosen by this staging pass. */
static int slot_alloc(const int* taken) {
  int best = -1;
  uint64_t best_ms = UINT64_MAX;
  for (int i = 0; i < DCT_NSLOTS; i++) {
    if (dct_g.slots[i].used || taken[i] || slot_referenced(i)) continue;
    if (dct_g.slots[i].retired_ms < best_ms) {
      best = i;
      best_ms = dct_g.slots[i].retired_ms;
    }
  }
  return best;
}

static void slot_write(int i, const dct_version_t* v) {
  dct_slot_t* s = &dct_g.slots[i];
  uint64_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
  atomic_store_explicit(&s->seq, q + 1, memory_order_relaxed); /* odd: being written */
  atomic_thread_fence(memory_order_release);
  memcpy(&s->v, v, sizeof *v);
  atomic_store_explicit(&s->seq, q + 2, memory_order_release);
}

static uint64_t slot_tag(int i) {
  return DCT_TAG(i, atomic_load_explicit(&dct_g.slots[i].seq, memory_order_relaxed));
}

static int staged_find(uint64_t version) {
  for (int k = 0; k < dct_g.n_staged; k++)
    if (dct_g.slots[dct_g.staged[k]].v.version == version) return dct_g.staged[k];
  return -1;
}

/* A slot holding `version`: staged, pinned by prepare, or the applied one; -1 if none. */
static int find_usable(uint64_t version) {
  int s = staged_find(version);
  if (s >= 0) return s;
  if (dct_g.prepared >= 0 && dct_g.slots[dct_g.prepared].v.version == version) return dct_g.prepared;
  uint64_t a = atomic_load(&dct_g.applied_tag);
  if (a && dct_g.slots[DCT_TAG_SLOT(a)].v.version == version) return DCT_TAG_SLOT(a);
  return -1;
}

static void publish_applied(int slot) {
  uint64_t ver = slot < 0 ? 0 : dct_g.slots[slot].v.version;
  atomic_store_explicit(&dct_g.applied_tag, slot < 0 ? 0 : slot_tag(slot), memory_order_release);
  atomic_store_explicit(&dct_g.applied_version, ver, memory_order_release);
  atomic_fetch_add(&dct_g.applies, 1);
}

static int same_rules(const dct_version_t* a, const dct_version_t* b) {
  return a->n_rules == b->n_rules && a->apply_at_ns == b->apply_at_ns &&
         memcmp(a->func_start, b->func_start, sizeof a->func_start) == 0 &&
         memcmp(a->rules, b->rules, (size_t)a->n_rules * sizeof a->rules[0]) == 0;
}

/* Epoch mode: choose the pending version. The newest staged version whose time has come and that
   is newer than the applied one (it is applied by the next getCollInfo: late, counted), else the
   earliest future one. Versions without `at` are never applied in this mode. */
static void epoch_refresh(int count_late) {
  if (dct_g.mode != DCT_MODE_EPOCH) {
    atomic_store(&dct_g.pending_tag, 0);
    atomic_store(&dct_g.pending_version, 0);
    atomic_store(&dct_g.pending_at_ns, 0);
    return;
  }
  uint64_t now = dct_now_ns(), applied = atomic_load(&dct_g.applied_version);
  int due = -1, future = -1;
  for (int k = 0; k < dct_g.n_staged; k++) {
    const dct_version_t* v = &dct_g.slots[dct_g.staged[k]].v;
    if (v->apply_at_ns == 0 || v->version <= applied) continue;
    if (v->apply_at_ns <= now) due = dct_g.staged[k];
    else if (future < 0) future = dct_g.staged[k];
  }
  int pick = due >= 0 ? due : future;
  if (pick < 0) {
    atomic_store(&dct_g.pending_tag, 0);
    atomic_store(&dct_g.pending_version, 0);
    atomic_store(&dct_g.pending_at_ns, 0);
    return;
  }
  uint64_t tag = slot_tag(pick);
  if (atomic_load(&dct_g.pending_tag) == tag) return;
  if (due >= 0 && count_late) {
    atomic_fetch_add(&dct_g.epoch_late, 1);
    DCT_WARN("DynamICCL tuner: config version %llu arrived after its epoch; applying it late (ranks may disagree "
             "until it is applied everywhere)",
             (unsigned long long)dct_g.slots[pick].v.version);
  }
  atomic_store(&dct_g.pending_version, dct_g.slots[pick].v.version);
  atomic_store(&dct_g.pending_at_ns, dct_g.slots[pick].v.apply_at_ns);
  atomic_store_explicit(&dct_g.pending_tag, tag, memory_order_release);
}

/* Install a parsed file as the staged set. Returns 0, or -1 with err set (nothing changes). */
int dct_stage(const dct_parsed_t* p, char* err, size_t errlen) {
  /* Versions never go back, even across a file without versions: a rank that missed a reset would
     otherwise hold other rules under the same number. */
  uint64_t newest = p->n ? p->v[p->n - 1].version : 0;
  if (p->n > 0 && (newest < dct_g.high_water || (newest == dct_g.high_water && staged_find(newest) < 0))) {
    snprintf(err, errlen, "newest version %llu is not newer than version %llu seen before (versions must only grow)",
             (unsigned long long)newest, (unsigned long long)dct_g.high_water);
    return -1;
  }
  int idx[DCT_MAX_VERSIONS];
  int taken[DCT_NSLOTS] = {0};
  int need = 0;
  for (int k = 0; k < p->n; k++) {
    int s = -1;
    for (int i = 0; i < DCT_NSLOTS; i++) /* staged, applied or pending copy of the same version */
      if ((dct_g.slots[i].used || slot_referenced(i)) && dct_g.slots[i].v.version == p->v[k].version) {
        s = i;
        break;
      }
    if (s >= 0 && !same_rules(&dct_g.slots[s].v, &p->v[k])) {
      snprintf(err, errlen, "version %llu changed its rules (a version number must never be reused)",
               (unsigned long long)p->v[k].version);
      return -1;
    }
    idx[k] = s;
    if (s >= 0) taken[s] = 1;
    else need++;
  }
  for (int k = 0; k < p->n; k++) {
    if (idx[k] >= 0) continue;
    int s = slot_alloc(taken);
    if (s < 0) {
      atomic_fetch_add(&dct_g.slots_exhausted, 1);
      snprintf(err, errlen, "no free table slot for %d new versions", need);
      return -1;
    }
    taken[s] = 1;
    idx[k] = s;
  }
  for (int k = 0; k < p->n; k++) {
    dct_slot_t* s = &dct_g.slots[idx[k]];
    if (!s->used && !slot_referenced(idx[k])) slot_write(idx[k], &p->v[k]);
    s->used = 1;
    dct_g.staged[k] = idx[k];
  }
  dct_g.n_staged = p->n;
  if (newest > dct_g.high_water) dct_g.high_water = newest;
  atomic_store(&dct_g.staged_version, p->n ? p->v[p->n - 1].version : 0);
  atomic_store(&dct_g.oldest_version, p->n ? p->v[0].version : 0);
  if (dct_g.mode == DCT_MODE_IMMEDIATE) {
    int newest_slot = p->n ? idx[p->n - 1] : -1;
    uint64_t tag = newest_slot < 0 ? 0 : slot_tag(newest_slot);
    if (atomic_load(&dct_g.applied_tag) != tag) publish_applied(newest_slot);
  }
  epoch_refresh(1);
  retire_unreferenced();
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Control functions                                                                           */

DCT_EXPORT uint64_t dynamiccl_tuner_staged_version(void) { return atomic_load(&dct_g.staged_version); }
DCT_EXPORT uint64_t dynamiccl_tuner_oldest_version(void) { return atomic_load(&dct_g.oldest_version); }
DCT_EXPORT uint64_t dynamiccl_tuner_applied_version(void) { return atomic_load(&dct_g.applied_version); }

DCT_EXPORT uint32_t dynamiccl_tuner_config_version(uint64_t comm_hash) {
  (void)comm_hash;
  uint64_t v = atomic_load_explicit(&dct_g.applied_version, memory_order_relaxed);
  return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

DCT_EXPORT int dynamiccl_tuner_has_version(uint64_t version) {
  if (version == 0) return 1;
  pthread_mutex_lock(&dct_g.ctl);
  int found = find_usable(version) >= 0;
  pthread_mutex_unlock(&dct_g.ctl);
  return found;
}

DCT_EXPORT int dynamiccl_tuner_prepare_version(uint64_t version) {
  pthread_mutex_lock(&dct_g.ctl);
  int s = version == 0 ? -1 : find_usable(version);
  dct_g.prepared = s;
  int ok = version == 0 || s >= 0;
  if (!ok) retire_unreferenced();
  pthread_mutex_unlock(&dct_g.ctl);
  return ok;
}

DCT_EXPORT int dynamiccl_tuner_apply_version(uint64_t version) {
  pthread_mutex_lock(&dct_g.ctl);
  if (dct_g.mode != DCT_MODE_AGREE) {
    dct_set_error("apply_version: only in agree mode (DYNAMICCL_TUNER_APPLY=agree)");
    atomic_fetch_add(&dct_g.apply_refused, 1);
    pthread_mutex_unlock(&dct_g.ctl);
    return -1;
  }
  int rc = 0;
  if (version == 0) {
    if (atomic_load(&dct_g.applied_tag) != 0) publish_applied(-1);
  } else {
    int s = find_usable(version);
    if (s < 0) {
      char msg[160];
      snprintf(msg, sizeof msg, "apply_version: version %llu is not staged (staged %llu..%llu)",
               (unsigned long long)version, (unsigned long long)atomic_load(&dct_g.oldest_version),
               (unsigned long long)atomic_load(&dct_g.staged_version));
      dct_set_error(msg);
      atomic_fetch_add(&dct_g.apply_refused, 1);
      rc = -1;
    } else if (atomic_load(&dct_g.applied_tag) != slot_tag(s)) {
      publish_applied(s);
    }
  }
  dct_g.prepared = -1;
  retire_unreferenced();
  pthread_mutex_unlock(&dct_g.ctl);
  return rc;
}

DCT_EXPORT size_t dynamiccl_tuner_last_error(char* buf, size_t len) {
  pthread_mutex_lock(&dct_g.ctl);
  size_t n = strlen(dct_g.last_error);
  if (buf && len) snprintf(buf, len, "%s", dct_g.last_error);
  pthread_mutex_unlock(&dct_g.ctl);
  return n;
}

DCT_EXPORT void dynamiccl_tuner_stats(dynamiccl_tuner_stats_t* out) {
  if (out == NULL) return;
  memset(out, 0, sizeof *out);
  out->control_abi = DYNAMICCL_TUNER_CONTROL_ABI;
  pthread_mutex_lock(&dct_g.ctl);
  out->mode = (uint64_t)dct_g.mode;
  pthread_mutex_unlock(&dct_g.ctl);
  out->staged_version = atomic_load(&dct_g.staged_version);
  out->oldest_version = atomic_load(&dct_g.oldest_version);
  out->applied_version = atomic_load(&dct_g.applied_version);
  out->pending_version = atomic_load(&dct_g.pending_version);
  out->pending_at_ns = atomic_load(&dct_g.pending_at_ns);
  out->reloads = atomic_load(&dct_g.reloads);
  out->reload_errors = atomic_load(&dct_g.reload_errors);
  out->files_missing = atomic_load(&dct_g.files_missing);
  out->applies = atomic_load(&dct_g.applies);
  out->apply_refused = atomic_load(&dct_g.apply_refused);
  out->epoch_late = atomic_load(&dct_g.epoch_late);
  out->slots_exhausted = atomic_load(&dct_g.slots_exhausted);
  out->calls = atomic_load(&dct_g.f_calls);
  out->decisions = atomic_load(&dct_g.f_decisions);
  out->no_enabled_cell = atomic_load(&dct_g.f_no_enabled);
  out->chunk_set = atomic_load(&dct_g.f_chunk_set);
  out->lookup_retries = atomic_load(&dct_g.f_retries);
  pthread_mutex_lock(&dct_g.lifecycle);
  for (dct_ctx_t* c = dct_g.ctxs; c; c = c->next) {
    out->contexts++;
    out->calls += atomic_load_explicit(&c->calls, memory_order_relaxed);
    out->decisions += atomic_load_explicit(&c->decisions, memory_order_relaxed);
    out->no_enabled_cell += atomic_load_explicit(&c->no_enabled, memory_order_relaxed);
    out->chunk_set += atomic_load_explicit(&c->chunk_set, memory_order_relaxed);
    out->lookup_retries += atomic_load_explicit(&c->retries, memory_order_relaxed);
  }
  pthread_mutex_unlock(&dct_g.lifecycle);
}

/* ------------------------------------------------------------------------------------------ */
/* Reload thread                                                                               */

static void* reload_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&dct_g.ctl);
  for (;;) {
    if (dct_g.stop_requested) break;
    pthread_mutex_unlock(&dct_g.ctl);
    dynamiccl_tuner_reload();
    pthread_mutex_lock(&dct_g.ctl);
    epoch_refresh(0); /* the next future version once the previous one was applied */
    if (dct_g.stop_requested) break;
    int ms = dct_g.poll_ms > 0 ? dct_g.poll_ms : DCT_DEFAULT_POLL_MS;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&dct_g.wake, &dct_g.ctl, &ts);
  }
  pthread_mutex_unlock(&dct_g.ctl);
  return NULL;
}

int dct_thread_start(void) {
  pthread_mutex_lock(&dct_g.ctl);
  int poll = dct_g.poll_ms;
  dct_g.stop_requested = 0;
  pthread_mutex_unlock(&dct_g.ctl);
  if (poll <= 0 || dct_g.thread_running) return 0;
  static pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_destroy(&dct_g.wake);
  pthread_cond_init(&dct_g.wake, &attr);
  pthread_condattr_destroy(&attr);
  if (pthread_create(&dct_g.thread, NULL, reload_main, NULL) != 0) return -1;
  dct_g.thread_running = 1;
  return 0;
}

void dct_thread_stop(void) {
  if (!dct_g.thread_running) return;
  pthread_mutex_lock(&dct_g.ctl);
  dct_g.stop_requested = 1;
  pthread_cond_broadcast(&dct_g.wake);
  pthread_mutex_unlock(&dct_g.ctl);
  pthread_join(dct_g.thread, NULL);
  dct_g.thread_running = 0;
}
