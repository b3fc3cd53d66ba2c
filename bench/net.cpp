// One of the two bench files that include Beast (the other is mock_model.cpp); the WebSocket
// client is the library's (src/ws_client.cpp).
#include "bench/net.hpp"

#include "bench/bench.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace baton::bench {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::ip::tcp;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// Errors that mean "the server closed this keep-alive connection", worth one more try.
bool closed_by_peer(const error_code& ec) {
    return ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
           ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
           ec == bhttp::error::partial_message;
}
} // namespace

std::optional<http_url> parse_http_url(std::string_view url) {
    constexpr std::string_view scheme = "http://";
    if (!url.starts_with(scheme)) return std::nullopt;
    url.remove_prefix(scheme.size());
    auto slash = url.find('/');
    std::string_view authority = url.substr(0, slash);
    http_url u;
    if (slash != std::string_view::npos) u.path = std::string(url.substr(slash));
    while (!u.path.empty() && u.path.back() == '/')
        u.path.pop_back();
    auto colon = authority.rfind(':');
    if (colon == std::string_view::npos || authority.find(']', colon) != std::string_view::npos) {
        u.host = std::string(authority);
        u.port = "80";
    } else {
        u.host = std::string(authority.substr(0, colon));
        u.port = std::string(authority.substr(colon + 1));
    }
    if (u.host.size() > 2 && u.host.front() == '[' && u.host.back() == ']')
        u.host = u.host.substr(1, u.host.size() - 2);
    if (u.host.empty() || u.port.empty()) return std::nullopt;
    return u;
}

struct http_connection::impl {
    impl(asio::any_io_executor ex, std::string h, std::string p)
        : resolver(ex), stream(ex), host(std::move(h)), port(std::move(p)) {}

    tcp::resolver resolver;
    tcp::resolver::results_type endpoints;
    beast::tcp_stream stream;
    beast::flat_buffer buffer;
    std::string host;
    std::string port;
    bool open = false;
    std::size_t connects = 0;
    std::vector<std::pair<std::string, std::string>> headers;

    asio::awaitable<error_code> ensure_open(milliseconds timeout) {
        if (open) co_return error_code{};
        if (endpoints.empty()) {
            auto [ec, results] = co_await resolver.async_resolve(host, port, use_tuple);
            if (ec) co_return ec;
            endpoints = std::move(results);
        }
        stream.expires_after(timeout);
        auto [ec, ep] = co_await stream.async_connect(endpoints, use_tuple);
        if (ec) {
            reset();
            co_return ec;
        }
        error_code ignored;
        stream.socket().set_option(tcp::no_delay(true), ignored);
        buffer.clear();
        open = true;
        ++connects;
        co_return error_code{};
    }

    void reset() {
        error_code ignored;
        stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
        stream.close();
        buffer.clear();
        open = false;
    }

    bhttp::request<bhttp::string_body> make(std::string_view method, const std::string& target) {
        bhttp::request<bhttp::string_body> req{bhttp::string_to_verb(method), target, 11};
        req.set(bhttp::field::host, host + ":" + port);
        req.set(bhttp::field::user_agent, "baton-bench");
        for (const auto& [name, value] : headers)
            req.set(name, value);
        req.keep_alive(true);
        return req;
    }
};

http_connection::http_connection(asio::any_io_executor ex, std::string host, std::string port)
    : impl_(std::make_unique<impl>(std::move(ex), std::move(host), std::move(port))) {}
http_connection::~http_connection() = default;

void http_connection::set_header(std::string name, std::string value) {
    impl_->headers.emplace_back(std::move(name), std::move(value));
}

std::size_t http_connection::connects() const {
    return impl_->connects;
}
void http_connection::close() {
    impl_->reset();
}

asio::awaitable<std::pair<error_code, http_reply>> http_connection::request(std::string_view method,
                                                                            std::string target,
                                                                            std::string body,
                                                                            milliseconds timeout) {
    auto& c = *impl_;
    for (int attempt = 0;; ++attempt) {
        bool reused = c.open;
        if (auto ec = co_await c.ensure_open(timeout)) co_return std::pair{ec, http_reply{}};
        auto req = c.make(method, target);
        if (!body.empty()) {
            req.set(bhttp::field::content_type, "application/json");
            req.body() = body;
        }
        req.prepare_payload();
        c.stream.expires_after(timeout);
        auto [ec, written] = co_await bhttp::async_write(c.stream, req, use_tuple);
        if (!ec) {
            bhttp::response_parser<bhttp::string_body> parser;
            parser.body_limit(64 * 1024 * 1024);
            auto [rec, read] = co_await bhttp::async_read(c.stream, c.buffer, parser, use_tuple);
            if (!rec) {
                auto& res = parser.get();
                c.stream.expires_never();
                if (!res.keep_alive()) c.reset();
                co_return std::pair{error_code{}, http_reply{res.result_int(), std::move(res.body())}};
            }
            ec = rec;
        }
        c.reset();
        if (!(reused && attempt == 0 && closed_by_peer(ec))) co_return std::pair{ec, http_reply{}};
    }
}

asio::awaitable<std::pair<error_code, http_reply>>
http_connection::events(std::string target, const std::function<bool(const sse_event&)>& on_event,
                        milliseconds timeout) {
    auto& c = *impl_;
    if (auto ec = co_await c.ensure_open(timeout)) co_return std::pair{ec, http_reply{}};
    auto req = c.make("GET", target);
    req.set(bhttp::field::accept, "text/event-stream");
    req.prepare_payload();
    c.stream.expires_after(timeout);
    auto [ec, written] = co_await bhttp::async_write(c.stream, req, use_tuple);
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(boost::none);
    if (!ec)
        std::tie(ec, written) = co_await bhttp::async_read_header(c.stream, c.buffer, parser, use_tuple);
    if (ec) {
        c.reset();
        co_return std::pair{ec, http_reply{}};
    }
    if (parser.get().result_int() != 200) {
        std::tie(ec, written) = co_await bhttp::async_read(c.stream, c.buffer, parser, use_tuple);
        auto& res = parser.get();
        if (ec || !res.keep_alive()) c.reset();
        c.stream.expires_never();
        co_return std::pair{ec, http_reply{res.result_int(), std::move(res.body())}};
    }
    sse_parser sse;
    bool stopped = false;
    while (!parser.is_done()) {
        std::tie(ec, written) = co_await bhttp::async_read_some(c.stream, c.buffer, parser, use_tuple);
        if (ec) {
            c.reset();
            // After the wanted event a server that keeps the stream open costs the connection only.
            co_return std::pair{stopped ? error_code{} : ec, http_reply{200, {}}};
        }
        // The body so far is taken and cleared: string_body's reader appends to it.
        auto& body = parser.get().body();
        if (!stopped && !body.empty())
            for (const auto& ev : sse.feed(body))
                if (!stopped && !on_event(ev)) {
                    stopped = true;
                    // The stream should end right after; do not wait for it long.
                    c.stream.expires_after(std::chrono::seconds(1));
                }
        body.clear();
    }
    c.stream.expires_never();
    if (!parser.get().keep_alive()) c.reset();
    co_return std::pair{error_code{}, http_reply{200, {}}};
}

bool terminal_status(std::string_view s) {
    return s == "completed" || s == "stopped" || s == "failed" || s == "timed_out" || s == "step_limit";
}

asio::awaitable<turn_poll> poll_turn(http_connection& c, std::string prefix, std::string tid,
                                     milliseconds timeout, bool held) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    std::string target = prefix + "/v1/turns/" + tid;
    if (held) target += "?wait=30"; // the daemon answers at the end: no pause between requests
    turn_poll p;
    for (milliseconds delay{0};; delay = std::clamp(delay * 2, milliseconds(1), milliseconds(20))) {
        if (delay.count() > 0 && !held) {
            timer.expires_after(delay);
            co_await timer.async_wait(use_tuple);
        }
        std::tie(p.ec, p.last) = co_await c.request(method_get, target, {}, timeout);
        ++p.polls;
        if (p.ec || p.last.status != 200) co_return p;
        auto status = json_field(p.last.body, "status");
        if (terminal_status(status)) {
            p.status = std::move(status);
            co_return p;
        }
    }
}

} // namespace baton::bench
