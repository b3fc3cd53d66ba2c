// Time for the timers that decide what baton does: schedules, the Telegram debounce and backoff,
// outbox retries, idle compaction. Each such component takes a clock in its options (default: the
// real one, system_clock()); a test passes a manual_clock, whose time moves only when the test
// advances it, and checks what happened just before and just after a deadline without sleeping.
//
// Contract. A clock reads two times that move together: now() (monotonic; the deadlines of waits)
// and utc_ms() (wall time, ms since the Unix epoch; a schedule's slots, stored timestamps). A
// `timer` on a clock is shaped like asio::steady_timer and has its rules: not thread-safe (one
// strand uses it); async_wait completes with success once now() reaches expiry() (at once when it
// has already: posted, never inline), and with operation_aborted when cancel(), expires_at/after()
// or the timer's destruction comes first, or when the wait's cancellation slot (use_awaitable's,
// bind_cancellation_slot's, an awaitable operator's) is emitted with any cancellation type. The
// handler runs through its associated executor (else the timer's), and a pending wait counts as
// work on the timer's executor.
#pragma once

#include <baton/types.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>

namespace baton {

namespace detail {
class timer_impl; // one timer's waits, made by its clock (src/core/clock.cpp)
}

class clock {
public:
    using duration = std::chrono::steady_clock::duration;
    using time_point = std::chrono::steady_clock::time_point;

    virtual ~clock() = default;
    // Monotonic time: what timers' deadlines are measured in.
    virtual time_point now() const = 0;
    // Wall time in ms since the Unix epoch (UTC).
    virtual time_ms utc_ms() const = 0;
    // For `timer`: the waits of one timer on `ex`.
    virtual std::unique_ptr<detail::timer_impl> make_timer(boost::asio::any_io_executor ex) = 0;
};

// The real clocks: std::chrono::steady_clock, the system's UTC time and asio::steady_timer. One
// object, shared.
const std::shared_ptr<clock>& system_clock();

namespace detail {
using wait_handler = boost::asio::any_completion_handler<void(boost::system::error_code)>;

class timer_impl {
public:
    virtual ~timer_impl() = default; // cancels the waits still pending
    virtual clock::time_point expiry() const = 0;
    virtual std::size_t expires_at(clock::time_point t) = 0; // cancels the pending waits
    virtual std::size_t cancel() = 0;
    virtual void async_wait(wait_handler h) = 0;
};
} // namespace detail

// asio::steady_timer's shape on any clock. Holds the clock (a null one means system_clock()).
class timer {
public:
    using executor_type = boost::asio::any_io_executor;
    using time_point = clock::time_point;
    using duration = clock::duration;

    timer(std::shared_ptr<clock> c, executor_type ex);
    timer(std::shared_ptr<clock> c, executor_type ex, time_point at);
    timer(std::shared_ptr<clock> c, executor_type ex, duration after);
    ~timer();
    timer(const timer&) = delete;
    timer& operator=(const timer&) = delete;

    executor_type get_executor() const { return ex_; }
    const std::shared_ptr<clock>& get_clock() const { return clock_; }
    time_point expiry() const;
    // Both cancel the waits pending; they return how many.
    std::size_t expires_at(time_point at);
    std::size_t expires_after(duration d);
    std::size_t cancel();

    // Handler: void(error_code). Cancellation: terminal, partial and total (operation_aborted).
    template <class Token> auto async_wait(Token&& token) {
        return boost::asio::async_initiate<Token, void(boost::system::error_code)>(
            [](auto handler, detail::timer_impl* impl) {
                impl->async_wait(detail::wait_handler(std::move(handler)));
            },
            token, impl_.get());
    }

private:
    std::shared_ptr<clock> clock_;
    executor_type ex_;
    std::unique_ptr<detail::timer_impl> impl_;
};

// A clock for tests: time stands still until advance() moves it. Thread-safe: advance() may run on
// any thread while timers on other threads wait; the waits it completes are posted to their
// handlers' executors (run the io_context to see them happen). A jump is one instant, as a stalled
// process sees it: a wait started after advance() counts from the new time.
class manual_clock final : public clock {
public:
    // Starts at `utc` (ms since the epoch); now() starts at the real steady time.
    explicit manual_clock(time_ms utc = now_ms());

    time_point now() const override;
    time_ms utc_ms() const override;
    std::unique_ptr<detail::timer_impl> make_timer(boost::asio::any_io_executor ex) override;

    // Moves time forward (never back) and completes, in deadline order, every wait due by then.
    void advance(duration d);
    void advance_to(time_point t);
    // Moves to the earliest pending deadline, completing the waits due then; false when none.
    bool advance_to_next();
    // Waits pending (started and neither completed nor cancelled).
    std::size_t waiting() const;
    std::optional<time_point> next_deadline() const;

    struct state;

private:
    std::shared_ptr<state> state_;
};

} // namespace baton
