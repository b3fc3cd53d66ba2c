#include "channels/schedule/channel.hpp"

#include <baton/log.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <charconv>

namespace baton::schedule {

std::string fire_key(std::string_view name, time_ms slot) {
    return "schedule " + std::string(name) + " " + std::to_string(slot);
}

std::string cursor_name(std::string_view name) {
    return "schedule:" + std::string(name);
}

struct detail::worker {
    worker(asio::any_io_executor ex, const std::shared_ptr<baton::clock>& clock, schedule_config c)
        : strand(asio::make_strand(ex)), timer(clock, strand), cfg(std::move(c)) {
        when.every_ms = cfg.every_ms;
        if (!cfg.every_ms) {
            auto parsed = parse_cron(cfg.cron);
            if (parsed) when.cron = *parsed;
        }
    }
    asio::strand<asio::any_io_executor> strand;
    baton::timer timer; // touched on the strand only
    schedule_config cfg;
    timing when;
    std::atomic<bool> stopped{false};
};

namespace {

using detail::worker;
using worker_ptr = std::shared_ptr<worker>;

json::object about(const schedule_config& c) {
    return {{"schedule", c.name}, {"session_id", c.session}};
}

// The last slot fired, from the cursor (nullopt: never fired, or unreadable: logged).
asio::awaitable<std::optional<time_ms>> read_cursor(runtime& rt, const schedule_config& c) {
    std::vector<std::string> names{cursor_name(c.name)};
    auto got = co_await rt.read_cursors(std::move(names));
    if (!got) {
        log::error("schedule: cannot read its cursor; firing as on a first start", about(c));
        co_return std::nullopt;
    }
    std::optional<std::string> value = std::move(got->front());
    if (!value) co_return std::nullopt;
    time_ms t = 0;
    auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), t);
    if (ec == std::errc() && end == value->data() + value->size()) co_return t;
    auto f = about(c);
    f["cursor"] = *value;
    log::warn("schedule: ignoring a malformed cursor", std::move(f));
    co_return std::nullopt;
}

// Never throws: a failure is logged (the next start then sees the previous value).
asio::awaitable<void> write_cursor(runtime& rt, const schedule_config& c, time_ms value) {
    std::vector<std::pair<std::string, std::string>> values{
        {cursor_name(c.name), std::to_string(value)}};
    if (co_await rt.write_cursors(std::move(values)))
        log::error("schedule: cannot store its cursor", about(c));
}

// Waits until the clock reaches `slot`; false when stopped first.
asio::awaitable<bool> wait_until(worker& w, const options& o, time_ms slot) {
    while (!w.stopped.load()) {
        time_ms left = slot - o.clock->utc_ms();
        if (left <= 0) co_return true;
        w.timer.expires_after(std::min(std::chrono::milliseconds(left), o.max_wait));
        boost::system::error_code ec; // operation_aborted on stop: the loop ends
        co_await w.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return false;
}

// Accepts the slot's message (refusals are logged and skipped), then records the slot as fired.
// Never throws.
asio::awaitable<void> fire(runtime& rt, const schedule_config& c, time_ms slot) {
    accept_request req;
    req.session_id = c.session;
    req.tenant = c.tenant;
    req.agent = c.agent;
    req.channel = "schedule";
    req.text = c.text;
    req.deliver = c.deliver;
    req.metadata = {{"schedule", c.name}, {"fire_at", format_time(slot)}};
    req.idem.key = fire_key(c.name, slot);
    req.idem.fingerprint =
        sha256_hex(c.session + "\n" + c.agent + "\n" + c.text + "\n" + json::serialize(c.deliver));
    auto f = about(c);
    f["fire_at"] = format_time(slot);
    try {
        auto result = co_await rt.accept(std::move(req));
        if (result) {
            f["turn_id"] = result->turn_id;
            log::info(result->replayed ? "schedule: slot already fired" : "schedule: fired", f);
        } else {
            const auto& err = result.error();
            f["code"] = code_name(err.code);
            f["message"] = err.message;
            log::warn("schedule: fire skipped", f);
        }
    } catch (const std::exception& e) {
        f["error"] = e.what();
        log::error("schedule: fire failed", f);
    }
    co_await write_cursor(rt, c, slot);
}

// One schedule's life: read the cursor, then fire slot after slot until stopped.
asio::awaitable<void> run_worker(runtime& rt, worker_ptr w, options o) {
    std::optional<time_ms> last = co_await read_cursor(rt, w->cfg);
    if (!last) {
        // The first start is remembered as if a fire had happened then: restarts before the first
        // slot keep counting from it, and a slot missed while down later is caught up.
        last = o.clock->utc_ms();
        co_await write_cursor(rt, w->cfg, *last);
    }
    while (!w->stopped.load()) {
        time_ms now = o.clock->utc_ms();
        auto slot = next_fire(w->when, last, now);
        if (!slot) {
            log::warn("schedule: never fires", about(w->cfg));
            co_return;
        }
        if (*slot < now) {
            auto f = about(w->cfg);
            f["fire_at"] = format_time(*slot);
            log::info("schedule: firing a missed slot once", std::move(f));
        }
        if (!co_await wait_until(*w, o, *slot)) co_return;
        // Woken late (a stalled or paused process): the slots that passed meanwhile are this one
        // fire, for the latest of them, as after downtime; firing each would come in a burst.
        const time_ms woke = o.clock->utc_ms();
        if (auto latest = next_fire(w->when, last, woke); latest && *latest > *slot && *latest <= woke)
            slot = latest;
        // Several nodes: each runs the schedule, and the slot's idempotency key makes its fire
        // one across them. An `every_ms` schedule is anchored at the cursor, which two nodes
        // starting together may each have written; the one that finds a fire less than a period
        // old in the cursor takes that node's grid instead of firing too.
        if (w->when.every_ms && rt.cluster_stats()) {
            auto shared = co_await read_cursor(rt, w->cfg);
            if (shared && *shared > *slot - *w->when.every_ms && *shared != *slot) {
                last = shared;
                continue;
            }
        }
        co_await fire(rt, w->cfg, *slot);
        last = slot;
    }
}

} // namespace

channel::channel(asio::any_io_executor ex, runtime& rt, std::vector<schedule_config> schedules,
                 options o)
    : rt_(rt), opts_(std::move(o)) {
    if (!opts_.clock) opts_.clock = system_clock();
    for (auto& s : schedules)
        workers_.push_back(std::make_shared<worker>(ex, opts_.clock, std::move(s)));
}

channel::~channel() {
    stop();
}

void channel::start() {
    if (started_.exchange(true)) return;
    for (const auto& w : workers_) {
        running_->fetch_add(1);
        auto done = [running = running_, what = "schedule " + w->cfg.name](std::exception_ptr e) {
            running->fetch_sub(1);
            log::spawn_logger{what}(e);
        };
        asio::co_spawn(w->strand, run_worker(rt_, w, opts_), std::move(done));
    }
}

void channel::stop() {
    for (const auto& w : workers_) {
        if (w->stopped.exchange(true)) continue;
        asio::post(w->strand, [w] { w->timer.cancel(); });
    }
}

} // namespace baton::schedule
