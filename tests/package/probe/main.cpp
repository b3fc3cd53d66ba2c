// Built against the installed package with plain Boost headers (tests/package/run): checks that
// this program's header-only Asio and the Asio inside baton's libraries agree. Prints one line per
// check; exits 0 when all pass.
#include <baton/service.hpp>

#include <boost/asio.hpp>
#include <csignal>
#include <iostream>
#include <thread>

namespace asio = boost::asio;
using namespace baton;

int failures = 0;
void check(bool ok, const char* what) {
    std::cout << (ok ? "ok   " : "FAIL ") << what << "\n";
    if (!ok) ++failures;
}

asio::awaitable<void> run(service& svc) {
    co_await svc.async_start(asio::use_awaitable);
    accept_request msg{.session_id = "probe", .text = "hello"};
    accepted a = co_await svc.async_submit(std::move(msg), asio::use_awaitable);

    boost::system::error_code ec;
    auto sub = svc.subscribe_turn(a.turn_id, ec);
    check(!ec, "subscribe_turn");
    std::string last;
    for (;;) {
        auto [e, ev] = co_await sub.async_next(asio::as_tuple(asio::use_awaitable));
        if (e) {
            ec = e;
            break;
        }
        last = ev.event->type;
    }
    check(last == "turn.finished", "a turn subscription hands over turn.finished last");
    check(ec == asio::error::eof, "and then ends with asio::error::eof, as this program's Asio knows it");
    check(&ec.category() == &asio::error::get_misc_category(), "one misc error category");

    auto [nf, rec] = co_await svc.async_get_turn("t_nope", asio::as_tuple(asio::use_awaitable));
    check(nf == errc::not_found, "an unknown turn is errc::not_found");

    // A socket error made by baton's Asio compares equal to this program's.
    asio::ip::tcp::socket s(co_await asio::this_coro::executor);
    auto [ce] = co_await s.async_connect({asio::ip::make_address("127.0.0.1"), 1},
                                         asio::as_tuple(asio::use_awaitable));
    check(ce == asio::error::connection_refused, "connection_refused on a closed loopback port");

    asio::signal_set signals(co_await asio::this_coro::executor, SIGUSR1);
    asio::steady_timer guard(co_await asio::this_coro::executor, std::chrono::seconds(5));
    bool got = false;
    signals.async_wait([&](boost::system::error_code e, int) {
        got = !e;
        guard.cancel();
    });
    std::raise(SIGUSR1);
    co_await guard.async_wait(asio::as_tuple(asio::use_awaitable));
    check(got, "a signal_set of this program fires beside baton");

    co_await svc.async_stop(asio::use_awaitable);
}

int main() {
    asio::io_context io;
    service_options opts{.http = false};
    opts.config.storage.type = storage_config::kind::memory;
    service svc(io.get_executor(), opts);
    auto done = asio::co_spawn(io, run(svc), asio::use_future);
    io.run();
    done.get();

    // use_future from another thread, with the io_context run by a thread of this program.
    asio::io_context io2;
    service svc2(io2.get_executor(), opts);
    auto guard = asio::make_work_guard(io2);
    std::thread t([&] { io2.run(); });
    svc2.async_start(asio::use_future).get();
    accept_request m{.session_id = "probe", .text = "again"};
    auto acc = svc2.async_submit(std::move(m), asio::use_future).get();
    auto rec = svc2.async_wait_turn(acc.turn_id, asio::use_future).get();
    check(rec.status == turn_status::completed, "use_future from another thread");
    svc2.async_stop(asio::use_future).get();
    guard.reset();
    t.join();
    return failures == 0 ? 0 : 1;
}
