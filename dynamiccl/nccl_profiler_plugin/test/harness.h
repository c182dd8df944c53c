/* The tiny test harness both plugins' C unit tests use (nccl_profiler_plugin/test/test_plugin.c,
 * nccl_tuner_plugin/test/test_tuner.c): a mock NCCL logger that keeps the last message and counts
 * warnings, TEST_ASSERT (prints FAIL file:line and returns 1 from the test), and a runner for a table
 * of named tests: all of them, or the one named on the command line. Include it after the plugin
 * sources (it needs ncclDebugLogLevel from nccl_common_abi.h). */
#ifndef DCCL_TEST_HARNESS_H
#define DCCL_TEST_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static char g_log[4096];
static int g_warns;
static void mock_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) {
  (void)flags, (void)file, (void)line;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_log, sizeof g_log, fmt, ap);
  va_end(ap);
  if (level == NCCL_LOG_WARN) g_warns++;
}

#define TEST_ASSERT(cond, ...)                                                   \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, "\n");                                                     \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

typedef struct {
  const char* name;
  int (*fn)(void);
} test_case_t;

/* Runs every test (or only argv[1]); prints PASS/FAIL per test and "N/M passed". Exit code: 0 all
 * passed, 1 a failure, 2 no test of that name. */
static int run_tests(const test_case_t* tests, size_t n, int argc, char** argv) {
  int failed = 0, ran = 0;
  for (size_t i = 0; i < n; i++) {
    if (argc > 1 && strcmp(argv[1], tests[i].name) != 0) continue;
    ran++;
    int rc = tests[i].fn();
    printf("%s %s\n", rc == 0 ? "PASS" : "FAIL", tests[i].name);
    failed += rc != 0;
  }
  if (ran == 0) {
    fprintf(stderr, "no test named %s\n", argv[1]);
    return 2;
  }
  printf("%d/%d passed\n", ran - failed, ran);
  return failed ? 1 : 0;
}

#endif /* DCCL_TEST_HARNESS_H */
