#include "channels/telegram/inbox.hpp"

#include <baton/command.hpp>

#include <algorithm>

namespace baton::telegram {

std::string ready_message::text() const {
    std::string out;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) out += '\n';
        out += parts[i].text;
    }
    return out;
}

bool is_command(std::string_view text) {
    return parse_command(text).has_value();
}

inbox::clock::time_point inbox::deadline(const buffer& b) const {
    return std::min(b.last + debounce_, b.first + 5 * debounce_);
}

std::vector<ready_message> inbox::add(update u, clock::time_point now) {
    std::vector<ready_message> out;
    if (debounce_.count() <= 0) {
        out.push_back({u.chat_id, {std::move(u)}});
        return out;
    }
    auto it = chats_.find(u.chat_id);
    if (is_command(u.text)) {
        if (it != chats_.end()) {
            out.push_back(std::move(it->second.msg));
            chats_.erase(it);
        }
        out.push_back({u.chat_id, {std::move(u)}});
        return out;
    }
    if (it == chats_.end()) {
        std::string chat = u.chat_id;
        chats_.emplace(chat, buffer{{chat, {std::move(u)}}, now, now});
    } else {
        it->second.msg.parts.push_back(std::move(u));
        it->second.last = now;
    }
    return out;
}

std::vector<ready_message> inbox::due(clock::time_point now) {
    std::vector<ready_message> out;
    for (auto it = chats_.begin(); it != chats_.end();) {
        if (deadline(it->second) <= now) {
            out.push_back(std::move(it->second.msg));
            it = chats_.erase(it);
        } else {
            ++it;
        }
    }
    std::sort(out.begin(), out.end(), [](const ready_message& a, const ready_message& b) {
        return a.parts.front().update_id < b.parts.front().update_id;
    });
    return out;
}

std::optional<inbox::clock::time_point> inbox::next_deadline() const {
    std::optional<clock::time_point> out;
    for (const auto& [chat, b] : chats_)
        if (!out || deadline(b) < *out) out = deadline(b);
    return out;
}

std::vector<update> inbox::buffered() const {
    std::vector<update> out;
    for (const auto& [chat, b] : chats_)
        out.insert(out.end(), b.msg.parts.begin(), b.msg.parts.end());
    std::sort(out.begin(), out.end(),
              [](const update& a, const update& b) { return a.update_id < b.update_id; });
    return out;
}

std::vector<ready_message> inbox::group(std::vector<update> updates) {
    std::sort(updates.begin(), updates.end(),
              [](const update& a, const update& b) { return a.update_id < b.update_id; });
    std::vector<ready_message> out;
    std::map<std::string, std::size_t> index;
    for (auto& u : updates) {
        auto [it, fresh] = index.emplace(u.chat_id, out.size());
        if (fresh)
            out.push_back({u.chat_id, {std::move(u)}});
        else
            out[it->second].parts.push_back(std::move(u));
    }
    return out;
}

} // namespace baton::telegram
