// The turn records the runtime knows best: turns queued or running in this process, and the last
// finished ones. GET /v1/turns/{tid} is answered from here without a store trip while a client
// polls; anything else comes from the store. Only records the store already holds are put here.
#pragma once

#include <baton/types.hpp>

#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace baton::detail {

class turn_cache {
public:
    explicit turn_cache(std::size_t finished_capacity = 1024) : capacity_(finished_capacity) {}

    // A queued or running turn, as just stored.
    void live(const turn_record& rec);
    // A finished turn, as just stored: kept among the last `finished_capacity`.
    void finished(const turn_record& rec);
    // After a failed store write: the store is the only truth for this turn.
    void forget(const std::string& turn_id);
    std::optional<turn_record> find(const std::string& turn_id) const;
    // Appends the turn's public JSON (`append_turn_json`) to `out` when it is here and of
    // `tenant` (empty: any), without copying the record. `other_tenant`: here, but not the
    // caller's (nothing appended).
    enum class lookup { absent, found, other_tenant };
    lookup append_json(const std::string& turn_id, std::string_view tenant, std::string& out) const;

private:
    mutable std::mutex mutex_;
    std::unordered_map<std::string, turn_record> records_;
    std::deque<std::string> finished_order_; // oldest first
    std::size_t capacity_;
};

} // namespace baton::detail
