#include "tests/context_daemon.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace baton::test {

namespace {

std::string role_of(const json::value& m) {
    return m.is_object() ? string_at(m.get_object(), "role") : std::string();
}

std::string content_of(const json::value& m) {
    return m.is_object() ? string_at(m.get_object(), "content") : std::string();
}

// The number after `key` in `text` ("{reply:" -> 120), if the key is there.
std::optional<std::size_t> number_after(std::string_view text, std::string_view key,
                                        std::string_view* rest = nullptr) {
    auto at = text.find(key);
    if (at == std::string_view::npos) return std::nullopt;
    const char* first = text.data() + at + key.size();
    const char* last = text.data() + text.size();
    std::size_t n = 0;
    auto [end, ec] = std::from_chars(first, last, n);
    if (ec != std::errc()) return std::nullopt;
    if (rest) *rest = std::string_view(end, static_cast<std::size_t>(last - end));
    return n;
}

struct directives {
    std::size_t reply = 16;
    std::size_t bulk_bytes = 0;
    std::size_t bulk_calls = 0;
    bool clock = false;
    std::size_t delay_ms = 0;
};

directives read_directives(std::string_view text) {
    directives d;
    if (auto n = number_after(text, "{reply:")) d.reply = *n;
    std::string_view rest;
    if (auto n = number_after(text, "{bulk:", &rest)) {
        d.bulk_bytes = *n;
        d.bulk_calls = 1;
        if (rest.starts_with('x'))
            if (auto k = number_after(rest, "x")) d.bulk_calls = *k;
    }
    d.clock = text.find("{clock}") != std::string_view::npos;
    if (auto n = number_after(text, "{delay:")) d.delay_ms = *n;
    return d;
}

json::object bulk_tool(unsigned short port) {
    return json::object{{"bulk",
                         {{"kind", "http"},
                          {"url", "http://127.0.0.1:" + std::to_string(port) + "/bulk"},
                          {"description", "returns as many bytes as asked"},
                          {"parameters",
                           {{"type", "object"},
                            {"properties", {{"bytes", {{"type", "integer"}}}}},
                            {"required", json::array{"bytes"}}}}}}};
}

json::object agent_extra(const context_options& o) {
    json::array thresholds;
    for (double t : o.thresholds)
        thresholds.emplace_back(t);
    json::array pinned;
    for (const auto& p : o.pinned)
        pinned.emplace_back(p);
    json::object context{{"reserve_output_tokens", o.reserve},
                         {"compaction_thresholds", std::move(thresholds)}};
    if (o.idle_ms) context["idle_compaction_after_ms"] = *o.idle_ms;
    return json::object{{"model", {{"context_window", o.window}}},
                        {"instructions", std::move(pinned)},
                        {"context", std::move(context)}};
}

} // namespace

std::string filler(std::size_t bytes, std::size_t seed) {
    static constexpr std::string_view words[] = {"amber ", "brook ", "cedar ", "dune ",  "ember ",
                                                 "fjord ", "grove ", "heath ", "inlet ", "juniper "};
    std::string out;
    out.reserve(bytes + 8);
    for (std::size_t i = seed; out.size() < bytes; ++i)
        out += words[i % std::size(words)];
    out.resize(bytes);
    return out;
}

std::string user_message(std::string_view tag, std::size_t bytes, std::string_view directives) {
    std::string out(tag);
    out += ' ';
    if (!directives.empty()) {
        out += directives;
        out += ' ';
    }
    if (out.size() < bytes) out += filler(bytes - out.size(), tag.size());
    return out;
}

std::string reply_text(std::size_t bytes) {
    std::string out = "reply ";
    if (out.size() < bytes) out += filler(bytes - out.size(), 3);
    return out;
}

bool is_summary_request(const recorded_request& r) {
    const auto& msgs = messages_of(r);
    return !msgs.empty() && role_of(msgs[0]) == "system" &&
           content_of(msgs[0]).starts_with(summary_prompt_start);
}

const json::array& messages_of(const recorded_request& r) {
    static const json::array none;
    const auto* body = r.body.if_object();
    const auto* msgs = body ? body->if_contains("messages") : nullptr;
    return msgs && msgs->is_array() ? msgs->get_array() : none;
}

std::vector<recorded_request> requests_for(const std::vector<recorded_request>& reqs,
                                           std::string_view text) {
    std::vector<recorded_request> out;
    for (const auto& r : reqs) {
        if (is_summary_request(r)) continue;
        const auto& msgs = messages_of(r);
        auto last_user = std::find_if(msgs.rbegin(), msgs.rend(),
                                      [](const json::value& m) { return role_of(m) == "user"; });
        if (last_user != msgs.rend() && content_of(*last_user) == text) out.push_back(r);
    }
    return out;
}

std::optional<recorded_request> first_request_for(const std::vector<recorded_request>& reqs,
                                                  std::string_view text) {
    auto all = requests_for(reqs, text);
    if (all.empty()) return std::nullopt;
    return std::move(all.front());
}

void check_pinned_first(const recorded_request& r, const std::vector<std::string>& pinned) {
    const auto& msgs = messages_of(r);
    BOOST_TEST_REQUIRE(msgs.size() > pinned.size(),
                       "a request with only " << msgs.size() << " messages");
    for (std::size_t i = 0; i < pinned.size(); ++i) {
        BOOST_TEST(role_of(msgs[i]) == "system", "message " << i << " is " << role_of(msgs[i]));
        BOOST_TEST(content_of(msgs[i]) == pinned[i], "message " << i << " is not pinned block " << i);
    }
}

std::string turn_result::error_code() const {
    const auto* e = record.if_contains("error");
    return e && e->is_object() ? string_at(e->get_object(), "code") : std::string();
}

std::vector<json::object> turn_result::compactions() const {
    std::vector<json::object> out;
    for (const auto& f : frames)
        if (f.event == "compaction" && f.data.is_object()) out.push_back(f.data.get_object());
    return out;
}

turn_result run_turn(connection& c, std::string_view sid, std::string_view text) {
    turn_result t;
    const std::string session(sid);
    auto post = c.request("POST", "/v1/sessions/" + session + "/messages",
                          json::serialize(json::object{{"text", text}}));
    BOOST_TEST_REQUIRE(post.status == 202u, "POST answered " << post.status << " " << post.body);
    t.turn_id = turn_id_of(post);
    // The stream ends after turn.finished: reading it whole waits for the turn.
    auto events = c.request("GET", "/v1/turns/" + t.turn_id + "/events");
    BOOST_TEST_REQUIRE(events.status == 200u, events.body);
    t.frames = parse_sse(events.body);
    BOOST_TEST_REQUIRE(!t.frames.empty());
    BOOST_TEST(t.frames.back().event == "turn.finished",
               "the stream ended with " << t.frames.back().event);
    t.record = body_object(c.request("GET", "/v1/turns/" + t.turn_id));
    return t;
}

std::vector<json::object> read_tape(connection& c, std::string_view sid) {
    std::vector<json::object> out;
    std::int64_t after = 0;
    for (int page = 0; page < 1000; ++page) {
        auto r = c.request("GET", "/v1/sessions/" + std::string(sid) +
                                      "/tape?after=" + std::to_string(after) + "&limit=1000");
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
        const auto& entries = body_object(r).at("entries").as_array();
        if (entries.empty()) return out;
        for (const auto& e : entries)
            out.push_back(e.as_object());
        auto next = int_at(body_object(r), "next_after");
        BOOST_TEST_REQUIRE(next > after, "next_after did not advance: " << r.body);
        after = next;
    }
    BOOST_FAIL("the tape of " << sid << " did not end within 1000 pages");
    return out;
}

std::vector<json::object> entries_of(const std::vector<json::object>& tape, std::string_view kind) {
    std::vector<json::object> out;
    for (const auto& e : tape) {
        if (string_at(e, "kind") != kind) continue;
        if (kind == "event" && string_at(e.at("payload").as_object(), "name") != "compaction") continue;
        out.push_back(e);
    }
    return out;
}

std::vector<json::object> compaction_events(const std::vector<json::object>& tape) {
    std::vector<json::object> out;
    for (const auto& e : entries_of(tape, "event")) {
        const auto* data = e.at("payload").as_object().if_contains("data");
        BOOST_TEST_REQUIRE((data && data->is_object()), "a compaction event without data: " << e);
        out.push_back(data->get_object());
    }
    return out;
}

std::vector<std::int64_t> message_ids(const std::vector<json::object>& tape, std::string_view role,
                                      std::string_view text) {
    std::vector<std::int64_t> out;
    for (const auto& e : tape) {
        if (string_at(e, "kind") != "message") continue;
        const auto& p = e.at("payload").as_object();
        if (string_at(p, "role") == role && string_at(p, "text") == text) out.push_back(int_at(e, "id"));
    }
    return out;
}

context_daemon::context_daemon(context_options o, json::object limits)
    : options(std::move(o)), summarizer([](const recorded_request&) {
          return fake_reply::completion("MODEL-SUMMARY: the user sent notes and the agent replied.");
      }),
      d(std::move(limits), false, bulk_tool(bulk.port()), agent_extra(options)),
      conn(d.connect(std::chrono::seconds(30))) {
    bulk.set_handler([](const recorded_request& r) {
        const auto* body = r.body.if_object();
        std::int64_t n = body ? int_at(*body, "bytes") : -1;
        fake_reply out;
        out.headers = {{"Content-Type", "text/plain"}};
        out.pieces = {bulk_output(n > 0 ? static_cast<std::size_t>(n) : 0)};
        return out;
    });
    d.model.report_prompt_tokens(options.token_scale);
    d.model.set_handler([this](const recorded_request& r) { return answer_request(r); });
}

context_daemon::~context_daemon() {
    if (d.daemon) stop_cleanly();
}

void context_daemon::stop_cleanly() {
    int code = d.stop();
    BOOST_TEST(code == 0, "the daemon exited with " << code);
    auto log = d.log();
    for (std::string_view bad : {"Sanitizer", "runtime error:"})
        BOOST_TEST(log.find(bad) == std::string::npos, "the daemon's log holds \"" << bad << "\":\n"
                                                                                   << log);
}

void context_daemon::restart() {
    stop_cleanly();
    d.start({"--config", (d.dir.root / "baton.json").string()});
    conn = d.connect(std::chrono::seconds(30));
}

void context_daemon::set_summarizer(answer a) {
    std::lock_guard lock(mutex);
    summarizer = std::move(a);
}

fake_reply context_daemon::answer_request(const recorded_request& r) {
    if (is_summary_request(r)) {
        answer a;
        {
            std::lock_guard lock(mutex);
            a = summarizer;
        }
        return a(r);
    }
    const auto& msgs = messages_of(r);
    auto last_user = std::find_if(msgs.rbegin(), msgs.rend(),
                                  [](const json::value& m) { return role_of(m) == "user"; });
    const std::string text = last_user == msgs.rend() ? std::string() : content_of(*last_user);
    const std::string tag = text.substr(0, text.find(' '));
    auto how = read_directives(text);
    bool after_tools = !msgs.empty() && role_of(msgs.back()) == "tool";
    if (!after_tools && (how.bulk_calls > 0 || how.clock)) {
        std::vector<std::vector<std::string>> calls;
        for (std::size_t i = 0; i < how.bulk_calls; ++i)
            calls.push_back({"call_" + tag + "_" + std::to_string(calls.size()), "bulk",
                             json::serialize(json::object{{"bytes", how.bulk_bytes}})});
        if (how.clock)
            calls.push_back({"call_" + tag + "_" + std::to_string(calls.size()), "clock", "{}"});
        return fake_reply::completion("", std::move(calls), "tool_calls");
    }
    return fake_reply::completion(reply_text(how.reply)).after(std::chrono::milliseconds(how.delay_ms));
}

std::int64_t context_daemon::model_tokens(const recorded_request& r) const {
    return static_cast<std::int64_t>(std::llround(prompt_tokens_of(r.body) * options.token_scale));
}

void context_daemon::check_every_request_fits() {
    auto reqs = d.model.requests();
    for (std::size_t i = 0; i < reqs.size(); ++i) {
        auto n = model_tokens(reqs[i]);
        BOOST_TEST(n <= budget(), "request " << i << (is_summary_request(reqs[i]) ? " (summary)" : "")
                                             << " counts " << n << " tokens, over the budget "
                                             << budget());
    }
}

} // namespace baton::test
