// expect.h — the check of the C++ host tests (test_route, test_shard_plan, test_prefix_tree):
// EXPECT(cond, fmt, ...) counts a failure and prints the file, line, condition and message; a
// test's main returns `failures != 0`. One translation unit per test, so the counter is its own.
#pragma once

#include <cstdio>

namespace {
int failures = 0;
}  // namespace

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            ++failures;                                                     \
            std::fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                              \
            std::fprintf(stderr, "\n");                                     \
        }                                                                   \
    } while (0)
