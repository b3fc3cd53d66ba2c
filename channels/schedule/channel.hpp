// The schedule channel: for each configured schedule a timer coroutine that fires its text into
// its session through runtime::accept, like a message from a user. The last slot fired (at first
// the time of the first start) is kept in cursor `schedule:<name>`; each fire carries the idempotency
// key "schedule <name> <slot ms>" (with a space, which no HTTP Idempotency-Key holds), so a crash
// between the accept and the cursor write cannot fire a slot twice. Missed slots: see next_fire.hpp.
#pragma once

#include "channels/schedule/next_fire.hpp"

#include <baton/clock.hpp>
#include <baton/config.hpp>
#include <baton/runtime.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace baton::schedule {

struct options {
    // Slots are read on its UTC time and waited for on its timers; tests pass a manual_clock.
    std::shared_ptr<baton::clock> clock = system_clock();
    // The longest single timer wait: the clock is read again after it, so a wall clock that jumps
    // is followed within this.
    std::chrono::milliseconds max_wait{std::chrono::seconds(30)};
};

// The idempotency key and cursor name of a schedule's fires.
std::string fire_key(std::string_view name, time_ms slot);
std::string cursor_name(std::string_view name);

namespace detail {
struct worker; // one schedule's timer and state (channel.cpp)
}

class channel {
public:
    // Cron texts must have been validated (parse_config does).
    // The timers run on strands of `ex`.
    channel(asio::any_io_executor ex, runtime& rt, std::vector<schedule_config> schedules,
            options o = {});
    ~channel();
    channel(const channel&) = delete;
    channel& operator=(const channel&) = delete;

    // Starts one coroutine per schedule (after runtime::recover, so that recovered turns queue
    // first). Once only: later calls do nothing.
    void start();
    // Cancels every timer; a fire in progress finishes its accept and cursor write. Idempotent.
    void stop();
    // Coroutines still running (0 once stopped ones have ended).
    std::size_t running() const { return running_->load(); }

private:
    runtime& rt_;
    options opts_;
    std::vector<std::shared_ptr<detail::worker>> workers_;
    std::atomic<bool> started_{false};
    std::shared_ptr<std::atomic<std::size_t>> running_ = std::make_shared<std::atomic<std::size_t>>(0);
};

} // namespace baton::schedule
