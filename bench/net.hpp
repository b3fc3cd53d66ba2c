// Client sides for the benchmarks: one keep-alive HTTP/1.1 connection (plain requests and SSE
// streams), and the library's WebSocket client under its bench name. Beast stays in net.cpp.
// Not thread-safe: use each object from one coroutine (or strand) at a time.
#pragma once

#include "src/model/sse.hpp"
#include <baton/ws_client.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace baton::bench {

namespace asio = boost::asio;
using boost::system::error_code;
using std::chrono::milliseconds;

// http://HOST:PORT[/PATH] (no TLS): host, port ("80" when absent) and path ("" when absent).
struct http_url {
    std::string host;
    std::string port;
    std::string path;
};
std::optional<http_url> parse_http_url(std::string_view url);

struct http_reply {
    unsigned status = 0;
    std::string body;
};

// Methods for request(), named: keeps literals out of co_await expressions (g++ 12 coroutine bugs).
inline constexpr std::string_view method_get = "GET";
inline constexpr std::string_view method_post = "POST";

class http_connection {
public:
    http_connection(asio::any_io_executor ex, std::string host, std::string port);
    ~http_connection();
    http_connection(const http_connection&) = delete;
    http_connection& operator=(const http_connection&) = delete;

    // One request; `timeout` bounds connect + write + read. A JSON body gets its Content-Type.
    // A reused connection the server closed meanwhile is retried once on a new one.
    // Cancellation: none beyond the timeout (the connection is then closed).
    asio::awaitable<std::pair<error_code, http_reply>>
    request(std::string_view method, std::string target, std::string body, milliseconds timeout);

    // GET `target` as Server-Sent Events: calls `on_event` per event until it returns false or the
    // stream ends; `timeout` bounds the whole exchange. A non-200 answer comes back whole (status
    // and body) without any call; a 200 comes back with an empty body.
    asio::awaitable<std::pair<error_code, http_reply>>
    events(std::string target, const std::function<bool(const sse_event&)>& on_event,
           milliseconds timeout);

    // A header sent with every later request (Authorization).
    void set_header(std::string name, std::string value);

    // TCP connections made so far (1 when keep-alive held all along).
    std::size_t connects() const;
    void close();

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

// The daemon's turn statuses that end a turn (API.md).
bool terminal_status(std::string_view status);

// GET `prefix`/v1/turns/{tid} until the turn's status is terminal: at once, then after 1 ms
// doubling up to 20 ms. A transport error or a non-200 answer ends the wait with an empty status.
struct turn_poll {
    error_code ec;
    http_reply last;    // the last answer
    std::string status; // the terminal status, or ""
    std::uint32_t polls = 0;
};
// Polls GET /v1/turns/{tid} (backing off 1..20 ms) until terminal; `held`: long polls with
// ?wait=30, one after the other, without a pause.
asio::awaitable<turn_poll> poll_turn(http_connection& c, std::string prefix, std::string tid,
                                     milliseconds timeout, bool held = false);

// The library's WebSocket client (include/baton/ws_client.hpp).
using ws_connection = baton::ws_client;

} // namespace baton::bench
