// Test helpers: an io_context fixture that proves no work is left behind, bounded runs of
// awaitables and of handlers (a hung test fails instead of hanging CI) and bounded polls of a
// condition.
#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <exception>
#include <optional>
#include <thread>

namespace baton::test {

namespace asio = boost::asio;
using namespace std::chrono_literals;

struct io_fixture {
    asio::io_context ctx;
    ~io_fixture() {
        ctx.restart();
        ctx.poll();
        BOOST_TEST(ctx.stopped());
    }
};

// Runs `a` on ctx until it completes or `limit` passes (then the test fails). Rethrows its error.
template <class T>
T run_bounded(asio::io_context& ctx, asio::awaitable<T> a, std::chrono::milliseconds limit = 10s) {
    std::optional<T> out;
    std::exception_ptr error;
    bool done = false;
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e, T v) {
        error = e;
        if (!e) out.emplace(std::move(v));
        done = true;
    });
    auto deadline = std::chrono::steady_clock::now() + limit;
    ctx.restart();
    while (!done && std::chrono::steady_clock::now() < deadline)
        ctx.run_one_for(10ms);
    BOOST_REQUIRE_MESSAGE(done, "operation did not finish within its bound");
    if (error) std::rethrow_exception(error);
    return std::move(*out);
}

// Runs ctx's handlers until `done()` holds or `limit` passes; returns done().
template <class P> bool run_until(asio::io_context& ctx, P done, std::chrono::milliseconds limit = 5s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    ctx.restart();
    while (!done() && std::chrono::steady_clock::now() < deadline)
        ctx.run_one_for(std::chrono::milliseconds(5));
    return done();
}

// Polls `pred` every 2 ms until it holds or `limit` passes; returns whether it held.
template <class Pred> bool eventually(Pred pred, std::chrono::milliseconds limit = 10s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

inline void run_bounded(asio::io_context& ctx, asio::awaitable<void> a,
                        std::chrono::milliseconds limit = 10s) {
    auto wrap = [](asio::awaitable<void> inner) -> asio::awaitable<int> {
        co_await std::move(inner);
        co_return 0;
    };
    run_bounded<int>(ctx, wrap(std::move(a)), limit);
}

} // namespace baton::test
