// Idle compaction's timer (the runtime's idle loop), through baton::service in process on a manual
// clock: a session whose window crossed the first threshold is compacted once, when it has been
// idle for context.idle_compaction_after and not a millisecond before, and never again while
// nothing happens; the timer never fires into a running turn (the turn's end starts the idle
// time afresh); 0 arms no timer at all. What the compaction does to the context is
// compaction_session_test.cpp's (the real daemon).
#include "tests/clocked_service.hpp"

#include <mutex>
#include <string>
#include <vector>

using namespace baton;
using namespace baton::test;

namespace {

using time_point = baton::clock::time_point;

// Answers at once; a message starting "slow" is answered after 1 s of the clock. Records when each
// call started and when it answered.
struct clocked_model : model_client {
    explicit clocked_model(std::shared_ptr<baton::clock> c) : clock(std::move(c)) {}
    asio::awaitable<chat_completion> complete(const model_request& req, const delta_handler&) override {
        auto started = clock->now();
        const auto& text = req.messages.back().content;
        if (text.starts_with("slow")) {
            baton::timer t(clock, co_await asio::this_coro::executor, 1s);
            co_await t.async_wait(asio::use_awaitable);
        }
        {
            std::lock_guard lock(mutex);
            calls.emplace_back(started, clock->now());
        }
        chat_completion c;
        c.text = "noted: " + text.substr(0, 200);
        c.finish_reason = "stop";
        co_return c;
    }
    std::string name() const override { return "clocked"; }

    std::shared_ptr<baton::clock> clock;
    std::mutex mutex;
    std::vector<std::pair<time_point, time_point>> calls;
};

// A service whose default agent has a 900-token budget with its first threshold at 90 tokens (one
// turn below crosses it, two stay under the second) and idle compaction after `idle`; a plugin
// records each idle compaction (session, clock time).
struct idle_service {
    explicit idle_service(std::chrono::milliseconds idle) : s(clocked_service::memory_options()) {
        agent_config a;
        a.model.context_window = 1000;
        a.context.reserve_output_tokens = 100;
        a.context.compaction_thresholds = {0.1, 0.8, 0.9};
        a.context.idle_compaction_after = idle;
        model = std::make_shared<clocked_model>(s.clock);
        s.svc->add_agent(a, model);
        plugin recorder;
        recorder.name = "idle recorder";
        recorder.compact_idle = [this](framework&, const agent&, const session_ref& sid) {
            std::lock_guard lock(mutex);
            compactions.emplace_back(sid.id, s.clock->now());
            return noop();
        };
        s.svc->add_plugin(recorder);
        s.start();
    }
    static asio::awaitable<void> noop() { co_return; }

    // Submits a message of ~100 tokens and returns its turn id.
    std::string submit(std::string session, std::string head) {
        accept_request m;
        m.session_id = std::move(session);
        m.text = head + " " + std::string(400 - head.size() - 1, 'x');
        auto f = s.svc->async_submit(std::move(m), asio::use_future);
        return clocked_service::wait(f).turn_id;
    }
    turn_record wait_turn(const std::string& tid) {
        auto f = s.svc->async_wait_turn(tid, asio::use_future);
        return clocked_service::wait(f);
    }
    std::size_t count() {
        std::lock_guard lock(mutex);
        return compactions.size();
    }

    clocked_service s;
    std::shared_ptr<clocked_model> model;
    std::mutex mutex;
    std::vector<std::pair<std::string, time_point>> compactions;
};

} // namespace

BOOST_AUTO_TEST_SUITE(idle_compaction)

BOOST_AUTO_TEST_CASE(an_idle_session_is_compacted_once_after_its_idle_time) {
    idle_service f(300ms);
    auto rec = f.wait_turn(f.submit("s1", "first"));
    BOOST_TEST_REQUIRE((rec.status == turn_status::completed));
    const auto ended = f.s.clock->now(); // the clock stands still: the turn ended now
    BOOST_TEST_REQUIRE(f.s.parked());
    f.s.clock->advance(299ms);
    BOOST_TEST_REQUIRE(f.s.parked());
    BOOST_TEST(f.count() == 0u);
    f.s.clock->advance(1ms);
    BOOST_TEST_REQUIRE(eventually([&] { return f.count() == 1; }), f.s.log_text());
    {
        std::lock_guard lock(f.mutex);
        BOOST_TEST(f.compactions[0].first == "s1");
        BOOST_TEST((f.compactions[0].second == ended + 300ms));
    }
    // Once: no timer is left, and five more idle periods bring nothing.
    BOOST_TEST_REQUIRE(f.s.parked(0));
    f.s.clock->advance(1500ms);
    BOOST_TEST(f.s.parked(0));
    BOOST_TEST(f.count() == 1u);
}

BOOST_AUTO_TEST_CASE(the_idle_timer_never_fires_into_a_running_turn) {
    idle_service f(300ms);
    BOOST_TEST_REQUIRE((f.wait_turn(f.submit("s1", "first")).status == turn_status::completed));
    // At once, a turn whose model call takes a second: the timer armed by the first turn comes
    // due in the middle of it.
    const auto t0 = f.s.clock->now();
    auto slow = f.submit("s1", "slow one");
    BOOST_TEST_REQUIRE(f.s.parked(2)); // the idle timer and the model's second
    f.s.clock->advance(300ms);
    BOOST_TEST_REQUIRE(f.s.parked(1)); // the session was busy: left alone, no idle timer
    BOOST_TEST(f.count() == 0u);
    f.s.clock->advance(700ms);
    BOOST_TEST_REQUIRE((f.wait_turn(slow).status == turn_status::completed));
    // The turn's end starts the idle time again: compacted 300 ms after it, not before.
    BOOST_TEST_REQUIRE(f.s.parked(1));
    f.s.clock->advance(299ms);
    BOOST_TEST_REQUIRE(f.s.parked(1));
    BOOST_TEST(f.count() == 0u);
    f.s.clock->advance(1ms);
    BOOST_TEST_REQUIRE(eventually([&] { return f.count() == 1; }), f.s.log_text());
    BOOST_TEST_REQUIRE(f.s.parked(0));
    {
        std::lock_guard lock(f.mutex);
        BOOST_TEST((f.compactions[0].second == t0 + 1300ms));
    }
    std::lock_guard lock(f.model->mutex);
    BOOST_TEST_REQUIRE(f.model->calls.size() >= 2u);
    BOOST_TEST((f.model->calls[1].first == t0));
    BOOST_TEST((f.model->calls[1].second == t0 + 1000ms)); // the slow turn's answer
}

BOOST_AUTO_TEST_CASE(idle_compaction_after_0_arms_no_timer) {
    idle_service f(0ms);
    BOOST_TEST_REQUIRE((f.wait_turn(f.submit("s1", "first")).status == turn_status::completed));
    BOOST_TEST(f.s.clock->waiting() == 0u);
    f.s.clock->advance(1h);
    BOOST_TEST(f.s.parked(0));
    BOOST_TEST(f.count() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
