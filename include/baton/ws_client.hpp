// A WebSocket client connection (ws://, or wss:// after use_tls(); text frames) for the terminal
// chat and the benchmarks. Beast stays in ws_client.cpp. Not thread-safe: run it on one strand; one
// receive() and one send() may be in flight at once (Beast allows one read and one write).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace baton {

// wss://: how the server's certificate is checked.
struct ws_client_tls {
    std::string ca_file;     // PEM trust anchors; empty: the system's default paths
    bool verify_peer = true; // the chain, and that the certificate names the host (or its IP address)
};

class ws_client {
public:
    ws_client(boost::asio::any_io_executor ex, std::string host, std::string port);
    ~ws_client();
    ws_client(const ws_client&) = delete;
    ws_client& operator=(const ws_client&) = delete;

    // Connects and upgrades within `timeout`. Returns the HTTP status of the answer (101 on
    // success); a refused upgrade gives an error and the status the server sent (404, ...).
    // With `idle`, a later receive() fails when nothing arrives for that long; with `ping` too,
    // a quiet connection is pinged, so only a dead peer (no pong either) fails it.
    // Cancellation: none beyond the timeout.
    // A header sent with the upgrade request (Authorization, Sec-WebSocket-Protocol); before connect().
    void set_header(std::string name, std::string value);
    // TLS (1.2 and later) before the upgrade (wss://); before connect(). Fails when the trust
    // anchors cannot be loaded.
    boost::system::error_code use_tls(const ws_client_tls& opts = {});

    boost::asio::awaitable<std::pair<boost::system::error_code, unsigned>>
    connect(std::string target, std::chrono::milliseconds timeout,
            std::optional<std::chrono::milliseconds> idle = {}, bool ping = false);

    boost::asio::awaitable<boost::system::error_code> send(std::string text);
    // The next text or binary message.
    boost::asio::awaitable<std::pair<boost::system::error_code, std::string>> receive();
    // The closing handshake (normal closure); a pending receive() then ends with `closed`.
    boost::asio::awaitable<boost::system::error_code> close();

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

} // namespace baton
