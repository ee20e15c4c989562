# The live view of `ctest -V` for scripts/test.sh: each test's start and result, and its output as
# it comes (pytest's progress: a row of dots and [ NN%] every ~70 tests), without ctest's preamble
# (configuration, the dependency graph, each test's command, directory, environment and timeout)
# or its closing list of passed tests. ctest.log keeps everything; the summary reads it.
#   ctest -V ... | tee ctest.log | awk -f scripts/ctest-progress.awk
/^(UpdateCTestConfiguration|Internal ctest|Test project|Constructing a list|Done constructing|Updating test list|Added [0-9]+ tests? to meet|Checking test dependency)/ { next }
/^test [0-9]+$/ || /^$/ { next }
/^[0-9]+: Environment variable/ { env = 1; next }
env && /^[0-9]+:  / { next }                # the environment's lines (indented by one more space)
{ env = 0 }
/^[0-9]+: (Test command|Working Directory|Test timeout computed)/ { next }
/^The following tests passed:/ { passed = 1; next }
passed && /^\t/ { next }
{ passed = 0 }
/^[0-9]+: / { sub(/^[0-9]+: /, "      "); print; fflush(); next }   # a test's own output, live
{ print; fflush() }
