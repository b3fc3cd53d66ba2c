#include <baton/clock.hpp>

#include <boost/asio/append.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <map>
#include <mutex>
#include <vector>

namespace baton {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

clock::time_point saturating_add(clock::time_point t, clock::duration d) {
    if (d > clock::duration::zero() && t > clock::time_point::max() - d) return clock::time_point::max();
    if (d < clock::duration::zero() && t < clock::time_point::min() - d) return clock::time_point::min();
    return t + d;
}

class steady_timer_impl final : public detail::timer_impl {
public:
    explicit steady_timer_impl(asio::any_io_executor ex) : timer_(std::move(ex)) {}
    clock::time_point expiry() const override { return timer_.expiry(); }
    std::size_t expires_at(clock::time_point t) override { return timer_.expires_at(t); }
    std::size_t cancel() override { return timer_.cancel(); }
    void async_wait(detail::wait_handler h) override { timer_.async_wait(std::move(h)); }

private:
    asio::steady_timer timer_;
};

class real_clock final : public clock {
public:
    time_point now() const override { return std::chrono::steady_clock::now(); }
    time_ms utc_ms() const override { return now_ms(); }
    std::unique_ptr<detail::timer_impl> make_timer(asio::any_io_executor ex) override {
        return std::make_unique<steady_timer_impl>(std::move(ex));
    }
};

} // namespace

const std::shared_ptr<clock>& system_clock() {
    static const std::shared_ptr<clock> c = std::make_shared<real_clock>();
    return c;
}

timer::timer(std::shared_ptr<baton::clock> c, executor_type ex)
    : clock_(c ? std::move(c) : system_clock()), ex_(std::move(ex)), impl_(clock_->make_timer(ex_)) {}

timer::timer(std::shared_ptr<baton::clock> c, executor_type ex, time_point at)
    : timer(std::move(c), std::move(ex)) {
    impl_->expires_at(at);
}

timer::timer(std::shared_ptr<baton::clock> c, executor_type ex, duration after)
    : timer(std::move(c), std::move(ex)) {
    expires_after(after);
}

timer::~timer() = default;

timer::time_point timer::expiry() const {
    return impl_->expiry();
}

std::size_t timer::expires_at(time_point at) {
    return impl_->expires_at(at);
}

std::size_t timer::expires_after(duration d) {
    return impl_->expires_at(saturating_add(clock_->now(), d));
}

std::size_t timer::cancel() {
    return impl_->cancel();
}

// ---- manual_clock ----

struct manual_clock::state {
    // A pending wait. `done` (under the mutex) makes completion and cancellation exclusive.
    struct op {
        // Moved in at construction: Boost 1.81's any_completion_handler move-assignment recurses
        // without end (it wraps the source in a new handler instead of taking it).
        op(const void* o, detail::wait_handler h, asio::any_io_executor w)
            : owner(o), handler(std::move(h)), work(std::move(w)) {}
        const void* owner; // its timer
        detail::wait_handler handler;
        asio::any_io_executor work; // the timer's executor, tracking work while the wait pends
        bool done = false;
        std::multimap<time_point, std::shared_ptr<op>>::iterator at;
    };
    using op_ptr = std::shared_ptr<op>;

    mutable std::mutex mutex;
    time_point start, now;
    time_ms utc_start = 0;
    std::multimap<time_point, op_ptr> waits;

    // Posts the handler to its executor (through the timer's); never inline.
    static void finish(const op_ptr& o, error_code ec) {
        auto ex = std::move(o->work);
        asio::post(ex, asio::append(std::move(o->handler), ec));
    }

    // With the mutex held: takes every wait due by `now`, in deadline order.
    std::vector<op_ptr> take_due() {
        std::vector<op_ptr> due;
        while (!waits.empty() && waits.begin()->first <= now) {
            due.push_back(std::move(waits.begin()->second));
            due.back()->done = true;
            waits.erase(waits.begin());
        }
        return due;
    }

    std::size_t cancel_all(const void* owner) {
        std::vector<op_ptr> out;
        {
            std::lock_guard lock(mutex);
            for (auto it = waits.begin(); it != waits.end();) {
                if (it->second->owner != owner) {
                    ++it;
                    continue;
                }
                it->second->done = true;
                out.push_back(std::move(it->second));
                it = waits.erase(it);
            }
        }
        for (const auto& o : out)
            finish(o, asio::error::operation_aborted);
        return out.size();
    }
};

namespace {

using manual_state = manual_clock::state;

// Installed in a wait's cancellation slot. Weak: a slot may keep it long after the wait ended.
struct wait_canceller {
    std::weak_ptr<manual_state> st;
    std::weak_ptr<manual_state::op> o;
    void operator()(asio::cancellation_type_t type) {
        constexpr auto any = asio::cancellation_type::terminal | asio::cancellation_type::partial |
                             asio::cancellation_type::total;
        if (!(type & any)) return;
        auto s = st.lock();
        auto p = o.lock();
        if (!s || !p) return;
        {
            std::lock_guard lock(s->mutex);
            if (p->done) return;
            p->done = true;
            s->waits.erase(p->at);
        }
        manual_state::finish(p, asio::error::operation_aborted);
    }
};

class manual_timer_impl final : public detail::timer_impl {
public:
    manual_timer_impl(std::shared_ptr<manual_state> st, asio::any_io_executor ex)
        : st_(std::move(st)), ex_(std::move(ex)) {}
    ~manual_timer_impl() override { st_->cancel_all(this); }

    clock::time_point expiry() const override { return expiry_; }
    std::size_t expires_at(clock::time_point t) override {
        auto n = st_->cancel_all(this);
        expiry_ = t;
        return n;
    }
    std::size_t cancel() override { return st_->cancel_all(this); }

    void async_wait(detail::wait_handler h) override {
        auto slot = asio::get_associated_cancellation_slot(h);
        auto o = std::make_shared<manual_state::op>(
            this, std::move(h), asio::prefer(ex_, asio::execution::outstanding_work.tracked));
        // Decided under the mutex: once the wait is in `waits`, another thread's advance() may
        // complete it (and set `done`) at any time.
        bool due_now = false;
        {
            std::lock_guard lock(st_->mutex);
            if (expiry_ > st_->now) {
                o->at = st_->waits.emplace(expiry_, o);
            } else {
                o->done = due_now = true;
            }
        }
        if (due_now) {
            manual_state::finish(o, {});
            return;
        }
        // The slot belongs to this thread's caller: a wait completed meanwhile ignores its emit.
        if (slot.is_connected()) slot.template emplace<wait_canceller>(wait_canceller{st_, o});
    }

private:
    std::shared_ptr<manual_state> st_;
    asio::any_io_executor ex_;
    clock::time_point expiry_{};
};

} // namespace

manual_clock::manual_clock(time_ms utc) : state_(std::make_shared<state>()) {
    state_->start = state_->now = std::chrono::steady_clock::now();
    state_->utc_start = utc;
}

clock::time_point manual_clock::now() const {
    std::lock_guard lock(state_->mutex);
    return state_->now;
}

time_ms manual_clock::utc_ms() const {
    std::lock_guard lock(state_->mutex);
    return state_->utc_start +
           std::chrono::duration_cast<std::chrono::milliseconds>(state_->now - state_->start).count();
}

std::unique_ptr<detail::timer_impl> manual_clock::make_timer(asio::any_io_executor ex) {
    return std::make_unique<manual_timer_impl>(state_, std::move(ex));
}

namespace {
// Moves the clock to `target(now, waits)` (never back; nullopt: stays) and completes what is due.
template <class Target> bool jump(manual_state& s, Target target) {
    std::vector<manual_state::op_ptr> due;
    {
        std::lock_guard lock(s.mutex);
        std::optional<clock::time_point> to = target(s.now, s.waits);
        if (!to) return false;
        s.now = std::max(s.now, *to);
        due = s.take_due();
    }
    for (const auto& o : due)
        manual_state::finish(o, {});
    return true;
}
} // namespace

void manual_clock::advance(duration d) {
    jump(*state_, [d](time_point now, const auto&) { return std::optional(saturating_add(now, d)); });
}

void manual_clock::advance_to(time_point t) {
    jump(*state_, [t](time_point, const auto&) { return std::optional(t); });
}

bool manual_clock::advance_to_next() {
    return jump(*state_, [](time_point, const auto& waits) {
        return waits.empty() ? std::nullopt : std::optional(waits.begin()->first);
    });
}

std::size_t manual_clock::waiting() const {
    std::lock_guard lock(state_->mutex);
    return state_->waits.size();
}

std::optional<clock::time_point> manual_clock::next_deadline() const {
    std::lock_guard lock(state_->mutex);
    if (state_->waits.empty()) return std::nullopt;
    return state_->waits.begin()->first;
}

} // namespace baton
