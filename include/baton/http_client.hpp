// An HTTP/1.1 client for model providers and webhooks: keep-alive connections pooled per endpoint
// (scheme, host, port), TLS with certificate and host name verification, timeouts and Asio
// cancellation. Expected failures come back as error codes; no Beast type leaks out of this header.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace baton {

struct http_client_options {
    // As many as the turns that may call one endpoint at once: fewer makes a busy daemon
    // reconnect for most calls.
    std::size_t max_idle_per_endpoint = 256;
    std::chrono::milliseconds connect_timeout{
        10000};              // name resolution, TCP connect (TLS: handshake too)
    bool verify_peer = true; // https: check the chain and the host name
    std::string ca_file;     // PEM trust anchors; empty: the system default paths
};

struct http_response {
    unsigned status = 0;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;

    // The first header of that name, compared case-insensitively.
    std::optional<std::string_view> header(std::string_view name) const;
};

using http_headers = std::vector<std::pair<std::string, std::string>>;

// A request body the caller keeps and the client only reads: it must stay valid until the call
// completes. For a body sent more than once (a caller's own retries) without a copy per try.
struct borrowed_body {
    // Explicit: `{}` stays an empty string. Never null: an empty view still points somewhere.
    explicit borrowed_body(std::string_view t) : text(t.data() ? t : std::string_view("", 0)) {}
    std::string_view text;
};

// Thread-safe: any number of coroutines, on any executors, may share one client. Each connection
// has its own strand, on which every operation on it runs.
class http_client {
public:
    explicit http_client(boost::asio::any_io_executor ex, http_client_options opts = {});
    // Closes the idle connections; requests in flight keep what they need and finish.
    ~http_client();
    http_client(const http_client&) = delete;
    http_client& operator=(const http_client&) = delete;

    // Sends one request and reads the whole response body (at most 64 MiB). `timeout` bounds the
    // whole exchange. The client frames the body: it sends Content-Length (for any body, and for
    // an empty POST, PUT or OPTIONS) and drops a caller's Content-Length and Transfer-Encoding; a
    // caller's Host replaces the URL's. Errors: bad URL or scheme, a method or header name that is
    // not an HTTP token, a header value holding CR, LF or NUL, or a TRACE with a body ->
    // errc::invalid_argument before anything is sent; refused/unreachable as
    // the socket reports them, timeout -> boost::beast::error::timeout, peer closed -> eof or
    // partial_message, TLS failures in the ssl category. A pooled connection found closed by the
    // server before any response byte is retried once on a fresh connection.
    // Cancellation: a terminal cancellation of the awaiting coroutine aborts the request, closes
    // (never pools) its connection and returns operation_aborted.
    boost::asio::awaitable<std::pair<boost::system::error_code, http_response>>
    request(std::string method, std::string url, http_headers headers, std::string body,
            std::chrono::milliseconds timeout);

    // Like request(), but hands the body over as it arrives: on_head(status + headers) once, then
    // on_body(piece) per piece read. The returned response carries status and headers, no body.
    // The callbacks run on the connection's strand while the awaiting coroutine is suspended (so
    // never concurrently with it, but maybe on another thread). A callback that throws aborts the
    // request (the connection is closed) and the exception propagates.
    // Cancellation: as request(); pieces already delivered stay delivered.
    boost::asio::awaitable<std::pair<boost::system::error_code, http_response>>
    stream(std::string method, std::string url, http_headers headers, std::string body,
           std::chrono::milliseconds timeout, std::function<void(const http_response& head)> on_head,
           std::function<void(std::string_view piece)> on_body);

    // The same two, with a body the caller keeps (see borrowed_body).
    boost::asio::awaitable<std::pair<boost::system::error_code, http_response>>
    request(std::string method, std::string url, http_headers headers, borrowed_body body,
            std::chrono::milliseconds timeout);
    boost::asio::awaitable<std::pair<boost::system::error_code, http_response>>
    stream(std::string method, std::string url, http_headers headers, borrowed_body body,
           std::chrono::milliseconds timeout, std::function<void(const http_response& head)> on_head,
           std::function<void(std::string_view piece)> on_body);

    // Idle pooled connections over all endpoints (tests, metrics).
    std::size_t idle_connections() const;

    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

} // namespace baton
