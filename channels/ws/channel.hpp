// The WebSocket channel (docs/api.md "WebSocket channel: GET /v1/ws"), without sockets: which
// connections follow which sessions, and the replies of channel `ws`. A reply is an outbox item:
// stored before it is sent, sent to every connection subscribed to its session, and sent again on
// each later subscribe until a client acks its key. session.cpp runs the connections (Beast).
#pragma once

#include <baton/runtime.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace baton::ws {

struct options {
    std::size_t max_connections = 10000;   // more are refused at the upgrade with 503
    std::size_t max_frame_bytes = 1 << 20; // a bigger incoming frame closes with 1009
    std::size_t max_queued_frames = 4096;  // a connection further behind than this is dropped
    std::chrono::milliseconds idle_timeout{60000}; // pings keep it open; no answer closes it
};

// One client connection, as the channel sees it. Thread-safe.
class connection {
public:
    virtual ~connection() = default;
    // Queues a text frame without blocking; a connection whose queue overflows closes itself.
    virtual void send(std::string frame) = 0;
    // Closes with 1001 (going away).
    virtual void close() = 0;
};

class channel {
public:
    channel(runtime& rt, options o);
    ~channel();
    channel(const channel&) = delete;
    channel& operator=(const channel&) = delete;

    runtime& rt() { return rt_; }
    const options& opts() const { return opts_; }

    // Its dispatch_outbound stores the replies of channel `ws` and sends them to subscribers.
    plugin make_plugin();

    // A connection slot, given back when the returned token is destroyed (the token may outlive
    // the channel: connections end when their io_context is destroyed). Null when max_connections
    // are open (the upgrade answers 503).
    std::shared_ptr<void> try_open();
    std::size_t connections() const { return open_->load(); }

    // A connection's life in the channel: attach once accepted, detach when it ends (this also
    // ends its subscriptions).
    void attach(const std::shared_ptr<connection>& c);
    void detach(const connection* c);

    // `c` follows the session from now on (its replies, and its turns' events unless `events` is
    // false), and is sent every reply of the session not yet acked. Subscribing again only
    // switches the events on or off.
    // Cancellation: none.
    asio::awaitable<void> subscribe(const std::shared_ptr<connection>& c, const session_ref& session,
                                    bool events = true);

    // Sends a stored reply to the session's subscribers.
    void deliver(const outbox_item& item);

    // Closes every connection (drain).
    void stop();

private:
    asio::awaitable<bool> dispatch(turn_context& ctx, const outbound& item);

    // A followed session: its event listener, which forwards every event (`events` true) or only
    // the end of a turn no reply follows (replies only). One listener for the connection's life:
    // a switch flips the flag it reads, so that no event goes out twice or not at all meanwhile.
    struct followed {
        session_ref session;
        std::uint64_t listener = 0;
        std::shared_ptr<std::atomic<bool>> events;
    };
    struct attached {
        std::weak_ptr<connection> conn;
        std::vector<followed> sessions;
    };

    runtime& rt_;
    options opts_;
    std::shared_ptr<std::atomic<std::size_t>> open_ = std::make_shared<std::atomic<std::size_t>>(0);
    std::mutex mutex_;
    std::unordered_map<const connection*, attached> conns_;
    std::unordered_map<std::string, std::vector<std::weak_ptr<connection>>> by_session_; // by key()
};

// {"type":"reply","session","turn_id","key","text","uncertain"}
std::string reply_frame(const outbox_item& item);
// A client frame's "id": none when the frame had none (or one that cannot be echoed); "" is an id.
using frame_ref = std::optional<std::string_view>;
// The id as echoed back: null when the frame had none.
json::value frame_id(frame_ref id);
// {"type":"error","id","code","message"} (id null when the frame had none)
std::string error_frame(frame_ref id, std::string_view code, std::string_view message);
// The same for a refusal of the runtime's: a 429 adds "retry_after" (seconds).
std::string error_frame(frame_ref id, const api_error& e);

} // namespace baton::ws
