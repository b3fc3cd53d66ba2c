#include "channels/webhook/channel.hpp"

#include <baton/channels.hpp>

namespace baton {

namespace {
class webhook_plugin final : public channel {
public:
    explicit webhook_plugin(std::shared_ptr<http_client> http) : http_(std::move(http)) {}
    std::string_view name() const override { return "webhook"; }
    void attach(channel_host& host) override {
        const auto& c = host.config().channels;
        host.add_outbound(std::make_shared<webhook::channel>(
            c.webhook_targets, http_, static_cast<std::size_t>(c.webhook_max_concurrency)));
    }
    asio::awaitable<void> start() override { co_return; }
    asio::awaitable<void> stop() override { co_return; }

private:
    std::shared_ptr<http_client> http_;
};
} // namespace

std::shared_ptr<channel> make_webhook_channel(std::shared_ptr<http_client> http) {
    return std::make_shared<webhook_plugin>(std::move(http));
}

} // namespace baton
