#include <baton/log.hpp>
#include <baton/runtime.hpp>

#include "src/admission.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <mutex>

namespace baton {

using detail::session_actor;
using detail::turn_slot;

struct runtime::impl {
    impl(asio::any_io_executor e, runtime& r) : ex(std::move(e)), rt(r), actors(ex) {}

    asio::any_io_executor ex;
    runtime& rt;
    detail::actor_registry actors;
    std::mutex observers_mutex;
    std::vector<std::function<void(const turn_record&)>> observers;

    void kick(const std::shared_ptr<session_actor>& a);
    asio::awaitable<void> drain_loop(std::shared_ptr<session_actor> a);
    asio::awaitable<void> run_turn(turn_record rec);
};

runtime::runtime(asio::any_io_executor ex, framework& fw)
    : fw_(fw), impl_(std::make_unique<impl>(std::move(ex), *this)) {}

runtime::~runtime() = default;

std::size_t runtime::live_sessions() const { return impl_->actors.live_sessions(); }

void runtime::on_turn_finished(std::function<void(const turn_record&)> f) {
    std::lock_guard lock(impl_->observers_mutex);
    impl_->observers.push_back(std::move(f));
}

// Starts the session's drainer when it is idle and its head message is stored.
void runtime::impl::kick(const std::shared_ptr<session_actor>& a) {
    if (!actors.claim_drainer(*a, rt.draining())) return;
    auto loop = drain_loop(a);
    asio::co_spawn(a->strand, std::move(loop), log::spawn_logger{"session " + a->session_id});
}

// The session's one consumer: a turn starts only after the previous one has finished.
asio::awaitable<void> runtime::impl::drain_loop(std::shared_ptr<session_actor> a) {
    for (;;) {
        auto next = actors.next_turn(*a, rt.draining());
        if (!next) co_return;
        co_await run_turn(std::move(next->record));
        actors.turn_done(*a);
    }
}

asio::awaitable<void> runtime::impl::run_turn(turn_record rec) {
    auto& db = rt.fw_.db();
    rt.running_.fetch_add(1);
    rec.status = turn_status::running;
    rec.started_at = now_ms();
    try {
        auto mark = [id = rec.turn_id, at = *rec.started_at](store& s) { s.mark_running(id, at); };
        co_await db.run(std::move(mark));

        inbound in;
        in.turn_id = rec.turn_id;
        in.channel = rec.input.channel;
        in.session_id = rec.session_id;
        in.agent = rec.agent;
        in.tenant = rec.tenant;
        in.text = rec.input.text;
        in.metadata = rec.input.metadata;
        in.deliver = rec.input.deliver;
        auto result = co_await rt.fw_.process_inbound(std::move(in));
        rec.status = turn_status::completed;
        rec.reply = std::move(result.reply);
        rec.steps = result.steps;
        rec.usage = result.usage;
    } catch (const turn_error& e) {
        rec.status = turn_status::failed;
        rec.error = error_info{e.code(), e.what()};
    } catch (const boost::system::system_error& e) {
        bool aborted = e.code() == asio::error::operation_aborted;
        rec.status = aborted ? turn_status::stopped : turn_status::failed;
        if (!aborted) rec.error = error_info{"internal_error", e.what()};
    } catch (const std::exception& e) {
        rec.status = turn_status::failed;
        rec.error = error_info{"internal_error", e.what()};
    }
    rec.finished_at = now_ms();
    if (rec.error)
        log::warn(
            "turn failed",
            {{"turn_id", rec.turn_id}, {"code", rec.error->code}, {"message", rec.error->message}});
    try {
        co_await asio::this_coro::reset_cancellation_state();
        auto finish = [rec](store& s) { s.finish_turn(rec); };
        co_await db.run(std::move(finish));
    } catch (const std::exception& e) {
        log::error("cannot store the end of a turn", {{"turn_id", rec.turn_id}, {"error", e.what()}});
    }
    {
        std::lock_guard lock(observers_mutex);
        for (auto& f : observers)
            f(rec);
    }
    rt.running_.fetch_sub(1);
}

asio::awaitable<accept_result> runtime::accept(accept_request req) {
    if (draining()) co_return api_error{errc::draining, "the daemon is shutting down"};
    const agent* ag = fw_.find_agent(req.agent);
    if (!ag) co_return api_error{errc::invalid_request, "unknown agent: " + req.agent};

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

    // The slot is taken before the store write so that accept order is run order.
    auto reserved = impl_->actors.reserve(req.session_id, ag->config.admission, rec);
    if (auto* err = std::get_if<api_error>(&reserved)) co_return std::move(*err);
    auto [actor, slot] = std::get<detail::reservation>(std::move(reserved));

    insert_result stored;
    try {
        auto insert = [rec, idem = std::move(req.idem)](store& s) { return s.insert_turn(rec, idem); };
        stored = co_await fw_.db().run(std::move(insert));
    } catch (const std::exception& e) {
        log::error("cannot store a message", {{"session_id", rec.session_id}, {"error", e.what()}});
        impl_->actors.release(*actor, slot);
        impl_->kick(actor);
        co_return api_error{errc::internal_error, "the message could not be stored"};
    }
    if (stored.outcome != insert_outcome::inserted) {
        impl_->actors.release(*actor, slot);
        impl_->kick(actor);
        if (stored.outcome == insert_outcome::key_reused)
            co_return api_error{errc::idempotency_key_reused,
                                "this Idempotency-Key was already used with another request"};
        co_return accepted{stored.turn_id, rec.session_id, true};
    }
    impl_->actors.mark_ready(*actor, slot);
    impl_->kick(actor);
    co_return accepted{rec.turn_id, rec.session_id, false};
}

asio::awaitable<std::optional<turn_record>> runtime::get_turn(std::string turn_id) {
    auto get = [id = std::move(turn_id)](store& s) { return s.get_turn(id); };
    co_return co_await fw_.db().run(std::move(get));
}

asio::awaitable<std::optional<session_view>> runtime::get_session(std::string session_id) {
    auto get = [sid = session_id](store& s) { return s.get_session(sid); };
    auto rec = co_await fw_.db().run(std::move(get));
    if (!rec) co_return std::nullopt;
    session_view v;
    v.record = std::move(*rec);
    auto live = impl_->actors.status(session_id);
    v.busy = live.busy;
    v.queued = live.queued;
    co_return v;
}

asio::awaitable<std::vector<tape_entry>> runtime::read_tape(std::string session_id, std::int64_t after,
                                                            std::size_t limit) {
    auto read = [sid = std::move(session_id), after, limit](store& s) {
        return s.read_tape(sid, after, limit);
    };
    co_return co_await fw_.db().run(std::move(read));
}

asio::awaitable<std::size_t> runtime::recover() {
    auto list = [](store& s) { return s.unfinished_turns(); };
    auto turns = co_await fw_.db().run(list);
    std::vector<std::shared_ptr<session_actor>> to_kick;
    for (auto& rec : turns) {
        if (rec.status == turn_status::running) {
            rec.status = turn_status::failed;
            rec.error = error_info{"abandoned", "the daemon stopped while this turn was running"};
            rec.finished_at = now_ms();
            auto finish = [rec](store& s) { s.finish_turn(rec); };
            co_await fw_.db().run(std::move(finish));
            continue;
        }
        to_kick.push_back(impl_->actors.requeue(rec));
    }
    for (auto& a : to_kick)
        impl_->kick(a);
    if (!turns.empty()) log::info("recovered unfinished turns", {{"count", turns.size()}});
    co_return turns.size();
}

asio::awaitable<void> runtime::drain(std::chrono::milliseconds grace) {
    draining_.store(true);
    // Shutdown only: a short poll keeps this free of cross-thread timer races.
    asio::steady_timer timer(co_await asio::this_coro::executor);
    auto deadline = std::chrono::steady_clock::now() + grace;
    while (running_.load() != 0 && std::chrono::steady_clock::now() < deadline) {
        timer.expires_after(std::chrono::milliseconds(10));
        co_await timer.async_wait(asio::use_awaitable);
    }
}

} // namespace baton
