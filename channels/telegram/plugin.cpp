#include "channels/telegram/channel.hpp"

#include <baton/channels.hpp>

#include <stdexcept>

namespace baton {

namespace {
// The poller admits chat messages; the sender (sendMessage) delivers the replies.
class telegram_plugin final : public channel {
public:
    explicit telegram_plugin(std::shared_ptr<http_client> http) : http_(std::move(http)) {}
    std::string_view name() const override { return "telegram"; }
    void attach(channel_host& host) override {
        std::string why;
        auto o = telegram::options_from(host.config().channels, why);
        if (!o) throw std::invalid_argument(why);
        o->clock = host.runtime().clock();
        host.add_outbound(telegram::make_sender(http_, *o));
        poller_ = std::make_unique<telegram::poller>(host.get_executor(), host.runtime(), http_, *o);
    }
    asio::awaitable<void> start() override {
        poller_->start();
        co_return;
    }
    // No new chat messages while draining; what the debounce holds stays stored.
    asio::awaitable<void> stop() override {
        if (poller_) co_await poller_->stop();
    }

private:
    std::shared_ptr<http_client> http_;
    std::unique_ptr<telegram::poller> poller_;
};
} // namespace

std::shared_ptr<channel> make_telegram_channel(std::shared_ptr<http_client> http) {
    return std::make_shared<telegram_plugin>(std::move(http));
}

} // namespace baton
