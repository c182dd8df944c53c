/* DynamICCL tuner plugin: control functions exported next to ncclTunerPlugin_v7/_v6/_v5/_v4.
 *
 * Not part of NCCL's ABI. Reached with dlopen(path, RTLD_NOLOAD) + dlsym from the same process:
 * the PyTorch agreement hook (nccl_tuner_plugin/sync.py, via ctypes), the profiler plugin
 * (applied version in every record) and the simulator (simulator/tuner_abi.py).
 *
 * None of these run on NCCL's hot path except dynamiccl_tuner_config_version(), which is a
 * single atomic load (the profiler calls it once per collective record).
 *
 * Versions: the config file holds up to DCT_MAX_VERSIONS versions, newest last. "Staged" = the
 * versions of the last good file; "applied" = the one getCollInfo uses (0 = none: NCCL's own
 * choice). How staged becomes applied depends on the apply mode (DYNAMICCL_TUNER_APPLY):
 *   agree      (default) only dynamiccl_tuner_apply_version(v), called by the agreement hook with
 *              the same v on every rank at the same point of the collective sequence;
 *   epoch      a version line `version N at T` becomes applied at the first getCollInfo at or
 *              after unix time T ns (no hook; see README for the failure modes);
 *   immediate  the newest staged version as soon as it is loaded (single-rank jobs, tests).
 */
#ifndef DYNAMICCL_TUNER_H_
#define DYNAMICCL_TUNER_H_

#include <stddef.h>
#include <stdint.h>

#define DCT_MODE_AGREE 0
#define DCT_MODE_EPOCH 1
#define DCT_MODE_IMMEDIATE 2

/* Bumped when a function or the stats layout below changes. */
#define DYNAMICCL_TUNER_CONTROL_ABI 1

/* Counters and state (all uint64, 256 bytes; mirrored by ctypes in simulator/tuner_abi.py). */
typedef struct {
  uint64_t control_abi;      /* DYNAMICCL_TUNER_CONTROL_ABI */
  uint64_t mode;             /* DCT_MODE_* */
  uint64_t staged_version;   /* newest version of the last good file (0: none) */
  uint64_t oldest_version;   /* oldest version of the last good file (0: none) */
  uint64_t applied_version;  /* version getCollInfo uses (0: NCCL's choice) */
  uint64_t pending_version;  /* epoch mode: the version waiting for its time (0: none) */
  uint64_t pending_at_ns;    /* epoch mode: its time */
  uint64_t reloads;          /* good files loaded (a changed file that parsed) */
  uint64_t reload_errors;    /* bad files rejected (the last good config stays) */
  uint64_t files_missing;    /* polls that found no file (after one had been loaded) */
  uint64_t applies;          /* successful dynamiccl_tuner_apply_version / automatic switches */
  uint64_t apply_refused;    /* apply of a version that is not staged */
  uint64_t epoch_late;       /* epoch mode: a version loaded after its time (applied late) */
  uint64_t contexts;         /* live communicator contexts */
  uint64_t calls;            /* getCollInfo calls */
  uint64_t decisions;        /* calls where a rule set a cell to 0 */
  uint64_t no_enabled_cell;  /* a rule matched but every cell it allows was -1 (NCCL's choice kept) */
  uint64_t chunk_set;        /* getChunkSize calls that changed the chunk */
  uint64_t lookup_retries;   /* seqlock retries (a table slot recycled during a lookup) */
  uint64_t slots_exhausted;  /* reloads refused for lack of a free table slot */
  uint64_t reserved[12];
} dynamiccl_tuner_stats_t;

/* Override the environment (call before the first init to take effect for it; later calls apply
   at the next poll). path NULL keeps the current/env path; mode < 0 and poll_ms < 0 keep theirs.
   poll_ms 0 = no background thread: the file is read only by dynamiccl_tuner_reload(). */
int dynamiccl_tuner_configure(const char* path, int mode, int poll_ms);
/* Read the file now if it changed (stat: inode, size, mtime). Returns 1 loaded a new config,
   0 unchanged or absent, -1 rejected (the last good config stays; see last_error). Runs on the
   caller's thread: never call it from NCCL's threads. */
int dynamiccl_tuner_reload(void);
/* Newest and oldest staged version (0 when nothing is staged). */
uint64_t dynamiccl_tuner_staged_version(void);
uint64_t dynamiccl_tuner_oldest_version(void);
/* Is version v staged (v == 0: always)? */
int dynamiccl_tuner_has_version(uint64_t version);
/* Pin `version` so that a concurrent reload cannot drop it before dynamiccl_tuner_apply_version.
   Returns 1 if it is usable here (v == 0, staged, or the applied one), else 0 (and unpins). The
   agreement hook calls it between its two all-reduces. */
int dynamiccl_tuner_prepare_version(uint64_t version);
/* Make `version` the applied one (0 = NCCL's choice). Returns 0, or -1 if it is neither staged,
   prepared nor applied (nothing changes). Agree mode only. Clears the prepare pin. */
int dynamiccl_tuner_apply_version(uint64_t version);
uint64_t dynamiccl_tuner_applied_version(void);
/* For the profiler plugin: the applied version for communicator comm_hash (saturated to 32 bits).
   The applied version is process-wide today; comm_hash is reserved for per-communicator scopes.
   Lock-free, allocation-free, no syscall. */
uint32_t dynamiccl_tuner_config_version(uint64_t comm_hash);
/* What the profiler stamps on a record: dynamiccl_tuner_config_version, except 0 when NCCL loaded
   this tuner as v4 (no communicator id) and the applied version has communicator-specific rules,
   which v4 cannot match, so the version is not applied there. Lock-free, allocation-free. */
uint32_t dynamiccl_tuner_record_version(uint64_t comm_hash);
void dynamiccl_tuner_stats(dynamiccl_tuner_stats_t* out);
/* Copy the last error message (empty if none) into buf; returns its length. */
size_t dynamiccl_tuner_last_error(char* buf, size_t len);

#endif /* DYNAMICCL_TUNER_H_ */
