#include "tests/ws_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/test/unit_test.hpp>

#include <sys/socket.h>
#include <sys/time.h>

#include <chrono>

namespace baton::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = boost::beast::websocket;
namespace json = boost::json;

struct ws_client::impl {
    asio::io_context ioc;
    websocket::stream<asio::ip::tcp::socket> ws{ioc};
    int close_code = 0;
    std::string protocol;
    std::chrono::milliseconds timeout{10000};
    std::chrono::steady_clock::time_point read_deadline; // of the read under way
};

ws_client::ws_client(const std::string& host, unsigned short port, std::chrono::milliseconds timeout)
    : ws_client(host, port, {}, timeout) {}

std::string ws_client::protocol() const {
    return impl_->protocol;
}

ws_client::ws_client(const std::string& host, unsigned short port,
                     const std::vector<std::pair<std::string, std::string>>& headers,
                     std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
    auto& sock = impl_->ws.next_layer();
    boost::system::error_code ec;
    sock.connect({asio::ip::make_address(host), port}, ec);
    BOOST_REQUIRE_MESSAGE(!ec, "cannot connect to the daemon: " << ec.message());
    // Blocking reads and writes give up after `timeout` (EAGAIN): a silent peer fails the test.
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    ::setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(sock.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    impl_->ws.set_option(websocket::stream_base::decorator([headers](websocket::request_type& req) {
        for (const auto& [name, value] : headers)
            req.set(name, value);
    }));
    websocket::response_type res;
    impl_->ws.handshake(res, host + ":" + std::to_string(port), "/v1/ws", ec);
    BOOST_REQUIRE_MESSAGE(!ec, "WebSocket upgrade failed: " << ec.message() << " (HTTP "
                                                             << res.result_int() << ")");
    impl_->protocol = std::string(res[boost::beast::http::field::sec_websocket_protocol]);
    // The server's keep-alive pings reset the socket's timeout at every receive: a read that got
    // nothing but pings past its deadline ends the connection, so that it fails instead of hanging.
    impl_->timeout = timeout;
    impl_->ws.control_callback([i = impl_.get()](websocket::frame_type, beast::string_view) {
        if (std::chrono::steady_clock::now() > i->read_deadline) {
            boost::system::error_code ignored;
            i->ws.next_layer().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        }
    });
}

ws_client::~ws_client() {
    boost::system::error_code ec;
    if (impl_->ws.is_open()) impl_->ws.next_layer().close(ec);
}

void ws_client::send(const json::object& frame) {
    send_text(json::serialize(frame));
}

void ws_client::send_text(std::string_view text) {
    boost::system::error_code ec;
    impl_->ws.text(true);
    impl_->ws.write(asio::buffer(text.data(), text.size()), ec);
    BOOST_REQUIRE_MESSAGE(!ec, "WebSocket write failed: " << ec.message());
}

bool ws_client::try_send_text(std::string_view text) {
    boost::system::error_code ec;
    impl_->ws.text(true);
    impl_->ws.write(asio::buffer(text.data(), text.size()), ec);
    return !ec;
}

void ws_client::send_binary(std::string_view bytes) {
    boost::system::error_code ec;
    impl_->ws.binary(true);
    impl_->ws.write(asio::buffer(bytes.data(), bytes.size()), ec);
    impl_->ws.text(true);
    BOOST_REQUIRE_MESSAGE(!ec, "WebSocket write failed: " << ec.message());
}

void ws_client::send_raw(std::string_view bytes) {
    boost::system::error_code ec;
    asio::write(impl_->ws.next_layer(), asio::buffer(bytes.data(), bytes.size()), ec);
    BOOST_REQUIRE_MESSAGE(!ec, "TCP write failed: " << ec.message());
}

std::optional<json::object> ws_client::read() {
    beast::flat_buffer buffer;
    boost::system::error_code ec;
    impl_->read_deadline = std::chrono::steady_clock::now() + impl_->timeout;
    impl_->ws.read(buffer, ec);
    if (ec) {
        if (ec == websocket::error::closed) impl_->close_code = impl_->ws.reason().code;
        BOOST_TEST_MESSAGE("WebSocket read ended: " << ec.message());
        return std::nullopt;
    }
    auto text = beast::buffers_to_string(buffer.data());
    auto v = json::parse(text, ec);
    BOOST_REQUIRE_MESSAGE(!ec && v.is_object(), "the server sent a frame that is not a JSON object: " << text);
    seen.push_back(v.as_object());
    taken.push_back(false);
    return std::move(v.as_object());
}

json::object ws_client::read_until(const std::function<bool(const json::object&)>& match) {
    // Each read is bounded by the socket's timeout; frames that keep coming without the one
    // wanted are bounded here, so that the test fails instead of hanging.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (std::size_t i = 0;; ++i) {
        BOOST_REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline,
                              "no matching frame within 60 s (" << seen.size() << " frames seen)");
        if (i == seen.size()) {
            auto f = read();
            BOOST_REQUIRE_MESSAGE(f.has_value(), "the WebSocket ended (close code "
                                                     << impl_->close_code << ") before the frame");
        }
        if (!taken[i] && match(seen[i])) {
            taken[i] = true;
            return seen[i];
        }
    }
}

void ws_client::barrier() {
    send(json::object{{"type", "ping"}});
    read_until(frame_type("pong"));
}

int ws_client::close_code() const {
    return impl_->close_code;
}

void ws_client::drop() {
    boost::system::error_code ec;
    impl_->ws.next_layer().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    impl_->ws.next_layer().close(ec);
}

std::function<bool(const json::object&)> frame_type(std::string type) {
    return [type](const json::object& f) {
        auto* t = f.if_contains("type");
        return t && t->is_string() && t->get_string() == type;
    };
}

std::function<bool(const json::object&)> event_named(std::string event, std::string turn_id) {
    return [event, turn_id](const json::object& f) {
        auto* t = f.if_contains("type");
        auto* e = f.if_contains("event");
        if (!t || !e || *t != "event" || *e != event.c_str()) return false;
        return turn_id.empty() || f.at("turn_id") == turn_id.c_str();
    };
}

} // namespace baton::test
