#include <baton/channels.hpp>
#include <baton/delivery.hpp>
#include <baton/log.hpp>
#include <baton/openai_client.hpp>
#include <baton/pipeline.hpp>
#include <baton/service.hpp>
#include <baton/store.hpp>
#include <baton/store_runner.hpp>
#include <baton/strand.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace baton {

namespace {
using boost::system::error_code;
using detail::nothing;
using detail::outcome;

std::shared_ptr<model_client> make_model(asio::any_io_executor ex, const agent_config& a,
                                         const std::shared_ptr<http_client>& http) {
    if (a.model.provider == "echo") return make_echo_model();
    if (a.model.provider == "openai") return make_openai_model(ex, a.model, http);
    throw std::invalid_argument("agents." + a.name + ".model.provider: unknown provider " +
                                a.model.provider);
}

std::shared_ptr<store> open_store(const config& cfg,
                                  std::function<void(const std::string&)> on_lease_lost) {
    switch (cfg.storage.type) {
    case storage_config::kind::memory:
        return make_memory_store();
    case storage_config::kind::postgres: {
        postgres_options o;
        o.conninfo = cfg.storage.postgres_conninfo;
        if (!cfg.storage.postgres_conninfo_env.empty()) {
            const char* v = std::getenv(cfg.storage.postgres_conninfo_env.c_str());
            if (!v || !*v)
                throw std::invalid_argument("storage.postgres.conninfo_env: the environment variable " +
                                            cfg.storage.postgres_conninfo_env +
                                            (v ? " is empty" : " is not set"));
            o.conninfo = v;
        }
        o.pool_size = static_cast<std::size_t>(cfg.storage.postgres_pool_size);
        o.connect_timeout = cfg.storage.postgres_connect_timeout;
        o.query_timeout = cfg.storage.postgres_query_timeout;
        o.cluster = cfg.storage.postgres_cluster;
        o.lease = cfg.storage.postgres_lease;
        o.node_id = cfg.storage.postgres_node_id;
        o.on_lease_lost = std::move(on_lease_lost);
        return make_postgres_store(o);
    }
    case storage_config::kind::sqlite:
        break;
    }
    return make_sqlite_store({cfg.storage.sqlite_path, cfg.storage.sqlite_synchronous});
}

template <class T> outcome<T> failure(errc e, std::string message, diagnostics* diag) {
    if (diag) diag->assign(std::move(message));
    return {make_error_code(e), {}};
}

} // namespace

struct service::impl : channel_host {
    impl(asio::any_io_executor e, service_options o) : ex(std::move(e)), opts(std::move(o)) {}

    asio::any_io_executor ex;
    service_options opts;
    std::string init_error; // what the constructor could not build
    errc init_errc = errc::internal_error;
    std::unique_ptr<store_runner> db;
    std::unique_ptr<baton::framework> fw;
    std::shared_ptr<http_client> http;
    std::unique_ptr<baton::runtime> rt;
    std::unique_ptr<delivery> outbox;
    std::vector<std::shared_ptr<channel>> channels;
    std::shared_ptr<http_channel> http_ch;
    enum class phase { built, starting, running, stopping, stopped };
    std::atomic<phase> state{phase::built}; // read by wait_turn, which any thread may call

    // channel_host
    asio::any_io_executor get_executor() const override { return ex; }
    const baton::config& config() const override { return opts.config; }
    baton::runtime& runtime() override { return *rt; }
    void add_plugin(plugin p) override { fw->register_plugin(std::move(p)); }
    void add_outbound(std::shared_ptr<outbound_channel> c) override {
        outbox->add_channel(std::move(c));
    }

    // stop() or close() on every channel; one that fails is logged and the others go on.
    // How far async_start got: channels[0, attached) were attached, [0, started) started. A start
    // that failed part way is stopped (stop, close) only as far as it went.
    std::size_t attached = 0, started = 0;
    asio::awaitable<void> each_channel(asio::awaitable<void> (channel::*step)(), std::size_t n,
                                       const char* failed) {
        for (std::size_t k = 0; k < n && k < channels.size(); ++k) {
            auto& c = channels[k];
            try {
                co_await ((*c).*step)();
            } catch (const std::exception& e) {
                log::error(failed, {{"channel", std::string(c->name())}, {"error", e.what()}});
            }
        }
    }
};

service::service(asio::any_io_executor ex, service_options opts)
    : impl_(std::make_unique<impl>(std::move(ex), std::move(opts))) {
    auto& i = *impl_;
    const auto& cfg = i.opts.config;
    try {
        i.db = std::make_unique<store_runner>(open_store(cfg, i.opts.on_lease_lost));
    } catch (const std::exception& e) {
        // A framework over an empty memory store keeps the members usable; start() refuses.
        i.init_error = e.what();
        i.db = std::make_unique<store_runner>(make_memory_store());
    }
    i.fw = std::make_unique<baton::framework>(*i.db);
    i.fw->register_plugin(make_default_plugin(*i.db));
    i.http = std::make_shared<http_client>(i.ex);
    for (auto& [name, a] : cfg.agents) {
        try {
            i.fw->add_agent(agent{a, make_model(i.ex, a, i.http)});
        } catch (const std::exception& e) {
            if (i.init_error.empty()) i.init_error = e.what(), i.init_errc = errc::invalid_config;
        }
    }
    for (auto& [name, t] : cfg.tools)
        i.fw->tools().add(make_http_tool(name, t, i.http));
    runtime_options ro;
    ro.events.events_per_turn = static_cast<std::size_t>(cfg.server.events_per_turn);
    ro.clock = i.opts.clock;
    for (const auto& [name, t] : cfg.tenants)
        ro.tenants[name] = t.limits;
    i.rt = std::make_unique<baton::runtime>(i.ex, *i.fw, ro);
    delivery_options delivery_opts;
    delivery_opts.clock = i.rt->clock();
    i.outbox = std::make_unique<delivery>(i.ex, *i.rt, delivery_opts);
    // The channels the config enables, in the order they start.
    bool others = i.opts.channels;
    if (others && !cfg.channels.schedules.empty()) add_channel(make_schedule_channel());
    if (i.opts.http) {
        i.http_ch = make_http_channel();
        add_channel(i.http_ch);
    }
    if (others && !cfg.channels.webhook_targets.empty()) add_channel(make_webhook_channel(i.http));
    if (others && cfg.channels.telegram_token_env) add_channel(make_telegram_channel(i.http));
}

// The members go in reverse: channels, delivery, runtime, framework, then the store runner (its
// destructor runs what is queued and joins its thread).
service::~service() = default;

asio::any_io_executor service::get_executor() const {
    return impl_->ex;
}
const baton::config& service::config() const {
    return impl_->opts.config;
}
void service::add_plugin(plugin p) {
    impl_->fw->register_plugin(std::move(p));
}
void service::add_tool(std::shared_ptr<tool> t) {
    impl_->fw->tools().add(std::move(t));
}
void service::add_agent(agent_config a, std::shared_ptr<model_client> model) {
    impl_->fw->add_agent(agent{std::move(a), std::move(model)});
}
void service::add_channel(std::shared_ptr<channel> c) {
    impl_->channels.push_back(std::move(c));
}
baton::framework& service::framework() {
    return *impl_->fw;
}
baton::runtime& service::runtime() {
    return *impl_->rt;
}
asio::ip::tcp::endpoint service::local_endpoint() const {
    return impl_->http_ch ? impl_->http_ch->local_endpoint() : asio::ip::tcp::endpoint{};
}
bool service::running() const {
    return impl_->state == impl::phase::running;
}

asio::any_io_executor service::new_strand() const {
    return detail::make_thin_strand(impl_->ex);
}

asio::awaitable<outcome<nothing>> service::start(diagnostics* diag) {
    auto& i = *impl_;
    if (diag) diag->clear();
    if (i.state != impl::phase::built)
        co_return failure<nothing>(errc::invalid_request, "the service was started already", diag);
    // A store that cannot be opened: internal_error (`baton serve` exits 1, as it always has); a
    // model client the config cannot make: invalid_config.
    if (!i.init_error.empty()) co_return failure<nothing>(i.init_errc, i.init_error, diag);
    const auto& cfg = i.opts.config;
    if (i.opts.http && !valid_listen_address(cfg.server.listen))
        co_return failure<nothing>(errc::invalid_config,
                                   "server.listen: expected IP:PORT (an IPv4 address, [IPv6] or "
                                   "localhost; port 0..65535), not " +
                                       cfg.server.listen,
                                   diag);
    // With tokens every /v1 call is authenticated: any address may be listened on.
    if (i.opts.http && cfg.server.tokens.empty() && !loopback_listen_address(cfg.server.listen) &&
        !i.opts.allow_unauthenticated_remote)
        co_return failure<nothing>(
            errc::invalid_config,
            "refusing to listen on " + cfg.server.listen +
                " without server.tokens; pass --insecure-no-auth (baton serve) or set "
                "service_options::allow_unauthenticated_remote to allow it",
            diag);
    i.state = impl::phase::starting;
    std::string step = "attaching the channels";
    try {
        for (auto& c : i.channels) {
            step = std::string("channel ") + std::string(c->name());
            c->attach(i);
            ++i.attached;
        }
        // Last: the outbox takes the items of the pushing channels before any other hook.
        i.fw->register_plugin(i.outbox->make_plugin());
        // Items left by the last process first (sending -> uncertain), then the turns it left.
        step = "recovering the outbox";
        co_await i.outbox->start();
        step = "recovering turns";
        co_await i.rt->recover();
        for (auto& c : i.channels) {
            step = std::string("starting channel ") + std::string(c->name());
            co_await c->start();
            ++i.started;
        }
    } catch (const std::invalid_argument& e) {
        // The state stays `starting`: async_stop() stops what had started.
        co_return failure<nothing>(errc::invalid_config, step + ": " + e.what(), diag);
    } catch (const std::exception& e) {
        log::error("start failed", {{"step", step}, {"error", e.what()}});
        co_return failure<nothing>(errc::internal_error, step + ": " + e.what(), diag);
    }
    i.state = impl::phase::running;
    co_return outcome<nothing>{};
}

asio::awaitable<outcome<nothing>> service::stop() {
    auto& i = *impl_;
    if (i.state != impl::phase::running && i.state != impl::phase::starting) {
        i.state = impl::phase::stopped;
        co_return outcome<nothing>{};
    }
    i.state = impl::phase::stopping;
    log::info("draining", {{"running_turns", i.rt->running_turns()}});
    co_await i.each_channel(&channel::stop, i.started, "stopping a channel failed");
    try {
        co_await i.rt->drain(i.opts.drain_grace);
    } catch (const std::exception& e) {
        log::error("drain failed", {{"error", e.what()}});
    }
    co_await i.each_channel(&channel::close, i.attached, "closing a channel failed");
    try {
        co_await i.outbox->stop(i.opts.delivery_grace);
    } catch (const std::exception& e) {
        log::error("stopping delivery failed", {{"error", e.what()}});
    }
    i.rt->release_waiters();
    i.state = impl::phase::stopped;
    co_return outcome<nothing>{};
}

asio::awaitable<outcome<accepted>> service::submit(accept_request m, diagnostics* diag) {
    if (diag) diag->clear();
    auto r = co_await impl_->rt->accept(std::move(m));
    if (r) co_return outcome<accepted>{{}, std::move(*r)};
    auto e = r.error();
    co_return failure<accepted>(e.code, std::move(e.message), diag);
}

// A store that fails (a full disk, an I/O error) is an expected failure: internal_error, or
// store_unavailable when its database cannot be reached (a retry may pass).
namespace {
boost::system::error_code store_failure(const std::exception& e) {
    return make_error_code(dynamic_cast<const store_unavailable*>(&e) ? errc::store_unavailable
                                                                      : errc::internal_error);
}
} // namespace

asio::awaitable<outcome<turn_record>> service::get_turn(std::string turn_id) {
    std::optional<turn_record> rec;
    try {
        rec = co_await impl_->rt->get_turn(std::move(turn_id));
    } catch (const std::exception& e) {
        log::error("store call failed", {{"error", e.what()}});
        co_return outcome<turn_record>{store_failure(e), {}};
    }
    if (!rec) co_return outcome<turn_record>{make_error_code(errc::not_found), {}};
    co_return outcome<turn_record>{{}, std::move(*rec)};
}

asio::awaitable<outcome<turn_record>> service::wait_turn(std::string turn_id) {
    co_await detail::accept_partial_cancellation();
    std::optional<turn_record> rec;
    try {
        // Once stopped no turn ends any more here: the record as it stands (draining if unfinished).
        std::optional<clock::duration> up_to;
        if (impl_->state.load() == impl::phase::stopped) up_to = clock::duration::zero();
        rec = co_await impl_->rt->wait_turn(std::move(turn_id), {}, up_to);
    } catch (const boost::system::system_error& e) {
        if (e.code() == asio::error::operation_aborted)
            co_return outcome<turn_record>{make_error_code(asio::error::operation_aborted), {}};
        log::error("store call failed", {{"error", e.what()}});
        co_return outcome<turn_record>{make_error_code(errc::internal_error), {}};
    } catch (const std::exception& e) {
        log::error("store call failed", {{"error", e.what()}});
        co_return outcome<turn_record>{store_failure(e), {}};
    }
    if (!rec) co_return outcome<turn_record>{make_error_code(errc::not_found), {}};
    // Released by stop() before the turn ended.
    if (!is_terminal(rec->status)) co_return outcome<turn_record>{make_error_code(errc::draining), {}};
    co_return outcome<turn_record>{{}, std::move(*rec)};
}

asio::awaitable<outcome<std::vector<tape_entry>>>
service::read_tape(session_ref session_id, std::int64_t after, std::size_t limit) {
    using out = outcome<std::vector<tape_entry>>;
    if (limit < 1 || limit > 1000) co_return out{make_error_code(errc::invalid_request), {}};
    std::vector<tape_entry> entries;
    try {
        auto session = co_await impl_->rt->get_session(session_id);
        if (!session) co_return out{make_error_code(errc::not_found), {}};
        entries = co_await impl_->rt->read_tape(std::move(session_id), after, limit);
    } catch (const std::exception& e) {
        log::error("store call failed", {{"error", e.what()}});
        co_return out{store_failure(e), {}};
    }
    co_return out{{}, std::move(entries)};
}

asio::awaitable<outcome<nothing>> service::cancel(std::string turn_id) {
    std::optional<api_error> e;
    try {
        e = co_await impl_->rt->cancel(std::move(turn_id));
    } catch (const std::exception& ex) {
        log::error("store call failed", {{"error", ex.what()}});
        co_return outcome<nothing>{store_failure(ex), {}};
    }
    if (e) co_return outcome<nothing>{make_error_code(e->code), {}};
    co_return outcome<nothing>{};
}

// --- subscriptions ---

struct service::subscription::state {
    explicit state(asio::any_io_executor s) : strand(s), timer(s) {}
    asio::any_io_executor strand;
    asio::steady_timer timer; // woken (cancelled) on the strand when something arrives
    std::mutex mutex;
    std::deque<service_event> queue;
    std::uint64_t dropped = 0;
    bool closed = false;
    // A session's subscription: its listener in the hub.
    event_hub* hub = nullptr;
    session_ref session_id;
    std::uint64_t listener = 0;
    // A turn's: its log, read after `after`.
    std::shared_ptr<turn_log> log;
    std::int64_t after = 0;
    bool finished = false; // turn.finished is queued or handed over

    void end() {
        std::lock_guard lock(mutex);
        if (closed) return;
        closed = true;
        if (hub && listener) hub->unlisten(session_id, listener);
        listener = 0;
    }
};

service::subscription::subscription(std::shared_ptr<state> s) : state_(std::move(s)) {}
service::subscription::subscription(subscription&&) noexcept = default;
service::subscription& service::subscription::operator=(subscription&& o) noexcept {
    if (this != &o) {
        close();
        state_ = std::move(o.state_);
    }
    return *this;
}
service::subscription::~subscription() {
    close();
}
void service::subscription::close() {
    if (!state_) return;
    state_->end();
    // Wakes a reader (which then sees `closed`); the state lives until its handlers have run.
    asio::post(state_->strand, [s = state_] { s->timer.cancel(); });
}
std::uint64_t service::subscription::gap() const {
    std::lock_guard lock(state_->mutex);
    return state_->dropped;
}
asio::any_io_executor service::subscription::executor() const {
    return state_->strand;
}

asio::awaitable<outcome<service_event>> service::subscription::next() {
    using out = outcome<service_event>;
    co_await detail::accept_partial_cancellation();
    auto s = state_;
    for (;;) {
        if (s->log) {
            // Reads what is new; the log calls the waker (once) on its next publish.
            std::weak_ptr<state> weak = s;
            auto r = s->log->read_after(s->after, 256, [weak] {
                if (auto st = weak.lock()) asio::post(st->strand, [st] { st->timer.cancel(); });
            });
            std::lock_guard lock(s->mutex);
            if (r.gap_from) s->dropped += static_cast<std::uint64_t>(r.gap_to - *r.gap_from + 1);
            for (auto& e : r.events) {
                s->after = e->seq;
                if (e->type == "turn.finished") s->finished = true;
                s->queue.push_back({s->log->turn_id(), s->log->session_id(), std::move(e)});
            }
        }
        {
            std::lock_guard lock(s->mutex);
            if (!s->queue.empty()) {
                auto e = std::move(s->queue.front());
                s->queue.pop_front();
                co_return out{{}, std::move(e)};
            }
            if (s->closed || (s->log && s->finished))
                co_return out{make_error_code(asio::error::eof), {}};
        }
        if (co_await detail::cancelled())
            co_return out{make_error_code(asio::error::operation_aborted), {}};
        s->timer.expires_at(asio::steady_timer::time_point::max());
        co_await s->timer.async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

service::subscription service::subscribe_session(const session_ref& session_id) {
    auto s = std::make_shared<subscription::state>(detail::make_thin_strand(impl_->ex));
    s->hub = &impl_->rt->events();
    s->session_id = session_id;
    std::weak_ptr<subscription::state> weak = s;
    s->listener = s->hub->listen(session_id, [weak](const turn_log& log, const event_ptr& e) {
        auto st = weak.lock();
        if (!st) return;
        {
            std::lock_guard lock(st->mutex);
            if (st->closed) return;
            if (st->queue.size() >= 4096) {
                st->queue.pop_front();
                ++st->dropped;
            }
            st->queue.push_back({log.turn_id(), log.session_id(), e});
        }
        asio::post(st->strand, [st] { st->timer.cancel(); });
    });
    return subscription(std::move(s));
}

service::subscription service::subscribe_turn(const std::string& turn_id, error_code& ec) {
    auto s = std::make_shared<subscription::state>(detail::make_thin_strand(impl_->ex));
    s->log = impl_->rt->events().find(turn_id);
    ec = s->log ? error_code{} : make_error_code(errc::not_found);
    if (!s->log) s->closed = true;
    return subscription(std::move(s));
}

} // namespace baton
