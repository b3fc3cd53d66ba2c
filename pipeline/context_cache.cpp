#include "pipeline/context_cache.hpp"

#include <baton/json_text.hpp>
#include <baton/store.hpp>

#include <functional>

namespace baton::pipeline {

namespace {
constexpr std::size_t shard_count = 16;
} // namespace

struct context_cache::shard {
    struct entry {
        json::object state;
        std::size_t state_bytes = 0;
        std::shared_ptr<context_window> window; // null while lent
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
        std::size_t n = sizeof(entry) + 2 * sid.size() + 96 + e.state_bytes +
                        (e.window ? sizeof(context_window) + e.window->bytes() : 0);
        bytes = bytes - e.bytes + n;
        e.bytes = n;
    }

    static void set_state(entry& e, const json::object& state) {
        e.state = state;
        e.state_bytes = state.empty() ? 0 : json_text(state).size() * 2;
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

context_cache::context_cache(std::size_t max_bytes) {
    for (std::size_t i = 0; i < shard_count; ++i) {
        shards_.push_back(std::make_unique<shard>());
        shards_.back()->max_bytes = max_bytes / shard_count;
    }
}

context_cache::~context_cache() = default;

context_cache::shard& context_cache::shard_for(const std::string& sid) {
    return *shards_[std::hash<std::string>{}(sid) % shards_.size()];
}

std::shared_ptr<context_window> context_cache::lend(const std::string& sid, json::object& state) {
    auto& sh = shard_for(sid);
    std::lock_guard lock(sh.mutex);
    auto it = sh.entries.find(sid);
    if (it == sh.entries.end() || !it->second.window) return nullptr;
    auto& e = it->second;
    sh.touch(e);
    state = e.state;
    return std::move(e.window);
}

void context_cache::give_back(const std::string& sid, std::shared_ptr<context_window> w,
                              const std::vector<tape_entry>& entries, const json::object* state) {
    for (const auto& entry : entries)
        w->add(entry);
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
    if (state && (inserted || e.state != *state)) shard::set_state(e, *state);
    e.window = std::move(w);
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

std::vector<tape_entry> read_context_entries(baton::store& s, const session_ref& sid) {
    for (std::size_t limit = 256;; limit *= 4) {
        auto tail = s.tape_tail(sid, limit);
        bool whole = tail.size() < limit;
        auto span = find_context_span(tail, whole);
        if (span.complete) {
            tail.erase(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(span.first));
            return tail;
        }
        if (span.from > 0 && !tail.empty()) {
            // The anchor kept entries older than this tail: read them forward from there.
            auto older = s.read_tape(sid, span.from - 1, std::size_t(1) << 30);
            std::size_t i = 0;
            while (i < older.size() && older[i].id < span.from)
                ++i;
            older.erase(older.begin(), older.begin() + static_cast<std::ptrdiff_t>(i));
            return older;
        }
    }
}

} // namespace baton::pipeline
