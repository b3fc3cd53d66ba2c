// Session actors and their registry: who may run next in each session. The bookkeeping (queue,
// busy flag, drainer claim, eviction) is plain code under a sharded mutex; runtime.cpp drives it.
#pragma once

#include <baton/config.hpp>
#include <baton/errors.hpp>
#include <baton/types.hpp>

#include <baton/strand.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace baton::detail {

struct turn_slot {
    turn_record record;
    bool ready = false; // stored; may run
    // Not a turn: the session's idle compaction (record names the session and agent only). It
    // waits its turn like a message, so it never runs beside a turn of its session.
    bool compaction = false;
};

struct session_actor {
    session_actor(std::string k, boost::asio::any_io_executor ex, std::size_t shard_index)
        : key(std::move(k)), tenant(key.substr(0, key.find('/'))), strand(detail::make_thin_strand(ex)),
          shard(shard_index) {}

    const std::string key; // session_ref::key(): tenant and id
    const std::string tenant;
    boost::asio::any_io_executor strand; // a strand (detail::make_thin_strand)
    const std::size_t shard;
    // Guarded by the shard's mutex.
    std::deque<std::shared_ptr<turn_slot>> queue;
    bool drainer = false; // a drain coroutine owns the session
    bool busy = false;    // a turn is running
    std::string running;  // its turn id
};

struct reservation {
    std::shared_ptr<session_actor> actor;
    std::shared_ptr<turn_slot> slot;
    bool first = false; // the session was idle with nothing queued: it runs as soon as it is stored
};

struct live_status {
    bool busy = false;
    std::int64_t queued = 0;
};

// Sessions are named by session_ref::key() (`key` below): two tenants' sessions are two actors.
class actor_registry {
public:
    explicit actor_registry(boost::asio::any_io_executor ex, std::size_t shards = 64);

    // Takes a place at the back of the session's queue, or says why not (reject mode, full queue).
    std::variant<reservation, api_error> reserve(const std::string& key, const admission_config& adm,
                                                 const turn_record& rec);
    // `as_stored`: the record as it was stored, when that differs from the one reserved.
    void mark_ready(session_actor& a, const std::shared_ptr<turn_slot>& s,
                    const turn_record* as_stored = nullptr);
    // Gives a place back (the store refused or replayed); evicts an actor left idle.
    void release(session_actor& a, const std::shared_ptr<turn_slot>& s);
    // Puts a stored turn back in its session's queue (recovery); no bound applies.
    std::shared_ptr<session_actor> requeue(const turn_record& rec);
    // Queues the session's idle compaction; null when the session is not idle (busy or queued).
    std::shared_ptr<session_actor> queue_compaction(const session_ref& session,
                                                    const std::string& agent);

    // True when the caller must start the session's drainer: none runs and the head is ready.
    bool claim_drainer(session_actor& a, bool draining);
    // The drainer's next turn; nullopt ends the drainer (and evicts the actor when it is idle).
    std::optional<turn_slot> next_turn(session_actor& a, bool draining);
    void turn_done(session_actor& a);
    // The end of the session's running turn `turn_id` is stored: the session reads as idle from
    // now on (reject mode takes the next message), before anyone can read the turn as finished.
    void turn_ending(const std::string& key, const std::string& turn_id);
    // Admission modes `collect` and `steer`: takes the stored messages at the front of the queue
    // (in order, stopping at one not yet stored or for another agent) to fold into the turn that
    // runs or is about to run.
    std::vector<turn_record> take_ready(session_actor& a, const std::string& agent);

    // Takes a queued (not yet running) turn out of its session's queue; false when it is not there.
    bool remove_queued(const std::string& key, const std::string& turn_id);
    // The turn the session is running, or "".
    std::string running_turn(const std::string& key);

    live_status status(const std::string& key);
    std::size_t live_sessions();
    // Messages waiting in every session's queue (metrics).
    std::int64_t total_waiting();

private:
    struct shard {
        std::mutex mutex;
        std::unordered_map<std::string, std::shared_ptr<session_actor>> actors;
    };
    shard& shard_for(const std::string& sid, std::size_t* index = nullptr);
    std::shared_ptr<session_actor> get_or_create(shard& sh, std::size_t index, const std::string& sid);
    static void evict_if_idle(shard& sh, session_actor& a);

    boost::asio::any_io_executor ex_;
    std::vector<shard> shards_;
};

} // namespace baton::detail
