#include <baton/delivery.hpp>
#include <baton/detail/async.hpp>
#include <baton/log.hpp>
#include <baton/store_runner.hpp>

#include <baton/strand.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace baton {

using std::chrono::milliseconds;

outbox_item after_attempt(outbox_item item, const send_outcome& o, time_ms now, const retry_policy& p) {
    item.updated_at = now;
    item.next_attempt_at = 0;
    if (o.maybe_delivered) item.uncertain = true;
    switch (o.what) {
    case send_outcome::kind::delivered:
        item.status = outbox_status::delivered;
        item.last_error.clear();
        return item;
    case send_outcome::kind::failed:
        item.status = outbox_status::failed;
        item.last_error = o.error;
        return item;
    case send_outcome::kind::retry:
        break;
    }
    item.last_error = o.error;
    auto n = static_cast<std::size_t>(std::max<std::int64_t>(item.attempts, 1));
    if (n > p.backoff.size()) {
        item.status = outbox_status::failed;
        return item;
    }
    auto wait = p.backoff[n - 1];
    if (o.retry_after && *o.retry_after > wait) wait = *o.retry_after;
    item.status = outbox_status::pending;
    item.next_attempt_at = now + wait.count();
    return item;
}

namespace {
bool continuation(unsigned char c) {
    return (c & 0xC0) == 0x80;
}
} // namespace

std::vector<std::string> split_chunks(std::string_view text, std::size_t max_chars) {
    std::vector<std::string> out;
    if (max_chars == 0) {
        out.emplace_back(text);
        return out;
    }
    std::size_t pos = 0;
    while (pos < text.size()) {
        // Byte offsets of the code points of this chunk, counted in UTF-16 units as Telegram
        // counts its limit (a code point above U+FFFF, four UTF-8 bytes, is two): `i` after
        // max_chars of them, `soft` where its last quarter starts.
        std::size_t chars = 0, i = pos, soft = std::string_view::npos;
        std::size_t soft_at = max_chars - max_chars / 4;
        while (i < text.size()) {
            std::size_t units = static_cast<unsigned char>(text[i]) >= 0xF0 ? 2 : 1;
            if (chars + units > max_chars && chars > 0) break;
            ++i;
            while (i < text.size() && continuation(static_cast<unsigned char>(text[i])))
                ++i;
            chars += units;
            if (soft == std::string_view::npos && chars >= soft_at) soft = i;
        }
        std::size_t cut = i;
        if (i < text.size()) {
            // Prefer a line break, then a space, in the last quarter; the break stays with the chunk.
            auto window = text.substr(0, i);
            auto nl = window.rfind('\n');
            auto sp = window.rfind(' ');
            if (soft != std::string_view::npos && nl != std::string_view::npos && nl >= soft && nl > pos)
                cut = nl + 1;
            else if (soft != std::string_view::npos && sp != std::string_view::npos && sp >= soft &&
                     sp > pos)
                cut = sp + 1;
        }
        out.emplace_back(text.substr(pos, cut - pos));
        pos = cut;
    }
    if (out.empty()) out.emplace_back();
    return out;
}

namespace {

// One channel's workers. Everything but the channel itself lives on the strand.
struct lane : std::enable_shared_from_this<lane> {
    lane(asio::any_io_executor ex, std::shared_ptr<outbound_channel> c, store_runner& db,
         const retry_policy& r, std::shared_ptr<baton::clock> clk)
        : ch(std::move(c)), strand(detail::make_thin_strand(ex)), clock(std::move(clk)),
          timer(clock, strand), db(db), retry(r) {}

    std::shared_ptr<outbound_channel> ch;
    asio::any_io_executor strand; // detail::make_thin_strand
    std::shared_ptr<baton::clock> clock;
    baton::timer timer;
    store_runner& db;
    const retry_policy retry;

    // Items queue per recipient for an ordered channel, else each item alone; a queue's head is
    // in flight, waiting out its backoff, or runnable.
    std::unordered_map<std::string, std::deque<outbox_item>> queues;
    std::deque<std::string> runnable;
    std::multimap<time_ms, std::string> waiting;
    std::unordered_set<std::string> known; // keys queued here (an item is never queued twice)
    time_ms armed_for = 0;                 // when the timer fires (0: not armed)
    std::size_t active = 0;
    // One per send in flight: stop() cancels those still running after its grace.
    std::set<std::shared_ptr<asio::cancellation_signal>> sends;
    bool running = false;  // start() ran: attempts may begin
    bool stopping = false; // stop() ran: none begins any more

    std::string queue_key(const outbox_item& o) const { return ch->ordered() ? o.recipient : o.key; }

    // On the strand.
    void enqueue(outbox_item item) {
        if (!known.insert(item.key).second) return;
        auto qk = queue_key(item);
        auto& q = queues[qk];
        q.push_back(std::move(item));
        if (q.size() == 1) schedule_head(qk);
        pump();
    }

    void schedule_head(const std::string& qk) {
        const auto& head = queues.at(qk).front();
        if (head.next_attempt_at > clock->utc_ms()) {
            waiting.emplace(head.next_attempt_at, qk);
            arm();
        } else {
            runnable.push_back(qk);
        }
    }

    void pump() {
        if (!running || stopping) return;
        while (active < std::max<std::size_t>(1, ch->max_concurrency()) && !runnable.empty()) {
            auto qk = std::move(runnable.front());
            runnable.pop_front();
            ++active;
            auto signal = std::make_shared<asio::cancellation_signal>();
            sends.insert(signal);
            // The handler keeps the signal alive until the attempt has completed (on the strand).
            auto done = [self = shared_from_this(), signal](std::exception_ptr e) {
                self->sends.erase(signal);
                log::spawn_logger{"delivery " + std::string(self->ch->name())}(e);
            };
            asio::co_spawn(strand, attempt(qk, queues.at(qk).front()),
                           asio::bind_cancellation_slot(signal->slot(), std::move(done)));
        }
    }

    void arm() {
        if (waiting.empty() || stopping) return;
        auto first = waiting.begin()->first;
        if (armed_for != 0 && armed_for <= first) return;
        armed_for = first;
        timer.expires_after(milliseconds(std::max<time_ms>(0, first - clock->utc_ms())));
        // Weak: a pending wait must not keep the lane (and so this timer) alive into the
        // io_context's destruction.
        timer.async_wait([weak = weak_from_this(), first](boost::system::error_code ec) {
            auto self = weak.lock();
            if (ec || !self || self->armed_for != first) return; // replaced, or stopped
            self->armed_for = 0;
            auto now = self->clock->utc_ms();
            while (!self->waiting.empty() && self->waiting.begin()->first <= now) {
                self->runnable.push_back(self->waiting.begin()->second);
                self->waiting.erase(self->waiting.begin());
            }
            self->arm();
            self->pump();
        });
    }

    asio::awaitable<void> attempt(std::string qk, outbox_item item) {
        auto self = shared_from_this();
        item.status = outbox_status::sending;
        item.attempts += 1;
        // Marked before any byte goes out: a crash from here on is the `uncertain` window.
        bool marked = false;
        try {
            auto mark = [item](store& s) { return s.update_outbox(item); };
            marked = co_await db.run(std::move(mark));
        } catch (const std::exception& e) {
            log::error("cannot mark an outbox item sending", {{"key", item.key}, {"error", e.what()}});
        }
        outbox_item next;
        if (!marked) {
            // The store failed: not sent; try again a little later, without counting it.
            next = item;
            next.status = outbox_status::pending;
            next.attempts -= 1;
            next.next_attempt_at = clock->utc_ms() + 1000;
        } else {
            send_outcome outcome;
            try {
                outcome = co_await ch->send(item);
            } catch (const std::exception& e) {
                outcome = send_outcome::again(e.what());
            }
            if ((co_await asio::this_coro::cancellation_state).cancelled() !=
                asio::cancellation_type::none) {
                // Cut off by stop() after its grace: left `sending` in the store, so that the next
                // start sends it again, flagged uncertain.
                log::info("delivery cut off by the stop",
                          {{"key", item.key}, {"channel", item.channel}});
                --active;
                co_return;
            }
            next = after_attempt(item, outcome, clock->utc_ms(), retry);
            if (next.status == outbox_status::failed)
                log::warn("delivery failed", {{"key", next.key},
                                              {"channel", next.channel},
                                              {"attempts", next.attempts},
                                              {"error", next.last_error}});
            else if (next.status == outbox_status::pending)
                log::info("delivery will be retried", {{"key", next.key},
                                                       {"channel", next.channel},
                                                       {"attempts", next.attempts},
                                                       {"error", next.last_error}});
            try {
                auto save = [next](store& s) { return s.update_outbox(next); };
                co_await db.run(std::move(save));
            } catch (const std::exception& e) {
                // Left `sending` in the store: the next start sends it again, flagged uncertain.
                log::error("cannot record an outbox item's attempt",
                           {{"key", next.key}, {"error", e.what()}});
            }
        }
        --active;
        auto& q = queues.at(qk);
        if (next.status == outbox_status::pending) {
            q.front() = std::move(next);
            schedule_head(qk);
        } else {
            known.erase(q.front().key);
            q.pop_front();
            if (q.empty())
                queues.erase(qk);
            else
                schedule_head(qk);
        }
        pump();
    }
};

// Read on the lane's strand.
asio::awaitable<std::size_t> active_sends(std::shared_ptr<lane> l) {
    co_return l->active;
}

} // namespace

struct delivery::impl {
    impl(asio::any_io_executor e, runtime& r, delivery_options o)
        : ex(std::move(e)), rt(r), opts(std::move(o)) {
        if (!opts.clock) opts.clock = system_clock();
    }
    asio::any_io_executor ex;
    runtime& rt;
    delivery_options opts;
    std::map<std::string, std::shared_ptr<lane>, std::less<>> lanes; // fixed once start() runs

    static void post_enqueue(const std::shared_ptr<lane>& l, outbox_item item) {
        asio::post(l->strand, [l, item = std::move(item)]() mutable { l->enqueue(std::move(item)); });
    }

    asio::awaitable<bool> dispatch(turn_context& ctx, const outbound& item);
    asio::awaitable<std::size_t> recover(const std::shared_ptr<lane>& l);
    // Queues items left open by an earlier process (or a dead node): `sending` ones pending and
    // uncertain, those of a recipient no longer configured failed.
    asio::awaitable<std::size_t> resume(const std::shared_ptr<lane>& l, std::vector<outbox_item> items);
    // Several nodes: items this node took over from a node whose lease expired.
    asio::awaitable<void> take_over(std::vector<outbox_item> items);
};

delivery::delivery(asio::any_io_executor ex, runtime& rt, delivery_options o)
    : impl_(std::make_shared<impl>(std::move(ex), rt, std::move(o))) {
    // Several nodes: a node's open items are its own; a dead node's come through its claims.
    std::weak_ptr<impl> weak = impl_;
    rt.on_outbox_taken_over([weak](std::vector<outbox_item> items) {
        auto i = weak.lock();
        if (!i) return;
        asio::co_spawn(i->ex, i->take_over(std::move(items)), log::spawn_logger{"outbox take-over"});
    });
}

delivery::~delivery() = default;

void delivery::add_channel(std::shared_ptr<outbound_channel> ch) {
    std::string name(ch->name());
    auto l =
        std::make_shared<lane>(impl_->ex, ch, impl_->rt.fw().db(), impl_->opts.retry, impl_->opts.clock);
    impl_->lanes[name] = l;
    impl_->rt.add_route(name, [ch](std::string_view to) { return ch->check_recipient(to); });
}

plugin delivery::make_plugin() {
    plugin p;
    p.name = "delivery";
    p.dispatch_outbound = [impl = impl_](turn_context& ctx, const outbound& item) {
        return impl->dispatch(ctx, item);
    };
    return p;
}

// An item for a pushing channel: its chunks are stored (the turn waits for that), then queued.
asio::awaitable<bool> delivery::impl::dispatch(turn_context& ctx, const outbound& item) {
    auto it = lanes.find(item.channel);
    if (it == lanes.end()) co_return false;
    auto l = it->second;
    auto chunks = split_chunks(item.text, l->ch->max_chunk_chars());
    std::vector<outbox_item> items;
    items.reserve(chunks.size());
    for (std::size_t c = 0; c < chunks.size(); ++c) {
        outbox_item o;
        o.turn_id = ctx.inbound.turn_id;
        o.tenant = ctx.inbound.tenant;
        o.session_id = ctx.session_id;
        o.channel = item.channel;
        o.recipient = item.to;
        // Chunk c of the turn's item i: i * 65536 + c (a single unsplit reply keeps index 0).
        o.index = item.index * 65536 + static_cast<std::int64_t>(c);
        o.text = std::move(chunks[c]);
        o.key = outbox_key(o.session_id, o.turn_id, o.channel, o.recipient, o.index);
        items.push_back(std::move(o));
    }
    // Named before the co_await: g++ 12 destroys a temporary of a co_await's arguments twice.
    std::function<void(std::vector<outbox_item>)> queue = [l](std::vector<outbox_item> added) {
        for (auto& a : added)
            post_enqueue(l, std::move(a));
    };
    co_await rt.enqueue_outbox(ctx, std::move(items), std::move(queue));
    co_return true;
}

asio::awaitable<std::size_t> delivery::impl::recover(const std::shared_ptr<lane>& l) {
    store::outbox_filter open;
    open.statuses = {outbox_status::pending, outbox_status::sending};
    open.channel = std::string(l->ch->name());
    open.limit = std::numeric_limits<std::size_t>::max();
    auto list = [open](store& s) { return s.list_outbox(open); };
    co_return co_await resume(l, co_await rt.fw().db().run(std::move(list)));
}

asio::awaitable<void> delivery::impl::take_over(std::vector<outbox_item> items) {
    std::map<std::string, std::vector<outbox_item>> by_channel;
    for (auto& o : items)
        by_channel[o.channel].push_back(std::move(o));
    for (auto& [channel, list] : by_channel) {
        auto it = lanes.find(channel);
        if (it == lanes.end()) {
            log::warn("outbox items taken over for a channel this node has not configured",
                      {{"channel", channel}, {"count", list.size()}});
            continue;
        }
        co_await resume(it->second, std::move(list));
    }
}

asio::awaitable<std::size_t> delivery::impl::resume(const std::shared_ptr<lane>& l,
                                                    std::vector<outbox_item> items) {
    std::size_t queued = 0, uncertain = 0;
    for (auto& item : items) {
        bool changed = false;
        if (item.status == outbox_status::sending) {
            // Its last attempt may or may not have reached the recipient.
            item.status = outbox_status::pending;
            item.uncertain = true;
            item.next_attempt_at = 0;
            changed = true;
            ++uncertain;
        }
        if (auto why = l->ch->check_recipient(item.recipient)) {
            item.status = outbox_status::failed;
            item.last_error = "recipient no longer configured: " + *why;
            changed = true;
        }
        if (changed) {
            auto save = [item](store& s) { s.update_outbox(item); };
            co_await rt.fw().db().run(std::move(save));
        }
        if (item.status == outbox_status::pending) {
            post_enqueue(l, std::move(item));
            ++queued;
        }
    }
    if (!items.empty())
        log::info(
            "recovered outbox items",
            {{"channel", std::string(l->ch->name())}, {"queued", queued}, {"uncertain", uncertain}});
    co_return queued;
}

asio::awaitable<std::size_t> delivery::start() {
    std::size_t queued = 0;
    // Several nodes: the open items of the nodes before come by take-over (claims), not by a scan
    // that would take those of live nodes too.
    if (!impl_->rt.fw().db().store().cluster())
        for (auto& [name, l] : impl_->lanes)
            queued += co_await impl_->recover(l);
    for (auto& [name, l] : impl_->lanes)
        asio::post(l->strand, [l = l] {
            l->running = true;
            l->pump();
        });
    co_return queued;
}

asio::awaitable<void> delivery::stop(std::chrono::milliseconds grace) {
    for (auto& [name, l] : impl_->lanes)
        asio::post(l->strand, [l = l] {
            l->stopping = true;
            l->armed_for = 0;
            l->timer.cancel();
        });
    asio::steady_timer timer(co_await asio::this_coro::executor);
    auto deadline = std::chrono::steady_clock::now() + grace;
    // Shutdown only: a short poll of the lanes' in-flight counts. After the grace the sends still
    // in flight are cancelled (terminal) and waited for, however long a channel that ignores
    // cancellation takes (a warning every 5 s): none outlives the stop on its executor.
    bool cancelled = false;
    auto warn_at = deadline + std::chrono::seconds(5);
    for (;;) {
        std::size_t active = 0;
        for (auto& [name, l] : impl_->lanes)
            active += co_await detail::run_on(l->strand, active_sends(l));
        if (active == 0) break;
        auto now = std::chrono::steady_clock::now();
        if (!cancelled && now >= deadline) {
            cancelled = true;
            for (auto& [name, l] : impl_->lanes)
                asio::post(l->strand, [l = l] {
                    for (const auto& s : l->sends)
                        s->emit(asio::cancellation_type::terminal);
                });
        } else if (cancelled && now >= warn_at) {
            warn_at = now + std::chrono::seconds(5);
            log::warn("stopping: waiting for sends that ignore cancellation", {{"sending", active}});
        }
        timer.expires_after(milliseconds(10));
        co_await timer.async_wait(asio::use_awaitable);
    }
}

} // namespace baton
