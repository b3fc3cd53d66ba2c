// baton::clock (include/baton/clock.hpp): a manual clock's waits complete when the test moves time
// to their deadline and not before, on their handler's executor, in deadline order, from any
// thread; they are cancelled as steady_timer waits are (cancel, a new expiry, destruction, a
// cancellation slot, an awaitable operator); a pending one is work. The system clock's timer
// does the same on real time.
#include "tests/test_util.hpp"

#include <baton/clock.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdlib>
#include <future>
#include <thread>
#include <vector>

using namespace baton;
using namespace baton::test;
using boost::system::error_code;

namespace {

// Records how each wait ended, in completion order.
struct outcomes {
    std::vector<std::pair<int, error_code>> got;
    auto handler(int id) {
        return [this, id](error_code ec) { got.emplace_back(id, ec); };
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(clocks)

BOOST_FIXTURE_TEST_CASE(a_wait_ends_when_time_reaches_its_deadline_not_before, io_fixture) {
    auto c = std::make_shared<manual_clock>(1'000'000);
    const auto t0 = c->now();
    outcomes out;
    timer late(c, ctx.get_executor(), 300ms);
    timer early(c, ctx.get_executor(), 100ms);
    late.async_wait(out.handler(2));
    early.async_wait(out.handler(1));
    BOOST_TEST(c->waiting() == 2u);
    BOOST_TEST((c->next_deadline() == t0 + 100ms));
    ctx.poll();
    BOOST_TEST(out.got.empty());
    c->advance(99ms);
    ctx.restart();
    ctx.poll();
    BOOST_TEST(out.got.empty());
    BOOST_TEST(c->utc_ms() == 1'000'099);
    // Past both deadlines at once: both end, the earlier first; posted, never inline.
    c->advance(250ms);
    BOOST_TEST(out.got.empty());
    BOOST_TEST(c->waiting() == 0u);
    ctx.restart();
    ctx.poll();
    BOOST_REQUIRE_EQUAL(out.got.size(), 2u);
    BOOST_TEST(out.got[0].first == 1);
    BOOST_TEST(out.got[1].first == 2);
    BOOST_TEST(!out.got[0].second);
    BOOST_TEST(!out.got[1].second);
    BOOST_TEST((c->now() == t0 + 349ms));
    BOOST_TEST(c->utc_ms() == 1'000'349);
    // A deadline already passed: success at once (posted); time does not go back.
    timer past(c, ctx.get_executor(), t0);
    past.async_wait(out.handler(3));
    BOOST_TEST(out.got.size() == 2u);
    ctx.restart();
    ctx.poll();
    BOOST_REQUIRE_EQUAL(out.got.size(), 3u);
    BOOST_TEST(!out.got[2].second);
    c->advance_to(t0);
    BOOST_TEST((c->now() == t0 + 349ms));
}

BOOST_FIXTURE_TEST_CASE(cancel_a_new_expiry_and_destruction_abort_the_wait, io_fixture) {
    auto c = std::make_shared<manual_clock>();
    outcomes out;
    timer a(c, ctx.get_executor(), 1s);
    a.async_wait(out.handler(1));
    BOOST_TEST(a.cancel() == 1u);
    a.expires_after(1s);
    a.async_wait(out.handler(2));
    BOOST_TEST(a.expires_after(2s) == 1u);
    a.async_wait(out.handler(3));
    {
        timer b(c, ctx.get_executor(), 1s);
        b.async_wait(out.handler(4));
    }
    BOOST_TEST(c->waiting() == 1u); // a's third wait
    ctx.poll();
    BOOST_REQUIRE_EQUAL(out.got.size(), 3u);
    for (const auto& [id, ec] : out.got)
        BOOST_TEST((ec == boost::asio::error::operation_aborted), id);
    // The new expiry holds: 2 s, not 1 s.
    c->advance(1s);
    ctx.restart();
    ctx.poll();
    BOOST_TEST(out.got.size() == 3u);
    c->advance(1s);
    ctx.restart();
    ctx.poll();
    BOOST_REQUIRE_EQUAL(out.got.size(), 4u);
    BOOST_TEST(out.got[3].first == 3);
    BOOST_TEST(!out.got[3].second);
}

BOOST_FIXTURE_TEST_CASE(a_pending_wait_is_work_and_a_cancellation_slot_ends_it, io_fixture) {
    auto c = std::make_shared<manual_clock>();
    outcomes out;
    boost::asio::cancellation_signal stop;
    timer t(c, ctx.get_executor(), 1h);
    t.async_wait(boost::asio::bind_cancellation_slot(stop.slot(), out.handler(1)));
    ctx.poll();
    BOOST_TEST(!ctx.stopped()); // run() would wait for it
    stop.emit(boost::asio::cancellation_type::terminal);
    BOOST_TEST(c->waiting() == 0u);
    ctx.poll();
    BOOST_TEST(ctx.stopped());
    BOOST_REQUIRE_EQUAL(out.got.size(), 1u);
    BOOST_TEST((out.got[0].second == boost::asio::error::operation_aborted));
    // An emit after the wait ended does nothing.
    stop.emit(boost::asio::cancellation_type::terminal);
    c->advance(2h);
    ctx.restart();
    ctx.poll();
    BOOST_TEST(out.got.size() == 1u);
}

namespace {
using namespace boost::asio::experimental::awaitable_operators;

// The first of two waits wins; the other is cancelled through its slot.
boost::asio::awaitable<int> race(std::shared_ptr<baton::clock> c) {
    auto ex = co_await boost::asio::this_coro::executor;
    timer fast(c, ex, 10s);
    timer slow(c, ex, 20s);
    auto r = co_await (fast.async_wait(boost::asio::use_awaitable) ||
                       slow.async_wait(boost::asio::use_awaitable));
    co_return static_cast<int>(r.index());
}

// Waits 5 s of the clock on `strand`; says whether the wait ended there.
boost::asio::awaitable<bool> wait_on(std::shared_ptr<baton::clock> c,
                                     boost::asio::strand<boost::asio::any_io_executor> strand) {
    timer t(c, co_await boost::asio::this_coro::executor, 5s);
    co_await t.async_wait(boost::asio::use_awaitable);
    co_return strand.running_in_this_thread();
}
} // namespace

BOOST_FIXTURE_TEST_CASE(an_awaitable_race_cancels_the_loser, io_fixture) {
    auto c = std::make_shared<manual_clock>();
    std::optional<int> winner;
    boost::asio::co_spawn(ctx, race(c), [&](std::exception_ptr e, int i) {
        BOOST_TEST(!e);
        winner = i;
    });
    ctx.poll();
    BOOST_TEST(c->waiting() == 2u);
    c->advance(10s);
    ctx.restart();
    ctx.poll();
    BOOST_TEST(winner.value_or(-1) == 0);
    BOOST_TEST(c->waiting() == 0u);
}

BOOST_AUTO_TEST_CASE(advance_on_another_thread_completes_on_the_waiters_strand) {
    asio::io_context ctx;
    auto c = std::make_shared<manual_clock>();
    auto strand = boost::asio::make_strand(boost::asio::any_io_executor(ctx.get_executor()));
    std::vector<std::future<bool>> done;
    for (int i = 0; i < 8; ++i)
        done.push_back(boost::asio::co_spawn(strand, wait_on(c, strand), boost::asio::use_future));
    std::thread runner([&] { ctx.run_for(10s); });
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (c->waiting() < 8 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    BOOST_TEST_REQUIRE(c->waiting() == 8u);
    BOOST_TEST(c->advance_to_next());
    for (auto& f : done) {
        BOOST_TEST_REQUIRE((f.wait_for(5s) == std::future_status::ready));
        BOOST_TEST(f.get());
    }
    BOOST_TEST(!c->advance_to_next());
    runner.join(); // run_for returns once no work is left
}

BOOST_FIXTURE_TEST_CASE(the_system_clock_waits_on_real_time, io_fixture) {
    const auto& c = system_clock();
    BOOST_TEST(std::abs(c->utc_ms() - now_ms()) < 1000);
    outcomes out;
    auto t0 = std::chrono::steady_clock::now();
    timer t(c, ctx.get_executor(), 20ms);
    t.async_wait(out.handler(1));
    timer never(nullptr, ctx.get_executor(), 1h); // null: the system clock
    boost::asio::cancellation_signal stop;
    never.async_wait(boost::asio::bind_cancellation_slot(stop.slot(), out.handler(2)));
    stop.emit(boost::asio::cancellation_type::terminal);
    ctx.run_for(5s);
    BOOST_REQUIRE_EQUAL(out.got.size(), 2u);
    BOOST_TEST(out.got[0].first == 2);
    BOOST_TEST((out.got[0].second == boost::asio::error::operation_aborted));
    BOOST_TEST(!out.got[1].second);
    BOOST_TEST((std::chrono::steady_clock::now() - t0 >= 20ms));
}

BOOST_AUTO_TEST_SUITE_END()
