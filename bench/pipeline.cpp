// `baton-bench pipeline`: turns through the full seven-stage pipeline in-process, on the memory
// (or SQLite) store and a null model, from K concurrent sessions on N threads. Reports turns/s
// and the average wall time per stage hop (7 hops a turn, all threads together). With
// `--session-length N`: N turns in one session, comparing the first 100 with the last 100.
#include "bench/bench.hpp"
#include "bench/measure.hpp"

#include <baton/pipeline.hpp>
#include <baton/framework.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>

#include <sched.h>
#include <unistd.h>

namespace baton::bench {

namespace {
// Answers at once with a fixed text: the pipeline's own cost is what is measured.
class null_model final : public model_client {
public:
    asio::awaitable<chat_completion> complete(const model_request&, const delta_handler&) override {
        chat_completion c;
        c.text = "ok";
        c.finish_reason = "stop";
        co_return c;
    }
    std::string name() const override { return "null"; }
};

asio::awaitable<void> session_loop(framework& fw, std::string sid,
                                   std::chrono::steady_clock::time_point end,
                                   std::atomic<std::uint64_t>& turns) {
    inbound in;
    in.session_id = std::move(sid);
    in.text = "hello";
    while (std::chrono::steady_clock::now() < end) {
        inbound copy = in;
        co_await fw.process_inbound(std::move(copy));
        turns.fetch_add(1, std::memory_order_relaxed);
    }
}
} // namespace

namespace {
// Pins the calling thread, and the threads it starts from now on, to the core it runs on.
void pin_to_this_core() {
    cpu_set_t set;
    CPU_ZERO(&set);
    int cpu = ::sched_getcpu();
    CPU_SET(cpu < 0 ? 0 : cpu, &set);
    ::sched_setaffinity(0, sizeof set, &set);
}

// One session, turns one after another: the first 100 turns against the last 100, by wall time
// and by CPU time. With the SQLite store every turn waits four times for the store's thread. When
// the two threads run on two cores, each wait is a wake-up across cores, which on a VM costs more
// than the turn's own work (2-3x the CPU), and the scheduler moves the threads between the two
// placements at any time: pinned (the default), both share one core and the figures compare the
// turns' own cost.
int run_session_length(framework& fw, std::int64_t turns, const std::string& store_name, bool pinned) {
    asio::io_context ctx(1);
    std::vector<double> us(static_cast<std::size_t>(turns)), cpu(us.size());
    auto one_session = [&]() -> asio::awaitable<void> {
        inbound in;
        in.session_id = "long-session";
        in.text = "hello";
        for (std::int64_t i = 0; i < turns; ++i) {
            auto c0 = self_cpu_us();
            auto t0 = std::chrono::steady_clock::now();
            co_await fw.process_inbound(in);
            auto at = static_cast<std::size_t>(i);
            auto elapsed = std::chrono::steady_clock::now() - t0;
            us[at] = std::chrono::duration<double, std::micro>(elapsed).count();
            cpu[at] = self_cpu_us() - c0;
        }
    };
    asio::co_spawn(ctx, one_session(), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
    });
    ctx.run();
    auto window = static_cast<std::ptrdiff_t>(std::min<std::size_t>(100, us.size() / 2));
    auto median_of = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v[v.size() / 2];
    };
    auto ratio = [](double a, double b) { return a > 0 ? b / a : 0; };
    double first = median_of({us.begin(), us.begin() + window});
    double last = median_of({us.end() - window, us.end()});
    double first_cpu = median_of({cpu.begin(), cpu.begin() + window});
    double last_cpu = median_of({cpu.end() - window, cpu.end()});
    std::cout << "session length: " << turns << " turns in one session, " << store_name << " store"
              << (pinned ? ", pinned to one core" : "") << "\n";
    std::cout << "median us per turn, first " << window << ": " << first << ", last " << window << ": "
              << last << ", ratio " << ratio(first, last) << "\n";
    std::cout << "median CPU us per turn (all threads), first " << window << ": " << first_cpu
              << ", last " << window << ": " << last_cpu << ", ratio " << ratio(first_cpu, last_cpu)
              << "\n";
    print_json({{"bench", "pipeline-session-length"},
                {"store", store_name},
                {"turns", turns},
                {"pinned", pinned},
                {"first_us_per_turn", first},
                {"last_us_per_turn", last},
                {"ratio", ratio(first, last)},
                {"first_cpu_us_per_turn", first_cpu},
                {"last_cpu_us_per_turn", last_cpu},
                {"cpu_ratio", ratio(first_cpu, last_cpu)}});
    return 0;
}

std::shared_ptr<store> open_store(const std::string& name, const std::filesystem::path& dir) {
    if (name == "memory") return std::shared_ptr<store>(make_memory_store());
    if (name == "sqlite")
        return std::shared_ptr<store>(make_sqlite_store({(dir / "bench.db").string()}));
    throw std::invalid_argument("--store: memory or sqlite");
}
} // namespace

int run_pipeline(const options& opt) {
    opt.only({"--seconds", "--threads", "--sessions", "--store", "--session-length", "--context-window",
              "--io", "--pin"});
    double seconds = opt.number("--seconds", 5);
    int threads = static_cast<int>(opt.number("--threads", 2));
    int sessions = static_cast<int>(opt.number("--sessions", 64));
    auto length = static_cast<std::int64_t>(opt.number("--session-length", 0));
    std::string store_name = opt.text("--store", "memory");
    std::string io = opt.text("--io", "shared");
    // The agent's model.context_window: with the default, sessions compact (summarise through
    // the null model) every few hundred turns, as long sessions do.
    auto window = static_cast<std::int64_t>(opt.number("--context-window", 8192));
    auto pin = opt.number("--pin", 1);
    if (seconds <= 0 || threads < 1 || sessions < 1 || length < 0 || window < 2048 ||
        (io != "shared" && io != "per-thread") || (pin != 0 && pin != 1)) {
        std::cerr << "baton-bench pipeline: --seconds > 0, --threads >= 1, --sessions >= 1, "
                     "--session-length >= 0, --context-window >= 2048, --io shared|per-thread, "
                     "--pin 0|1\n";
        return 2;
    }
    // --session-length: this thread and the store's (started below, inheriting it) share one
    // core, so that first and last turns are compared under the same thread placement.
    if (length > 0 && pin == 1) pin_to_this_core();
    auto dir = std::filesystem::temp_directory_path() /
               ("baton-bench-" + std::to_string(::getpid()) + "-" + make_turn_id());
    std::filesystem::create_directories(dir);
    struct cleanup {
        std::filesystem::path dir;
        ~cleanup() {
            std::error_code ec;
            std::filesystem::remove_all(dir, ec);
        }
    } remove_dir{dir};
    store_runner db{open_store(store_name, dir)};
    framework fw{db, make_default_plugin(db)};
    agent a;
    a.model = std::make_shared<null_model>();
    a.config.model.context_window = window;
    a.config.context.reserve_output_tokens = 1024;
    fw.add_agent(a);
    if (length > 0) return run_session_length(fw, length, store_name, pin == 1);

    // shared: one io_context run by all threads (sessions on strands, handlers may hop threads);
    // per-thread: one io_context per thread, sessions spread over them (each session stays on its
    // thread, as a daemon pinning sessions to io threads would run).
    std::vector<std::unique_ptr<asio::io_context>> contexts;
    for (int i = 0; i < (io == "shared" ? 1 : threads); ++i)
        contexts.push_back(std::make_unique<asio::io_context>(io == "shared" ? threads : 1));
    std::atomic<std::uint64_t> turns{0};
    auto start = std::chrono::steady_clock::now();
    auto end = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(seconds));
    for (int i = 0; i < sessions; ++i)
        asio::co_spawn(asio::make_strand(*contexts[static_cast<std::size_t>(i) % contexts.size()]),
                       session_loop(fw, "bench-" + std::to_string(i), end, turns),
                       [](std::exception_ptr e) {
                           if (e) std::rethrow_exception(e);
                       });
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i)
        pool.emplace_back([&, i] { contexts[static_cast<std::size_t>(i) % contexts.size()]->run(); });
    for (auto& t : pool)
        t.join();
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double n = static_cast<double>(turns.load());
    double per_s = n / elapsed;
    double ns_per_hop = n > 0 ? elapsed * 1e9 * threads / (n * 7) : 0;
    std::cout << "pipeline: " << turns.load() << " turns in " << elapsed << " s on " << threads
              << " threads, " << sessions << " sessions, " << store_name << " store, " << io << " io\n";
    std::cout << "turns/s: " << static_cast<std::uint64_t>(per_s) << "\n";
    std::cout << "ns per stage hop (thread time / 7 stages): " << static_cast<std::uint64_t>(ns_per_hop)
              << "\n";
    json::object out{{"bench", "pipeline"},   {"store", store_name},
                     {"turns", turns.load()}, {"seconds", elapsed},
                     {"threads", threads},    {"sessions", sessions}, {"io", io},
                     {"turns_per_s", per_s},  {"ns_per_stage_hop", ns_per_hop}};
    if (store_name == "sqlite")
        out["calls_per_commit"] =
            db.batches() ? static_cast<double>(db.calls()) / static_cast<double>(db.batches()) : 0.0;
    print_json(out);
    return 0;
}

} // namespace baton::bench
