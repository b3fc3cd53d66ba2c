#include "src/app/serve.hpp"
#include "src/app/wiring.hpp"

#include <baton/log.hpp>
#include <baton/service.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_future.hpp>

#include <sqlite3.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
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
int mallctl(const char* name, void* oldp, std::size_t* oldlenp, void* newp, std::size_t newlen);
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

// Gives the pages the allocator holds freed back to the kernel. jemalloc keeps them (its decay)
// until later allocations come by, which an idle daemon does not make: what starting (the config,
// the migrations, recovery) or a burst of turns freed would stay resident for good.
void release_freed_memory() {
#ifdef BATON_JEMALLOC
    // This thread's cache of freed blocks first, so that their pages can go too.
    mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0); // 4096: MALLCTL_ARENAS_ALL
#elif defined(__GLIBC__)
    malloc_trim(0);
#endif
}

// Releases freed memory once the store has had no call for a whole tick after having had some:
// within 1-2 s of the daemon going idle, never under load.
void release_when_idle(asio::steady_timer& t, runtime& rt, std::uint64_t released, std::uint64_t seen) {
    t.expires_after(std::chrono::seconds(1));
    t.async_wait([&t, &rt, released, seen](const boost::system::error_code& ec) {
        if (ec) return; // stopping
        auto now = rt.store_calls();
        bool idle_again = now == seen && now != released;
        if (idle_again) release_freed_memory();
        release_when_idle(t, rt, idle_again ? now : released, now);
    });
}

std::string url_host(const tcp::endpoint& ep) {
    auto a = ep.address();
    return a.is_v6() ? "[" + a.to_string() + "]" : a.to_string();
}
} // namespace

int run_daemon(const serve_options& opts) {
    tune_malloc();
    // A log line written after stderr's reader went away (`2>&1 | head`, a log shipper that
    // restarts) must not kill the daemon with SIGPIPE: the write fails and the daemon goes on.
    // Sockets never raise it (sends use MSG_NOSIGNAL); the daemon starts no child processes.
    std::signal(SIGPIPE, SIG_IGN);
    // The daemon owns its process and reads no SQLite memory statistics: without them SQLite
    // takes no global mutex around each of its allocations (~6% of a stored turn's instructions,
    // bench/RESULTS.md, session 39). Only before SQLite starts; an embedder decides for itself.
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    auto loaded = load_config_or_report(opts.config_file);
    if (!loaded) return 2;
    service_options so;
    so.config = std::move(*loaded);
    // Its work is other nodes' by now: it ends at once, as a crash would, writing nothing more.
    so.on_lease_lost = [](const std::string& why) {
        log::error("this node's lease expired: exiting", {{"why", why}});
        std::_Exit(3);
    };
    auto& cfg = so.config;
    if (opts.listen) cfg.server.listen = *opts.listen;
    if (opts.threads) cfg.server.threads = *opts.threads;
    if (opts.data_dir)
        cfg.storage.sqlite_path = (std::filesystem::path(*opts.data_dir) / "baton.db").string();
    else if (!opts.config_file)
        cfg.storage.sqlite_path = "var/baton.db";
    so.allow_unauthenticated_remote = opts.insecure_no_auth;
    unsigned threads = cfg.server.threads > 0 ? static_cast<unsigned>(cfg.server.threads)
                                              : std::max(1u, std::thread::hardware_concurrency());

    asio::io_context ioc(static_cast<int>(threads));
    // Taken before anything starts, so that a signal sent as soon as `listening on` is printed
    // (or while starting) drains (found by a new-user check: 1 start in 8 died of it at once). A
    // signal that came meanwhile waits in the set until the wait below. SIGHUP too (the terminal
    // closed): a drain, not the default's instant death.
    asio::signal_set signals(ioc, SIGINT, SIGTERM, SIGHUP);
    service svc(ioc.get_executor(), std::move(so));
    // The guard comes first: a run() that finds no work would leave the io_context stopped.
    auto work = asio::make_work_guard(ioc);
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < threads; ++i)
        pool.emplace_back([&] { ioc.run(); });
    // Without the guard, run() returns once what the stopped service left (a cancelled timer
    // loop finishing, a connection closing) has run; 2 s at most, then the rest is dropped. The
    // io_context must not destroy a suspended coroutine after the service that it points into.
    auto stop_threads = [&] {
        work.reset();
        for (int i = 0; i < 200 && !ioc.stopped(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        ioc.stop();
        for (auto& t : pool)
            t.join();
    };

    diagnostics diag;
    boost::system::error_code ec;
    try {
        svc.async_start(diag, asio::use_future).get();
    } catch (const boost::system::system_error& e) {
        ec = e.code();
    }
    if (ec) {
        std::cerr << "baton: " << (diag.message().empty() ? ec.message() : diag.message()) << "\n";
        stop_threads();
        return ec == errc::invalid_config ? 2 : 1;
    }
    auto local = svc.local_endpoint();
    std::cout << "listening on " << (svc.config().server.tls ? "https://" : "http://") << url_host(local)
              << ":" << local.port() << std::endl;
    log::info("ready", {{"listen", url_host(local) + ":" + std::to_string(local.port())},
                        {"threads", threads},
                        {"storage", svc.config().storage.type == storage_config::kind::sqlite
                                        ? svc.config().storage.sqlite_path
                                    : svc.config().storage.type == storage_config::kind::postgres
                                        ? (svc.config().storage.postgres_cluster ? "postgres (cluster)"
                                                                                 : "postgres")
                                        : "memory"}});
    // What starting used and freed goes back at once; what turns free, when they stop.
    release_freed_memory();
    asio::steady_timer idle_release(asio::make_strand(ioc));
    release_when_idle(idle_release, svc.runtime(), svc.runtime().store_calls(),
                      svc.runtime().store_calls());
    std::promise<int> stop_signal;
    signals.async_wait(
        [&](const boost::system::error_code& e, int sig) { stop_signal.set_value(e ? 0 : sig); });
    int sig = stop_signal.get_future().get();
    log::info("stopping", {{"signal", sig}});
    asio::post(idle_release.get_executor(), [&] { idle_release.cancel(); });
    svc.async_stop(asio::use_future).get();
    stop_threads();
    log::info("stopped");
    return 0;
}

} // namespace baton
