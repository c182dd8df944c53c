/* A shared library that runs saved records through the plugin's stale-timestamp guard
 * (src/stale_guard.c) in the order the sender would have taken them, for replays of real runs
 * (tests/nccl_profiler_plugin/guard_replay.py). Built by `make emulator` as test/build/libdccl-guard-replay.so.
 */
#include "../src/stale_guard.c"

/* Applies one process's guard to recs[0..n) in place. Returns the records untimed; *state, *offset_ns
   and *checked describe the guard afterwards. */
__attribute__((visibility("default"))) uint64_t dccl_guard_replay(dccl_event_record_t* recs, uint64_t n,
                                                                   uint32_t tol_us, int* state, int64_t* offset_ns,
                                                                   uint64_t* checked) {
  dccl_stale_guard_t g;
  dccl_stale_guard_init(&g, tol_us);
  for (uint64_t i = 0; i < n; i++) dccl_stale_guard_check(&g, &recs[i]);
  *state = (int)g.state;
  *offset_ns = g.offset_ns;
  *checked = g.checked;
  return g.flagged;
}
