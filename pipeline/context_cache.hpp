// The sessions' context windows, kept in memory between turns: load_state reads a session's window
// from here instead of re-reading the tape, and save_state extends it with what the turn stored, so
// the cost of a turn does not grow with the length of its session. A session not cached (first
// turn since start, evicted, or its last save failed) is loaded from the store once.
#pragma once

#include <baton/model.hpp>
#include <baton/types.hpp>

#include <cstddef>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace baton::pipeline {

// The messages since the last anchor, as the model sees them, with their approximate footprint.
struct context_window {
    std::deque<chat_message> messages;
    std::size_t bytes = 0;

    // Appends what a tape entry contributes: an anchor starts a new window (its summary, if any,
    // as a system message); a message adds itself; other kinds add nothing. Keeps the last
    // `max_messages`.
    void add(const tape_entry& e, std::size_t max_messages);
};

class context_cache {
public:
    // `max_bytes` bounds the whole cache (least recently used sessions go first).
    explicit context_cache(std::size_t max_messages, std::size_t max_bytes = std::size_t(32) << 20);
    ~context_cache();
    context_cache(const context_cache&) = delete;
    context_cache& operator=(const context_cache&) = delete;

    // Copies the session's state and window out; false when the session is not cached.
    bool get(const std::string& sid, json::object& state, std::vector<chat_message>& window);
    // The window a tape tail (oldest first) makes, within this cache's message bound.
    context_window render(const std::vector<tape_entry>& tail) const;
    // Caches a session loaded from the store, with the window render() made of its tail.
    void put(const std::string& sid, const json::object& state, context_window window);
    // After a successful save: extends the window and replaces the state. No-op when not cached.
    void apply(const std::string& sid, const std::vector<tape_entry>& entries,
               const json::object& state);
    // After a failed save: the next turn reloads from the store.
    void erase(const std::string& sid);

    std::size_t sessions() const;

private:
    struct shard;
    shard& shard_for(const std::string& sid);
    std::size_t max_messages_;
    std::vector<std::unique_ptr<shard>> shards_;
};

} // namespace baton::pipeline
