// Runs store calls without blocking socket threads: a blocking store (SQLite) gets one thread of its
// own and the awaiting coroutine resumes on its executor; a non-blocking one is called inline.
#pragma once

#include <baton/store.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <memory>
#include <type_traits>

namespace baton {

class store_runner {
public:
    explicit store_runner(std::shared_ptr<baton::store> s) : store_(std::move(s)), pool_(1) {}
    ~store_runner() { pool_.join(); }

    baton::store& store() { return *store_; }

    // Calls f(store) and returns its result; exceptions propagate to the awaiting coroutine.
    // Cancellation: not cancellable once submitted (a store call is short and must finish).
    template <class F> auto run(F f) -> boost::asio::awaitable<std::invoke_result_t<F, baton::store&>> {
        using R = std::invoke_result_t<F, baton::store&>;
        if (!store_->blocking()) co_return f(*store_);
        auto job = [s = store_, f = std::move(f)]() mutable -> boost::asio::awaitable<R> {
            co_return f(*s);
        };
        co_return co_await boost::asio::co_spawn(pool_, std::move(job), boost::asio::use_awaitable);
    }

    void stop() { pool_.join(); }

private:
    std::shared_ptr<baton::store> store_;
    boost::asio::thread_pool pool_;
};

} // namespace baton
