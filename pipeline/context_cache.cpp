#include "pipeline/context_cache.hpp"

#include <functional>

namespace baton::pipeline {

namespace {
constexpr std::size_t shard_count = 16;

std::string_view string_at(const json::object& o, std::string_view key) {
    auto* v = o.if_contains(key);
    return v && v->is_string() ? std::string_view(v->get_string()) : std::string_view{};
}

std::size_t message_bytes(const chat_message& m) {
    return sizeof(chat_message) + m.content.capacity() + m.role.capacity();
}
} // namespace

void context_window::add(const tape_entry& e, std::size_t max_messages) {
    if (e.kind == tape_kind::anchor) {
        messages.clear();
        bytes = 0;
        auto summary = string_at(e.payload, "summary");
        if (summary.empty()) return;
        messages.push_back({"system", std::string(summary)});
        bytes += message_bytes(messages.back());
        return;
    }
    if (e.kind != tape_kind::message) return;
    auto role = string_at(e.payload, "role");
    auto* text = e.payload.if_contains("text");
    if (role.empty() || !text || !text->is_string()) return;
    messages.push_back({std::string(role), std::string(text->get_string())});
    bytes += message_bytes(messages.back());
    while (messages.size() > max_messages) {
        bytes -= message_bytes(messages.front());
        messages.pop_front();
    }
}

struct context_cache::shard {
    struct entry {
        json::object state;
        std::size_t state_bytes = 0;
        context_window window;
        std::size_t bytes = 0;
        std::list<std::string>::iterator lru; // position in `order`
    };
    std::mutex mutex;
    std::unordered_map<std::string, entry> entries;
    std::list<std::string> order; // most recently used first
    std::size_t bytes = 0;
    std::size_t max_bytes = 0;

    void touch(entry& e) { order.splice(order.begin(), order, e.lru); }

    void recount(const std::string& sid, entry& e) {
        std::size_t n = sizeof(entry) + 2 * sid.size() + 96 + e.state_bytes + e.window.bytes;
        bytes = bytes - e.bytes + n;
        e.bytes = n;
    }

    static void set_state(entry& e, const json::object& state) {
        e.state = state;
        e.state_bytes = state.empty() ? 0 : json::serialize(state).size() * 2;
    }

    // Keeps the shard within its budget; the entry just used stays.
    void evict() {
        while (bytes > max_bytes && order.size() > 1) {
            auto it = entries.find(order.back());
            bytes -= it->second.bytes;
            entries.erase(it);
            order.pop_back();
        }
    }
};

context_cache::context_cache(std::size_t max_messages, std::size_t max_bytes)
    : max_messages_(max_messages) {
    for (std::size_t i = 0; i < shard_count; ++i) {
        shards_.push_back(std::make_unique<shard>());
        shards_.back()->max_bytes = max_bytes / shard_count;
    }
}

context_cache::~context_cache() = default;

context_cache::shard& context_cache::shard_for(const std::string& sid) {
    return *shards_[std::hash<std::string>{}(sid) % shards_.size()];
}

bool context_cache::get(const std::string& sid, json::object& state, std::vector<chat_message>& window) {
    auto& sh = shard_for(sid);
    std::lock_guard lock(sh.mutex);
    auto it = sh.entries.find(sid);
    if (it == sh.entries.end()) return false;
    sh.touch(it->second);
    state = it->second.state;
    window.assign(it->second.window.messages.begin(), it->second.window.messages.end());
    return true;
}

context_window context_cache::render(const std::vector<tape_entry>& tail) const {
    context_window window;
    for (const auto& e : tail)
        window.add(e, max_messages_);
    return window;
}

void context_cache::put(const std::string& sid, const json::object& state, context_window window) {
    auto& sh = shard_for(sid);
    std::lock_guard lock(sh.mutex);
    auto [it, inserted] = sh.entries.try_emplace(sid);
    auto& e = it->second;
    if (inserted) {
        sh.order.push_front(sid);
        e.lru = sh.order.begin();
    } else {
        sh.touch(e);
    }
    shard::set_state(e, state);
    e.window = std::move(window);
    sh.recount(sid, e);
    sh.evict();
}

void context_cache::apply(const std::string& sid, const std::vector<tape_entry>& entries,
                          const json::object& state) {
    auto& sh = shard_for(sid);
    std::lock_guard lock(sh.mutex);
    auto it = sh.entries.find(sid);
    if (it == sh.entries.end()) return;
    auto& e = it->second;
    sh.touch(e);
    for (const auto& entry : entries)
        e.window.add(entry, max_messages_);
    if (e.state != state) shard::set_state(e, state);
    sh.recount(sid, e);
    sh.evict();
}

void context_cache::erase(const std::string& sid) {
    auto& sh = shard_for(sid);
    std::lock_guard lock(sh.mutex);
    auto it = sh.entries.find(sid);
    if (it == sh.entries.end()) return;
    sh.bytes -= it->second.bytes;
    sh.order.erase(it->second.lru);
    sh.entries.erase(it);
}

std::size_t context_cache::sessions() const {
    std::size_t n = 0;
    for (const auto& sh : shards_) {
        std::lock_guard lock(sh->mutex);
        n += sh->entries.size();
    }
    return n;
}

} // namespace baton::pipeline
