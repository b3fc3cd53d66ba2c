// A baton::service in the test's process with its timers on a manual clock: one io thread, the
// log captured, every wait bounded. A test moves time with `clock` and checks what happened just
// before and just after a deadline; parked(n) says the components have settled on their timers.
#pragma once

#include "tests/test_util.hpp"

#include <baton/clock.hpp>
#include <baton/log.hpp>
#include <baton/service.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace baton::test {

struct clocked_service {
    // `opts.clock` is replaced with `clock`, which starts at `utc`. Memory store unless the
    // config says otherwise; no HTTP listener unless opts.http.
    explicit clocked_service(service_options opts, time_ms utc = now_ms())
        : clock(std::make_shared<manual_clock>(utc)) {
        log::set_sink([this](std::string_view line) {
            std::lock_guard lock(log_mutex);
            log_lines.emplace_back(line);
        });
        opts.clock = clock;
        options = std::move(opts);
        svc = std::make_unique<service>(io.get_executor(), options);
    }
    ~clocked_service() {
        if (svc && svc->running()) stop();
        svc.reset();
        work.reset();
        io.stop();
        thread.join();
        log::set_sink({});
    }

    static service_options memory_options() {
        service_options o;
        o.http = false;
        o.config.storage.type = storage_config::kind::memory;
        return o;
    }

    void start() {
        auto f = svc->async_start(asio::use_future);
        wait(f);
    }
    // Time goes on while the service stops (a paced or backed-off send in flight finishes instead
    // of holding up the drain); then no wait is left on the clock.
    void stop() {
        auto f = svc->async_stop(asio::use_future);
        auto deadline = std::chrono::steady_clock::now() + 10s;
        while (f.wait_for(1ms) != std::future_status::ready &&
               std::chrono::steady_clock::now() < deadline)
            clock->advance_to_next();
        wait(f);
        BOOST_TEST(clock->waiting() == 0u, "a timer is left after the service stopped");
    }
    // A new service on the same options and clock (the store file survives; a memory store not).
    void restart() {
        if (svc->running()) stop();
        svc.reset();
        svc = std::make_unique<service>(io.get_executor(), options);
        start();
    }

    // Runs `a` on the io thread and returns its result (bounded).
    template <class T> T run(asio::awaitable<T> a) {
        auto f = asio::co_spawn(io, std::move(a), asio::use_future);
        return wait(f);
    }
    template <class T> static T wait(std::future<T>& f) {
        BOOST_REQUIRE_MESSAGE(f.wait_for(10s) == std::future_status::ready, "no answer within 10 s");
        return f.get();
    }

    std::int64_t turns(const std::string& sid) {
        auto v = run(svc->runtime().get_session(sid));
        return v ? v->record.turns : 0;
    }
    // The session's user messages, oldest first.
    std::vector<std::string> user_texts(const std::string& sid) {
        std::vector<std::string> out;
        for (const auto& e : run(svc->runtime().read_tape(sid, 0, 1000))) {
            const auto* role = e.payload.if_contains("role");
            if (e.kind == tape_kind::message && role && *role == "user")
                out.emplace_back(e.payload.at("text").as_string());
        }
        return out;
    }
    std::vector<outbox_item> outbox(outbox_status s) {
        store::outbox_filter f;
        f.statuses = {s};
        return run(svc->runtime().list_outbox(f));
    }

    // Waits until `n` waits are pending on the clock: whatever was due has happened, and nothing
    // more that depends on time can until the clock moves.
    bool parked(std::size_t n = 1) {
        return eventually([&] { return clock->waiting() == n; });
    }

    std::size_t logged(std::string_view needle) {
        std::lock_guard lock(log_mutex);
        std::size_t n = 0;
        for (const auto& l : log_lines)
            n += l.find(needle) != std::string::npos;
        return n;
    }
    std::string log_text() {
        std::lock_guard lock(log_mutex);
        std::string out;
        for (const auto& l : log_lines)
            out += l + "\n";
        return out;
    }

    asio::io_context io{1};
    asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
    std::thread thread{[this] { io.run(); }};
    std::shared_ptr<manual_clock> clock;
    service_options options;
    std::unique_ptr<service> svc;
    std::mutex log_mutex;
    std::vector<std::string> log_lines;
};

} // namespace baton::test
