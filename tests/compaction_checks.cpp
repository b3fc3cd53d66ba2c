#include "tests/compaction_checks.hpp"

namespace baton::test {

std::vector<std::string> fill_past_t3(context_daemon& c, const fill_plan& plan, std::string_view sid) {
    std::vector<std::string> sent;
    for (int i = 1; i <= plan.notes + 1; ++i) {
        bool last = i == plan.notes + 1;
        auto text = last ? user_message("last-note", plan.last_bytes,
                                        "{reply:" + std::to_string(plan.last_reply) + "}")
                         : user_message("note-" + std::to_string(i), plan.note_bytes, "{reply:40}");
        auto t = c.turn(text, sid);
        BOOST_TEST_REQUIRE(t.status() == "completed", "fill turn " << i << ": " << t.record);
        BOOST_TEST(t.compactions().empty(), "fill turn " << i << " compacted");
        sent.push_back(text);
    }
    // The scenario's own check, with the fake's count.
    auto reqs = c.d.model.requests();
    auto last = first_request_for(reqs, sent.back());
    BOOST_TEST_REQUIRE(last.has_value());
    auto before = prompt_tokens_of(last->body);
    BOOST_TEST_REQUIRE(before < c.threshold(3) * 95 / 100,
                       "setup: the last fill turn counts " << before);
    BOOST_TEST_REQUIRE(before + message_tokens(plan.last_reply) > c.threshold(3) * 104 / 100,
                       "setup: the window after the last fill turn is "
                           << before + message_tokens(plan.last_reply));
    return sent;
}

json::object only_event_at(const std::vector<json::object>& events, std::int64_t level) {
    std::vector<json::object> at;
    for (const auto& e : events)
        if (int_at(e, "level") == level) at.push_back(e);
    BOOST_TEST_REQUIRE(at.size() == 1u, at.size() << " compaction events at level " << level);
    return at.front();
}

std::vector<std::int64_t> levels_of(const std::vector<json::object>& events) {
    std::vector<std::int64_t> out;
    for (const auto& e : events)
        out.push_back(int_at(e, "level"));
    return out;
}

void check_event(const json::object& e, std::string_view stage, std::int64_t level,
                 std::string_view trigger, std::int64_t at_least) {
    BOOST_TEST(string_at(e, "stage") == stage, e);
    BOOST_TEST(int_at(e, "level") == level, e);
    BOOST_TEST(string_at(e, "trigger") == trigger, e);
    auto before = int_at(e, "before_tokens");
    auto after = int_at(e, "after_tokens");
    BOOST_TEST(after >= 0, e);
    BOOST_TEST(before > after, e);
    BOOST_TEST(before >= at_least, "before_tokens " << before << " is under the threshold " << at_least);
}

void check_frame(const turn_result& t, std::string_view stage) {
    auto frames = t.compactions();
    bool found = false;
    for (const auto& f : frames) {
        BOOST_TEST(int_at(f, "before_tokens") > int_at(f, "after_tokens"), f);
        found = found || string_at(f, "stage") == stage;
    }
    BOOST_TEST(found, "no compaction frame with stage " << stage << " among " << frames.size());
}

std::vector<const json::value*> with_role(const recorded_request& r, std::string_view role) {
    std::vector<const json::value*> out;
    for (const auto& m : messages_of(r))
        if (string_at(m.as_object(), "role") == role) out.push_back(&m);
    return out;
}

std::string describe(const recorded_request& r) {
    std::string out = is_summary_request(r) ? "summary request [" : "[";
    std::string tag;
    for (const auto& m : messages_of(r)) {
        const auto& o = m.as_object();
        auto role = string_at(o, "role");
        auto content = string_at(o, "content");
        if (role == "user") tag = content.substr(0, content.find(' '));
        out += role.substr(0, 1) +
               std::to_string(prompt_tokens_of(json::object{{"messages", json::array{m}}})) + " ";
    }
    return (tag.empty() ? "" : tag + " ") + out + "]";
}

std::vector<recorded_request> summary_requests(const context_daemon& c) {
    std::vector<recorded_request> out;
    for (auto& r : c.d.model.requests())
        if (is_summary_request(r)) out.push_back(std::move(r));
    return out;
}

} // namespace baton::test
