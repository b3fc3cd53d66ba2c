// `baton-bench memory`: the real daemon's memory. Starts `baton serve` on 127.0.0.1:0 with a temp
// data dir, measures its idle RSS, then the RSS per idle session (one message posted to each of N
// sessions, all turns finished) and per open WebSocket connection to /v1/ws (M of them; reported as
// not available if the daemon refuses the upgrade). Stops the daemon it started with SIGTERM.
#include "bench/bench.hpp"
#include "bench/measure.hpp"
#include "bench/net.hpp"
#include "bench/process.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <thread>

namespace baton::bench {

namespace json = boost::json;

namespace {

// Posts one message to each of sessions mem-<i> it claims and waits for its turn to be terminal.
asio::awaitable<void> session_worker(http_url url, std::atomic<int>& next, int total, int& errors) {
    http_connection c(co_await asio::this_coro::executor, url.host, url.port);
    for (int i; (i = next++) < total;) {
        std::string body = json::serialize(json::object{{"text", "hello"}});
        auto [ec, r] =
            co_await c.request(method_post, "/v1/sessions/mem-" + std::to_string(i) + "/messages",
                               std::move(body), milliseconds(60000));
        auto tid = ec || r.status != 202 ? std::string() : json_field(r.body, "turn_id");
        if (tid.empty()) {
            ++errors;
            continue;
        }
        auto p = co_await poll_turn(c, "", tid, milliseconds(60000));
        if (p.status != "completed") ++errors;
    }
}

// Opens WebSocket connections until `total` are open (or one fails); they stay in `conns`.
asio::awaitable<void> ws_worker(http_url url, std::atomic<int>& next, int total,
                                std::vector<std::unique_ptr<ws_connection>>& conns, int& errors) {
    auto ex = co_await asio::this_coro::executor;
    while (next++ < total) {
        auto c = std::make_unique<ws_connection>(ex, url.host, url.port);
        auto [ec, status] = co_await c->connect("/v1/ws", milliseconds(10000));
        if (ec) {
            ++errors;
            continue;
        }
        conns.push_back(std::move(c));
    }
}

void settle(milliseconds d) {
    std::this_thread::sleep_for(d);
}
} // namespace

int run_memory(const options& opt) {
    opt.only({"--baton", "--sessions", "--connections", "--concurrency", "--settle-ms"});
    std::string baton = opt.text("--baton", default_baton_path());
    int sessions = static_cast<int>(opt.number("--sessions", 10000));
    int connections = static_cast<int>(opt.number("--connections", 10000));
    int concurrency = static_cast<int>(opt.number("--concurrency", 32));
    milliseconds settle_time(static_cast<long>(opt.number("--settle-ms", 3000)));
    if (sessions < 1 || connections < 0 || concurrency < 1) {
        std::cerr << "baton-bench memory: --sessions >= 1, --connections >= 0, --concurrency >= 1\n";
        return 2;
    }
    // Before the daemon starts, so that it inherits the raised limit too.
    auto fd_limit = raise_fd_limit();
    temp_dir dir("baton-bench-memory");
    child_process daemon;
    // The embedded echo model (no BATON_MODEL).
    auto line =
        daemon.start({baton, "serve", "--listen", "127.0.0.1:0", "--data", (dir.path / "data").string()},
                     dir.path / "daemon.log");
    auto url = std::optional<http_url>(listening_url(line));
    std::cout << "daemon pid " << daemon.pid << " " << line << "\n";

    asio::io_context ctx(1);
    http_connection probe(ctx.get_executor(), url->host, url->port);
    if (!run(ctx, wait_healthy(probe))) throw std::runtime_error("GET /healthz never answered 200");
    probe.close();
    settle(settle_time / 2);
    auto idle = read_proc(daemon.pid);
    std::cout << "idle RSS: " << idle.rss_mb << " MB\n";

    std::atomic<int> next{0};
    int session_errors = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < std::min(concurrency, sessions); ++i)
        asio::co_spawn(ctx, session_worker(*url, next, sessions, session_errors),
                       [](std::exception_ptr e) {
                           if (e) std::rethrow_exception(e);
                       });
    ctx.run();
    ctx.restart();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    settle(settle_time);
    auto after = read_proc(daemon.pid);
    double per_session =
        (static_cast<double>(after.rss_bytes) - static_cast<double>(idle.rss_bytes)) / sessions;
    std::cout << sessions << " sessions in " << secs << " s (" << session_errors << " errors): RSS "
              << after.rss_mb << " MB, " << per_session << " bytes per session\n";

    json::value per_conn = nullptr;
    std::string ws_state = "not available";
    std::vector<std::unique_ptr<ws_connection>> conns;
    int ws_errors = 0;
    if (connections > 0) {
        auto first = std::make_unique<ws_connection>(ctx.get_executor(), url->host, url->port);
        auto [ec, status] = run(ctx, first->connect("/v1/ws", milliseconds(10000)));
        if (ec) {
            std::cout << "WebSocket: not available (/v1/ws answered "
                      << (status > 0 ? "HTTP " + std::to_string(status) : ec.message()) << ")\n";
        } else {
            ws_state = "available";
            conns.push_back(std::move(first));
            next = 1;
            for (int i = 0; i < std::min(concurrency, connections); ++i)
                asio::co_spawn(ctx, ws_worker(*url, next, connections, conns, ws_errors),
                               [](std::exception_ptr e) {
                                   if (e) std::rethrow_exception(e);
                               });
            ctx.run();
            ctx.restart();
            settle(settle_time);
            auto with_ws = read_proc(daemon.pid);
            double d = static_cast<double>(with_ws.rss_bytes) - static_cast<double>(after.rss_bytes);
            per_conn = conns.empty() ? 0.0 : d / static_cast<double>(conns.size());
            std::cout << conns.size() << " WebSocket connections (" << ws_errors << " failed, fd limit "
                      << fd_limit << "): RSS " << with_ws.rss_mb << " MB, " << per_conn.as_double()
                      << " bytes per connection\n";
        }
    }
    auto peak = read_proc(daemon.pid);
    std::size_t opened = conns.size();
    conns.clear();
    int exit_status = daemon.stop();
    std::cout << "daemon stopped (exit " << exit_status << "), peak RSS " << peak.hwm_mb << " MB\n";
    int errors = session_errors + ws_errors;
    print_json({{"bench", "memory"},
                {"idle_rss_mb", idle.rss_mb},
                {"rss_after_sessions_mb", after.rss_mb},
                {"rss_per_session_bytes", per_session},
                {"sessions", sessions},
                {"session_seconds", secs},
                {"ws", ws_state},
                {"rss_per_ws_conn_bytes", per_conn},
                {"connections", opened},
                {"peak_rss_mb", peak.hwm_mb},
                {"errors", errors},
                {"daemon_exit", exit_status}});
    return errors > 0 || exit_status != 0 ? 1 : 0;
}

} // namespace baton::bench
