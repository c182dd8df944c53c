/* Profiler unit tests: the stale-timestamp guard (stale_guard.h) and the sender's use of it
   (#included by test_plugin.c after its helpers). Timestamps follow the NCCL 2.28.9 runs: the GPU
   clock 30 us ahead of CLOCK_REALTIME, kernels starting >= 40 us after the enqueue. */
/* ------------------------------------------------------------------------------------------ */

#define SG_T0 1795767949000000000ull /* 2026-11-27, the real runs' wall clock */

/* A GPU-timed COLL record: enqueued at t, GPU start lead ns later (on the GPU's clock), span ns long,
   host stop tail ns after the GPU stop (on the host's clock); the GPU clock is 30 us ahead. */
static dccl_event_record_t sg_rec(uint64_t t, int64_t lead, uint64_t span, int64_t tail) {
  dccl_event_record_t r;
  memset(&r, 0, sizeof r);
  r.kind = DCCL_KIND_COLL;
  r.timing_source = DCCL_TIMING_KERNEL_GPU;
  r.enqueue_ns = t;
  r.gpu_start_ns = (uint64_t)((int64_t)t + lead);
  r.gpu_end_ns = r.gpu_start_ns + span;
  r.cpu_end_ns = (uint64_t)((int64_t)r.gpu_end_ns - 30000 + tail);
  return r;
}

/* DCCL_GUARD_WINDOW healthy records from t on (every 1 ms); returns the next free time. */
static uint64_t sg_learn(dccl_stale_guard_t* g, uint64_t t) {
  for (int i = 0; i < DCCL_GUARD_WINDOW; i++, t += 1000000) {
    dccl_event_record_t r = sg_rec(t, 40000 + 1000 * (i % 7), 20000, 5000 * (i % 5));
    if (dccl_stale_guard_check(g, &r) != 0 || r.flags != 0) return 0;
  }
  return t;
}

static int sg_untimed(const dccl_event_record_t* r) {
  return r->timing_source == DCCL_TIMING_NONE && r->flags == DCCL_FLAG_TIMING_SUSPECT;
}

/* Aligned clocks: a record whose GPU start precedes its enqueue (another kernel's pTimers, short span:
   the order guard and span check pass it), or whose GPU stop follows its host stop, by more than the
   tolerance is untimed and counted; records within the tolerance, already untimed or CPU-timed are not. */
static int test_stale_guard_rule(void) {
  dccl_stale_guard_t g;
  dccl_stale_guard_init(&g, 100);
  uint64_t t = sg_learn(&g, SG_T0);
  /* host stop 30 us before the GPU stop, + 0..20 us: the shortest, -30 us */
  TEST_ASSERT(t != 0 && g.state == DCCL_GUARD_ON && g.offset_ns == -30000,
              "learned: state %d offset %lld", g.state, (long long)g.offset_ns);
  dccl_event_record_t early = sg_rec(t, -237000, 3000, 0);       /* H200 rank 0 record 899: 237 us early */
  dccl_event_record_t late = sg_rec(t, 40000, 20000, -200000);   /* GPU stop 200 us after the host's */
  dccl_event_record_t edge = sg_rec(t, -60000, 3000, -60000);    /* 60 us early / late: within 100 us */
  dccl_event_record_t cpu = sg_rec(t, -50000000, 3000, 0);
  cpu.timing_source = DCCL_TIMING_KERNEL_CPU;
  dccl_event_record_t none = sg_rec(t, -50000000, 3000, 0);
  none.timing_source = DCCL_TIMING_NONE;
  none.flags = DCCL_FLAG_TIMING_SUSPECT; /* the order guard's: counted there, not twice */
  TEST_ASSERT(dccl_stale_guard_check(&g, &early) == 1 && sg_untimed(&early) &&
                  early.gpu_start_ns == t - 237000 && early.gpu_end_ns == t - 234000,
              "early start untimed, pTimers kept: timing %d flags %d", early.timing_source, early.flags);
  TEST_ASSERT(dccl_stale_guard_check(&g, &late) == 1 && sg_untimed(&late), "late stop untimed");
  TEST_ASSERT(dccl_stale_guard_check(&g, &edge) == 0 && edge.timing_source == DCCL_TIMING_KERNEL_GPU &&
                  edge.flags == 0, "within the tolerance kept");
  TEST_ASSERT(dccl_stale_guard_check(&g, &cpu) == 0 && cpu.timing_source == DCCL_TIMING_KERNEL_CPU && cpu.flags == 0,
              "CPU-timed record untouched");
  TEST_ASSERT(dccl_stale_guard_check(&g, &none) == 0 && none.flags == DCCL_FLAG_TIMING_SUSPECT, "no double count");
  TEST_ASSERT(g.flagged == 2 && g.checked == 3, "flagged %llu checked %llu", (unsigned long long)g.flagged,
              (unsigned long long)g.checked);
  char line[256];
  dccl_stale_guard_describe(&g, line, sizeof line);
  TEST_ASSERT(strstr(line, "guard on") && strstr(line, "2 of 3 records untimed"), "%s", line);
  return 0;
}

/* Clocks not aligned (the emulator's simulated pTimers, years from the host clock; a real-time
   simulator's batches paced every 20 ms, so host stops lag by 0..20 ms): the guard turns itself off
   and never touches a record; it never judges the first window; DYNAMICCL_STALE_GUARD_US=0 turns it off. */
static int test_stale_guard_off_unless_aligned(void) {
  dccl_stale_guard_t g;
  dccl_stale_guard_init(&g, 100);
  for (int i = 0; i < DCCL_GUARD_WINDOW; i++) {
    dccl_event_record_t r = sg_rec(SG_T0 + (uint64_t)i * 1000000, 40000, 5000, 0);
    r.gpu_start_ns = 1700000000000000000ull + (uint64_t)i * 10000; /* emulate.c's pTimers */
    r.gpu_end_ns = r.gpu_start_ns + 5000;
    TEST_ASSERT(dccl_stale_guard_check(&g, &r) == 0 && r.flags == 0, "learning never flags");
  }
  TEST_ASSERT(g.state == DCCL_GUARD_OFF, "off after a window of misaligned records: %d", g.state);
  dccl_event_record_t stale = sg_rec(SG_T0, -50000000, 3000, 0);
  TEST_ASSERT(dccl_stale_guard_check(&g, &stale) == 0 && stale.flags == 0 && g.checked == 0, "off: untouched");

  dccl_stale_guard_init(&g, 100);
  for (int i = 0; i < 3 * DCCL_GUARD_WINDOW; i++) {
    int64_t lag = (int64_t)((uint64_t)i * 7919u % 20000u) * 1000; /* 0..20 ms */
    dccl_event_record_t r = sg_rec(SG_T0 + (uint64_t)i * 1000000, 40000, 5000, lag);
    dccl_stale_guard_check(&g, &r);
  }
  TEST_ASSERT(g.state == DCCL_GUARD_OFF && g.fits == 0, "a paced simulator is no wall clock: %d", g.state);

  dccl_stale_guard_init(&g, 100);
  stale = sg_rec(SG_T0, -237000, 3000, 0);
  TEST_ASSERT(dccl_stale_guard_check(&g, &stale) == 0 && stale.flags == 0 && g.state == DCCL_GUARD_LEARNING,
              "the first window is not judged");

  dccl_stale_guard_init(&g, 0);
  TEST_ASSERT(g.state == DCCL_GUARD_OFF && sg_learn(&g, SG_T0) != 0 && g.state == DCCL_GUARD_OFF, "0 = off");
  return 0;
}

/* The GPU clock drifts against CLOCK_REALTIME (the H100 run: 1.1 ms behind, then 20 us more every
   second): each window re-learns the offset and the last two windows' medians give the drift rate, so
   a job with one GPU-timed record a second (a window spans 64 s, 1.3 ms of drift) has nothing flagged
   over 30 windows, and a stale record at the end is still caught. */
static int test_stale_guard_follows_drift(void) {
  dccl_stale_guard_t g;
  dccl_stale_guard_init(&g, 100);
  uint64_t t = SG_T0;
  int64_t drift = 1100000; /* host stop - GPU stop, beyond the 30 us sg_rec puts in */
  for (int i = 0; i < 31 * DCCL_GUARD_WINDOW; i++, t += 1000000000ull, drift += 20000) {
    dccl_event_record_t r = sg_rec(t, 40000 - drift, 20000, drift + 5000 * (i % 5));
    TEST_ASSERT(dccl_stale_guard_check(&g, &r) == 0, "record %d flagged at drift %lld us (offset %lld, %.1f ppm)", i,
                (long long)drift / 1000, (long long)g.offset_ns, g.drift * 1e6);
  }
  TEST_ASSERT(g.state == DCCL_GUARD_ON && g.drift > 19e-6 && g.drift < 21e-6, "drift %.2f ppm", g.drift * 1e6);
  dccl_event_record_t stale = sg_rec(t, -drift - 500000, 3000, drift);
  TEST_ASSERT(dccl_stale_guard_check(&g, &stale) == 1 && g.fits > 200, "stale caught after the drift");
  return 0;
}

/* The sender applies the guard to every record it takes from the ring and counts what it untimed in
   kernel_ch_timing_suspect (STATS); other kinds pass untouched. */
static int test_stale_guard_in_sender_drain(void) {
  clear_env();
  setenv("DYNAMICCL_STALE_GUARD_US", "100", 1);
  void* ctx = init6(0x5A1E, 0, 2);
  TEST_ASSERT(ctx != NULL, "init");
  dccl_event_record_t out[4];
  while (ring_take(out, 4) != 0) {
  }
  sender_t s = {.fd = -1};
  s.buf = malloc(sizeof(dccl_frame_header_t) + (size_t)DCCL_MAX_RECORDS_PER_FRAME * DCCL_RECORD_SIZE);
  TEST_ASSERT(s.buf != NULL, "buffer");
  dccl_stale_guard_init(&s.guard, dccl_g.cfg.stale_guard_us);
  uint64_t t = SG_T0;
  for (int i = 0; i < DCCL_GUARD_WINDOW; i++, t += 1000000) {
    dccl_event_record_t r = sg_rec(t, 40000, 20000, 0);
    dccl_ring_push(&dccl_g.ring, &r);
  }
  dccl_event_record_t stale = sg_rec(t, -7144000, 2000, 0), ok = sg_rec(t + 1000000, 50000, 9000, 0);
  dccl_event_record_t peer = stale;
  peer.kind = DCCL_KIND_PEER;
  dccl_ring_push(&dccl_g.ring, &stale);
  dccl_ring_push(&dccl_g.ring, &peer);
  dccl_ring_push(&dccl_g.ring, &ok);
  uint64_t before = atomic_load(&dccl_g.timing_suspect);
  uint64_t taken = drain(&s, 0);
  const dccl_event_record_t* f = (const dccl_event_record_t*)(s.buf + sizeof(dccl_frame_header_t));
  int rc = 0;
  if (taken != DCCL_GUARD_WINDOW + 3 || !sg_untimed(&f[DCCL_GUARD_WINDOW]) || f[DCCL_GUARD_WINDOW + 1].flags != 0 ||
      f[DCCL_GUARD_WINDOW + 2].timing_source != DCCL_TIMING_KERNEL_GPU || f[0].flags != 0 ||
      atomic_load(&dccl_g.timing_suspect) != before + 1) {
    fprintf(stderr, "  FAIL drain: taken %llu, stale timing %d flags %d, counter +%llu\n", (unsigned long long)taken,
            f[DCCL_GUARD_WINDOW].timing_source, f[DCCL_GUARD_WINDOW].flags,
            (unsigned long long)(atomic_load(&dccl_g.timing_suspect) - before));
    rc = 1;
  }
  free(s.buf);
  ncclProfiler_v6.finalize(ctx);
  atomic_store(&dccl_g.timing_suspect, 0);
  clear_env();
  return rc;
}

/* A deep queue (the overhead launches: 64 MiB AllReduces enqueued within a millisecond, each finishing
   160 ms after the previous, so a record's enqueue is up to 10 s before its host stop) on a drifting
   GPU clock (20 ppm), most host stops 150 us late and every 10th on time: the offset is learned at the
   host stops and from the shortest delays, so nothing is flagged. */
static int test_stale_guard_deep_queue(void) {
  dccl_stale_guard_t g;
  dccl_stale_guard_init(&g, 100);
  for (int i = 0; i < 4 * DCCL_GUARD_WINDOW; i++) {
    uint64_t enq = SG_T0 + (uint64_t)(i / DCCL_GUARD_WINDOW) * DCCL_GUARD_WINDOW * 160000000ull +
                   (uint64_t)(i % DCCL_GUARD_WINDOW) * 10000; /* a burst of 64 enqueues */
    uint64_t stop = SG_T0 + (uint64_t)i * 160000000ull + 160000000ull; /* host clock */
    int64_t offset = 1100000 + (int64_t)((stop - SG_T0) / 50000);       /* 20 ppm */
    dccl_event_record_t r;
    memset(&r, 0, sizeof r);
    r.kind = DCCL_KIND_COLL;
    r.timing_source = DCCL_TIMING_KERNEL_GPU;
    r.enqueue_ns = enq;
    r.cpu_end_ns = stop + (i % 10 ? 150000 : 0);
    r.gpu_end_ns = (uint64_t)((int64_t)stop - offset);
    r.gpu_start_ns = r.gpu_end_ns - 159000000ull;
    TEST_ASSERT(dccl_stale_guard_check(&g, &r) == 0, "record %d flagged (offset %lld, %.1f ppm)", i,
                (long long)g.offset_ns, g.drift * 1e6);
  }
  TEST_ASSERT(g.state == DCCL_GUARD_ON && g.checked > 0, "on");
  return 0;
}

/* The host clock steps by 5 ms (NTP): the records after it are flagged until DCCL_GUARD_WINDOW in a row
   have missed the prediction; the guard then learns again and judges nothing wrongly after that. */
static int test_stale_guard_relearns_after_clock_step(void) {
  dccl_stale_guard_t g;
  dccl_stale_guard_init(&g, 100);
  uint64_t t = sg_learn(&g, SG_T0);
  int flagged_after = 0;
  for (int i = 0; i < 4 * DCCL_GUARD_WINDOW; i++, t += 1000000) {
    dccl_event_record_t r = sg_rec(t, 40000, 20000, 0);
    r.enqueue_ns += 5000000; /* host clock 5 ms ahead from now on */
    r.cpu_end_ns += 5000000;
    int f = dccl_stale_guard_check(&g, &r);
    if (i >= 2 * DCCL_GUARD_WINDOW) flagged_after += f;
  }
  TEST_ASSERT(g.state == DCCL_GUARD_ON && flagged_after == 0 && g.flagged <= DCCL_GUARD_WINDOW,
              "state %d, %llu flagged, %d after relearning", g.state, (unsigned long long)g.flagged, flagged_after);
  return 0;
}
