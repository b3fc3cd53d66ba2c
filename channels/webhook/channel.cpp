#include "channels/webhook/channel.hpp"

#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/string.hpp>

#include <algorithm>
#include <charconv>

namespace baton::webhook {

std::string request_body(const outbox_item& item) {
    return json::serialize(json::object{{"key", item.key},
                                        {"session_id", item.session_id},
                                        {"turn_id", item.turn_id},
                                        {"target", item.recipient},
                                        {"index", item.index},
                                        {"text", item.text},
                                        {"uncertain", item.uncertain},
                                        {"attempt", item.attempts},
                                        {"created_at", format_time(item.created_at)}});
}

namespace {
// Retry-After in seconds (the HTTP-date form is not used by webhook receivers we know of).
std::optional<std::chrono::milliseconds> retry_after(const http_response& r) {
    auto v = r.header("Retry-After");
    if (!v) return std::nullopt;
    std::int64_t s = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), s);
    if (ec != std::errc() || end != v->data() + v->size() || s < 0) return std::nullopt;
    return std::chrono::milliseconds(std::min<std::int64_t>(s, 86400) * 1000);
}

std::string excerpt(std::string_view body) {
    constexpr std::size_t max = 200;
    if (body.size() <= max) return std::string(body);
    return std::string(body.substr(0, max)) + "...";
}
} // namespace

send_outcome classify(const boost::system::error_code& ec, const http_response& r) {
    // Refused or unreachable: nothing was sent. Any other failure may come after the receiver
    // got the request, so the retry is uncertain (its Idempotency-Key makes it harmless).
    if (ec == boost::asio::error::connection_refused || ec == boost::asio::error::host_unreachable ||
        ec == boost::asio::error::network_unreachable || ec == boost::asio::error::invalid_argument ||
        ec == boost::system::errc::invalid_argument)
        return send_outcome::again(ec.message());
    if (ec == boost::beast::error::timeout) return send_outcome::unanswered("timed out");
    if (ec) return send_outcome::unanswered(ec.message());
    auto status = "HTTP " + std::to_string(r.status);
    if (r.status >= 200 && r.status < 300) return send_outcome::ok();
    if (r.status == 408 || r.status == 429 || r.status >= 500)
        return send_outcome::again(status, retry_after(r));
    return send_outcome::give_up(r.body.empty() ? status : status + ": " + excerpt(r.body));
}

channel::channel(std::map<std::string, webhook_target> targets, std::shared_ptr<http_client> http,
                 std::size_t max_concurrency)
    : targets_(targets.begin(), targets.end()), http_(std::move(http)),
      max_concurrency_(max_concurrency) {
    // A target's own User-Agent replaces ours (the config refuses the other headers baton sets):
    // decided once here, not at every send.
    for (auto& [name, t] : targets_) {
        bool agent = std::any_of(t.headers.begin(), t.headers.end(), [](const auto& h) {
            return boost::beast::iequals(h.first, "User-Agent");
        });
        if (!agent) t.headers.emplace("User-Agent", "baton");
    }
}

std::optional<std::string> channel::check_recipient(std::string_view to) const {
    if (targets_.count(to) != 0) return std::nullopt;
    if (to.empty()) return "a webhook target name is required";
    std::string known;
    for (const auto& [name, t] : targets_)
        known += (known.empty() ? "" : ", ") + name;
    return "unknown webhook target \"" + std::string(to) +
           "\" (configured: " + (known.empty() ? "none" : known) + ")";
}

asio::awaitable<send_outcome> channel::send(const outbox_item& item) {
    auto it = targets_.find(item.recipient);
    if (it == targets_.end()) co_return send_outcome::give_up("unknown webhook target");
    const auto& target = it->second;
    http_headers headers{{"Content-Type", "application/json"}, {"Idempotency-Key", item.key}};
    for (const auto& [k, v] : target.headers)
        headers.emplace_back(k, v);
    auto [ec, response] = co_await http_->request("POST", target.url, std::move(headers),
                                                  request_body(item), target.timeout);
    co_return classify(ec, response);
}

} // namespace baton::webhook
