#include "channels/telegram/bot_api.hpp"
#include "channels/telegram/channel.hpp"

#include <baton/log.hpp>

#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace baton::telegram {

namespace {

using time_point = baton::clock::time_point;

class sender final : public outbound_channel {
public:
    sender(std::shared_ptr<http_client> http, options o)
        : http_(std::move(http)), opts_(std::move(o)),
          url_(method_url(opts_.api_base, opts_.token, "sendMessage")) {
        if (!opts_.clock) opts_.clock = system_clock();
    }

    std::string_view name() const override { return "telegram"; }

    std::optional<std::string> check_recipient(std::string_view to) const override {
        if (!is_chat_id(to))
            return "expected a Telegram chat id (an integer), got \"" + std::string(to) + "\"";
        if (!allowed(opts_, to))
            return "chat " + std::string(to) + " is not in channels.telegram.allow_chats";
        return std::nullopt;
    }

    std::size_t max_chunk_chars() const override { return 4096; }
    bool ordered() const override { return true; }

    // Cancellation: a terminal cancellation aborts the pacing wait or the request and throws
    // operation_aborted (the item stays `sending`; a restart sends it again as uncertain).
    asio::awaitable<send_outcome> send(const outbox_item& item) override {
        auto slot = reserve(item.recipient);
        if (slot > opts_.clock->now()) {
            baton::timer pause(opts_.clock, co_await asio::this_coro::executor, slot);
            co_await pause.async_wait(asio::use_awaitable);
        }
        // Named first: GCC 12 cannot keep an initializer list alive across a co_await.
        http_headers headers{{"Content-Type", "application/json"}};
        auto [ec, res] =
            co_await http_->request("POST", url_, std::move(headers),
                                    send_message_body(item.recipient, item.text), opts_.send_timeout);
        if (ec == asio::error::operation_aborted) throw boost::system::system_error(ec);
        // The error text names the failure only: the URL holds the token.
        if (ec == asio::error::connection_refused || ec == asio::error::host_unreachable ||
            ec == asio::error::network_unreachable)
            co_return send_outcome::again("sendMessage: " + ec.message());
        // A timeout or a reset may come after Telegram showed the message: the retry is uncertain.
        if (ec) co_return send_outcome::unanswered("sendMessage: " + ec.message());
        auto outcome = parse_send_message(res.status, res.body);
        if (outcome.what != send_outcome::kind::delivered)
            log::warn("telegram: sendMessage not delivered",
                      {{"chat_id", item.recipient}, {"key", item.key}, {"error", outcome.error}});
        co_return outcome;
    }

private:
    // The earliest time this send may start: send_interval after the chat's last send, send_gap
    // after anyone's. Taken at once, so concurrent sends queue up behind each other.
    time_point reserve(const std::string& chat) {
        std::lock_guard lock(mutex_);
        auto now = opts_.clock->now();
        auto at = std::max(now, last_any_ + opts_.send_gap);
        if (auto it = last_.find(chat); it != last_.end())
            at = std::max(at, it->second + opts_.send_interval);
        last_any_ = at;
        last_[chat] = at;
        // Chats quiet for longer than the interval need no entry.
        if (last_.size() > 4096)
            std::erase_if(last_, [&](const auto& kv) { return kv.second + opts_.send_interval < now; });
        return at;
    }

    std::shared_ptr<http_client> http_;
    options opts_;
    std::string url_;
    std::mutex mutex_;
    std::unordered_map<std::string, time_point> last_;
    time_point last_any_{};
};

} // namespace

std::shared_ptr<outbound_channel> make_sender(std::shared_ptr<http_client> http, options o) {
    return std::make_shared<sender>(std::move(http), std::move(o));
}

} // namespace baton::telegram
