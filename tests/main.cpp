// The test module: every tests/*.cpp adds its own suites (listed in tests/SUITES for ctest).
#define BOOST_TEST_MODULE baton
#include <boost/test/unit_test.hpp>
