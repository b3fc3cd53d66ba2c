// Runs store calls without blocking socket threads. A blocking store (SQLite) gets one thread of
// its own that takes every call queued meanwhile and runs them as one batch: one transaction, one
// commit (group commit), after which each awaiting coroutine resumes on its own executor. A
// non-blocking store (memory) is called inline.
#pragma once

#include <baton/store.hpp>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace baton {

class store_runner {
public:
    explicit store_runner(std::shared_ptr<baton::store> s);
    ~store_runner();
    store_runner(const store_runner&) = delete;
    store_runner& operator=(const store_runner&) = delete;

    baton::store& store() { return *store_; }

    // Calls f(store) and returns its result once it is durable (its batch committed); exceptions,
    // including a failed commit, propagate to the awaiting coroutine.
    // f may run more than once. A batch first runs its calls bare in one transaction (no undo
    // point each: store::begin_optimistic_batch); when one of them wrote and then threw (the store
    // refuses the commit, store::batch_replay), the transaction is rolled back and every call of
    // the batch runs again, each all-or-nothing on its own; one that threw before writing fails
    // alone and the others commit. So f
    // must do nothing but its store calls and its result, from what it captured, as a database
    // transaction's retried function does. run_once is for a call that must not run again.
    // Cancellation: not cancellable once submitted (a store call is short and must finish).
    template <class F> auto run(F f) -> boost::asio::awaitable<std::invoke_result_t<F, baton::store&>> {
        return call(std::move(f), true);
    }
    // As run, but f runs exactly once: a batch holding such a call is run call by call from the
    // start (each call all-or-nothing on its own), never rolled back and run again.
    template <class F>
    auto run_once(F f) -> boost::asio::awaitable<std::invoke_result_t<F, baton::store&>> {
        return call(std::move(f), false);
    }

    // Runs what is queued, then stops the store thread. Idempotent.
    void stop();

    // Batches committed so far and calls they carried (benchmarks, metrics); replays: the
    // optimistic batches rolled back because a call failed, and run again call by call.
    std::uint64_t batches() const;
    std::uint64_t calls() const;
    std::uint64_t replays() const;

private:
    template <class F>
    auto call(F f, bool replayable) -> boost::asio::awaitable<std::invoke_result_t<F, baton::store&>> {
        using R = std::invoke_result_t<F, baton::store&>;
        if (!store_->blocking()) co_return f(*store_);
        std::conditional_t<std::is_void_v<R>, bool, std::optional<R>> result{};
        std::exception_ptr error;
        // The coroutine stays suspended until the job completes, so the job may point at its locals.
        auto work = [&](baton::store& s) {
            if constexpr (std::is_void_v<R>) {
                f(s);
                result = true;
            } else {
                result.emplace(f(s));
            }
        };
        auto initiate = [this, &work, &error, replayable](auto handler) {
            // The awaiting executor counts as busy until the job completes (io_context::run
            // must not return meanwhile).
            auto ex = boost::asio::prefer(boost::asio::get_associated_executor(handler),
                                          boost::asio::execution::outstanding_work.tracked);
            auto done = [ex, h = std::make_shared<decltype(handler)>(std::move(handler))]() {
                boost::asio::post(ex, [h] { (*h)(); });
            };
            submit(job{std::ref(work), &error, std::move(done), replayable});
        };
        co_await boost::asio::async_initiate<decltype(boost::asio::use_awaitable), void()>(
            initiate, boost::asio::use_awaitable);
        if (error) std::rethrow_exception(error);
        if constexpr (!std::is_void_v<R>) co_return std::move(*result);
    }

    struct job {
        std::function<void(baton::store&)> work;
        std::exception_ptr* error;
        std::function<void()> done;
        bool replayable = true;
    };
    void submit(job j);
    void loop();
    void run_batch(std::vector<job>& batch);
    bool run_optimistic(std::vector<job>& batch);

    std::shared_ptr<baton::store> store_;
    mutable std::mutex mutex_;
    std::condition_variable wake_;
    std::vector<job> queue_;
    bool stopping_ = false;
    std::uint64_t batches_ = 0, calls_ = 0, replays_ = 0;
    std::thread thread_;
};

} // namespace baton
