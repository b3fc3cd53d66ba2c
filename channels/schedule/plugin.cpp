#include "channels/schedule/channel.hpp"

#include <baton/channels.hpp>

namespace baton {

namespace {
class schedule_plugin final : public channel {
public:
    std::string_view name() const override { return "schedule"; }
    void attach(channel_host& host) override {
        schedule::options o;
        o.clock = host.runtime().clock();
        schedules_ = std::make_unique<schedule::channel>(host.get_executor(), host.runtime(),
                                                         host.config().channels.schedules, o);
    }
    // After recovery, so that a catch-up fire queues behind the turns an earlier process left.
    asio::awaitable<void> start() override {
        schedules_->start();
        co_return;
    }
    asio::awaitable<void> stop() override {
        if (schedules_) schedules_->stop();
        co_return;
    }

private:
    std::unique_ptr<schedule::channel> schedules_;
};
} // namespace

std::shared_ptr<channel> make_schedule_channel() {
    return std::make_shared<schedule_plugin>();
}

} // namespace baton
