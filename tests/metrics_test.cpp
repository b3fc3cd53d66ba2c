// GET /metrics (docs/api.md): the Prometheus text of the real daemon, read only over HTTP and checked by
// a strict parser of the 0.0.4 exposition format on every scrape. Turns by outcome, stage and model
// call histograms, queue and connection gauges, the outbox by status. Plus the registry on its own.
#include "tests/daemon_fixture.hpp"
#include "tests/model_daemon.hpp"
#include "tests/webhook_receiver.hpp"
#include "tests/ws_client.hpp"

#include <baton/metrics.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <thread>

using namespace baton;
using namespace baton::test;

namespace {

using label_set = std::map<std::string, std::string>;

struct sample {
    std::string name;
    label_set labels;
    double value = 0;
};

struct family {
    std::string type;
    std::string help;
    std::vector<sample> samples;
};

// A parsed exposition; lookups fail the test when the sample is missing.
struct exposition {
    std::map<std::string, family> families;

    const sample* find(const std::string& name, const label_set& labels = {}) const {
        for (const auto& [fname, f] : families)
            for (const auto& s : f.samples)
                if (s.name == name && s.labels == labels) return &s;
        return nullptr;
    }
    double value(const std::string& name, const label_set& labels = {}) const {
        auto* s = find(name, labels);
        BOOST_TEST_REQUIRE(s != nullptr, "no sample " << name << " with " << labels.size() << " labels");
        return s->value;
    }
};

bool valid_name(std::string_view n, bool label) {
    if (n.empty()) return false;
    for (std::size_t i = 0; i < n.size(); ++i) {
        char c = n[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':') ||
                  (i > 0 && c >= '0' && c <= '9');
        if (!ok) return false;
    }
    return !(label && n.starts_with("__"));
}

std::optional<double> parse_value(std::string_view v) {
    if (v == "+Inf") return INFINITY;
    if (v == "-Inf") return -INFINITY;
    if (v == "NaN") return NAN;
    double d = 0;
    auto r = std::from_chars(v.data(), v.data() + v.size(), d);
    if (r.ec != std::errc() || r.ptr != v.data() + v.size()) return std::nullopt;
    return d;
}

// Parses `name{a="x",b="y"} value`; empty optional (with `why`) when the line is malformed.
std::optional<sample> parse_sample(std::string_view line, std::string& why) {
    sample s;
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ')
        ++i;
    s.name = std::string(line.substr(0, i));
    if (!valid_name(s.name, false)) return why = "bad metric name", std::nullopt;
    if (i < line.size() && line[i] == '{') {
        ++i;
        for (;;) {
            auto eq = line.find('=', i);
            if (eq == std::string_view::npos) return why = "label without '='", std::nullopt;
            std::string lname(line.substr(i, eq - i));
            if (!valid_name(lname, true)) return why = "bad label name '" + lname + "'", std::nullopt;
            i = eq + 1;
            if (i >= line.size() || line[i] != '"') return why = "label value not quoted", std::nullopt;
            ++i;
            std::string value;
            bool closed = false;
            while (i < line.size()) {
                char c = line[i++];
                if (c == '"') {
                    closed = true;
                    break;
                }
                if (c == '\\') {
                    if (i >= line.size()) return why = "dangling escape", std::nullopt;
                    char e = line[i++];
                    if (e == '\\' || e == '"')
                        value += e;
                    else if (e == 'n')
                        value += '\n';
                    else
                        return why = "bad escape", std::nullopt;
                    continue;
                }
                if (c == '\n') return why = "raw newline in a label value", std::nullopt;
                value += c;
            }
            if (!closed) return why = "unterminated label value", std::nullopt;
            if (!s.labels.emplace(lname, value).second) return why = "duplicate label", std::nullopt;
            if (i < line.size() && line[i] == ',') {
                ++i;
                continue;
            }
            if (i < line.size() && line[i] == '}') {
                ++i;
                break;
            }
            return why = "expected ',' or '}'", std::nullopt;
        }
    }
    if (i >= line.size() || line[i] != ' ')
        return why = "no single space before the value", std::nullopt;
    auto v = parse_value(line.substr(i + 1));
    if (!v) return why = "bad value (or a timestamp)", std::nullopt;
    s.value = *v;
    return s;
}

// The family a sample belongs to: a histogram's _bucket, _sum and _count belong to it.
std::string family_of(const std::map<std::string, family>& fams, const std::string& name) {
    for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
        if (!name.ends_with(suffix)) continue;
        auto base = name.substr(0, name.size() - suffix.size());
        auto it = fams.find(base);
        if (it != fams.end() && it->second.type == "histogram") return base;
    }
    return name;
}

void check_histogram(const std::string& name, const family& f) {
    std::map<label_set, std::vector<std::pair<double, double>>> buckets; // by labels without le
    std::map<label_set, double> sums, counts;
    for (const auto& s : f.samples) {
        auto labels = s.labels;
        if (s.name == name + "_bucket") {
            auto le = labels.find("le");
            BOOST_TEST_REQUIRE((le != labels.end()), name << "_bucket without le");
            auto bound = parse_value(le->second);
            BOOST_TEST_REQUIRE(bound.has_value(), "bad le " << le->second);
            labels.erase(le);
            buckets[labels].emplace_back(*bound, s.value);
        } else {
            BOOST_TEST(!labels.contains("le"), s.name << " has an le label");
            (s.name == name + "_sum" ? sums : counts)[labels] = s.value;
        }
    }
    BOOST_TEST(!buckets.empty(), name << " has no buckets");
    for (const auto& [labels, bs] : buckets) {
        for (std::size_t i = 1; i < bs.size(); ++i) {
            BOOST_TEST(bs[i].first > bs[i - 1].first, name << ": le not increasing");
            BOOST_TEST(bs[i].second >= bs[i - 1].second, name << ": buckets not cumulative");
        }
        BOOST_TEST(std::isinf(bs.back().first), name << ": the last bucket is not +Inf");
        BOOST_TEST_REQUIRE(counts.contains(labels), name << "_count missing");
        BOOST_TEST_REQUIRE(sums.contains(labels), name << "_sum missing");
        BOOST_TEST(bs.back().second == counts[labels], name << ": +Inf bucket != _count");
        BOOST_TEST(sums[labels] >= 0);
    }
    BOOST_TEST(sums.size() == buckets.size());
    BOOST_TEST(counts.size() == buckets.size());
}

// A strict reader of the text format 0.0.4 as baton writes it: HELP and TYPE once per family and
// before its samples, a family's samples together, no duplicate series, histogram invariants.
exposition parse_exposition(std::string_view text) {
    exposition out;
    BOOST_TEST_REQUIRE((!text.empty() && text.back() == '\n'), "the text does not end with a newline");
    std::set<std::string> closed;
    std::string current;
    std::set<std::pair<std::string, label_set>> series;
    std::size_t line_no = 0;
    while (!text.empty()) {
        auto nl = text.find('\n');
        auto line = text.substr(0, nl);
        text.remove_prefix(nl + 1);
        ++line_no;
        BOOST_TEST_REQUIRE(!line.empty(), "empty line " << line_no);
        if (line.starts_with("#")) {
            bool help = line.starts_with("# HELP "), type = line.starts_with("# TYPE ");
            BOOST_TEST_REQUIRE((help || type), "unexpected comment at line " << line_no << ": " << line);
            auto rest = line.substr(7);
            auto sp = rest.find(' ');
            BOOST_TEST_REQUIRE(sp != std::string_view::npos, "line " << line_no << ": " << line);
            std::string name(rest.substr(0, sp));
            BOOST_TEST_REQUIRE(valid_name(name, false), "line " << line_no << ": " << line);
            BOOST_TEST_REQUIRE(!closed.contains(name), name << " continues after another family");
            if (name != current) {
                if (!current.empty()) closed.insert(current);
                current = name;
            }
            auto& f = out.families[name];
            BOOST_TEST_REQUIRE(f.samples.empty(), "HELP/TYPE after samples of " << name);
            if (help) {
                BOOST_TEST_REQUIRE(f.help.empty(), "second HELP for " << name);
                f.help = std::string(rest.substr(sp + 1));
                BOOST_TEST(!f.help.empty());
            } else {
                BOOST_TEST_REQUIRE(f.type.empty(), "second TYPE for " << name);
                f.type = std::string(rest.substr(sp + 1));
                static const std::set<std::string> types{"counter", "gauge", "histogram", "summary",
                                                         "untyped"};
                BOOST_TEST_REQUIRE(types.contains(f.type), "unknown type " << f.type);
            }
            continue;
        }
        std::string why;
        auto s = parse_sample(line, why);
        BOOST_TEST_REQUIRE(s.has_value(), "line " << line_no << " (" << why << "): " << line);
        auto fname = family_of(out.families, s->name);
        BOOST_TEST_REQUIRE(fname == current,
                           s->name << " outside its family's block (" << current << ")");
        auto& f = out.families[fname];
        BOOST_TEST_REQUIRE(!f.type.empty(), "sample before TYPE: " << line);
        if (f.type != "histogram") {
            BOOST_TEST(!s->labels.contains("le"));
            if (f.type == "counter") BOOST_TEST(s->value >= 0, line);
        }
        BOOST_TEST_REQUIRE(series.emplace(s->name, s->labels).second, "duplicate series: " << line);
        f.samples.push_back(std::move(*s));
    }
    for (const auto& [name, f] : out.families) {
        BOOST_TEST(!f.type.empty(), name << " has no TYPE");
        BOOST_TEST(!f.help.empty(), name << " has no HELP");
        if (f.type == "histogram") check_histogram(name, f);
    }
    return out;
}

const std::vector<std::string> outcomes{"completed", "stopped", "failed", "timed_out", "step_limit"};
const std::vector<std::string> stages{"resolve_session",  "load_state", "build_prompt",
                                      "run_model",        "save_state", "render_outbound",
                                      "dispatch_outbound"};

exposition scrape(const daemon_fixture& d, const std::string& target = "/metrics") {
    auto r = d.request("GET", target);
    BOOST_TEST_REQUIRE(r.status == 200u, r.body);
    BOOST_TEST(r.header("Content-Type").value_or("") == "text/plain; version=0.0.4; charset=utf-8");
    return parse_exposition(r.body);
}

// Scrapes until `ok` holds (bounded); fails the test with the last scrape otherwise.
exposition scrape_until(const daemon_fixture& d, const std::function<bool(const exposition&)>& ok,
                        const std::string& what, std::chrono::milliseconds limit = 5s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
        auto e = scrape(d);
        if (ok(e)) return e;
        if (std::chrono::steady_clock::now() > deadline) {
            BOOST_FAIL("metrics never showed: " << what);
            return e;
        }
        std::this_thread::sleep_for(20ms);
    }
}

double outcome(const exposition& e, const std::string& o) {
    return e.value("baton_turns_total", {{"outcome", o}});
}
double stage_count(const exposition& e, const std::string& stage) {
    return e.value("baton_stage_duration_seconds_count", {{"stage", stage}});
}
double model_calls(const exposition& e, const std::string& o) {
    return e.value("baton_model_call_duration_seconds_count", {{"outcome", o}});
}
double connections(const exposition& e, const std::string& kind) {
    return e.value("baton_open_connections", {{"kind", kind}});
}
double outbox(const exposition& e, const std::string& status) {
    return e.value("baton_outbox_items", {{"status", status}});
}

} // namespace

BOOST_AUTO_TEST_SUITE(metrics)

BOOST_AUTO_TEST_CASE(the_registry_buckets_by_le_and_renders_valid_text) {
    auto reg = std::make_shared<metrics_registry>();
    using namespace std::chrono;
    reg->observe_stage(turn_stage::build_prompt, milliseconds(1)); // le is inclusive
    reg->observe_stage(turn_stage::build_prompt, microseconds(1500));
    reg->observe_stage(turn_stage::build_prompt, seconds(200)); // past the last bound
    reg->observe_model_call(false, milliseconds(30));
    reg->turn_finished(turn_status::step_limit);
    reg->turn_finished(turn_status::queued); // not an outcome: ignored
    reg->turn_accepted();
    {
        auto a = reg->open_connection(connection_kind::sse);
        auto b = std::move(a);
        BOOST_TEST(reg->open_connections(connection_kind::sse) == 1);
        auto c = reg->open_connection(connection_kind::websocket);
        b = std::move(c);
        BOOST_TEST(reg->open_connections(connection_kind::sse) == 0);
        BOOST_TEST(reg->open_connections(connection_kind::websocket) == 1);
    }
    BOOST_TEST(reg->open_connections(connection_kind::websocket) == 0);

    metrics_gauges g;
    g.queue_depth = 3;
    auto e = parse_exposition(reg->render(g));
    auto bucket = [&](const std::string& le) {
        return e.value("baton_stage_duration_seconds_bucket", {{"stage", "build_prompt"}, {"le", le}});
    };
    BOOST_TEST(bucket("0.001") == 1);
    BOOST_TEST(bucket("0.0025") == 2);
    BOOST_TEST(bucket("120") == 2);
    BOOST_TEST(bucket("+Inf") == 3);
    BOOST_TEST(e.value("baton_stage_duration_seconds_sum", {{"stage", "build_prompt"}}) == 200.0025);
    BOOST_TEST(model_calls(e, "error") == 1);
    BOOST_TEST(e.value("baton_model_call_duration_seconds_bucket",
                       {{"outcome", "error"}, {"le", "0.025"}}) == 0);
    BOOST_TEST(e.value("baton_model_call_duration_seconds_bucket",
                       {{"outcome", "error"}, {"le", "0.05"}}) == 1);
    BOOST_TEST(outcome(e, "step_limit") == 1);
    BOOST_TEST(outcome(e, "completed") == 0);
    BOOST_TEST(e.value("baton_turns_accepted_total") == 1);
    BOOST_TEST(e.value("baton_queue_depth") == 3);
    // The store could not be counted: the families are there, without samples.
    BOOST_TEST(e.families.contains("baton_outbox_items"));
    BOOST_TEST(e.families.at("baton_outbox_items").samples.empty());
}

BOOST_AUTO_TEST_CASE(the_parser_refuses_what_prometheus_would) {
    // Each of these must fail parse_exposition; checked through a sample line parser only, so
    // that the test itself stays green.
    std::string why;
    BOOST_TEST(!parse_sample("a{b=\"x\"}1", why).has_value());
    BOOST_TEST(!parse_sample("a{b=x} 1", why).has_value());
    BOOST_TEST(!parse_sample("a{b=\"x\\q\"} 1", why).has_value());
    BOOST_TEST(!parse_sample("a{b=\"x\",b=\"y\"} 1", why).has_value());
    BOOST_TEST(!parse_sample("a 1 1700000000", why).has_value());
    BOOST_TEST(!parse_sample("1a 1", why).has_value());
    BOOST_TEST(parse_sample("a{b=\"x\\\"y\\\\\\n\"} +Inf", why).has_value());
    BOOST_TEST(parse_sample("a{b=\"x\\\"y\\\\\\n\"} 1", why)->labels.at("b") == "x\"y\\\n");
}

BOOST_AUTO_TEST_CASE(a_fresh_daemon_shows_every_family_at_zero) {
    daemon_fixture d;
    auto e = scrape(d);
    const std::map<std::string, std::string> types{{"baton_turns_total", "counter"},
                                                   {"baton_turns_accepted_total", "counter"},
                                                   {"baton_turn_duration_seconds", "histogram"},
                                                   {"baton_stage_duration_seconds", "histogram"},
                                                   {"baton_model_call_duration_seconds", "histogram"},
                                                   {"baton_queue_depth", "gauge"},
                                                   {"baton_turns_running", "gauge"},
                                                   {"baton_sessions_live", "gauge"},
                                                   {"baton_store_batches_total", "counter"},
                                                   {"baton_store_calls_total", "counter"},
                                                   {"baton_outbox_items", "gauge"},
                                                   {"baton_outbox_uncertain_items", "gauge"},
                                                   {"baton_open_connections", "gauge"},
                                                   {"baton_build_info", "gauge"},
                                                   // Per tenant: no series yet, only the family.
                                                   {"baton_tenant_turns_running", "gauge"},
                                                   {"baton_tenant_sessions_waiting", "gauge"},
                                                   {"baton_tenant_turns_today", "gauge"},
                                                   {"baton_tenant_tokens_today", "gauge"},
                                                   {"baton_tenant_rate_limited_total", "counter"},
                                                   {"baton_tenant_quota_exceeded_total", "counter"}};
    for (const auto& [name, type] : types) {
        BOOST_TEST_REQUIRE(e.families.contains(name), name);
        BOOST_TEST(e.families.at(name).type == type, name);
    }
    BOOST_TEST(e.families.size() == types.size());
    for (const auto& o : outcomes)
        BOOST_TEST(outcome(e, o) == 0, o);
    BOOST_TEST(e.value("baton_turns_accepted_total") == 0);
    BOOST_TEST(e.value("baton_turn_duration_seconds_count") == 0);
    BOOST_TEST(e.value("baton_turn_duration_seconds_sum") == 0);
    BOOST_TEST(e.value("baton_turn_duration_seconds_bucket", {{"le", "+Inf"}}) == 0);
    for (const auto& s : stages)
        BOOST_TEST(stage_count(e, s) == 0, s);
    BOOST_TEST(e.families.at("baton_stage_duration_seconds").samples.size() == stages.size() * 19);
    BOOST_TEST(model_calls(e, "ok") == 0);
    BOOST_TEST(model_calls(e, "error") == 0);
    for (auto g : {"baton_queue_depth", "baton_turns_running", "baton_sessions_live",
                   "baton_outbox_uncertain_items"})
        BOOST_TEST(e.value(g) == 0, g);
    for (auto st : {"pending", "sending", "delivered", "failed"})
        BOOST_TEST(outbox(e, st) == 0, st);
    BOOST_TEST(connections(e, "http") >= 1); // this scrape's own
    BOOST_TEST(connections(e, "websocket") == 0);
    BOOST_TEST(connections(e, "sse") == 0);
    // The version label is what `baton --version` prints.
    auto v = run_baton({"--version"});
    BOOST_TEST(v.output ==
               "baton " + e.families.at("baton_build_info").samples.at(0).labels.at("version") + "\n");
    BOOST_TEST(e.value("baton_build_info", {{"version", "0.1.0"}}) == 1);
}

BOOST_AUTO_TEST_CASE(query_strings_are_ignored_and_other_methods_are_405) {
    daemon_fixture d;
    auto e = scrape(d, "/metrics?x=y&x=&=z&debug");
    BOOST_TEST(e.families.contains("baton_turns_total"));
    // A target that is not a URL at all is refused as everywhere else.
    check_error(d.request("GET", "/metrics?x=%zz"), 400, "invalid_request");
    scrape(d, "/metrics/");
    auto r = d.request("POST", "/metrics", "{}");
    check_error(r, 405, "method_not_allowed");
    BOOST_TEST(r.header("Allow").value_or("") == "GET, HEAD");
    check_error(d.request("DELETE", "/metrics"), 405, "method_not_allowed");
    // No token is needed, and the daemon is as healthy as before.
    BOOST_TEST(d.request("GET", "/healthz").status == 200u);
}

BOOST_AUTO_TEST_CASE(a_burst_of_scrapes_leaves_the_daemon_serving) {
    daemon_fixture d;
    std::vector<std::thread> scrapers;
    std::atomic<int> ok{0};
    // Connected here: Boost.Test's checks (connect() has some) are not for other threads.
    for (int t = 0; t < 4; ++t)
        scrapers.emplace_back([&ok, c = d.connect()]() mutable {
            for (int i = 0; i < 50; ++i) {
                if (!c.write(format_request("GET", "/metrics"))) return;
                auto r = c.read_response();
                if (!r || r->status != 200 || !r->body.ends_with("\n")) return;
                ++ok;
            }
        });
    auto tid = turn_id_of(d.post_message("busy", "hello"));
    for (auto& t : scrapers)
        t.join();
    BOOST_TEST(ok.load() == 200);
    BOOST_TEST(string_at(d.wait_for_turn(tid), "status") == "completed");
    auto e = scrape_until(
        d, [](const exposition& e) { return outcome(e, "completed") == 1; }, "the turn counted");
    BOOST_TEST(e.value("baton_turns_accepted_total") == 1);
}

BOOST_AUTO_TEST_CASE(completed_turns_count_once_per_stage_and_model_call) {
    model_daemon d;
    constexpr int plain = 4;
    for (int i = 0; i < plain; ++i)
        d.model.push(fake_reply::completion("reply " + std::to_string(i)));
    // One turn of two model calls: a tool call, then the answer.
    d.model.push(fake_reply::completion("", {{"call_1", "clock", "{}"}}, "tool_calls"));
    d.model.push(fake_reply::completion("the time is now"));
    for (int i = 0; i < plain; ++i)
        BOOST_TEST(string_at(d.wait_for_turn(d.post("hi", "s" + std::to_string(i))), "status") ==
                   "completed");
    BOOST_TEST(string_at(d.wait_for_turn(d.post("what time is it?", "tool")), "status") == "completed");
    constexpr int turns = plain + 1;

    auto e = scrape_until(
        d, [](const exposition& e) { return e.value("baton_turns_running") == 0; }, "no turn running");
    BOOST_TEST(outcome(e, "completed") == turns);
    for (const auto& o : outcomes)
        if (o != "completed") BOOST_TEST(outcome(e, o) == 0, o);
    BOOST_TEST(e.value("baton_turns_accepted_total") == turns);
    BOOST_TEST(e.value("baton_turn_duration_seconds_count") == turns);
    BOOST_TEST(e.value("baton_turn_duration_seconds_sum") > 0);
    for (const auto& s : stages) {
        BOOST_TEST(stage_count(e, s) == turns, s);
        BOOST_TEST(e.value("baton_stage_duration_seconds_bucket", {{"stage", s}, {"le", "+Inf"}}) ==
                   turns);
    }
    BOOST_TEST(model_calls(e, "ok") == turns + 1);
    BOOST_TEST(model_calls(e, "error") == 0);
    BOOST_TEST(e.value("baton_queue_depth") == 0);
    // SQLite: a turn is two store calls (stored, ended), and one more before its first tool call,
    // committed in batches of one or more.
    BOOST_TEST(e.value("baton_store_calls_total") >= 2 * turns + 1);
    BOOST_TEST(e.value("baton_store_batches_total") >= 1);
    BOOST_TEST(e.value("baton_store_batches_total") <= e.value("baton_store_calls_total"));
    // Counters only grow: a second scrape reads the same numbers.
    auto again = scrape(d);
    BOOST_TEST(outcome(again, "completed") == turns);
    BOOST_TEST(model_calls(again, "ok") == turns + 1);
}

BOOST_AUTO_TEST_CASE(a_failing_model_counts_failed_turns_and_model_errors) {
    model_daemon d;
    d.model.push(fake_reply::error(400, "bad request")); // not retried: one call
    d.model.push(fake_reply::completion("fine"));
    auto failed = d.wait_for_turn(d.post("hi", "bad"));
    BOOST_TEST(string_at(failed, "status") == "failed");
    BOOST_TEST(string_at(d.wait_for_turn(d.post("hi", "good")), "status") == "completed");
    auto e = scrape_until(
        d, [](const exposition& e) { return e.value("baton_turns_running") == 0; }, "no turn running");
    BOOST_TEST(outcome(e, "failed") == 1);
    BOOST_TEST(outcome(e, "completed") == 1);
    BOOST_TEST(model_calls(e, "error") == 1);
    BOOST_TEST(model_calls(e, "ok") == 1);
    BOOST_TEST(e.value("baton_turn_duration_seconds_count") == 2);
    // The failed turn went through run_model and save_state, not the outbound stages.
    for (auto s : {"resolve_session", "load_state", "build_prompt", "run_model", "save_state"})
        BOOST_TEST(stage_count(e, s) == 2, s);
    for (auto s : {"render_outbound", "dispatch_outbound"})
        BOOST_TEST(stage_count(e, s) == 1, s);
}

BOOST_AUTO_TEST_CASE(other_outcomes_are_counted_by_status) {
    model_daemon d({{"max_steps", 1}, {"turn_timeout_ms", 400}});
    d.model.push(fake_reply::completion("", {{"c", "clock", "{}"}}, "tool_calls"));
    BOOST_TEST(string_at(d.wait_for_turn(d.post("loop", "a")), "status") == "step_limit");
    d.model.push(fake_reply::completion("too late").after(1500ms));
    BOOST_TEST(string_at(d.wait_for_turn(d.post("slow", "b")), "status") == "timed_out");
    d.model.push(fake_reply::completion("too late").after(1500ms));
    auto tid = d.post("cancel me", "c");
    // Cancelled while the model is answering, so that the call is one that did not answer.
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (d.model.requests().size() < 3 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
    BOOST_TEST_REQUIRE(d.model.requests().size() == 3u);
    BOOST_TEST(d.request("POST", "/v1/turns/" + tid + "/cancel").status == 202u);
    BOOST_TEST(string_at(d.wait_for_turn(tid), "status") == "stopped");
    auto e = scrape_until(
        d, [](const exposition& e) { return e.value("baton_turns_running") == 0; }, "no turn running");
    BOOST_TEST(outcome(e, "step_limit") == 1);
    BOOST_TEST(outcome(e, "timed_out") == 1);
    BOOST_TEST(outcome(e, "stopped") == 1);
    BOOST_TEST(outcome(e, "completed") == 0);
    BOOST_TEST(e.value("baton_turn_duration_seconds_count") == 3);
    // The timed-out and the stopped calls did not answer.
    BOOST_TEST(model_calls(e, "ok") == 1);
    BOOST_TEST(model_calls(e, "error") == 2);
}

BOOST_AUTO_TEST_CASE(gauges_show_turns_waiting_behind_a_slow_model) {
    model_daemon d;
    d.model.push(fake_reply::completion("first").after(1500ms));
    d.model.push(fake_reply::completion("second"));
    d.model.push(fake_reply::completion("third"));
    std::vector<std::string> tids;
    for (auto text : {"one", "two", "three"})
        tids.push_back(d.post(text, "queue"));
    auto e = scrape_until(
        d,
        [](const exposition& e) {
            return e.value("baton_turns_running") == 1 && e.value("baton_queue_depth") == 2;
        },
        "one turn running, two waiting", 1400ms);
    BOOST_TEST(e.value("baton_sessions_live") == 1);
    BOOST_TEST(e.value("baton_turns_accepted_total") == 3);
    for (const auto& tid : tids)
        BOOST_TEST(string_at(d.wait_for_turn(tid), "status") == "completed");
    e = scrape_until(
        d,
        [](const exposition& e) {
            return e.value("baton_turns_running") == 0 && e.value("baton_queue_depth") == 0 &&
                   e.value("baton_sessions_live") == 0;
        },
        "nothing running, waiting or live");
    BOOST_TEST(outcome(e, "completed") == 3);
}

BOOST_AUTO_TEST_CASE(open_connections_follow_websockets_sse_streams_and_idle_http) {
    model_daemon d(json::object{}, true);
    auto http_is = [&](double n) {
        return [n](const exposition& e) { return connections(e, "http") == n; };
    };
    scrape_until(d, http_is(1), "only the scrape's own HTTP connection");
    {
        auto idle = d.connect();
        scrape_until(d, http_is(2), "an idle HTTP connection");
        {
            ws_client ws(d.daemon->host(), d.daemon->port());
            // An upgraded connection is no longer an HTTP one. (A scrape reads the gauges one by
            // one, so one taken while the upgrade happens may show it as neither.)
            scrape_until(
                d,
                [](const exposition& e) {
                    return connections(e, "websocket") == 1 && connections(e, "http") == 2;
                },
                "a WebSocket, and no more HTTP connections than before it");
        }
        scrape_until(
            d, [](const exposition& e) { return connections(e, "websocket") == 0; },
            "the WebSocket closed");
    }
    scrape_until(d, http_is(1), "the idle connection closed");

    // An event stream is open until its turn finishes.
    d.model.push(fake_reply::stream_text({"slow ", "reply"}).after(1500ms));
    auto tid = d.post("take your time");
    auto c = d.connect(4000ms);
    BOOST_TEST_REQUIRE(c.write(format_request("GET", "/v1/turns/" + tid + "/events")));
    scrape_until(
        d, [](const exposition& e) { return connections(e, "sse") == 1; }, "an SSE stream", 1400ms);
    BOOST_TEST(string_at(d.wait_for_turn(tid), "status") == "completed");
    scrape_until(
        d, [](const exposition& e) { return connections(e, "sse") == 0; }, "the SSE stream ended");
}

BOOST_AUTO_TEST_CASE(the_outbox_is_counted_by_status) {
    struct webhook_daemon : daemon_fixture {
        webhook_receiver receiver;
        webhook_daemon() : daemon_fixture(deferred{}) {
            json::object cfg{
                {"agents", json::object{{"default", json::object{}}}},
                {"channels",
                 {{"webhook",
                   {{"targets", {{"crm", {{"url", receiver.url()}, {"timeout_ms", 2000}}}}}}}}}};
            start({"--config", write_file("baton.json", json::serialize(cfg)).string()});
        }
    } d;
    // Replies to session "later" are refused for now: they wait for a retry, pending.
    d.receiver.answer_with([](const recorded_request& r) {
        bool later = json::serialize(r.body).find("later") != std::string::npos;
        return receiver_answer{later ? 503u : 200u, "600", 0ms};
    });
    auto post = [&](std::string_view sid) {
        json::object body{{"text", "hello"}, {"deliver", {{"channel", "webhook"}, {"to", "crm"}}}};
        auto r =
            d.request("POST", "/v1/sessions/" + std::string(sid) + "/messages", json::serialize(body));
        BOOST_TEST_REQUIRE(r.status == 202u, r.body);
        return turn_id_of(r);
    };
    for (auto sid : {"now-1", "now-2", "later"})
        BOOST_TEST(string_at(d.wait_for_turn(post(sid)), "status") == "completed");
    auto e = scrape_until(
        d,
        [](const exposition& e) {
            return outbox(e, "delivered") == 2 && outbox(e, "pending") == 1 && outbox(e, "sending") == 0;
        },
        "two delivered, one pending", 10s);
    BOOST_TEST(outbox(e, "failed") == 0);
    BOOST_TEST(e.value("baton_outbox_uncertain_items") == 0);
    BOOST_TEST(d.receiver.requests().size() >= 3u);
}

BOOST_AUTO_TEST_SUITE_END()
