// The library's only WebSocket-client translation unit that includes Beast.
#include <baton/ws_client.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

#include <openssl/ssl.h>

namespace baton {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace ssl = boost::asio::ssl;
namespace websocket = boost::beast::websocket;
using asio::ip::tcp;
using boost::system::error_code;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
using plain_ws = websocket::stream<beast::tcp_stream>;
using secure_ws = websocket::stream<beast::ssl_stream<beast::tcp_stream>>;
} // namespace

struct ws_client::impl {
    impl(asio::any_io_executor ex, std::string h, std::string p)
        : resolver(ex), plain(std::make_unique<plain_ws>(ex)), host(std::move(h)), port(std::move(p)) {}
    tcp::resolver resolver;
    std::unique_ptr<plain_ws> plain;   // ws://
    std::optional<ssl::context> tls;   // wss://: made by use_tls()
    std::unique_ptr<secure_ws> secure; // wss://, instead of `plain`
    beast::flat_buffer buffer;
    std::string host;
    std::string port;
    std::vector<std::pair<std::string, std::string>> headers;

    template <class WS>
    asio::awaitable<std::pair<error_code, unsigned>>
    connect(WS& ws, std::string target, std::chrono::milliseconds timeout,
            std::optional<std::chrono::milliseconds> idle, bool ping);
};

void ws_client::set_header(std::string name, std::string value) {
    impl_->headers.emplace_back(std::move(name), std::move(value));
}

error_code ws_client::use_tls(const ws_client_tls& opts) {
    auto& c = *impl_;
    c.tls.emplace(ssl::context::tls_client);
    SSL_CTX_set_min_proto_version(c.tls->native_handle(), TLS1_2_VERSION);
    error_code ec;
    if (!opts.verify_peer) {
        c.tls->set_verify_mode(ssl::verify_none);
    } else {
        if (opts.ca_file.empty())
            c.tls->set_default_verify_paths(ec);
        else
            c.tls->load_verify_file(opts.ca_file, ec);
        if (!ec) c.tls->set_verify_mode(ssl::verify_peer, ec);
    }
    if (ec) return ec;
    auto ex = c.plain->get_executor();
    c.secure = std::make_unique<secure_ws>(ex, *c.tls);
    auto& stream = c.secure->next_layer();
    // SNI and the name the certificate must carry: the host, unless it is an IP address.
    error_code addr_ec;
    asio::ip::make_address(c.host, addr_ec);
    if (addr_ec) ::SSL_set_tlsext_host_name(stream.native_handle(), c.host.c_str());
    if (opts.verify_peer) stream.set_verify_callback(ssl::host_name_verification(c.host));
    return {};
}

ws_client::ws_client(asio::any_io_executor ex, std::string host, std::string port)
    : impl_(std::make_unique<impl>(std::move(ex), std::move(host), std::move(port))) {}
ws_client::~ws_client() = default;

template <class WS>
asio::awaitable<std::pair<error_code, unsigned>>
ws_client::impl::connect(WS& ws, std::string target, std::chrono::milliseconds timeout,
                         std::optional<std::chrono::milliseconds> idle, bool ping) {
    auto [rec, endpoints] = co_await resolver.async_resolve(host, port, use_tuple);
    if (rec) co_return std::pair{rec, 0u};
    auto& tcp_layer = beast::get_lowest_layer(ws);
    tcp_layer.expires_after(timeout);
    auto [ec, ep] = co_await tcp_layer.async_connect(endpoints, use_tuple);
    if (ec) co_return std::pair{ec, 0u};
    error_code ignored;
    tcp_layer.socket().set_option(tcp::no_delay(true), ignored);
    if constexpr (std::is_same_v<WS, secure_ws>) {
        std::tie(ec) = co_await ws.next_layer().async_handshake(ssl::stream_base::client, use_tuple);
        if (ec) {
            tcp_layer.close();
            co_return std::pair{ec, 0u};
        }
    }
    websocket::response_type res;
    if (!headers.empty())
        ws.set_option(websocket::stream_base::decorator([h = headers](websocket::request_type& req) {
            for (const auto& [name, value] : h)
                req.set(name, value);
        }));
    std::tie(ec) = co_await ws.async_handshake(res, host + ":" + port, target, use_tuple);
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
    ws.set_option(opt);
    ws.text(true);
    co_return std::pair{error_code{}, res.result_int()};
}

asio::awaitable<std::pair<error_code, unsigned>>
ws_client::connect(std::string target, std::chrono::milliseconds timeout,
                   std::optional<std::chrono::milliseconds> idle, bool ping) {
    auto& c = *impl_;
    if (c.secure) co_return co_await c.connect(*c.secure, std::move(target), timeout, idle, ping);
    co_return co_await c.connect(*c.plain, std::move(target), timeout, idle, ping);
}

asio::awaitable<error_code> ws_client::send(std::string text) {
    auto& c = *impl_;
    auto buf = asio::buffer(text);
    auto [ec, n] = c.secure ? co_await c.secure->async_write(buf, use_tuple)
                            : co_await c.plain->async_write(buf, use_tuple);
    co_return ec;
}

asio::awaitable<std::pair<error_code, std::string>> ws_client::receive() {
    auto& c = *impl_;
    c.buffer.clear();
    auto [ec, n] = c.secure ? co_await c.secure->async_read(c.buffer, use_tuple)
                            : co_await c.plain->async_read(c.buffer, use_tuple);
    if (ec) co_return std::pair{ec, std::string{}};
    co_return std::pair{error_code{}, beast::buffers_to_string(c.buffer.data())};
}

asio::awaitable<error_code> ws_client::close() {
    auto& c = *impl_;
    auto [ec] = c.secure ? co_await c.secure->async_close(websocket::close_code::normal, use_tuple)
                         : co_await c.plain->async_close(websocket::close_code::normal, use_tuple);
    co_return ec;
}

} // namespace baton
