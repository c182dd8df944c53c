/* DynamICCL profiler plugin: the per-process sender thread.
 *
 * Drains the record ring every DYNAMICCL_FLUSH_MS, batches records into frames and writes them
 * to the collector over a non-blocking Unix or TCP socket with bounded send time (connect.c: a TCP
 * name is resolved once, off the sender's path, so finalize never waits for DNS); a token, if configured,
 * opens every connection; undelivered records are logged once and summed up at finalize. Reconnects
 * with exponential backoff; every (re)connect starts with a PROCESS record and one COMM record
 * per live communicator. Also reaps stale slots and sends a STATS record about once a second.
 * NCCL threads never wait for it: when it cannot keep up, the ring fills and records are
 * dropped and counted on the producer side.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"
#include "../../contracts/dynamiccl_paths.h"

typedef struct {
  int fd;
  int ever_connected;
  uint64_t next_connect_ms;
  uint64_t backoff_ms;
  uint64_t last_stats_ms;
  uint64_t conn_id; /* 1, 2, ... per successful connect */
  uint8_t* buf; /* frame header + DCCL_MAX_RECORDS_PER_FRAME records */
  uint32_t n;       /* records in the frame being built */
  uint32_t n_data;  /* of which COLL/P2P records from the ring */
  uint64_t next_tuner_link_ms; /* next attempt to find the DynamICCL tuner (plugin.c) */
  int warned_undelivered;      /* "cannot deliver" logged (once per process) */
  dccl_stale_guard_t guard;    /* stale_guard.h: applied to every record taken from the ring */
} sender_t;

/* ---- per-job token: DYNAMICCL_TOKEN_FILE (owned by this user, mode 600) or DYNAMICCL_TOKEN ----
 * Sent in the auth preamble before the first frame of every connection (collector/auth.py). */
#define DCCL_AUTH_MAGIC 0x55414344u
#define DCCL_TOKEN_MAX 512
static uint8_t dccl_preamble[8 + DCCL_TOKEN_MAX];
static size_t dccl_preamble_len; /* 0: no token */

static size_t read_token_file(const char* path, char* out, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    DCCL_WARN("DynamICCL profiler: DYNAMICCL_TOKEN_FILE %s: %s; connecting without a token", path, strerror(errno));
    if (fd >= 0) close(fd);
    return 0;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    DCCL_WARN("DynamICCL profiler: DYNAMICCL_TOKEN_FILE %s must belong to this user and not be readable by "
              "others (chmod 600); connecting without a token", path);
    close(fd);
    return 0;
  }
  ssize_t n = read(fd, out, cap);
  close(fd);
  size_t len = n > 0 ? (size_t)n : 0;
  while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == '\r' || out[len - 1] == ' ')) len--;
  return len;
}

static void load_token(void) {
  char token[DCCL_TOKEN_MAX + 1];
  size_t len = 0;
  const char* path = getenv("DYNAMICCL_TOKEN_FILE");
  const char* env = getenv("DYNAMICCL_TOKEN");
  if (path && *path) len = read_token_file(path, token, DCCL_TOKEN_MAX);
  else if (env && *env) memcpy(token, env, len = strnlen(env, DCCL_TOKEN_MAX));
  dccl_preamble_len = 0;
  if (len == 0) return;
  uint32_t magic = DCCL_AUTH_MAGIC;
  uint16_t version = 1, n16 = (uint16_t)len;
  memcpy(dccl_preamble, &magic, 4);
  memcpy(dccl_preamble + 4, &version, 2);
  memcpy(dccl_preamble + 6, &n16, 2);
  memcpy(dccl_preamble + 8, token, len);
  dccl_preamble_len = 8 + len;
}

/* ---- where to send: DYNAMICCL_COLLECTOR, else the per-user, per-job default socket ----
 * The default lives in a directory the collector creates 0700; a directory another user owns or can
 * write is refused (a squatter would receive the job's records), logged once, records counted. */
static char dccl_addr[DCCL_ADDR_MAX + 8];
static int dccl_addr_unsafe; /* the default directory failed the ownership/mode check */

static void resolve_address(void) {
  const char* env = getenv("DYNAMICCL_COLLECTOR");
  int use_default = !(env && *env) && strcmp(dccl_g.cfg.collector, DCCL_DEFAULT_COLLECTOR) == 0;
  char path[sizeof(((struct sockaddr_un*)0)->sun_path)];
  dccl_addr_unsafe = 0;
  if (!use_default || dynamiccl_default_path(path, sizeof path, "collector", "sock") != 0) {
    snprintf(dccl_addr, sizeof dccl_addr, "%s", dccl_g.cfg.collector);
    return;
  }
  snprintf(dccl_addr, sizeof dccl_addr, "unix:%s", path);
}

/* 0 when the default socket's directory may be used now (checked before every connect). */
static int address_dir_ok(char* err, size_t errlen) {
  if (strcmp(dccl_addr, dccl_g.cfg.collector) == 0) return 0; /* explicitly configured: the user's choice */
  char dir[sizeof dccl_addr];
  snprintf(dir, sizeof dir, "%s", dccl_addr + 5);
  char* slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  if (dynamiccl_check_private_dir(dir, err, errlen) == 0) return 0;
  return strstr(err, "does not exist") ? 1 : -1; /* 1: no collector yet (not unsafe) */
}

/* Records that could not be delivered: logged once, then only counted (summary at finalize). */
static void note_undelivered(sender_t* s, const char* why) {
  if (s->warned_undelivered) return;
  s->warned_undelivered = 1;
  DCCL_WARN("DynamICCL profiler: cannot deliver records to the collector at %s (%s); they are counted as "
            "undelivered (logged once; totals at finalize)", dccl_addr, why);
}

static void sender_close(sender_t* s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  s->backoff_ms = DCCL_RECONNECT_MIN_MS;
  s->next_connect_ms = dccl_monotonic_ms() + s->backoff_ms;
}


static void frame_flush(sender_t* s, int timeout_ms) {
  if (s->n == 0) return;
  if (s->fd >= 0) {
    dccl_frame_header_t* h = (dccl_frame_header_t*)s->buf;
    *h = (dccl_frame_header_t){.magic = DCCL_WIRE_MAGIC, .version = DCCL_WIRE_VERSION,
                               .record_size = DCCL_RECORD_SIZE, .n_records = s->n, .flags = 0};
    if (dccl_send_all(s->fd, s->buf, sizeof *h + (size_t)s->n * DCCL_RECORD_SIZE, timeout_ms) == 0) {
      atomic_fetch_add(&dccl_g.records_sent, s->n_data);
    } else {
      DCCL_INFO("DynamICCL profiler: lost the collector connection (%s); reconnecting", strerror(errno));
      sender_close(s);
      atomic_fetch_add(&dccl_g.records_undelivered, s->n_data);
      note_undelivered(s, "connection lost");
    }
  } else {
    atomic_fetch_add(&dccl_g.records_undelivered, s->n_data);
    if (s->n_data) note_undelivered(s, "not connected");
  }
  s->n = 0;
  s->n_data = 0;
}

static inline void* frame_slot(sender_t* s, int timeout_ms) {
  if (s->n == DCCL_MAX_RECORDS_PER_FRAME) frame_flush(s, timeout_ms);
  void* p = s->buf + sizeof(dccl_frame_header_t) + (size_t)s->n * DCCL_RECORD_SIZE;
  s->n++;
  memset(p, 0, DCCL_RECORD_SIZE);
  return p;
}

static void copy_str(char* dst, size_t cap, const char* src) {
  memset(dst, 0, cap); /* NUL padded; a value of exactly `cap` bytes has no terminator */
  if (src) memcpy(dst, src, strnlen(src, cap));
}

static const char* job_id(void) {
  static const char* const vars[] = {"DYNAMICCL_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char* v = getenv(vars[i]);
    if (v && *v) return v;
  }
  return "unknown";
}

/* A COMM record for every live communicator not yet announced on this connection (all of them
   right after a connect; a new one after its init). Goes before the data it describes. */
static void announce_comms(sender_t* s) {
  if (s->fd < 0) return;
  pthread_mutex_lock(&dccl_g.registry);
  for (dccl_ctx_t* c = dccl_g.ctxs; c; c = c->next) {
    if (c->announced_conn == s->conn_id) continue;
    c->announced_conn = s->conn_id;
    dccl_comm_record_t* r = frame_slot(s, DCCL_SEND_TIMEOUT_MS);
    r->kind = DCCL_KIND_COMM;
    r->pid = c->pid;
    r->comm_hash = c->comm_hash;
    r->rank = c->rank;
    r->nranks = c->nranks;
    r->nnodes = c->nnodes;
    copy_str(r->comm_name, sizeof r->comm_name, c->name);
  }
  pthread_mutex_unlock(&dccl_g.registry);
}

static void add_stats(sender_t* s, int timeout_ms);

/* PROCESS, one COMM per live communicator, then STATS (connection ordinal, sent so far): the first
   frame of every connection. */
static void send_hello(sender_t* s) {
  dccl_process_record_t* p = frame_slot(s, DCCL_SEND_TIMEOUT_MS);
  p->kind = DCCL_KIND_PROCESS;
  p->abi_version = (uint8_t)dccl_g.abi_version;
  p->pid = (uint32_t)getpid();
  p->start_ns = dccl_g.start_ns;
  char host[256] = {0};
  const char* host_override = getenv("DYNAMICCL_HOST"); /* containers, simulated nodes */
  if (host_override && *host_override) copy_str(host, sizeof host - 1, host_override);
  else gethostname(host, sizeof host - 1);
  copy_str(p->host, sizeof p->host, host);
  copy_str(p->job_id, sizeof p->job_id, job_id());
  announce_comms(s);
  add_stats(s, DCCL_SEND_TIMEOUT_MS);
  frame_flush(s, DCCL_SEND_TIMEOUT_MS);
}

static void try_connect(sender_t* s) {
  const char* a = dccl_addr;
  char why[512];
  int dir = strncmp(a, "unix:", 5) == 0 ? address_dir_ok(why, sizeof why) : 0;
  if (dir < 0 && !dccl_addr_unsafe) {
    dccl_addr_unsafe = 1;
    DCCL_WARN("DynamICCL profiler: refusing the default collector socket %s: %s (another user could read this "
              "job's records); remove the directory or set DYNAMICCL_COLLECTOR", a, why);
  }
  int fd = dir != 0 ? -1 : strncmp(a, "unix:", 5) == 0 ? dccl_connect_unix(a + 5) : dccl_connect_tcp(a + 4);
  if (fd < 0) {
    s->next_connect_ms = dccl_monotonic_ms() + s->backoff_ms;
    s->backoff_ms = s->backoff_ms * 2 > DCCL_RECONNECT_MAX_MS ? DCCL_RECONNECT_MAX_MS : s->backoff_ms * 2;
    return;
  }
  if (dccl_preamble_len && dccl_send_all(fd, dccl_preamble, dccl_preamble_len, DCCL_SEND_TIMEOUT_MS) != 0) {
    close(fd);
    s->next_connect_ms = dccl_monotonic_ms() + s->backoff_ms;
    return;
  }
  s->fd = fd;
  s->conn_id++;
  s->backoff_ms = DCCL_RECONNECT_MIN_MS;
  if (s->ever_connected) atomic_fetch_add(&dccl_g.reconnects, 1);
  s->ever_connected = 1;
  DCCL_INFO("DynamICCL profiler: connected to %s", a);
  send_hello(s);
}

/* The collector never writes to us: readable means EOF (collector gone) or junk to discard. */
static void check_peer(sender_t* s) {
  if (s->fd < 0) return;
  char junk[256];
  ssize_t r = recv(s->fd, junk, sizeof junk, MSG_DONTWAIT);
  if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) sender_close(s);
}

/* reserved[0] = this connection's ordinal (1, 2, ...): with records_sent in the STATS that opens every
   connection, a collector that restarted counts what was sent to its predecessor (receivers/continuity.py). */
static void add_stats(sender_t* s, int timeout_ms) {
  dccl_stats_record_t st;
  dccl_stats_snapshot(&st);
  st.reserved[0] = s->conn_id;
  memcpy(frame_slot(s, timeout_ms), &st, sizeof st);
}

/* Move everything in the ring into frames. Returns the number of ring records taken. */
static uint64_t drain(sender_t* s, int timeout_ms) {
  uint64_t total = 0;
  for (;;) {
    if (s->n == DCCL_MAX_RECORDS_PER_FRAME) frame_flush(s, timeout_ms);
    dccl_event_record_t* dst =
        (dccl_event_record_t*)(s->buf + sizeof(dccl_frame_header_t) + (size_t)s->n * DCCL_RECORD_SIZE);
    uint32_t got = dccl_ring_pop(&dccl_g.ring, dst, DCCL_MAX_RECORDS_PER_FRAME - s->n);
    if (got == 0) break;
    for (uint32_t i = 0; i < got; i++)
      if (dccl_stale_guard_check(&s->guard, &dst[i]))
        atomic_fetch_add_explicit(&dccl_g.timing_suspect, 1, memory_order_relaxed);
    s->n += got;
    s->n_data += got;
    total += got;
  }
  return total;
}

static void reap_all(void) {
  uint64_t stale_ns = (uint64_t)dccl_g.cfg.stale_ms * 1000000ull;
  uint64_t now = dccl_now_ns();
  pthread_mutex_lock(&dccl_g.registry);
  for (dccl_ctx_t* c = dccl_g.ctxs; c; c = c->next) dccl_reap_ctx(c, now, stale_ns);
  pthread_mutex_unlock(&dccl_g.registry);
}

/* One line at the end: what was delivered and what was lost, so loss is visible without a collector. */
static void log_summary(const sender_t* s) {
  unsigned long long sent = atomic_load(&dccl_g.records_sent), und = atomic_load(&dccl_g.records_undelivered);
  unsigned long long ring = atomic_load(&dccl_g.records_dropped_ring_full);
  unsigned long long pool = atomic_load(&dccl_g.events_dropped_pool_full);
  DCCL_LOG(und || ring || pool ? NCCL_LOG_WARN : NCCL_LOG_INFO,
           "DynamICCL profiler: finalize: %llu records sent to %s, %llu undelivered, %llu dropped (ring full), "
           "%llu events dropped (pool full)", sent, dccl_addr, und, ring, pool);
  char guard[256];
  dccl_stale_guard_describe(&s->guard, guard, sizeof guard);
  DCCL_INFO("DynamICCL profiler: finalize: %s", guard);
}

static void* sender_main(void* arg) {
  (void)arg;
  sender_t s = {.fd = -1, .backoff_ms = DCCL_RECONNECT_MIN_MS, .last_stats_ms = dccl_monotonic_ms()};
  s.buf = malloc(sizeof(dccl_frame_header_t) + (size_t)DCCL_MAX_RECORDS_PER_FRAME * DCCL_RECORD_SIZE);
  if (s.buf == NULL) return NULL; /* records then pile up in the ring and are counted as ring-full drops */
  dccl_stale_guard_init(&s.guard, dccl_g.cfg.stale_guard_us);
  load_token();
  resolve_address();
  int stop = 0;
  uint64_t wait_ms = 0;
  for (;;) {
    pthread_mutex_lock(&dccl_g.wake_mutex);
    if (!dccl_g.stop_requested && wait_ms > 0) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t ns = (uint64_t)ts.tv_nsec + wait_ms * 1000000ull;
      ts.tv_sec += (time_t)(ns / 1000000000ull);
      ts.tv_nsec = (long)(ns % 1000000000ull);
      pthread_cond_timedwait(&dccl_g.wake_cond, &dccl_g.wake_mutex, &ts);
    }
    stop = dccl_g.stop_requested;
    pthread_mutex_unlock(&dccl_g.wake_mutex);
    if (stop) break;

    if (atomic_load_explicit(&dccl_tsc.on, memory_order_relaxed)) dccl_tsc_anchor();
    check_peer(&s);
    if (s.fd < 0 && dccl_monotonic_ms() >= s.next_connect_ms) try_connect(&s);
    reap_all();
    announce_comms(&s);
    uint64_t taken = drain(&s, DCCL_SEND_TIMEOUT_MS);
    uint64_t now_ms = dccl_monotonic_ms();
    if (now_ms - s.last_stats_ms >= DCCL_STATS_INTERVAL_MS) {
      s.last_stats_ms = now_ms;
      if (s.fd >= 0) add_stats(&s, DCCL_SEND_TIMEOUT_MS);
    }
    frame_flush(&s, DCCL_SEND_TIMEOUT_MS);
    if (!atomic_load_explicit(&dccl_g.tuner_version_fn, memory_order_relaxed) && now_ms >= s.next_tuner_link_ms) {
      s.next_tuner_link_ms = now_ms + DCCL_TUNER_LINK_RETRY_MS;
      dccl_tuner_link();
    }
    /* A ring more than a quarter full after one interval: come back soon instead of dropping. */
    wait_ms = taken > (dccl_g.ring.mask + 1) / 4 ? 1 : dccl_g.cfg.flush_ms;
    /* the TSC clock has no rate yet: the second anchor as soon as it can give one */
    if (atomic_load_explicit(&dccl_tsc.on, memory_order_relaxed) &&
        !atomic_load_explicit(&dccl_tsc.mult, memory_order_relaxed) && wait_ms > DCCL_TSC_MIN_RATE_NS / 1000000 + 1)
      wait_ms = DCCL_TSC_MIN_RATE_NS / 1000000 + 1;
  }

  /* Final flush at the last finalize: bounded, then exit. */
  uint64_t deadline = dccl_monotonic_ms() + DCCL_FINAL_FLUSH_MS;
  check_peer(&s);
  if (s.fd < 0) try_connect(&s);
  announce_comms(&s);
  for (;;) {
    uint64_t now = dccl_monotonic_ms();
    int left = now >= deadline ? 1 : (int)(deadline - now);
    uint64_t taken = drain(&s, left);
    if (taken == 0) {
      if (s.fd >= 0) add_stats(&s, left);
      frame_flush(&s, left);
      break;
    }
    frame_flush(&s, left);
  }
  if (s.fd >= 0) close(s.fd);
  free(s.buf);
  log_summary(&s);
  return NULL;
}

int dccl_sender_start(void) {
#ifdef DCCL_TESTING_NO_SENDER
  return 0; /* unit tests drain the ring themselves */
#endif
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread inherits "all blocked": signals go to NCCL's threads */
  dccl_g.stop_requested = 0;
  int rc = pthread_create(&dccl_g.thread, NULL, sender_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  dccl_g.thread_running = (rc == 0);
  return rc == 0 ? 0 : -1;
}

void dccl_sender_stop(void) {
  if (!dccl_g.thread_running) return;
  pthread_mutex_lock(&dccl_g.wake_mutex);
  dccl_g.stop_requested = 1;
  pthread_cond_signal(&dccl_g.wake_cond);
  pthread_mutex_unlock(&dccl_g.wake_mutex);
  pthread_join(dccl_g.thread, NULL);
  dccl_g.thread_running = 0;
  dccl_g.stop_requested = 0;
}
