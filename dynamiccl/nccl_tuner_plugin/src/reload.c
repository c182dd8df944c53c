/* DynamICCL tuner plugin: where the configuration comes from (DYNAMICCL_TUNER_* settings,
 * dynamiccl_tuner_configure) and reading it (dynamiccl_tuner_reload).
 *
 * Stats the file, refuses one another user could have planted, reads and parses it without the
 * control lock, then stages the parsed versions under it (control.c: dct_stage). An unchanged
 * file is skipped by identity (device, inode, size, mtime) unless it was written too recently to
 * trust its mtime; every rejected file is counted and the streak logged once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "../../contracts/dynamiccl_paths.h"

/* ------------------------------------------------------------------------------------------ */
/* Environment (first init; an invalid value is a warning and the default, never a failure:     */
/* a tuner init error would fail communicator creation).                                       */

/* 1 while dct_g.path is the per-user default: its directory must then pass the private-dir rule. */
static int g_default_path; /* dct_g.path is the per-user default (ctl lock) */

void dct_env_load(void) {
  pthread_mutex_lock(&dct_g.ctl);
  if (dct_g.env_loaded) {
    pthread_mutex_unlock(&dct_g.ctl);
    return;
  }
  dct_g.env_loaded = 1;
  const char* p = getenv("DYNAMICCL_TUNER_CONFIG");
  if (!(dct_g.overrides & 1)) {
    g_default_path = 1;
    dynamiccl_default_path(dct_g.path, sizeof dct_g.path, "tuner", "conf"); /* fits: at most ~4 KB + 80 */
    if (p && *p && strlen(p) >= DCT_PATH_MAX)
      DCT_WARN("DynamICCL tuner: DYNAMICCL_TUNER_CONFIG is too long; using %s", dct_g.path);
    else if (p && *p) {
      snprintf(dct_g.path, sizeof dct_g.path, "%s", p);
      g_default_path = 0;
    }
  }
  const char* m = getenv("DYNAMICCL_TUNER_APPLY");
  if (!(dct_g.overrides & 2) && m && *m) {
    if (strcasecmp(m, "agree") == 0) dct_g.mode = DCT_MODE_AGREE;
    else if (strcasecmp(m, "epoch") == 0) dct_g.mode = DCT_MODE_EPOCH;
    else if (strcasecmp(m, "immediate") == 0) dct_g.mode = DCT_MODE_IMMEDIATE;
    else DCT_WARN("DynamICCL tuner: DYNAMICCL_TUNER_APPLY=%.40s is not agree|epoch|immediate; using agree", m);
  }
  const char* q = getenv("DYNAMICCL_TUNER_POLL_MS");
  if (!(dct_g.overrides & 4) && q && *q) {
    char* end;
    errno = 0;
    long v = strtol(q, &end, 10);
    if (errno || *end || v < 0 || v > DCT_MAX_POLL_MS)
      DCT_WARN("DynamICCL tuner: DYNAMICCL_TUNER_POLL_MS=%.40s is not in 0..%d; using %d", q, DCT_MAX_POLL_MS,
               dct_g.poll_ms);
    else dct_g.poll_ms = (int)v;
  }
  pthread_mutex_unlock(&dct_g.ctl);
}

DCT_EXPORT int dynamiccl_tuner_configure(const char* path, int mode, int poll_ms) {
  if (path && (*path == '\0' || strlen(path) >= DCT_PATH_MAX)) return -1;
  if (mode > DCT_MODE_IMMEDIATE || poll_ms > DCT_MAX_POLL_MS) return -1;
  pthread_mutex_lock(&dct_g.ctl);
  if (path) {
    g_default_path = 0;
    snprintf(dct_g.path, sizeof dct_g.path, "%s", path);
    dct_g.overrides |= 1;
  }
  if (mode >= 0) {
    dct_g.mode = mode;
    dct_g.overrides |= 2;
  }
  if (poll_ms >= 0) {
    dct_g.poll_ms = poll_ms;
    dct_g.overrides |= 4;
  }
  pthread_mutex_unlock(&dct_g.ctl);
  if (path) { /* force a re-read of the (new) path */
    pthread_mutex_lock(&dct_g.reload_lock);
    dct_g.have_ident = 0;
    pthread_mutex_unlock(&dct_g.reload_lock);
  }
  return 0;
}

static dct_parsed_t g_scratch; /* parse output (reload_lock) */

static void reload_failed(const char* path, const char* msg) {
  atomic_fetch_add(&dct_g.reload_errors, 1);
  char buf[DCT_ERR_MAX];
  snprintf(buf, sizeof buf, "%.200s: %.280s", path, msg);
  pthread_mutex_lock(&dct_g.ctl);
  dct_set_error(buf);
  uint64_t keep = atomic_load(&dct_g.staged_version);
  pthread_mutex_unlock(&dct_g.ctl);
  if (!dct_g.error_streak) /* log once per streak of bad files; every one is counted */
    DCT_WARN("DynamICCL tuner: rejected config %s; keeping version %llu (further errors are counted, not logged)",
             buf, (unsigned long long)keep);
  dct_g.error_streak = 1;
}

/* A config changes how every collective of the job runs: only this user's or root's file, and
   one nobody else can write, is read (a file planted by another user in a shared directory is not). */
static int trusted_file(const struct stat* st, char* why, size_t cap) {
  if (st->st_uid != geteuid() && st->st_uid != 0) {
    snprintf(why, cap, "owned by uid %u, not by this job's user (uid %u) or root; refusing it",
             (unsigned)st->st_uid, (unsigned)geteuid());
    return 0;
  }
  if (st->st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(why, cap, "writable by group or others (mode %o); refusing it", (unsigned)(st->st_mode & 0777));
    return 0;
  }
  return 1;
}

/* The default path's directory: another user's (or a group/other-writable) directory could hold a
   planted config, so it is refused (counted once per streak, like a bad file). Missing: no config yet. */
static int g_dir_refused;
static int default_dir_ok(const char* path) {
  char dir[DCT_PATH_MAX], why[DCT_ERR_MAX - 64];
  snprintf(dir, sizeof dir, "%s", path);
  char* slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  if (dynamiccl_check_private_dir(dir, why, sizeof why) == 0 || strstr(why, "does not exist")) {
    g_dir_refused = 0;
    return 1;
  }
  if (!g_dir_refused) {
    char msg[DCT_ERR_MAX];
    snprintf(msg, sizeof msg, "directory %.400s; refusing the default config (set DYNAMICCL_TUNER_CONFIG)", why);
    reload_failed(path, msg);
  }
  g_dir_refused = 1;
  return 0;
}

static int blank(const char* buf, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (buf[i] != ' ' && buf[i] != '\t' && buf[i] != '\n' && buf[i] != '\r') return 0;
  return 1;
}

DCT_EXPORT int dynamiccl_tuner_reload(void) {
  char path[DCT_PATH_MAX];
  pthread_mutex_lock(&dct_g.reload_lock);
  pthread_mutex_lock(&dct_g.ctl);
  memcpy(path, dct_g.path, sizeof path);
  int check_dir = g_default_path;
  pthread_mutex_unlock(&dct_g.ctl);
  if (check_dir && !default_dir_ok(path)) {
    pthread_mutex_unlock(&dct_g.reload_lock);
    return -1;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) {
      if (dct_g.had_file) {
        atomic_fetch_add(&dct_g.files_missing, 1);
        if (!dct_g.missing_logged)
          DCT_WARN("DynamICCL tuner: config %s disappeared; keeping version %llu", path,
                   (unsigned long long)atomic_load(&dct_g.staged_version));
        dct_g.missing_logged = 1;
      }
      dct_g.have_ident = 0;
      pthread_mutex_unlock(&dct_g.reload_lock);
      return 0;
    }
    if (!dct_g.have_ident || dct_g.ino != 0) { /* count each new failure once, not every poll */
      reload_failed(path, strerror(e));
      dct_g.have_ident = 1;
      dct_g.ino = 0;
      dct_g.size = -1;
    }
    pthread_mutex_unlock(&dct_g.reload_lock);
    return -1;
  }
  struct stat st;
  char why[DCT_ERR_MAX] = "";
  memset(&st, 0, sizeof st);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !trusted_file(&st, why, sizeof why)) {
    close(fd);
    if (!dct_g.have_ident || dct_g.ino != st.st_ino || dct_g.mtim.tv_nsec != st.st_mtim.tv_nsec) /* once per file */
      reload_failed(path, S_ISREG(st.st_mode) ? why : "not a regular file");
    dct_g.have_ident = 1;
    dct_g.ino = st.st_ino;
    dct_g.mtim = st.st_mtim;
    dct_g.size = -1; /* never "the same file" as a good one */
    pthread_mutex_unlock(&dct_g.reload_lock);
    return -1;
  }
  dct_g.missing_logged = 0;
  int same_ident = dct_g.have_ident && st.st_dev == dct_g.dev && st.st_ino == dct_g.ino &&
                   st.st_size == dct_g.size && st.st_mtim.tv_sec == dct_g.mtim.tv_sec &&
                   st.st_mtim.tv_nsec == dct_g.mtim.tv_nsec;
  if (same_ident && !dct_g.racy) {
    close(fd);
    pthread_mutex_unlock(&dct_g.reload_lock);
    return 0;
  }
  int rc = -1;
  char err[DCT_ERR_MAX];
  char* buf = NULL;
  if (st.st_size > DCT_MAX_FILE_BYTES) {
    snprintf(err, sizeof err, "file is %lld bytes, at most %d", (long long)st.st_size, DCT_MAX_FILE_BYTES);
    goto fail_ident;
  }
  buf = malloc((size_t)st.st_size + 1);
  if (buf == NULL) {
    snprintf(err, sizeof err, "out of memory");
    goto fail_ident;
  }
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  if (got != (size_t)st.st_size) {
    snprintf(err, sizeof err, "short read (%zu of %lld bytes)", got, (long long)st.st_size);
    goto fail_ident;
  }
  buf[got] = '\0';
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < got; i++) h = (h ^ (uint8_t)buf[i]) * 1099511628211ull;
  uint64_t mt = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
  uint64_t now = dct_now_ns();
  int racy = now < mt || now - mt < DCT_RACY_NS;
  int same_content = dct_g.have_ident && h == dct_g.content_hash && st.st_size == dct_g.size;
  dct_g.have_ident = 1;
  dct_g.dev = st.st_dev;
  dct_g.ino = st.st_ino;
  dct_g.size = st.st_size;
  dct_g.mtim = st.st_mtim;
  dct_g.content_hash = h;
  dct_g.racy = racy;
  dct_g.had_file = 1;
  if (same_ident && same_content) { /* a racy re-read that found the same bytes */
    free(buf);
    close(fd);
    pthread_mutex_unlock(&dct_g.reload_lock);
    return 0;
  }
  if (blank(buf, got)) { /* a truncate-then-crash: not "no config", which would revert every rank */
    snprintf(err, sizeof err, "empty file (a truncated write?)");
    goto fail;
  }
  if (dct_parse(buf, got, &g_scratch, err, sizeof err) != 0) goto fail;
  pthread_mutex_lock(&dct_g.ctl);
  rc = dct_stage(&g_scratch, err, sizeof err);
  if (rc == 0) dct_g.last_error[0] = '\0';
  pthread_mutex_unlock(&dct_g.ctl);
  if (rc != 0) goto fail;
  atomic_fetch_add(&dct_g.reloads, 1);
  if (dct_g.error_streak) DCT_INFO("DynamICCL tuner: config %s is valid again", path);
  dct_g.error_streak = 0;
  DCT_INFO("DynamICCL tuner: loaded %s: %d versions, newest %llu", path, g_scratch.n,
           (unsigned long long)atomic_load(&dct_g.staged_version));
  free(buf);
  close(fd);
  pthread_mutex_unlock(&dct_g.reload_lock);
  return 1;
fail_ident: /* do not retry an unreadable file of this identity on every poll */
  dct_g.have_ident = 1;
  dct_g.dev = st.st_dev;
  dct_g.ino = st.st_ino;
  dct_g.size = st.st_size;
  dct_g.mtim = st.st_mtim;
  dct_g.content_hash = 0;
  dct_g.racy = 0;
  dct_g.had_file = 1;
fail:
  free(buf);
  close(fd);
  reload_failed(path, err);
  pthread_mutex_unlock(&dct_g.reload_lock);
  return -1;
}

