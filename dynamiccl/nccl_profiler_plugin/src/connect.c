/* DynamICCL profiler plugin: the sender's transport. Unix and TCP connects (non-blocking, bounded),
 * collector name resolution that never blocks a path finalize waits for, and a bounded write.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"

static int wait_fd(int fd, short events, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = events};
  for (;;) {
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0 ? 0 : -1;
  }
}

int dccl_connect_unix(const char* path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  size_t n = strnlen(path, sizeof a.sun_path - 1); /* validated < 108 at init */
  memcpy(a.sun_path, path, n);
  if (connect(fd, (struct sockaddr*)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* ---- collector address resolution: once, never on a path finalize waits for ----
 * A name is resolved by a detached thread (getaddrinfo has no timeout); the sender only reads the
 * result. The library pins itself in memory first (RTLD_NODELETE) so that a resolver still waiting
 * on DNS when NCCL unloads the plugin returns into mapped code. Numeric addresses need no thread. */
#define DCCL_MAX_ADDRS 4
enum { DCCL_RES_NONE, DCCL_RES_RUNNING, DCCL_RES_DONE, DCCL_RES_FAILED };
static struct {
  pthread_mutex_t mu;
  int state;
  int n;
  struct sockaddr_storage addr[DCCL_MAX_ADDRS];
  socklen_t len[DCCL_MAX_ADDRS];
  int family[DCCL_MAX_ADDRS];
  char host[DCCL_ADDR_MAX], port[16];
} dccl_res = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int split_hostport(const char* hostport, char* host, size_t cap, char* port, size_t pcap) {
  memset(host, 0, cap);
  memcpy(host, hostport, strnlen(hostport, cap - 1));
  char* colon = strrchr(host, ':');
  if (colon == NULL || strlen(colon + 1) >= pcap) return -1;
  *colon = '\0';
  snprintf(port, pcap, "%s", colon + 1);
  if (host[0] == '[' && colon > host + 1 && colon[-1] == ']') { /* [v6addr]:port */
    colon[-1] = '\0';
    memmove(host, host + 1, strlen(host));
  }
  return 0;
}

/* Store up to DCCL_MAX_ADDRS results (caller holds dccl_res.mu). */
static void res_store(struct addrinfo* res) {
  dccl_res.n = 0;
  for (struct addrinfo* ai = res; ai && dccl_res.n < DCCL_MAX_ADDRS; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof dccl_res.addr[0]) continue;
    memcpy(&dccl_res.addr[dccl_res.n], ai->ai_addr, ai->ai_addrlen);
    dccl_res.len[dccl_res.n] = ai->ai_addrlen;
    dccl_res.family[dccl_res.n] = ai->ai_family;
    dccl_res.n++;
  }
  dccl_res.state = dccl_res.n > 0 ? DCCL_RES_DONE : DCCL_RES_FAILED;
}

static void* resolver_main(void* arg) {
  (void)arg;
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(dccl_res.host, dccl_res.port, &hints, &res);
  pthread_mutex_lock(&dccl_res.mu);
  if (rc == 0) res_store(res);
  else dccl_res.state = DCCL_RES_FAILED;
  pthread_mutex_unlock(&dccl_res.mu);
  if (res) freeaddrinfo(res);
  return NULL;
}

/* Keep this library mapped for the life of the process (a detached resolver may outlive finalize). */
static int pin_library(void) {
  Dl_info info;
  if (dladdr((void*)&resolver_main, &info) == 0 || info.dli_fname == NULL) return -1;
  return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) ? 0 : -1;
}

/* Start resolving (numeric addresses at once); returns the state. Never blocks on DNS. */
static int resolve_collector(const char* hostport) {
  pthread_mutex_lock(&dccl_res.mu);
  int state = dccl_res.state;
  if (state == DCCL_RES_NONE || state == DCCL_RES_FAILED) {
    if (split_hostport(hostport, dccl_res.host, sizeof dccl_res.host, dccl_res.port, sizeof dccl_res.port) != 0) {
      state = dccl_res.state = DCCL_RES_FAILED;
    } else {
      struct addrinfo hints, *res = NULL;
      memset(&hints, 0, sizeof hints);
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
      if (getaddrinfo(dccl_res.host, dccl_res.port, &hints, &res) == 0) { /* no DNS involved */
        res_store(res);
        freeaddrinfo(res);
      } else {
        pthread_t t;
        pthread_attr_t attr;
        dccl_res.state = DCCL_RES_FAILED;
        if (pin_library() == 0 && pthread_attr_init(&attr) == 0) {
          pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
          if (pthread_create(&t, &attr, resolver_main, NULL) == 0) dccl_res.state = DCCL_RES_RUNNING;
          pthread_attr_destroy(&attr);
        }
      }
      state = dccl_res.state;
    }
  }
  pthread_mutex_unlock(&dccl_res.mu);
  return state;
}

int dccl_connect_tcp(const char* hostport) {
  if (resolve_collector(hostport) != DCCL_RES_DONE) return -1; /* not yet (or failed): retry with backoff */
  struct sockaddr_storage addr[DCCL_MAX_ADDRS];
  socklen_t len[DCCL_MAX_ADDRS];
  int family[DCCL_MAX_ADDRS], n;
  pthread_mutex_lock(&dccl_res.mu);
  n = dccl_res.n;
  memcpy(addr, dccl_res.addr, sizeof addr);
  memcpy(len, dccl_res.len, sizeof len);
  memcpy(family, dccl_res.family, sizeof family);
  pthread_mutex_unlock(&dccl_res.mu);
  int fd = -1;
  for (int i = 0; i < n; i++) {
    fd = socket(family[i], SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int ok = connect(fd, (struct sockaddr*)&addr[i], len[i]) == 0;
    if (!ok && errno == EINPROGRESS && wait_fd(fd, POLLOUT, DCCL_CONNECT_TIMEOUT_MS) == 0) {
      int soerr = 0;
      socklen_t len = sizeof soerr;
      ok = getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0;
    }
    if (ok) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      break;
    }
    close(fd);
    fd = -1;
  }
  return fd;
}

/* Write all of buf within timeout_ms. MSG_NOSIGNAL: a closed peer gives EPIPE, not SIGPIPE. */
int dccl_send_all(int fd, const uint8_t* buf, size_t len, int timeout_ms) {
  uint64_t deadline = dccl_monotonic_ms() + (uint64_t)timeout_ms;
  while (len > 0) {
    ssize_t w = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      buf += w;
      len -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      uint64_t now = dccl_monotonic_ms();
      if (now >= deadline || wait_fd(fd, POLLOUT, (int)(deadline - now)) != 0) return -1;
      continue;
    }
    return -1;
  }
  return 0;
}
