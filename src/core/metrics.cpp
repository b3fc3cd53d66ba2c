#include <baton/metrics.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace baton {

namespace {
constexpr auto relaxed = std::memory_order_relaxed;
// As `baton --version` prints it (src/main.cpp; the metrics suite checks that they agree).
constexpr std::string_view build_version = BATON_VERSION;

constexpr std::array<std::string_view, turn_stage_count> stage_names{
    "resolve_session", "load_state",      "build_prompt",     "run_model",
    "save_state",      "render_outbound", "dispatch_outbound"};
constexpr std::array<std::string_view, 5> outcome_names{"completed", "stopped", "failed", "timed_out",
                                                        "step_limit"};
constexpr std::array<std::string_view, connection_kind_count> connection_names{"http", "websocket",
                                                                               "sse"};
constexpr std::array<std::string_view, 4> outbox_names{"pending", "sending", "delivered", "failed"};
// The bucket bounds as Prometheus shows them (`le`), in seconds.
constexpr std::array<std::string_view, latency_histogram::bounds_ns.size()> bound_labels{
    "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
    "0.5",   "1",      "2.5",   "5",    "10",    "30",   "60",  "120"};

// Label values are fixed names here; escaping still keeps the text valid whatever they become.
void append_escaped(std::string& out, std::string_view v) {
    for (char c : v) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '"')
            out += "\\\"";
        else if (c == '\n')
            out += "\\n";
        else
            out += c;
    }
}

void append_int(std::string& out, std::int64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

void append_uint(std::string& out, std::uint64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

// Nanoseconds as seconds, exactly (9 decimals, trailing zeros dropped).
void append_seconds(std::string& out, std::uint64_t ns) {
    append_uint(out, ns / 1'000'000'000);
    auto frac = ns % 1'000'000'000;
    if (frac == 0) return;
    char buf[16];
    std::snprintf(buf, sizeof buf, ".%09llu", static_cast<unsigned long long>(frac));
    std::string_view f(buf);
    while (f.back() == '0')
        f.remove_suffix(1);
    out += f;
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
    out += "# HELP ";
    out += name;
    out += ' ';
    out += help;
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type;
    out += '\n';
}

// `name{label="value"} ` (no braces without a label).
void sample_name(std::string& out, std::string_view name, std::string_view label = {},
                 std::string_view value = {}, std::string_view le = {}) {
    out += name;
    if (label.empty() && le.empty()) {
        out += ' ';
        return;
    }
    out += '{';
    if (!label.empty()) {
        out += label;
        out += "=\"";
        append_escaped(out, value);
        out += '"';
    }
    if (!le.empty()) {
        if (!label.empty()) out += ',';
        out += "le=\"";
        out += le;
        out += '"';
    }
    out += "} ";
}

void histogram_samples(std::string& out, std::string_view name, const latency_histogram& h,
                       std::string_view label = {}, std::string_view value = {}) {
    auto s = h.read();
    std::string bucket = std::string(name) + "_bucket";
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < bound_labels.size(); ++i) {
        cumulative += s.buckets[i];
        sample_name(out, bucket, label, value, bound_labels[i]);
        append_uint(out, cumulative);
        out += '\n';
    }
    sample_name(out, bucket, label, value, "+Inf");
    append_uint(out, s.count);
    out += '\n';
    sample_name(out, std::string(name) + "_sum", label, value);
    append_seconds(out, s.sum_ns);
    out += '\n';
    sample_name(out, std::string(name) + "_count", label, value);
    append_uint(out, s.count);
    out += '\n';
}

void gauge(std::string& out, std::string_view name, std::string_view help, std::int64_t v) {
    header(out, name, "gauge", help);
    sample_name(out, name);
    append_int(out, v);
    out += '\n';
}
} // namespace

namespace {
// This thread's shard: threads take them in turn as they first observe.
std::size_t this_thread_shard(std::size_t count) noexcept {
    static std::atomic<std::size_t> next{0};
    thread_local const std::size_t mine = next.fetch_add(1, relaxed);
    return mine % count;
}
} // namespace

void latency_histogram::observe(std::chrono::nanoseconds d) noexcept {
    auto ns = std::max<std::int64_t>(d.count(), 0);
    std::size_t i = 0;
    while (i < bounds_ns.size() && ns > bounds_ns[i])
        ++i;
    auto& sh = shards_[this_thread_shard(shard_count)];
    sh.buckets[i].fetch_add(1, relaxed);
    sh.sum_ns.fetch_add(static_cast<std::uint64_t>(ns), relaxed);
}

latency_histogram::snapshot latency_histogram::read() const noexcept {
    snapshot s;
    for (const auto& sh : shards_) {
        for (std::size_t i = 0; i < sh.buckets.size(); ++i)
            s.buckets[i] += sh.buckets[i].load(relaxed);
        s.sum_ns += sh.sum_ns.load(relaxed);
    }
    for (auto b : s.buckets)
        s.count += b;
    return s;
}

std::string_view to_string(turn_stage s) noexcept {
    return stage_names[static_cast<std::size_t>(s)];
}

std::optional<turn_stage> parse_turn_stage(std::string_view name) noexcept {
    for (std::size_t i = 0; i < stage_names.size(); ++i)
        if (stage_names[i] == name) return static_cast<turn_stage>(i);
    return std::nullopt;
}

void metrics_registry::turn_finished(turn_status s) noexcept {
    // completed is the first terminal status; the order of outcome_names follows the enum.
    auto i = static_cast<int>(s) - static_cast<int>(turn_status::completed);
    if (i < 0 || i >= static_cast<int>(finished_.size())) return;
    finished_[static_cast<std::size_t>(i)].fetch_add(1, relaxed);
}

metrics_registry::connection_guard::connection_guard(std::shared_ptr<metrics_registry> r,
                                                     connection_kind k) noexcept
    : registry_(std::move(r)), kind_(k) {
    if (registry_) registry_->connections_[static_cast<std::size_t>(k)].fetch_add(1, relaxed);
}

metrics_registry::connection_guard&
metrics_registry::connection_guard::operator=(connection_guard&& o) noexcept {
    if (this != &o) {
        if (registry_) registry_->connections_[static_cast<std::size_t>(kind_)].fetch_sub(1, relaxed);
        registry_ = std::move(o.registry_);
        kind_ = o.kind_;
    }
    return *this;
}

metrics_registry::connection_guard::~connection_guard() {
    if (registry_) registry_->connections_[static_cast<std::size_t>(kind_)].fetch_sub(1, relaxed);
}

std::string metrics_registry::render(const metrics_gauges& g) const {
    std::string out;
    out.reserve(16384);
    header(out, "baton_turns_total", "counter", "Turns finished, by terminal status.");
    for (std::size_t i = 0; i < outcome_names.size(); ++i) {
        sample_name(out, "baton_turns_total", "outcome", outcome_names[i]);
        append_uint(out, finished_[i].load(relaxed));
        out += '\n';
    }
    header(out, "baton_turns_accepted_total", "counter", "Messages admitted as queued turns.");
    sample_name(out, "baton_turns_accepted_total");
    append_uint(out, accepted_.load(relaxed));
    out += '\n';

    header(out, "baton_turn_duration_seconds", "histogram",
           "Turns run by this process, from started to finished.");
    histogram_samples(out, "baton_turn_duration_seconds", turn_);
    header(out, "baton_stage_duration_seconds", "histogram", "Turn stages, by stage.");
    for (std::size_t i = 0; i < stages_.size(); ++i)
        histogram_samples(out, "baton_stage_duration_seconds", stages_[i], "stage", stage_names[i]);
    header(out, "baton_model_call_duration_seconds", "histogram",
           "Model calls of the agent loop (one per step), by outcome.");
    histogram_samples(out, "baton_model_call_duration_seconds", model_calls_[0], "outcome", "ok");
    histogram_samples(out, "baton_model_call_duration_seconds", model_calls_[1], "outcome", "error");

    gauge(out, "baton_queue_depth", "Turns waiting in session queues.", g.queue_depth);
    gauge(out, "baton_turns_running", "Turns running now.", g.turns_running);
    gauge(out, "baton_sessions_live", "Session actors in memory.", g.sessions_live);
    header(out, "baton_store_batches_total", "counter",
           "Store transactions committed by the store thread (group commit).");
    sample_name(out, "baton_store_batches_total");
    append_uint(out, g.store_batches);
    out += '\n';
    header(out, "baton_store_calls_total", "counter", "Store calls those transactions carried.");
    sample_name(out, "baton_store_calls_total");
    append_uint(out, g.store_calls);
    out += '\n';

    header(out, "baton_outbox_items", "gauge", "Outbox items, by status.");
    if (g.outbox) {
        for (std::size_t i = 0; i < outbox_names.size(); ++i) {
            sample_name(out, "baton_outbox_items", "status", outbox_names[i]);
            append_int(out, g.outbox->by_status[i]);
            out += '\n';
        }
    }
    header(out, "baton_outbox_uncertain_items", "gauge",
           "Outbox items flagged uncertain (sent again after a crash), whatever their status.");
    if (g.outbox) {
        sample_name(out, "baton_outbox_uncertain_items");
        append_int(out, g.outbox->uncertain);
        out += '\n';
    }

    header(out, "baton_open_connections", "gauge",
           "Open connections: HTTP (not upgraded), WebSocket, and SSE event streams.");
    for (std::size_t i = 0; i < connection_names.size(); ++i) {
        sample_name(out, "baton_open_connections", "kind", connection_names[i]);
        append_int(out, connections_[i].load(relaxed));
        out += '\n';
    }
    header(out, "baton_build_info", "gauge", "The baton version, as a label.");
    sample_name(out, "baton_build_info", "version", build_version);
    out += "1\n";
    return out;
}

} // namespace baton
