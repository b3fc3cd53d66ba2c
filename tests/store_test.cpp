// Store conformance: every check runs against each store implementation, so the memory store used by
// tests and benches cannot drift from the SQLite store the daemon uses. SQLite-only checks
// (durability, schema versioning, open errors) are in the store_sqlite suite at the end.
#include <baton/store.hpp>

#include "src/store/sqlite_schema.hpp"
#include "tests/pg_test.hpp"

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <sqlite3.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <thread>

namespace bdata = boost::unit_test::data;
namespace fs = std::filesystem;
using namespace baton;

namespace {

// A directory of its own under the system temp dir, removed with everything in it (-wal, -shm too).
struct temp_dir {
    fs::path root;
    temp_dir() {
        static std::atomic<int> counter{0};
        std::random_device rd;
        root = fs::temp_directory_path() /
               ("baton-store-test-" + std::to_string(rd()) + "-" + std::to_string(counter++));
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(root, ec);
    }
    // Nested below root, so opening it also checks that parent directories are created.
    std::string db_path() const { return (root / "data" / "baton.db").string(); }
};

using test::pg_schema;
using test::test_pg;

std::unique_ptr<store> open_store(const std::string& kind, const temp_dir& dir,
                                  const std::optional<pg_schema>& schema = std::nullopt) {
    if (kind == "memory") return make_memory_store();
    if (kind == "postgres") return make_postgres_store({.conninfo = schema->conninfo()});
    return make_sqlite_store({.path = dir.db_path(), .synchronous = "normal"});
}

struct store_fixture {
    temp_dir dir;
    std::optional<pg_schema> schema;
    std::unique_ptr<store> s;
    explicit store_fixture(const std::string& kind)
        : schema(kind == "postgres" ? std::optional<pg_schema>(std::in_place) : std::nullopt),
          s(open_store(kind, dir, schema)) {}
};

std::vector<std::string> store_kinds() {
    std::vector<std::string> k{"memory", "sqlite"};
    if (!test_pg().empty())
        k.push_back("postgres");
    else
        std::fprintf(stderr, "store conformance: BATON_TEST_PG is not set, the PostgreSQL store "
                             "is not tested (scripts/test starts a cluster when PostgreSQL is "
                             "installed)\n");
    return k;
}

const std::vector<std::string> kinds = store_kinds();

turn_record make_turn(std::string turn_id, std::string session_id) {
    turn_record t;
    t.turn_id = std::move(turn_id);
    t.session_id = std::move(session_id);
    t.created_at = 1'700'000'000'000;
    t.input.text = "hello from " + t.turn_id;
    return t;
}

state_update entries_for(const std::string& sid, const std::string& tid, int n) {
    state_update u{sid, tid, {}, std::nullopt};
    for (int i = 0; i < n; ++i)
        u.entries.push_back(make_message("user", "m" + std::to_string(i)));
    return u;
}

// The end of a turn that was never stored: N tape entries and an outbox item for session s9 come
// before its record, which names the unknown turn t_missing and so fails.
turn_end end_of_unknown_turn(int entries) {
    turn_end end;
    end.state = entries_for("s9", "t_missing", entries);
    outbox_item o;
    o.key = "ob_orphan";
    o.turn_id = "t_missing";
    o.session_id = "s9";
    o.channel = "ws";
    o.recipient = "s9";
    o.text = "x";
    end.outbox = {o};
    auto ghost = make_turn("t_missing", "s9");
    ghost.status = turn_status::completed;
    end.finished = {ghost};
    return end;
}

std::vector<std::int64_t> ids_of(const std::vector<tape_entry>& v) {
    std::vector<std::int64_t> ids;
    for (const auto& e : v)
        ids.push_back(e.id);
    return ids;
}

std::vector<std::string> turn_ids_of(const std::vector<turn_record>& v) {
    std::vector<std::string> ids;
    for (const auto& t : v)
        ids.push_back(t.turn_id);
    return ids;
}

void check_same_turn(const turn_record& got, const turn_record& want) {
    BOOST_TEST(got.turn_id == want.turn_id);
    BOOST_TEST(got.session_id == want.session_id);
    BOOST_TEST(got.agent == want.agent);
    BOOST_TEST(got.tenant == want.tenant);
    BOOST_TEST(to_string(got.status) == to_string(want.status));
    BOOST_TEST((got.reply == want.reply));
    BOOST_TEST(got.refusal == want.refusal);
    BOOST_TEST(got.steps == want.steps);
    BOOST_TEST(got.usage.prompt_tokens == want.usage.prompt_tokens);
    BOOST_TEST(got.usage.completion_tokens == want.usage.completion_tokens);
    BOOST_TEST(got.error.has_value() == want.error.has_value());
    if (got.error && want.error) {
        BOOST_TEST(got.error->code == want.error->code);
        BOOST_TEST(got.error->message == want.error->message);
    }
    BOOST_TEST(got.created_at == want.created_at);
    BOOST_TEST((got.started_at == want.started_at));
    BOOST_TEST((got.finished_at == want.finished_at));
    BOOST_TEST(got.attempt == want.attempt);
    BOOST_TEST(got.side_effects == want.side_effects);
    BOOST_TEST(got.input.channel == want.input.channel);
    BOOST_TEST(got.input.text == want.input.text);
    BOOST_TEST(json::serialize(got.input.metadata) == json::serialize(want.input.metadata));
    BOOST_TEST(json::serialize(got.input.deliver) == json::serialize(want.input.deliver));
}

} // namespace

BOOST_AUTO_TEST_SUITE(store_conformance)

BOOST_DATA_TEST_CASE(turn_round_trip_keeps_every_field, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto full = make_turn("t_full", "s1");
    full.agent = "helper";
    full.tenant = "acme";
    full.status = turn_status::running;
    full.reply = "partial \"quoted\" reply \xc3\xa9";
    full.steps = 4;
    full.usage = {120, 34};
    full.error = error_info{"model_error", "upstream said no"};
    full.started_at = 1'700'000'000'500;
    full.finished_at = 1'700'000'001'000;
    full.input.channel = "ws";
    full.input.metadata = {{"user", "u-1"}, {"nested", {{"a", json::array{1, 2, 3}}, {"b", nullptr}}}};
    full.input.deliver = {{"channel", "webhook"}, {"to", "crm"}};
    BOOST_TEST((f.s->insert_turn(full, {}).outcome == insert_outcome::inserted));

    // Optional fields left unset must come back unset, not as empty strings or zeros.
    auto bare = make_turn("t_bare", "s1");
    f.s->insert_turn(bare, {});

    auto got_full = f.s->get_turn("t_full");
    BOOST_TEST_REQUIRE(got_full.has_value());
    check_same_turn(*got_full, full);
    auto got_bare = f.s->get_turn("t_bare");
    BOOST_TEST_REQUIRE(got_bare.has_value());
    check_same_turn(*got_bare, bare);
    BOOST_TEST(!got_bare->reply.has_value());
    BOOST_TEST(!got_bare->error.has_value());
    BOOST_TEST(!got_bare->started_at.has_value());
    BOOST_TEST(got_bare->input.deliver.is_null());
}

BOOST_DATA_TEST_CASE(missing_records_are_absent, bdata::make(kinds), kind) {
    store_fixture f(kind);
    BOOST_TEST(!f.s->get_turn("t_nope").has_value());
    BOOST_TEST(!f.s->get_session("nope").has_value());
    BOOST_TEST(f.s->read_tape("nope", 0, 10).empty());
    BOOST_TEST(f.s->tape_tail("nope", 10).empty());
    BOOST_TEST(f.s->unfinished_turns().empty());
}

BOOST_DATA_TEST_CASE(idempotency_key_replay_and_reuse, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto first = f.s->insert_turn(make_turn("t_1", "s1"), {"key-1", "fp-a"});
    BOOST_TEST((first.outcome == insert_outcome::inserted));
    BOOST_TEST(first.turn_id == "t_1");

    auto replay = f.s->insert_turn(make_turn("t_2", "s1"), {"key-1", "fp-a"});
    BOOST_TEST((replay.outcome == insert_outcome::replayed));
    BOOST_TEST(replay.turn_id == "t_1");

    auto reuse = f.s->insert_turn(make_turn("t_3", "s1"), {"key-1", "fp-b"});
    BOOST_TEST((reuse.outcome == insert_outcome::key_reused));
    BOOST_TEST(reuse.turn_id == "t_1");

    // Neither the replay nor the reuse stored anything.
    BOOST_TEST(!f.s->get_turn("t_2").has_value());
    BOOST_TEST(!f.s->get_turn("t_3").has_value());
    BOOST_TEST(f.s->get_session("s1")->turns == 1);
    BOOST_TEST(f.s->unfinished_turns().size() == 1u);

    // No key never deduplicates; another key is independent (also across sessions).
    BOOST_TEST((f.s->insert_turn(make_turn("t_4", "s1"), {}).outcome == insert_outcome::inserted));
    BOOST_TEST((f.s->insert_turn(make_turn("t_5", "s1"), {}).outcome == insert_outcome::inserted));
    BOOST_TEST((f.s->insert_turn(make_turn("t_6", "s2"), {"key-2", "fp-a"}).outcome ==
                insert_outcome::inserted));
    auto other_session = f.s->insert_turn(make_turn("t_7", "s2"), {"key-1", "fp-a"});
    BOOST_TEST((other_session.outcome == insert_outcome::replayed));
    BOOST_TEST(other_session.turn_id == "t_1");

    // find_idempotency answers as insert_turn would, and stores nothing.
    const std::string tenant{default_tenant};
    auto found = f.s->find_idempotency(tenant, {"key-1", "fp-a"});
    BOOST_TEST_REQUIRE(found.has_value());
    BOOST_TEST((found->outcome == insert_outcome::replayed));
    BOOST_TEST(found->turn_id == "t_1");
    auto other = f.s->find_idempotency(tenant, {"key-1", "fp-b"});
    BOOST_TEST_REQUIRE(other.has_value());
    BOOST_TEST((other->outcome == insert_outcome::key_reused));
    BOOST_TEST(!f.s->find_idempotency(tenant, {"key-9", "fp-a"}).has_value());
    BOOST_TEST(!f.s->find_idempotency("another", {"key-1", "fp-a"}).has_value());
    BOOST_TEST(f.s->get_session("s1")->turns == 3);
}

BOOST_DATA_TEST_CASE(duplicate_turn_id_throws_and_changes_nothing, bdata::make(kinds), kind) {
    store_fixture f(kind);
    f.s->insert_turn(make_turn("t_1", "s1"), {});
    auto again = make_turn("t_1", "s2");
    BOOST_CHECK_THROW(f.s->insert_turn(again, {"k", "fp"}), std::runtime_error);
    BOOST_TEST(f.s->get_session("s1")->turns == 1);
    BOOST_TEST(!f.s->get_session("s2").has_value());
    // The failed insert did not claim its idempotency key either.
    BOOST_TEST(
        (f.s->insert_turn(make_turn("t_2", "s1"), {"k", "fp"}).outcome == insert_outcome::inserted));
}

BOOST_DATA_TEST_CASE(session_counts_turns_and_remembers_the_last, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto t1 = make_turn("t_1", "s1");
    t1.agent = "helper";
    t1.created_at = 1000;
    f.s->insert_turn(t1, {});
    auto t2 = make_turn("t_2", "s1");
    t2.agent = "other"; // a later turn does not rename the session's agent
    t2.created_at = 2000;
    f.s->insert_turn(t2, {});
    f.s->insert_turn(make_turn("t_3", "s2"), {});
    f.s->insert_turn(make_turn("t_0", "s1"), {});

    auto s1 = f.s->get_session("s1");
    BOOST_TEST_REQUIRE(s1.has_value());
    BOOST_TEST(s1->session_id == "s1");
    BOOST_TEST(s1->turns == 3);
    BOOST_TEST(s1->last_turn_id.value_or("") == "t_0");
    BOOST_TEST(s1->agent == "helper");
    BOOST_TEST(s1->tenant == std::string(default_tenant));
    BOOST_TEST(s1->created_at == 1000);
    BOOST_TEST(s1->state.empty());
    BOOST_TEST(f.s->get_session("s2")->turns == 1);
    BOOST_TEST(f.s->get_session("s2")->last_turn_id.value_or("") == "t_3");
}

BOOST_DATA_TEST_CASE(tape_ids_increase_per_session, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto u = entries_for("s1", "t_1", 3);
    u.entries[1].created_at = 42; // kept when set
    u.entries[2].turn_id = "t_x"; // kept when set
    f.s->save_state(u);
    BOOST_TEST(ids_of(u.entries) == (std::vector<std::int64_t>{1, 2, 3}));
    BOOST_TEST(u.entries[0].turn_id == "t_1");
    BOOST_TEST(u.entries[2].turn_id == "t_x");
    BOOST_TEST(u.entries[1].created_at == 42);

    auto no_time = entries_for("s1", "t_2", 1);
    no_time.entries[0].created_at = 0;
    auto before = now_ms();
    f.s->save_state(no_time);
    BOOST_TEST(no_time.entries[0].id == 4);
    BOOST_TEST(no_time.entries[0].created_at >= before);

    auto other = entries_for("s2", "t_9", 2);
    f.s->save_state(other);
    BOOST_TEST(ids_of(other.entries) == (std::vector<std::int64_t>{1, 2}));

    auto more = entries_for("s1", "t_3", 2);
    more.entries[0] = make_event_entry("compaction", {{"before_tokens", 10}});
    f.s->save_state(more);
    BOOST_TEST(ids_of(more.entries) == (std::vector<std::int64_t>{5, 6}));

    auto tape = f.s->read_tape("s1", 0, 100);
    BOOST_TEST(ids_of(tape) == (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}));
    BOOST_TEST_REQUIRE(tape.size() == 6u);
    BOOST_TEST(tape[1].created_at == 42);
    BOOST_TEST(tape[2].turn_id == "t_x");
    BOOST_TEST(tape[4].turn_id == "t_3");
    BOOST_TEST(to_string(tape[4].kind) == "event");
    BOOST_TEST(json::serialize(tape[4].payload) == json::serialize(more.entries[0].payload));
    BOOST_TEST(json::serialize(tape[0].payload) == R"({"role":"user","text":"m0"})");
}

BOOST_DATA_TEST_CASE(read_tape_pages_after_and_limit, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto u = entries_for("s1", "t_1", 10);
    f.s->save_state(u);
    BOOST_TEST(ids_of(f.s->read_tape("s1", 0, 4)) == (std::vector<std::int64_t>{1, 2, 3, 4}));
    BOOST_TEST(ids_of(f.s->read_tape("s1", 4, 4)) == (std::vector<std::int64_t>{5, 6, 7, 8}));
    BOOST_TEST(ids_of(f.s->read_tape("s1", 8, 4)) == (std::vector<std::int64_t>{9, 10}));
    BOOST_TEST(f.s->read_tape("s1", 10, 4).empty());
    BOOST_TEST(f.s->read_tape("s1", 0, 0).empty());
    BOOST_TEST(f.s->read_tape("s1", -3, 2).size() == 2u);
    // "No limit" spelt as the largest size_t must not overflow into a negative SQL LIMIT.
    BOOST_TEST(f.s->read_tape("s1", 0, std::numeric_limits<std::size_t>::max()).size() == 10u);
}

BOOST_DATA_TEST_CASE(tape_payloads_come_back_as_written, bdata::make(kinds), kind) {
    store_fixture f(kind);
    // Plain messages (which the memory store packs as role and raw text) and everything else.
    std::vector<std::pair<tape_kind, std::string>> written{
        {tape_kind::message, R"({"role":"user","text":"hi \"you\"\n\u00e9"})"},
        {tape_kind::message, R"({"role":"assistant","text":""})"},
        {tape_kind::message, R"({"role":"critic","text":"x"})"},
        {tape_kind::message, R"({"text":"y","role":"user"})"},
        {tape_kind::message, R"({"role":"user","text":"z","name":"n"})"},
        {tape_kind::message, R"({"role":"tool","text":7})"},
        {tape_kind::event, R"({})"},
        {tape_kind::event, R"({"a":1})"},
        {tape_kind::tool_call, R"({"call_id":"c1","name":"f","arguments":{"q":[1,2.5,null,true]}})"},
    };
    state_update u;
    u.session_id = "s1";
    u.turn_id = "t_1";
    for (const auto& [k, text] : written)
        u.entries.push_back(make_entry(k, json::parse(text).as_object()));
    f.s->save_state(u);
    auto back = f.s->read_tape("s1", 0, 100);
    BOOST_TEST_REQUIRE(back.size() == written.size());
    for (std::size_t i = 0; i < back.size(); ++i) {
        BOOST_TEST((back[i].kind == written[i].first));
        BOOST_TEST(json::serialize(back[i].payload) == json::serialize(json::parse(written[i].second)));
        BOOST_TEST(back[i].turn_id == "t_1");
    }
}

BOOST_DATA_TEST_CASE(tape_tail_returns_the_last_entries_ascending, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto u = entries_for("s1", "t_1", 10);
    f.s->save_state(u);
    auto other = entries_for("s2", "t_2", 5);
    f.s->save_state(other);
    auto tail = f.s->tape_tail("s1", 3);
    BOOST_TEST(ids_of(tail) == (std::vector<std::int64_t>{8, 9, 10}));
    BOOST_TEST(tail.back().payload.at("text").as_string() == "m9");
    BOOST_TEST(f.s->tape_tail("s1", 20).size() == 10u);
    BOOST_TEST(f.s->tape_tail("s1", 0).empty());
    BOOST_TEST(ids_of(f.s->tape_tail("s2", 1)) == (std::vector<std::int64_t>{5}));
}

BOOST_DATA_TEST_CASE(save_state_replaces_state_and_creates_the_session, bdata::make(kinds), kind) {
    store_fixture f(kind);
    state_update u{"s1", "", {}, json::object{{"a", 1}, {"nested", {{"x", "y"}}}}};
    auto before = now_ms();
    f.s->save_state(u);
    auto s = f.s->get_session("s1");
    BOOST_TEST_REQUIRE(s.has_value());
    BOOST_TEST(json::serialize(s->state) == R"({"a":1,"nested":{"x":"y"}})");
    BOOST_TEST(s->turns == 0);
    BOOST_TEST(!s->last_turn_id.has_value());
    BOOST_TEST(s->agent == "default");
    BOOST_TEST(s->created_at >= before);

    // No state in the update: the stored state is left alone.
    auto only_tape = entries_for("s1", "t_1", 1);
    f.s->save_state(only_tape);
    BOOST_TEST(json::serialize(f.s->get_session("s1")->state) == R"({"a":1,"nested":{"x":"y"}})");

    // A new state replaces the old one whole: keys are not merged.
    state_update replace{"s1", "", {}, json::object{{"b", 2}}};
    f.s->save_state(replace);
    BOOST_TEST(json::serialize(f.s->get_session("s1")->state) == R"({"b":2})");

    // A later turn on a session made by save_state counts normally.
    f.s->insert_turn(make_turn("t_1", "s1"), {});
    BOOST_TEST(f.s->get_session("s1")->turns == 1);
    BOOST_TEST(json::serialize(f.s->get_session("s1")->state) == R"({"b":2})");
}

BOOST_DATA_TEST_CASE(mark_running_then_finish_turn, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto t = make_turn("t_1", "s1");
    t.input.metadata = {{"k", "v"}};
    f.s->insert_turn(t, {});
    f.s->mark_running("t_1", 1'700'000'000'100);
    auto running = f.s->get_turn("t_1");
    BOOST_TEST((running->status == turn_status::running));
    BOOST_TEST(running->started_at.value_or(0) == 1'700'000'000'100);

    t.status = turn_status::completed;
    t.reply = "I can't help with that.";
    t.refusal = true;
    t.steps = 3;
    t.usage = {10, 20};
    t.started_at = 1'700'000'000'200; // finish_turn's record is the final word, started_at included
    t.finished_at = 1'700'000'000'900;
    f.s->finish_turn(t);
    check_same_turn(*f.s->get_turn("t_1"), t);
    t.refusal = false;
    t.reply = "done";
    f.s->finish_turn(t);
    check_same_turn(*f.s->get_turn("t_1"), t);

    // A later finish overwrites: the error is set and the reply cleared.
    t.status = turn_status::failed;
    t.reply.reset();
    t.error = error_info{"abandoned", "the process stopped mid-turn"};
    f.s->finish_turn(t);
    check_same_turn(*f.s->get_turn("t_1"), t);

    BOOST_CHECK_THROW(f.s->mark_running("t_nope", 1), std::runtime_error);
    BOOST_CHECK_THROW(f.s->finish_turn(make_turn("t_nope", "s1")), std::runtime_error);
}

BOOST_DATA_TEST_CASE(unfinished_turns_in_accept_order, bdata::make(kinds), kind) {
    store_fixture f(kind);
    // Ids deliberately out of lexical order: accept order is insertion order, not id order.
    for (auto [id, sid] :
         {std::pair{"t_e", "s1"}, {"t_a", "s2"}, {"t_d", "s1"}, {"t_b", "s3"}, {"t_c", "s2"}})
        f.s->insert_turn(make_turn(id, sid), {});
    auto done = make_turn("t_f", "s1");
    done.status = turn_status::completed; // stored already terminal: never unfinished
    f.s->insert_turn(done, {});

    f.s->mark_running("t_d", 5);
    auto finished = make_turn("t_a", "s2");
    finished.status = turn_status::completed;
    f.s->finish_turn(finished);

    auto unfinished = f.s->unfinished_turns();
    BOOST_TEST(turn_ids_of(unfinished) == (std::vector<std::string>{"t_e", "t_d", "t_b", "t_c"}));
    BOOST_TEST_REQUIRE(unfinished.size() == 4u);
    BOOST_TEST((unfinished[1].status == turn_status::running));
    BOOST_TEST(unfinished[0].input.text == "hello from t_e"); // full records, input included
}

BOOST_DATA_TEST_CASE(concurrent_writers_lose_nothing, bdata::make(kinds), kind) {
    store_fixture f(kind);
    constexpr int threads = 8, per_thread = 25;
    std::vector<std::thread> pool;
    store* s = f.s.get();
    for (int i = 0; i < threads; ++i)
        pool.emplace_back([s, i] {
            for (int j = 0; j < per_thread; ++j) {
                auto id = "t_" + std::to_string(i) + "_" + std::to_string(j);
                s->insert_turn(make_turn(id, "s" + std::to_string(i % 3)), {"k" + id, "fp"});
                auto u = entries_for("shared", id, 1);
                s->save_state(u);
            }
        });
    for (auto& t : pool)
        t.join();

    BOOST_TEST(f.s->unfinished_turns().size() == std::size_t(threads * per_thread));
    std::int64_t turns = 0;
    for (auto sid : {"s0", "s1", "s2"})
        turns += f.s->get_session(sid)->turns;
    BOOST_TEST(turns == threads * per_thread);
    // One shared tape, ids 1..N with no gap or duplicate.
    auto tape = f.s->read_tape("shared", 0, 10'000);
    std::vector<std::int64_t> want(threads * per_thread);
    std::iota(want.begin(), want.end(), 1);
    BOOST_TEST(ids_of(tape) == want);
}

namespace {
outbox_item make_item(const std::string& sid, const std::string& tid, const std::string& channel,
                      std::int64_t index) {
    outbox_item o;
    o.key = outbox_key(sid, tid, channel, sid, index);
    o.turn_id = tid;
    o.session_id = sid;
    o.channel = channel;
    o.recipient = sid;
    o.index = index;
    o.text = "reply " + tid + " \xc3\xa9";
    return o;
}
} // namespace

BOOST_DATA_TEST_CASE(outbox_items_are_stored_once_and_listed_in_order, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto a = make_item("s1", "t_1", "ws", 0);
    auto b = make_item("s1", "t_2", "ws", 0);
    auto c = make_item("s2", "t_3", "webhook", 0);
    BOOST_TEST(f.s->add_outbox(a));
    BOOST_TEST(f.s->add_outbox(b));
    BOOST_TEST(f.s->add_outbox(c));
    // The same key again changes nothing, even with another text.
    auto again = a;
    again.text = "other";
    BOOST_TEST(!f.s->add_outbox(again));
    BOOST_TEST(f.s->get_outbox(a.key)->text == a.text);

    store::outbox_filter open_ws;
    open_ws.statuses = {outbox_status::pending, outbox_status::sending};
    open_ws.channel = "ws";
    open_ws.session_id = "s1";
    auto got = f.s->list_outbox(open_ws);
    BOOST_TEST_REQUIRE(got.size() == 2u);
    BOOST_TEST(got[0].key == a.key);
    BOOST_TEST(got[1].key == b.key);
    BOOST_TEST(got[0].turn_id == "t_1");
    BOOST_TEST(got[0].recipient == "s1");
    BOOST_TEST(got[0].index == 0);

    a.status = outbox_status::delivered;
    a.attempts = 1;
    BOOST_TEST(f.s->update_outbox(a));
    got = f.s->list_outbox(open_ws);
    BOOST_TEST_REQUIRE(got.size() == 1u);
    BOOST_TEST(got[0].key == b.key);
    BOOST_TEST((f.s->get_outbox(a.key)->status == outbox_status::delivered));
    BOOST_TEST(f.s->get_outbox(a.key)->attempts == 1);

    c.uncertain = true;
    c.status = outbox_status::sending;
    BOOST_TEST(f.s->update_outbox(c));
    store::outbox_filter uncertain;
    uncertain.uncertain_only = true;
    got = f.s->list_outbox(uncertain);
    BOOST_TEST_REQUIRE(got.size() == 1u);
    BOOST_TEST(got[0].key == c.key);
    BOOST_TEST(got[0].uncertain);

    BOOST_TEST(f.s->list_outbox({}).size() == 3u);
    auto unknown = make_item("s9", "t_9", "ws", 0);
    BOOST_TEST(!f.s->update_outbox(unknown));
    BOOST_TEST(!f.s->get_outbox(unknown.key).has_value());

    // A retry waiting out its backoff keeps when and why.
    c.status = outbox_status::pending;
    c.attempts = 2;
    c.next_attempt_at = 1'700'000'025'000;
    c.last_error = "HTTP 503";
    BOOST_TEST(f.s->update_outbox(c));
    auto back = f.s->get_outbox(c.key);
    BOOST_TEST(back->next_attempt_at == 1'700'000'025'000);
    BOOST_TEST(back->last_error == "HTTP 503");
    c.last_error.clear();
    c.status = outbox_status::delivered;
    BOOST_TEST(f.s->update_outbox(c));
    BOOST_TEST(f.s->get_outbox(c.key)->last_error.empty());
}

BOOST_DATA_TEST_CASE(outbox_counts_by_status_and_uncertain, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto counts = [&] {
        auto n = f.s->count_outbox();
        return std::vector<std::int64_t>{n.by_status[0], n.by_status[1], n.by_status[2], n.by_status[3],
                                         n.uncertain};
    };
    BOOST_TEST(counts() == (std::vector<std::int64_t>{0, 0, 0, 0, 0}), boost::test_tools::per_element());
    std::vector<outbox_item> items;
    for (int i = 0; i < 6; ++i) {
        items.push_back(make_item("s" + std::to_string(i % 2), "t_" + std::to_string(i), "ws", 0));
        BOOST_TEST(f.s->add_outbox(items.back()));
    }
    BOOST_TEST(!f.s->add_outbox(items[0])); // counted once
    auto set = [&](int i, outbox_status st, bool uncertain) {
        items[i].status = st;
        items[i].uncertain = uncertain;
        BOOST_TEST(f.s->update_outbox(items[i]));
    };
    set(1, outbox_status::sending, true);
    set(2, outbox_status::delivered, false);
    set(3, outbox_status::delivered, true);
    set(4, outbox_status::failed, false);
    // pending, sending, delivered, failed, uncertain (whatever the status)
    BOOST_TEST(counts() == (std::vector<std::int64_t>{2, 1, 2, 1, 2}), boost::test_tools::per_element());
}

BOOST_DATA_TEST_CASE(cursors_are_kept_by_name, bdata::make(kinds), kind) {
    store_fixture f(kind);
    BOOST_TEST(!f.s->get_cursor("telegram.offset").has_value());
    f.s->set_cursor("telegram.offset", "41");
    f.s->set_cursor("schedule:a", "1700000000000");
    f.s->set_cursor("telegram.offset", "42");
    BOOST_TEST(f.s->get_cursor("telegram.offset").value_or("") == "42");
    BOOST_TEST(f.s->get_cursor("schedule:a").value_or("") == "1700000000000");
}

BOOST_DATA_TEST_CASE(tenants_keep_sessions_tapes_keys_and_items_apart, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto of = [](std::string tid, std::string tenant) {
        auto t = make_turn(std::move(tid), "s1");
        t.tenant = std::move(tenant);
        return t;
    };
    BOOST_TEST((f.s->insert_turn(of("t_a", "a"), {"key", "fp-a"}).outcome == insert_outcome::inserted));
    // The same session id and the same Idempotency-Key in another tenant are another session and
    // another key.
    BOOST_TEST((f.s->insert_turn(of("t_b", "b"), {"key", "fp-b"}).outcome == insert_outcome::inserted));
    auto again = f.s->insert_turn(of("t_a2", "a"), {"key", "fp-a"});
    BOOST_TEST((again.outcome == insert_outcome::replayed));
    BOOST_TEST(again.turn_id == "t_a");
    BOOST_TEST(
        (f.s->insert_turn(of("t_b2", "b"), {"key", "fp-a"}).outcome == insert_outcome::key_reused));

    auto ua = entries_for("s1", "t_a", 2);
    ua.tenant = "a";
    f.s->save_state(ua);
    auto ub = entries_for("s1", "t_b", 1);
    ub.tenant = "b";
    ub.state = json::object{{"who", "b"}};
    f.s->save_state(ub);
    BOOST_TEST(ids_of(f.s->read_tape({"a", "s1"}, 0, 10)) == (std::vector<std::int64_t>{1, 2}));
    BOOST_TEST(ids_of(f.s->read_tape({"b", "s1"}, 0, 10)) == (std::vector<std::int64_t>{1}));
    BOOST_TEST(ids_of(f.s->tape_tail({"a", "s1"}, 10)) == (std::vector<std::int64_t>{1, 2}));
    BOOST_TEST(f.s->read_tape("s1", 0, 10).empty()); // the default tenant has no s1
    BOOST_TEST(!f.s->get_session("s1").has_value());
    auto sa = f.s->get_session({"a", "s1"});
    auto sb = f.s->get_session({"b", "s1"});
    BOOST_TEST_REQUIRE((sa && sb));
    BOOST_TEST(sa->tenant == "a");
    BOOST_TEST(sa->turns == 1);
    BOOST_TEST(sa->state.empty());
    BOOST_TEST(sb->tenant == "b");
    BOOST_TEST(json::serialize(sb->state) == R"({"who":"b"})");
    BOOST_TEST(f.s->get_turn("t_b")->tenant == "b");

    auto ia = make_item("s1", "t_a", "ws", 0);
    ia.tenant = "a";
    auto ib = make_item("s1", "t_b", "ws", 0);
    ib.tenant = "b";
    BOOST_TEST(f.s->add_outbox(ia));
    BOOST_TEST(f.s->add_outbox(ib));
    BOOST_TEST(f.s->get_outbox(ib.key)->tenant == "b");
    store::outbox_filter open_b;
    open_b.statuses = {outbox_status::pending, outbox_status::sending};
    open_b.channel = "ws";
    open_b.tenant = "b";
    open_b.session_id = "s1";
    auto got = f.s->list_outbox(open_b);
    BOOST_TEST_REQUIRE(got.size() == 1u);
    BOOST_TEST(got[0].key == ib.key);
    store::outbox_filter all_a;
    all_a.tenant = "a";
    BOOST_TEST(f.s->list_outbox(all_a).size() == 1u);
    BOOST_TEST(f.s->list_outbox({}).size() == 2u);
}

BOOST_DATA_TEST_CASE(attempts_count_starts_and_the_side_effect_marker_is_kept, bdata::make(kinds),
                     kind) {
    store_fixture f(kind);
    auto queued = make_turn("t_q", "s1");
    f.s->insert_turn(queued, {});
    BOOST_TEST(f.s->get_turn("t_q")->attempt == 0);
    f.s->mark_running("t_q", 1'700'000'000'100);
    BOOST_TEST(f.s->get_turn("t_q")->attempt == 1);
    // Run again after a crash: the start counts once more.
    f.s->mark_running("t_q", 1'700'000'000'200);
    auto again = f.s->get_turn("t_q");
    BOOST_TEST(again->attempt == 2);
    BOOST_TEST(!again->side_effects);
    f.s->mark_side_effects("t_q");
    auto unfinished = f.s->unfinished_turns();
    BOOST_TEST_REQUIRE(unfinished.size() == 1u);
    BOOST_TEST(unfinished[0].attempt == 2);
    BOOST_TEST(unfinished[0].side_effects);
    BOOST_CHECK_THROW(f.s->mark_side_effects("t_unknown"), std::exception);
    // Stored as running by the accept: the attempt it carries counts.
    auto running = make_turn("t_r", "s1");
    running.status = turn_status::running;
    running.started_at = running.created_at;
    running.attempt = 1;
    f.s->insert_turn(running, {});
    check_same_turn(*f.s->get_turn("t_r"), running);
}

BOOST_DATA_TEST_CASE(end_turn_writes_tape_state_outbox_and_record_together, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto t = make_turn("t_e", "s1");
    t.status = turn_status::running;
    t.started_at = t.created_at;
    t.attempt = 1;
    f.s->insert_turn(t, {});
    outbox_item earlier;
    earlier.key = "ob_dup";
    earlier.turn_id = "t_e";
    earlier.session_id = "s1";
    earlier.channel = "ws";
    earlier.recipient = "s1";
    earlier.text = "already there";
    BOOST_TEST(f.s->add_outbox(earlier));

    turn_end end;
    end.state = entries_for("s1", "t_e", 2);
    end.state->state = json::object{{"k", "v"}};
    auto fresh = earlier;
    fresh.key = "ob_new";
    fresh.index = 1;
    fresh.text = "the reply";
    auto dup = earlier;
    dup.text = "not stored again";
    end.outbox = {fresh, dup};
    auto done = t;
    done.status = turn_status::completed;
    done.reply = "the reply";
    done.steps = 1;
    done.finished_at = t.created_at + 10;
    end.finished = {done};
    auto added = f.s->end_turn(end);
    BOOST_TEST_REQUIRE(added.size() == 1u);
    BOOST_TEST(added[0].key == "ob_new");
    BOOST_TEST(ids_of(end.state->entries) == (std::vector<std::int64_t>{1, 2}));
    BOOST_TEST(ids_of(f.s->read_tape("s1", 0, 10)) == (std::vector<std::int64_t>{1, 2}));
    BOOST_TEST(json::serialize(f.s->get_session("s1")->state) == R"({"k":"v"})");
    BOOST_TEST(f.s->get_outbox("ob_dup")->text == "already there");
    BOOST_TEST(f.s->get_outbox("ob_new")->text == "the reply");
    check_same_turn(*f.s->get_turn("t_e"), done);
    BOOST_TEST(f.s->unfinished_turns().empty());
}

BOOST_DATA_TEST_CASE(an_end_naming_an_unknown_turn_changes_nothing, bdata::make(kinds), kind) {
    store_fixture f(kind);
    auto end = end_of_unknown_turn(1);
    BOOST_CHECK_THROW(f.s->end_turn(end), std::exception);
    BOOST_TEST(f.s->read_tape("s9", 0, 10).empty());
    BOOST_TEST(!f.s->get_outbox("ob_orphan").has_value());
}

// Several nodes: a message to an idle session of this node's is stored as the node's own, to
// run at once; one behind an unfinished turn waits, queued, for a claim. The end of a turn goes
// in one transaction that stores nothing once the turn is another node's (taken over).
BOOST_AUTO_TEST_CASE(a_cluster_node_runs_its_idle_sessions_and_ends_only_its_own_turns) {
    if (test_pg().empty()) return;
    pg_schema schema;
    auto s = make_postgres_store({.conninfo = schema.conninfo(), .cluster = true, .node_id = "node-a"});
    auto t = make_turn("t_c", "s1");
    t.status = turn_status::running;
    t.started_at = t.created_at;
    t.attempt = 1;
    BOOST_TEST(s->insert_turn(t, {}).own);
    check_same_turn(*s->get_turn("t_c"), t);
    auto behind = make_turn("t_c2", "s1");
    behind.status = turn_status::running;
    behind.started_at = behind.created_at;
    behind.attempt = 1;
    BOOST_TEST(!s->insert_turn(behind, {}).own);
    auto waiting = s->get_turn("t_c2");
    BOOST_TEST(to_string(waiting->status) == "queued");
    BOOST_TEST(waiting->attempt == 0);
    BOOST_TEST(!waiting->started_at.has_value());

    turn_end end;
    end.state = entries_for("s1", "t_c", 2);
    auto o = make_item("s1", "t_c", "ws", 0);
    end.outbox = {o};
    auto done = t;
    done.status = turn_status::completed;
    done.reply = "the reply";
    done.finished_at = t.created_at + 10;
    end.finished = {done};
    // Taken over by another node: nothing of the end is stored.
    test::pg_exec(schema.conninfo(), "UPDATE turns SET node = 'node-b' WHERE turn_id = 't_c'");
    BOOST_CHECK_THROW(s->end_turn(end), store_unavailable);
    BOOST_TEST(s->read_tape("s1", 0, 10).empty());
    BOOST_TEST(!s->get_outbox(o.key).has_value());
    BOOST_TEST(to_string(s->get_turn("t_c")->status) == "running");
    // This node's: all of it, in one transaction.
    test::pg_exec(schema.conninfo(), "UPDATE turns SET node = 'node-a' WHERE turn_id = 't_c'");
    auto added = s->end_turn(end);
    BOOST_TEST(added.size() == 1u);
    BOOST_TEST(ids_of(end.state->entries) == (std::vector<std::int64_t>{1, 2}));
    BOOST_TEST(ids_of(s->read_tape("s1", 0, 10)) == (std::vector<std::int64_t>{1, 2}));
    BOOST_TEST(s->get_outbox(o.key)->text == o.text);
    check_same_turn(*s->get_turn("t_c"), done);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- SQLite only -----------------------------------------------------------------------------------

namespace {

// A second, raw connection to the file, to look at what the store wrote.
struct raw_db {
    sqlite3* db = nullptr;
    explicit raw_db(const std::string& path) {
        BOOST_TEST_REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    }
    ~raw_db() { sqlite3_close(db); }
    std::string scalar(const std::string& sql) {
        sqlite3_stmt* st = nullptr;
        BOOST_TEST_REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
        std::string out;
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
            out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
        return out;
    }
    // EXPLAIN QUERY PLAN puts its words in column 3, one row per step.
    std::string plan(const std::string& sql) {
        sqlite3_stmt* st = nullptr;
        auto explain = "EXPLAIN QUERY PLAN " + sql;
        BOOST_TEST_REQUIRE(sqlite3_prepare_v2(db, explain.c_str(), -1, &st, nullptr) == SQLITE_OK);
        std::string out;
        while (sqlite3_step(st) == SQLITE_ROW)
            out += reinterpret_cast<const char*>(sqlite3_column_text(st, 3)) + std::string("; ");
        sqlite3_finalize(st);
        return out;
    }
    void exec(const std::string& sql) {
        BOOST_TEST_REQUIRE(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(store_sqlite)

BOOST_AUTO_TEST_CASE(data_survives_close_and_reopen) {
    temp_dir dir;
    {
        auto s = open_store("sqlite", dir);
        auto t = make_turn("t_1", "s1");
        t.input.deliver = {{"channel", "webhook"}, {"to", "crm"}};
        s->insert_turn(t, {"key", "fp"});
        s->insert_turn(make_turn("t_2", "s1"), {});
        auto u = entries_for("s1", "t_1", 3);
        u.state = json::object{{"model", "echo"}};
        s->save_state(u);
        t.status = turn_status::completed;
        t.reply = "ok";
        t.finished_at = 1'700'000'009'000;
        s->finish_turn(t);
    }
    BOOST_TEST(fs::exists(dir.db_path()));
    auto s = open_store("sqlite", dir);
    auto t1 = s->get_turn("t_1");
    BOOST_TEST_REQUIRE(t1.has_value());
    BOOST_TEST(t1->reply.value_or("") == "ok");
    BOOST_TEST(json::serialize(t1->input.deliver) == R"({"channel":"webhook","to":"crm"})");
    BOOST_TEST(turn_ids_of(s->unfinished_turns()) == (std::vector<std::string>{"t_2"}));
    BOOST_TEST(s->get_session("s1")->turns == 2);
    BOOST_TEST(json::serialize(s->get_session("s1")->state) == R"({"model":"echo"})");
    BOOST_TEST(ids_of(s->read_tape("s1", 0, 10)) == (std::vector<std::int64_t>{1, 2, 3}));
    // The counter and the idempotency keys are durable too.
    auto more = entries_for("s1", "t_2", 1);
    s->save_state(more);
    BOOST_TEST(more.entries[0].id == 4);
    BOOST_TEST(
        (s->insert_turn(make_turn("t_3", "s1"), {"key", "fp"}).outcome == insert_outcome::replayed));
}

// The store's VFS holds a commit's WAL frames back and writes them in one go when the commit frame
// is complete (src/store/sqlite_wal_vfs.hpp): what a call stored is in the file when the call
// returns, for a connection of the default VFS to read, and a transaction of several MiB, which
// goes out in pieces and reads its own spilled pages back, arrives whole.
BOOST_AUTO_TEST_CASE(a_call_is_in_the_file_when_it_returns) {
    temp_dir dir;
    auto s = open_store("sqlite", dir);
    raw_db raw(dir.db_path());
    for (int i = 0; i < 40; ++i) {
        s->insert_turn(make_turn("t_" + std::to_string(i), "s" + std::to_string(i % 7)), {});
        BOOST_TEST_REQUIRE(raw.scalar("SELECT count(*) FROM turns") == std::to_string(i + 1));
        auto u = entries_for("s" + std::to_string(i % 7), "t_" + std::to_string(i), 2);
        s->save_state(u);
        BOOST_TEST_REQUIRE(raw.scalar("SELECT count(*) FROM tape") == std::to_string(2 * (i + 1)));
    }
    s->insert_turn(make_turn("t_big", "big"), {});
    s->begin_batch();
    for (int i = 0; i < 12; ++i) {
        state_update u{
            "big", "t_big", {make_message("user", std::string(300'000, char('a' + i)))}, std::nullopt};
        s->save_state(u);
    }
    s->end_batch();
    BOOST_TEST(raw.scalar("SELECT count(*) FROM tape WHERE session_id = 'big' AND "
                          "length(payload) > 300000") == "12");
    BOOST_TEST(raw.scalar("PRAGMA integrity_check") == "ok");
    auto tape = s->read_tape("big", 0, 20);
    BOOST_TEST_REQUIRE(tape.size() == 12u);
    for (int i = 0; i < 12; ++i)
        BOOST_TEST(tape[i].payload.at("text").as_string() == std::string(300'000, char('a' + i)));
    s.reset();
    BOOST_TEST(raw.scalar("SELECT count(*) FROM tape") == "92");
}

// In a group commit, an end of a turn that fails takes back everything it wrote (its tape entries
// and outbox items come before the record that fails), and only that: the calls before and after
// it in the same transaction are stored.
BOOST_AUTO_TEST_CASE(a_failed_end_in_a_batch_takes_back_only_its_own_writes) {
    temp_dir dir;
    auto s = open_store("sqlite", dir);
    s->begin_batch();
    s->insert_turn(make_turn("t_1", "s1"), {});
    auto end = end_of_unknown_turn(2);
    BOOST_CHECK_THROW(s->end_turn(end), std::exception);
    auto after = entries_for("s1", "t_1", 1);
    s->save_state(after);
    s->end_batch();
    BOOST_TEST(s->get_turn("t_1").has_value());
    BOOST_TEST(ids_of(s->read_tape("s1", 0, 10)) == (std::vector<std::int64_t>{1}));
    BOOST_TEST(s->read_tape("s9", 0, 10).empty());
    BOOST_TEST(!s->get_outbox("ob_orphan").has_value());
    raw_db raw(dir.db_path());
    BOOST_TEST(raw.scalar("SELECT count(*) FROM sessions WHERE session_id = 's9'") == "0");
}

BOOST_AUTO_TEST_CASE(cursors_survive_close_and_reopen) {
    temp_dir dir;
    open_store("sqlite", dir)->set_cursor("telegram.offset", "977");
    BOOST_TEST(open_store("sqlite", dir)->get_cursor("telegram.offset").value_or("") == "977");
}

BOOST_AUTO_TEST_CASE(schema_version_and_wal_are_set) {
    temp_dir dir;
    auto s = open_store("sqlite", dir);
    raw_db raw(dir.db_path());
    BOOST_TEST(detail::sqlite_schema_version() >= 1);
    BOOST_TEST(raw.scalar("PRAGMA user_version") == std::to_string(detail::sqlite_schema_version()));
    BOOST_TEST(raw.scalar("PRAGMA journal_mode") == "wal");
    // The queries the store runs must be served by the partial indexes, not a scan of every turn.
    auto plan = raw.plan("SELECT turn_id FROM turns WHERE status IN ('queued', 'running') ORDER BY seq");
    BOOST_TEST(plan.find("turns_unfinished") != std::string::npos, "plan: " << plan);
    // Every keyed insert looks its key up: that must be an index search too.
    plan = raw.plan("SELECT turn_id, idem_fingerprint FROM turns WHERE idem_key = ?1");
    BOOST_TEST(plan.find("turns_idem_key") != std::string::npos, "plan: " << plan);
}

BOOST_AUTO_TEST_CASE(reopening_does_not_rerun_migrations) {
    temp_dir dir;
    fs::create_directories(dir.root);
    auto path = (dir.root / "m.db").string();
    {
        raw_db raw(path);
        BOOST_TEST(detail::migrate_sqlite(raw.db) == detail::sqlite_schema_version());
        BOOST_TEST(detail::migrate_sqlite(raw.db) == 0);
    }
    { make_sqlite_store({.path = path})->insert_turn(make_turn("t_1", "s1"), {}); }
    // A migration that ran again would fail on the existing tables, or rebuild them empty.
    auto s = make_sqlite_store({.path = path});
    BOOST_TEST(s->get_turn("t_1").has_value());
    raw_db raw(path);
    BOOST_TEST(detail::migrate_sqlite(raw.db) == 0);
    BOOST_TEST(raw.scalar("PRAGMA user_version") == std::to_string(detail::sqlite_schema_version()));
}

BOOST_AUTO_TEST_CASE(outbox_counts_are_kept_without_a_scan_and_filled_on_upgrade) {
    temp_dir dir;
    {
        // A database from before the counts (schema 3): the upgrade counts what is there.
        fs::create_directories(fs::path(dir.db_path()).parent_path());
        raw_db raw(dir.db_path());
        detail::migrate_sqlite(raw.db, 3);
        for (int i = 0; i < 3; ++i)
            raw.exec("INSERT INTO outbox (key, turn_id, session_id, channel, recipient, idx, text, "
                     "status, created_at, updated_at) VALUES ('k" +
                     std::to_string(i) + "', 't_" + std::to_string(i) +
                     "', 's1', 'ws', 's1', 0, 'x', '" + (i == 0 ? "delivered" : "pending") + "', 1, 1)");
    }
    auto s = open_store("sqlite", dir);
    auto n = s->count_outbox();
    BOOST_TEST(n.by_status[static_cast<std::size_t>(outbox_status::pending)] == 2);
    BOOST_TEST(n.by_status[static_cast<std::size_t>(outbox_status::delivered)] == 1);
    raw_db raw(dir.db_path());
    BOOST_TEST(raw.scalar("PRAGMA user_version") == std::to_string(detail::sqlite_schema_version()));
    auto plan = raw.plan("SELECT status, sum(n), sum(uncertain * n) FROM outbox_counts GROUP BY status");
    BOOST_TEST(plan.find("outbox ") == std::string::npos, "plan: " << plan);
    // Deleting items (pruning) keeps the counts right too.
    raw.exec("DELETE FROM outbox WHERE status = 'delivered'");
    BOOST_TEST(s->count_outbox().by_status[static_cast<std::size_t>(outbox_status::delivered)] == 0);
}

BOOST_AUTO_TEST_CASE(data_from_before_tenants_belongs_to_the_default_tenant) {
    temp_dir dir;
    {
        // A database as the last build without tenants (schema 5) left it.
        fs::create_directories(fs::path(dir.db_path()).parent_path());
        raw_db raw(dir.db_path());
        detail::migrate_sqlite(raw.db, 5);
        raw.exec("INSERT INTO sessions (session_id, tenant, agent, turns, last_turn_id, state, "
                 "tape_next, created_at) VALUES ('s1', '', 'default', 2, 't_2', '{\"k\":1}', 3, 1)");
        raw.exec("INSERT INTO turns (turn_id, session_id, agent, tenant, status, input_text, "
                 "input_channel, metadata, idem_key, idem_fingerprint, reply, created_at, refusal) "
                 "VALUES ('t_1', 's1', 'default', '', 'completed', 'hi', 'http', '{}', 'key1', 'fp', "
                 "'echo: hi', 1, 0), ('t_2', 's1', 'default', '', 'queued', 'again', 'http', '{}', "
                 "NULL, NULL, NULL, 2, 0)");
        raw.exec("INSERT INTO tape (session_id, id, kind, payload, turn_id, created_at) VALUES "
                 "('s1', 1, 'message', '{\"role\":\"user\",\"text\":\"hi\"}', 't_1', 1), "
                 "('s1', 2, 'message', '{\"role\":\"assistant\",\"text\":\"echo: hi\"}', 't_1', 1)");
        raw.exec("INSERT INTO outbox (key, turn_id, session_id, channel, recipient, idx, text, status, "
                 "created_at, updated_at) VALUES ('ob_1', 't_1', 's1', 'ws', 's1', 0, 'echo: hi', "
                 "'pending', 1, 1)");
        BOOST_TEST(raw.scalar("PRAGMA user_version") == "5");
    }
    auto s = open_store("sqlite", dir);
    auto session = s->get_session("s1");
    BOOST_TEST_REQUIRE(session.has_value());
    BOOST_TEST(session->tenant == std::string(default_tenant));
    BOOST_TEST(session->turns == 2);
    BOOST_TEST(json::serialize(session->state) == R"({"k":1})");
    BOOST_TEST(ids_of(s->read_tape("s1", 0, 10)) == (std::vector<std::int64_t>{1, 2}));
    BOOST_TEST(s->get_turn("t_1")->tenant == std::string(default_tenant));
    BOOST_TEST(s->get_turn("t_1")->reply.value_or("") == "echo: hi");
    BOOST_TEST(turn_ids_of(s->unfinished_turns()) == (std::vector<std::string>{"t_2"}));
    // The old key is the default tenant's; another tenant may use it afresh.
    auto replay = make_turn("t_3", "s1");
    BOOST_TEST((s->insert_turn(replay, {"key1", "fp"}).outcome == insert_outcome::replayed));
    replay.tenant = "acme";
    BOOST_TEST((s->insert_turn(replay, {"key1", "fp"}).outcome == insert_outcome::inserted));
    // The tape goes on where it was; the outbox item is the default tenant's.
    auto more = entries_for("s1", "t_2", 1);
    s->save_state(more);
    BOOST_TEST(more.entries[0].id == 3);
    auto item = s->get_outbox("ob_1");
    BOOST_TEST_REQUIRE(item.has_value());
    BOOST_TEST(item->tenant == std::string(default_tenant));
    // New turns get seqs after the old ones (the AUTOINCREMENT counter moved with the table).
    BOOST_TEST(turn_ids_of(s->unfinished_turns()) == (std::vector<std::string>{"t_2", "t_3"}));
    raw_db raw(dir.db_path());
    BOOST_TEST(raw.scalar("PRAGMA user_version") == std::to_string(detail::sqlite_schema_version()));
    BOOST_TEST(raw.scalar("PRAGMA foreign_key_check") == "");
    BOOST_TEST(raw.scalar("PRAGMA integrity_check") == "ok");
    BOOST_TEST(raw.scalar("SELECT count(*) FROM sqlite_master WHERE name LIKE '%_v6'") == "0");
}

BOOST_AUTO_TEST_CASE(turns_from_before_attempts_count_one_start_when_they_started) {
    temp_dir dir;
    {
        // A database as the last build without attempts (schema 7) left it.
        fs::create_directories(fs::path(dir.db_path()).parent_path());
        raw_db raw(dir.db_path());
        detail::migrate_sqlite(raw.db, 7);
        raw.exec("INSERT INTO sessions (session_id, tenant, agent, turns, created_at) VALUES "
                 "('s1', 'default', 'default', 2, 1)");
        raw.exec("INSERT INTO turns (turn_id, session_id, agent, tenant, status, input_text, "
                 "input_channel, metadata, created_at, started_at, refusal) VALUES "
                 "('t_1', 's1', 'default', 'default', 'running', 'hi', 'http', '{}', 1, 2, 0), "
                 "('t_2', 's1', 'default', 'default', 'queued', 'again', 'http', '{}', 3, NULL, 0)");
    }
    auto s = open_store("sqlite", dir);
    BOOST_TEST(s->get_turn("t_1")->attempt == 1);
    BOOST_TEST(!s->get_turn("t_1")->side_effects);
    BOOST_TEST(s->get_turn("t_2")->attempt == 0);
}

BOOST_AUTO_TEST_CASE(newer_schema_is_refused) {
    temp_dir dir;
    fs::create_directories(dir.root);
    auto path = (dir.root / "future.db").string();
    { raw_db(path).exec("PRAGMA user_version = 999"); }
    BOOST_CHECK_THROW(make_sqlite_store({.path = path}), std::runtime_error);
}

// Found by a new-user check: another program's database was taken and baton's tables written
// into it; the refusal names the file.
BOOST_AUTO_TEST_CASE(a_database_of_another_program_is_refused_and_left_as_it_is) {
    temp_dir dir;
    fs::create_directories(dir.root);
    auto path = (dir.root / "theirs.db").string();
    {
        raw_db raw(path);
        raw.exec("CREATE TABLE users (id INTEGER)");
        raw.exec("INSERT INTO users VALUES (1)");
    }
    try {
        make_sqlite_store({.path = path});
        BOOST_FAIL("another program's database was taken");
    } catch (const std::runtime_error& e) {
        std::string what = e.what();
        BOOST_TEST(what.find(path) != std::string::npos, what);
        BOOST_TEST(what.find("not a baton database") != std::string::npos, what);
    }
    raw_db raw(path);
    BOOST_TEST(raw.scalar("SELECT group_concat(name) FROM sqlite_master WHERE type = 'table'") ==
               "users");
    BOOST_TEST(raw.scalar("PRAGMA user_version") == "0");
    BOOST_TEST(raw.scalar("PRAGMA journal_mode") == "delete"); // not switched to WAL either
}

BOOST_AUTO_TEST_CASE(open_errors_throw_runtime_error) {
    temp_dir dir;
    fs::create_directories(dir.root);
    // A parent "directory" that is a file.
    std::ofstream(dir.root / "file") << "x";
    BOOST_CHECK_THROW(make_sqlite_store({.path = (dir.root / "file" / "b.db").string()}),
                      std::runtime_error);
    // The path is a directory.
    BOOST_CHECK_THROW(make_sqlite_store({.path = dir.root.string()}), std::runtime_error);
    // Not a database.
    std::ofstream(dir.root / "junk.db") << std::string(4096, 'j');
    BOOST_CHECK_THROW(make_sqlite_store({.path = (dir.root / "junk.db").string()}), std::runtime_error);
    BOOST_CHECK_THROW(make_sqlite_store({.path = dir.db_path(), .synchronous = "sometimes"}),
                      std::runtime_error);
    for (auto mode : {"off", "FULL", "normal"})
        BOOST_CHECK_NO_THROW(make_sqlite_store({.path = dir.db_path(), .synchronous = mode}));
}

// Found by a new user: a second `baton serve` on the same --data started, took the first one's
// running turn for abandoned and ran it again, and took its outbox. One store at a time now.
BOOST_AUTO_TEST_CASE(a_second_store_on_one_database_is_refused_until_the_first_closes) {
    temp_dir dir;
    auto first = open_store("sqlite", dir);
    first->insert_turn(make_turn("t_1", "s1"), {});
    auto refused = [](const std::string& path, const char* what) {
        try {
            make_sqlite_store({.path = path});
            BOOST_ERROR(what);
        } catch (const std::runtime_error& e) {
            BOOST_TEST(std::string(e.what()).find("is in use by another baton process") !=
                           std::string::npos,
                       e.what());
        }
    };
    refused(dir.db_path(), "a second store opened the database");
    // The first is untouched (its connection's own locks too: it still writes).
    first->insert_turn(make_turn("t_2", "s1"), {});
    BOOST_TEST(first->unfinished_turns().size() == 2u);
    // Other readers are not held.
    raw_db raw(dir.db_path());
    BOOST_TEST(raw.scalar("SELECT count(*) FROM turns") == "2");
    // Nor through a symlink to the file (found by a new-user check: the lock was named after the
    // path as written, and two daemons ran the same turns).
    auto link = std::filesystem::path(dir.db_path()).parent_path() / "link.db";
    std::filesystem::create_symlink(dir.db_path(), link);
    refused(link.string(), "a second store opened the database through a symlink");
    first.reset();
    auto second = open_store("sqlite", dir);
    BOOST_TEST(second->unfinished_turns().size() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()
