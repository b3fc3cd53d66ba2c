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
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/system/error_code.hpp>

#include <exception>
#include <utility>

namespace baton::detail {

template <class T> struct outcome {
    boost::system::error_code ec;
    T value{};
};
struct nothing {};

template <class T> struct signature_of {
    using type = void(boost::system::error_code, T);
};
template <> struct signature_of<nothing> {
    using type = void(boost::system::error_code);
};

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

template <class T, class Token>
auto async_run(boost::asio::any_io_executor ex, boost::asio::awaitable<outcome<T>> op, Token&& token) {
    namespace asio = boost::asio;
    return asio::async_initiate<Token, typename signature_of<T>::type>(
        [ex](auto handler, asio::awaitable<outcome<T>> op) {
            auto slot = asio::get_associated_cancellation_slot(handler);
            auto handler_ex = asio::get_associated_executor(handler, ex);
            asio::co_spawn(
                ex, std::move(op),
                asio::bind_cancellation_slot(
                    slot, asio::bind_executor(handler_ex, [h = std::move(handler)](
                                                              std::exception_ptr e, outcome<T> r) mutable {
                        // Expected failures travel in r.ec; an exception here is a bug.
                        if (e) std::rethrow_exception(e);
                        complete(h, std::move(r));
                    })));
        },
        token, std::move(op));
}

} // namespace baton::detail
