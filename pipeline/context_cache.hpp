// The sessions' context windows, kept in memory between turns: a turn borrows its session's window
// (load_state), extends and compacts it, and gives it back with what it stored (save_state), so
// the cost of a turn does not grow with the length of its session and the window's messages are
// never copied. A session not cached (first turn since start, evicted, or its last save failed)
// is rebuilt from the store once.
#pragma once

#include "pipeline/context_window.hpp"

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace baton {
class store;
}

namespace baton::pipeline {

class context_cache {
public:
    // `max_bytes` bounds the whole cache (least recently used sessions go first).
    explicit context_cache(std::size_t max_bytes = std::size_t(32) << 20);
    ~context_cache();
    context_cache(const context_cache&) = delete;
    context_cache& operator=(const context_cache&) = delete;

    // Sessions are named by session_ref::key().
    // Lends the session's window and copies its state out; null when the session is not cached
    // (or its window is lent already: then the borrower rebuilds it from the store).
    std::shared_ptr<context_window> lend(const std::string& sid, json::object& state);
    // Takes a window back: the stored `entries` are applied to it and the state replaced (when
    // given). A session evicted meanwhile is cached again.
    void give_back(const std::string& sid, std::shared_ptr<context_window> w,
                   const std::vector<tape_entry>& entries, const json::object* state);
    // After a failed save: the next turn reloads from the store.
    void erase(const std::string& sid);

    std::size_t sessions() const;

private:
    struct shard;
    shard& shard_for(const std::string& sid);
    std::vector<std::unique_ptr<shard>> shards_;
};

// The entries a session's window is made of, oldest first, read from the store (see
// find_context_span): never the whole tape unless the session never had an anchor.
std::vector<tape_entry> read_context_entries(store& s, const session_ref& session);

} // namespace baton::pipeline
