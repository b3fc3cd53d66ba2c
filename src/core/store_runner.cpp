#include <baton/log.hpp>
#include <baton/store_runner.hpp>

#include <exception>
#include <stdexcept>

namespace baton {

store_runner::store_runner(std::shared_ptr<baton::store> s) : store_(std::move(s)) {
    if (store_->blocking()) thread_ = std::thread([this] { loop(); });
}

store_runner::~store_runner() {
    stop();
}

void store_runner::stop() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
}

void store_runner::submit(job j) {
    {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(j));
    }
    wake_.notify_one();
}

std::uint64_t store_runner::batches() const {
    std::lock_guard lock(mutex_);
    return batches_;
}

std::uint64_t store_runner::calls() const {
    std::lock_guard lock(mutex_);
    return calls_;
}

std::uint64_t store_runner::replays() const {
    std::lock_guard lock(mutex_);
    return replays_;
}

void store_runner::loop() {
    std::vector<job> batch;
    for (;;) {
        {
            std::unique_lock lock(mutex_);
            wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return; // stopping, nothing left
            batch.swap(queue_);
            ++batches_;
            calls_ += batch.size();
        }
        run_batch(batch);
        batch.clear();
    }
}

namespace {
// A batch's failure as an exception object of each call's own. Shared, the one object would be
// read by the calls' coroutines on the io threads and freed by whichever let go last, on another
// thread: libstdc++ counts an exception's references where ThreadSanitizer cannot see them, and
// it reported that as a race. What callers tell apart is kept: store_unavailable, and the message.
std::exception_ptr own_copy(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const store_unavailable& x) {
        return std::make_exception_ptr(store_unavailable(x.what()));
    } catch (const std::exception& x) {
        return std::make_exception_ptr(std::runtime_error(x.what()));
    } catch (...) {
        return std::make_exception_ptr(std::runtime_error("store: the batch failed"));
    }
}

// Runs each call, keeping what each one threw as its own error.
template <class Jobs> void run_each(Jobs& batch, store& s) {
    for (auto& j : batch) {
        try {
            j.work(s);
        } catch (...) {
            *j.error = std::current_exception();
        }
    }
}

// The batch as a whole failed (it could not begin or commit): a call without an error of its own
// either succeeded or never ran, and neither is stored.
template <class Jobs> void fail_all(Jobs& batch, const std::exception_ptr& batch_error) {
    log::error("store: a batch of calls failed", {{"calls", batch.size()}});
    for (auto& j : batch)
        if (!*j.error) *j.error = own_copy(batch_error);
}
} // namespace

// The fast path: every call bare in one transaction, then the commit. True when the batch is
// done (committed, or its commit failed and every call has that error); false when it must run
// again call by call: a call wrote and then threw (the store refused the commit and rolled it
// back), a call must not run twice, or the store has no optimistic batches (nothing was begun).
bool store_runner::run_optimistic(std::vector<job>& batch) {
    for (const auto& j : batch)
        if (!j.replayable) return false;
    try {
        if (!store_->begin_optimistic_batch()) return false;
    } catch (...) {
        return false; // the careful batch begins again, and reports what fails
    }
    run_each(batch, *store_);
    std::exception_ptr batch_error;
    try {
        store_->end_batch();
    } catch (const batch_replay&) {
        try {
            store_->abort_batch();
        } catch (...) {
        }
        for (auto& j : batch)
            *j.error = nullptr; // heard again, if it fails again, from its second run
        std::lock_guard lock(mutex_);
        ++replays_;
        return false;
    } catch (...) {
        batch_error = std::current_exception();
    }
    if (batch_error) fail_all(batch, batch_error);
    return true;
}

// Every call of the batch runs in one transaction; each call is all-or-nothing on its own (the
// store nests it), and the commit makes the survivors durable together. A failed commit fails
// every call that had succeeded, since none of them is stored.
void store_runner::run_batch(std::vector<job>& batch) {
    if (run_optimistic(batch)) {
        for (auto& j : batch)
            j.done();
        return;
    }
    std::exception_ptr batch_error;
    try {
        store_->begin_batch();
    } catch (...) {
        batch_error = std::current_exception();
    }
    if (!batch_error) {
        run_each(batch, *store_);
        try {
            store_->end_batch();
        } catch (...) {
            batch_error = std::current_exception();
        }
    }
    if (batch_error) fail_all(batch, batch_error);
    for (auto& j : batch)
        j.done();
}

} // namespace baton
