/* Per-user, per-job default paths: the C mirror of dynamiccl/contracts/runtime_paths.py (the rule is
 * stated there; tests/contracts/test_runtime_paths.py checks both give the same paths).
 *
 * Header-only (static functions) so both plugins include it without a link dependency. The plugins
 * only read the directory, never create it: the collector and the retuner create it 0700.
 * Include after defining _GNU_SOURCE (or _POSIX_C_SOURCE >= 200112L) for lstat. */
#ifndef DYNAMICCL_PATHS_H
#define DYNAMICCL_PATHS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DYNAMICCL_JOB_MAX 64

static int dynamiccl_job_ok(const char* s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > DYNAMICCL_JOB_MAX || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
             c == '-';
    if (!ok) return 0;
  }
  return 1;
}

/* DYNAMICCL_JOB_ID, else SLURM_JOB_ID; NULL when neither is a valid name part. */
static const char* dynamiccl_job_id(void) {
  const char* vars[2] = {"DYNAMICCL_JOB_ID", "SLURM_JOB_ID"};
  for (int i = 0; i < 2; i++) {
    const char* v = getenv(vars[i]);
    if (dynamiccl_job_ok(v)) return v;
  }
  return NULL;
}

/* $XDG_RUNTIME_DIR/dynamiccl, else /tmp/dynamiccl-<uid>. Returns 0, or -1 when it does not fit. */
static int dynamiccl_runtime_dir(char* out, size_t n) {
  const char* xdg = getenv("XDG_RUNTIME_DIR");
  int w;
  if (xdg && xdg[0] == '/') {
    size_t len = strlen(xdg);
    while (len > 1 && xdg[len - 1] == '/') len--;
    w = snprintf(out, n, "%.*s/dynamiccl", (int)len, xdg);
  } else {
    w = snprintf(out, n, "/tmp/dynamiccl-%u", (unsigned)getuid());
  }
  return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

/* <runtime dir>/<stem>[-<job>].<ext>, e.g. stem "collector", ext "sock". 0, or -1 when it does not fit. */
static int dynamiccl_default_path(char* out, size_t n, const char* stem, const char* ext) {
  char dir[1024]; /* longer runtime directories do not fit a socket or a sane path: refused (-1) */
  if (dynamiccl_runtime_dir(dir, sizeof dir) != 0) return -1;
  const char* job = dynamiccl_job_id();
  int w = job ? snprintf(out, n, "%s/%s-%s.%s", dir, stem, job, ext) : snprintf(out, n, "%s/%s.%s", dir, stem, ext);
  return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

/* 0 when dir is a directory (not a link) owned by this user and not group/other-writable;
 * otherwise -1 with the reason in err. A missing directory is -1 with "does not exist". */
static int dynamiccl_check_private_dir(const char* dir, char* err, size_t errlen) {
  struct stat st;
  if (lstat(dir, &st) != 0) {
    snprintf(err, errlen, "%.300s does not exist", dir);
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%.300s is not a directory (a link or a file)", dir);
    return -1;
  }
  if (st.st_uid != getuid()) {
    snprintf(err, errlen, "%.300s is owned by uid %u, not by this user (uid %u)", dir, (unsigned)st.st_uid,
             (unsigned)getuid());
    return -1;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(err, errlen, "%.300s is writable by group or others (mode %o)", dir, (unsigned)(st.st_mode & 07777));
    return -1;
  }
  return 0;
}

#endif
