// baton's one entry point. A service is built on the host's executor from a config (the daemon's
// JSON config, or one filled in from code) and owns every part a turn stands on: the store and its
// runner, the framework with the default pipeline, the runtime, the outbox's delivery and the
// channels. async_start() recovers what an earlier process left and starts the channels;
// async_stop() drains. `baton serve` is a thin main over it (src/app/serve.cpp).
//
// Threads: the service runs on the executor it is given and starts no threads of its own, with
// one exception: a SQLite or PostgreSQL store runs its calls on one thread of its own
// (store_runner), so that no disk write or database round trip ever blocks an I/O thread (the
// PostgreSQL store keeps one more for its connections). The memory store runs none.
//
// Every async_* member takes any completion token (use_awaitable, use_future, deferred, a
// callback) and completes through the handler's associated executor. Expected failures come as a
// baton::errc in the error_code (its message() is the snake_case code of docs/api.md); with a
// `diagnostics&` the sentence that explains it is there too. Exceptions are bugs.
#pragma once

#include <baton/channel.hpp>
#include <baton/clock.hpp>
#include <baton/config.hpp>
#include <baton/detail/async.hpp>
#include <baton/errors.hpp>
#include <baton/framework.hpp>
#include <baton/runtime.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <memory>
#include <string>
#include <vector>

namespace baton {

struct service_options {
    baton::config config = default_config();
    // Serve the HTTP API, SSE and WebSocket on config.server.listen. Off: no socket is opened;
    // the program talks to the service through its members.
    bool http = true;
    // Add the other channels the config enables (schedules, webhook, Telegram). Off: none; the
    // program adds its own with add_channel().
    bool channels = true;
    // Listen on a non-loopback address although no tokens are configured (--insecure-no-auth).
    bool allow_unauthenticated_remote = false;
    // How long async_stop() lets running turns finish, and then the outbox's sends in flight.
    std::chrono::milliseconds drain_grace{10000};
    std::chrono::milliseconds delivery_grace{5000};
    // What the timers that decide behaviour run on: schedules, the Telegram debounce and
    // backoff, outbox retries, idle compaction (runtime::clock()). Tests pass a manual_clock.
    std::shared_ptr<baton::clock> clock = system_clock();
    // Several nodes on PostgreSQL (storage.postgres.cluster): called once, on the store's thread,
    // when this node finds its lease expired. Its work belongs to other nodes by then and the
    // store refuses every call; `baton serve` exits (code 3). Unset: the service stays up,
    // answering 503 store_unavailable, until it is stopped.
    std::function<void(const std::string& why)> on_lease_lost;
};

// One of a turn's events, as a subscription hands it over.
struct service_event {
    std::string turn_id;
    std::string session_id;
    event_ptr event; // seq, type, data (docs/api.md "Turn events")
};

class service {
public:
    // Builds every part from the options; nothing runs and no socket opens until async_start().
    // A config the daemon would refuse (an unknown provider, a bad listen address: invalid_config)
    // and a store that cannot be opened (internal_error) are reported by async_start(), with the
    // reason in `diagnostics`.
    service(boost::asio::any_io_executor ex, service_options opts);
    ~service();
    service(const service&) = delete;
    service& operator=(const service&) = delete;

    boost::asio::any_io_executor get_executor() const;
    const baton::config& config() const;

    // --- Before async_start(): one line each to add a part. ---
    // Stage hooks and agent-loop hooks (docs/hooks.md); registered after the default pipeline,
    // so they override it.
    void add_plugin(plugin p);
    // A tool an agent may call when its config lists the tool's name.
    void add_tool(std::shared_ptr<tool> t);
    // An agent with its own model client (replaces a configured agent of the same name).
    void add_agent(agent_config a, std::shared_ptr<model_client> model);
    // A channel (docs/channels.md): started after recovery, stopped before the drain.
    void add_channel(std::shared_ptr<channel> c);
    // The framework and runtime underneath, for what the members here do not cover.
    baton::framework& framework();
    baton::runtime& runtime();

    // --- Start and stop. ---
    // What `baton serve` does before it says "listening": opens the store, recovers the outbox
    // (items left `sending` go out again `uncertain`) and the turns an earlier process left,
    // then starts the schedules, the HTTP listener and the channels, in that order.
    // Handler: void(error_code). Errors: errc::invalid_config (with diagnostics), errc::internal_error
    // (recovery failed, the listener could not bind). Cancellation: none. After a failure, call
    // async_stop() to stop what had started, as far as it went: recovered turns drain, a channel
    // is stopped if it had started and closed if it had been attached, one never attached is left.
    template <class Token> auto async_start(Token&& token) {
        return detail::async_run<detail::nothing>(get_executor(), start(nullptr),
                                                  std::forward<Token>(token));
    }
    template <class Token> auto async_start(diagnostics& diag, Token&& token) {
        return detail::async_run<detail::nothing>(get_executor(), start(&diag),
                                                  std::forward<Token>(token));
    }
    // Stops the channels (no new messages), drains (running turns finish within drain_grace;
    // queued ones stay stored for the next start; one still running then is stopped and left
    // `running` in the store, as a crash leaves it), then closes the channels' connections and
    // stops delivery. No turn runs on the executor once it has completed. Handler:
    // void(error_code). Cancellation: none. Idempotent.
    template <class Token> auto async_stop(Token&& token) {
        return detail::async_run<detail::nothing>(get_executor(), stop(), std::forward<Token>(token));
    }
    // The address the HTTP listener is bound to (after async_start; port 0 in the config picks one).
    boost::asio::ip::tcp::endpoint local_endpoint() const;
    bool running() const;

    // --- Turns. ---
    // Admits a message: it is stored before the handler runs. Handler: void(error_code, accepted).
    // Errors: invalid_request (unknown agent, bad deliver), idempotency_key_reused,
    // session_queue_full, session_busy, rate_limited and quota_exceeded (the tenant's limits),
    // draining, internal_error (the store failed), store_unavailable (its database cannot be
    // reached).
    // Cancellation: none (the message is stored or refused either way).
    template <class Token> auto async_submit(accept_request m, Token&& token) {
        return detail::async_run<accepted>(get_executor(), submit(std::move(m), nullptr),
                                           std::forward<Token>(token));
    }
    template <class Token> auto async_submit(accept_request m, diagnostics& diag, Token&& token) {
        return detail::async_run<accepted>(get_executor(), submit(std::move(m), &diag),
                                           std::forward<Token>(token));
    }
    // Completes once the turn has ended (completed, failed, stopped, ...) with its final record,
    // or at once when it already has. Handler: void(error_code, turn_record). Errors: not_found;
    // draining when the service stops before the turn ends; internal_error (the store failed),
    // store_unavailable (its database cannot be reached).
    // Cancellation: terminal and partial; the wait ends with operation_aborted and the turn goes on.
    template <class Token> auto async_wait_turn(std::string turn_id, Token&& token) {
        return detail::async_run<turn_record>(new_strand(), wait_turn(std::move(turn_id)),
                                              std::forward<Token>(token));
    }
    // The turn's record as it stands. Handler: void(error_code, turn_record). Errors: not_found,
    // internal_error (the store failed), store_unavailable (its database cannot be reached).
    // Cancellation: none.
    template <class Token> auto async_get_turn(std::string turn_id, Token&& token) {
        return detail::async_run<turn_record>(get_executor(), get_turn(std::move(turn_id)),
                                              std::forward<Token>(token));
    }
    // Up to `limit` (1..1000) tape entries of the session with id > after, oldest first. A bare
    // session id names a session of the default tenant. Handler: void(error_code,
    // std::vector<tape_entry>). Errors: not_found (no such session), invalid_request (limit).
    // Cancellation: none.
    template <class Token>
    auto async_read_tape(session_ref session, std::int64_t after, std::size_t limit, Token&& token) {
        return detail::async_run<std::vector<tape_entry>>(
            get_executor(), read_tape(std::move(session), after, limit), std::forward<Token>(token));
    }
    // Stops a queued or running turn: it ends `stopped`. Handler: void(error_code). Errors:
    // not_found, turn_not_running (it had already ended). Cancellation: none.
    template <class Token> auto async_cancel(std::string turn_id, Token&& token) {
        return detail::async_run<detail::nothing>(get_executor(), cancel(std::move(turn_id)),
                                                  std::forward<Token>(token));
    }

    // --- Events. ---
    // A subscription to the events of one session's turns (from now on) or of one turn (from
    // its first kept event, `turn.finished` last). Events queue inside the subscription; a
    // subscription of a session that falls 4096 events behind drops the oldest (see gap()).
    // Destroying it ends it; it must not outlive its service.
    class subscription {
    public:
        subscription(subscription&&) noexcept;
        subscription& operator=(subscription&&) noexcept;
        ~subscription();
        // The next event. Handler: void(error_code, service_event). Errors: boost::asio::error::eof
        // once a turn subscription has handed over turn.finished, or after close(). Cancellation:
        // terminal and partial (operation_aborted; the events stay queued). One at a time.
        template <class Token> auto async_next(Token&& token) {
            return detail::async_run<service_event>(executor(), next(), std::forward<Token>(token));
        }
        // Events the subscription had to drop because nobody read them (0: none).
        std::uint64_t gap() const;
        void close();

        struct state;

    private:
        friend class service;
        explicit subscription(std::shared_ptr<state> s);
        boost::asio::any_io_executor executor() const;
        boost::asio::awaitable<detail::outcome<service_event>> next();
        std::shared_ptr<state> state_;
    };
    subscription subscribe_session(const session_ref& session);
    // Errors: not_found when the turn is unknown or its events have expired (the record still
    // answers async_get_turn).
    subscription subscribe_turn(const std::string& turn_id, boost::system::error_code& ec);

    struct impl;

private:
    boost::asio::any_io_executor new_strand() const; // where a wait runs and is woken
    boost::asio::awaitable<detail::outcome<detail::nothing>> start(diagnostics* diag);
    boost::asio::awaitable<detail::outcome<detail::nothing>> stop();
    boost::asio::awaitable<detail::outcome<accepted>> submit(accept_request m, diagnostics* diag);
    boost::asio::awaitable<detail::outcome<turn_record>> wait_turn(std::string turn_id);
    boost::asio::awaitable<detail::outcome<turn_record>> get_turn(std::string turn_id);
    boost::asio::awaitable<detail::outcome<std::vector<tape_entry>>>
    read_tape(session_ref session, std::int64_t after, std::size_t limit);
    boost::asio::awaitable<detail::outcome<detail::nothing>> cancel(std::string turn_id);

    std::unique_ptr<impl> impl_;
};

} // namespace baton
