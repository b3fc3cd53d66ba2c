// The daemon's metrics (GET /metrics, Prometheus text format 0.0.4): counters and fixed-bucket
// histograms that the turn's hot path updates with relaxed atomic adds only (no lock, no
// allocation), and a renderer that reads them, with gauges sampled at scrape time, into text.
#pragma once

#include <baton/store.hpp>
#include <baton/types.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace baton {

// A latency histogram with the bounds below (seconds); the sum is kept in nanoseconds.
class latency_histogram {
public:
    static constexpr std::array<std::int64_t, 16> bounds_ns{
        1'000'000,      2'500'000,      5'000'000,      10'000'000,     25'000'000,    50'000'000,
        100'000'000,    250'000'000,    500'000'000,    1'000'000'000,  2'500'000'000, 5'000'000'000,
        10'000'000'000, 30'000'000'000, 60'000'000'000, 120'000'000'000};

    void observe(std::chrono::nanoseconds d) noexcept;

    struct snapshot {
        std::array<std::uint64_t, bounds_ns.size() + 1> buckets{}; // per bucket; the last is +Inf
        std::uint64_t count = 0;                                   // the buckets' total
        std::uint64_t sum_ns = 0;
    };
    snapshot read() const noexcept;

private:
    // Threads add to their own shard (its own cache lines): turns on several threads would
    // otherwise bounce the same counters between cores on every stage.
    static constexpr std::size_t shard_count = 8;
    struct alignas(64) shard {
        std::array<std::atomic<std::uint64_t>, bounds_ns.size() + 1> buckets{};
        std::atomic<std::uint64_t> sum_ns{0};
    };
    std::array<shard, shard_count> shards_{};
};

// The seven stages of a turn (framework.hpp), in order.
enum class turn_stage {
    resolve_session,
    load_state,
    build_prompt,
    run_model,
    save_state,
    render_outbound,
    dispatch_outbound
};
inline constexpr std::size_t turn_stage_count = 7;
std::optional<turn_stage> parse_turn_stage(std::string_view name) noexcept;
std::string_view to_string(turn_stage s) noexcept;

enum class connection_kind { http, websocket, sse };
inline constexpr std::size_t connection_kind_count = 3;

// What the renderer samples at scrape time.
struct metrics_gauges {
    std::int64_t queue_depth = 0;
    std::int64_t turns_running = 0;
    std::int64_t sessions_live = 0;
    // Group commit: transactions committed by the store thread, and the store calls they carried
    // (0 and 0 for a store called inline, like the memory store).
    std::uint64_t store_batches = 0;
    std::uint64_t store_calls = 0;
    std::optional<store::outbox_counts> outbox; // nullopt: the store could not be read (no samples)
};

// One per framework (so one per runtime): embedding two runtimes keeps two sets of numbers.
class metrics_registry : public std::enable_shared_from_this<metrics_registry> {
public:
    void turn_accepted() noexcept { accepted_.fetch_add(1, std::memory_order_relaxed); }
    // A turn reached a terminal status (queued and running are ignored).
    void turn_finished(turn_status s) noexcept;
    void observe_turn(std::chrono::nanoseconds d) noexcept { turn_.observe(d); }
    void observe_stage(turn_stage s, std::chrono::nanoseconds d) noexcept {
        stages_[static_cast<std::size_t>(s)].observe(d);
    }
    void observe_model_call(bool ok, std::chrono::nanoseconds d) noexcept {
        model_calls_[ok ? 0 : 1].observe(d);
    }

    // Times one model call: observed when destroyed, as `error` unless ok() was called.
    class call_timer {
    public:
        explicit call_timer(metrics_registry& r) noexcept
            : registry_(r), started_(std::chrono::steady_clock::now()) {}
        call_timer(const call_timer&) = delete;
        call_timer& operator=(const call_timer&) = delete;
        ~call_timer() { registry_.observe_model_call(ok_, std::chrono::steady_clock::now() - started_); }
        void ok() noexcept { ok_ = true; }

    private:
        metrics_registry& registry_;
        std::chrono::steady_clock::time_point started_;
        bool ok_ = false;
    };

    // Counts an open connection until it is destroyed; it keeps the registry alive, so that a
    // connection destroyed with its io_context after the runtime is gone is harmless.
    class connection_guard {
    public:
        connection_guard() = default;
        connection_guard(std::shared_ptr<metrics_registry> r, connection_kind k) noexcept;
        connection_guard(connection_guard&& o) noexcept = default;
        connection_guard& operator=(connection_guard&& o) noexcept;
        ~connection_guard();

    private:
        std::shared_ptr<metrics_registry> registry_;
        connection_kind kind_ = connection_kind::http;
    };
    connection_guard open_connection(connection_kind k) {
        return connection_guard(shared_from_this(), k);
    }
    std::int64_t open_connections(connection_kind k) const noexcept {
        return connections_[static_cast<std::size_t>(k)].load(std::memory_order_relaxed);
    }

    // The exposition text (Prometheus 0.0.4) of every family, with the sampled gauges.
    std::string render(const metrics_gauges& g) const;

private:
    std::atomic<std::uint64_t> accepted_{0};
    std::array<std::atomic<std::uint64_t>, 5>
        finished_{}; // completed, stopped, failed, timed_out, step_limit
    latency_histogram turn_;
    std::array<latency_histogram, turn_stage_count> stages_;
    std::array<latency_histogram, 2> model_calls_; // ok, error
    std::array<std::atomic<std::int64_t>, connection_kind_count> connections_{};
};

// The Content-Type of the exposition text.
inline constexpr std::string_view metrics_content_type = "text/plain; version=0.0.4; charset=utf-8";

} // namespace baton
