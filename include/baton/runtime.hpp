// The runtime: what channels call. It admits messages (stored before they are acknowledged), runs
// one turn at a time per session through the framework, and answers questions about turns and
// sessions. Each live session is an actor: a strand plus a bounded queue, drained by one coroutine
// that takes the next message only after the previous turn has finished. Sessions run in parallel.
#pragma once

#include <baton/clock.hpp>
#include <baton/errors.hpp>
#include <baton/events.hpp>
#include <baton/framework.hpp>
#include <baton/store.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/system/result.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace baton {

struct accepted {
    std::string turn_id;
    std::string session_id;
    bool replayed = false;
};

struct accept_request {
    std::string tenant{default_tenant}; // whose session (docs/api.md "Tenants")
    std::string session_id;
    std::string agent = "default";
    std::string channel = "http";
    std::string text;
    json::object metadata;
    json::value deliver;
    idempotency idem;
    // Called once the message is stored, before its turn can start (or publish any event): a
    // channel that streams the session's events tells its client about the turn here, so that
    // nothing of the turn reaches the client before the turn's id does. Must not block.
    std::function<void(const accepted&)> on_stored;
};

// accept()'s outcome: the accepted message, or the refusal (its errc and the sentence that
// explains it). `if (r) r->turn_id; else r.error().code`; r.value() throws the refusal as a
// boost::system::system_error.
using accept_result = boost::system::result<accepted, api_error>;

struct runtime_options {
    event_hub_options events;
    // What idle compaction waits on; channels built on this runtime take it too (clock()).
    std::shared_ptr<baton::clock> clock = system_clock();
    // Per-tenant limits (config `tenants.<name>.limits`); a tenant not named has none.
    std::map<std::string, tenant_limits> tenants;
};

// GET /v1/usage: a tenant's finished turns and model tokens by UTC day.
struct usage_day {
    std::string date; // YYYY-MM-DD (UTC)
    std::int64_t turns = 0;
    std::int64_t prompt_tokens = 0;
    std::int64_t completion_tokens = 0;
};
struct tenant_usage {
    std::string tenant;
    usage_day today;
    std::vector<usage_day>
        days; // the last 30 days, today included, oldest first; days without turns too
    tenant_limits limits;
};

// A tenant's live figures (/metrics' baton_tenant_* series).
struct tenant_stats {
    std::string tenant;
    std::int64_t running = 0; // turns running under max_running_turns
    std::int64_t waiting = 0; // sessions waiting for a slot
    std::int64_t turns_today = 0;
    std::int64_t tokens_today = 0;
    std::int64_t rate_limited = 0; // messages refused, since start
    std::int64_t quota_exceeded = 0;
};

struct session_view {
    session_record record;
    bool busy = false;
    std::int64_t queued = 0;
};

class runtime {
public:
    // `ex` runs the session actors (an io_context's executor; its threads run sessions in parallel).
    runtime(asio::any_io_executor ex, framework& fw, event_hub_options events = {});
    runtime(asio::any_io_executor ex, framework& fw, runtime_options o);
    ~runtime();
    runtime(const runtime&) = delete;
    runtime& operator=(const runtime&) = delete;

    // Admits a message: completes once it is durably stored (or refused). Cancellation: none.
    asio::awaitable<accept_result> accept(accept_request req);

    // Tenants: a call that names a turn, a session or an outbox item answers one of another
    // tenant as it answers an unknown one (nullopt, false, not_found): a caller cannot learn that
    // it exists. Where `tenant` is a parameter, empty matches every tenant (code that serves them
    // all); a channel passes its caller's.

    // The turn's record. Turns queued, running or recently finished in this process are answered
    // from memory (without `input`, which stays in the store); others from the store.
    asio::awaitable<std::optional<turn_record>> get_turn(std::string turn_id, std::string tenant = {});
    // The same record's public JSON (docs/api.md "Turn record"), as GET /v1/turns/{tid} answers it.
    asio::awaitable<std::optional<std::string>> turn_json(std::string turn_id, std::string tenant = {});
    // Waits until the turn ends, then answers its final record; nullopt: no such turn (of
    // `tenant`). With `up_to` (a held request: GET /v1/turns/{tid}?wait=S), the wait also ends
    // when `up_to` has passed on clock() or when a drain begins, and answers the record as it
    // stands. Without, it waits until the end or release_waiters(). Cancellation: terminal,
    // partial and total (throws operation_aborted; the turn goes on).
    asio::awaitable<std::optional<turn_record>> wait_turn(std::string turn_id, std::string tenant,
                                                          std::optional<clock::duration> up_to);
    // Ends every wait_turn at once with the record as it stands (a library's stop, after its drain).
    void release_waiters();
    // Waits in progress (held requests and library waits).
    std::size_t waiting_turns() const;
    asio::awaitable<std::optional<session_view>> get_session(session_ref session);
    asio::awaitable<std::vector<tape_entry>> read_tape(session_ref session, std::int64_t after,
                                                       std::size_t limit);

    // The outbox (docs/api.md "Delivery"). Items in creation order, filtered (filter.tenant: of
    // that tenant only).
    asio::awaitable<std::vector<outbox_item>> list_outbox(store::outbox_filter filter);
    // Stores items before anything is sent; an item whose key is already stored is left as it is.
    // Publishes outbox.enqueued on the turn's events. Returns the items stored by this call.
    asio::awaitable<std::vector<outbox_item>> enqueue_outbox(std::vector<outbox_item> items);
    // The same from a dispatch_outbound hook, for the turn `ctx` runs: when the runtime runs the
    // turn the items are stored with its end, in one transaction, and `on_stored` gets those
    // whose key was new once that is committed (never, when the end is not stored: the turn then
    // ends as after a crash). Otherwise they are stored at once, as above. Send from on_stored.
    asio::awaitable<void> enqueue_outbox(turn_context& ctx, std::vector<outbox_item> items,
                                         std::function<void(std::vector<outbox_item>)> on_stored);
    // A recipient confirmed an item (WebSocket ack): delivered. False when the key is unknown, or
    // when `channel` is given and the item is another channel's, or `tenant` and another tenant's.
    asio::awaitable<bool> outbox_delivered(std::string key, std::string channel = {},
                                           std::string tenant = {});

    // The tenant's usage: finished turns and tokens, today and the last 30 days (from the store).
    asio::awaitable<tenant_usage> usage(std::string tenant);
    // Every tenant with limits or turns since start.
    std::vector<tenant_stats> tenants() const;

    // Cancels a queued or running turn: it ends `stopped` (a running one keeps its partial reply).
    // Errors: not_found (also another tenant's turn), turn_not_running (already finished).
    asio::awaitable<std::optional<api_error>> cancel(std::string turn_id, std::string tenant = {});

    // Picks up what an earlier process left: queued turns run again in accept order; turns that
    // were mid-run run again (attempt + 1), unless they had begun a side effect (a tool call):
    // those end `failed` with error.code "abandoned" (or run again with `on_abandoned: rerun`).
    // Returns how many turns it touched.
    asio::awaitable<std::size_t> recover();

    // Stops admitting messages and starting queued turns (they stay stored for the next start);
    // completes when the running turns have finished or `grace` has passed. Held waits
    // (wait_turn with `up_to`) are answered at once with the record as it stands. Turns still
    // running after `grace` are stopped, and nothing more of them is stored: they stay `running`,
    // as after a crash, for the next start (recover()), and waited for to unwind however long that
    // takes (a hook that ignores cancellation delays the stop; a warning every 5 s names the turns):
    // no turn outlives the drain.
    asio::awaitable<void> drain(std::chrono::milliseconds grace);
    bool draining() const { return draining_.load(); }
    // Why the store cannot serve now, or nullopt (store::unavailable; /readyz).
    std::optional<std::string> store_unavailable() const;
    std::size_t running_turns() const { return running_.load(); }
    // Session actors in memory (busy or with queued messages); idle ones are evicted.
    std::size_t live_sessions() const;
    // Messages waiting in session queues (stored or being stored), all sessions together.
    std::int64_t queued_turns() const;
    // Store calls made and the transactions they were grouped into (GET /metrics).
    std::uint64_t store_calls() const;
    std::uint64_t store_batches() const;
    // The outbox counted by status (GET /metrics), on the store's thread.
    asio::awaitable<store::outbox_counts> count_outbox();

    // The channels a message may ask to be delivered through (`deliver.channel`). "http" is always
    // one (its reply is the turn record). `check(to)` says why a recipient is unknown (nullopt:
    // fine). accept() refuses other channels and unknown recipients with invalid_request.
    // Register before messages arrive.
    using route_check = std::function<std::optional<std::string>(std::string_view to)>;
    void add_route(std::string channel, route_check check);

    // Channel cursors: small named values a channel keeps across restarts (a poll offset, a
    // schedule's last fire). Read in the order named (nullopt: never written); written together,
    // in one transaction. Errors: internal_error when the store fails. Cancellation: none.
    asio::awaitable<boost::system::result<std::vector<std::optional<std::string>>>>
    read_cursors(std::vector<std::string> names);
    asio::awaitable<boost::system::error_code>
    write_cursors(std::vector<std::pair<std::string, std::string>> values);

    // Called (on the session's strand) after a turn's final record is stored.
    void on_turn_finished(std::function<void(const turn_record&)> f);

    // Several nodes on one database (store::cluster(); docs/design.md "Several nodes").
    // Asks the node running the turn to relay its events here: a reader on this node follows a
    // turn another node runs (the HTTP channel's SSE does). A no-op on one node.
    void follow(const std::string& turn_id);
    // Called (on a runtime thread) with open outbox items this node took over from a node whose
    // lease expired. Register before recover().
    void on_outbox_taken_over(std::function<void(std::vector<outbox_item>)> f);
    // The cluster's figures (GET /metrics), or nullopt on one node.
    std::optional<cluster::stats> cluster_stats() const;

    framework& fw() { return fw_; }
    // The clock of its timers (runtime_options::clock); never null.
    const std::shared_ptr<baton::clock>& clock() const;
    // The turns' live events (SSE, WebSocket, terminal chat read them here).
    event_hub& events();

private:
    asio::awaitable<std::optional<accept_result>> find_replay(const accept_request& req);
    asio::awaitable<accept_result> accept_for_cluster(turn_record rec, idempotency idem,
                                                      std::function<void(const accepted&)> on_stored);
    struct impl;
    framework& fw_;
    std::atomic<bool> draining_{false};
    std::atomic<std::size_t> running_{0};
    std::unique_ptr<impl> impl_;
};

} // namespace baton
