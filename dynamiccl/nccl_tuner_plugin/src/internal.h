/* DynamICCL tuner plugin: shared internal declarations (not part of any ABI). */
#ifndef DYNAMICCL_TUNER_INTERNAL_H_
#define DYNAMICCL_TUNER_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "dynamiccl_tuner.h"
#include "nccl_tuner_abi.h"

#define DCT_PLUGIN_NAME "dynamiccl"
#define DCT_EXPORT __attribute__((visibility("default")))

/* ---- limits (nccl_tuner_plugin/config.py holds the same numbers; a test compares) ---- */
#define DCT_MAX_RULES 256         /* per version */
#define DCT_MAX_VERSIONS 8        /* per file */
#define DCT_MAX_FILE_BYTES (1 << 20)
/* Format 2 (contracts/tuner_file.py): a file starting with this line must end with
   "# end lines=K crc32=XXXXXXXX" (K lines before it, zlib CRC-32 of every byte before it). */
#define DCT_HEADER_V2 "# dynamiccl tuner config format=2"
#define DCT_MAX_CHANNELS 64       /* NCCL MAXCHANNELS */
#define DCT_NFUNC 6               /* Broadcast Reduce AllGather ReduceScatter AllReduce AllToAll */
/* Table slots: the staged versions, the next file's new versions, applied and pending. */
#define DCT_NSLOTS (3 * DCT_MAX_VERSIONS + 2)
#define DCT_SLOT_GRACE_MS 50      /* a retired slot is reused after this long when possible */
#define DCT_LOOKUP_MAX_RETRIES 64
/* A file modified this recently may be rewritten within the file system's timestamp granularity
   with the same size and a recycled inode: identity alone cannot prove it unchanged, so it is
   re-read and its content hash compared until it is older than this. */
#define DCT_RACY_NS 50000000ull

/* ---- defaults (documented in README.md; a test compares) ---- */
/* default config path: the per-user, per-job rule of dynamiccl/contracts/dynamiccl_paths.h ("tuner", "conf") */
#define DCT_DEFAULT_POLL_MS 100
#define DCT_MAX_POLL_MS 60000
#define DCT_PATH_MAX 4096
#define DCT_ERR_MAX 512

/* One rule, normalised. algo/proto -1 = any. func is the internal index (dct_func_index). */
typedef struct {
  uint64_t min_bytes;
  uint64_t max_bytes;
  uint64_t chunk;
  uint64_t comm;
  int8_t algo;
  int8_t proto;
  uint8_t nch;
  uint8_t any_comm;
  uint8_t func;
  uint8_t pad_[3];
} dct_rule_t;

#define DCT_MAX_BND (2 * DCT_MAX_RULES + DCT_NFUNC) /* interval boundaries per version */
#define DCT_NO_RULE 0xffff

/* One version: its rules grouped by function (file order kept inside a function, so "first
   matching rule wins" holds), rules[func_start[f] .. func_start[f+1]) for function f.
   Byte-range index per function f: the sorted rule boundaries bnd[bnd_start[f] .. bnd_start[f+1])
   (the first is 0) cut the byte axis into intervals no rule edge crosses; first[i] is the first rule
   of f covering interval i, whatever its communicator (DCT_NO_RULE: none). A lookup is a binary
   search, then a scan from first[i] that stops at the first rule whose communicator matches. */
typedef struct {
  uint64_t version;
  uint64_t apply_at_ns;     /* `version N at T`: epoch mode switches at unix time T ns (0: none) */
  uint32_t n_rules;
  uint32_t has_comm_rules;  /* a rule names a communicator: cannot be applied as written under tuner v4 */
  uint16_t func_start[DCT_NFUNC + 1];
  uint16_t bnd_start[DCT_NFUNC + 1];
  dct_rule_t rules[DCT_MAX_RULES];
  uint64_t bnd[DCT_MAX_BND];
  uint16_t first[DCT_MAX_BND];
} dct_version_t;

typedef struct {
  int n;
  dct_version_t v[DCT_MAX_VERSIONS];
} dct_parsed_t;

/* A preallocated table slot. Readers validate with the seqlock `seq` (even = stable); a slot is
   rewritten only when no published tag refers to it. */
typedef struct {
  _Atomic uint64_t seq;
  dct_version_t v;
  /* control side only (under dct_g.ctl) */
  int used;                 /* holds a version that is staged, applied or pending */
  uint64_t retired_ms;
} __attribute__((aligned(64))) dct_slot_t;

/* Published tag: 0 = none, else ((slot + 1) << 48) | slot seq at publication. */
#define DCT_TAG_SEQ_MASK ((UINT64_C(1) << 48) - 1)
#define DCT_TAG(slot, seq) ((((uint64_t)(slot) + 1) << 48) | ((seq) & DCT_TAG_SEQ_MASK))
#define DCT_TAG_SLOT(tag) ((int)((tag) >> 48) - 1)

typedef struct dct_ctx {
  uint64_t comm;
  size_t nranks, nnodes;
  int abi;
  int comm_known;           /* 0 under tuner v4 (init gets no communicator id) */
  /* nBytes of the last getCollInfo per function: getChunkSize looks its rule up by the size
     getCollInfo saw, not the per-channel part NCCL passes it (one writer: NCCL's thread) */
  uint64_t last_bytes[DCT_NFUNC];
  /* hot-path counters: calls on one communicator are serialized by NCCL, so load+store */
  _Atomic uint64_t calls, decisions, no_enabled, chunk_set, retries;
  /* the chained tuner (chain.c): its context and functions, NULL without one */
  void* chain_ctx;
  ncclTunerGetCollInfo_t chain_coll;
  ncclResult_t (*chain_chunk)(void*, ncclFunc_t, size_t, int, int, int, size_t*);
  ncclResult_t (*chain_fini)(void*);
  _Atomic uint64_t chain_calls, chain_errors;
  struct dct_ctx* next;
} dct_ctx_t;

/* What NCCL passed to init, whatever the ABI version (constants: v5/v6 or v7 layout by abi). */
typedef struct {
  int abi;
  uint64_t comm;
  size_t nranks, nnodes;
  ncclDebugLogger_t logfn;
  void* nvl;
  void* constants;
} dct_init_args_t;

typedef struct {
  /* control state */
  pthread_mutex_t ctl;           /* slots bookkeeping, staged set, path, mode (never on the hot path) */
  pthread_mutex_t reload_lock;   /* one reload at a time */
  pthread_mutex_t lifecycle;     /* init/finalize, context registry, thread start/stop */
  dct_slot_t* slots;             /* dct_slot_storage[DCT_NSLOTS] (zero-initialised: .bss, not in the file) */
  _Atomic uint64_t applied_tag;
  _Atomic uint64_t pending_tag;  /* epoch mode */
  _Atomic uint64_t applied_version;
  _Atomic uint64_t staged_version, oldest_version, pending_version, pending_at_ns;
  int staged[DCT_MAX_VERSIONS];  /* slot indices, ascending versions */
  int n_staged;
  int prepared;                  /* slot pinned by dynamiccl_tuner_prepare_version (-1: none) */
  uint64_t high_water;           /* newest version ever staged: files may never go below it */
  char path[DCT_PATH_MAX];
  int mode;
  int poll_ms;
  int overrides;                 /* bit 0 path, 1 mode, 2 poll (set by dynamiccl_tuner_configure) */
  int env_loaded;
  /* identity of the last file read (reload_lock) */
  int have_ident;
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtim;
  uint64_t content_hash;         /* FNV-1a of the last file read */
  int racy;                      /* the last file was read within DCT_RACY_NS of its mtime */
  int had_file;
  int missing_logged;
  int error_streak;
  char last_error[DCT_ERR_MAX];  /* under ctl */
  /* counters */
  _Atomic uint64_t reloads, reload_errors, files_missing, applies, apply_refused, epoch_late, slots_exhausted;
  _Atomic uint64_t f_calls, f_decisions, f_no_enabled, f_chunk_set, f_retries; /* finalized contexts */
  _Atomic uint64_t f_chain_calls, f_chain_errors;
  /* lifecycle */
  ncclDebugLogger_t logfn;
  int refcount;
  dct_ctx_t* ctxs;
  pthread_t thread;
  int thread_running;
  int stop_requested;
  pthread_cond_t wake;
} dct_global_t;

extern dct_global_t dct_g;
extern dct_slot_t dct_slot_storage[DCT_NSLOTS];

/* rules.c */
int dct_func_index(int ncclFunc);
/* Parse a whole file. Returns 0, or -1 with a message naming the line in err. */
int dct_parse(const char* text, size_t len, dct_parsed_t* out, char* err, size_t errlen);

/* chain.c: DYNAMICCL_TUNER_CHAIN (load/unload under lifecycle, at the first init / last finalize) */
void dct_chain_load(void);
void dct_chain_unload(void);
void dct_chain_init(dct_ctx_t* ctx, const dct_init_args_t* args);
void dct_chain_fini(dct_ctx_t* ctx);

/* control.c */
void dct_env_load(void);                 /* caller holds lifecycle */
/* control.c, for the reload (reload.c): ctl lock held */
void dct_set_error(const char* msg);
int dct_stage(const dct_parsed_t* p, char* err, size_t errlen); /* 0, or -1 with err (nothing changes) */
int dct_thread_start(void);              /* caller holds lifecycle */
void dct_thread_stop(void);              /* caller holds lifecycle */
uint64_t dct_now_ns(void);               /* CLOCK_REALTIME */
uint64_t dct_monotonic_ms(void);
const char* dct_mode_name(int mode);

#define DCT_LOG(level, ...)                                                                 \
  do {                                                                                       \
    ncclDebugLogger_t fn_ = dct_g.logfn;                                                     \
    if (fn_) fn_(level, NCCL_TUNING, __FILE__, __LINE__, __VA_ARGS__);                       \
  } while (0)
#define DCT_WARN(...) DCT_LOG(NCCL_LOG_WARN, __VA_ARGS__)
#define DCT_INFO(...) DCT_LOG(NCCL_LOG_INFO, __VA_ARGS__)

#endif /* DYNAMICCL_TUNER_INTERNAL_H_ */
