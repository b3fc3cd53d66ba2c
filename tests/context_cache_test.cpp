// The context window and its budget (pipeline/context_window, context_cache, compaction): what
// enters a window, that one rebuilt from the tape equals one extended turn by turn, that it
// survives turns without store reads and is rebuilt when it cannot be trusted, and that each
// compaction stage applies at its threshold. In-process: a memory store and scripted models.
#include "pipeline/compaction.hpp"
#include "pipeline/context_cache.hpp"

#include <baton/pipeline.hpp>
#include <baton/framework.hpp>

#include "tests/delegating_store.hpp"
#include "tests/test_util.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <stdexcept>

using namespace baton;
using namespace baton::test;
using namespace baton::pipeline;

namespace {

tape_entry with_id(tape_entry e, std::int64_t id) {
    e.id = id;
    return e;
}

tape_entry anchor(std::string_view summary, std::int64_t from = 0) {
    json::object p{{"name", "a"}, {"summary", summary}};
    if (from > 0) p["from"] = from;
    return make_entry(tape_kind::anchor, std::move(p));
}

tape_entry call(std::string id, std::string name) {
    return make_entry(tape_kind::tool_call, {{"call_id", id}, {"name", name}, {"arguments", "{}"}});
}

tape_entry result(std::string id, std::string output) {
    return make_entry(tape_kind::tool_result, {{"call_id", id}, {"ok", true}, {"output", output}});
}

tape_entry stage_event(std::string_view stage, std::int64_t through) {
    return make_event_entry("compaction", json::object{{"stage", stage}, {"through", through}});
}

std::vector<std::string> texts(const std::vector<chat_message>& m) {
    std::vector<std::string> out;
    for (const auto& x : m) {
        std::string s = x.role + ":" + x.content;
        for (const auto& c : x.tool_calls)
            s += "[" + c.name + "]";
        out.push_back(s);
    }
    return out;
}

// Stores the entries with ids 1.. and returns them.
std::vector<tape_entry> numbered(std::vector<tape_entry> v) {
    for (std::size_t i = 0; i < v.size(); ++i)
        v[i].id = static_cast<std::int64_t>(i + 1);
    return v;
}

context_window window_of(const std::vector<tape_entry>& entries) {
    context_window w;
    w.set_pinned("a", {"pinned one"});
    for (const auto& e : entries)
        w.add(e);
    return w;
}

} // namespace

BOOST_AUTO_TEST_SUITE(context_cache_suite)

BOOST_AUTO_TEST_CASE(estimates_tokens_without_a_tokenizer) {
    BOOST_TEST(estimate_tokens(std::string_view("")) == 0);
    BOOST_TEST(estimate_tokens(std::string_view("abcd")) == 1);
    BOOST_TEST(estimate_tokens(std::string_view("abcde")) == 2);
    BOOST_TEST(estimate_tokens(std::string_view("日本語")) == 3); // one per non-ASCII character
    BOOST_TEST(estimate_tokens(chat_message{"user", std::string(400, 'x'), {}, {}}) == 104);
    // Reasoning counts where it goes back to the model (under a field), not where it does not.
    chat_message thought{"assistant", "ok", {}, {}};
    thought.reasoning.text = std::string(400, 'r');
    const auto bare = estimate_tokens(chat_message{"assistant", "ok", {}, {}});
    BOOST_TEST(estimate_tokens(thought) == bare);
    thought.reasoning.field = "reasoning_content";
    BOOST_TEST(estimate_tokens(thought) == bare + 100);
}

BOOST_AUTO_TEST_CASE(window_holds_pinned_blocks_then_everything_since_the_last_anchor) {
    auto w = window_of(numbered({make_message("user", "old"), anchor(""), make_message("user", "a"),
                                 make_message("assistant", "let me look"), call("c1", "clock"),
                                 call("c2", "clock"), result("c1", "noon"), result("c2", "noon"),
                                 make_message("assistant", "b")}));
    BOOST_TEST(texts(w.messages) ==
                   (std::vector<std::string>{"system:pinned one", "user:a",
                                             "assistant:let me look[clock][clock]", "tool:noon",
                                             "tool:noon", "assistant:b"}),
               boost::test_tools::per_element());
    BOOST_TEST(w.messages[3].tool_call_id == "c1");
    std::int64_t sum = 0;
    for (const auto& m : w.messages)
        sum += estimate_tokens(m);
    BOOST_TEST(w.tokens == sum);
    BOOST_TEST(w.last_id == 9);

    w.add(with_id(anchor("we spoke of noon"), 10));
    BOOST_TEST(texts(w.messages) ==
                   (std::vector<std::string>{"system:pinned one", "system:we spoke of noon"}),
               boost::test_tools::per_element());
    // An entry applied already (id <= last_id) changes nothing.
    w.add(with_id(make_message("user", "again"), 10));
    BOOST_TEST(w.messages.size() == 2u);
}

BOOST_AUTO_TEST_CASE(an_anchor_that_keeps_recent_messages_and_the_stages_rebuild_the_same) {
    std::string big(2000, 'z');
    auto tape = numbered({make_message("user", "q1"), call("c1", "fetch"), result("c1", big),
                          make_message("assistant", "a1"), make_message("user", "q2"),
                          call("c2", "fetch"), result("c2", big), make_message("assistant", "a2"),
                          stage_event("trim_tool_outputs", 8), make_message("user", "q3"),
                          make_message("assistant", "a3"), stage_event("drop_tool_rounds", 11),
                          anchor("q1 and q2 were asked", 5), make_message("user", "q4")});
    auto w = window_of(tape);
    BOOST_TEST(texts(w.messages) ==
                   (std::vector<std::string>{"system:pinned one", "system:q1 and q2 were asked",
                                             "user:q2", "assistant:a2", "user:q3", "assistant:a3",
                                             "user:q4"}),
               boost::test_tools::per_element());

    // What the store returns for a reload: from the anchor's `from` on.
    auto span = find_context_span(tape, true);
    BOOST_TEST(span.complete);
    BOOST_TEST(span.from == 5);
    std::vector<tape_entry> tail(tape.begin() + static_cast<std::ptrdiff_t>(span.first), tape.end());
    BOOST_TEST(tail.front().id == 5);
    auto rebuilt = window_of(tail);
    BOOST_TEST(texts(rebuilt.messages) == texts(w.messages), boost::test_tools::per_element());
    BOOST_TEST(rebuilt.tokens == w.tokens);

    // A tail cut after the kept entries does not reach back far enough.
    std::vector<tape_entry> short_tail(tape.begin() + 8, tape.end());
    BOOST_TEST(!find_context_span(short_tail, false).complete);
}

// The JSON a window keeps for its messages (sent instead of writing them again) must be what
// writing them now gives, through every change: a tool call joining an assistant message, trimmed
// outputs, dropped rounds, anchors, new pinned blocks. Checked after each entry of a long tape.
BOOST_AUTO_TEST_CASE(the_windows_json_is_what_writing_its_messages_now_gives) {
    std::string big = "line \"one\"\n" + std::string(1500, 'z') + "\ttab\\";
    std::vector<tape_entry> tape;
    for (int round = 0; round < 6; ++round) {
        auto n = std::to_string(round);
        tape.push_back(make_message("user", "q" + n + " \"quoted\""));
        tape.push_back(make_message("assistant", "let me look " + n));
        tape.push_back(call("c" + n, "fetch")); // joins the assistant message above
        tape.push_back(result("c" + n, round % 2 ? big : "small \u00e9 " + n));
        tape.push_back(call("d" + n, "clock")); // a call of its own
        tape.push_back(result("d" + n, "12:00"));
        tape.push_back(make_message("assistant", "a" + n + "\n"));
    }
    auto ids = numbered(std::move(tape));
    tape = ids;
    const auto id_after = [&](std::size_t i) { return tape[i].id; };
    tape.push_back(stage_event("trim_tool_outputs", id_after(20)));
    tape.push_back(make_message("user", "after trim"));
    tape.push_back(stage_event("drop_tool_rounds", id_after(30)));
    tape.push_back(make_message("user", "after drop"));
    tape.push_back(anchor("earlier: questions and answers", id_after(35)));
    tape.push_back(make_message("assistant", "after anchor"));
    // Rounds whose first change is a removal (calls of their own, no text), then an anchor
    // without a summary that keeps the last entries. The older rounds go first.
    tape.push_back(stage_event("drop_tool_rounds", 0));
    const auto first_drop = tape.size() - 1;
    for (int round = 0; round < 3; ++round) {
        auto n = std::to_string(round);
        tape.push_back(make_message("user", "u" + n));
        tape.push_back(call("e" + n, "clock")); // after a user message: a call of its own
        tape.push_back(result("e" + n, "13:0" + n));
        tape.push_back(make_message("assistant", "b" + n));
    }
    const auto mark = tape.size();
    tape.push_back(stage_event("drop_tool_rounds", 0));
    tape.push_back(make_message("user", "after the second drop"));
    tape.push_back(anchor("", 0));
    tape.push_back(make_message("user", "after an empty anchor"));
    // An anchor that keeps every message: nothing goes, its summary comes first.
    tape.push_back(anchor("all kept", 0));
    tape.push_back(make_message("user", "last"));
    // A tool result first in line: the anchor kept it but not its call.
    tape.push_back(make_message("user", "u3"));
    tape.push_back(call("e3", "clock"));
    tape.push_back(result("e3", "13:03"));
    tape.push_back(make_message("assistant", "b3"));
    tape.push_back(anchor("from a result", 0));
    tape.push_back(stage_event("drop_tool_rounds", 0));
    tape.push_back(make_message("user", "end"));
    for (std::size_t i = ids.size(); i < tape.size(); ++i)
        tape[i].id = static_cast<std::int64_t>(i + 1);
    tape[mark] = stage_event("drop_tool_rounds", tape[mark - 1].id);
    tape[mark + 2] = anchor("", tape[mark - 2].id);
    tape[first_drop] = stage_event("drop_tool_rounds", tape[first_drop - 1].id);
    tape[first_drop].id = static_cast<std::int64_t>(first_drop + 1);
    tape[mark].id = static_cast<std::int64_t>(mark + 1);
    tape[mark + 2].id = static_cast<std::int64_t>(mark + 3);
    tape[mark + 4] = anchor("all kept", tape[mark - 2].id);
    tape[mark + 4].id = static_cast<std::int64_t>(mark + 5);
    const auto result_first = tape.size() - 5;
    tape[result_first + 2] = anchor("from a result", tape[result_first].id);
    tape[result_first + 2].id = static_cast<std::int64_t>(result_first + 3);
    tape[result_first + 3] = stage_event("drop_tool_rounds", tape[result_first + 1].id);
    tape[result_first + 3].id = static_cast<std::int64_t>(result_first + 4);

    context_window w;
    w.set_pinned("a", {"pinned \"one\""});
    std::size_t encoded_before = 0;
    auto check = [&](const std::string& when) {
        // Lent as the pipeline lends it, encoded, compared, handed back.
        auto lent = std::exchange(w.messages, {});
        auto before = w.bytes();
        std::string json(w.encode(lent));
        std::string fresh;
        for (std::size_t i = 0; i < lent.size(); ++i) {
            if (i) fresh += ',';
            append_chat_message(fresh, lent[i]);
        }
        BOOST_TEST_REQUIRE(json == fresh, when);
        BOOST_TEST_REQUIRE(json::parse("[" + fresh + "]").as_array().size() == lent.size(), when);
        BOOST_TEST(w.bytes() >= before, when);
        encoded_before = json.size();
        w.messages = std::move(lent);
    };
    check("empty");
    for (std::size_t i = 0; i < tape.size(); ++i) {
        w.add(tape[i]);
        check("after entry " + std::to_string(i + 1));
    }
    BOOST_TEST(encoded_before > 0u);
    // New pinned blocks: the window is written again from them on.
    w.set_pinned("a", {"pinned two", "pinned three"});
    check("new pinned blocks");
    // A window too short to be the one lent gets no JSON.
    BOOST_TEST(w.encode({}).empty());
}

BOOST_AUTO_TEST_CASE(trim_keeps_a_preview_naming_the_entry) {
    std::string big(2000, 'z');
    auto w = window_of(numbered({make_message("user", "q"), call("c1", "fetch"), result("c1", big),
                                 result("c1", "small"), stage_event("trim_tool_outputs", 4)}));
    BOOST_REQUIRE(w.messages.size() == 5u);
    const auto& trimmed = w.messages[3].content;
    BOOST_TEST(trimmed.size() < 300u);
    BOOST_TEST(trimmed.find("tape entry 3") != std::string::npos);
    BOOST_TEST(trimmed.find("2000 bytes") != std::string::npos);
    BOOST_TEST(w.messages[4].content == "small");
    BOOST_TEST(!w.has_trimmable_outputs());
}

BOOST_AUTO_TEST_CASE(read_context_entries_reaches_back_past_a_long_tail) {
    auto st = make_memory_store();
    turn_record t;
    t.turn_id = make_turn_id();
    t.session_id = "s1";
    st->insert_turn(t, {});
    state_update u;
    u.session_id = "s1";
    for (int i = 0; i < 300; ++i)
        u.entries.push_back(make_message("user", "m" + std::to_string(i)));
    st->save_state(u);
    // No anchor: everything.
    BOOST_TEST(read_context_entries(*st, "s1").size() == 300u);
    // An anchor keeping entries from id 10 on, with 400 entries after it.
    state_update v;
    v.session_id = "s1";
    v.entries.push_back(anchor("sum", 10));
    for (int i = 0; i < 400; ++i)
        v.entries.push_back(make_message("user", "n" + std::to_string(i)));
    st->save_state(v);
    auto got = read_context_entries(*st, "s1");
    BOOST_REQUIRE(!got.empty());
    BOOST_TEST(got.front().id == 10);
    BOOST_TEST(got.size() == 291u + 1u + 400u);
}

BOOST_AUTO_TEST_CASE(cache_lends_and_takes_back_and_forgets_on_erase) {
    context_cache cache;
    json::object state;
    BOOST_TEST(!cache.lend("s1", state));
    auto w = std::make_shared<context_window>(window_of(numbered({make_message("user", "hi")})));
    cache.give_back("s1", w, {with_id(make_message("assistant", "hello"), 2)}, nullptr);
    auto got = cache.lend("s1", state);
    BOOST_REQUIRE(got);
    // While lent, nobody else gets it.
    BOOST_TEST(!cache.lend("s1", state));
    BOOST_TEST(texts(got->messages) ==
                   (std::vector<std::string>{"system:pinned one", "user:hi", "assistant:hello"}),
               boost::test_tools::per_element());
    json::object st2{{"k", 2}};
    cache.give_back("s1", got, {}, &st2);
    BOOST_REQUIRE(cache.lend("s1", state));
    BOOST_TEST(state.at("k").as_int64() == 2);
    cache.erase("s1");
    BOOST_TEST(!cache.lend("s1", state));
}

BOOST_AUTO_TEST_CASE(cache_stays_within_its_byte_budget) {
    context_cache cache(16 * 4096); // 4 KiB per shard
    for (int i = 0; i < 2000; ++i)
        cache.give_back("s" + std::to_string(i),
                        std::make_shared<context_window>(
                            window_of(numbered({make_message("user", std::string(500, 'x'))}))),
                        {}, nullptr);
    // Each session costs over 500 bytes: far fewer than 2000 fit in 64 KiB.
    BOOST_TEST(cache.sessions() < 200u);
    BOOST_TEST(cache.sessions() > 16u);
}

namespace {
// A memory store that counts tape reads and can fail the next save.
class watched_store final : public delegating_store {
public:
    void save_state(state_update& u) override {
        if (fail_next_save.exchange(false)) throw std::runtime_error("disk full");
        inner->save_state(u);
    }
    std::vector<tape_entry> tape_tail(const session_ref& s, std::size_t l) override {
        ++tail_reads;
        return inner->tape_tail(s, l);
    }
    std::atomic<bool> fail_next_save{false};
    std::atomic<int> tail_reads{0};
};

// Answers "re: <last message>"; summary requests (no tools, a summarizer's system message) get
// `summary` or, when it is empty, an exception. Reports prompt tokens as our estimate would.
struct scripted_model final : model_client {
    std::vector<model_request> requests;
    std::string summary = "the model's summary";
    int summaries = 0;
    asio::awaitable<chat_completion> complete(const model_request& req, const delta_handler&) override {
        requests.push_back(req);
        chat_completion c;
        if (req.messages.front().content.starts_with("You summarize conversations")) {
            ++summaries;
            if (summary.empty()) throw std::runtime_error("summary refused");
            c.text = summary;
            co_return c;
        }
        for (const auto& m : req.messages)
            c.prompt_tokens += estimate_tokens(m);
        c.text = "re: " + req.messages.back().content;
        co_return c;
    }
    std::string name() const override { return "scripted"; }
    std::vector<model_request> turn_requests() const {
        std::vector<model_request> out;
        for (const auto& r : requests)
            if (!r.messages.front().content.starts_with("You summarize conversations")) out.push_back(r);
        return out;
    }
};

struct turn_runner {
    io_fixture f;
    std::shared_ptr<watched_store> st = std::make_shared<watched_store>();
    store_runner db{st};
    framework fw{db, make_default_plugin(db)};
    std::shared_ptr<scripted_model> model = std::make_shared<scripted_model>();

    explicit turn_runner(std::int64_t window = 128000, std::vector<std::string> pinned = {}) {
        agent a;
        a.model = model;
        a.config.model.context_window = window;
        a.config.context.reserve_output_tokens = window / 10;
        a.config.instructions = std::move(pinned);
        fw.add_agent(a);
    }
    turn_result turn(std::string text) {
        auto run = [this](std::string t) -> asio::awaitable<turn_result> {
            inbound in;
            in.session_id = "s1";
            in.text = std::move(t);
            co_return co_await fw.process_inbound(std::move(in));
        };
        return run_bounded(f.ctx, run(std::move(text)));
    }
    std::vector<tape_entry> tape() { return st->read_tape("s1", 0, 100000); }
};
} // namespace

BOOST_AUTO_TEST_CASE(window_survives_turns_and_is_reloaded_after_a_failed_save) {
    turn_runner r;
    r.turn("one");
    r.turn("two");
    r.turn("three");
    // Only the first turn read the tape; the next ones used the cached window.
    BOOST_TEST(r.st->tail_reads.load() == 1);
    r.st->fail_next_save = true;
    BOOST_CHECK_THROW(r.turn("lost"), std::runtime_error);
    r.turn("four");
    // After the failed save the window came from the store again, without the lost turn.
    BOOST_TEST(r.st->tail_reads.load() == 2);
    std::vector<std::size_t> sizes;
    for (const auto& q : r.model->requests)
        sizes.push_back(q.messages.size());
    BOOST_TEST(sizes == (std::vector<std::size_t>{1, 3, 5, 7, 7}), boost::test_tools::per_element());
    BOOST_TEST(r.tape().size() == 8u);
}

BOOST_AUTO_TEST_CASE(long_session_stays_within_budget_and_keeps_pinned_blocks_and_the_tape) {
    // Budget 450 tokens: a few dozen messages fit; 300 turns need many summaries.
    turn_runner r(500, {"pinned A", "pinned B"});
    for (int i = 0; i < 300; ++i) {
        auto res = r.turn("message " + std::to_string(i) + " " + std::string(static_cast<std::size_t>(i % 7) * 20, 'w'));
        BOOST_TEST_REQUIRE((res.status == turn_status::completed), "turn " << i);
    }
    auto requests = r.model->turn_requests();
    BOOST_REQUIRE(requests.size() == 300u);
    for (const auto& q : requests) {
        std::int64_t t = 0;
        for (const auto& m : q.messages)
            t += estimate_tokens(m);
        BOOST_TEST(t <= 450);
        BOOST_REQUIRE(q.messages.size() >= 3u);
        BOOST_TEST(q.messages[0].content == "pinned A");
        BOOST_TEST(q.messages[1].content == "pinned B");
    }
    BOOST_TEST(r.model->summaries > 3);
    int users = 0, anchors = 0;
    for (const auto& e : r.tape()) {
        if (e.kind == tape_kind::message && e.payload.at("role") == "user") ++users;
        if (e.kind == tape_kind::anchor) ++anchors;
    }
    BOOST_TEST(users == 300);
    BOOST_TEST(anchors >= r.model->summaries);
}

BOOST_AUTO_TEST_CASE(summary_falls_back_to_an_extract_when_the_model_fails) {
    turn_runner r(500);
    r.model->summary.clear(); // summary calls throw
    for (int i = 0; i < 60; ++i)
        BOOST_TEST_REQUIRE((r.turn("question " + std::to_string(i) + std::string(60, 'q')).status ==
                            turn_status::completed));
    bool found = false;
    for (const auto& e : r.tape()) {
        if (e.kind != tape_kind::anchor) continue;
        found = true;
        BOOST_TEST(std::string(e.payload.at("summary").as_string()).starts_with("Earlier conversation (extract):"));
    }
    BOOST_TEST(found);
    BOOST_TEST(r.model->summaries > 0);
}

BOOST_AUTO_TEST_CASE(pinned_blocks_and_message_that_cannot_fit_fail_the_turn_unsent) {
    turn_runner r(200, {std::string(400, 'p')});
    BOOST_CHECK_EXCEPTION(r.turn(std::string(400, 'm')), turn_error,
                          [](const turn_error& e) { return e.code() == "context_overflow"; });
    BOOST_TEST(r.model->requests.empty());
    BOOST_TEST((r.turn("short").status == turn_status::completed));
}

BOOST_AUTO_TEST_CASE(stages_apply_at_their_thresholds) {
    // A window with two large tool results, compacted with growing extra load.
    io_fixture f;
    auto model = std::make_shared<scripted_model>();
    agent a;
    a.model = model;
    a.config.model.context_window = 2000;
    a.config.context.reserve_output_tokens = 0; // budget 2000: stages at 1200, 1500, 1800
    std::string big(2000, 'z');                 // ~500 tokens each
    auto base = numbered({make_message("user", "q1"), call("c1", "fetch"), result("c1", big),
                          make_message("assistant", "a1"), make_message("user", "q2"),
                          call("c2", "fetch"), result("c2", big), make_message("assistant", "a2")});
    auto run = [&](std::int64_t extra) {
        auto w = window_of(base);
        std::vector<tape_entry> out;
        run_bounded(f.ctx, compact({&a, extra, compaction_trigger::turn, nullptr}, w, out));
        std::vector<std::string> stages;
        for (const auto& e : out)
            if (e.kind == tape_kind::event)
                stages.push_back(std::string(e.payload.at("data").at("stage").as_string()));
        return std::pair{stages, w};
    };
    auto w0 = window_of(base);
    BOOST_TEST_REQUIRE(w0.tokens > 1000);
    BOOST_TEST_REQUIRE(w0.tokens < 1100);
    // Below the first threshold: nothing.
    BOOST_TEST(run(1190 - w0.tokens).first.empty());
    // Over the first: outputs trimmed, and that is enough.
    auto [s1, w1] = run(1210 - w0.tokens);
    BOOST_TEST(s1 == (std::vector<std::string>{"trim_tool_outputs"}), boost::test_tools::per_element());
    BOOST_TEST(w1.tokens < w0.tokens);
    // Still over the second once trimmed: tool rounds dropped too.
    auto [s2, w2] = run(1505 - w1.tokens);
    BOOST_TEST(s2 == (std::vector<std::string>{"trim_tool_outputs", "drop_tool_rounds"}),
               boost::test_tools::per_element());
    BOOST_TEST(!w2.has_tool_rounds());
    // Still over the third without tool rounds: older messages summarised, and that is enough.
    auto [s3, w3] = run(1805 - w2.tokens);
    BOOST_TEST(s3 == (std::vector<std::string>{"trim_tool_outputs", "drop_tool_rounds", "summarize"}),
               boost::test_tools::per_element());
    BOOST_TEST(w3.summary() == "the model's summary");
    // The new message alone (1790) all but reaches the third: no handoff could bring the context
    // under it, and the summarised context fits the budget, so the summary stays.
    auto [s4, w4] = run(1790);
    BOOST_TEST(s4 == (std::vector<std::string>{"trim_tool_outputs", "drop_tool_rounds", "summarize"}),
               boost::test_tools::per_element());
    BOOST_TEST(w4.summary() == "the model's summary");
    BOOST_TEST(estimate_with(w4, 1790) <= 2000);
    // So far over that even the summary does not fit: handed off with what the budget leaves.
    auto [s5, w5] = run(1990); // with the pinned block 1997 of 2000
    BOOST_TEST(s5.size() == 4u);
    BOOST_TEST(s5.back() == "handoff");
    BOOST_TEST(estimate_with(w5, 1990) <= 2000);
    BOOST_TEST(w5.items.size() <= w5.pinned + 1);
}

BOOST_AUTO_TEST_CASE(handoff_and_reset_start_new_anchors_without_the_model) {
    turn_runner r;
    r.turn("remember the number 42");
    auto before = r.model->requests.size();
    auto h = r.turn("/handoff topic-2");
    BOOST_TEST(h.direct_command);
    BOOST_TEST(r.model->requests.size() == before);
    r.turn("next");
    auto q = r.model->requests.back();
    BOOST_REQUIRE(q.messages.size() == 2u);
    BOOST_TEST(q.messages[0].role == "system");
    BOOST_TEST(q.messages[0].content.find("remember the number 42") != std::string::npos);
    r.turn("/reset");
    r.turn("after reset");
    BOOST_TEST(r.model->requests.back().messages.size() == 1u);
    // The tape still has everything.
    int users = 0;
    for (const auto& e : r.tape())
        if (e.kind == tape_kind::message && e.payload.at("role") == "user") ++users;
    BOOST_TEST(users == 5);
}

BOOST_AUTO_TEST_SUITE_END()
