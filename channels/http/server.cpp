// The only translation unit of the HTTP channel that includes Beast.
#include <baton/http_server.hpp>
#include <baton/log.hpp>

#include "channels/http/api.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>

namespace baton {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::ip::tcp;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// What a failed read deserves: an error reply, or (nullopt) a silent close.
std::optional<http::reply> read_failure_reply(const boost::system::error_code& ec, bool got_bytes) {
    if (ec == bhttp::error::body_limit)
        return http::error_reply(errc::payload_too_large, "the body is larger than max_body_bytes");
    if (ec == bhttp::error::header_limit) {
        auto r = http::error_reply(errc::invalid_request, "the request headers are too large");
        r.status = 431;
        return r;
    }
    if (ec == beast::error::timeout)
        return got_bytes ? std::optional(http::error_reply(errc::request_timeout,
                                                           "the request was not received in time"))
                         : std::nullopt;
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
        ec == bhttp::error::partial_message)
        return std::nullopt;
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category())
        return http::error_reply(errc::invalid_request, "malformed HTTP request: " + ec.message());
    return std::nullopt;
}
// A read deadline that cancels the socket instead of closing it (as tcp_stream's own timeout
// does), so that a 408 can still be written after a slow request.
class read_deadline {
public:
    explicit read_deadline(tcp::socket& s)
        : timer_(s.get_executor()), state_(std::make_shared<state>()) {
        state_->socket = &s;
    }
    ~read_deadline() { state_->socket = nullptr; }

    void arm(std::chrono::milliseconds d) {
        auto st = state_;
        auto generation = ++st->generation;
        st->fired = false;
        timer_.expires_after(d);
        timer_.async_wait([st, generation](boost::system::error_code ec) {
            // A stale expiry (the read finished meanwhile) must not cancel a later operation.
            if (ec || !st->socket || st->generation != generation) return;
            st->fired = true;
            boost::system::error_code ignored;
            st->socket->cancel(ignored);
        });
    }
    // True when the deadline passed before disarm.
    bool disarm() {
        ++state_->generation;
        timer_.cancel();
        return std::exchange(state_->fired, false);
    }

private:
    struct state {
        tcp::socket* socket = nullptr;
        std::uint64_t generation = 0;
        bool fired = false;
    };
    asio::steady_timer timer_;
    std::shared_ptr<state> state_;
};
} // namespace

struct http_server::impl : std::enable_shared_from_this<impl> {
    impl(asio::any_io_executor e, runtime& rt, http_server_options o, std::function<bool()> ready)
        : ex(std::move(e)), acceptor(asio::make_strand(ex)), api(rt, std::move(ready)), opts(o) {}

    asio::any_io_executor ex;
    tcp::acceptor acceptor;
    http::api api;
    http_server_options opts;
    std::atomic<bool> stopped{false};

    static asio::awaitable<void> accept_loop(std::shared_ptr<impl> self);
    static asio::awaitable<void> serve(std::shared_ptr<impl> self, tcp::socket socket);
    asio::awaitable<bool> write(beast::tcp_stream& stream, unsigned version, bool keep_alive,
                                http::reply r);
};

asio::awaitable<bool> http_server::impl::write(beast::tcp_stream& stream, unsigned version,
                                               bool keep_alive, http::reply r) {
    bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(r.status), version};
    res.set(bhttp::field::server, "baton");
    res.set(bhttp::field::content_type, r.content_type);
    res.set(bhttp::field::cache_control, "no-store");
    for (auto& [name, value] : r.headers)
        res.set(name, value);
    res.body() = std::move(r.body);
    res.keep_alive(keep_alive && !stopped.load());
    res.prepare_payload();
    stream.expires_after(opts.body_timeout);
    auto [ec, n] = co_await bhttp::async_write(stream, res, use_tuple);
    co_return !ec && res.keep_alive();
}

// One connection: requests are read and answered in order (pipelined ones wait in the buffer).
asio::awaitable<void> http_server::impl::serve(std::shared_ptr<impl> self, tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    read_deadline deadline(stream.socket());
    const auto& opts = self->opts;
    for (;;) {
        if (buffer.size() == 0) {
            // Keep-alive: wait for the next request's first byte under the idle timeout.
            stream.expires_after(opts.idle_timeout);
            auto [ec, n] = co_await stream.async_read_some(buffer.prepare(4096), use_tuple);
            if (ec) break;
            buffer.commit(n);
        }
        bhttp::request_parser<bhttp::string_body> parser;
        parser.header_limit(static_cast<std::uint32_t>(opts.max_header_bytes));
        parser.body_limit(opts.max_body_bytes);
        stream.expires_never();
        deadline.arm(opts.header_timeout);
        auto [hec, hn] = co_await bhttp::async_read_header(stream, buffer, parser, use_tuple);
        if (deadline.disarm()) hec = beast::error::timeout;
        if (!hec && !parser.is_done()) {
            auto expect = parser.get()[bhttp::field::expect];
            if (beast::iequals(expect, "100-continue")) {
                bhttp::response<bhttp::empty_body> cont{bhttp::status::continue_,
                                                        parser.get().version()};
                co_await bhttp::async_write(stream, cont, use_tuple);
            }
            deadline.arm(opts.body_timeout);
            auto [bec, bn] = co_await bhttp::async_read(stream, buffer, parser, use_tuple);
            hec = deadline.disarm() ? beast::error::timeout : bec;
        }
        if (hec) {
            if (auto r = read_failure_reply(hec, true))
                co_await self->write(stream, 11, false, std::move(*r));
            break;
        }
        auto& req = parser.get();
        http::request_view view;
        view.method = req.method_string();
        view.target = req.target();
        view.content_type = req[bhttp::field::content_type];
        if (auto it = req.find("Idempotency-Key"); it != req.end()) {
            view.idempotency_key = it->value();
            view.has_idempotency_key = true;
        }
        view.body = req.body();
        http::reply r;
        try {
            r = co_await self->api.handle(view);
        } catch (const std::exception& e) {
            log::error("request failed", {{"target", std::string(view.target)}, {"error", e.what()}});
            r = http::error_reply(errc::internal_error, "internal error");
        }
        if (!co_await self->write(stream, req.version(), req.keep_alive(), std::move(r))) break;
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

asio::awaitable<void> http_server::impl::accept_loop(std::shared_ptr<impl> self) {
    for (;;) {
        auto [ec, socket] = co_await self->acceptor.async_accept(asio::make_strand(self->ex), use_tuple);
        if (self->stopped.load()) co_return;
        if (ec) {
            if (ec == asio::error::operation_aborted) co_return;
            // Out of descriptors and the like: back off instead of spinning.
            log::warn("accept failed", {{"error", ec.message()}});
            asio::steady_timer pause(self->acceptor.get_executor(), std::chrono::milliseconds(50));
            co_await pause.async_wait(use_tuple);
            continue;
        }
        boost::system::error_code nodelay_ec;
        socket.set_option(tcp::no_delay(true), nodelay_ec);
        auto conn_ex = socket.get_executor();
        asio::co_spawn(conn_ex, serve(self, std::move(socket)), log::spawn_logger{"http connection"});
    }
}

http_server::http_server(asio::any_io_executor ex, runtime& rt, http_server_options opts,
                         std::function<bool()> ready)
    : impl_(std::make_shared<impl>(std::move(ex), rt, opts, std::move(ready))) {}

http_server::~http_server() {
    stop();
}

boost::system::error_code http_server::listen(const tcp::endpoint& ep) {
    boost::system::error_code ec;
    auto& a = impl_->acceptor;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    return ec;
}

tcp::endpoint http_server::local_endpoint() const {
    boost::system::error_code ec;
    return impl_->acceptor.local_endpoint(ec);
}

void http_server::start() {
    asio::co_spawn(impl_->acceptor.get_executor(), impl::accept_loop(impl_),
                   log::spawn_logger{"http accept loop"});
}

void http_server::stop() {
    if (impl_->stopped.exchange(true)) return;
    asio::post(impl_->acceptor.get_executor(), [self = impl_] {
        boost::system::error_code ec;
        self->acceptor.close(ec);
    });
}

} // namespace baton
