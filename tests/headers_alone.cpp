// The real check happens at build time: build/tests/header_alone/<name>.cpp includes one public header (twice)
// and nothing else, for every header in include/opt/. This case only makes the program a test.
#include <doctest/doctest.h>
#include <opt/version.hpp>

TEST_CASE("every public header compiles alone") { CHECK(OPT_VERSION_MAJOR == 0); }
