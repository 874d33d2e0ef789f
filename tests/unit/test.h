// test.h: the unit tests' whole harness.
//
// Each EXPECT prints one line, "PASS <test>: <what>" or "FAIL <test>: <what>",
// which tests/run.sh counts; a test program exits non-zero if any check failed.
//
//   int main(void) {
//       EXPECT(1 + 1 == 2, "addition works (got %d)", 1 + 1);
//       return test_summary();
//   }
#pragma once
#include <stdio.h>

static int test_failures;

#define EXPECT(cond, ...)                                                           \
    do {                                                                            \
        int ok_ = (cond);                                                           \
        printf("%s %s: ", ok_ ? "PASS" : "FAIL", TEST_NAME);                        \
        printf(__VA_ARGS__);                                                        \
        if (!ok_) printf("   [%s:%d: %s]", __FILE__, __LINE__, #cond);              \
        printf("\n");                                                               \
        fflush(stdout);                                                             \
        test_failures += !ok_;                                                      \
    } while (0)

static inline int test_summary(void) { return test_failures ? 1 : 0; }
