#include "src/core/turn_cache.hpp"

namespace baton::detail {

namespace {
// What a poll needs; the input (text, metadata) stays in the store.
turn_record without_input(const turn_record& rec) {
    turn_record r;
    r.turn_id = rec.turn_id;
    r.session_id = rec.session_id;
    r.agent = rec.agent;
    r.tenant = rec.tenant;
    r.status = rec.status;
    r.reply = rec.reply;
    r.refusal = rec.refusal;
    r.steps = rec.steps;
    r.usage = rec.usage;
    r.error = rec.error;
    r.created_at = rec.created_at;
    r.started_at = rec.started_at;
    r.finished_at = rec.finished_at;
    r.attempt = rec.attempt;
    return r;
}
} // namespace

void turn_cache::live(const turn_record& rec) {
    std::lock_guard lock(mutex_);
    records_.insert_or_assign(rec.turn_id, without_input(rec));
}

void turn_cache::finished(const turn_record& rec) {
    std::lock_guard lock(mutex_);
    records_.insert_or_assign(rec.turn_id, without_input(rec));
    finished_order_.push_back(rec.turn_id);
    while (finished_order_.size() > capacity_) {
        auto it = records_.find(finished_order_.front());
        if (it != records_.end() && is_terminal(it->second.status)) records_.erase(it);
        finished_order_.pop_front();
    }
}

void turn_cache::forget(const std::string& turn_id) {
    std::lock_guard lock(mutex_);
    records_.erase(turn_id);
}

std::optional<turn_record> turn_cache::find(const std::string& turn_id) const {
    std::lock_guard lock(mutex_);
    auto it = records_.find(turn_id);
    if (it == records_.end()) return std::nullopt;
    return it->second;
}

turn_cache::lookup turn_cache::append_json(const std::string& turn_id, std::string_view tenant,
                                           std::string& out) const {
    std::lock_guard lock(mutex_);
    auto it = records_.find(turn_id);
    if (it == records_.end()) return lookup::absent;
    if (!tenant.empty() && it->second.tenant != tenant) return lookup::other_tenant;
    append_turn_json(out, it->second);
    return lookup::found;
}

} // namespace baton::detail
