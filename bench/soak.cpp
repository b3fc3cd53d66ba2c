// `baton-bench soak`: the daemon under steady load for minutes, as it runs when exposed: bearer
// tokens of two tenants (each with limits it stays under), SQLite, a streamed model call to the
// mock model. It starts the mock and `baton serve` itself, measures the closed-loop throughput for
// a few seconds, then paces C clients (alternately tenant a and b, one session each) at half of it:
// a warm-up, then M minutes. The agent's context window is small (4096 tokens) so that every
// session is at its budget, compacted, from the warm-up on. Every minute: turns, errors, p50/p99 of the
// completion latency (POST
// -> terminal status seen by polling), the daemon's RSS and CPU per turn. The verdict: 0 errors,
// RSS at the end within 5 % of RSS after the warm-up, and p99 steady (the minutes' spread).
// Exit 0 when the verdict holds, 1 when it does not, 2 on misuse.
#include "bench/bench.hpp"
#include "bench/measure.hpp"
#include "bench/net.hpp"
#include "bench/process.hpp"

#include <baton/auth.hpp>
#include <baton/types.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

namespace baton::bench {

namespace json = boost::json;
using clock_type = std::chrono::steady_clock;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// What one period of the run saw.
struct bucket {
    std::vector<double> done_ms;
    std::uint64_t errors = 0;
    std::map<std::string, std::uint64_t> kinds;
};

struct soak_client {
    soak_client(asio::any_io_executor ex, int i, const http_url& url, const std::string& token)
        : executor(ex), session("soak-" + std::to_string(i)), http(ex, url.host, url.port) {
        http.set_header("Authorization", "Bearer " + token);
    }
    asio::any_io_executor executor;
    std::string session;
    http_connection http;
};

// One turn: POST, then poll until terminal. Returns the error kind ("" when it completed).
asio::awaitable<std::string> one_turn(soak_client& c, double& done_ms) {
    auto t0 = clock_type::now();
    std::string body = json::serialize(json::object{{"text", "soak"}});
    std::string target = "/v1/sessions/" + c.session + "/messages";
    auto [ec, reply] =
        co_await c.http.request(method_post, std::move(target), std::move(body), milliseconds(60000));
    if (ec) co_return "connection: " + ec.message();
    if (reply.status != 202)
        co_return "http_" + std::to_string(reply.status) + " " + reply.body.substr(0, 80);
    auto tid = json_field(reply.body, "turn_id");
    auto p = co_await poll_turn(c.http, "", tid, milliseconds(60000));
    done_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    if (p.ec) co_return "poll: " + p.ec.message();
    if (p.status != "completed")
        co_return "status_" + (p.status.empty() ? std::to_string(p.last.status) : p.status);
    co_return std::string();
}

// Closed loop until `end`: the throughput the daemon reaches with these clients.
asio::awaitable<void> closed_loop(soak_client& c, clock_type::time_point end, std::uint64_t& done,
                                  std::uint64_t& errors) {
    while (clock_type::now() < end) {
        double ms = 0;
        auto err = co_await one_turn(c, ms);
        ++(err.empty() ? done : errors);
    }
}

// Paced: a turn every `period`, starting at `first`, until `end`; results go to the bucket of
// the minute (or period of `bucket_len`) the turn started in.
asio::awaitable<void> paced_loop(soak_client& c, clock_type::time_point first,
                                 clock_type::time_point end, clock_type::duration period,
                                 clock_type::time_point origin, clock_type::duration bucket_len,
                                 std::vector<bucket>& buckets, std::uint64_t& late) {
    asio::steady_timer timer(c.executor);
    auto next = first;
    for (;;) {
        if (next >= end) co_return;
        timer.expires_at(next);
        co_await timer.async_wait(use_tuple);
        auto started = clock_type::now();
        double ms = 0;
        auto err = co_await one_turn(c, ms);
        auto i = static_cast<std::size_t>((started - origin) / bucket_len);
        if (i < buckets.size()) {
            auto& b = buckets[i];
            if (err.empty()) {
                b.done_ms.push_back(ms);
            } else {
                ++b.errors;
                ++b.kinds[err];
            }
        }
        next += period;
        if (next < clock_type::now()) {
            ++late; // behind the pace: the next turn goes at once, not in a burst
            next = clock_type::now();
        }
    }
}

// Samples the daemon's RSS every `every` until `end`.
asio::awaitable<void> sampler(asio::any_io_executor ex, int pid, clock_type::time_point end,
                              clock_type::duration every, std::vector<proc_sample>& out) {
    asio::steady_timer timer(ex);
    for (auto t = clock_type::now() + every; t <= end + std::chrono::milliseconds(10); t += every) {
        timer.expires_at(t);
        co_await timer.async_wait(use_tuple);
        out.push_back(read_proc(pid));
    }
}

void spawn_all(asio::io_context& ctx, std::vector<asio::awaitable<void>> tasks) {
    for (auto& t : tasks)
        asio::co_spawn(ctx, std::move(t), [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run();
    ctx.restart();
}

} // namespace

int run_soak(const options& opt) {
    opt.only({"--minutes", "--baton", "--clients", "--rate", "--warmup-s", "--measure-s", "--bucket-s",
              "--context-window"});
    double minutes = opt.number("--minutes", 10);
    std::string baton = opt.text("--baton", default_baton_path());
    int clients_n = static_cast<int>(opt.number("--clients", 50));
    double rate_opt = opt.number("--rate", 0);
    double warmup_s = opt.number("--warmup-s", 60);
    double measure_s = opt.number("--measure-s", 15);
    double bucket_s = opt.number("--bucket-s", 60);
    if (minutes <= 0 || clients_n < 2 || warmup_s < 0 || measure_s <= 0 || bucket_s <= 0 ||
        rate_opt < 0) {
        std::cerr
            << "baton-bench soak: --minutes > 0, --clients >= 2, --measure-s > 0, --bucket-s > 0\n";
        return 2;
    }
    // Small enough that every session reaches its budget (and compaction holds it there) during
    // the warm-up: the soak then measures the steady state, not sessions still growing.
    std::int64_t context_window = static_cast<std::int64_t>(opt.number("--context-window", 4096));
    raise_fd_limit();
    temp_dir dir("baton-bench-soak");
    child_process mock;
    auto mock_url = listening_url(
        mock.start({self_path(), "mock-model", "--listen", "127.0.0.1:0"}, dir.path / "mock.log"));
    // Two tenants, one token each, with limits they stay under (checked on every turn).
    std::string token_a = make_token(), token_b = make_token();
    json::object limits{{"turns_per_minute", 1000000}, {"tokens_per_day", 1000000000000LL}};
    json::object cfg{
        {"server",
         {{"listen", "127.0.0.1:0"},
          {"tokens", json::array{json::object{{"sha256", sha256_hex(token_a)}, {"tenant", "a"}},
                                 json::object{{"sha256", sha256_hex(token_b)}, {"tenant", "b"}}}}}},
        {"storage", {{"sqlite", {{"path", (dir.path / "data" / "baton.db").string()}}}}},
        {"tenants", {{"a", {{"limits", limits}}}, {"b", {{"limits", limits}}}}},
        {"agents",
         {{"default",
           {{"model",
             {{"provider", "openai"},
              {"base_url", "http://" + mock_url.host + ":" + mock_url.port + "/v1"},
              {"model", "mock"},
              {"stream", true},
              {"context_window", context_window}}},
            {"context", {{"reserve_output_tokens", context_window / 8}}}}}}}};
    auto cfg_path = dir.path / "baton.json";
    std::ofstream(cfg_path) << json::serialize(cfg);
    child_process daemon;
    auto url = listening_url(
        daemon.start({baton, "serve", "--config", cfg_path.string()}, dir.path / "daemon.log"));
    std::cout << "daemon pid " << daemon.pid << " at " << url.host << ":" << url.port << ", mock at "
              << mock_url.host << ":" << mock_url.port << "\n";

    asio::io_context ctx(1);
    {
        http_connection probe(ctx.get_executor(), url.host, url.port);
        if (!run(ctx, wait_healthy(probe))) throw std::runtime_error("GET /healthz never answered 200");
    }
    std::vector<std::unique_ptr<soak_client>> clients;
    for (int i = 0; i < clients_n; ++i)
        clients.push_back(
            std::make_unique<soak_client>(asio::make_strand(ctx), i, url, i % 2 ? token_b : token_a));

    // 1. The throughput these clients reach, closed loop.
    std::uint64_t measured = 0, measure_errors = 0;
    {
        auto end = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                           std::chrono::duration<double>(measure_s));
        std::vector<asio::awaitable<void>> tasks;
        for (auto& c : clients)
            tasks.push_back(closed_loop(*c, end, measured, measure_errors));
        spawn_all(ctx, std::move(tasks));
    }
    double full_rate = static_cast<double>(measured) / measure_s;
    double rate = rate_opt > 0 ? rate_opt : full_rate / 2;
    std::cout << "closed loop: " << fixed(full_rate) << " turns/s (" << measure_errors
              << " errors); pacing at " << fixed(rate) << " turns/s\n";
    if (rate <= 0) {
        std::cerr << "baton-bench soak: no turn completed while measuring\n";
        return 1;
    }
    auto period = std::chrono::duration_cast<clock_type::duration>(
        std::chrono::duration<double>(clients_n / rate));

    auto paced = [&](clock_type::time_point origin, double seconds, std::vector<bucket>& buckets,
                     clock_type::duration bucket_len, std::uint64_t& late) {
        auto end = origin + std::chrono::duration_cast<clock_type::duration>(
                                std::chrono::duration<double>(seconds));
        std::vector<asio::awaitable<void>> tasks;
        for (int i = 0; i < clients_n; ++i)
            tasks.push_back(paced_loop(*clients[static_cast<std::size_t>(i)],
                                       origin + period * i / clients_n, end, period, origin, bucket_len,
                                       buckets, late));
        return tasks;
    };
    // 2. Warm-up at that pace.
    std::uint64_t warm_late = 0;
    if (warmup_s > 0) {
        std::vector<bucket> warm(1);
        auto len = std::chrono::duration_cast<clock_type::duration>(
            std::chrono::duration<double>(warmup_s + 1));
        spawn_all(ctx, paced(clock_type::now(), warmup_s, warm, len, warm_late));
        std::cout << "warm-up: " << fixed(warmup_s, 0) << " s, " << warm[0].done_ms.size() << " turns, "
                  << warm[0].errors << " errors\n";
    }
    auto after_warmup = read_proc(daemon.pid);
    std::cout << "RSS after warm-up: " << fixed(after_warmup.rss_mb, 2) << " MB\n";

    // 3. The soak.
    auto bucket_len =
        std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(bucket_s));
    double soak_s = minutes * 60;
    auto n_buckets = static_cast<std::size_t>(std::ceil(soak_s / bucket_s));
    std::vector<bucket> buckets(n_buckets);
    std::vector<proc_sample> samples;
    std::uint64_t late = 0;
    auto origin = clock_type::now();
    auto cpu0 = read_proc(daemon.pid);
    auto tasks = paced(origin, soak_s, buckets, bucket_len, late);
    tasks.push_back(sampler(
        ctx.get_executor(), daemon.pid,
        origin + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(soak_s)),
        bucket_len, samples));
    spawn_all(ctx, std::move(tasks));
    double elapsed = std::chrono::duration<double>(clock_type::now() - origin).count();
    auto end_sample = read_proc(daemon.pid);

    std::uint64_t turns = 0, errors = 0;
    std::map<std::string, std::uint64_t> kinds;
    std::vector<double> p99s, all_ms;
    json::array minutes_json;
    std::cout << "period  turns  turns/s  p50 ms  p99 ms  errors  RSS MB\n";
    for (std::size_t i = 0; i < buckets.size(); ++i) {
        auto& b = buckets[i];
        all_ms.insert(all_ms.end(), b.done_ms.begin(), b.done_ms.end());
        auto n = b.done_ms.size();
        auto lat = summarize(b.done_ms);
        turns += n;
        errors += b.errors;
        for (auto& [k, v] : b.kinds)
            kinds[k] += v;
        double rss = i < samples.size() ? samples[i].rss_mb : end_sample.rss_mb;
        if (n > 0) p99s.push_back(lat.p99);
        std::cout << std::setw(6) << i + 1 << std::setw(7) << n << std::setw(9)
                  << fixed(static_cast<double>(n) / bucket_s) << std::setw(8) << fixed(lat.p50, 2)
                  << std::setw(8) << fixed(lat.p99, 2) << std::setw(8) << b.errors << std::setw(8)
                  << fixed(rss, 2) << "\n";
        minutes_json.push_back(json::object{{"turns", n},
                                            {"p50_ms", lat.p50},
                                            {"p99_ms", lat.p99},
                                            {"errors", b.errors},
                                            {"rss_mb", rss}});
    }
    auto overall = summarize(all_ms);
    double growth =
        after_warmup.rss_bytes > 0
            ? (static_cast<double>(end_sample.rss_bytes) - static_cast<double>(after_warmup.rss_bytes)) /
                  static_cast<double>(after_warmup.rss_bytes) * 100
            : 0;
    double p99_min = p99s.empty() ? 0 : *std::min_element(p99s.begin(), p99s.end());
    double p99_max = p99s.empty() ? 0 : *std::max_element(p99s.begin(), p99s.end());
    double cpu_per_turn = turns > 0 ? static_cast<double>(end_sample.cpu_us - cpu0.cpu_us) /
                                          static_cast<double>(turns + errors)
                                    : 0;
    std::cout << "soak: " << turns << " turns in " << fixed(elapsed, 1) << " s ("
              << fixed(turns / elapsed) << " turns/s), " << errors << " errors, " << late
              << " turns behind the pace\n";
    for (auto& [k, v] : kinds)
        std::cout << "  " << k << ": " << v << "\n";
    std::cout << "completion ms p50/p99/max: " << fixed(overall.p50, 2) << " / " << fixed(overall.p99, 2)
              << " / " << fixed(overall.max, 2) << "; p99 per period " << fixed(p99_min, 2) << "-"
              << fixed(p99_max, 2) << "\n";
    std::cout << "RSS: " << fixed(after_warmup.rss_mb, 2) << " MB after warm-up, "
              << fixed(end_sample.rss_mb, 2) << " MB at the end (" << fixed(growth, 2) << " %), peak "
              << fixed(end_sample.hwm_mb, 2) << " MB\n";
    std::cout << "daemon CPU: " << fixed(cpu_per_turn) << " us per turn\n";
    clients.clear();
    int daemon_exit = daemon.stop();
    mock.stop();
    bool ok = errors == 0 && std::abs(growth) <= 5.0 && daemon_exit == 0;
    std::cout << "verdict: " << (ok ? "holds" : "does not hold")
              << " (0 errors, RSS within 5 %, daemon exit " << daemon_exit << ")\n";
    print_json({{"bench", "soak"},
                {"minutes", minutes},
                {"clients", clients_n},
                {"tenants", 2},
                {"closed_loop_turns_per_s", full_rate},
                {"paced_turns_per_s", rate},
                {"turns", turns},
                {"errors", errors},
                {"late", late},
                {"p50_ms", overall.p50},
                {"p99_ms", overall.p99},
                {"max_ms", overall.max},
                {"p99_min_ms", p99_min},
                {"p99_max_ms", p99_max},
                {"rss_after_warmup_mb", after_warmup.rss_mb},
                {"rss_end_mb", end_sample.rss_mb},
                {"rss_growth_pct", growth},
                {"peak_rss_mb", end_sample.hwm_mb},
                {"cpu_us_per_turn", cpu_per_turn},
                {"daemon_exit", daemon_exit},
                {"periods", std::move(minutes_json)}});
    return ok ? 0 : 1;
}

} // namespace baton::bench
