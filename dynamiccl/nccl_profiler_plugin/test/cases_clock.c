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
  TEST_ASSERT(parse_one("DYNAMICCL_CLOCK", "", &cfg, err) == 0 && cfg.clock == DCCL_CLOCK_AUTO, "default: chosen at init");
  TEST_ASSERT(parse_one("DYNAMICCL_CLOCK", "0", &cfg, err) == 0 && cfg.clock == DCCL_CLOCK_VDSO, "0: clock_gettime");
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
  int usable = dccl_tsc_usable(), warns = g_warns;
  setenv("DYNAMICCL_CLOCK", "1", 1);
  void* ctx = init6(0xc10c, 0, 2);
  unsetenv("DYNAMICCL_CLOCK");
  TEST_ASSERT(ctx != NULL, "init: %s", g_log);
  TEST_ASSERT(atomic_load(&dccl_tsc.on) == usable, "on only where the TSC qualifies (usable %d)", usable);
  TEST_ASSERT(g_warns == warns + !usable, "fallback warned (only where unusable): %s", g_log);
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

/* Writes text to a fresh file under /tmp; its path in path. */
static int write_tmp(char* path, size_t n, const char* tag, const char* text) {
  snprintf(path, n, "/tmp/dccl-clock-%d-%s", (int)getpid(), tag);
  FILE* f = fopen(path, "w");
  if (f == NULL) return -1;
  fputs(text, f);
  fclose(f);
  return 0;
}

/* The default clock is chosen from the host's readings (injected): the TSC only with constant_tsc and
   nonstop_tsc on the first CPU and the tsc clocksource; DYNAMICCL_CLOCK=0 always gets clock_gettime. */
static int test_clock_choice(void) {
  static const char* const both = "processor\t: 0\nflags\t\t: fpu tsc constant_tsc rep_good nonstop_tsc cpuid\n"
                                  "processor\t: 1\nflags\t\t: fpu\n";
  static const char* const no_nonstop = "processor\t: 0\nflags\t\t: fpu tsc constant_tsc rep_good\n";
  static const char* const later_cpu_only = "processor\t: 0\nflags\t\t: fpu\nprocessor\t: 1\n"
                                            "flags\t\t: constant_tsc nonstop_tsc\n";
  char cpu_ok[128], cpu_no[128], cpu_late[128], cs_tsc[128], cs_kvm[128];
  TEST_ASSERT(write_tmp(cpu_ok, sizeof cpu_ok, "cpu-ok", both) == 0 && write_tmp(cpu_no, sizeof cpu_no, "cpu-no", no_nonstop) == 0 &&
                  write_tmp(cpu_late, sizeof cpu_late, "cpu-late", later_cpu_only) == 0 &&
                  write_tmp(cs_tsc, sizeof cs_tsc, "cs-tsc", "tsc\n") == 0 && write_tmp(cs_kvm, sizeof cs_kvm, "cs-kvm", "kvm-clock\n") == 0,
              "temporary files");
#if defined(__x86_64__)
  TEST_ASSERT(dccl_tsc_usable_at(cpu_ok, cs_tsc) == 1, "invariant TSC, clocksource tsc: usable");
#endif
  TEST_ASSERT(dccl_tsc_usable_at(cpu_no, cs_tsc) == 0, "no nonstop_tsc: not usable");
  TEST_ASSERT(dccl_tsc_usable_at(cpu_late, cs_tsc) == 0, "the first CPU's flags decide");
  TEST_ASSERT(dccl_tsc_usable_at(cpu_ok, cs_kvm) == 0, "clocksource kvm-clock: not usable");
  TEST_ASSERT(dccl_tsc_usable_at("/nonexistent/cpuinfo", cs_tsc) == 0 && dccl_tsc_usable_at(cpu_ok, "/nonexistent/cs") == 0,
              "unreadable: not usable");
  TEST_ASSERT(dccl_clock_wants_tsc(DCCL_CLOCK_AUTO, 1) && !dccl_clock_wants_tsc(DCCL_CLOCK_AUTO, 0), "default: the TSC where usable");
  TEST_ASSERT(dccl_clock_wants_tsc(DCCL_CLOCK_TSC, 1) && !dccl_clock_wants_tsc(DCCL_CLOCK_TSC, 0), "1: the TSC where usable");
  TEST_ASSERT(!dccl_clock_wants_tsc(DCCL_CLOCK_VDSO, 1) && !dccl_clock_wants_tsc(DCCL_CLOCK_VDSO, 0), "0: never the TSC");
  /* through init, on injected readings: a host that does not qualify gets clock_gettime, silently by
     default and with a warning when DYNAMICCL_CLOCK=1 asked for the TSC; one that does gets the TSC */
  clear_env();
  tsc_reset();
  dccl_cpuinfo_path = cpu_ok;
  dccl_clocksource_path = cs_kvm;
  int warns = g_warns; /* (g_log keeps only the last message: init's own line follows the warning) */
  void* ctx = init6(0xc10f, 0, 2);
  TEST_ASSERT(ctx != NULL && atomic_load(&dccl_tsc.on) == 0, "kvm-clock host, unset: clock_gettime");
  TEST_ASSERT(g_warns == warns, "no warning by default: %s", g_log);
  ncclProfiler_v6.finalize(ctx);
  setenv("DYNAMICCL_CLOCK", "1", 1);
  ctx = init6(0xc110, 0, 2);
  unsetenv("DYNAMICCL_CLOCK");
  TEST_ASSERT(ctx != NULL && atomic_load(&dccl_tsc.on) == 0, "kvm-clock host, 1: clock_gettime");
  TEST_ASSERT(g_warns == warns + 1, "1 on a host that does not qualify warns: %s", g_log);
  ncclProfiler_v6.finalize(ctx);
#if defined(__x86_64__)
  dccl_clocksource_path = cs_tsc;
  ctx = init6(0xc111, 0, 2);
  TEST_ASSERT(ctx != NULL && atomic_load(&dccl_tsc.on) == 1, "qualifying host, unset: the TSC");
  ncclProfiler_v6.finalize(ctx);
  setenv("DYNAMICCL_CLOCK", "0", 1);
  ctx = init6(0xc112, 0, 2);
  unsetenv("DYNAMICCL_CLOCK");
  TEST_ASSERT(ctx != NULL && atomic_load(&dccl_tsc.on) == 0, "qualifying host, 0: clock_gettime");
  ncclProfiler_v6.finalize(ctx);
#endif
  dccl_cpuinfo_path = "/proc/cpuinfo";
  dccl_clocksource_path = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
  unlink(cpu_ok);
  unlink(cpu_no);
  unlink(cpu_late);
  unlink(cs_tsc);
  unlink(cs_kvm);
  /* and on this host's own readings: unset follows the host, 0 forces clock_gettime, neither warns */
  tsc_reset();
  int usable = dccl_tsc_usable();
  warns = g_warns;
  ctx = init6(0xc10d, 0, 2);
  TEST_ASSERT(ctx != NULL, "init: %s", g_log);
  TEST_ASSERT(atomic_load(&dccl_tsc.on) == usable, "unset: TSC exactly where usable (usable %d, on %d)", usable,
              atomic_load(&dccl_tsc.on));
  TEST_ASSERT(g_warns == warns, "no warning by default: %s", g_log);
  ncclProfiler_v6.finalize(ctx);
  setenv("DYNAMICCL_CLOCK", "0", 1);
  ctx = init6(0xc10e, 0, 2);
  unsetenv("DYNAMICCL_CLOCK");
  TEST_ASSERT(ctx != NULL, "init: %s", g_log);
  TEST_ASSERT(atomic_load(&dccl_tsc.on) == 0, "DYNAMICCL_CLOCK=0: clock_gettime");
  ncclProfiler_v6.finalize(ctx);
  tsc_reset();
  return 0;
}
