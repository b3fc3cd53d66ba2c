// The store: where accepted messages, turn records, tapes and session state outlive the process.
// Implementations are synchronous and thread-safe; the runtime calls blocking ones off its socket
// threads (see store_runner). Every store passes the same conformance suite (tests/store_test.cpp).
// Calls naming an unknown turn (mark_running, finish_turn) or a duplicate turn id throw.
// Sessions are named by tenant and id (session_ref): two tenants' sessions never share a row, a
// tape or an idempotency key. Turn ids and outbox keys are unique across tenants; their records
// carry their tenant.
#pragma once

#include <baton/types.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton {

struct idempotency {
    std::string key;         // empty: no Idempotency-Key; a key is the tenant's (turn_record::tenant)
    std::string fingerprint; // what the request said, to tell a replay from a reuse
};

enum class insert_outcome { inserted, replayed, key_reused };

struct insert_result {
    insert_outcome outcome = insert_outcome::inserted;
    std::string turn_id; // the stored turn (the earlier one on a replay)
    // Several nodes (cluster()): stored as this node's to run, with the status and attempt asked
    // for, because its session is this node's and had no other unfinished turn. When false, a
    // cluster store keeps it queued for the session's owner to claim.
    bool own = false;
};

// The part of a turn that save_state persists: tape entries appended, session state replaced.
struct state_update {
    std::string session_id;
    std::string turn_id;
    std::vector<tape_entry> entries; // ids are assigned by the store
    std::optional<json::object> state;
    std::string tenant{default_tenant}; // whose session
};

// The end of a turn, written as one transaction (end_turn): its tape entries and state, its
// outbox items and its final record, with those of the turns it answered too (collect, steer).
struct turn_end {
    std::vector<turn_record> finished; // final records (finish_turn), the turn's own first
    std::optional<state_update> state; // save_state's part; ids are written back
    std::vector<outbox_item> outbox;   // added unless their key exists
};

// Thrown by a store that cannot reach its database (PostgreSQL down or restarting, a lost
// connection, no free connection in time). Nothing of the failed call is stored, or, when the
// connection was lost after the call was sent, it may be: the API answers 503 store_unavailable,
// and a client retries with the same Idempotency-Key.
class store_unavailable : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Thrown by end_batch() of an optimistic batch in which a call wrote and then failed: nothing of
// the batch is stored, and its calls are to run again, each all-or-nothing on its own.
class batch_replay : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Several nodes on one database (docs/design.md "Several nodes"): what a store that serves a
// cluster offers the runtime beside the store calls. Each live session has one owner node, which
// alone runs its turns, in accept order; a node that accepts a message for a session it does not
// own only stores it, and the owner claims it. A node whose lease expired is taken over: its
// sessions, queued and running turns and open outbox items go to the nodes that claim them.
struct claimed_work {
    struct turn {
        turn_record record;      // as stored: queued, or running when taken over from a dead node
        std::string accepted_by; // the node that accepted it (its client may follow it there)
        std::string taken_from;  // the dead node it was claimed from, or empty
    };
    std::vector<turn> turns;         // in accept order per session
    std::vector<outbox_item> outbox; // open items of dead nodes, now this node's to deliver
};

// An event of a turn, relayed between nodes: to the node that accepted the turn, and to any node
// that follows it (cluster::follow).
struct relayed_event {
    std::string turn_id;
    session_ref session;
    std::string type;     // as published (turn_event::type)
    std::string data;     // the event's JSON text
    std::int64_t seq = 0; // its seq on the node running the turn (receivers drop repeats)
    std::string to;       // one node (a replay for a follower), or empty: every node
};

class cluster {
public:
    virtual ~cluster() = default;
    virtual const std::string& node_id() const = 0;

    // A store call (blocking): claims what this node should run now: queued turns of sessions it
    // owns or that have no live owner (it becomes their owner), with those of dead nodes, and
    // the dead nodes' open outbox items.
    virtual claimed_work claim() = 0;

    // Called once before work starts. `work`: there may be something to claim (a message for a
    // session this node owns was stored, somewhere). `event`: an event another node relays. `watch`:
    // another node follows a turn (its events should be relayed). Called on the store's thread;
    // they must not block.
    virtual void subscribe(std::function<void()> work, std::function<void(relayed_event)> event,
                           std::function<void(const std::string& turn_id)> watch) = 0;

    // Sends an event to the other nodes (never blocks; it goes out within a few milliseconds).
    virtual void relay(relayed_event e) = 0;
    // Asks the node running the turn to relay its events here (never blocks).
    virtual void follow(const std::string& turn_id) = 0;

    // A store call (blocking): what the database says of a session's turns, wherever they run:
    // one running (`busy`), and how many wait (`queued`). For GET /v1/sessions/{sid} on a node
    // that does not run them.
    struct activity {
        bool busy = false;
        std::int64_t queued = 0;
    };
    virtual activity session_activity(const session_ref& session) = 0;

    // For /metrics.
    struct stats {
        std::int64_t live_nodes = 0;       // nodes whose lease holds, this one included
        std::int64_t claims = 0;           // claim() calls
        std::int64_t claimed_turns = 0;    // turns claimed
        std::int64_t taken_over_turns = 0; // of them, from dead nodes
        std::int64_t relayed_out = 0;      // events sent to other nodes
        std::int64_t relayed_in = 0;       // events received
        std::int64_t pool_open = 0;        // connections open ...
        std::int64_t pool_idle = 0;        // ... and idle
        std::int64_t pool_size = 0;
    };
    virtual stats status() const = 0;
};

class store {
public:
    virtual ~store() = default;

    // The cluster this store serves (several nodes on one database), or nullptr (one node).
    virtual baton::cluster* cluster() { return nullptr; }

    // Why the store cannot serve now (its database is unreachable), or nullopt: /readyz answers
    // 503 store_unavailable meanwhile. Cheap: it reports what the store last saw, never blocks.
    virtual std::optional<std::string> unavailable() const { return std::nullopt; }

    // True when calls may block (disk); the runtime then runs them on its store thread.
    virtual bool blocking() const = 0;

    // Durably stores a queued turn and creates or touches its session (t.tenant, t.session_id).
    // With a key the tenant already used:
    // `replayed` when the fingerprint matches, `key_reused` when it does not (nothing stored).
    virtual insert_result insert_turn(const turn_record& t, const idempotency& idem) = 0;

    // What insert_turn would answer for a key the tenant already used (`replayed` or `key_reused`,
    // with the earlier turn), or nullopt when the tenant has not used it. Reads only: the runtime
    // asks it for a message it refuses before storing (a spent tokens_per_day), so that a replay
    // still finds its turn. The default answers nullopt: such a replay is refused like a new
    // message.
    virtual std::optional<insert_result> find_idempotency(const std::string& tenant,
                                                          const idempotency& idem);

    // Moves a turn to running (started_at set) and counts the start (attempt + 1). A turn stored
    // by insert_turn as running already counts the attempt it carries.
    virtual void mark_running(const std::string& turn_id, time_ms started_at) = 0;

    // Records that the turn has begun side effects (its first tool call): after a crash it is not
    // run again (turn_record::side_effects).
    virtual void mark_side_effects(const std::string& turn_id) = 0;

    // Appends tape entries (assigning increasing ids, written back into `u`) and replaces state.
    virtual void save_state(state_update& u) = 0;

    // Writes the final record of a turn (status, reply, steps, usage, error, started_at,
    // finished_at, attempt).
    virtual void finish_turn(const turn_record& t) = 0;

    // save_state, add_outbox for each item and finish_turn for each record, all or nothing (one
    // transaction where the store has them). Returns the outbox items added (new keys). The default
    // makes the calls in that order; a store with transactions overrides it to wrap them.
    virtual std::vector<outbox_item> end_turn(turn_end& e);

    virtual std::optional<turn_record> get_turn(const std::string& turn_id) = 0;
    virtual std::optional<session_record> get_session(const session_ref& session) = 0;

    // Entries with id > after, ascending, at most `limit`.
    virtual std::vector<tape_entry> read_tape(const session_ref& session, std::int64_t after,
                                              std::size_t limit) = 0;
    // The last `limit` entries, ascending (context assembly; never the whole tape).
    virtual std::vector<tape_entry> tape_tail(const session_ref& session, std::size_t limit) = 0;

    // Turns left queued or running by an earlier process, in accept order.
    virtual std::vector<turn_record> unfinished_turns() = 0;

    // The outbox. add_outbox stores a new item; false (and nothing changed) when its key exists.
    virtual bool add_outbox(const outbox_item& item) = 0;
    // Writes an item's status, attempts, uncertain flag, next_attempt_at and last_error
    // (updated_at = now); false when the key is unknown.
    virtual bool update_outbox(const outbox_item& item) = 0;
    virtual std::optional<outbox_item> get_outbox(const std::string& key) = 0;
    // Items in creation order, filtered (empty filter fields match everything): `statuses` any of
    // them, `uncertain_only`, `channel`, `tenant`, `session_id`; at most `limit`.
    struct outbox_filter {
        std::vector<outbox_status> statuses;
        bool uncertain_only = false;
        std::string channel;
        std::string tenant;
        std::string session_id;
        std::size_t limit = 1000;
    };
    virtual std::vector<outbox_item> list_outbox(const outbox_filter& f) = 0;
    // Every item counted by status, and those flagged uncertain whatever their status (metrics).
    // The default lists the whole outbox; stores override it with a count.
    struct outbox_counts {
        std::array<std::int64_t, 4> by_status{}; // indexed by outbox_status
        std::int64_t uncertain = 0;
        void add(const outbox_item& o) {
            by_status[static_cast<std::size_t>(o.status)] += 1;
            uncertain += o.uncertain ? 1 : 0;
        }
    };
    virtual outbox_counts count_outbox();

    // Finished turns counted by tenant and UTC day (finished_at / 86400000), for turns finished
    // at or after `from`; `tenant` empty: every tenant. Ascending by tenant, then day.
    struct usage_row {
        std::string tenant;
        std::int64_t day = 0;
        std::int64_t turns = 0;
        std::int64_t prompt_tokens = 0;
        std::int64_t completion_tokens = 0;
    };
    virtual std::vector<usage_row> usage_by_day(const std::string& tenant, time_ms from) = 0;

    // Channel cursors: small named values a channel must keep across restarts (the Telegram
    // update offset, a schedule's last fire). nullopt when never set.
    virtual std::optional<std::string> get_cursor(const std::string& name) = 0;
    virtual void set_cursor(const std::string& name, const std::string& value) = 0;

    // Group commit (the store runner's): calls between begin_batch() and end_batch() share one
    // transaction, each still all-or-nothing on its own; end_batch() commits them together and
    // throws when that fails (then none of them is stored). No-ops for a store without commits.
    virtual void begin_batch() {}
    virtual void end_batch() {}
    // The optimistic form, which the runner tries first: begin_optimistic_batch() begins a
    // transaction whose calls run bare, without the undo point each that makes them
    // all-or-nothing on their own, and answers true; a store without it answers false, having
    // begun nothing. A call that throws having written nothing has simply failed. One that
    // wrote and then threw leaves the whole transaction to undo: end_batch() then throws
    // batch_replay and stores nothing, and the runner runs the same calls again in a
    // begin_batch() batch. abort_batch() rolls an optimistic batch back, whatever its state.
    virtual bool begin_optimistic_batch() { return false; }
    virtual void abort_batch() {}
};

std::unique_ptr<store> make_memory_store();

struct sqlite_options {
    std::string path;                   // file name; parent directories are created
    std::string synchronous = "normal"; // off | normal | full
};
std::unique_ptr<store> make_sqlite_store(const sqlite_options& opts);

// PostgreSQL (docs/design.md "PostgreSQL"): libpq, loaded at the first open, runs non-blocking on
// the store's own event loop over a pool of connections; the schema is migrated at open, once
// across nodes. The conninfo is libpq's (keywords or a postgres:// URI); `baton serve` refuses one
// that names a password in its config file (libpq takes it from PGPASSWORD or ~/.pgpass). Throws
// std::invalid_argument for bad options, std::runtime_error when the database cannot be reached or
// migrated.
struct postgres_options {
    std::string conninfo;
    std::size_t pool_size = 4;                        // connections at most
    std::chrono::milliseconds connect_timeout{5000};  // one connection attempt
    std::chrono::milliseconds query_timeout{30000};   // one round trip; then the connection is closed
    std::chrono::milliseconds acquire_timeout{10000}; // waiting for a free connection
    std::chrono::milliseconds probe_interval{1000};   // the health probe (unavailable())
    // One node per database (schema): the store holds an advisory lock of its schema while it is
    // open, and refuses to open (or to serve, once it lost the lock) beside another holder.
    // Ignored when `cluster` is set.
    bool exclusive = true;
    // Several nodes on the database (store::cluster()): each one a row in baton_nodes, renewed
    // every probe_interval; other nodes take a node over once `lease` has passed without renewal.
    bool cluster = false;
    std::chrono::milliseconds lease{10000};
    std::string node_id; // empty: a random one for each open
    // Cluster: called once (on the store's thread) when this node finds its lease expired: its
    // work belongs to other nodes now, and every later call fails. `baton serve` exits.
    std::function<void(const std::string& why)> on_lease_lost;
};
std::unique_ptr<store> make_postgres_store(const postgres_options& opts);
// Why libpq would refuse `conninfo` before connecting (an unknown keyword, a malformed URI), or
// nullopt. Loads libpq (std::runtime_error when it cannot). For `baton check-config`.
std::optional<std::string> postgres_conninfo_error(const std::string& conninfo);

} // namespace baton
