// A channel that connects baton, as a WebSocket client, to a chat service of some other kind
// (docs/channels.md "A WebSocket client channel"). The library does what every such channel
// needs: it dials, keeps the connection alive with pings (a peer that answers neither frames nor
// pings is dropped), reconnects with exponential backoff (on the runtime's clock), stores every reply in the outbox before
// it is sent, sends it, and sends it again after each reconnect until the peer acknowledges its
// key. A subclass says only what the peer's frames mean and what a reply's frame looks like.
//
// Delivery is at least once: a reply can reach the peer twice (before and after a reconnect), with
// the same key each time, until acked(key) is called for it.
#pragma once

#include <baton/channel.hpp>

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace baton {

struct ws_client_channel_options {
    std::string name;          // the channel's name: `deliver.channel` and its outbox items
    std::string host = "127.0.0.1";
    std::string port;
    std::string target = "/";  // the upgrade request's path
    std::chrono::milliseconds connect_timeout{5000};
    // A connection quiet this long is pinged; one that stays silent as long again is dropped.
    std::chrono::milliseconds heartbeat{15000};
    // Between connection attempts: after a failed dial or a lost connection the wait doubles from
    // backoff_min up to backoff_max; it starts again from backoff_min after a connection that
    // lasted backoff_max.
    std::chrono::milliseconds backoff_min{250}, backoff_max{10000};
};

class ws_client_channel : public channel {
public:
    explicit ws_client_channel(ws_client_channel_options o);
    ~ws_client_channel() override;

    std::string_view name() const final;
    void attach(channel_host& host) final;
    boost::asio::awaitable<void> start() final;
    boost::asio::awaitable<void> stop() final;
    // Closes the connection (after the drain, when the last replies are stored) and ends the loop.
    boost::asio::awaitable<void> close() final;

    bool connected() const;
    std::uint64_t connections() const; // connections made so far (reconnects counted)

protected:
    // After each connection is made, before the unacknowledged replies go out again (join rooms,
    // authenticate). Frames sent here go first.
    virtual boost::asio::awaitable<void> on_connected() { co_return; }
    // Each text frame the peer sends, in order; the next is read once this returns.
    virtual boost::asio::awaitable<void> on_frame(std::string frame) = 0;
    // The frame that carries a reply to the peer: `item.recipient` is where it goes (the `to`
    // given to submit()), `item.key` what the peer acknowledges it with.
    virtual std::string reply_frame(const outbox_item& item) = 0;

    // For the subclass, from its hooks above (they run on the channel's strand):
    // A message from `recipient` (a room, a chat) into `session_id`; its reply comes back to
    // `recipient` through reply_frame(). `key` (the peer's message id) makes a frame the peer
    // sends twice one turn (scoped to this channel and recipient: it meets no other channel's or
    // HTTP client's key). Errors as service::async_submit's.
    boost::asio::awaitable<accept_result> submit(std::string session_id, std::string recipient,
                                                 std::string text, std::string key);
    // The peer confirmed a reply: it is `delivered` and not sent again. False when this channel
    // has no reply with that key (another channel's key marks nothing).
    boost::asio::awaitable<bool> acked(std::string key);
    // Queues a frame on the connection; false when there is none (the frame is dropped).
    bool send(std::string frame);
    channel_host& host();

public:
    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

} // namespace baton
