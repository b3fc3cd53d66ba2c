// The library's only WebSocket-client translation unit that includes Beast.
#include <baton/ws_client.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

namespace baton {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = boost::beast::websocket;
using asio::ip::tcp;
using boost::system::error_code;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
}

struct ws_client::impl {
    impl(asio::any_io_executor ex, std::string h, std::string p)
        : resolver(ex), ws(ex), host(std::move(h)), port(std::move(p)) {}
    tcp::resolver resolver;
    websocket::stream<beast::tcp_stream> ws;
    beast::flat_buffer buffer;
    std::string host;
    std::string port;
    std::vector<std::pair<std::string, std::string>> headers;
};

void ws_client::set_header(std::string name, std::string value) {
    impl_->headers.emplace_back(std::move(name), std::move(value));
}

ws_client::ws_client(asio::any_io_executor ex, std::string host, std::string port)
    : impl_(std::make_unique<impl>(std::move(ex), std::move(host), std::move(port))) {}
ws_client::~ws_client() = default;

asio::awaitable<std::pair<error_code, unsigned>>
ws_client::connect(std::string target, std::chrono::milliseconds timeout,
                   std::optional<std::chrono::milliseconds> idle, bool ping) {
    auto& c = *impl_;
    auto [rec, endpoints] = co_await c.resolver.async_resolve(c.host, c.port, use_tuple);
    if (rec) co_return std::pair{rec, 0u};
    auto& tcp_layer = beast::get_lowest_layer(c.ws);
    tcp_layer.expires_after(timeout);
    auto [ec, ep] = co_await tcp_layer.async_connect(endpoints, use_tuple);
    if (ec) co_return std::pair{ec, 0u};
    error_code ignored;
    tcp_layer.socket().set_option(tcp::no_delay(true), ignored);
    websocket::response_type res;
    if (!c.headers.empty())
        c.ws.set_option(websocket::stream_base::decorator([h = c.headers](websocket::request_type& req) {
            for (const auto& [name, value] : h)
                req.set(name, value);
        }));
    std::tie(ec) = co_await c.ws.async_handshake(res, c.host + ":" + c.port, target, use_tuple);
    if (ec) {
        tcp_layer.close();
        co_return std::pair{ec, res.result_int()};
    }
    // From here the websocket stream's own timeouts apply, not the TCP layer's.
    tcp_layer.expires_never();
    auto opt = websocket::stream_base::timeout::suggested(beast::role_type::client);
    if (idle) {
        opt.idle_timeout = *idle;
        opt.keep_alive_pings = ping;
    }
    c.ws.set_option(opt);
    c.ws.text(true);
    co_return std::pair{error_code{}, res.result_int()};
}

asio::awaitable<error_code> ws_client::send(std::string text) {
    auto [ec, n] = co_await impl_->ws.async_write(asio::buffer(text), use_tuple);
    co_return ec;
}

asio::awaitable<std::pair<error_code, std::string>> ws_client::receive() {
    auto& c = *impl_;
    c.buffer.clear();
    auto [ec, n] = co_await c.ws.async_read(c.buffer, use_tuple);
    if (ec) co_return std::pair{ec, std::string{}};
    co_return std::pair{error_code{}, beast::buffers_to_string(c.buffer.data())};
}

asio::awaitable<error_code> ws_client::close() {
    auto [ec] = co_await impl_->ws.async_close(websocket::close_code::normal, use_tuple);
    co_return ec;
}

} // namespace baton
