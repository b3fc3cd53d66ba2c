#include "src/daemon.hpp"
#include "src/wiring.hpp"

#include <baton/framework.hpp>
#include <baton/http_client.hpp>
#include <baton/http_server.hpp>
#include <baton/log.hpp>
#include <baton/openai_client.hpp>
#include <baton/runtime.hpp>

#include "channels/schedule/channel.hpp"
#include "channels/telegram/channel.hpp"
#include "channels/webhook/channel.hpp"
#include "channels/ws/channel.hpp"

#include <baton/delivery.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>
#include <thread>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#ifdef BATON_JEMALLOC
// jemalloc's settings, read at its start: one arena per CPU (its default, four per CPU, makes
// ~0.3 MB more idle RSS). MALLOC_CONF in the environment adds to and overrides this.
extern "C" {
const char* malloc_conf = "percpu_arena:percpu";
}
#endif

namespace baton {

namespace {
using asio::ip::tcp;

// glibc returns the top of a heap to the kernel whenever 128 KiB of it is free, and serves
// buffers over 128 KiB (a long context's request body) by mmap: under load the io threads'
// arenas shrink and grow again many times a second (madvise, page faults, consolidation), ~8% of
// the daemon's CPU per turn in bench/RESULTS.md. A daemon keeps what it freed, up to 64 MiB.
// GLIBC_TUNABLES or MALLOC_* in the environment win over this. Built with jemalloc (the default,
// see CMakeLists.txt), none of this applies: jemalloc keeps freed pages for a while on its own.
void tune_malloc() {
#if defined(__GLIBC__) && !defined(BATON_JEMALLOC)
    if (std::getenv("GLIBC_TUNABLES") || std::getenv("MALLOC_TRIM_THRESHOLD_") ||
        std::getenv("MALLOC_MMAP_THRESHOLD_"))
        return;
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    mallopt(M_MMAP_THRESHOLD, 16 << 20);
#endif
}

std::optional<tcp::endpoint> parse_endpoint(const std::string& s, std::string& error) {
    auto colon = s.rfind(':');
    if (colon == std::string::npos) {
        error = "expected HOST:PORT, got " + s;
        return std::nullopt;
    }
    std::string host = s.substr(0, colon), port = s.substr(colon + 1);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    if (host == "localhost") host = "127.0.0.1";
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(host, ec);
    if (ec) {
        error = "not an IP address: " + host;
        return std::nullopt;
    }
    int p = -1;
    try {
        std::size_t used = 0;
        p = std::stoi(port, &used);
        if (used != port.size()) p = -1;
    } catch (...) {
    }
    if (p < 0 || p > 65535) {
        error = "not a port: " + port;
        return std::nullopt;
    }
    return tcp::endpoint(addr, static_cast<unsigned short>(p));
}

std::string url_host(const tcp::endpoint& ep) {
    auto a = ep.address();
    return a.is_v6() ? "[" + a.to_string() + "]" : a.to_string();
}
} // namespace

int run_daemon(const serve_options& opts) {
    tune_malloc();
    auto loaded = load_config_or_report(opts.config_file);
    if (!loaded) return 2;
    config cfg = std::move(*loaded);
    if (opts.listen) cfg.server.listen = *opts.listen;
    if (opts.threads) cfg.server.threads = *opts.threads;
    if (opts.data_dir)
        cfg.storage.sqlite_path = (std::filesystem::path(*opts.data_dir) / "baton.db").string();
    else if (!opts.config_file)
        cfg.storage.sqlite_path = "var/baton.db";

    std::string error;
    auto ep = parse_endpoint(cfg.server.listen, error);
    if (!ep) {
        std::cerr << "baton: --listen: " << error << "\n";
        return 2;
    }
    if (!ep->address().is_loopback() && cfg.server.tokens.empty() && !opts.insecure_no_auth) {
        std::cerr << "baton: refusing to listen on " << cfg.server.listen
                  << " without server.tokens; pass --insecure-no-auth to allow it\n";
        return 2;
    }
    if (!cfg.server.tokens.empty()) {
        std::cerr << "baton: server.tokens: bearer-token auth is not available in this build\n";
        return 2;
    }

    unsigned threads = cfg.server.threads > 0 ? static_cast<unsigned>(cfg.server.threads)
                                              : std::max(1u, std::thread::hardware_concurrency());
    asio::io_context ioc(static_cast<int>(threads));
    runtime_parts parts;
    try {
        parts = build_runtime_parts(cfg, ioc.get_executor());
    } catch (const std::exception& e) {
        std::cerr << "baton: " << e.what() << "\n";
        return 1;
    }
    auto& db = parts.db;
    auto& fw = parts.fw;
    event_hub_options events;
    events.events_per_turn = static_cast<std::size_t>(cfg.server.events_per_turn);
    runtime rt(ioc.get_executor(), *fw, events);
    std::unique_ptr<ws::channel> websocket;
    if (cfg.channels.ws_enabled) {
        ws::options wo;
        wo.max_connections = static_cast<std::size_t>(cfg.channels.ws_max_connections);
        wo.max_frame_bytes = static_cast<std::size_t>(cfg.channels.ws_max_frame_bytes);
        wo.max_queued_frames = static_cast<std::size_t>(cfg.channels.ws_max_queued_frames);
        wo.idle_timeout = cfg.channels.ws_idle_timeout;
        websocket = std::make_unique<ws::channel>(rt, wo);
        fw->register_plugin(websocket->make_plugin());
    }
    // Pushing channels: their replies go through the outbox's delivery workers.
    delivery outbox(ioc.get_executor(), rt);
    if (!cfg.channels.webhook_targets.empty())
        outbox.add_channel(std::make_shared<webhook::channel>(
            cfg.channels.webhook_targets, parts.http,
            static_cast<std::size_t>(cfg.channels.webhook_max_concurrency)));
    // Telegram: the poller admits chat messages; the sender (sendMessage) delivers the replies.
    std::unique_ptr<telegram::poller> telegram_poller;
    if (cfg.channels.telegram_token_env) {
        std::string why;
        auto to = telegram::options_from(cfg.channels, why);
        if (!to) {
            std::cerr << "baton: " << why << "\n";
            return 2;
        }
        outbox.add_channel(telegram::make_sender(parts.http, *to));
        telegram_poller = std::make_unique<telegram::poller>(ioc.get_executor(), rt, parts.http, *to);
    }
    fw->register_plugin(outbox.make_plugin());
    // Schedules: timed messages into their sessions, started once recovery is done.
    std::unique_ptr<schedule::channel> schedules;
    if (!cfg.channels.schedules.empty())
        schedules = std::make_unique<schedule::channel>(ioc.get_executor(), rt, cfg.channels.schedules);
    std::atomic<bool> ready{false};
    http_server_options hopts;
    hopts.max_body_bytes = static_cast<std::size_t>(cfg.server.max_body_bytes);
    hopts.header_timeout = cfg.server.header_timeout;
    hopts.idle_timeout = cfg.server.idle_timeout;
    hopts.sse_heartbeat = cfg.server.sse_heartbeat;
    http_server server(ioc.get_executor(), rt, hopts, [&] { return ready.load() && !rt.draining(); },
                       websocket.get());
    if (auto ec = server.listen(*ep)) {
        std::cerr << "baton: cannot listen on " << cfg.server.listen << ": " << ec.message() << "\n";
        return 1;
    }

    // The guard comes first: a run() that finds no work would leave the io_context stopped.
    auto work = asio::make_work_guard(ioc);
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < threads; ++i)
        pool.emplace_back([&] { ioc.run(); });

    int exit_code = 0;
    try {
        // Items left by the last process first (sending -> uncertain), then the turns it left.
        asio::co_spawn(ioc, outbox.start(), asio::use_future).get();
        auto recovered = asio::co_spawn(ioc, rt.recover(), asio::use_future);
        recovered.get();
    } catch (const std::exception& e) {
        log::error("recovery failed", {{"error", e.what()}});
        exit_code = 1;
    }
    asio::signal_set signals(ioc, SIGINT, SIGTERM);
    if (exit_code == 0) {
        // After recovery, so that a catch-up fire queues behind the turns an earlier process left.
        if (schedules) schedules->start();
        server.start();
        if (telegram_poller) telegram_poller->start();
        ready.store(true);
        auto local = server.local_endpoint();
        std::cout << "listening on http://" << url_host(local) << ":" << local.port() << std::endl;
        log::info("ready",
                  {{"listen", url_host(local) + ":" + std::to_string(local.port())},
                   {"threads", threads},
                   {"storage", cfg.storage.type == storage_config::kind::sqlite ? cfg.storage.sqlite_path
                                                                                : "memory"}});
        std::promise<int> stop_signal;
        signals.async_wait(
            [&](const boost::system::error_code& ec, int sig) { stop_signal.set_value(ec ? 0 : sig); });
        int sig = stop_signal.get_future().get();
        log::info("draining", {{"signal", sig}, {"running_turns", rt.running_turns()}});
        if (schedules) schedules->stop();
        server.stop();
        try {
            // No new chat messages while draining; what the debounce holds stays stored.
            if (telegram_poller) asio::co_spawn(ioc, telegram_poller->stop(), asio::use_future).get();
        } catch (const std::exception& e) {
            log::error("telegram: stop failed", {{"error", e.what()}});
        }
        try {
            asio::co_spawn(ioc, rt.drain(std::chrono::seconds(10)), asio::use_future).get();
        } catch (const std::exception& e) {
            log::error("drain failed", {{"error", e.what()}});
        }
        // After the drain, so that replies of the turns that finished meanwhile were sent.
        if (websocket) websocket->stop();
        try {
            asio::co_spawn(ioc, outbox.stop(std::chrono::seconds(5)), asio::use_future).get();
        } catch (const std::exception& e) {
            log::error("stopping delivery failed", {{"error", e.what()}});
        }
    }
    work.reset();
    ioc.stop();
    for (auto& t : pool)
        t.join();
    db->stop();
    log::info("stopped");
    return exit_code;
}

} // namespace baton
