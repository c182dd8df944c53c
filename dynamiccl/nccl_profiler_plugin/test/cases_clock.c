/* Profiler unit tests: the record clock (clock.h, DYNAMICCL_CLOCK). #included by test_plugin.c. */

static void tsc_reset(void) {
  atomic_store(&dccl_tsc.on, 0);
  atomic_store(&dccl_tsc.seq, 0);
  atomic_store(&dccl_tsc.mult, 0);
  atomic_store(&dccl_tsc.max_ticks, 0);
  dccl_tsc.rate_tsc = dccl_tsc.rate_mono = 0;
}

/* The anchor arithmetic on injected readings: 3 ticks per ns (a 3 GHz TSC). */
static int test_tsc_clock_anchor(void) {
  dccl_config_t cfg;
  char err[256];
  TEST_ASSERT(parse_one("DYNAMICCL_CLOCK", "2", &cfg, err) != 0 && strstr(err, "DYNAMICCL_CLOCK"), "refused: %s", err);
  TEST_ASSERT(parse_one("DYNAMICCL_CLOCK", "1", &cfg, err) == 0 && cfg.clock == 1, "tsc accepted");
  TEST_ASSERT(parse_one("DYNAMICCL_CLOCK", "", &cfg, err) == 0 && cfg.clock == 0, "default: clock_gettime");
  tsc_reset();
  const uint64_t T = 1000000, RT = 5000000000ull, MONO = 1000000000ull;
  uint64_t t = 0;
  dccl_tsc_anchor_at(T, RT, MONO);
  TEST_ASSERT(!dccl_tsc_convert(T + 30, &t), "no rate after one anchor: falls back");
  dccl_tsc_anchor_at(T + 30000000, RT + 10000000, MONO + 10000000); /* 10 ms later */
  TEST_ASSERT(dccl_tsc_convert(T + 30000000 + 3000000, &t), "a rate after 10 ms");
  TEST_ASSERT(t >= RT + 11000000 - 1 && t <= RT + 11000000 + 1, "3 ticks per ns: %llu", (unsigned long long)(t - RT));
  TEST_ASSERT(!dccl_tsc_convert(T + 30000000 - 1, &t), "a reading before the anchor falls back");
  TEST_ASSERT(!dccl_tsc_convert(T + 30000000 + 3000000001ull, &t), "more than 1 s past the anchor falls back");
  /* 5 ms later, CLOCK_REALTIME stepped by +1 s: the anchor takes the step, the rate interval goes on */
  dccl_tsc_anchor_at(T + 45000000, RT + 1015000000, MONO + 15000000);
  TEST_ASSERT(dccl_tsc_convert(T + 45000000 + 300, &t) && t + 1 >= RT + 1015000100 && t <= RT + 1015000100,
              "step taken: %llu", (unsigned long long)(t - RT));
  /* a counter no TSC is (2e12 ticks in 20 ms, 1e-5 ns per tick): refused, the old rate kept */
  const uint64_t FAR = T + 30000000 + 2000000000000ull;
  dccl_tsc_anchor_at(FAR, RT + 1035000000, MONO + 30000000);
  TEST_ASSERT(dccl_tsc_convert(FAR + 3000, &t) && t + 1 >= RT + 1035001000 && t <= RT + 1035001000,
              "rate kept: %llu", (unsigned long long)(t - RT - 1035000000));
  atomic_fetch_add(&dccl_tsc.seq, 1); /* the sender is writing the anchor */
  TEST_ASSERT(!dccl_tsc_convert(FAR + 3000, &t), "odd seqlock: falls back");
  tsc_reset();
  return 0;
}

/* DYNAMICCL_CLOCK=1 through init on this host: records' clock agrees with CLOCK_REALTIME. */
static int test_tsc_clock_live(void) {
  clear_env();
  int usable = dccl_tsc_usable();
  setenv("DYNAMICCL_CLOCK", "1", 1);
  void* ctx = init6(0xc10c, 0, 2);
  unsetenv("DYNAMICCL_CLOCK");
  TEST_ASSERT(ctx != NULL, "init: %s", g_log);
  TEST_ASSERT(atomic_load(&dccl_tsc.on) == usable, "on only where the TSC qualifies (usable %d)", usable);
  TEST_ASSERT(usable || strstr(g_log, "DYNAMICCL_CLOCK=1") != NULL, "fallback warned: %s", g_log);
  if (usable) {
    /* the unit tests have no sender thread (DCCL_TESTING_NO_SENDER): this thread takes its part,
       the anchor's only writer, and anchors again after 30 ms */
    struct timespec pause = {0, 30 * 1000000};
    nanosleep(&pause, NULL);
    dccl_tsc_anchor();
    TEST_ASSERT(atomic_load(&dccl_tsc.mult) != 0, "a rate after 30 ms");
    for (int i = 0; i < 100; i++) {
      uint64_t a = dccl_realtime_ns(), x = dccl_now_ns(), b = dccl_realtime_ns();
      /* 100 µs: the anchor's own uncertainty is tens of ns; the slack covers preemption under load */
      TEST_ASSERT(x + 100000 >= a && x <= b + 100000, "tsc clock %lld ns off [%llu, %llu]", (long long)(x - a),
                  (unsigned long long)a, (unsigned long long)b);
    }
  }
  ncclProfiler_v6.finalize(ctx);
  TEST_ASSERT(atomic_load(&dccl_tsc.on) == 0 && atomic_load(&dccl_tsc.mult) == 0, "off after the last finalize");
  return 0;
}
