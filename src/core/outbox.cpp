// Outbox items: status names, the listing JSON and the derived key.
#include <baton/store.hpp>
#include <baton/types.hpp>

#include <openssl/evp.h>

#include <array>

namespace baton {

namespace {
constexpr std::array<std::string_view, 4> outbox_status_names{"pending", "sending", "delivered",
                                                              "failed"};
} // namespace

std::string_view to_string(outbox_status s) {
    return outbox_status_names[static_cast<std::size_t>(s)];
}

store::outbox_counts store::count_outbox() {
    outbox_filter all;
    all.limit = static_cast<std::size_t>(-1);
    outbox_counts n;
    for (const auto& o : list_outbox(all))
        n.add(o);
    return n;
}

std::optional<insert_result> store::find_idempotency(const std::string&, const idempotency&) {
    return std::nullopt;
}

std::vector<outbox_item> store::end_turn(turn_end& e) {
    if (e.state) save_state(*e.state);
    std::vector<outbox_item> added;
    for (auto& o : e.outbox) {
        if (o.created_at == 0) o.created_at = now_ms();
        if (add_outbox(o)) added.push_back(o);
    }
    for (const auto& t : e.finished)
        finish_turn(t);
    return added;
}

std::optional<outbox_status> parse_outbox_status(std::string_view s) {
    for (std::size_t i = 0; i < outbox_status_names.size(); ++i)
        if (outbox_status_names[i] == s) return static_cast<outbox_status>(i);
    return std::nullopt;
}

json::object to_json(const outbox_item& o) {
    return {{"key", o.key},
            {"turn_id", o.turn_id},
            {"tenant", o.tenant},
            {"session_id", o.session_id},
            {"channel", o.channel},
            {"status", to_string(o.status)},
            {"attempts", o.attempts},
            {"uncertain", o.uncertain},
            {"last_error", o.last_error.empty() ? json::value(nullptr) : json::value(o.last_error)}};
}

// Each part is length-prefixed, so ("a:b", "c") and ("a", "b:c") cannot collide.
std::string outbox_key(std::string_view session_id, std::string_view turn_id, std::string_view channel,
                       std::string_view recipient, std::int64_t index) {
    std::string text;
    for (std::string_view p : {session_id, turn_id, channel, recipient}) {
        text += std::to_string(p.size());
        text += ':';
        text += p;
    }
    text += std::to_string(index);
    return "ob_" + sha256_hex(text).substr(0, 32);
}

std::string sha256_hex(std::string_view data) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * n);
    for (unsigned i = 0; i < n; ++i) {
        out.push_back(hex[md[i] >> 4]);
        out.push_back(hex[md[i] & 15]);
    }
    return out;
}

} // namespace baton
