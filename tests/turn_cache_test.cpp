// The runtime's memory of turns (src/turn_cache): live turns stay until they finish, finished ones
// are kept among the last N, and inputs are never held. I/O-free.
#include "src/core/turn_cache.hpp"

#include <boost/test/unit_test.hpp>

using namespace baton;
using baton::detail::turn_cache;

namespace {
turn_record record(const std::string& tid, turn_status status) {
    turn_record t;
    t.turn_id = tid;
    t.session_id = "s1";
    t.status = status;
    t.created_at = 1'700'000'000'000;
    t.input.text = std::string(1000, 'x');
    return t;
}
} // namespace

BOOST_AUTO_TEST_SUITE(turn_cache_suite)

BOOST_AUTO_TEST_CASE(keeps_live_turns_and_the_last_finished_ones) {
    turn_cache cache(2);
    cache.live(record("t_live", turn_status::running));
    for (auto id : {"t_1", "t_2", "t_3"}) {
        cache.live(record(id, turn_status::queued));
        cache.finished(record(id, turn_status::completed));
    }
    // Only the last two finished turns remain; the running one is never evicted.
    BOOST_TEST(!cache.find("t_1").has_value());
    BOOST_TEST(cache.find("t_2").has_value());
    BOOST_TEST(cache.find("t_3").has_value());
    BOOST_REQUIRE(cache.find("t_live").has_value());
    BOOST_TEST((cache.find("t_live")->status == turn_status::running));
    // The poll's view has no input: a megabyte of text is not kept for 1,024 turns.
    BOOST_TEST(cache.find("t_3")->input.text.empty());
    BOOST_TEST((cache.find("t_3")->status == turn_status::completed));
}

BOOST_AUTO_TEST_CASE(forget_leaves_the_answer_to_the_store) {
    turn_cache cache;
    cache.live(record("t_1", turn_status::running));
    cache.forget("t_1");
    BOOST_TEST(!cache.find("t_1").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
