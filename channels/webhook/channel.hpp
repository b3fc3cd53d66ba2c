// The webhook channel: POSTs each reply routed with {"deliver": {"channel": "webhook", "to":
// "<target>"}} as JSON to the target's URL, with `Idempotency-Key: <outbox key>` so that the
// receiver can drop a retry it has already seen. 2xx: delivered; 408, 429, 5xx, timeouts and
// connection errors: retried (Retry-After honoured); any other status: failed.
#pragma once

#include <baton/config.hpp>
#include <baton/delivery.hpp>
#include <baton/http_client.hpp>

#include <map>
#include <memory>
#include <string>

namespace baton::webhook {

// The body of one POST: {"key", "session_id", "turn_id", "target", "index", "text", "uncertain",
// "attempt", "created_at"}.
std::string request_body(const outbox_item& item);

// What a response (or its absence: `ec`) means for the item.
send_outcome classify(const boost::system::error_code& ec, const http_response& r);

class channel final : public outbound_channel {
public:
    channel(std::map<std::string, webhook_target> targets, std::shared_ptr<http_client> http,
            std::size_t max_concurrency);

    std::string_view name() const override { return "webhook"; }
    std::optional<std::string> check_recipient(std::string_view to) const override;
    std::size_t max_concurrency() const override { return max_concurrency_; }
    asio::awaitable<send_outcome> send(const outbox_item& item) override;

private:
    std::map<std::string, webhook_target, std::less<>> targets_;
    std::shared_ptr<http_client> http_;
    std::size_t max_concurrency_;
};

} // namespace baton::webhook
