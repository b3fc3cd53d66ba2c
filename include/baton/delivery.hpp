// Delivery (docs/api.md "Delivery (outbox)"): the push half of the outbox. dispatch_outbound stores each
// outbound item (key derived from session, turn, channel, recipient, index) before any byte is sent;
// delivery workers then send it through its channel, with bounded concurrency per channel and the
// retry budget below, and record every step in the store so that a restart picks up where the
// last process stopped (items found `sending` are sent again, flagged `uncertain`).
//
// A pushing channel (webhook, Telegram) implements `outbound_channel`; the WebSocket channel does
// not push (clients ack), so it keeps its own dispatch hook.
#pragma once

#include <baton/clock.hpp>
#include <baton/framework.hpp>
#include <baton/runtime.hpp>
#include <baton/types.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

// What one attempt to send an item came to.
struct send_outcome {
    enum class kind { delivered, retry, failed };
    kind what = kind::delivered;
    std::string error;                                    // retry, failed: why (kept as last_error)
    std::optional<std::chrono::milliseconds> retry_after; // the peer's hint (Retry-After)
    // The request may have reached the recipient although no answer came (a timeout, a reset
    // after sending): the next attempt is flagged `uncertain`, as after a crash.
    bool maybe_delivered = false;

    static send_outcome ok() { return {}; }
    static send_outcome again(std::string why, std::optional<std::chrono::milliseconds> after = {}) {
        return {kind::retry, std::move(why), after, false};
    }
    static send_outcome unanswered(std::string why) { return {kind::retry, std::move(why), {}, true}; }
    static send_outcome give_up(std::string why) { return {kind::failed, std::move(why), {}, false}; }
};

// A channel that pushes items to a recipient. send() is called by the delivery workers, at most
// max_concurrency() at a time per channel and, when ordered(), one at a time per recipient, in
// creation order. It must return (never throw for an expected failure) within its own timeout.
class outbound_channel {
public:
    virtual ~outbound_channel() = default;
    // The name used in `deliver.channel` and in outbox items ("webhook", "telegram").
    virtual std::string_view name() const = 0;
    // Checked when a message is accepted: nullopt when `to` names a recipient this channel can
    // reach, else why not (the POST answers 400 invalid_request with it).
    virtual std::optional<std::string> check_recipient(std::string_view to) const = 0;
    // The longest text of one item, in UTF-16 units (a code point above U+FFFF counts two, as
    // Telegram counts); 0: no limit. Longer replies are split
    // into chunks with indexes 0, 1, ...
    virtual std::size_t max_chunk_chars() const { return 0; }
    virtual std::size_t max_concurrency() const { return 8; }
    // True when a recipient must get its items one at a time, in order (chat messages).
    virtual bool ordered() const { return false; }
    // Cancellation: a terminal cancellation (shutdown) may abort the send; the item then stays
    // `sending` in the store and a restart sends it again as `uncertain`.
    virtual asio::awaitable<send_outcome> send(const outbox_item& item) = 0;
};

// The retry budget: after the n-th failed attempt the item waits backoff[n-1]; after the last one
// it is `failed`. Default 1 s, 5 s, 25 s, 120 s, 600 s: six attempts in all.
struct retry_policy {
    std::vector<std::chrono::milliseconds> backoff{std::chrono::seconds(1), std::chrono::seconds(5),
                                                   std::chrono::seconds(25), std::chrono::seconds(120),
                                                   std::chrono::seconds(600)};
};

// The item once an attempt (already counted in item.attempts) came to `o` at `now`: delivered;
// pending again with next_attempt_at (the later of its backoff and the peer's hint); or failed.
// Pure: no I/O.
outbox_item after_attempt(outbox_item item, const send_outcome& o, time_ms now, const retry_policy& p);

// Splits text into chunks of at most `max_chars` UTF-16 units (0: one chunk), preferring to cut
// after a newline, then after a space, in the last quarter of a chunk; never inside a UTF-8
// sequence. Pure.
std::vector<std::string> split_chunks(std::string_view text, std::size_t max_chars);

struct delivery_options {
    retry_policy retry;
    // Backoffs are measured (next_attempt_at, UTC ms) and waited out on it.
    std::shared_ptr<baton::clock> clock = system_clock();
};

class delivery {
public:
    delivery(asio::any_io_executor ex, runtime& rt, delivery_options o = {});
    ~delivery();
    delivery(const delivery&) = delete;
    delivery& operator=(const delivery&) = delete;

    // Before start(). Registers the channel's route with the runtime (deliver.channel == name()).
    void add_channel(std::shared_ptr<outbound_channel> ch);

    // Its dispatch_outbound takes the items of the registered channels: split, stored, queued.
    plugin make_plugin();

    // Picks up what an earlier process left: items in `sending` become pending and `uncertain`,
    // then every pending item of a registered channel is queued (keeping its backoff); items of a
    // recipient no longer configured are marked failed; items of a channel not registered are left
    // as they are (pending until a start that registers it again). Then workers run.
    // Returns how many items it queued.
    asio::awaitable<std::size_t> start();

    // No new attempts start (the stored items wait for the next start); completes when the sends
    // in flight have finished. Those still running after `grace` are cancelled (terminal) and
    // waited for; they stay `sending` (`uncertain` later).
    asio::awaitable<void> stop(std::chrono::milliseconds grace);

    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

} // namespace baton
