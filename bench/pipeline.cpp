// `baton-bench pipeline`: turns through the full seven-stage pipeline in-process, on the memory
// store and a null model, from K concurrent sessions on N threads. Reports turns/s and the
// average wall time per stage hop (7 hops a turn, all threads together).
#include "bench/bench.hpp"

#include <baton/framework.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

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

int run_pipeline(const options& opt) {
    double seconds = opt.number("--seconds", 5);
    int threads = static_cast<int>(opt.number("--threads", 2));
    int sessions = static_cast<int>(opt.number("--sessions", 64));
    if (seconds <= 0 || threads < 1 || sessions < 1) {
        std::cerr << "baton-bench pipeline: --seconds > 0, --threads >= 1, --sessions >= 1\n";
        return 2;
    }
    store_runner db{std::shared_ptr<store>(make_memory_store())};
    framework fw(db);
    agent a;
    a.model = std::make_shared<null_model>();
    fw.add_agent(a);

    asio::io_context ctx(threads);
    std::atomic<std::uint64_t> turns{0};
    auto start = std::chrono::steady_clock::now();
    auto end = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(seconds));
    for (int i = 0; i < sessions; ++i)
        asio::co_spawn(asio::make_strand(ctx),
                       session_loop(fw, "bench-" + std::to_string(i), end, turns),
                       [](std::exception_ptr e) {
                           if (e) std::rethrow_exception(e);
                       });
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i)
        pool.emplace_back([&] { ctx.run(); });
    for (auto& t : pool)
        t.join();
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double n = static_cast<double>(turns.load());
    double per_s = n / elapsed;
    double ns_per_hop = n > 0 ? elapsed * 1e9 * threads / (n * 7) : 0;
    std::cout << "pipeline: " << turns.load() << " turns in " << elapsed << " s on " << threads
              << " threads, " << sessions << " sessions\n";
    std::cout << "turns/s: " << static_cast<std::uint64_t>(per_s) << "\n";
    std::cout << "ns per stage hop (thread time / 7 stages): " << static_cast<std::uint64_t>(ns_per_hop)
              << "\n";
    print_json({{"bench", "pipeline"},
                {"turns", turns.load()},
                {"seconds", elapsed},
                {"threads", threads},
                {"sessions", sessions},
                {"turns_per_s", per_s},
                {"ns_per_stage_hop", ns_per_hop}});
    return 0;
}

} // namespace baton::bench
