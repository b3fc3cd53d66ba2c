// The Telegram channel: a bot reached through the Bot API. Inbound, a poller long-polls
// getUpdates and admits each text message through the runtime (session `telegram:<chat_id>`),
// persisting its offset so that a restart neither loses nor repeats an update. Outbound, a sender
// (an `outbound_channel` for the delivery workers) posts sendMessage, paced per chat and overall.
#pragma once

#include <baton/clock.hpp>
#include <baton/config.hpp>
#include <baton/delivery.hpp>
#include <baton/http_client.hpp>
#include <baton/runtime.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace baton::telegram {

struct options {
    std::string api_base = "https://api.telegram.org";
    std::string token;                    // never logged, nor any URL holding it
    std::vector<std::string> allow_chats; // empty: every chat
    std::string agent = "default";
    std::string tenant{default_tenant}; // whose sessions the chats are
    std::chrono::milliseconds debounce{0};
    std::chrono::seconds poll_timeout{25};
    std::chrono::milliseconds send_interval{1000}; // between two sends to one chat
    std::chrono::milliseconds send_gap{34};        // between any two sends: about 30 per second
    std::chrono::milliseconds send_timeout{15000};
    std::chrono::milliseconds backoff_min{1000}, backoff_max{30000}; // getUpdates failing
    // The debounce, the backoff and the send pacing run on it; tests pass a manual_clock.
    std::shared_ptr<baton::clock> clock = system_clock();
};

// The options of channels.telegram, with the token read from its environment variable. Nullopt
// (and `error` says why) when the channel is not configured or the variable is unset or empty.
std::optional<options> options_from(const channels_config& c, std::string& error);

// Whether `chat` may talk to the bot.
bool allowed(const options& o, std::string_view chat);

// sendMessage as an outbound_channel named "telegram": max_chunk_chars 4096, ordered per chat.
// Thread-safe.
std::shared_ptr<outbound_channel> make_sender(std::shared_ptr<http_client> http, options o);

// The inbound half. Cursors in the store: `telegram.offset` (the next update_id to ask for),
// `telegram.pending` (updates held by the debounce, with the bot id), written together and only
// once the updates before the offset are accepted or held there.
class poller {
public:
    poller(asio::any_io_executor ex, runtime& rt, std::shared_ptr<http_client> http, options o);
    ~poller();
    poller(const poller&) = delete;
    poller& operator=(const poller&) = delete;

    // Starts polling (once). Failures are logged and retried; nothing here ends the process.
    void start();
    // Cancels the long poll and any wait; completes once the polling coroutine has ended (an
    // accept already under way finishes first). Held debounce buffers stay in the store and are
    // admitted by the next start. Idempotent.
    asio::awaitable<void> stop();

    // Counters for tests and metrics.
    std::uint64_t polls() const;    // getUpdates requests answered or failed
    std::uint64_t accepted() const; // messages admitted (replays included)

    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

} // namespace baton::telegram
