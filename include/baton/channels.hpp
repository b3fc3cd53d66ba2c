// The built-in channels, each a baton::channel (<baton/channel.hpp>). The service adds the ones
// its config enables; a program can add them itself to a service built with http = false.
#pragma once

#include <baton/channel.hpp>
#include <baton/config.hpp>
#include <baton/http_client.hpp>

#include <boost/asio/ip/tcp.hpp>

#include <functional>
#include <memory>

namespace baton {

// HTTP API, SSE, the web chat page and, when config.channels.ws_enabled, the WebSocket channel,
// on config.server.listen (docs/api.md). attach() binds the address (before recovery; it throws
// when the address cannot be bound, which fails async_start); start() accepts. /readyz is 200
// once started and until stopped.
class http_channel : public channel {
public:
    // The address it listens on, once started (port 0 in the config picks a free one).
    virtual boost::asio::ip::tcp::endpoint local_endpoint() const = 0;
};
std::shared_ptr<http_channel> make_http_channel();

// Replies POSTed to config.channels.webhook targets (`deliver.channel: "webhook"`).
std::shared_ptr<channel> make_webhook_channel(std::shared_ptr<http_client> http);

// A Telegram bot (config.channels.telegram): getUpdates in, sendMessage out. attach() throws
// std::invalid_argument when its token's environment variable is unset or empty.
std::shared_ptr<channel> make_telegram_channel(std::shared_ptr<http_client> http);

// config.channels.schedules: timed messages into their sessions.
std::shared_ptr<channel> make_schedule_channel();

} // namespace baton
