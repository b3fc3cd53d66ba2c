// The channel interface: how messages come into baton and replies go out, for the built-in
// channels (HTTP with SSE, WebSocket, webhook, Telegram, schedules) and for channels of one's
// own (docs/channels.md). A channel is added to the service before it starts
// (service::add_channel); the service then calls, in this order:
//
//   attach(host)  once, at async_start, before recovery: register what the channel brings (hooks,
//                 a pushing outbound channel, routes). Nothing is admitted yet.
//   start()       after recovery: take messages (listen, poll, connect, arm timers).
//   stop()        at async_stop, before the drain: take no new messages.
//   close()       after the drain, when the replies of the turns that finished are out: close
//                 connections.
//
// Through its host a channel submits messages (with an idempotency key), follows the events of
// its sessions and turns, keeps cursors (a poll offset, a schedule's last fire) and delivers
// replies: pushed by the outbox's workers (outbound_channel, with retries and backoff) or
// acknowledged by the recipient (a dispatch_outbound hook that stores the item, then
// runtime::outbox_delivered when the recipient acks).
#pragma once

#include <baton/config.hpp>
#include <baton/delivery.hpp>
#include <baton/framework.hpp>
#include <baton/runtime.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <memory>
#include <string_view>

namespace baton {

// What a channel sees of the service.
class channel_host {
public:
    virtual ~channel_host() = default;
    virtual boost::asio::any_io_executor get_executor() const = 0;
    virtual const baton::config& config() const = 0;
    // Submitting (runtime::accept), turns and tapes, events (runtime::events()), cursors
    // (runtime::read_cursors / write_cursors) and acks (runtime::outbox_delivered).
    virtual baton::runtime& runtime() = 0;
    // Hooks (docs/hooks.md), after the default pipeline's: e.g. a dispatch_outbound that takes
    // this channel's items.
    virtual void add_plugin(plugin p) = 0;
    // A channel whose replies the outbox's workers push (send() with retries and backoff); its
    // name() becomes a `deliver.channel` that messages may ask for.
    virtual void add_outbound(std::shared_ptr<outbound_channel> c) = 0;
};

class channel {
public:
    virtual ~channel() = default;
    virtual std::string_view name() const = 0;
    virtual void attach(channel_host& host) = 0;
    // A failure (an exception) fails the service's async_start with the message.
    virtual boost::asio::awaitable<void> start() = 0;
    virtual boost::asio::awaitable<void> stop() = 0;
    virtual boost::asio::awaitable<void> close() { co_return; }
};

} // namespace baton
