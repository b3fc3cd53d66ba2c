// Records' plain helpers: times as RFC 3339 UTC with milliseconds, checked against the C library.
#include <baton/types.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <ctime>
#include <random>

using namespace baton;

namespace {
std::string reference(time_ms t) {
    std::time_t secs = static_cast<std::time_t>(t / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(t % 1000));
    return buf;
}
} // namespace

BOOST_AUTO_TEST_SUITE(types)

BOOST_AUTO_TEST_CASE(format_time_matches_the_c_library) {
    BOOST_TEST(format_time(0) == "1970-01-01T00:00:00.000Z");
    BOOST_TEST(format_time(951'782'400'123) == "2000-02-29T00:00:00.123Z");   // a leap day
    BOOST_TEST(format_time(4'107'542'399'999) == "2100-02-28T23:59:59.999Z"); // 2100 is no leap year
    BOOST_TEST(format_time(4'107'542'400'000) == "2100-03-01T00:00:00.000Z");
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<time_ms> any(0, 253'402'300'799'999); // up to 9999-12-31
    for (int i = 0; i < 20000; ++i) {
        auto t = any(rng);
        BOOST_TEST_REQUIRE(format_time(t) == reference(t));
    }
}

BOOST_AUTO_TEST_CASE(outbox_keys_are_derived_and_distinct) {
    auto k = outbox_key("s1", "t_1", "ws", "s1", 0);
    BOOST_TEST(k == outbox_key("s1", "t_1", "ws", "s1", 0));
    BOOST_TEST(k.size() == 35u);
    BOOST_TEST(k.rfind("ob_", 0) == 0u);
    BOOST_TEST(k != outbox_key("s1", "t_1", "ws", "s1", 1));
    BOOST_TEST(k != outbox_key("s1", "t_2", "ws", "s1", 0));
    BOOST_TEST(k != outbox_key("s1", "t_1", "webhook", "s1", 0));
    // Parts are delimited: moving a character from one part to the next gives another key.
    BOOST_TEST(outbox_key("a:b", "c", "ws", "", 0) != outbox_key("a", "b:c", "ws", "", 0));
    BOOST_TEST(sha256_hex("abc") ==
               "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

BOOST_AUTO_TEST_SUITE_END()
