// One WebSocket connection of the channel (Beast). The HTTP server hands an upgrade request for
// GET /v1/ws over to serve(), which owns the connection from then on.
#pragma once

#include "channels/ws/channel.hpp"

#include <baton/auth.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <string>

namespace baton::ws {

// Accepts the upgrade on a connection slot taken with channel::try_open, then reads frames (and
// writes, while there is something to send) until the connection ends.
// Cancellation: closing the socket (channel::stop).
// `who` is the caller the upgrade authenticated: every frame acts as its tenant. `early` holds the
// bytes that came after the upgrade request before its 101 (a client that did not wait): they are
// the connection's first frames.
asio::awaitable<void> serve(channel& ch, std::shared_ptr<void> slot, boost::beast::tcp_stream stream,
                            boost::beast::http::request<boost::beast::http::string_body> req, caller who,
                            std::string early);
// The same over TLS (server.tls), on a stream whose handshake is done.
asio::awaitable<void> serve(channel& ch, std::shared_ptr<void> slot,
                            boost::beast::ssl_stream<boost::beast::tcp_stream> stream,
                            boost::beast::http::request<boost::beast::http::string_body> req, caller who,
                            std::string early);

} // namespace baton::ws
