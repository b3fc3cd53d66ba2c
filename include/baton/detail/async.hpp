// How baton's completion-token APIs are built: an operation is a coroutine on baton's executor
// that yields an error_code and a value; async_run() starts it for any completion token
// (use_awaitable, use_future, deferred, a callback, ...). The handler is invoked through its
// associated executor, and its associated cancellation slot reaches the coroutine: a terminal or
// partial cancellation of the token cancels what the operation is waiting for.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/error_code.hpp>

#include "baton/strand.hpp"

#include <exception>
#include <memory>
#include <optional>
#include <utility>

namespace baton::detail {

template <class T> struct outcome {
    boost::system::error_code ec;
    T value{};
};
struct nothing {};

template <class T> struct signature_of { using type = void(boost::system::error_code, T); };
template <> struct signature_of<nothing> { using type = void(boost::system::error_code); };

template <class T, class Handler> void complete(Handler& h, outcome<T>&& r) {
    if constexpr (std::is_same_v<T, nothing>)
        std::move(h)(r.ec);
    else
        std::move(h)(r.ec, std::move(r.value));
}

// Lets a token's partial cancellation through as well as the terminal one (co_spawn's default),
// and has the operation look at the cancellation state itself (cancelled()) instead of the next
// co_await throwing: a cancelled operation completes with operation_aborted, never an exception.
inline boost::asio::awaitable<void> accept_partial_cancellation() {
    co_await boost::asio::this_coro::reset_cancellation_state(
        boost::asio::enable_partial_cancellation());
    co_await boost::asio::this_coro::throw_if_cancelled(false);
}

inline boost::asio::awaitable<bool> cancelled() {
    auto cs = co_await boost::asio::this_coro::cancellation_state;
    co_return cs.cancelled() != boost::asio::cancellation_type::none;
}

// Cancellation across executors. Boost 1.81's co_spawn forwards a cancellation to the executor it
// spawned on by dispatching a raw pointer to a signal that dies with the operation: a cancellation
// that races the operation's end is a use after free there. These forward through a shared signal
// instead, and the operation's side disconnects it when it ends, on its own executor, so a late
// cancellation is dropped.
template <class T>
boost::asio::awaitable<T> guarded(boost::asio::any_io_executor ex,
                                  std::shared_ptr<boost::asio::cancellation_signal> sig,
                                  boost::asio::awaitable<T> op) {
    namespace asio = boost::asio;
    // On `ex`, where `sig` is emitted: the inner co_spawn's forwarding runs inline.
    std::exception_ptr e;
    std::optional<std::conditional_t<std::is_void_v<T>, nothing, T>> r;
    try {
        if constexpr (std::is_void_v<T>) {
            co_await asio::co_spawn(ex, std::move(op),
                                    asio::bind_cancellation_slot(sig->slot(), asio::use_awaitable));
            r.emplace();
        } else {
            r.emplace(co_await asio::co_spawn(
                ex, std::move(op), asio::bind_cancellation_slot(sig->slot(), asio::use_awaitable)));
        }
    } catch (...) {
        e = std::current_exception();
    }
    sig->slot().clear();
    if (e) std::rethrow_exception(e);
    if constexpr (!std::is_void_v<T>) co_return std::move(*r);
}

// Has a cancellation emitted on `slot` reach the returned operation, dispatched onto `ex`. The
// handler installed on `slot` owns the signal: clearing the slot, as an awaiting coroutine does when
// it resumes, is always safe.
template <class T>
boost::asio::awaitable<T> forwarding(boost::asio::any_io_executor ex,
                                     boost::asio::cancellation_slot slot, boost::asio::awaitable<T> op) {
    namespace asio = boost::asio;
    auto sig = std::make_shared<asio::cancellation_signal>();
    slot.assign(
        [sig, ex](asio::cancellation_type t) { asio::dispatch(ex, [sig, t] { sig->emit(t); }); });
    return guarded(std::move(ex), std::move(sig), std::move(op));
}

// co_await run_on(ex, op): runs `op` on `ex` (a strand, say) and resumes the caller where it was;
// the caller's cancellation reaches `op`. Use it instead of co_spawn(ex, op, use_awaitable).
template <class T>
boost::asio::awaitable<T> run_on(boost::asio::any_io_executor ex, boost::asio::awaitable<T> op) {
    namespace asio = boost::asio;
    asio::cancellation_state cs = co_await asio::this_coro::cancellation_state;
    auto slot = cs.slot();
    auto none = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
    if (!slot.is_connected()) co_return co_await asio::co_spawn(ex, std::move(op), none);
    co_return co_await asio::co_spawn(ex, forwarding(ex, slot, std::move(op)), none);
}

template <class T, class Token>
auto async_run(boost::asio::any_io_executor ex, boost::asio::awaitable<outcome<T>> op, Token&& token) {
    namespace asio = boost::asio;
    return asio::async_initiate<Token, typename signature_of<T>::type>(
        [ex](auto handler, asio::awaitable<outcome<T>> op) {
            auto slot = asio::get_associated_cancellation_slot(handler);
            auto handler_ex = asio::get_associated_executor(handler, ex);
            // A cancellable operation runs on a strand of its own, where its cancellation lands.
            if (slot.is_connected()) op = forwarding(make_thin_strand(ex), slot, std::move(op));
            asio::co_spawn(
                ex, std::move(op),
                asio::bind_cancellation_slot(
                    asio::cancellation_slot(),
                    asio::bind_executor(handler_ex, [h = std::move(handler)](std::exception_ptr e,
                                                                             outcome<T> r) mutable {
                        // Expected failures travel in r.ec; an exception here is a bug.
                        if (e) std::rethrow_exception(e);
                        complete(h, std::move(r));
                    })));
        },
        token, std::move(op));
}

} // namespace baton::detail
