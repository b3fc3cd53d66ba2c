#include <baton/command.hpp>
#include <baton/log.hpp>
#include <baton/runtime.hpp>

#include "src/core/admission.hpp"
#include "src/core/tenant_quotas.hpp"
#include "src/core/turn_cache.hpp"

#include <baton/detail/async.hpp>
#include <baton/strand.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>

namespace baton {

using detail::session_actor;

using detail::turn_slot;

namespace {
// A turn in flight: its cancellation signal lives on the session's strand.
struct running_turn {
    running_turn(asio::any_io_executor s, std::shared_ptr<turn_progress> p, std::string t)
        : strand(std::move(s)), progress(std::move(p)), tenant(std::move(t)) {}
    // shutdown: the drain's grace ran out; the turn is left `running` in the store, as a crash
    // would leave it, for the next start to decide (run again, or `abandoned`).
    enum class reason { none, cancelled, timed_out, shutdown };
    asio::any_io_executor strand; // the session's strand
    std::shared_ptr<turn_progress> progress;
    const std::string tenant;
    asio::cancellation_signal signal;
    reason why = reason::none;

    // On the strand only.
    void stop(reason r) {
        if (why != reason::none) return;
        why = r;
        progress->stop_reason = r == reason::timed_out ? "timed_out" : "stopped";
        signal.emit(asio::cancellation_type::terminal);
    }
};

// A caller of wait_turn: its coroutine runs on `strand`, where the turn's end is handed over.
struct turn_waiter {
    turn_waiter(std::shared_ptr<baton::clock> c, asio::any_io_executor s, bool h)
        : strand(s), timer(std::move(c), s), held(h) {}
    asio::any_io_executor strand;
    baton::timer timer;
    const bool held;                   // bounded (a held request): a drain ends it
    std::optional<turn_record> record; // the end, set on the strand
    bool released = false;             // a drain or release_waiters(), set on the strand
};

// The end of a turn a crash (or a node's loss) cut off after its side effects began: its record
// `failed`/`abandoned` and, in the same transaction, its message and an `error` entry on the tape
// (the run that was cut off kept nothing there), so that the session's next turn knows what was
// asked and that it went unanswered.
turn_end abandoned_end(turn_record rec, std::string why, time_ms now) {
    rec.status = turn_status::failed;
    rec.error = error_info{"abandoned", why};
    rec.finished_at = now;
    state_update u;
    u.session_id = rec.session_id;
    u.turn_id = rec.turn_id;
    u.tenant = rec.tenant;
    for (auto e : {make_message("user", rec.input.text), make_error_entry("abandoned", why)}) {
        e.turn_id = rec.turn_id;
        u.entries.push_back(std::move(e));
    }
    turn_end end;
    end.finished.push_back(std::move(rec));
    end.state = std::move(u);
    return end;
}
} // namespace

struct runtime::impl {
    impl(asio::any_io_executor e, runtime& r, runtime_options o)
        : ex(std::move(e)), rt(r), clk(o.clock ? std::move(o.clock) : system_clock()), actors(ex),
          hub(o.events), quotas(std::move(o.tenants), clk) {}

    asio::any_io_executor ex;
    runtime& rt;
    std::shared_ptr<baton::clock> clk;
    detail::actor_registry actors;
    detail::turn_cache turns;
    event_hub hub;
    detail::tenant_quotas quotas;
    std::mutex running_mutex;
    std::unordered_map<std::string, std::shared_ptr<running_turn>> running;
    std::mutex observers_mutex;
    std::vector<std::function<void(const turn_record&)>> observers;
    std::map<std::string, route_check, std::less<>> routes; // written before accept() runs
    mutable std::mutex waiters_mutex;
    std::unordered_multimap<std::string, std::shared_ptr<turn_waiter>> waiters;

    // Hands a turn's stored end to its waiters.
    void hand_over(const turn_record& rec);
    // Ends the waits (only the held ones when `held_only`) with the record as it stands.
    void release(bool held_only);
    void unregister(const std::string& turn_id, const std::shared_ptr<turn_waiter>& w);
    asio::awaitable<std::optional<turn_record>> wait_here(std::string turn_id, std::string tenant,
                                                          std::optional<clock::duration> up_to);

    std::optional<api_error> check_deliver(const json::value& deliver) const;

    void kick(const std::shared_ptr<session_actor>& a);
    // `holding`: the tenant's running-turn slot was handed over already (tenant_quotas::release).
    asio::awaitable<void> drain_loop(std::shared_ptr<session_actor> a, bool holding = false);
    // Gives the tenant's slot back, or hands it on to the session waiting for it.
    void release_slot(const std::string& tenant);
    asio::awaitable<void> run_turn(std::shared_ptr<session_actor> a, turn_record rec,
                                   std::vector<turn_record> collected);
    // Stores a turn's end and publishes it; `retry`: until stored (or draining), else once.
    // `progress`: the turn's own (when it ran), whose gathered writes (turn_progress::end) go in the
    // same transaction.
    asio::awaitable<void> store_start(const std::vector<std::string>& ids, time_ms at);
    // `abandon`: nothing is stored (a turn stopped by the end of a drain's grace). `folded`: the
    // final records of the messages it answered too (folded_ends), ended in the same transaction.
    asio::awaitable<void> store_final(turn_record rec, bool retry = true,
                                      std::shared_ptr<turn_progress> progress = nullptr,
                                      bool abandon = false, std::vector<turn_record> folded = {});
    // What follows a stored end for one of its records: readers, waiters and observers are told.
    void ended(const turn_record& rec);
    // A message folded into a running turn (collect, steer) now counts as running (the caller
    // has stored it so, at `at`).
    void fold(const turn_record& folded, const std::shared_ptr<running_turn>& carrier, time_ms at);
    // Admission mode `steer`: takes the messages waiting behind the running turn, stores them as
    // running and folds them into it.
    asio::awaitable<std::vector<steered_message>> steer(std::shared_ptr<session_actor> a,
                                                        std::shared_ptr<std::vector<turn_record>> folded,
                                                        std::weak_ptr<running_turn> carrier,
                                                        std::string agent);
    // It ends with the turn that answered it: same status, reply and error; no steps of its own.
    // No longer running here; returns the final records.
    std::vector<turn_record> folded_ends(std::vector<turn_record> folded, const turn_record& carrier);
    // Cancels the turn when it runs here (and is of `tenant`, unless empty).
    bool signal_running(const std::string& turn_id, std::string_view tenant = {});

    // Idle compaction: sessions whose window is worth compacting, each due once it has been
    // idle long enough. One timer loop serves them all while any is due.
    using time_point = baton::clock::time_point;
    struct idle_session {
        session_ref session;
        std::string agent;
    };
    std::mutex idle_mutex;
    // The loop runs on its strand; a drain cancels its wait there (idle_wait: the loop's timer
    // while it runs), so that the loop ends at once.
    asio::any_io_executor idle_strand = asio::make_strand(ex);
    baton::timer* idle_wait = nullptr;
    using idle_queue = std::multimap<time_point, idle_session>;
    idle_queue idle_due;
    std::unordered_map<std::string, idle_queue::iterator>
        idle_index; // each session's one entry (by key)
    bool idle_loop_running = false;
    void compaction_due(const session_ref& s, const std::string& agent, std::chrono::milliseconds after);
    asio::awaitable<void> idle_loop();
    asio::awaitable<void> run_compaction(std::shared_ptr<session_actor> a, turn_record rec);

    // Several nodes (store::cluster(), docs/design.md "Several nodes"). Set by recover() before
    // any message is accepted. A message is only stored here; the session's owner claims it
    // (claim_loop) and runs it. Events of a turn whose message another node accepted, or that
    // another node follows, are relayed through the database; relayed events of turns this node
    // accepted or follows go into its own logs.
    baton::cluster* cl = nullptr;
    asio::any_io_executor cluster_strand = asio::make_strand(ex);
    // On cluster_strand:
    std::unique_ptr<asio::steady_timer> claim_timer;
    bool claim_again = false;
    // A turn's relayed events in the runner's order: each source seq is applied once, the next
    // after the last applied (each goes through `early`); one that comes early (a live event before the
    // replay a follower asked for, or notifications that crossed) waits for the ones before it, for 1 s
    // at most.
    struct relayed_order {
        std::int64_t seen = 0;                                             // last source seq applied
        std::map<std::int64_t, std::pair<std::string, std::string>> early; // seq -> type, data
        std::chrono::steady_clock::time_point early_since{};
    };
    std::unordered_map<std::string, relayed_order> relayed_seen;
    // Applies what waited and may go now: the next in order, or any past the bound (`all`: every
    // one, in order, across the gaps).
    void apply_early(relayed_order& o, turn_log& log, bool all = false);
    // Applies what waited in order (with its gap: those before it are not coming), then forgets it.
    void flush_relayed(const std::string& turn_id, turn_log* log);
    std::unordered_map<std::string, std::chrono::steady_clock::time_point> watched; // followed early
    // Under relay_mutex: turns claimed here and not finished, and those whose events go out.
    std::mutex relay_mutex;
    std::unordered_map<std::string, session_ref> mine;
    std::unordered_map<std::string, std::pair<session_ref, std::uint64_t>> relaying; // its listener
    std::function<void(std::vector<outbox_item>)> on_outbox_claimed;

    void join_cluster(baton::cluster& c);
    void poke_claim();
    asio::awaitable<void> claim_loop();
    asio::awaitable<std::size_t> claim_once();
    // Relays the turn's events from now on, and (`replay`) those its log holds already.
    void start_relay(const std::string& turn_id, const session_ref& session, bool replay);
    void stop_relay(const std::string& turn_id);
    void on_relayed(relayed_event e);
    asio::awaitable<void> relayed_end(std::string turn_id);
    asio::awaitable<void> follow_end(std::string turn_id);
    void on_watch(const std::string& turn_id);
};

runtime::runtime(asio::any_io_executor ex, framework& fw, event_hub_options events)
    : runtime(std::move(ex), fw, runtime_options{events, system_clock(), {}}) {}

runtime::runtime(asio::any_io_executor ex, framework& fw, runtime_options o)
    : fw_(fw), impl_(std::make_unique<impl>(std::move(ex), *this, std::move(o))) {
    fw_.on_compaction_due = [i = impl_.get()](const session_ref& sid, const std::string& agent,
                                              std::chrono::milliseconds after) {
        i->compaction_due(sid, agent, after);
    };
}

event_hub& runtime::events() {
    return impl_->hub;
}

const std::shared_ptr<baton::clock>& runtime::clock() const {
    return impl_->clk;
}

runtime::~runtime() {
    fw_.on_compaction_due = nullptr;
}

std::size_t runtime::live_sessions() const {
    return impl_->actors.live_sessions();
}

std::int64_t runtime::queued_turns() const {
    return impl_->actors.total_waiting();
}

std::uint64_t runtime::store_calls() const {
    return fw_.db().calls();
}

std::uint64_t runtime::store_batches() const {
    return fw_.db().batches();
}

std::optional<std::string> runtime::store_unavailable() const {
    return fw_.db().store().unavailable();
}

asio::awaitable<store::outbox_counts> runtime::count_outbox() {
    auto count = [](store& s) { return s.count_outbox(); };
    co_return co_await fw_.db().run(std::move(count));
}

void runtime::add_route(std::string channel, route_check check) {
    impl_->routes[std::move(channel)] = std::move(check);
}

std::optional<api_error> runtime::impl::check_deliver(const json::value& deliver) const {
    const auto* d = deliver.if_object();
    if (!d) return std::nullopt;
    std::string_view channel, to;
    if (auto* c = d->if_contains("channel"); c && c->is_string()) channel = c->get_string();
    if (auto* t = d->if_contains("to"); t && t->is_string()) to = t->get_string();
    if (channel == "http")
        return to.empty() ? std::nullopt
                          : std::optional(api_error{errc::invalid_request,
                                                    "deliver.to: the http channel's reply is the turn "
                                                    "record: give no to"});
    auto it = routes.find(channel);
    if (it == routes.end()) {
        std::string known = "http";
        for (const auto& [name, check] : routes)
            known += ", " + name;
        return api_error{errc::invalid_request, "deliver.channel: unknown channel \"" +
                                                    std::string(channel) + "\" (configured: " + known +
                                                    ")"};
    }
    if (auto why = it->second(to)) return api_error{errc::invalid_request, "deliver.to: " + *why};
    return std::nullopt;
}

asio::awaitable<boost::system::result<std::vector<std::optional<std::string>>>>
runtime::read_cursors(std::vector<std::string> names) {
    auto read = [names = std::move(names)](store& s) {
        std::vector<std::optional<std::string>> out;
        out.reserve(names.size());
        for (const auto& n : names)
            out.push_back(s.get_cursor(n));
        return out;
    };
    try {
        co_return co_await fw_.db().run(std::move(read));
    } catch (const std::exception& e) {
        log::error("cannot read channel cursors", {{"error", e.what()}});
    }
    co_return boost::system::error_code(errc::internal_error);
}

asio::awaitable<boost::system::error_code>
runtime::write_cursors(std::vector<std::pair<std::string, std::string>> values) {
    auto write = [values = std::move(values)](store& s) {
        for (const auto& [name, value] : values)
            s.set_cursor(name, value);
    };
    try {
        co_await fw_.db().run(std::move(write));
        co_return boost::system::error_code{};
    } catch (const std::exception& e) {
        log::error("cannot write channel cursors", {{"error", e.what()}});
    }
    co_return boost::system::error_code(errc::internal_error);
}

void runtime::on_turn_finished(std::function<void(const turn_record&)> f) {
    std::lock_guard lock(impl_->observers_mutex);
    impl_->observers.push_back(std::move(f));
}

// Starts the session's drainer when it is idle and its head message is stored.
void runtime::impl::kick(const std::shared_ptr<session_actor>& a) {
    if (!actors.claim_drainer(*a, rt.draining())) return;
    auto loop = drain_loop(a);
    asio::co_spawn(a->strand, std::move(loop), log::spawn_logger{"session " + a->key});
}

void runtime::impl::release_slot(const std::string& tenant) {
    if (auto next = quotas.release(tenant)) {
        auto loop = drain_loop(next, true);
        asio::co_spawn(next->strand, std::move(loop), log::spawn_logger{"session " + next->key});
    }
}

// The session's one consumer: a turn starts only after the previous one has finished. A tenant
// at its max_running_turns makes it wait (the drainer stays claimed, the turn queued) until a
// turn of the tenant ends and hands the slot on, first come first served.
asio::awaitable<void> runtime::impl::drain_loop(std::shared_ptr<session_actor> a, bool holding) {
    const bool gated = quotas.limited_concurrency(a->tenant);
    for (;;) {
        if (gated && !holding) {
            if (!quotas.acquire(a->tenant, a)) co_return; // release_slot() resumes it
            holding = true;
        }
        auto next = actors.next_turn(*a, rt.draining());
        if (!next) {
            if (gated) release_slot(a->tenant);
            co_return;
        }
        if (next->compaction) {
            co_await run_compaction(a, std::move(next->record));
            actors.turn_done(*a);
            continue;
        }
        // Admission mode `collect`: the messages that queued behind it are answered together.
        std::vector<turn_record> collected;
        const agent* ag = rt.fw_.find_agent(next->record.agent);
        if (ag && ag->config.admission.mode == admission_mode::collect)
            collected = actors.take_ready(*a, next->record.agent);
        co_await run_turn(a, std::move(next->record), std::move(collected));
        actors.turn_done(*a);
        if (gated) {
            // Another session of the tenant may have waited: it goes first.
            release_slot(a->tenant);
            holding = false;
        }
    }
}

void runtime::impl::compaction_due(const session_ref& sid, const std::string& agent,
                                   std::chrono::milliseconds after) {
    auto due = clk->now() + after;
    {
        std::lock_guard lock(idle_mutex);
        // A session is due once: a later turn moves its due.
        auto [at, fresh] = idle_index.try_emplace(sid.key());
        if (!fresh) idle_due.erase(at->second);
        at->second = idle_due.emplace(due, idle_session{sid, agent});
        if (idle_loop_running) return;
        idle_loop_running = true;
    }
    // Outside the lock: co_spawn may start the loop right here.
    asio::co_spawn(idle_strand, idle_loop(), log::spawn_logger{"idle compaction"});
}

asio::awaitable<void> runtime::impl::idle_loop() {
    baton::timer timer(clk, idle_strand);
    struct published {
        baton::timer*& at;
        ~published() { at = nullptr; }
    } guard{idle_wait = &timer};
    for (;;) {
        std::vector<idle_session> ready;
        bool stop = false;
        auto wake = clk->now() + std::chrono::milliseconds(200);
        {
            std::lock_guard lock(idle_mutex);
            auto now = clk->now();
            while (!idle_due.empty() && idle_due.begin()->first <= now) {
                auto node = idle_due.extract(idle_due.begin());
                idle_index.erase(node.mapped().session.key());
                ready.push_back(std::move(node.mapped()));
            }
            if (idle_due.empty() || rt.draining()) {
                idle_loop_running = false;
                idle_due.clear();
                idle_index.clear();
                stop = true;
            } else {
                wake = std::min(wake, idle_due.begin()->first);
            }
        }
        for (auto& s : ready) {
            // A session busy again is left alone: its turn reports it due afresh when it ends.
            if (auto a = actors.queue_compaction(s.session, s.agent)) kick(a);
        }
        if (stop) co_return;
        // Later than now: everything due by now was taken above.
        timer.expires_at(wake);
        boost::system::error_code ec; // operation_aborted: a drain began, seen above
        co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
}

asio::awaitable<void> runtime::impl::run_compaction(std::shared_ptr<session_actor> a, turn_record rec) {
    try {
        co_await rt.fw_.compact_session(session_of(rec), rec.agent);
    } catch (const std::exception& e) {
        log::warn("idle compaction failed", {{"session", a->key}, {"error", e.what()}});
    }
}

namespace {
// The store call that marks turns running, all started at `at`, in one batch; `side_effects`:
// they join a turn that has begun them.
auto mark_all_running(std::vector<std::string> ids, time_ms at, bool side_effects = false) {
    return [ids = std::move(ids), at, side_effects](store& s) {
        for (const auto& id : ids) {
            s.mark_running(id, at);
            if (side_effects) s.mark_side_effects(id);
        }
    };
}
} // namespace

asio::awaitable<std::vector<steered_message>>
runtime::impl::steer(std::shared_ptr<session_actor> a, std::shared_ptr<std::vector<turn_record>> folded,
                     std::weak_ptr<running_turn> carrier, std::string agent) {
    std::vector<steered_message> out;
    if (carrier.expired()) co_return out;
    auto ready = actors.take_ready(*a, agent);
    if (ready.empty()) co_return out;
    // Stored as running before the turn answers them: a crash from here on ends them with it
    // instead of running them again as turns of their own.
    std::vector<std::string> ids;
    for (const auto& r : ready)
        ids.push_back(r.turn_id);
    auto at = now_ms();
    auto entry = carrier.lock();
    const bool joined_effects = entry && entry->progress->side_effects;
    if (entry)
        for (const auto& id : ids)
            entry->progress->folded.push_back(id);
    try {
        co_await rt.fw_.db().run(mark_all_running(std::move(ids), at, joined_effects));
    } catch (const std::exception& e) {
        // They are answered all the same; only a crash before the turn ends would run them again.
        log::warn("cannot store steered messages as running", {{"error", e.what()}});
    }
    for (auto& r : ready) {
        // Its own start, as the store counted it (mark_running), not the carrier's.
        r.started_at = at;
        r.attempt += 1;
        if (entry) fold(r, entry, at);
        out.push_back({r.turn_id, r.input.text, r.input.channel, r.input.deliver});
        folded->push_back(std::move(r));
    }
    co_return out;
}

void runtime::impl::fold(const turn_record& folded, const std::shared_ptr<running_turn>& carrier,
                         time_ms at) {
    auto rec = folded;
    rec.status = turn_status::running;
    rec.started_at = at;
    turns.live(rec);
    hub.open(rec.turn_id, session_of(rec))
        ->publish_text("turn.started", "{\"attempt\":" + std::to_string(rec.attempt) + "}");
    std::lock_guard lock(running_mutex);
    running[rec.turn_id] = carrier; // cancelling it cancels the turn that carries it
}

std::vector<turn_record> runtime::impl::folded_ends(std::vector<turn_record> folded,
                                                    const turn_record& carrier) {
    for (auto& rec : folded) {
        {
            std::lock_guard lock(running_mutex);
            running.erase(rec.turn_id);
        }
        rec.status = carrier.status;
        rec.reply = carrier.reply;
        rec.refusal = carrier.refusal;
        rec.error = carrier.error;
        if (!rec.started_at) rec.started_at = carrier.started_at;
    }
    return folded;
}

asio::awaitable<void> runtime::impl::run_turn(std::shared_ptr<session_actor> a, turn_record rec,
                                              std::vector<turn_record> collected) {
    auto began = std::chrono::steady_clock::now();
    rt.running_.fetch_add(1);
    auto progress = std::make_shared<turn_progress>();
    progress->events = hub.open(rec.turn_id, session_of(rec));
    // save_state and the outbox items go in the end's transaction (store_final).
    progress->deferred = true;
    // Stored as running by accept (a message to an idle session): its start is written already.
    const bool start_stored = rec.status == turn_status::running && rec.attempt > 0;
    auto entry = std::make_shared<running_turn>(a->strand, progress, rec.tenant);
    {
        std::lock_guard lock(running_mutex);
        running[rec.turn_id] = entry;
    }
    const agent* ag = rt.fw_.find_agent(rec.agent);
    // Admission mode `steer`: messages stored while the turn runs join it at a step boundary
    // (the agent loop calls this on the session's strand).
    auto folded = std::make_shared<std::vector<turn_record>>(std::move(collected));
    if (ag && ag->config.admission.mode == admission_mode::steer) {
        // Weak: the progress holds this function, and the running entry holds the progress.
        std::weak_ptr<running_turn> carrier = entry;
        progress->take_steering = [this, a, folded, carrier, agent = rec.agent] {
            return steer(a, folded, carrier, agent);
        };
    }
    // The turn deadline cancels the turn through its cancellation slot.
    asio::steady_timer deadline(a->strand);
    if (ag)
        deadline.expires_after(ag->config.limits.turn_timeout);
    else
        deadline.expires_after(std::chrono::hours(24));
    deadline.async_wait([entry](boost::system::error_code ec) {
        if (!ec) entry->stop(running_turn::reason::timed_out);
    });
    try {
        // The messages this turn answers too (`collect`) run with it: a crash ends them with it.
        rec.status = turn_status::running;
        rec.started_at = now_ms();
        std::vector<std::string> ids;
        if (!start_stored) {
            ids.push_back(rec.turn_id);
            rec.attempt += 1;
        }
        for (auto& c : *folded) {
            ids.push_back(c.turn_id);
            progress->folded.push_back(c.turn_id);
            // Started with this turn, and counted so by the store (store_start).
            c.started_at = rec.started_at;
            c.attempt += 1;
        }
        if (!ids.empty()) co_await store_start(ids, *rec.started_at);
        turns.live(rec);
        progress->events->publish_text("turn.started",
                                       "{\"attempt\":" + std::to_string(rec.attempt) + "}");

        inbound in;
        for (const auto& c : *folded) {
            fold(c, entry, *rec.started_at);
            in.collected.push_back({c.turn_id, c.input.text, c.input.channel, c.input.deliver});
        }
        in.turn_id = rec.turn_id;
        in.channel = rec.input.channel;
        in.session_id = rec.session_id;
        in.agent = rec.agent;
        in.tenant = rec.tenant;
        in.text = rec.input.text;
        in.metadata = rec.input.metadata;
        in.deliver = rec.input.deliver;
        in.progress = progress;
        auto turn = rt.fw_.process_inbound(std::move(in));
        auto result = co_await asio::co_spawn(
            a->strand, std::move(turn),
            asio::bind_cancellation_slot(entry->signal.slot(), asio::use_awaitable));
        rec.status = result.status;
        // A turn cut by its step limit without a word of text has no reply (null), not "".
        if (result.status == turn_status::step_limit && result.reply.empty())
            rec.reply.reset();
        else
            rec.reply = std::move(result.reply);
        rec.refusal = result.refusal;
        rec.steps = result.steps;
        rec.usage = result.usage;
    } catch (const turn_error& e) {
        rec.status = turn_status::failed;
        rec.error = error_info{e.code(), e.what()};
    } catch (const boost::system::system_error& e) {
        if (e.code() == asio::error::operation_aborted) {
            rec.status = entry->why == running_turn::reason::timed_out ? turn_status::timed_out
                                                                       : turn_status::stopped;
        } else {
            rec.status = turn_status::failed;
            // The code's own message: what() would add Boost's source location for API clients.
            rec.error = error_info{"internal_error", e.code().message()};
        }
    } catch (const std::exception& e) {
        rec.status = turn_status::failed;
        rec.error = error_info{"internal_error", e.what()};
    }
    deadline.cancel();
    {
        std::lock_guard lock(running_mutex);
        running.erase(rec.turn_id);
    }
    if (rec.status != turn_status::completed && rec.status != turn_status::step_limit) {
        // What the turn produced before it ended is kept.
        if (!progress->reply.empty()) rec.reply = progress->reply;
        rec.steps = progress->steps;
        rec.usage = progress->usage;
    }
    if (rec.error)
        log::warn(
            "turn failed",
            {{"turn_id", rec.turn_id}, {"code", rec.error->code}, {"message", rec.error->message}});
    co_await asio::this_coro::reset_cancellation_state();
    progress->take_steering = nullptr;
    rt.fw_.metrics().observe_turn(std::chrono::steady_clock::now() - began);
    const bool abandon = entry->why == running_turn::reason::shutdown;
    // One transaction ends the turn and the messages it answered: a crash between two ends ran a
    // folded message again as a turn of its own, answered twice (found by a new-user check).
    auto also = folded_ends(std::move(*folded), rec);
    co_await store_final(std::move(rec), true, progress, abandon, std::move(also));
    rt.running_.fetch_sub(1);
}

// A turn's start is stored before it runs. A database away for a moment (PostgreSQL restarting,
// a connection lost) fails the write with store_unavailable, having stored nothing or the start
// alone: it is tried again for up to 10 s, as a read is, rather than failing a turn that was
// accepted. (A start stored whose answer was lost counts twice in `attempt`.)
asio::awaitable<void> runtime::impl::store_start(const std::vector<std::string>& ids, time_ms at) {
    std::chrono::milliseconds pause{100};
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
        try {
            co_await rt.fw_.db().run(mark_all_running(ids, at));
            co_return;
        } catch (const baton::store_unavailable&) {
            if (rt.draining() || std::chrono::steady_clock::now() + pause > give_up) throw;
        }
        asio::steady_timer timer(co_await asio::this_coro::executor, pause);
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
        pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(1));
    }
}

asio::awaitable<void> runtime::impl::store_final(turn_record rec, bool retry,
                                                 std::shared_ptr<turn_progress> progress, bool abandon,
                                                 std::vector<turn_record> folded) {
    rec.finished_at = now_ms();
    for (auto& f : folded)
        f.finished_at = rec.finished_at;
    // Counted before anyone can read the final record.
    if (!abandon) {
        rt.fw_.metrics().turn_finished(rec.status);
        for (const auto& f : folded)
            rt.fw_.metrics().turn_finished(f.status);
    }
    // The end of a turn is tried again until it is stored (a full disk, an I/O error that
    // passes): until then the turn reads as running, and turn.finished waits, so that no reader
    // learns an outcome a crash could still take back. A daemon that is draining gives up: the
    // turn then ends as the next start decides for a turn found running (`abandoned`, or run
    // again), as if the process had died.
    turn_end end;
    std::vector<turn_progress::end_callback> after;
    if (progress) {
        end = std::move(progress->end);
        after = std::move(progress->after_end);
    }
    end.finished.push_back(rec);
    end.finished.insert(end.finished.end(), folded.begin(), folded.end());
    // Run once, whether the end was stored or given up.
    auto settle = [&](bool stored, const std::vector<outbox_item>& added) {
        for (auto& f : after)
            f(stored, end, added);
        after.clear();
    };
    if (abandon) {
        // As after a crash: the stream stops without turn.finished, the store still says
        // `running`, and the next start decides.
        log::warn("turn left running: the drain's grace ran out", {{"turn_id", rec.turn_id}});
        turns.forget(rec.turn_id);
        for (const auto& f : folded)
            turns.forget(f.turn_id);
        settle(false, {});
        co_return;
    }
    std::chrono::milliseconds pause{50};
    for (int attempt = 1;; ++attempt) {
        try {
            auto write = [&end](store& s) { return s.end_turn(end); };
            auto added = co_await rt.fw_.db().run(std::move(write));
            settle(true, added);
            if (!added.empty())
                if (auto log = hub.find(rec.turn_id))
                    for (const auto& o : added)
                        log->publish("outbox.enqueued",
                                     json::object{{"key", o.key}, {"channel", o.channel}});
            actors.turn_ending(session_of(rec).key(), rec.turn_id);
            turns.finished(rec);
            quotas.add_usage(rec.tenant, clk->utc_ms(), rec.usage);
            for (const auto& f : folded) {
                actors.turn_ending(session_of(f).key(), f.turn_id);
                turns.finished(f);
            }
            if (attempt > 1)
                log::info("stored the end of a turn at last",
                          {{"turn_id", rec.turn_id}, {"attempts", attempt}});
            break;
        } catch (const std::exception& e) {
            bool give_up = !retry || rt.draining();
            if (attempt == 1 || give_up)
                log::error(give_up ? "cannot store the end of a turn"
                                   : "cannot store the end of a turn yet; trying again",
                           {{"turn_id", rec.turn_id}, {"error", e.what()}});
            if (give_up) {
                // Nobody is told an end that is not stored: as after a crash, the stream stops
                // without turn.finished and the store's record decides at the next start.
                turns.forget(rec.turn_id);
                for (const auto& f : folded)
                    turns.forget(f.turn_id);
                settle(false, {});
                co_return;
            }
        }
        asio::steady_timer timer(co_await asio::this_coro::executor, pause);
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
        pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(5));
    }
    ended(rec);
    for (const auto& f : folded)
        ended(f);
}

void runtime::impl::ended(const turn_record& rec) {
    hub.open(rec.turn_id, session_of(rec))->publish("turn.finished", finished_event_data(rec));
    hub.retire(rec.turn_id);
    hand_over(rec);
    if (cl) {
        std::lock_guard lock(relay_mutex);
        mine.erase(rec.turn_id);
    }
    std::lock_guard lock(observers_mutex);
    for (auto& f : observers)
        f(rec);
}

void runtime::impl::hand_over(const turn_record& rec) {
    std::lock_guard lock(waiters_mutex);
    auto [b, e] = waiters.equal_range(rec.turn_id);
    for (auto it = b; it != e; ++it)
        asio::post(it->second->strand, [w = it->second, rec] {
            w->record = rec;
            w->timer.cancel();
        });
    waiters.erase(b, e);
}

void runtime::impl::release(bool held_only) {
    std::lock_guard lock(waiters_mutex);
    for (auto it = waiters.begin(); it != waiters.end();) {
        if (held_only && !it->second->held) {
            ++it;
            continue;
        }
        asio::post(it->second->strand, [w = it->second] {
            w->released = true;
            w->timer.cancel();
        });
        it = waiters.erase(it);
    }
}

void runtime::impl::unregister(const std::string& turn_id, const std::shared_ptr<turn_waiter>& w) {
    std::lock_guard lock(waiters_mutex);
    auto [b, e] = waiters.equal_range(turn_id);
    for (auto it = b; it != e; ++it)
        if (it->second == w) {
            waiters.erase(it);
            return;
        }
}

asio::awaitable<std::optional<turn_record>>
runtime::impl::wait_here(std::string turn_id, std::string tenant, std::optional<clock::duration> up_to) {
    // Every kind of cancellation ends the wait; looked at below, never thrown by a co_await.
    co_await asio::this_coro::reset_cancellation_state(asio::enable_total_cancellation());
    co_await asio::this_coro::throw_if_cancelled(false);
    auto strand = co_await asio::this_coro::executor;
    auto w = std::make_shared<turn_waiter>(clk, strand, up_to.has_value());
    {
        std::lock_guard lock(waiters_mutex);
        if (w->held && rt.draining())
            w->released = true; // answered at once, as the drain answered those before it
        else
            waiters.emplace(turn_id, w);
    }
    // Registered first, then read: an end between the two is not missed.
    std::optional<turn_record> rec;
    try {
        rec = co_await rt.get_turn(turn_id, tenant);
    } catch (...) {
        unregister(turn_id, w);
        throw;
    }
    if (!rec || is_terminal(rec->status) || w->released) {
        unregister(turn_id, w);
        co_return rec;
    }
    const auto until = up_to ? clk->now() + *up_to : clock::time_point::max();
    for (;;) {
        // Several nodes: the end of a turn another node runs may come by relay, or not (this
        // node neither accepted nor follows it): the record is read again every second.
        auto at = until;
        if (cl && until - clk->now() > std::chrono::seconds(1))
            at = clk->now() + std::chrono::seconds(1);
        w->timer.expires_at(at);
        auto [ec] = co_await w->timer.async_wait(asio::as_tuple(asio::use_awaitable));
        if (!ec && at != until && !w->record && !w->released) {
            std::optional<turn_record> now;
            try {
                now = co_await rt.get_turn(turn_id, tenant);
            } catch (const std::exception&) {
            }
            if (now && is_terminal(now->status)) {
                w->record = std::move(now);
                break;
            }
            continue;
        }
        if (w->record || w->released || !ec) break; // the end, a release, or `up_to` passed
        if (co_await detail::cancelled()) {
            unregister(turn_id, w);
            throw boost::system::system_error(asio::error::operation_aborted);
        }
    }
    unregister(turn_id, w);
    if (w->record) co_return std::move(w->record);
    co_return co_await rt.get_turn(std::move(turn_id), std::move(tenant));
}

asio::awaitable<std::optional<turn_record>> runtime::wait_turn(std::string turn_id, std::string tenant,
                                                               std::optional<clock::duration> up_to) {
    // On a strand of its own, where hand_over() and release() post.
    auto strand = detail::make_thin_strand(impl_->ex);
    co_return co_await detail::run_on(strand,
                                      impl_->wait_here(std::move(turn_id), std::move(tenant), up_to));
}

void runtime::release_waiters() {
    impl_->release(false);
}

std::size_t runtime::waiting_turns() const {
    std::lock_guard lock(impl_->waiters_mutex);
    return impl_->waiters.size();
}

bool runtime::impl::signal_running(const std::string& turn_id, std::string_view tenant) {
    std::shared_ptr<running_turn> entry;
    {
        std::lock_guard lock(running_mutex);
        auto it = running.find(turn_id);
        if (it == running.end() || (!tenant.empty() && it->second->tenant != tenant)) return false;
        entry = it->second;
    }
    asio::post(entry->strand, [entry] { entry->stop(running_turn::reason::cancelled); });
    return true;
}

asio::awaitable<std::optional<api_error>> runtime::cancel(std::string turn_id, std::string tenant) {
    if (impl_->signal_running(turn_id, tenant)) co_return std::nullopt;
    auto get = [id = turn_id](store& s) { return s.get_turn(id); };
    auto rec = co_await fw_.db().run(std::move(get));
    if (!rec || (!tenant.empty() && rec->tenant != tenant))
        co_return api_error{errc::not_found, "no such turn: " + turn_id};
    // A message to an idle session is stored as running already (accept); it may still wait for
    // its tenant's running-turn slot, and then it is in the queue.
    if ((rec->status == turn_status::queued || rec->status == turn_status::running) &&
        impl_->actors.remove_queued(session_of(*rec).key(), turn_id)) {
        rec->status = turn_status::stopped;
        rec->started_at.reset();
        rec->attempt = 0;
        co_await impl_->store_final(std::move(*rec), false); // a request waits on it: once
        co_return std::nullopt;
    }
    // It may have started meanwhile.
    if (impl_->signal_running(turn_id, tenant)) co_return std::nullopt;
    // Several nodes: a turn that has not ended runs (or waits) on another node, which alone can
    // stop it. Found by a new user: this said "has already finished" of a running turn.
    if (impl_->cl && !is_terminal(rec->status))
        co_return api_error{errc::turn_not_running,
                            "turn " + turn_id + " is " + std::string(to_string(rec->status)) +
                                " on another node: cancel it on the node that runs its session"};
    co_return api_error{errc::turn_not_running, "turn " + turn_id + " has already finished"};
}

namespace {
// First in an idle session, a turn starts at once: stored as running, so that its start costs no
// write of its own (run_turn sees the attempt counted).
turn_record as_stored(const turn_record& rec, bool first) {
    auto stored = rec;
    if (first) {
        stored.status = turn_status::running;
        stored.started_at = rec.created_at;
        stored.attempt = 1;
    }
    return stored;
}

// The answer to a message the store did not take.
api_error not_stored(const std::exception& e) {
    if (dynamic_cast<const baton::store_unavailable*>(&e))
        return api_error{errc::store_unavailable,
                         "the database is unreachable: the message was not accepted (retry with "
                         "the same Idempotency-Key)"};
    return api_error{errc::internal_error, "the message could not be stored"};
}

// The answer to a message whose Idempotency-Key the tenant used before: 409 for another request,
// else its earlier turn, a replay (told to on_stored as well).
accept_result earlier_answer(const insert_result& r, const std::string& session_id,
                             const std::function<void(const accepted&)>& on_stored) {
    if (r.outcome == insert_outcome::key_reused)
        return api_error{errc::idempotency_key_reused,
                         "this Idempotency-Key was already used with another request"};
    accepted replay{r.turn_id, session_id, true};
    if (on_stored) on_stored(replay);
    return replay;
}
} // namespace

// The answer insert_turn would give to a message whose Idempotency-Key the tenant used before, or
// nullopt (a key not used, or a store that cannot tell now: the caller refuses the message).
asio::awaitable<std::optional<accept_result>> runtime::find_replay(const accept_request& req) {
    std::optional<insert_result> found;
    try {
        auto find = [tenant = req.tenant, idem = req.idem](store& s) {
            return s.find_idempotency(tenant, idem);
        };
        found = co_await fw_.db().run(std::move(find));
    } catch (const std::exception& e) {
        log::warn("cannot look up an Idempotency-Key",
                  {{"session_id", req.session_id}, {"error", e.what()}});
    }
    if (!found) co_return std::nullopt;
    co_return earlier_answer(*found, req.session_id, req.on_stored);
}

asio::awaitable<accept_result> runtime::accept(accept_request req) {
    if (draining()) co_return api_error{errc::draining, "the daemon is shutting down"};
    const agent* ag = fw_.find_agent(req.agent);
    if (!ag) co_return api_error{errc::invalid_request, "unknown agent: " + req.agent};
    if (auto bad = impl_->check_deliver(req.deliver)) co_return std::move(*bad);
    if (!valid_tenant_name(req.tenant))
        co_return api_error{errc::invalid_request, "invalid tenant name: " + req.tenant};
    // Before anything is stored: a refused message was never accepted, nothing is dropped. A
    // spent tokens_per_day still lets the replay of a message accepted earlier find its turn.
    if (!req.idem.key.empty() && impl_->quotas.tokens_spent(req.tenant))
        if (auto earlier = co_await find_replay(req)) co_return std::move(*earlier);
    if (auto refused = impl_->quotas.admit(req.tenant)) co_return std::move(*refused);

    turn_record rec;
    rec.turn_id = make_turn_id();
    rec.session_id = req.session_id;
    rec.agent = req.agent;
    rec.tenant = req.tenant;
    rec.created_at = now_ms();
    rec.input.channel = req.channel;
    rec.input.text = std::move(req.text);
    rec.input.metadata = std::move(req.metadata);
    rec.input.deliver = std::move(req.deliver);

    // `/stop` acts at once on the running turn; the command itself then queues like any message.
    auto key = session_of(rec).key();
    if (is_stop_command(rec.input.text)) {
        auto current = impl_->actors.running_turn(key);
        if (!current.empty()) impl_->signal_running(current);
    }
    if (impl_->cl)
        co_return co_await accept_for_cluster(std::move(rec), std::move(req.idem),
                                              std::move(req.on_stored));
    // The slot is taken before the store write so that accept order is run order.
    auto reserved = impl_->actors.reserve(key, ag->config.admission, rec);
    if (auto* err = std::get_if<api_error>(&reserved)) {
        // So does a busy session (`reject`) or a full queue: a client that retries after a lost
        // answer must not be told that its message was refused while its turn runs (found by a
        // new-user check).
        if (!req.idem.key.empty())
            if (auto earlier = co_await find_replay(req)) co_return std::move(*earlier);
        co_return std::move(*err);
    }
    auto [actor, slot, first] = std::get<detail::reservation>(std::move(reserved));
    auto stored_rec = as_stored(rec, first);

    insert_result stored;
    try {
        auto insert = [stored_rec, idem = std::move(req.idem)](store& s) {
            return s.insert_turn(stored_rec, idem);
        };
        stored = co_await fw_.db().run(std::move(insert));
    } catch (const std::exception& e) {
        log::error("cannot store a message", {{"session_id", rec.session_id}, {"error", e.what()}});
        impl_->actors.release(*actor, slot);
        impl_->kick(actor);
        co_return not_stored(e);
    }
    if (stored.outcome != insert_outcome::inserted) {
        impl_->actors.release(*actor, slot);
        impl_->kick(actor);
        co_return earlier_answer(stored, rec.session_id, req.on_stored);
    }
    accepted ok{rec.turn_id, rec.session_id, false};
    if (req.on_stored) req.on_stored(ok);
    // Known before it can start, so that a poll never sees it go back from running to queued.
    impl_->turns.live(rec);
    fw_.metrics().turn_accepted();
    impl_->hub.open(rec.turn_id, session_of(rec))->publish_text("turn.queued", "{}");
    impl_->actors.mark_ready(*actor, slot, first ? &stored_rec : nullptr);
    // Admission mode `interrupt`: the running turn ends `stopped` and this message runs next.
    if (ag->config.admission.mode == admission_mode::interrupt) {
        auto current = impl_->actors.running_turn(key);
        if (!current.empty()) impl_->signal_running(current);
    }
    impl_->kick(actor);
    co_return ok;
}

// Several nodes: the message is stored for whichever node owns its session. When that is this
// node and the session has no other unfinished turn, the store keeps it as this node's (the
// `own` of its answer) and it runs here as on one node: stored running when the session is idle
// here too, no claim and no start of its own to write. Otherwise it waits, queued, for the
// owner's claim (the store tells the owner), and its events reach this node's log by relay.
asio::awaitable<accept_result>
runtime::accept_for_cluster(turn_record rec, idempotency idem,
                            std::function<void(const accepted&)> on_stored) {
    // A place in this node's queue first, as on one node: the turns a claim puts in the queue
    // meanwhile come after it. Not bounded here (admission modes act per node): a place the store
    // does not make this node's is given back.
    static const admission_config unbounded{admission_mode::queue,
                                            std::numeric_limits<std::int64_t>::max()};
    auto reserved = impl_->actors.reserve(session_of(rec).key(), unbounded, rec);
    auto [actor, slot, first] = std::get<detail::reservation>(std::move(reserved));
    auto stored_rec = as_stored(rec, first);
    insert_result stored;
    try {
        auto insert = [stored_rec, idem = std::move(idem)](store& s) {
            return s.insert_turn(stored_rec, idem);
        };
        stored = co_await fw_.db().run(std::move(insert));
    } catch (const std::exception& e) {
        log::error("cannot store a message", {{"session_id", rec.session_id}, {"error", e.what()}});
        impl_->actors.release(*actor, slot);
        impl_->kick(actor);
        co_return not_stored(e);
    }
    bool own = stored.outcome == insert_outcome::inserted && stored.own;
    if (own) {
        std::lock_guard lock(impl_->relay_mutex);
        impl_->mine.emplace(rec.turn_id, session_of(rec));
    } else {
        impl_->actors.release(*actor, slot);
        impl_->kick(actor);
    }
    if (stored.outcome != insert_outcome::inserted)
        co_return earlier_answer(stored, rec.session_id, on_stored);
    accepted ok{stored.turn_id, rec.session_id, false};
    if (on_stored) on_stored(ok);
    if (own) impl_->turns.live(rec);
    fw_.metrics().turn_accepted();
    impl_->hub.open(rec.turn_id, session_of(rec))->publish_text("turn.queued", "{}");
    if (own) {
        impl_->actors.mark_ready(*actor, slot, &stored_rec);
        impl_->kick(actor);
    }
    co_return ok;
}

asio::awaitable<std::optional<turn_record>> runtime::get_turn(std::string turn_id, std::string tenant) {
    auto rec = impl_->turns.find(turn_id);
    if (!rec) {
        auto get = [id = std::move(turn_id)](store& s) { return s.get_turn(id); };
        rec = co_await fw_.db().run(std::move(get));
    }
    if (rec && !tenant.empty() && rec->tenant != tenant) rec.reset();
    co_return rec;
}

asio::awaitable<std::optional<std::string>> runtime::turn_json(std::string turn_id, std::string tenant) {
    std::string out;
    switch (impl_->turns.append_json(turn_id, tenant, out)) {
    case detail::turn_cache::lookup::found:
        co_return out;
    case detail::turn_cache::lookup::other_tenant:
        co_return std::nullopt;
    case detail::turn_cache::lookup::absent:
        break;
    }
    auto rec = co_await get_turn(std::move(turn_id), std::move(tenant));
    if (!rec) co_return std::nullopt;
    co_return baton::turn_json(*rec);
}

asio::awaitable<std::optional<session_view>> runtime::get_session(session_ref session) {
    auto get = [sid = session](store& s) { return s.get_session(sid); };
    auto rec = co_await fw_.db().run(std::move(get));
    if (!rec) co_return std::nullopt;
    session_view v;
    v.record = std::move(*rec);
    auto live = impl_->actors.status(session.key());
    v.busy = live.busy;
    v.queued = live.queued;
    // Several nodes: a session idle here may run on its owner; the database knows. Found by a
    // new user: a node that was not the owner answered busy false, queued 0.
    if (impl_->cl && !v.busy && v.queued == 0) {
        auto ask = [c = impl_->cl, session](store&) { return c->session_activity(session); };
        auto a = co_await fw_.db().run(std::move(ask));
        v.busy = a.busy;
        v.queued = a.queued;
    }
    co_return v;
}

asio::awaitable<std::vector<tape_entry>> runtime::read_tape(session_ref session, std::int64_t after,
                                                            std::size_t limit) {
    auto read = [sid = std::move(session), after, limit](store& s) {
        return s.read_tape(sid, after, limit);
    };
    co_return co_await fw_.db().run(std::move(read));
}

asio::awaitable<std::vector<outbox_item>> runtime::list_outbox(store::outbox_filter filter) {
    auto list = [f = std::move(filter)](store& s) { return s.list_outbox(f); };
    co_return co_await fw_.db().run(std::move(list));
}

asio::awaitable<std::vector<outbox_item>> runtime::enqueue_outbox(std::vector<outbox_item> items) {
    auto add = [items = std::move(items)](store& s) mutable {
        std::vector<outbox_item> added;
        for (auto& o : items) {
            if (o.created_at == 0) o.created_at = now_ms();
            if (s.add_outbox(o)) added.push_back(o); // a copy: this may run again (store_runner::run)
        }
        return added;
    };
    auto added = co_await fw_.db().run(std::move(add));
    for (const auto& o : added)
        if (auto log = impl_->hub.find(o.turn_id))
            log->publish("outbox.enqueued", json::object{{"key", o.key}, {"channel", o.channel}});
    co_return added;
}

asio::awaitable<void> runtime::enqueue_outbox(turn_context& ctx, std::vector<outbox_item> items,
                                              std::function<void(std::vector<outbox_item>)> on_stored) {
    auto* p = ctx.inbound.progress.get();
    if (!p || !p->deferred) {
        auto added = co_await enqueue_outbox(std::move(items));
        if (on_stored) on_stored(std::move(added));
        co_return;
    }
    std::vector<std::string> keys;
    for (auto& o : items) {
        keys.push_back(o.key);
        p->end.outbox.push_back(std::move(o));
    }
    if (!on_stored) co_return;
    p->after_end.push_back([keys = std::move(keys), on_stored = std::move(on_stored)](
                               bool stored, const turn_end&, const std::vector<outbox_item>& added) {
        if (!stored) return;
        std::vector<outbox_item> mine;
        for (const auto& o : added)
            if (std::find(keys.begin(), keys.end(), o.key) != keys.end()) mine.push_back(o);
        if (!mine.empty()) on_stored(std::move(mine));
    });
}

asio::awaitable<bool> runtime::outbox_delivered(std::string key, std::string channel,
                                                std::string tenant) {
    auto mark = [key = std::move(key), channel = std::move(channel),
                 tenant = std::move(tenant)](store& s) {
        auto item = s.get_outbox(key);
        if (!item || (!channel.empty() && item->channel != channel) ||
            (!tenant.empty() && item->tenant != tenant))
            return false;
        if (item->status == outbox_status::delivered) return true;
        item->status = outbox_status::delivered;
        item->attempts += 1;
        return s.update_outbox(*item);
    };
    co_return co_await fw_.db().run(std::move(mark));
}

std::vector<tenant_stats> runtime::tenants() const {
    std::vector<tenant_stats> out;
    for (auto& s : impl_->quotas.snapshot())
        out.push_back({s.tenant, s.running, s.waiting, s.turns_today, s.tokens_today, s.rate_limited,
                       s.quota_exceeded});
    return out;
}

asio::awaitable<tenant_usage> runtime::usage(std::string tenant) {
    auto today = detail::utc_day(impl_->clk->utc_ms());
    auto from = (today - 29) * detail::ms_per_day;
    auto read = [tenant, from](store& s) { return s.usage_by_day(tenant, from); };
    auto rows = co_await fw_.db().run(std::move(read));
    tenant_usage u;
    u.tenant = tenant;
    u.limits = impl_->quotas.limits(tenant);
    for (auto day = today - 29; day <= today; ++day) {
        usage_day d;
        d.date = format_time(day * detail::ms_per_day).substr(0, 10);
        for (const auto& r : rows)
            if (r.day == day) {
                d.turns += r.turns;
                d.prompt_tokens += r.prompt_tokens;
                d.completion_tokens += r.completion_tokens;
            }
        u.days.push_back(std::move(d));
    }
    u.today = u.days.back();
    co_return u;
}

asio::awaitable<std::size_t> runtime::recover() {
    // Today's usage as the store counted it: tokens_per_day holds across a restart.
    {
        auto today = detail::utc_day(impl_->clk->utc_ms());
        auto read = [from = today * detail::ms_per_day](store& s) { return s.usage_by_day("", from); };
        for (const auto& r : co_await fw_.db().run(std::move(read)))
            impl_->quotas.restore_usage(r.tenant, r.day, r.turns, r.prompt_tokens + r.completion_tokens);
    }
    if (auto* c = fw_.db().store().cluster()) {
        // Several nodes: this node's work is what it claims, now and whenever it is told.
        impl_->join_cluster(*c);
        auto n = co_await detail::run_on(impl_->cluster_strand, impl_->claim_once());
        asio::co_spawn(impl_->cluster_strand, impl_->claim_loop(), log::spawn_logger{"cluster claims"});
        co_return n;
    }
    auto list = [](store& s) { return s.unfinished_turns(); };
    auto turns = co_await fw_.db().run(list);
    std::vector<std::shared_ptr<session_actor>> to_kick;
    for (auto& rec : turns) {
        const agent* ag = fw_.find_agent(rec.agent);
        // A turn found running had started; without side effects (no tool call began) it simply
        // runs again, its attempt counted.
        if (rec.status == turn_status::running && rec.side_effects &&
            !(ag && ag->config.rerun_abandoned)) {
            auto end = abandoned_end(rec, "the daemon stopped while this turn was running", now_ms());
            auto finish = [end](store& s) {
                auto e = end; // a batch replayed runs this again: from the same start
                s.end_turn(e);
            };
            co_await fw_.db().run(std::move(finish));
            fw_.metrics().turn_finished(turn_status::failed);
            continue;
        }
        // Queued, or mid-run: without side effects, or under an agent that runs such turns again
        // (`on_abandoned: rerun`).
        if (rec.status == turn_status::running)
            log::info("running a turn again", {{"turn_id", rec.turn_id}, {"attempt", rec.attempt + 1}});
        rec.status = turn_status::queued;
        rec.started_at.reset();
        to_kick.push_back(impl_->actors.requeue(rec));
    }
    for (auto& a : to_kick)
        impl_->kick(a);
    if (!turns.empty()) log::info("recovered unfinished turns", {{"count", turns.size()}});
    co_return turns.size();
}

// ---- Several nodes ----

void runtime::impl::join_cluster(baton::cluster& c) {
    cl = &c;
    claim_timer = std::make_unique<asio::steady_timer>(cluster_strand);
    // Called on the store's thread: each only posts.
    c.subscribe([this] { poke_claim(); }, [this](relayed_event e) { on_relayed(std::move(e)); },
                [this](const std::string& turn_id) { on_watch(turn_id); });
}

void runtime::impl::poke_claim() {
    asio::post(cluster_strand, [this] {
        claim_again = true;
        if (claim_timer) claim_timer->cancel();
    });
}

// Claims when told (a message stored for a session this node owns or that has no owner), and
// every second: a node whose lease expired is taken over within its lease and a second.
asio::awaitable<void> runtime::impl::claim_loop() {
    while (!rt.draining()) {
        if (!claim_again) {
            claim_timer->expires_after(std::chrono::seconds(1));
            boost::system::error_code ec;
            co_await claim_timer->async_wait(asio::redirect_error(asio::use_awaitable, ec));
            if (rt.draining()) break;
        }
        claim_again = false;
        co_await claim_once();
    }
}

// On cluster_strand (one claim at a time, so that a session's turns queue in accept order).
asio::awaitable<std::size_t> runtime::impl::claim_once() {
    claimed_work w;
    try {
        auto claim = [c = cl](store&) { return c->claim(); };
        w = co_await rt.fw_.db().run(std::move(claim));
    } catch (const std::exception& e) {
        log::warn("cannot claim work", {{"error", e.what()}});
        co_return 0;
    }
    std::vector<std::shared_ptr<session_actor>> to_kick;
    for (auto& t : w.turns) {
        auto& rec = t.record;
        if (!t.taken_from.empty())
            log::info(
                "taking over a turn",
                {{"turn_id", rec.turn_id}, {"from", t.taken_from}, {"status", to_string(rec.status)}});
        bool relay = t.accepted_by != cl->node_id();
        if (auto it = watched.find(rec.turn_id); it != watched.end()) {
            relay = true;
            watched.erase(it);
        }
        {
            std::lock_guard lock(relay_mutex);
            mine.emplace(rec.turn_id, session_of(rec));
        }
        if (relay) start_relay(rec.turn_id, session_of(rec), false);
        const agent* ag = rt.fw_.find_agent(rec.agent);
        // A turn its dead node was running: as after a crash (issue 11's semantics).
        if (rec.status == turn_status::running && rec.side_effects &&
            !(ag && ag->config.rerun_abandoned)) {
            auto end = abandoned_end(rec, "the node running this turn stopped", now_ms());
            rec = end.finished.front();
            try {
                auto finish = [end](store& s) {
                    auto e = end; // a batch replayed runs this again: from the same start
                    s.end_turn(e);
                };
                co_await rt.fw_.db().run(std::move(finish));
            } catch (const std::exception& e) {
                log::warn("cannot end a turn taken over",
                          {{"turn_id", rec.turn_id}, {"error", e.what()}});
                continue;
            }
            rt.fw_.metrics().turn_finished(rec.status);
            hub.open(rec.turn_id, session_of(rec))->publish("turn.finished", finished_event_data(rec));
            hub.retire(rec.turn_id);
            {
                std::lock_guard lock(relay_mutex);
                mine.erase(rec.turn_id);
            }
            hand_over(rec);
            continue;
        }
        if (rec.status == turn_status::running)
            log::info("running a turn again", {{"turn_id", rec.turn_id}, {"attempt", rec.attempt + 1}});
        rec.status = turn_status::queued;
        rec.started_at.reset();
        to_kick.push_back(actors.requeue(rec));
    }
    for (auto& a : to_kick)
        kick(a);
    if (!w.outbox.empty()) {
        log::info("took over outbox items", {{"count", w.outbox.size()}});
        if (on_outbox_claimed) on_outbox_claimed(std::move(w.outbox));
    }
    co_return w.turns.size();
}

void runtime::impl::start_relay(const std::string& turn_id, const session_ref& session, bool replay) {
    auto* c = cl;
    auto replay_log = [&] {
        // What it published before: receivers drop the seqs they have.
        if (auto log = hub.find(turn_id))
            for (auto& e : log->read_after(0, std::numeric_limits<std::size_t>::max()).events)
                c->relay({turn_id, session, e->type, e->data, e->seq, {}});
    };
    bool relayed_already = false;
    {
        std::lock_guard lock(relay_mutex);
        relayed_already = relaying.count(turn_id) > 0;
        if (!relayed_already) relaying[turn_id] = {session, 0};
    }
    if (relayed_already) {
        // Relayed already (for the node that accepted it): a new follower still needs the start.
        // Found by a new user, whose reader on a third node got only what came after it connected.
        if (replay) replay_log();
        return;
    }
    auto id = hub.listen(session, [this, c, turn_id](const turn_log& log, const event_ptr& e) {
        if (log.turn_id() != turn_id) return;
        c->relay({log.turn_id(), log.session(), e->type, e->data, e->seq, {}});
        if (e->type == "turn.finished") asio::post(ex, [this, turn_id] { stop_relay(turn_id); });
    });
    {
        std::lock_guard lock(relay_mutex);
        relaying[turn_id].second = id;
    }
    if (replay) replay_log();
}

void runtime::impl::stop_relay(const std::string& turn_id) {
    std::pair<session_ref, std::uint64_t> entry;
    {
        std::lock_guard lock(relay_mutex);
        auto it = relaying.find(turn_id);
        if (it == relaying.end()) return;
        entry = std::move(it->second);
        relaying.erase(it);
    }
    if (entry.second != 0) hub.unlisten(entry.first, entry.second);
}

// On the store's thread: into this node's log of the turn, if it has one, in the runner's order.
void runtime::impl::on_relayed(relayed_event e) {
    asio::post(cluster_strand, [this, e = std::move(e)]() mutable {
        if (e.type == "turn.finished") {
            flush_relayed(e.turn_id, hub.find(e.turn_id).get());
            bool wanted = hub.find(e.turn_id) != nullptr;
            if (!wanted) {
                std::lock_guard lock(waiters_mutex);
                wanted = waiters.count(e.turn_id) > 0;
            }
            if (wanted)
                asio::co_spawn(ex, relayed_end(e.turn_id), log::spawn_logger{"relayed turn end"});
            return;
        }
        auto log = hub.find(e.turn_id);
        if (!log) return;
        if (e.seq == 0) {
            log->publish_text(e.type, std::move(e.data));
            return;
        }
        auto& o = relayed_seen[e.turn_id];
        if (e.seq <= o.seen) return;
        if (o.early.empty()) o.early_since = std::chrono::steady_clock::now();
        o.early.emplace(e.seq, std::pair(std::move(e.type), std::move(e.data)));
        apply_early(o, *log);
    });
}

void runtime::impl::apply_early(relayed_order& o, turn_log& log, bool all) {
    const auto now = std::chrono::steady_clock::now();
    for (;;) {
        while (!o.early.empty() && o.early.begin()->first <= o.seen + 1) {
            auto node = o.early.extract(o.early.begin());
            if (node.key() <= o.seen) continue;
            o.seen = node.key();
            log.publish_text(node.mapped().first, std::move(node.mapped().second));
            o.early_since = now;
        }
        // Bounded: past 1 s (or 4096 events) what is missing is not coming.
        if (o.early.empty() ||
            (!all && now - o.early_since < std::chrono::seconds(1) && o.early.size() <= 4096))
            return;
        o.seen = o.early.begin()->first - 1;
    }
}

void runtime::impl::flush_relayed(const std::string& turn_id, turn_log* log) {
    auto it = relayed_seen.find(turn_id);
    if (it == relayed_seen.end()) return;
    if (log) apply_early(it->second, *log, true);
    relayed_seen.erase(it);
}

// Another node ended a turn this node has a log or waiters for: the stored record tells how.
asio::awaitable<void> runtime::impl::relayed_end(std::string turn_id) {
    auto get = [id = turn_id](store& s) { return s.get_turn(id); };
    std::optional<turn_record> rec;
    try {
        rec = co_await rt.fw_.db().run(std::move(get));
    } catch (const std::exception& e) {
        log::warn("cannot read a turn another node ended", {{"turn_id", turn_id}, {"error", e.what()}});
        co_return;
    }
    if (!rec || !is_terminal(rec->status)) co_return;
    if (auto log = hub.find(turn_id)) {
        log->publish("turn.finished", finished_event_data(*rec));
        hub.retire(turn_id);
    }
    hand_over(*rec);
}

// Another node follows a turn: relayed from here if it is this node's, else once it is claimed.
void runtime::impl::on_watch(const std::string& turn_id) {
    asio::post(cluster_strand, [this, turn_id] {
        std::optional<session_ref> session;
        {
            std::lock_guard lock(relay_mutex);
            if (auto it = mine.find(turn_id); it != mine.end()) session = it->second;
        }
        if (session) {
            start_relay(turn_id, *session, true);
            return;
        }
        auto now = std::chrono::steady_clock::now();
        if (watched.size() > 10000)
            for (auto it = watched.begin(); it != watched.end();)
                it = now - it->second > std::chrono::minutes(10) ? watched.erase(it) : std::next(it);
        watched[turn_id] = now;
    });
}

void runtime::follow(const std::string& turn_id) {
    if (!impl_->cl) return;
    impl_->cl->follow(turn_id);
    asio::co_spawn(impl_->cluster_strand, impl_->follow_end(turn_id), log::spawn_logger{"follow"});
}

// A followed turn may end before its runner hears of the follower (or it ran nowhere yet and
// its runner stops): its end is read from the store every second while the log waits for it.
asio::awaitable<void> runtime::impl::follow_end(std::string turn_id) {
    asio::steady_timer timer(cluster_strand);
    while (!rt.draining()) {
        timer.expires_after(std::chrono::seconds(1));
        boost::system::error_code ec;
        co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        auto log = hub.find(turn_id);
        if (!log || log->read_after(std::numeric_limits<std::int64_t>::max(), 1).finished) co_return;
        // Relayed events that waited past their bound go out even while no other event comes.
        if (auto it = relayed_seen.find(turn_id); it != relayed_seen.end())
            apply_early(it->second, *log);
        auto get = [id = turn_id](store& s) { return s.get_turn(id); };
        std::optional<turn_record> rec;
        try {
            rec = co_await rt.fw_.db().run(std::move(get));
        } catch (const std::exception&) {
            continue;
        }
        if (!rec) co_return;
        if (!is_terminal(rec->status)) continue;
        // Through the relay path's own end, so that it is published once.
        flush_relayed(turn_id, log.get());
        co_await relayed_end(turn_id);
        co_return;
    }
}

void runtime::on_outbox_taken_over(std::function<void(std::vector<outbox_item>)> f) {
    impl_->on_outbox_claimed = std::move(f);
}

std::optional<cluster::stats> runtime::cluster_stats() const {
    if (!impl_->cl) return std::nullopt;
    return impl_->cl->status();
}

asio::awaitable<void> runtime::drain(std::chrono::milliseconds grace) {
    draining_.store(true);
    impl_->release(true);
    asio::post(impl_->idle_strand, [i = impl_.get()] {
        if (i->idle_wait) i->idle_wait->cancel();
    });
    // Shutdown only: a short poll keeps this free of cross-thread timer races.
    asio::steady_timer timer(co_await asio::this_coro::executor);
    auto none_running_within = [&](std::chrono::milliseconds d) -> asio::awaitable<bool> {
        const auto deadline = std::chrono::steady_clock::now() + d;
        while (running_.load() != 0 && std::chrono::steady_clock::now() < deadline) {
            timer.expires_after(std::chrono::milliseconds(10));
            co_await timer.async_wait(asio::use_awaitable);
        }
        co_return running_.load() == 0;
    };
    if (co_await none_running_within(grace)) co_return;
    // The grace ran out: the turns still running stop where they are, and nothing more of them is
    // stored (a crash's outcome: found `running` at the next start). They unwind through their
    // cancellation slots. None may outlive the stop on its executor (the runtime may be destroyed
    // next), so a hook that ignores cancellation is waited for, however long it takes, with a
    // warning every 5 s.
    {
        std::lock_guard lock(impl_->running_mutex);
        for (auto& [id, entry] : impl_->running)
            asio::post(entry->strand, [entry = entry] { entry->stop(running_turn::reason::shutdown); });
    }
    while (!co_await none_running_within(std::chrono::seconds(5))) {
        std::vector<std::string> ids;
        {
            std::lock_guard lock(impl_->running_mutex);
            for (auto& [id, entry] : impl_->running)
                ids.push_back(id);
        }
        log::warn("stopping: waiting for turns whose hooks ignore cancellation",
                  {{"running", running_.load()}, {"turn_ids", json::value_from(ids)}});
    }
}

} // namespace baton
