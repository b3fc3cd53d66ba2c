#include "channels/telegram/bot_api.hpp"
#include "channels/telegram/channel.hpp"
#include "channels/telegram/inbox.hpp"
#include <baton/detail/async.hpp>

#include <baton/log.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <charconv>

namespace baton::telegram {

namespace {

using time_point = baton::clock::time_point;
using std::chrono::milliseconds;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
const std::string offset_cursor = "telegram.offset";
const std::string pending_cursor = "telegram.pending";

// Runs `a` as a child that no cancellation reaches: admitting and persisting always finish.
template <class T> asio::awaitable<T> uncancellable(asio::awaitable<T> a) {
    auto ex = co_await asio::this_coro::executor;
    co_return co_await asio::co_spawn(
        ex, std::move(a), asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
}

// Cancellation: terminal and partial end it early.
asio::awaitable<void> sleep_until(std::shared_ptr<baton::clock> c, time_point t) {
    baton::timer wait(std::move(c), co_await asio::this_coro::executor, t);
    co_await wait.async_wait(use_tuple);
}

json::object metadata_of(const ready_message& m) {
    const update& first = m.parts.front();
    json::object from;
    if (first.from_id) from["id"] = *first.from_id;
    if (!first.from_username.empty()) from["username"] = first.from_username;
    json::object md{{"update_id", first.update_id},
                    {"message_id", first.message_id},
                    {"chat_id", m.chat_id},
                    {"from", std::move(from)}};
    if (m.parts.size() > 1) {
        json::array updates, messages;
        for (const auto& p : m.parts) {
            updates.push_back(p.update_id);
            messages.push_back(p.message_id);
        }
        md["update_ids"] = std::move(updates);
        md["message_ids"] = std::move(messages);
    }
    return json::object{{"telegram", std::move(md)}};
}

} // namespace

struct poller::impl : std::enable_shared_from_this<impl> {
    impl(asio::any_io_executor ex, runtime& r, std::shared_ptr<http_client> h, options o)
        : strand(asio::make_strand(ex)), rt(r), http(std::move(h)), opts(std::move(o)),
          bot(bot_id(opts.token)), url(method_url(opts.api_base, opts.token, "getUpdates")),
          box(opts.debounce), done(strand, time_point::max()) {
        if (!opts.clock) opts.clock = system_clock();
    }

    asio::strand<asio::any_io_executor> strand;
    runtime& rt;
    std::shared_ptr<http_client> http;
    options opts;
    std::string bot;
    std::string url; // holds the token: never logged
    // The bot's username (getMe, asked once after the first good getUpdates, so that a wrong
    // token is refused by getUpdates alone): what tells a command addressed to it from one
    // addressed to another bot. Empty when not known: every addressed command is taken.
    std::string me;
    bool asked_me = false;
    inbox box;
    // The durable position: every update before it is admitted or held in the pending cursor.
    std::int64_t offset = 0;
    std::string written_pending; // the pending cursor as last written
    bool reload = true;          // state to be read again from the store (start, after a failure)
    milliseconds backoff{0};
    // On the strand only.
    bool started = false, stopping = false, finished = false;
    asio::cancellation_signal stop_signal;
    asio::steady_timer done;
    std::atomic<std::uint64_t> polls{0}, admitted{0};

    void launch();
    asio::awaitable<void> run();
    asio::awaitable<void> halt();
    asio::awaitable<std::optional<milliseconds>> step();
    milliseconds next_backoff() {
        backoff = backoff.count() == 0 ? opts.backoff_min : std::min(backoff * 2, opts.backoff_max);
        return backoff;
    }

    asio::awaitable<bool> recover();
    asio::awaitable<bool> flush_due();
    asio::awaitable<std::optional<poll_result>> get_updates();
    asio::awaitable<std::optional<poll_result>> fetch();
    asio::awaitable<std::optional<milliseconds>> handle(poll_result r);
    asio::awaitable<bool> process(poll_result r);
    asio::awaitable<bool> admit(const ready_message& m);
    asio::awaitable<void> persist(std::int64_t next, std::vector<update> pending);
};

poller::poller(asio::any_io_executor ex, runtime& rt, std::shared_ptr<http_client> http, options o)
    : impl_(std::make_shared<impl>(std::move(ex), rt, std::move(http), std::move(o))) {}

poller::~poller() = default;

std::uint64_t poller::polls() const {
    return impl_->polls.load();
}

std::uint64_t poller::accepted() const {
    return impl_->admitted.load();
}

void poller::start() {
    asio::post(impl_->strand, [self = impl_] { self->launch(); });
}

asio::awaitable<void> poller::stop() {
    co_await baton::detail::run_on(impl_->strand, impl_->halt());
}

void poller::impl::launch() {
    if (started || stopping) return;
    started = true;
    auto done_handler = [self = shared_from_this()](std::exception_ptr e) {
        log::spawn_logger{"telegram poller"}(e);
        self->finished = true;
        self->done.cancel();
    };
    asio::co_spawn(strand, run(),
                   asio::bind_cancellation_slot(stop_signal.slot(), std::move(done_handler)));
}

asio::awaitable<void> poller::impl::halt() {
    stopping = true;
    stop_signal.emit(asio::cancellation_type::terminal);
    if (started && !finished) co_await done.async_wait(use_tuple);
}

asio::awaitable<void> poller::impl::run() {
    // Cancellation (stop) ends the wait in progress; the loop then sees `stopping`.
    co_await asio::this_coro::throw_if_cancelled(false);
    log::info("telegram: polling", {{"agent", opts.agent}, {"debounce_ms", opts.debounce.count()}});
    time_point retry_at{};
    while (!stopping) {
        if (opts.clock->now() < retry_at) {
            auto until = retry_at;
            if (auto d = box.next_deadline(); d && !reload) until = std::min(until, *d);
            co_await sleep_until(opts.clock, until);
            if (!reload && !stopping && !co_await uncancellable(flush_due())) {
                reload = true;
                retry_at = opts.clock->now() + next_backoff();
            }
            continue;
        }
        std::optional<milliseconds> failed;
        try {
            failed = co_await step();
        } catch (const std::exception& e) {
            log::error("telegram: polling step failed", {{"error", e.what()}});
            reload = true;
            failed = next_backoff();
        }
        if (failed) retry_at = opts.clock->now() + *failed;
    }
    log::info("telegram: stopped polling");
}

// One round: state from the store when needed, due debounce buffers, one getUpdates and what it
// brought. Returns how long to wait before the next getUpdates when something failed.
asio::awaitable<std::optional<milliseconds>> poller::impl::step() {
    if (reload) {
        if (!co_await uncancellable(recover())) co_return next_backoff();
        reload = false;
    }
    if (!co_await uncancellable(flush_due())) {
        reload = true;
        co_return next_backoff();
    }
    if (stopping) co_return std::nullopt;
    auto got = co_await fetch();
    if (!got || stopping) co_return std::nullopt; // a debounce deadline came first, or stop
    co_return co_await handle(std::move(*got));
}

// Reads the cursors and admits what the last process held for debounce (at once: a restart does
// not wait for more).
asio::awaitable<bool> poller::impl::recover() {
    box = inbox(opts.debounce);
    std::vector<std::string> names{offset_cursor, pending_cursor}; // named: GCC 12 coroutine bug
    auto got = co_await rt.read_cursors(std::move(names));
    if (!got) throw boost::system::system_error(got.error(), "telegram: cannot read its cursors");
    auto off = std::move((*got)[0]), pend = std::move((*got)[1]);
    offset = 0;
    std::vector<update> pending;
    boost::system::error_code ec;
    json::value p = pend ? json::parse(*pend, ec) : json::value();
    const json::object* po = ec ? nullptr : p.if_object();
    const json::value* stored_bot = po ? po->if_contains("bot") : nullptr;
    if (stored_bot && stored_bot->is_string() && stored_bot->get_string() != bot) {
        log::warn("telegram: the bot changed since the last run; starting at its oldest update");
    } else if (off) {
        std::from_chars(off->data(), off->data() + off->size(), offset);
        if (const json::value* ups = po ? po->if_contains("updates") : nullptr; ups && ups->is_array())
            for (const auto& u : ups->get_array())
                if (auto parsed = update_from_json(u)) pending.push_back(std::move(*parsed));
    }
    written_pending = pend.value_or("");
    for (const auto& m : inbox::group(pending))
        if (!co_await admit(m)) co_return false;
    co_await persist(offset, {});
    co_return true;
}

asio::awaitable<bool> poller::impl::flush_due() {
    auto ready = box.due(opts.clock->now());
    if (ready.empty()) co_return true;
    for (const auto& m : ready)
        if (!co_await admit(m)) co_return false;
    co_await persist(offset, box.buffered());
    co_return true;
}

// Cancellation: a terminal cancellation aborts the request (nullopt).
asio::awaitable<std::optional<poll_result>> poller::impl::get_updates() {
    auto body = get_updates_body(offset, opts.poll_timeout.count());
    // Named first: GCC 12 cannot keep an initializer list alive across a co_await.
    http_headers headers{{"Content-Type", "application/json"}};
    auto [ec, res] = co_await http->request("POST", url, std::move(headers), std::move(body),
                                            opts.poll_timeout + std::chrono::seconds(10));
    if (ec == asio::error::operation_aborted) co_return std::nullopt;
    polls.fetch_add(1);
    if (ec) {
        poll_result r;
        r.what = poll_result::kind::retry;
        r.error = "getUpdates: " + ec.message(); // never the URL: it holds the token
        co_return r;
    }
    co_return parse_get_updates(res.status, res.body);
}

// The long poll, cut short by the next debounce deadline (the request is then abandoned: the
// offset it asked for was already durable, so nothing is confirmed that is not stored).
asio::awaitable<std::optional<poll_result>> poller::impl::fetch() {
    using namespace asio::experimental::awaitable_operators;
    auto deadline = box.next_deadline();
    if (!deadline) co_return co_await get_updates();
    auto r = co_await (get_updates() || sleep_until(opts.clock, *deadline));
    if (r.index() == 0) co_return std::get<0>(std::move(r));
    co_return std::nullopt;
}

asio::awaitable<std::optional<milliseconds>> poller::impl::handle(poll_result r) {
    switch (r.what) {
    case poll_result::kind::unauthorized:
        log::error("telegram: the Bot API refused the bot token; check the variable named by "
                   "channels.telegram.token_env",
                   {{"error", r.error}});
        backoff = opts.backoff_max;
        co_return opts.backoff_max;
    case poll_result::kind::retry: {
        auto wait = next_backoff();
        if (r.retry_after) wait = std::max<milliseconds>(*r.retry_after, milliseconds(0));
        log::warn("telegram: getUpdates failed", {{"error", r.error}, {"retry_in_ms", wait.count()}});
        co_return wait;
    }
    case poll_result::kind::ok:
        break;
    }
    backoff = milliseconds(0);
    if (!asked_me) {
        asked_me = true;
        http_headers headers{{"Content-Type", "application/json"}};
        auto [ec, res] = co_await http->request("POST", method_url(opts.api_base, opts.token, "getMe"),
                                                std::move(headers), "{}", std::chrono::seconds(10));
        if (ec == asio::error::operation_aborted) co_return std::nullopt;
        if (!ec) me = parse_get_me(res.status, res.body);
    }
    // A command addressed to another bot is not this one's: it only moves the offset.
    std::erase_if(r.updates, [this](update& u) {
        auto text = addressed_text(u.text, me);
        if (!text) return true;
        u.text = std::move(*text);
        return false;
    });
    if (!co_await uncancellable(process(std::move(r)))) {
        reload = true;
        co_return next_backoff();
    }
    co_return std::nullopt;
}

// Admits the batch's messages in order, then makes the new offset and the held updates durable
// together. False when a message could not be stored (the caller goes back to the durable state).
asio::awaitable<bool> poller::impl::process(poll_result r) {
    auto now = opts.clock->now();
    std::int64_t next = std::max(offset, r.next_offset);
    for (auto& u : r.updates) {
        if (u.update_id < offset) continue; // handled before
        if (!allowed(opts, u.chat_id)) {
            log::info("telegram: message from a chat not in allow_chats ignored",
                      {{"chat_id", u.chat_id}, {"update_id", u.update_id}});
            continue;
        }
        auto id = u.update_id;
        for (auto& m : box.add(std::move(u), now)) {
            // A buffer flushed by a command is made durable as it is joined first, so that a
            // restart admits the very same message (same key, same text).
            if (m.parts.size() > 1 && m.parts.back().update_id >= offset) {
                auto held = box.buffered();
                held.insert(held.end(), m.parts.begin(), m.parts.end());
                co_await persist(id, std::move(held));
            }
            if (!co_await admit(m)) co_return false;
        }
    }
    co_await persist(next, box.buffered());
    co_return true;
}

asio::awaitable<bool> poller::impl::admit(const ready_message& m) {
    const update& first = m.parts.front();
    accept_request req;
    req.session_id = "telegram:" + m.chat_id;
    req.agent = opts.agent;
    req.tenant = opts.tenant;
    req.channel = "telegram";
    req.text = m.text();
    req.metadata = metadata_of(m);
    req.deliver = json::object{{"channel", "telegram"}, {"to", m.chat_id}};
    // A space: no HTTP Idempotency-Key can look like this one.
    req.idem.key = "telegram update " + bot + ":" + std::to_string(first.update_id);
    req.idem.fingerprint = sha256_hex(req.session_id + "\n" + req.text);
    auto result = co_await rt.accept(std::move(req));
    json::object fields{{"chat_id", m.chat_id}, {"update_id", first.update_id}};
    if (result) {
        admitted.fetch_add(1);
        fields["turn_id"] = result->turn_id;
        fields["replayed"] = result->replayed;
        log::debug("telegram: message accepted", std::move(fields));
        co_return true;
    }
    const auto& err = result.error();
    fields["code"] = code_name(err.code);
    fields["message"] = err.message;
    switch (err.code) {
    case errc::draining:
    case errc::internal_error:
    // A full session queue (or daemon) has room again once a turn ends: the message and those
    // after it wait, unconfirmed, and are fetched again after backoff_min. A chat cannot answer
    // a 429 by sending again later, so dropping it would lose it.
    case errc::session_queue_full:
    case errc::overloaded:
        log::warn("telegram: message not stored; it will be fetched again", std::move(fields));
        co_return false;
    default:
        // An unknown agent or channel: retrying the same message cannot help.
        log::warn("telegram: message dropped", std::move(fields));
        co_return true;
    }
}

asio::awaitable<void> poller::impl::persist(std::int64_t next, std::vector<update> pending) {
    json::array held;
    for (const auto& u : pending)
        held.push_back(to_json(u));
    auto value = json::serialize(json::object{{"bot", bot}, {"updates", std::move(held)}});
    if (next == offset && value == written_pending) co_return;
    std::vector<std::pair<std::string, std::string>> values{{offset_cursor, std::to_string(next)},
                                                            {pending_cursor, value}};
    if (auto ec = co_await rt.write_cursors(std::move(values)))
        throw boost::system::system_error(ec, "telegram: cannot write its cursors");
    offset = next;
    written_pending = std::move(value);
}

} // namespace baton::telegram
