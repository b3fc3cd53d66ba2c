#include "channels/telegram/bot_api.hpp"

#include <baton/command.hpp>

#include <boost/beast/core/string.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>

namespace baton::telegram {

namespace {

std::optional<std::int64_t> int_member(const json::object& o, std::string_view key) {
    const auto* v = o.if_contains(key);
    if (!v) return std::nullopt;
    if (v->is_int64()) return v->get_int64();
    if (v->is_uint64() && v->get_uint64() <= static_cast<std::uint64_t>(INT64_MAX))
        return static_cast<std::int64_t>(v->get_uint64());
    return std::nullopt;
}

std::string string_member(const json::object& o, std::string_view key) {
    const auto* v = o.if_contains(key);
    return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

// The error object of a Bot API answer: {"ok": false, "error_code", "description", "parameters"}.
struct api_error_info {
    std::string description;
    std::optional<std::int64_t> retry_after;
};

api_error_info error_info_of(unsigned status, std::string_view body) {
    api_error_info out;
    boost::system::error_code ec;
    auto v = json::parse(body, ec);
    if (!ec && v.is_object()) {
        const auto& o = v.get_object();
        out.description = string_member(o, "description");
        if (const auto* p = o.if_contains("parameters"); p && p->is_object())
            out.retry_after = int_member(p->get_object(), "retry_after");
        // A day is as good as "too long" (as for the other channels' Retry-After): a larger value
        // would overflow once turned into milliseconds.
        if (out.retry_after) out.retry_after = std::min<std::int64_t>(*out.retry_after, 86400);
    }
    if (out.description.empty()) out.description = "HTTP " + std::to_string(status);
    return out;
}

} // namespace

json::object to_json(const update& u) {
    json::object o{{"update_id", u.update_id},
                   {"chat_id", u.chat_id},
                   {"message_id", u.message_id},
                   {"text", u.text}};
    if (u.from_id) o["from_id"] = *u.from_id;
    if (!u.from_username.empty()) o["from_username"] = u.from_username;
    return o;
}

std::optional<update> update_from_json(const json::value& v) {
    const auto* o = v.if_object();
    if (!o) return std::nullopt;
    update u;
    auto id = int_member(*o, "update_id");
    u.chat_id = string_member(*o, "chat_id");
    if (!id || !is_chat_id(u.chat_id)) return std::nullopt;
    u.update_id = *id;
    u.message_id = int_member(*o, "message_id").value_or(0);
    u.text = string_member(*o, "text");
    u.from_id = int_member(*o, "from_id");
    u.from_username = string_member(*o, "from_username");
    return u;
}

std::string method_url(std::string_view api_base, std::string_view token, std::string_view method) {
    std::string url(api_base);
    while (!url.empty() && url.back() == '/')
        url.pop_back();
    url += "/bot";
    url += token;
    url += '/';
    url += method;
    return url;
}

std::string bot_id(std::string_view token) {
    auto colon = token.find(':');
    if (colon == std::string_view::npos || colon == 0) return {};
    for (char c : token.substr(0, colon))
        if (c < '0' || c > '9') return {};
    return std::string(token.substr(0, colon));
}

std::string get_updates_body(std::int64_t offset, std::int64_t timeout_s) {
    return json::serialize(json::object{
        {"offset", offset}, {"timeout", timeout_s}, {"allowed_updates", json::array{"message"}}});
}

poll_result parse_get_updates(unsigned status, std::string_view body) {
    poll_result r;
    if (status != 200) {
        auto info = error_info_of(status, body);
        r.what =
            status == 401 || status == 404 ? poll_result::kind::unauthorized : poll_result::kind::retry;
        r.error = "getUpdates: HTTP " + std::to_string(status) + ": " + info.description;
        if (info.retry_after && *info.retry_after > 0)
            r.retry_after = std::chrono::seconds(*info.retry_after);
        return r;
    }
    boost::system::error_code ec;
    auto v = json::parse(body, ec);
    const auto* root = ec ? nullptr : v.if_object();
    const auto* ok = root ? root->if_contains("ok") : nullptr;
    if (!ok || !ok->is_bool() || !ok->get_bool()) {
        r.what = poll_result::kind::retry;
        r.error = "getUpdates: not ok: " + error_info_of(status, body).description;
        return r;
    }
    const auto* result = root->if_contains("result");
    if (!result || !result->is_array()) {
        r.what = poll_result::kind::retry;
        r.error = "getUpdates: no result array";
        return r;
    }
    for (const auto& item : result->get_array()) {
        const auto* u = item.if_object();
        if (!u) continue;
        auto id = int_member(*u, "update_id");
        // The Bot API numbers updates from 1 up; anything else (or one whose successor would not
        // fit the next offset) is not an update of a real server: skipped, never a confirmed offset.
        if (!id || *id < 0 || *id == std::numeric_limits<std::int64_t>::max()) continue;
        r.next_offset = std::max(r.next_offset, *id + 1);
        const auto* m = u->if_contains("message");
        const auto* msg = m ? m->if_object() : nullptr;
        if (!msg) continue;
        const auto* text = msg->if_contains("text");
        const auto* chat = msg->if_contains("chat");
        if (!text || !text->is_string() || !chat || !chat->is_object()) continue;
        auto chat_id = int_member(chat->get_object(), "id");
        if (!chat_id) continue;
        update out;
        out.update_id = *id;
        out.chat_id = std::to_string(*chat_id);
        out.message_id = int_member(*msg, "message_id").value_or(0);
        out.text = std::string(text->get_string());
        if (const auto* f = msg->if_contains("from"); f && f->is_object()) {
            out.from_id = int_member(f->get_object(), "id");
            out.from_username = string_member(f->get_object(), "username");
        }
        r.updates.push_back(std::move(out));
    }
    return r;
}

std::string parse_get_me(unsigned status, std::string_view body) {
    if (status != 200) return {};
    boost::system::error_code ec;
    auto v = json::parse(body, ec);
    if (ec || !v.is_object()) return {};
    const auto* r = v.get_object().if_contains("result");
    return r && r->is_object() ? string_member(r->get_object(), "username") : std::string();
}

std::optional<std::string> addressed_text(std::string_view text, std::string_view me) {
    auto cmd = parse_command(text);
    if (!cmd) return std::string(text);
    auto at = cmd->word.find('@');
    if (at == std::string_view::npos || at < 2) return std::string(text);
    auto to = cmd->word.substr(at + 1);
    if (!me.empty() && !boost::beast::iequals(to, me)) return std::nullopt;
    auto begin = static_cast<std::size_t>(cmd->word.data() - text.data());
    std::string out(text.substr(0, begin + at));
    out += text.substr(begin + cmd->word.size());
    return out;
}

std::string send_message_body(std::string_view chat_id, std::string_view text) {
    json::object o;
    std::int64_t n = 0;
    auto [end, ec] = std::from_chars(chat_id.data(), chat_id.data() + chat_id.size(), n);
    if (ec == std::errc() && end == chat_id.data() + chat_id.size() && is_chat_id(chat_id))
        o["chat_id"] = n;
    else
        o["chat_id"] = chat_id;
    o["text"] = text;
    return json::serialize(o);
}

send_outcome parse_send_message(unsigned status, std::string_view body) {
    if (status == 200) {
        boost::system::error_code ec;
        auto v = json::parse(body, ec);
        const auto* root = ec ? nullptr : v.if_object();
        const auto* ok = root ? root->if_contains("ok") : nullptr;
        if (ok && ok->is_bool() && ok->get_bool()) return send_outcome::ok();
        return send_outcome::again("sendMessage: not ok: " + error_info_of(status, body).description);
    }
    auto info = error_info_of(status, body);
    std::string why = "sendMessage: HTTP " + std::to_string(status) + ": " + info.description;
    if (status == 429) {
        std::optional<std::chrono::milliseconds> after;
        if (info.retry_after && *info.retry_after > 0) after = std::chrono::seconds(*info.retry_after);
        return send_outcome::again(std::move(why), after);
    }
    if (status == 408 || status >= 500) return send_outcome::again(std::move(why));
    // 400 (chat not found, bad request), 401/404 (bad token), 403 (blocked, kicked): sending the
    // same message again cannot succeed.
    return send_outcome::give_up(std::move(why));
}

bool is_chat_id(std::string_view s) {
    if (!s.empty() && s.front() == '-') s.remove_prefix(1);
    if (s.empty() || s.size() > 19) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    std::int64_t n = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    return ec == std::errc() && end == s.data() + s.size();
}

} // namespace baton::telegram
