/* DynamICCL NCCL profiler plugin: the tuner link (internal.h) — the DynamICCL tuner NCCL loaded,
 * found with dlopen(RTLD_NOLOAD), whose applied config version every record carries. Never on the
 * hot path (init and the sender thread): a mutex and dlopen are fine here; the hot path's read is
 * dccl_tuner_version() in internal.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

static pthread_mutex_t g_tuner_link_lock = PTHREAD_MUTEX_INITIALIZER;

void dccl_tuner_link(void) {
  if (atomic_load(&dccl_g.tuner_version_fn)) return;
  pthread_mutex_lock(&g_tuner_link_lock);
  if (atomic_load(&dccl_g.tuner_version_fn)) goto out;
  /* NCCL's search order (nccl-plugin-abi.md §2.6): unset -> libnccl-tuner.so; else the value,
     then libnccl-tuner-<value>.so; "none" disables. */
  const char* v = getenv("NCCL_TUNER_PLUGIN");
  char names[2][512];
  int n = 0;
  if (v == NULL || *v == '\0') {
    snprintf(names[n++], sizeof names[0], "libnccl-tuner.so");
  } else if (strcasecmp(v, "none") != 0) {
    snprintf(names[n++], sizeof names[0], "%s", v);
    size_t len = strlen(v);
    if (strchr(v, '/') == NULL && !(strncmp(v, "lib", 3) == 0 && len > 3 && strcmp(v + len - 3, ".so") == 0))
      snprintf(names[n++], sizeof names[0], "libnccl-tuner-%s.so", v);
  }
  for (int i = 0; i < n; i++) {
    void* h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) continue;
    /* record_version knows when the applied version is not applied (tuner v4); older tuners
       export only config_version */
    void* f = dlsym(h, "dynamiccl_tuner_record_version");
    if (f == NULL) f = dlsym(h, "dynamiccl_tuner_config_version");
    if (f == NULL) { /* another tuner: records keep version 0 */
      dlclose(h);
      continue;
    }
    dccl_g.tuner_handle = h;
    atomic_store_explicit(&dccl_g.tuner_version_fn, (uintptr_t)f, memory_order_release);
    DCCL_INFO("DynamICCL profiler: records carry the applied config version of tuner %s", names[i]);
    goto out;
  }
out:
  pthread_mutex_unlock(&g_tuner_link_lock);
}

void dccl_tuner_unlink(void) {
  pthread_mutex_lock(&g_tuner_link_lock);
  atomic_store(&dccl_g.tuner_version_fn, 0);
  if (dccl_g.tuner_handle) dlclose(dccl_g.tuner_handle);
  dccl_g.tuner_handle = NULL;
  pthread_mutex_unlock(&g_tuner_link_lock);
}
