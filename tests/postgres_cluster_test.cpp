// Several `baton serve` nodes on one PostgreSQL (storage.postgres.cluster), through their sockets
// like a user, against the test cluster of scripts/pg-cluster (a schema of its own per case):
// messages sent alternately to two nodes run in accept order per session, each once; a node
// killed with SIGKILL mid-stream is taken over and nothing accepted is lost; a turn running on
// one node is followed over SSE from the other. Skipped without a cluster.
#include "tests/daemon_fixture.hpp"
#include "tests/fake_openai.hpp"
#include "tests/pg_test.hpp"
#include "tests/plain_http.hpp"
#include "tests/webhook_receiver.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

using namespace baton::test;

namespace {

std::string read_text_file(const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// Rows of a query on the test cluster (test checks only), each value as text ("" for NULL).
std::vector<std::vector<std::string>> pg_rows(const std::string& conninfo, const std::string& sql,
                                              int columns) {
    const auto& pq = baton::detail::pq();
    PGconn* c = pq.PQconnectdb(conninfo.c_str());
    std::vector<std::vector<std::string>> out;
    std::string error;
    if (pq.PQstatus(c) != CONNECTION_OK) {
        error = pq.PQerrorMessage(c);
    } else {
        PGresult* r = pq.PQexec(c, sql.c_str());
        if (pq.PQresultStatus(r) != PGRES_TUPLES_OK) {
            error = pq.PQresultErrorMessage(r);
        } else {
            for (int i = 0; i < pq.PQntuples(r); ++i) {
                std::vector<std::string> row;
                for (int j = 0; j < columns; ++j)
                    row.emplace_back(pq.PQgetvalue(r, i, j));
                out.push_back(std::move(row));
            }
        }
        pq.PQclear(r);
    }
    pq.PQfinish(c);
    if (!error.empty()) throw std::runtime_error("test cluster: " + sql + ": " + error);
    return out;
}

// Two (or more) nodes on one schema; the agent is the echo model unless a fake model is given.
struct cluster_nodes {
    scratch_dir dir;
    pg_schema schema;
    std::filesystem::path config;
    std::vector<std::unique_ptr<daemon_process>> nodes;

    explicit cluster_nodes(const fake_openai* model = nullptr, int lease_ms = 10000,
                           const webhook_receiver* hook = nullptr, int schedule_every_ms = 0) {
        config = dir.root / "baton.json";
        json::object cfg{{"storage",
                          {{"postgres",
                            {{"conninfo", schema.conninfo()},
                             {"pool_size", 4},
                             {"cluster", true},
                             {"lease_ms", lease_ms}}}}}};
        if (model)
            cfg["agents"] = {{"default",
                              {{"model",
                                {{"provider", "openai"},
                                 {"base_url", model->base_url()},
                                 {"model", "fake-1"},
                                 {"stream", true},
                                 {"timeout_ms", 10000}}}}}};
        if (schedule_every_ms)
            cfg["channels"] = {{"schedules", json::array{{{"name", "tick"},
                                                          {"every_ms", schedule_every_ms},
                                                          {"session", "ticks"},
                                                          {"text", "tick"}}}}};
        if (hook)
            cfg["channels"] = {
                {"webhook", {{"targets", {{"crm", {{"url", hook->url()}, {"timeout_ms", 10000}}}}}}}};
        write_text_file(config, json::serialize(cfg));
    }
    void start(std::size_t n) {
        for (std::size_t i = 0; i < n; ++i)
            nodes.push_back(std::make_unique<daemon_process>(
                std::vector<std::string>{"serve", "--listen", "127.0.0.1:0", "--config",
                                         config.string()},
                dir.root / ("node" + std::to_string(nodes.size()) + ".log"), 20s));
    }
    http_response request(std::size_t node, std::string_view method, std::string_view target,
                          std::string_view body = {}) const {
        auto& d = *nodes.at(node);
        return connection(d.host(), d.port(), 20s).request(method, target, body);
    }
    std::string node_log(std::size_t i) const {
        return read_text_file(dir.root / ("node" + std::to_string(i) + ".log"));
    }
    // What a failed wait shows: every node's log, the open turns, the nodes' leases, and the
    // database's sessions (what each waits for).
    std::string diagnosis() const {
        std::ostringstream out;
        auto table = [&](const std::string& title, const std::string& sql, int columns) {
            out << "-- " << title << "\n";
            try {
                for (auto& row : pg_rows(schema.conninfo(), sql, columns)) {
                    for (auto& v : row)
                        out << v << " | ";
                    out << "\n";
                }
            } catch (const std::exception& e) {
                out << e.what() << "\n";
            }
        };
        table("open turns",
              "SELECT session_id, status, coalesce(node, '-'), attempt, turn_id FROM "
              "turns WHERE status IN ('queued', 'running') ORDER BY seq LIMIT 50",
              5);
        table("sessions", "SELECT session_id, coalesce(owner, '-') FROM sessions ORDER BY 1", 2);
        table("nodes",
              "SELECT node, heartbeat_at, clock_timestamp() - heartbeat_at, lease_ms FROM "
              "baton_nodes",
              4);
        table("database sessions",
              "SELECT pid, state, coalesce(wait_event_type, '-'), coalesce(wait_event, '-'), "
              "now() - xact_start, left(query, 160) FROM pg_stat_activity WHERE datname = "
              "current_database() AND pid <> pg_backend_pid()",
              6);
        for (std::size_t i = 0; i < nodes.size(); ++i) {
            // Still running, or dead (a zombie, or reaped by stop()).
            std::ifstream stat("/proc/" + std::to_string(nodes[i]->pid()) + "/stat");
            std::string pid, name, state;
            stat >> pid >> name >> state;
            out << "-- node " << i << " (pid " << nodes[i]->pid() << ", state "
                << (state.empty() ? "gone" : state) << ")'s log\n"
                << node_log(i);
        }
        return out.str();
    }
    // Waits (bounded) until no turn of the schema is queued or running.
    bool all_finished(std::chrono::milliseconds limit) const {
        auto until = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < until) {
            auto open = pg_rows(schema.conninfo(),
                                "SELECT count(*) FROM turns WHERE status IN ('queued', 'running')", 1);
            if (open.at(0).at(0) == "0") return true;
            std::this_thread::sleep_for(100ms);
        }
        return false;
    }
};

std::string text_body(const std::string& text) {
    return json::serialize(json::object{{"text", text}});
}

bool have_cluster() {
    if (!test_pg().empty()) return true;
    BOOST_TEST_MESSAGE("BATON_TEST_PG is not set: the PostgreSQL cluster cases are skipped");
    return false;
}

// Sends `per_session` messages to each of `sessions` sessions from `threads` client threads,
// message i of a session to node (i + session) % nodes, each after the previous one of its
// session was accepted. Returns session -> texts in send order; `problems` gets what went wrong.
std::map<std::string, std::vector<std::string>>
send_alternately(const cluster_nodes& c, int sessions, int per_session, int threads,
                 std::vector<std::string>& problems, std::chrono::milliseconds pause = {},
                 std::set<std::string>* maybe = nullptr) {
    std::mutex m;
    std::map<std::string, std::vector<std::string>> sent;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            for (int i = 0; i < per_session; ++i, std::this_thread::sleep_for(pause))
                for (int s = t; s < sessions; s += threads) {
                    auto sid = "s" + std::to_string(s);
                    auto text = sid + " m" + std::to_string(i);
                    auto& node = *c.nodes[static_cast<std::size_t>(i + s) % c.nodes.size()];
                    std::string error;
                    auto r =
                        plain_request(node.host(), node.port(), "POST",
                                      "/v1/sessions/" + sid + "/messages", text_body(text),
                                      {{"Idempotency-Key", sid + "-m" + std::to_string(i)}}, 20s, error);
                    std::lock_guard lock(m);
                    // Sent, but unanswered (the node died) or 503 (the database's connection broke
                    // after the insert was sent): stored or not.
                    if (maybe && ((!r && error != "connect failed") || (r && r->status == 503u)))
                        maybe->insert(text);
                    if (!r || r->status != 202u) {
                        problems.push_back(text + ": " +
                                           (r ? std::to_string(r->status) + " " + r->body : error));
                        continue;
                    }
                    sent[sid].push_back(text);
                }
        });
    for (auto& th : pool)
        th.join();
    return sent;
}

// What the tape of each session says: its user messages in tape order, and per turn the
// assistant messages it has.
struct tape_view {
    std::map<std::string, std::vector<std::string>> user_texts;
    std::map<std::string, int> replies_per_turn;
};
tape_view read_tapes(const cluster_nodes& c) {
    tape_view v;
    for (auto& row : pg_rows(c.schema.conninfo(),
                             "SELECT session_id, turn_id, payload FROM tape WHERE kind = 'message' "
                             "ORDER BY session_id, id",
                             3)) {
        auto p = json::parse(row[2]).as_object();
        auto role = std::string(p.at("role").as_string());
        if (role == "user") v.user_texts[row[0]].push_back(std::string(p.at("text").as_string()));
        if (role == "assistant") v.replies_per_turn[row[1]] += 1;
    }
    return v;
}

// Every turn completed, once: each accepted message (and perhaps some of `maybe`, sent without a
// clear answer) is on its session's tape in send order, with one reply.
void check_stored_once(const cluster_nodes& c,
                       const std::map<std::string, std::vector<std::string>>& sent,
                       const std::set<std::string>& maybe, std::size_t accepted) {
    auto turns = pg_rows(c.schema.conninfo(), "SELECT status, count(*) FROM turns GROUP BY status", 2);
    if (turns.size() != 1u) {
        std::ostringstream why;
        for (auto& row :
             pg_rows(c.schema.conninfo(),
                     "SELECT turn_id, status, attempt, coalesce(node, ''), coalesce(error_code, ''), "
                     "coalesce(error_message, '') FROM turns WHERE status <> 'completed'",
                     6))
            why << row[0] << " " << row[1] << " attempt " << row[2] << " on " << row[3] << ": " << row[4]
                << " " << row[5] << "\n";
        BOOST_TEST_REQUIRE(turns.size() == 1u, why.str() << c.diagnosis());
    }
    BOOST_TEST(turns[0][0] == "completed");
    auto stored = std::stoul(turns[0][1]);
    BOOST_TEST(stored >= accepted);
    BOOST_TEST(stored <= accepted + maybe.size());
    auto tapes = read_tapes(c);
    for (auto& [sid, texts] : sent) {
        std::vector<std::string> known;
        for (auto& t : tapes.user_texts[sid])
            if (!maybe.count(t)) known.push_back(t);
        BOOST_TEST(known == texts, sid);
    }
    // One reply per turn, whether it ran once or twice.
    BOOST_TEST(tapes.replies_per_turn.size() == stored);
    for (auto& [tid, n] : tapes.replies_per_turn)
        BOOST_TEST(n == 1, tid);
}

// Every call answers the deltas one by one, `pause` apart.
void stream_slowly(fake_openai& model, std::vector<std::string> deltas,
                   std::chrono::milliseconds pause) {
    model.set_handler([deltas = std::move(deltas), pause](const recorded_request&) {
        auto r = fake_reply::stream_text(deltas);
        r.piece_delay = pause;
        return r;
    });
}

// Sends the session's first message to node 0 and waits for its turn; returns the node that owns
// the session then (the one its node id appears in the log of).
std::size_t first_message_and_owner(cluster_nodes& c, const std::string& sid) {
    auto first = c.request(0, "POST", "/v1/sessions/" + sid + "/messages?wait=10", text_body("hello"));
    BOOST_TEST_REQUIRE(first.status == 200u, first.body);
    auto owner =
        pg_rows(c.schema.conninfo(), "SELECT owner FROM sessions WHERE session_id = '" + sid + "'", 1);
    auto runner =
        pg_rows(c.schema.conninfo(), "SELECT node FROM turns WHERE session_id = '" + sid + "'", 1);
    BOOST_TEST_REQUIRE(owner.at(0).at(0) == runner.at(0).at(0));
    std::size_t n = 0;
    while (n < c.nodes.size() && c.node_log(n).find(owner[0][0]) == std::string::npos)
        ++n;
    BOOST_TEST_REQUIRE(n < c.nodes.size());
    return n;
}

} // namespace

BOOST_AUTO_TEST_SUITE(postgres_cluster)

BOOST_AUTO_TEST_CASE(two_nodes_run_each_session_in_accept_order_once) {
    if (!have_cluster()) return;
    cluster_nodes c(nullptr, 10000);
    c.start(2);
    std::vector<std::string> problems;
    // 1,000 messages over 50 sessions, alternately to both nodes.
    auto sent = send_alternately(c, 50, 20, 10, problems);
    BOOST_TEST(problems.empty(), (problems.empty() ? "" : problems.front()));
    BOOST_TEST_REQUIRE(c.all_finished(60s), c.diagnosis());
    auto turns = pg_rows(c.schema.conninfo(),
                         "SELECT status, count(*), count(DISTINCT node), count(DISTINCT accepted_by) "
                         "FROM turns GROUP BY status",
                         4);
    BOOST_TEST_REQUIRE(turns.size() == 1u);
    BOOST_TEST(turns[0][0] == "completed");
    BOOST_TEST(turns[0][1] == "1000");
    BOOST_TEST(turns[0][2] == "2"); // both nodes ran turns ...
    BOOST_TEST(turns[0][3] == "2"); // ... and accepted them
    // Each session ran on one node at a time: no turn started before the one before it ended.
    auto overlaps = pg_rows(c.schema.conninfo(),
                            "SELECT count(*) FROM (SELECT started_at, lag(finished_at) OVER (PARTITION "
                            "BY tenant, session_id ORDER BY seq) AS before FROM turns) x WHERE "
                            "started_at < before",
                            1);
    BOOST_TEST(overlaps.at(0).at(0) == "0");
    // The tape holds every message once, in the order it was sent, and one reply each.
    auto tapes = read_tapes(c);
    for (auto& [sid, texts] : sent)
        BOOST_TEST(tapes.user_texts[sid] == texts, sid);
    BOOST_TEST(tapes.replies_per_turn.size() == 1000u);
    for (auto& [tid, n] : tapes.replies_per_turn)
        BOOST_TEST(n == 1, tid);
    // A turn's record and its long-poll answer the same from either node.
    auto tid = pg_rows(c.schema.conninfo(), "SELECT turn_id FROM turns ORDER BY seq LIMIT 1", 1)[0][0];
    for (std::size_t n = 0; n < 2; ++n) {
        auto r = c.request(n, "GET", "/v1/turns/" + tid + "?wait=1");
        BOOST_TEST(r.status == 200u);
        BOOST_TEST(json_field(r.body, "status") == "completed");
    }
    // The gauge is what the node's last lease renewal counted (every probe_interval, 1 s): a run
    // that ends within a second of the start may find the other node not yet counted.
    std::string metrics;
    for (int i = 0; i < 50; ++i) {
        metrics = c.request(0, "GET", "/metrics").body;
        if (metrics.find("baton_cluster_nodes_live 2") != std::string::npos) break;
        std::this_thread::sleep_for(100ms);
    }
    BOOST_TEST(metrics.find("baton_cluster_nodes_live 2") != std::string::npos,
               metrics << c.diagnosis());
    BOOST_TEST(metrics.find("baton_pg_pool_size 4") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_node_killed_mid_stream_is_taken_over_and_nothing_is_lost) {
    if (!have_cluster()) return;
    // Every model call streams 10 deltas 100 ms apart: turns are mid-stream when the node dies.
    fake_openai model;
    model.set_handler([](const recorded_request&) {
        auto r = fake_reply::stream_text({"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"});
        r.piece_delay = std::chrono::milliseconds(100);
        return r;
    });
    cluster_nodes c(&model, 4000);
    c.start(2);
    std::vector<std::string> problems;
    std::map<std::string, std::vector<std::string>> sent;
    std::set<std::string> maybe; // sent to the node as it died: no answer
    // 10 sessions, a message to each every 150 ms for 3 s; node 1 dies after 1 s. What is sent
    // to it after that is refused (no connection), and not counted as accepted.
    std::thread sender([&] { sent = send_alternately(c, 10, 20, 5, problems, 150ms, &maybe); });
    std::this_thread::sleep_for(1000ms);
    auto killed = c.nodes[1]->stop(0ms); // SIGKILL
    BOOST_TEST(killed == 128 + SIGKILL);
    sender.join();
    // The messages sent to the dead node after it died were refused (no connection); everything
    // accepted finishes on the survivor within the lease (4 s) and its claims.
    std::size_t accepted = 0;
    for (auto& [sid, texts] : sent)
        accepted += texts.size();
    BOOST_TEST_MESSAGE("accepted " << accepted << ", refused " << problems.size() << ", unanswered "
                                   << maybe.size());
    BOOST_TEST(accepted > 0u);
    BOOST_TEST_REQUIRE(c.all_finished(30s), c.diagnosis());
    check_stored_once(c, sent, maybe, accepted);
    // Some were running on the dead node: they ran again (attempt 2) on the survivor.
    auto attempts = pg_rows(c.schema.conninfo(), "SELECT max(attempt) FROM turns", 1);
    BOOST_TEST(std::stoi(attempts.at(0).at(0)) >= 2, c.node_log(0));
    BOOST_TEST(c.node_log(0).find("taking over a turn") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_dead_nodes_delivery_in_flight_is_sent_again_flagged_uncertain) {
    if (!have_cluster()) return;
    // The receiver holds the first request 20 s (its sender dies meanwhile), then answers at once.
    webhook_receiver hook;
    std::atomic<int> seen{0};
    hook.answer_with([&](const recorded_request&) {
        receiver_answer a;
        if (seen.fetch_add(1) == 0) a.delay = 20s;
        return a;
    });
    cluster_nodes c(nullptr, 4000, &hook);
    c.start(2);
    json::object body{{"text", "deliver me"}, {"deliver", {{"channel", "webhook"}, {"to", "crm"}}}};
    auto r = c.request(0, "POST", "/v1/sessions/w1/messages", json::serialize(body));
    BOOST_TEST_REQUIRE(r.status == 202u, r.body);
    auto tid = json_field(r.body, "turn_id");
    // Its item is being sent (the receiver has the request) by the node that ran the turn.
    std::string sender;
    for (int i = 0; i < 100 && sender.empty(); ++i) {
        auto rows = pg_rows(c.schema.conninfo(),
                            "SELECT coalesce(node, '') FROM outbox WHERE turn_id = '" + tid +
                                "' AND status = 'sending'",
                            1);
        if (!rows.empty() && seen.load() > 0) sender = rows[0][0];
        if (sender.empty()) std::this_thread::sleep_for(100ms);
    }
    BOOST_TEST_REQUIRE(!sender.empty());
    std::size_t dies = c.node_log(0).find(sender) != std::string::npos ? 0 : 1;
    BOOST_TEST(c.nodes[dies]->stop(0ms) == 128 + SIGKILL);
    // The survivor takes the item over once the lease (4 s) ran out and sends it again.
    BOOST_TEST_REQUIRE(hook.wait_delivered(1, 20s));
    std::vector<std::vector<std::string>> item;
    for (int i = 0; i < 50; ++i) {
        item = pg_rows(c.schema.conninfo(),
                       "SELECT status, uncertain, node FROM outbox WHERE turn_id = '" + tid + "'", 3);
        if (!item.empty() && item[0][0] == "delivered") break;
        std::this_thread::sleep_for(100ms);
    }
    BOOST_TEST_REQUIRE(item.size() == 1u);
    BOOST_TEST(item[0][0] == "delivered");
    BOOST_TEST(item[0][1] == "1"); // flagged uncertain: the first attempt may have arrived
    BOOST_TEST(item[0][2] != sender);
    BOOST_TEST(hook.requests().size() == 2u);
    BOOST_TEST(c.node_log(1 - dies).find("took over outbox items") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_message_to_the_owner_of_an_idle_session_runs_there_without_a_claim) {
    if (!have_cluster()) return;
    cluster_nodes c(nullptr);
    c.start(2);
    // Three messages one after another to node 0: its session, idle each time, so each is stored
    // running and runs there (two writes a turn, as on one node), none claimed.
    for (int i = 0; i < 3; ++i) {
        auto r =
            c.request(0, "POST", "/v1/sessions/o1/messages?wait=10", text_body("m" + std::to_string(i)));
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
    }
    auto metric = [&](std::size_t n, const std::string& name) {
        auto body = c.request(n, "GET", "/metrics").body;
        auto at = body.find("\n" + name + " ");
        BOOST_TEST_REQUIRE(at != std::string::npos, name);
        return std::stoll(body.substr(at + name.size() + 2));
    };
    BOOST_TEST(metric(0, "baton_cluster_claimed_turns_total") == 0);
    auto rows =
        pg_rows(c.schema.conninfo(),
                "SELECT t.node = s.owner AND t.accepted_by = s.owner, t.attempt FROM turns t "
                "JOIN sessions s USING (tenant, session_id) WHERE t.session_id = 'o1' ORDER BY seq",
                2);
    BOOST_TEST_REQUIRE(rows.size() == 3u);
    for (auto& row : rows) {
        BOOST_TEST(row[0] == "t");
        BOOST_TEST(row[1] == "1");
    }
    // The same session's message to node 1 is handed on: node 0 claims it and runs it.
    auto r = c.request(1, "POST", "/v1/sessions/o1/messages?wait=10", text_body("m3"));
    BOOST_TEST_REQUIRE(r.status == 200u, r.body);
    BOOST_TEST(metric(0, "baton_cluster_claimed_turns_total") == 1);
    BOOST_TEST(metric(1, "baton_cluster_claimed_turns_total") == 0);
    auto last = pg_rows(c.schema.conninfo(),
                        "SELECT t.node = s.owner, t.accepted_by <> s.owner FROM turns t JOIN sessions s "
                        "USING (tenant, session_id) WHERE t.session_id = 'o1' ORDER BY seq DESC LIMIT 1",
                        2);
    BOOST_TEST(last.at(0).at(0) == "t");
    BOOST_TEST(last.at(0).at(1) == "t");
}

BOOST_AUTO_TEST_CASE(a_turn_running_on_one_node_is_followed_over_sse_from_the_other) {
    if (!have_cluster()) return;
    fake_openai model;
    stream_slowly(model, {"one ", "two ", "three"}, std::chrono::milliseconds(300));
    cluster_nodes c(&model);
    c.start(2);
    // The session's first message, on node 0, makes node 0 its owner (nobody else claims it
    // first: node 1 is only told once the message is stored, and node 0 looks at once) ...
    // ... whichever node that is, the next turn is sent to it and followed from the other.
    std::size_t runs_on = first_message_and_owner(c, "f1");
    std::size_t follows = 1 - runs_on;
    auto r = c.request(runs_on, "POST", "/v1/sessions/f1/messages", text_body("again"));
    BOOST_TEST_REQUIRE(r.status == 202u, r.body);
    auto tid = json_field(r.body, "turn_id");
    auto& d = *c.nodes[follows];
    connection sse(d.host(), d.port(), 20s);
    BOOST_TEST_REQUIRE(sse.write(format_request("GET", "/v1/turns/" + tid + "/events")));
    auto got = sse.read_until_close().bytes;
    BOOST_TEST(got.find("event: model.delta") != std::string::npos, got);
    BOOST_TEST(got.find("\"one \"") != std::string::npos, got);
    BOOST_TEST(got.find("event: turn.finished") != std::string::npos, got);
    BOOST_TEST(got.find("one two three") != std::string::npos, got);
    // The runner relayed them; the follower received them.
    auto runner_metrics = c.request(runs_on, "GET", "/metrics").body;
    BOOST_TEST(runner_metrics.find("baton_cluster_relayed_events_sent_total 0") == std::string::npos);
}

// Found by a new user: with the message accepted by a node that is not the owner, the runner
// relayed the turn's events for that node already, and a reader on a third node got only what came
// after it connected (its request for the start was not answered). Now it gets the whole stream.
BOOST_AUTO_TEST_CASE(a_reader_on_a_third_node_gets_the_turn_from_its_start) {
    if (!have_cluster()) return;
    fake_openai model;
    stream_slowly(model, {"one ", "two ", "three ", "four"}, std::chrono::milliseconds(600));
    cluster_nodes c(&model);
    c.start(3);
    std::size_t runs_on = first_message_and_owner(c, "f3");
    std::size_t accepts = (runs_on + 1) % 3, reads = (runs_on + 2) % 3;
    auto r = c.request(accepts, "POST", "/v1/sessions/f3/messages", text_body("again"));
    BOOST_TEST_REQUIRE(r.status == 202u, r.body);
    auto tid = json_field(r.body, "turn_id");
    auto queued = c.request(accepts, "POST", "/v1/sessions/f3/messages", text_body("and again"));
    BOOST_TEST_REQUIRE(queued.status == 202u, queued.body);
    // Once the first delta is out (the answer takes ~3 s), whatever the exact moment.
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    // Every node says what the session is doing, not only its owner (found by the same user: the
    // others answered busy false, queued 0).
    for (std::size_t n = 0; n < 3; ++n) {
        auto s = c.request(n, "GET", "/v1/sessions/f3");
        BOOST_TEST_REQUIRE(s.status == 200u, s.body);
        auto v = json::parse(s.body).as_object();
        BOOST_TEST(v.at("busy").as_bool(), n << ": " << s.body);
        BOOST_TEST(v.at("queued").as_int64() == 1, n << ": " << s.body);
    }
    // A node that does not run it cannot cancel it, and says why.
    auto cancel = c.request(reads, "POST", "/v1/turns/" + tid + "/cancel");
    BOOST_TEST(cancel.status == 409u, cancel.body);
    BOOST_TEST(cancel.body.find("on another node") != std::string::npos, cancel.body);
    auto& d = *c.nodes[reads];
    connection sse(d.host(), d.port(), 20s);
    BOOST_TEST_REQUIRE(sse.write(format_request("GET", "/v1/turns/" + tid + "/events")));
    auto got = sse.read_until_close().bytes;
    for (auto part :
         {"event: turn.started", "\"one \"", "\"two \"", "event: turn.finished", "one two three four"})
        BOOST_TEST(got.find(part) != std::string::npos, part << " in\n" << got);
    BOOST_TEST(got.find("event: stream.gap") == std::string::npos, got);
}

BOOST_AUTO_TEST_CASE(the_database_restarted_under_load_costs_the_nodes_nothing_accepted) {
    if (!have_cluster() || test_pg_dir().empty()) return;
    cluster_nodes c(nullptr, 15000); // a lease longer than the outage
    c.start(2);
    std::vector<std::string> problems;
    std::map<std::string, std::vector<std::string>> sent;
    std::set<std::string> maybe;
    // 10 sessions, a message to each every 100 ms for 6 s, alternately to both nodes; the
    // database is stopped for 2 s in the middle (scripts/pg-cluster pause), then started again.
    std::thread sender([&] { sent = send_alternately(c, 10, 60, 5, problems, 100ms, &maybe); });
    std::this_thread::sleep_for(1000ms);
    auto script = std::string(BATON_SOURCE_DIR) + "/scripts/pg-cluster ";
    BOOST_TEST_REQUIRE(std::system((script + "pause '" + test_pg_dir() + "'").c_str()) == 0);
    // The nodes see the outage: /readyz answers 503 on both (from the probe, whatever the store
    // calls in flight). Accepts may not meet it: a node's calls run one at a time, and one that
    // waits for the database (a read tries again for up to 5 s) holds the others until it is back.
    std::set<std::size_t> saw_down;
    for (auto until = std::chrono::steady_clock::now() + 2000ms; std::chrono::steady_clock::now() < until;) {
        for (std::size_t n = 0; n < 2; ++n)
            if (c.request(n, "GET", "/readyz").status == 503u) saw_down.insert(n);
        std::this_thread::sleep_for(100ms);
    }
    BOOST_TEST_REQUIRE(std::system((script + "resume '" + test_pg_dir() + "'").c_str()) == 0);
    sender.join();
    // Whatever was refused meanwhile was refused clearly (503 store_unavailable).
    for (const auto& p : problems)
        BOOST_TEST(p.find("503") != std::string::npos, p);
    std::size_t accepted = 0;
    for (auto& [sid, texts] : sent)
        accepted += texts.size();
    BOOST_TEST_MESSAGE("accepted " << accepted << ", refused " << problems.size());
    BOOST_TEST(saw_down.size() == 2u); // the outage was seen ...
    std::size_t after = 0;            // ... and the nodes accept again after it
    for (auto& [sid, texts] : sent)
        after += texts.back().ends_with(" m59") ? 1 : 0;
    BOOST_TEST(after == sent.size());
    BOOST_TEST_REQUIRE(c.all_finished(30s), c.diagnosis());
    check_stored_once(c, sent, maybe, accepted);
    // Both nodes are still up and ready.
    for (std::size_t n = 0; n < 2; ++n)
        BOOST_TEST(c.request(n, "GET", "/readyz").status == 200u);
}

BOOST_AUTO_TEST_CASE(a_schedule_fires_once_across_the_cluster) {
    if (!have_cluster()) return;
    // Both nodes run the schedule (every second) from their first start, together.
    cluster_nodes c(nullptr, 10000, nullptr, 1000);
    c.start(2);
    std::this_thread::sleep_for(4500ms);
    auto rows = pg_rows(c.schema.conninfo(),
                        "SELECT idem_key FROM turns WHERE input_channel = 'schedule' ORDER BY seq", 1);
    BOOST_TEST(rows.size() >= 3u);
    BOOST_TEST(rows.size() <= 5u);
    // One grid: consecutive fires one period apart, never two in a period.
    std::vector<long long> slots;
    for (auto& r : rows)
        slots.push_back(std::stoll(r[0].substr(r[0].rfind(' ') + 1)));
    for (std::size_t i = 1; i < slots.size(); ++i)
        BOOST_TEST(slots[i] - slots[i - 1] == 1000, rows[i][0] << " after " << rows[i - 1][0]);
}

BOOST_AUTO_TEST_CASE(a_second_node_id_in_use_and_bad_cluster_keys_are_refused) {
    if (!have_cluster()) return;
    scratch_dir dir;
    pg_schema schema;
    auto path = dir.root / "baton.json";
    auto write = [&](json::object pg) {
        pg["conninfo"] = schema.conninfo();
        write_text_file(path, json::serialize(json::object{{"storage", {{"postgres", pg}}}}));
    };
    write({{"lease_ms", 5000}});
    auto r = run_baton({"check-config", path.string()});
    BOOST_TEST(r.exit_code != 0);
    BOOST_TEST(r.output.find("storage.postgres.lease_ms") != std::string::npos, r.output);
    write({{"cluster", true}, {"lease_ms", 500}});
    r = run_baton({"check-config", path.string()});
    BOOST_TEST(r.exit_code != 0);
    BOOST_TEST(r.output.find("storage.postgres.lease_ms") != std::string::npos, r.output);
    write({{"cluster", true}, {"node_id", "no spaces"}});
    r = run_baton({"check-config", path.string()});
    BOOST_TEST(r.output.find("storage.postgres.node_id") != std::string::npos, r.output);
    // Two nodes with one id: the second is refused at start.
    write({{"cluster", true}, {"node_id", "node-a"}});
    daemon_process first({"serve", "--listen", "127.0.0.1:0", "--config", path.string()},
                         dir.root / "a.log", 20s);
    r = run_baton({"serve", "--listen", "127.0.0.1:0", "--config", path.string()});
    BOOST_TEST(r.exit_code == 1, r.output);
    BOOST_TEST(r.output.find("node id 'node-a' is already registered by a live node") !=
                   std::string::npos,
               r.output);
}

BOOST_AUTO_TEST_SUITE_END()
