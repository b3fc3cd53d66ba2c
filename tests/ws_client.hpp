// A WebSocket test client for the daemon's /v1/ws (Beast, blocking, every read bounded by a socket
// timeout so that a silent daemon fails the test instead of hanging it).
#pragma once

#include <boost/json.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton::test {

class ws_client {
public:
    // Connects and upgrades; fails the test when it cannot.
    ws_client(const std::string& host, unsigned short port,
              std::chrono::milliseconds timeout = std::chrono::seconds(10));
    // The same with headers on the upgrade request (Authorization, Sec-WebSocket-Protocol).
    ws_client(const std::string& host, unsigned short port,
              const std::vector<std::pair<std::string, std::string>>& headers,
              std::chrono::milliseconds timeout = std::chrono::seconds(10));
    // The Sec-WebSocket-Protocol of the server's 101 ("" when none).
    std::string protocol() const;
    ~ws_client();
    ws_client(const ws_client&) = delete;
    ws_client& operator=(const ws_client&) = delete;

    void send(const boost::json::object& frame);
    void send_text(std::string_view text);
    // Sends without failing the test when the server has already closed (an oversized frame).
    bool try_send_text(std::string_view text);
    void send_binary(std::string_view bytes);
    // Writes bytes on the TCP connection as they are (a hand-made frame, masking included).
    void send_raw(std::string_view bytes);
    // The next frame as JSON; nullopt when the connection closed or the read timed out (then
    // close_code() says how the server closed it, 0 when it did not).
    std::optional<boost::json::object> read();
    // The first frame that matches and was not returned by an earlier call, from those already
    // read (frames can come in any order across turns) or read now; fails the test when the
    // connection ends first. Every frame read is kept in `seen`.
    boost::json::object read_until(const std::function<bool(const boost::json::object&)>& match);
    // Sends a ping frame and reads until its pong: every frame the server sent before is in `seen`.
    void barrier();
    int close_code() const;
    // Closes the TCP connection at once, without a close frame (a dropped network).
    void drop();

    std::vector<boost::json::object> seen;
    std::vector<bool> taken; // by read_until, one flag per frame of `seen`

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

// {"type": ...} matchers.
std::function<bool(const boost::json::object&)> frame_type(std::string type);
std::function<bool(const boost::json::object&)> event_named(std::string event, std::string turn_id = "");

} // namespace baton::test
