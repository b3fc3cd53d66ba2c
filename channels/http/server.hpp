// The HTTP channel: a Beast server for the REST API of docs/api.md (keep-alive, pipelining, body and
// header limits, timeouts). Runs on any executor; each connection on its own strand.
#pragma once

#include "channels/http/api.hpp"

#include <baton/runtime.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

namespace baton {

struct http_server_options {
    std::size_t max_body_bytes = 1048576;
    std::size_t max_header_bytes = 16384;
    std::chrono::milliseconds header_timeout{10000}; // from the first byte to the end of the headers
    std::chrono::milliseconds idle_timeout{60000};   // keep-alive wait for the next request
    std::chrono::milliseconds body_timeout{30000};
    std::chrono::milliseconds sse_heartbeat{15000}; // a comment line on an idle event stream
    http::access_options access;                    // tokens; /metrics without one
    std::size_t max_connections = 20000;            // open at once; one more gets 503 and is closed
    // Open at once from one address before a valid token was presented on them (0: no cap); one
    // more gets 503 and is closed. A connection stops counting once a request on it carries a
    // valid token.
    std::size_t max_connections_per_ip = 0;
    // TLS on the listener (TLS 1.2 and later), from PEM files; read when the server is made.
    std::optional<tls_config> tls;
};

// Loads server.tls's files as the server does when it is made (`baton check-config`): throws
// std::invalid_argument naming the key and the file, as `serve` reports them.
void check_tls_files(const tls_config& files);

namespace ws {
class channel;
}

class http_server {
public:
    // `websocket`: the channel that takes GET /v1/ws upgrades (nullptr: not served).
    // Throws std::invalid_argument when opts.tls names files that do not hold a certificate and
    // its key (the message names the file and OpenSSL's reason).
    http_server(asio::any_io_executor ex, runtime& rt, http_server_options opts,
                std::function<bool()> ready, ws::channel* websocket = nullptr);
    ~http_server();

    // Binds and listens; returns the error (address in use, ...) instead of throwing.
    boost::system::error_code listen(const asio::ip::tcp::endpoint& ep);
    asio::ip::tcp::endpoint local_endpoint() const;
    // Starts accepting connections. Cancellation: stop().
    void start();
    // Stops accepting and closes idle connections; requests in progress finish.
    void stop();

private:
    struct impl;
    std::shared_ptr<impl> impl_;
};

} // namespace baton
