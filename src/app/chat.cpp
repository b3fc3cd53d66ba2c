#include "src/app/chat.hpp"
#include "src/app/chat_view.hpp"
#include "src/app/wiring.hpp"

#include <baton/log.hpp>
#include <baton/runtime.hpp>
#include <baton/service.hpp>
#include <baton/types.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/json/parse.hpp>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>
#include <set>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

namespace baton {

std::string default_chat_session() {
    std::string user;
    if (const char* u = std::getenv("USER"))
        for (char c : std::string_view(u))
            if (valid_session_id(std::string_view(&c, 1))) user.push_back(c);
    std::string sid = "chat:" + user.substr(0, 100);
    return user.empty() ? std::string("chat") : sid;
}

line_reader::line_reader(std::function<void(std::string)> on_line, std::function<void()> on_eof)
    : on_line_(std::move(on_line)), on_eof_(std::move(on_eof)) {
    if (::pipe2(wake_, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    thread_ = std::thread([this] { run(); });
}

line_reader::~line_reader() {
    stop();
    ::close(wake_[0]);
    ::close(wake_[1]);
}

void line_reader::stop() {
    if (!thread_.joinable()) return;
    char c = 0;
    [[maybe_unused]] auto n = ::write(wake_[1], &c, 1);
    thread_.join();
}

void line_reader::run() {
    std::string pending;
    char buf[4096];
    for (;;) {
        pollfd fds[2] = {{0, POLLIN, 0}, {wake_[0], POLLIN, 0}};
        if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[1].revents != 0) return; // stopped: no on_eof
        ssize_t n = ::read(0, buf, sizeof buf);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) break;
        pending.append(buf, static_cast<std::size_t>(n));
        for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
            std::string line = pending.substr(0, nl);
            pending.erase(0, nl + 1);
            if (!line.empty() && line.back() == '\r') line.pop_back();
            on_line_(std::move(line));
        }
    }
    if (!pending.empty()) on_line_(std::move(pending));
    on_eof_();
}

namespace {

bool blank(std::string_view s) {
    return s.find_first_not_of(" \t\r") == std::string_view::npos;
}

// The in-process chat's state; everything but the reader thread runs on `out`.
struct local_chat {
    local_chat(asio::io_context& ioc, runtime& r, std::string sid)
        : rt(r), out(asio::make_strand(ioc)), session(std::move(sid)), tty(::isatty(0) == 1) {}

    runtime& rt;
    asio::strand<asio::io_context::executor_type> out;
    std::string session;
    bool tty;
    chat_view view{std::cout, chat_view::mode::in_process, dim_stdout()};
    std::set<std::string> running; // turns of the session queued or running
    bool eof = false;
    bool interrupted = false;
    std::atomic<bool> stopping{false}; // read by the reader thread
    asio::steady_timer grace{out};
    std::promise<int> done;
    bool done_set = false;

    void finish(int code) {
        if (done_set) return;
        done_set = true;
        done.set_value(code);
    }

    void on_event(const std::string& turn_id, const event_ptr& e) {
        boost::system::error_code ec;
        auto v = json::parse(e->data, ec);
        static const json::object empty;
        const json::object& data = !ec && v.is_object() ? v.get_object() : empty;
        if (e->type == "turn.queued") running.insert(turn_id);
        view.on_event(turn_id, e->type, data);
        if (e->type != "turn.finished") return;
        running.erase(turn_id);
        if (!running.empty()) return;
        if (interrupted || eof)
            finish(interrupted ? 130 : 0);
        else if (tty)
            view.prompt();
    }

    // On the reader thread: one accept at a time keeps the session's messages in input order.
    void send(std::string text) {
        if (stopping.load()) return;
        if (blank(text)) {
            if (tty) asio::post(out, [this] { view.prompt(); });
            return;
        }
        accept_request req;
        req.session_id = session;
        req.channel = "cli";
        req.text = std::move(text);
        for (;;) {
            auto r = asio::co_spawn(out, rt.accept(req), asio::use_future).get();
            if (r) return;
            const auto err = r.error();
            // A person cannot type faster than the queue drains; a pipe can: wait for room.
            if (err.code == errc::session_queue_full && !stopping.load()) {
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                continue;
            }
            asio::post(out, [this, e = err] { view.on_error(code_name(e.code), e.message); });
            return;
        }
    }

    void on_eof() {
        asio::post(out, [this] {
            eof = true;
            if (running.empty()) finish(interrupted ? 130 : 0);
        });
    }

    // Ctrl-C: the session's turns end `stopped` (stored as such), then the chat exits.
    void interrupt() {
        interrupted = true;
        stopping.store(true);
        view.note("[interrupted]");
        if (running.empty()) return finish(130);
        for (const auto& tid : running)
            asio::co_spawn(out, rt.cancel(tid), asio::detached);
        // A turn slow to notice its cancellation must not keep Ctrl-C from ending the chat.
        grace.expires_after(std::chrono::seconds(3));
        grace.async_wait([this](boost::system::error_code ec) {
            if (!ec) finish(130);
        });
    }
};

} // namespace

int run_local_chat(const chat_options& opts) {
    auto loaded = load_config_or_report(opts.config_file);
    if (!loaded) return 2;
    config cfg = std::move(*loaded);
    // A chat is a scratch conversation unless asked to keep it: never the daemon's ./var by default.
    if (opts.data_dir) {
        cfg.storage.type = storage_config::kind::sqlite;
        cfg.storage.sqlite_path = (std::filesystem::path(*opts.data_dir) / "baton.db").string();
    } else {
        cfg.storage.type = storage_config::kind::memory;
    }
    // The library's JSON log lines would drown the conversation; BATON_LOG still turns them on.
    if (!std::getenv("BATON_LOG")) log::set_level(log::level::error);

    asio::io_context ioc(1);
    service_options so;
    so.config = std::move(cfg);
    so.http = false;     // nothing listens: the terminal is the channel
    so.channels = false; // nor polls, fires or pushes
    so.drain_grace = std::chrono::milliseconds(0); // leaving ends a turn in progress, as before
    service svc(ioc.get_executor(), std::move(so));
    auto& rt = svc.runtime();
    local_chat chat(ioc, rt, opts.session);
    // Before any accept, so that no event of ours is missed. Called on the publisher's thread.
    auto listener = rt.events().listen(opts.session, [&chat](const turn_log& log, const event_ptr& e) {
        asio::post(chat.out, [&chat, id = log.turn_id(), e] { chat.on_event(id, e); });
    });

    auto work = asio::make_work_guard(ioc);
    std::thread io([&] { ioc.run(); });
    int code = 0;
    diagnostics diag;
    try {
        svc.async_start(diag, asio::use_future).get();
    } catch (const std::exception& e) {
        std::cerr << "baton: " << (diag.message().empty() ? e.what() : diag.message()) << "\n";
        code = 1;
    }
    asio::signal_set signals(ioc, SIGINT, SIGTERM);
    if (code == 0) {
        signals.async_wait([&](const boost::system::error_code& ec, int) {
            if (!ec) asio::post(chat.out, [&chat] { chat.interrupt(); });
        });
        if (chat.tty) asio::post(chat.out, [&chat] { chat.view.prompt(); });
        line_reader reader([&chat](std::string l) { chat.send(std::move(l)); },
                           [&chat] { chat.on_eof(); });
        auto result = chat.done.get_future();
        code = result.get();
        reader.stop();
    }
    rt.events().unlisten(opts.session, listener);
    if (code == 0) svc.async_stop(asio::use_future).get();
    work.reset();
    ioc.stop();
    io.join();
    return code;
}

} // namespace baton
