// One WebSocket connection of the channel (Beast). The HTTP server hands an upgrade request for
// GET /v1/ws over to serve(), which owns the connection from then on.
#pragma once

#include "channels/ws/channel.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

namespace baton::ws {

// Answers 503 when the channel is full; otherwise accepts the upgrade and runs one reader and one
// writer coroutine until the connection ends. Cancellation: closing the socket (channel::stop).
asio::awaitable<void> serve(channel& ch, boost::beast::tcp_stream stream,
                            boost::beast::http::request<boost::beast::http::string_body> req);

} // namespace baton::ws
