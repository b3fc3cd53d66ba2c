// The HTTP channel as a baton::channel: the server (API, SSE, web page) with the WebSocket
// channel it upgrades to.
#include "channels/ws/channel.hpp"
#include "channels/http/server.hpp"

#include <baton/channels.hpp>

#include <atomic>
#include <stdexcept>

namespace baton {

namespace {
using asio::ip::tcp;

tcp::endpoint parse_listen(const std::string& s) {
    auto colon = s.rfind(':');
    if (colon == std::string::npos) throw std::invalid_argument("expected HOST:PORT, got " + s);
    std::string host = s.substr(0, colon), port = s.substr(colon + 1);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    if (host == "localhost") host = "127.0.0.1";
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(host, ec);
    if (ec) throw std::invalid_argument("not an IP address: " + host);
    int p = -1;
    try {
        std::size_t used = 0;
        p = std::stoi(port, &used);
        if (used != port.size()) p = -1;
    } catch (...) {
    }
    if (p < 0 || p > 65535) throw std::invalid_argument("not a port: " + port);
    return tcp::endpoint(addr, static_cast<unsigned short>(p));
}

class http_channel_impl final : public http_channel {
public:
    std::string_view name() const override { return "http"; }

    void attach(channel_host& host) override {
        const auto& cfg = host.config();
        endpoint_ = parse_listen(cfg.server.listen);
        if (cfg.channels.ws_enabled) {
            ws::options wo;
            wo.max_connections = static_cast<std::size_t>(cfg.channels.ws_max_connections);
            wo.max_frame_bytes = static_cast<std::size_t>(cfg.channels.ws_max_frame_bytes);
            wo.max_queued_frames = static_cast<std::size_t>(cfg.channels.ws_max_queued_frames);
            wo.idle_timeout = cfg.channels.ws_idle_timeout;
            websocket_ = std::make_unique<ws::channel>(host.runtime(), wo);
            host.add_plugin(websocket_->make_plugin());
        }
        http_server_options o;
        o.max_body_bytes = static_cast<std::size_t>(cfg.server.max_body_bytes);
        o.header_timeout = cfg.server.header_timeout;
        o.idle_timeout = cfg.server.idle_timeout;
        o.sse_heartbeat = cfg.server.sse_heartbeat;
        o.access.tokens = authenticator(cfg.server.tokens);
        o.access.metrics_public = cfg.server.metrics_public;
        o.access.loopback = endpoint_.address().is_loopback();
        o.max_connections = static_cast<std::size_t>(cfg.server.max_connections);
        o.max_header_bytes = static_cast<std::size_t>(cfg.server.max_header_bytes);
        o.body_timeout = cfg.server.body_timeout;
        o.tls = cfg.server.tls;
        // Exposed (tokens, or an address others reach): a cap per client address by default.
        bool exposed = !cfg.server.tokens.empty() || !endpoint_.address().is_loopback();
        o.max_connections_per_ip =
            static_cast<std::size_t>(cfg.server.max_connections_per_ip.value_or(exposed ? 1024 : 0));
        auto& rt = host.runtime();
        server_ = std::make_unique<http_server>(
            host.get_executor(), rt, o, [this, &rt] { return ready_.load() && !rt.draining(); },
            websocket_.get());
        // Bound now, before recovery, as the daemon always has: a client that connects meanwhile
        // waits in the backlog and is answered once start() accepts.
        if (auto ec = server_->listen(endpoint_))
            throw std::runtime_error("cannot listen on " + cfg.server.listen + ": " + ec.message());
    }

    asio::awaitable<void> start() override {
        server_->start();
        ready_.store(true);
        co_return;
    }

    asio::awaitable<void> stop() override {
        ready_.store(false);
        if (server_) server_->stop();
        co_return;
    }

    // After the drain, so that the replies of the turns that finished meanwhile were sent.
    asio::awaitable<void> close() override {
        if (websocket_) websocket_->stop();
        co_return;
    }

    tcp::endpoint local_endpoint() const override {
        return server_ ? server_->local_endpoint() : tcp::endpoint{};
    }

private:
    tcp::endpoint endpoint_;
    std::unique_ptr<ws::channel> websocket_;
    std::unique_ptr<http_server> server_;
    std::atomic<bool> ready_{false};
};
} // namespace

std::shared_ptr<http_channel> make_http_channel() {
    return std::make_shared<http_channel_impl>();
}

} // namespace baton
