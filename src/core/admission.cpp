#include "src/core/admission.hpp"

#include <algorithm>
#include <functional>

namespace baton::detail {

actor_registry::actor_registry(boost::asio::any_io_executor ex, std::size_t shards)
    : ex_(std::move(ex)), shards_(shards) {}

actor_registry::shard& actor_registry::shard_for(const std::string& sid, std::size_t* index) {
    std::size_t i = std::hash<std::string>{}(sid) % shards_.size();
    if (index) *index = i;
    return shards_[i];
}

std::shared_ptr<session_actor> actor_registry::get_or_create(shard& sh, std::size_t index,
                                                             const std::string& sid) {
    auto& slot = sh.actors[sid];
    if (!slot) slot = std::make_shared<session_actor>(sid, ex_, index);
    return slot;
}

namespace {
// Messages waiting in a session's queue; an idle compaction there is not one.
std::int64_t turns_waiting(const session_actor& a) {
    return std::count_if(a.queue.begin(), a.queue.end(), [](const auto& s) { return !s->compaction; });
}
} // namespace

void actor_registry::evict_if_idle(shard& sh, session_actor& a) {
    if (a.drainer || a.busy || !a.queue.empty()) return;
    auto it = sh.actors.find(a.key);
    if (it != sh.actors.end() && it->second.get() == &a) sh.actors.erase(it);
}

std::variant<reservation, api_error>
actor_registry::reserve(const std::string& sid, const admission_config& adm, const turn_record& rec) {
    std::size_t index = 0;
    auto& sh = shard_for(sid, &index);
    std::lock_guard lock(sh.mutex);
    auto it = sh.actors.find(sid);
    if (it != sh.actors.end()) {
        auto& a = *it->second;
        // An idle compaction in the queue or running delays a message but does not count as a turn.
        auto waiting = turns_waiting(a);
        bool would_wait = (a.busy && !a.running.empty()) || waiting > 0;
        if (would_wait && adm.mode == admission_mode::reject)
            return api_error{errc::session_busy, "session " + rec.session_id + " is running a turn"};
        // `interrupt` stops the running turn for this message, which waits only for that stop:
        // it has room for one even with max_queued 0.
        const auto bound = adm.mode == admission_mode::interrupt
                               ? std::max<std::int64_t>(adm.max_queued, 1)
                               : adm.max_queued;
        if (would_wait && waiting >= bound)
            return api_error{errc::session_queue_full,
                             bound == 0 ? "session " + rec.session_id +
                                              " is running a turn and admission.max_queued is 0"
                                        : "session " + rec.session_id + " already has " +
                                              std::to_string(waiting) + " messages waiting"};
    }
    auto actor = get_or_create(sh, index, sid);
    auto slot = std::make_shared<turn_slot>();
    slot->record = rec;
    bool first = !actor->busy && !actor->drainer && actor->queue.empty();
    actor->queue.push_back(slot);
    return reservation{std::move(actor), std::move(slot), first};
}

void actor_registry::mark_ready(session_actor& a, const std::shared_ptr<turn_slot>& s,
                                const turn_record* as_stored) {
    std::lock_guard lock(shards_[a.shard].mutex);
    if (as_stored) s->record = *as_stored;
    s->ready = true;
}

void actor_registry::release(session_actor& a, const std::shared_ptr<turn_slot>& s) {
    auto& sh = shards_[a.shard];
    std::lock_guard lock(sh.mutex);
    auto it = std::find(a.queue.begin(), a.queue.end(), s);
    if (it != a.queue.end()) a.queue.erase(it);
    evict_if_idle(sh, a);
}

std::shared_ptr<session_actor> actor_registry::requeue(const turn_record& rec) {
    std::size_t index = 0;
    auto key = session_of(rec).key();
    auto& sh = shard_for(key, &index);
    std::lock_guard lock(sh.mutex);
    auto actor = get_or_create(sh, index, key);
    auto slot = std::make_shared<turn_slot>();
    slot->record = rec;
    slot->ready = true;
    actor->queue.push_back(std::move(slot));
    return actor;
}

std::shared_ptr<session_actor> actor_registry::queue_compaction(const session_ref& session,
                                                                const std::string& agent) {
    auto sid = session.key();
    std::size_t index = 0;
    auto& sh = shard_for(sid, &index);
    std::lock_guard lock(sh.mutex);
    if (auto it = sh.actors.find(sid);
        it != sh.actors.end() && (it->second->busy || it->second->drainer || !it->second->queue.empty()))
        return nullptr;
    auto actor = get_or_create(sh, index, sid);
    auto slot = std::make_shared<turn_slot>();
    slot->record.tenant = session.tenant;
    slot->record.session_id = session.id;
    slot->record.agent = agent;
    slot->ready = true;
    slot->compaction = true;
    actor->queue.push_back(std::move(slot));
    return actor;
}

bool actor_registry::claim_drainer(session_actor& a, bool draining) {
    std::lock_guard lock(shards_[a.shard].mutex);
    if (a.drainer || draining || a.queue.empty() || !a.queue.front()->ready) return false;
    a.drainer = true;
    return true;
}

std::optional<turn_slot> actor_registry::next_turn(session_actor& a, bool draining) {
    auto& sh = shards_[a.shard];
    std::lock_guard lock(sh.mutex);
    if (draining || a.queue.empty() || !a.queue.front()->ready) {
        // The head is still being stored: mark_ready's kick starts a new drainer.
        a.drainer = false;
        evict_if_idle(sh, a);
        return std::nullopt;
    }
    turn_slot next = std::move(*a.queue.front());
    a.queue.pop_front();
    a.busy = true;
    a.running = next.record.turn_id;
    return next;
}

void actor_registry::turn_done(session_actor& a) {
    std::lock_guard lock(shards_[a.shard].mutex);
    a.busy = false;
    a.running.clear();
}

void actor_registry::turn_ending(const std::string& key, const std::string& turn_id) {
    auto& sh = shard_for(key, nullptr);
    std::lock_guard lock(sh.mutex);
    auto it = sh.actors.find(key);
    if (it == sh.actors.end() || it->second->running != turn_id) return;
    it->second->busy = false;
    it->second->running.clear();
}

std::vector<turn_record> actor_registry::take_ready(session_actor& a, const std::string& agent) {
    std::lock_guard lock(shards_[a.shard].mutex);
    std::vector<turn_record> out;
    while (!a.queue.empty() && a.queue.front()->ready && !a.queue.front()->compaction &&
           a.queue.front()->record.agent == agent) {
        out.push_back(std::move(a.queue.front()->record));
        a.queue.pop_front();
    }
    return out;
}

bool actor_registry::remove_queued(const std::string& sid, const std::string& turn_id) {
    auto& sh = shard_for(sid);
    std::lock_guard lock(sh.mutex);
    auto it = sh.actors.find(sid);
    if (it == sh.actors.end()) return false;
    auto& q = it->second->queue;
    auto slot = std::find_if(q.begin(), q.end(),
                             [&](const auto& s) { return s->ready && s->record.turn_id == turn_id; });
    if (slot == q.end()) return false;
    q.erase(slot);
    evict_if_idle(sh, *it->second);
    return true;
}

std::string actor_registry::running_turn(const std::string& sid) {
    auto& sh = shard_for(sid);
    std::lock_guard lock(sh.mutex);
    auto it = sh.actors.find(sid);
    return it == sh.actors.end() ? std::string() : it->second->running;
}

live_status actor_registry::status(const std::string& sid) {
    auto& sh = shard_for(sid);
    std::lock_guard lock(sh.mutex);
    auto it = sh.actors.find(sid);
    if (it == sh.actors.end()) return {};
    return {it->second->busy, turns_waiting(*it->second)};
}

std::int64_t actor_registry::total_waiting() {
    std::int64_t n = 0;
    for (auto& sh : shards_) {
        std::lock_guard lock(sh.mutex);
        for (const auto& [sid, a] : sh.actors)
            n += turns_waiting(*a);
    }
    return n;
}

std::size_t actor_registry::live_sessions() {
    std::size_t n = 0;
    for (auto& sh : shards_) {
        std::lock_guard lock(sh.mutex);
        n += sh.actors.size();
    }
    return n;
}

} // namespace baton::detail
