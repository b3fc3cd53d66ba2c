// The PostgreSQL store. Its calls are synchronous (the store interface's), made from the store
// runner's thread or any other; each one hands its queries to the store's own Asio loop, where
// libpq runs non-blocking on a pool of connections, and waits for the answer. A call's statements
// go out as one pipeline: one round trip, one implicit transaction. A group commit (begin_batch,
// end_batch) is one explicit transaction on one connection, each call in it a savepoint whose
// SAVEPOINT and RELEASE travel in the call's own pipeline.
#include <baton/json_text.hpp>
#include <baton/log.hpp>
#include <baton/store.hpp>

#include "src/store/pg_connection.hpp"
#include "src/store/postgres_schema.hpp"
#include "src/store/store_columns.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_map>

namespace baton {
namespace {

namespace asio = boost::asio;
using detail::pg_connection;
using detail::pg_error;
using detail::pg_query;
using detail::pg_result;
using param = std::optional<std::string>;
using clock = std::chrono::steady_clock;

param p(const std::string& s) {
    return s;
}
param p(std::string_view s) {
    return std::string(s);
}
param p(std::int64_t v) {
    return std::to_string(v);
}
param p(bool v) {
    return std::string(v ? "1" : "0");
}
param p(const std::optional<std::string>& s) {
    return s;
}
param p(const std::optional<std::int64_t>& v) {
    return v ? param(std::to_string(*v)) : std::nullopt;
}
param limit_param(std::size_t limit) {
    return p(static_cast<std::int64_t>(std::min<std::size_t>(
        limit, static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()))));
}

json::value parse_json(const std::string& text, const char* column) {
    std::error_code ec;
    auto v = json::parse(text, ec);
    if (ec) throw std::runtime_error(std::string("postgres: corrupt JSON in column ") + column);
    return v;
}
json::object parse_object(const std::string& text, const char* column) {
    auto v = parse_json(text, column);
    if (!v.is_object())
        throw std::runtime_error(std::string("postgres: expected a JSON object in ") + column);
    return std::move(v.as_object());
}

using detail::outbox_columns;
using detail::tape_columns;
using detail::turn_columns;

// The statements, prepared on each connection at first use; `stmt` names their index.
enum stmt : int {
    find_idem,
    touch_session_for_turn,
    insert_turn_row,
    insert_own_turn_row,
    mark_running_row,
    finish_own_turn_row,
    mark_side_effects_row,
    finish_turn_row,
    save_state_rows,
    get_turn_row,
    get_session_row,
    read_tape_rows,
    tape_tail_rows,
    unfinished_rows,
    add_outbox_row,
    update_outbox_row,
    get_cursor_row,
    set_cursor_row,
    get_outbox_row,
    list_outbox_rows,
    usage_rows,
    count_outbox_rows,
    // Several nodes (cluster)
    register_node_row,
    release_turns_row,
    release_outbox_row,
    heartbeat_row,
    live_nodes_row,
    leave_row,
    notify_owner_row,
    claim_turn_rows,
    claim_outbox_rows,
    forget_nodes_row,
    notify_row,
    session_activity_row,
    stmt_count
};

// The nodes whose lease holds, on the database's clock.
const std::string live_nodes = "SELECT node FROM baton_nodes WHERE heartbeat_at > clock_timestamp() - "
                               "lease_ms * interval '1 millisecond'";

std::string prefixed(const std::string& columns, const std::string& prefix) {
    std::string out;
    std::size_t at = 0;
    while (at < columns.size()) {
        auto comma = columns.find(", ", at);
        auto name = columns.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        if (!out.empty()) out += ", ";
        out += prefix + name;
        if (comma == std::string::npos) break;
        at = comma + 2;
    }
    return out;
}

detail::pg_statement_table make_statements() {
    detail::pg_statement_table t;
    t.sql.resize(stmt_count);
    t.sql[find_idem] = "SELECT turn_id, idem_fingerprint FROM turns WHERE tenant = $1 AND idem_key = $2";
    // $6: in a cluster, this node, which owns a session it creates (or finds without owner):
    // the node a session's first message reached runs it, and nothing is handed on.
    t.sql[touch_session_for_turn] =
        "INSERT INTO sessions (session_id, tenant, agent, turns, last_turn_id, created_at, owner) "
        "VALUES ($1, $2, $3, 1, $4, $5, $6) ON CONFLICT (tenant, session_id) DO UPDATE SET "
        "turns = sessions.turns + 1, last_turn_id = excluded.last_turn_id, "
        "owner = coalesce(sessions.owner, excluded.owner)";
    // $1 … $22, in insert_turn's order.
    const std::string insert_turn_columns =
        "INSERT INTO turns (turn_id, session_id, agent, tenant, status, input_text, input_channel, "
        "metadata, deliver, idem_key, idem_fingerprint, reply, steps, prompt_tokens, "
        "completion_tokens, error_code, error_message, created_at, started_at, finished_at, attempt, "
        "accepted_by";
    t.sql[insert_turn_row] = insert_turn_columns +
                             ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, "
                             "$15, $16, $17, $18, $19, $20, $21, $22)";
    // In a cluster ($22: this node): the turn is this node's to run at once (node = $22, the
    // status and attempt asked for) when its session is this node's and has no other unfinished
    // turn; else it waits, queued, for the owner's claim. The session's row, locked by the upsert
    // before it in the same transaction, keeps both true until the commit: another accept for the
    // session waits on it, and a claim skips it.
    t.sql[insert_own_turn_row] =
        insert_turn_columns +
        ", node) SELECT $1, $2, $3, $4, CASE WHEN x.mine THEN $5::text ELSE 'queued' END, "
        "$6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, CASE WHEN x.mine THEN "
        "$19::bigint END, $20, CASE WHEN x.mine THEN $21::bigint ELSE 0 END, $22, CASE WHEN x.mine "
        "THEN $22::text END FROM (SELECT coalesce((SELECT owner = $22::text FROM sessions WHERE "
        "tenant = $4 AND session_id = $2), false) AND NOT EXISTS (SELECT 1 FROM turns WHERE status "
        "IN ('queued', 'running') AND tenant = $4 AND session_id = $2) AS mine) x "
        "RETURNING node IS NOT NULL";
    // In a cluster ($3, $2, $13 below: this node), only the node running the turn writes it: one
    // that was taken over (its lease expired) finds nothing.
    t.sql[mark_running_row] = "UPDATE turns SET status = 'running', started_at = $2, "
                              "attempt = attempt + 1 WHERE turn_id = $1 AND ($3::text IS NULL OR "
                              "node = $3)";
    t.sql[mark_side_effects_row] = "UPDATE turns SET side_effects = 1 WHERE turn_id = $1 AND "
                                   "($2::text IS NULL OR node = $2)";
    t.sql[finish_turn_row] =
        "UPDATE turns SET status = $2, reply = $3, steps = $4, prompt_tokens = $5, "
        "completion_tokens = $6, error_code = $7, error_message = $8, started_at = $9, "
        "finished_at = $10, refusal = $11, attempt = $12 WHERE turn_id = $1 AND ($13::text IS NULL "
        "OR node = $13)";
    // The same in a turn's end sent as one pipeline (a cluster's end_turn): a turn not this
    // node's (taken over) fails the statement, so that the transaction, COMMIT included, stores
    // nothing (SQLSTATE 22012 from the division: the only error this statement can raise).
    t.sql[finish_own_turn_row] =
        "WITH u AS (" + t.sql[finish_turn_row] + " RETURNING 1) SELECT 1 / count(*) FROM u";
    // One statement: the session row (created when missing) takes the entries' ids and the new
    // state, and the entries go in under those ids. $5: a JSON array of [kind, payload, turn_id,
    // created_at]; the row lock on the session orders concurrent saves.
    t.sql[save_state_rows] =
        "WITH s AS (INSERT INTO sessions (tenant, session_id, agent, created_at, tape_next, state) "
        "VALUES ($1, $2, 'default', $3, 1 + $4, coalesce($6, '{}')) "
        "ON CONFLICT (tenant, session_id) DO UPDATE SET tape_next = sessions.tape_next + $4, "
        "state = coalesce($6, sessions.state) RETURNING tape_next - $4 AS base), "
        "e AS (INSERT INTO tape (tenant, session_id, id, kind, payload, turn_id, created_at) "
        "SELECT $1, $2, s.base + x.ord - 1, x.v->>0, x.v->>1, x.v->>2, (x.v->>3)::bigint "
        "FROM s, json_array_elements($5::json) WITH ORDINALITY AS x(v, ord)) "
        "SELECT base FROM s";
    t.sql[get_turn_row] = "SELECT " + turn_columns + " FROM turns WHERE turn_id = $1";
    t.sql[get_session_row] = "SELECT session_id, tenant, agent, turns, last_turn_id, state, created_at "
                             "FROM sessions WHERE tenant = $2 AND session_id = $1";
    t.sql[read_tape_rows] = "SELECT " + tape_columns +
                            " FROM tape WHERE tenant = $4 AND session_id = $1 AND id > $2 "
                            "ORDER BY id LIMIT $3";
    t.sql[tape_tail_rows] = "SELECT * FROM (SELECT " + tape_columns +
                            " FROM tape WHERE tenant = $3 AND session_id = $1 ORDER BY id DESC "
                            "LIMIT $2) last ORDER BY id";
    t.sql[unfinished_rows] =
        "SELECT " + turn_columns + " FROM turns WHERE status IN ('queued', 'running') ORDER BY seq";
    t.sql[add_outbox_row] =
        "INSERT INTO outbox (key, turn_id, session_id, channel, recipient, idx, text, status, "
        "attempts, uncertain, created_at, updated_at, tenant, node) VALUES ($1, $2, $3, $4, $5, $6, $7, "
        "$8, $9, $10, $11, $11, $12, $13) ON CONFLICT (key) DO NOTHING";
    t.sql[update_outbox_row] = "UPDATE outbox SET status = $2, attempts = $3, uncertain = $4, "
                               "updated_at = $5, next_attempt_at = $6, last_error = nullif($7, '') "
                               "WHERE key = $1";
    t.sql[get_cursor_row] = "SELECT value FROM cursors WHERE name = $1";
    t.sql[set_cursor_row] = "INSERT INTO cursors (name, value, updated_at) VALUES ($1, $2, $3) "
                            "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                            "updated_at = excluded.updated_at";
    t.sql[get_outbox_row] = "SELECT " + outbox_columns + " FROM outbox WHERE key = $1";
    // Empty filter values match everything; $4 is a text array of statuses.
    t.sql[list_outbox_rows] = "SELECT " + outbox_columns +
                              " FROM outbox WHERE ($1 = '' OR channel = $1) AND ($2 = '' OR "
                              "session_id = $2) AND ($3 = 0 OR uncertain = 1) AND "
                              "(cardinality($4::text[]) = 0 OR status = ANY($4::text[])) AND "
                              "($6 = '' OR tenant = $6) ORDER BY seq LIMIT $5";
    t.sql[usage_rows] = "SELECT tenant, finished_at / 86400000 AS day, count(*), sum(prompt_tokens), "
                        "sum(completion_tokens) FROM turns WHERE ($1 = '' OR tenant = $1) AND "
                        "finished_at IS NOT NULL AND finished_at >= $2 GROUP BY tenant, day "
                        "ORDER BY tenant, day";
    t.sql[count_outbox_rows] = "SELECT status, count(*), count(*) FILTER (WHERE uncertain <> 0) "
                               "FROM outbox GROUP BY status";
    // A node id is taken again only once its lease has expired (a restart with node_id set).
    t.sql[register_node_row] =
        "INSERT INTO baton_nodes (node, started_at, heartbeat_at, lease_ms) VALUES ($1, $2, "
        "clock_timestamp(), $3) ON CONFLICT (node) DO UPDATE SET started_at = excluded.started_at, "
        "heartbeat_at = excluded.heartbeat_at, lease_ms = excluded.lease_ms WHERE "
        "baton_nodes.heartbeat_at <= clock_timestamp() - baton_nodes.lease_ms * interval "
        "'1 millisecond'";
    // What the id's earlier process left is claimed again, as another node's would be.
    t.sql[release_turns_row] = "UPDATE turns SET node = NULL WHERE node = $1 AND status IN "
                               "('queued', 'running') AND EXISTS (SELECT 1 FROM baton_nodes WHERE "
                               "node = $1 AND started_at = $2)";
    t.sql[release_outbox_row] = "UPDATE outbox SET node = NULL WHERE node = $1 AND status IN "
                                "('pending', 'sending') AND EXISTS (SELECT 1 FROM baton_nodes WHERE "
                                "node = $1 AND started_at = $2)";
    // A lease that expired is never renewed: the node's work may be another's by now.
    t.sql[heartbeat_row] = "UPDATE baton_nodes SET heartbeat_at = clock_timestamp() WHERE node = $1 "
                           "AND heartbeat_at > clock_timestamp() - lease_ms * interval '1 millisecond'";
    t.sql[live_nodes_row] = "SELECT count(*) FROM (" + live_nodes + ") live";
    t.sql[leave_row] = "UPDATE baton_nodes SET heartbeat_at = '-infinity' WHERE node = $1";
    t.sql[session_activity_row] =
        "SELECT count(*) FILTER (WHERE status = 'running'), count(*) FILTER (WHERE status = 'queued') "
        "FROM turns WHERE tenant = $1 AND session_id = $2 AND status IN ('queued', 'running')";
    // After a message is stored: its session's owner is told (nobody when it is this node, $3),
    // every node when the session has none or its owner is dead. Returns the owner and whether
    // its lease holds.
    t.sql[notify_owner_row] =
        "SELECT o, CASE WHEN o IS DISTINCT FROM $3 THEN pg_notify('baton_claim', CASE WHEN live THEN "
        "o ELSE '' END) END, live FROM (SELECT owner AS o, owner IN (" +
        live_nodes + ") AS live FROM sessions WHERE tenant = $1 AND session_id = $2) x";
    // The sessions with unfinished turns not this node's, that it owns or that have no live owner,
    // become its own (locked ones are another claimer's: skipped), and so do their unfinished
    // turns. $1: this node.
    t.sql[claim_turn_rows] =
        "WITH cand AS (SELECT s.tenant, s.session_id, s.owner FROM sessions s WHERE (s.tenant, "
        "s.session_id) IN (SELECT tenant, session_id FROM turns WHERE status IN ('queued', "
        "'running') AND node IS DISTINCT FROM $1) AND (s.owner IS NULL OR s.owner = $1 OR s.owner "
        "NOT IN (" +
        live_nodes +
        ")) LIMIT $2 FOR UPDATE OF s SKIP LOCKED), "
        "own AS (UPDATE sessions s SET owner = $1 FROM cand c WHERE s.tenant = c.tenant AND "
        "s.session_id = c.session_id AND s.owner IS DISTINCT FROM $1), "
        "took AS (SELECT t.turn_id, t.node AS was FROM turns t JOIN cand c ON t.tenant = c.tenant AND "
        "t.session_id = c.session_id WHERE t.status IN ('queued', 'running') AND t.node IS DISTINCT "
        "FROM $1) "
        "UPDATE turns t SET node = $1 FROM took WHERE t.turn_id = took.turn_id RETURNING " +
        prefixed(turn_columns, "t.") + ", coalesce(t.accepted_by, ''), coalesce(took.was, ''), t.seq";
    // Open outbox items of no live node (or of none: a single node's before) become this node's.
    t.sql[claim_outbox_rows] =
        "UPDATE outbox SET node = $1 WHERE seq IN (SELECT seq FROM outbox WHERE status IN "
        "('pending', 'sending') AND (node IS NULL OR node NOT IN (" +
        live_nodes +
        ")) ORDER BY "
        "seq LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING " +
        outbox_columns + ", seq";
    t.sql[forget_nodes_row] = "DELETE FROM baton_nodes WHERE node <> $1 AND heartbeat_at < "
                              "clock_timestamp() - interval '1 hour'";
    t.sql[notify_row] = "SELECT pg_notify($1, $2)";
    return t;
}

pg_query q(int s, std::vector<param> params = {}) {
    return pg_query{s, {}, std::move(params)};
}
pg_query sql(std::string text) {
    return pg_query{-1, std::move(text), {}};
}

turn_record read_turn(const pg_result& r, int row) {
    turn_record t;
    t.turn_id = r.text(row, 0);
    t.session_id = r.text(row, 1);
    t.agent = r.text(row, 2);
    t.tenant = r.text(row, 3);
    auto status = r.text(row, 4);
    auto st = parse_turn_status(status);
    if (!st) throw std::runtime_error("postgres: unknown turn status '" + status + "'");
    t.status = *st;
    t.input.text = r.text(row, 5);
    t.input.channel = r.text(row, 6);
    t.input.metadata = parse_object(r.text(row, 7), "metadata");
    t.input.deliver = r.is_null(row, 8) ? json::value(nullptr) : parse_json(r.text(row, 8), "deliver");
    t.reply = r.opt_text(row, 9);
    t.steps = r.int64(row, 10);
    t.usage.prompt_tokens = r.int64(row, 11);
    t.usage.completion_tokens = r.int64(row, 12);
    if (!r.is_null(row, 13)) t.error = error_info{r.text(row, 13), r.text(row, 14)};
    t.created_at = r.int64(row, 15);
    t.started_at = r.opt_int64(row, 16);
    t.finished_at = r.opt_int64(row, 17);
    t.refusal = r.int64(row, 18) != 0;
    t.attempt = r.int64(row, 19);
    t.side_effects = r.int64(row, 20) != 0;
    return t;
}

std::vector<tape_entry> read_entries(const pg_result& r) {
    std::vector<tape_entry> out;
    out.reserve(static_cast<std::size_t>(r.rows()));
    for (int i = 0; i < r.rows(); ++i) {
        tape_entry e;
        e.id = r.int64(i, 0);
        auto kind = r.text(i, 1);
        auto k = parse_tape_kind(kind);
        if (!k) throw std::runtime_error("postgres: unknown tape kind '" + kind + "'");
        e.kind = *k;
        e.payload = parse_object(r.text(i, 2), "payload");
        e.created_at = r.int64(i, 3);
        e.turn_id = r.text(i, 4);
        out.push_back(std::move(e));
    }
    return out;
}

std::vector<outbox_item> read_outbox(const pg_result& r) {
    std::vector<outbox_item> out;
    for (int i = 0; i < r.rows(); ++i) {
        outbox_item o;
        o.key = r.text(i, 0);
        o.turn_id = r.text(i, 1);
        o.tenant = r.text(i, 2);
        o.session_id = r.text(i, 3);
        o.channel = r.text(i, 4);
        o.recipient = r.text(i, 5);
        o.index = r.int64(i, 6);
        o.text = r.text(i, 7);
        auto status = r.text(i, 8);
        auto st = parse_outbox_status(status);
        if (!st) throw std::runtime_error("postgres: unknown outbox status '" + status + "'");
        o.status = *st;
        o.attempts = r.int64(i, 9);
        o.uncertain = r.int64(i, 10) != 0;
        o.created_at = r.int64(i, 11);
        o.updated_at = r.int64(i, 12);
        o.next_attempt_at = r.int64(i, 13);
        o.last_error = r.text(i, 14);
        out.push_back(std::move(o));
    }
    return out;
}

param optional_key(const std::string& s) {
    return s.empty() ? std::nullopt : param(s);
}

// Text may not hold NUL in PostgreSQL; JSON text never does (it escapes it), raw text might.
void check_text(const std::string& s, const char* what) {
    if (s.find('\0') != std::string::npos)
        throw std::invalid_argument(std::string("postgres: ") + what + " contains a NUL character");
}

class postgres_store final : public store {
public:
    explicit postgres_store(const postgres_options& opts)
        : opts_(opts), statements_(make_statements()), work_(asio::make_work_guard(ioc_)) {
        if (opts_.pool_size < 1) throw std::invalid_argument("postgres: pool_size must be at least 1");
        if (opts_.cluster) {
            if (opts_.lease < 2 * opts_.probe_interval)
                throw std::invalid_argument("postgres: the lease must be at least twice probe_interval");
            opts_.exclusive = false;
            node_ = opts_.node_id.empty() ? "n-" + make_turn_id().substr(2) : opts_.node_id;
        }
        thread_ = std::thread([this] { ioc_.run(); });
        try {
            migrate();
            // A cluster node holds the schema's node lock shared, a node without `cluster` holds
            // it alone: neither kind starts beside the other (both would run the same turns).
            if (opts_.cluster && !on_loop([this]() { return connect_cluster_probe(); }))
                throw std::runtime_error(alone_node_message);
            if (opts_.cluster) join_cluster();
            // The probe's first round: connected, and (exclusive) holding the node lock. (A
            // cluster node's probe connected above, and cluster_loop reconnects it.)
            if (!opts_.cluster) on_loop([this]() { return probe_once(); });
            if (opts_.exclusive && !node_lock_.load())
                throw std::runtime_error(
                    "postgres: another baton node is using this database (the schema's node lock "
                    "is held); several nodes on one database each need \"cluster\": true");
            if (auto why = unavailable()) throw store_unavailable(*why);
            asio::co_spawn(ioc_, probe_loop(), asio::detached);
        } catch (...) {
            stop_loop();
            throw;
        }
    }

    std::optional<std::string> unavailable() const override {
        std::lock_guard lock(health_mutex_);
        return down_;
    }

    ~postgres_store() override {
        if (opts_.cluster) leave_cluster();
        stop_loop();
    }

    baton::cluster* cluster() override { return opts_.cluster ? &cluster_ : nullptr; }

    bool blocking() const override { return true; }

    insert_result insert_turn(const turn_record& t, const idempotency& idem) override {
        check_text(t.input.text, "the message text");
        if (!idem.key.empty()) {
            if (auto found = find_key(t.tenant, idem)) return *found;
        }
        auto deliver =
            t.input.deliver.is_null() ? std::nullopt : param(json::serialize(t.input.deliver));
        param error_code, error_message;
        if (t.error) {
            error_code = t.error->code;
            error_message = t.error->message;
        }
        std::vector<pg_query> qs;
        qs.push_back(q(touch_session_for_turn,
                       {p(t.session_id), p(t.tenant), p(t.agent), p(t.turn_id), p(t.created_at), me()}));
        qs.push_back(q(opts_.cluster ? insert_own_turn_row : insert_turn_row,
                       {p(t.turn_id),
                        p(t.session_id),
                        p(t.agent),
                        p(t.tenant),
                        p(to_string(t.status)),
                        p(t.input.text),
                        p(t.input.channel),
                        p(json::serialize(t.input.metadata)),
                        deliver,
                        optional_key(idem.key),
                        optional_key(idem.key) ? param(idem.fingerprint) : std::nullopt,
                        p(t.reply),
                        p(t.steps),
                        p(t.usage.prompt_tokens),
                        p(t.usage.completion_tokens),
                        error_code,
                        error_message,
                        p(t.created_at),
                        p(t.started_at),
                        p(t.finished_at),
                        p(t.attempt),
                        me()}));
        // In a cluster, the owner is told; this node, when it is the owner (or there is none),
        // looks for work at once rather than when the notification comes back. A turn stored as
        // this node's own needs neither.
        if (opts_.cluster) qs.push_back(q(notify_owner_row, {p(t.tenant), p(t.session_id), me()}));
        try {
            auto r = run(qs);
            if (opts_.cluster && r[1].rows() > 0 && r[1].text(0, 0) == "t")
                return {insert_outcome::inserted, t.turn_id, true};
            // The owner is this node, or nobody (a dead node's session is anybody's to claim).
            if (opts_.cluster && r.back().rows() > 0 &&
                (r.back().is_null(0, 0) || r.back().text(0, 0) == node_ || r.back().text(0, 2) != "t"))
                poke();
        } catch (const pg_error& e) {
            // Another node (or thread) stored the same key meanwhile: answer as if it came first.
            if (e.sqlstate() == "23505" && e.constraint() == "turns_idem_key" && !idem.key.empty())
                if (auto found = find_key(t.tenant, idem)) return *found;
            throw;
        }
        return {insert_outcome::inserted, t.turn_id};
    }

    void mark_running(const std::string& turn_id, time_ms started_at) override {
        if (run_one(q(mark_running_row, {p(turn_id), p(started_at), me()})).affected() == 0)
            unknown_turn(turn_id);
    }

    void mark_side_effects(const std::string& turn_id) override {
        if (run_one(q(mark_side_effects_row, {p(turn_id), me()})).affected() == 0) unknown_turn(turn_id);
    }

    void save_state(state_update& u) override {
        auto r = run_one(save_state_query(u));
        assign_ids(u, r.int64(0, 0));
    }

    pg_query save_state_query(state_update& u) {
        json::array rows;
        rows.reserve(u.entries.size());
        for (auto& e : u.entries) {
            if (e.created_at == 0) e.created_at = now_ms();
            if (e.turn_id.empty()) e.turn_id = u.turn_id;
            rows.push_back(json::array{json::string(to_string(e.kind)),
                                       json::string(json_text(e.payload)), json::string(e.turn_id),
                                       e.created_at});
        }
        auto state = u.state ? param(json_text(*u.state)) : std::nullopt;
        return q(save_state_rows,
                 {p(u.tenant), p(u.session_id), p(now_ms()),
                  p(static_cast<std::int64_t>(u.entries.size())), p(json::serialize(rows)), state});
    }

    static void assign_ids(state_update& u, std::int64_t next) {
        for (auto& e : u.entries)
            e.id = next++;
    }

    void finish_turn(const turn_record& t) override {
        if (run_one(finish_turn_query(t, finish_turn_row)).affected() == 0) unknown_turn(t.turn_id);
    }

    pg_query finish_turn_query(const turn_record& t, int stmt) {
        param error_code, error_message;
        if (t.error) {
            error_code = t.error->code;
            error_message = t.error->message;
        }
        return q(stmt,
                 {p(t.turn_id), p(to_string(t.status)), p(t.reply), p(t.steps), p(t.usage.prompt_tokens),
                  p(t.usage.completion_tokens), error_code, error_message, p(t.started_at),
                  p(t.finished_at), p(t.refusal), p(t.attempt), me()});
    }

    std::vector<outbox_item> end_turn(turn_end& e) override {
        if (batch* b = current_batch()) {
            // Inside a group commit: one more savepoint around the calls' own.
            b->pending.push_back(sql("SAVEPOINT end_turn"));
            try {
                auto added = store::end_turn(e);
                b->pending.push_back(sql("RELEASE end_turn"));
                return added;
            } catch (...) {
                undo(*b, "end_turn");
                throw;
            }
        }
        if (opts_.cluster) return end_turn_in_one(e);
        start_batch();
        std::vector<outbox_item> added;
        try {
            added = store::end_turn(e);
        } catch (...) {
            abort_batch();
            throw;
        }
        end_batch();
        return added;
    }

    // A turn's end as one pipeline, one round trip: BEGIN, the state and tape, the outbox items,
    // the final records (each failing when the turn is no longer this node's), COMMIT.
    std::vector<outbox_item> end_turn_in_one(turn_end& e) {
        std::vector<pg_query> qs{sql("BEGIN")};
        if (e.state) qs.push_back(save_state_query(*e.state));
        for (auto& o : e.outbox) {
            if (o.created_at == 0) o.created_at = now_ms();
            qs.push_back(add_outbox_query(o));
        }
        for (const auto& t : e.finished)
            qs.push_back(finish_turn_query(t, finish_own_turn_row));
        qs.push_back(sql("COMMIT"));
        std::vector<pg_result> r;
        try {
            r = run(qs); // on a pooled connection: a cluster has no batch
        } catch (const pg_error& x) {
            if (x.sqlstate() == "22012" && !e.finished.empty()) unknown_turn(e.finished.front().turn_id);
            throw;
        }
        std::size_t at = 1;
        if (e.state) assign_ids(*e.state, r[at++].int64(0, 0));
        std::vector<outbox_item> added;
        for (auto& o : e.outbox)
            if (r[at++].affected() > 0) added.push_back(o);
        return added;
    }

    std::optional<insert_result> find_idempotency(const std::string& tenant,
                                                  const idempotency& idem) override {
        return find_key(tenant, idem);
    }

    std::optional<turn_record> get_turn(const std::string& turn_id) override {
        auto r = read_one(q(get_turn_row, {p(turn_id)}));
        if (r.rows() == 0) return std::nullopt;
        return read_turn(r, 0);
    }

    std::optional<session_record> get_session(const session_ref& session) override {
        auto r = read_one(q(get_session_row, {p(session.id), p(session.tenant)}));
        if (r.rows() == 0) return std::nullopt;
        session_record s;
        s.session_id = r.text(0, 0);
        s.tenant = r.text(0, 1);
        s.agent = r.text(0, 2);
        s.turns = r.int64(0, 3);
        s.last_turn_id = r.opt_text(0, 4);
        s.state = parse_object(r.text(0, 5), "state");
        s.created_at = r.int64(0, 6);
        return s;
    }

    std::vector<tape_entry> read_tape(const session_ref& session, std::int64_t after,
                                      std::size_t limit) override {
        return read_entries(read_one(
            q(read_tape_rows, {p(session.id), p(after), limit_param(limit), p(session.tenant)})));
    }

    std::vector<tape_entry> tape_tail(const session_ref& session, std::size_t limit) override {
        return read_entries(
            read_one(q(tape_tail_rows, {p(session.id), limit_param(limit), p(session.tenant)})));
    }

    std::vector<turn_record> unfinished_turns() override {
        auto r = read_one(q(unfinished_rows));
        std::vector<turn_record> out;
        for (int i = 0; i < r.rows(); ++i)
            out.push_back(read_turn(r, i));
        return out;
    }

    bool add_outbox(const outbox_item& o) override {
        return run_one(add_outbox_query(o)).affected() > 0;
    }

    pg_query add_outbox_query(const outbox_item& o) {
        check_text(o.text, "an outbox item's text");
        return q(add_outbox_row,
                 {p(o.key), p(o.turn_id), p(o.session_id), p(o.channel), p(o.recipient), p(o.index),
                  p(o.text), p(to_string(o.status)), p(o.attempts), p(o.uncertain),
                  p(o.created_at ? o.created_at : now_ms()), p(o.tenant), me()});
    }

    bool update_outbox(const outbox_item& o) override {
        auto r = run_one(
            q(update_outbox_row, {p(o.key), p(to_string(o.status)), p(o.attempts), p(o.uncertain),
                                  p(now_ms()), p(o.next_attempt_at), p(o.last_error)}));
        return r.affected() > 0;
    }

    std::optional<outbox_item> get_outbox(const std::string& key) override {
        auto items = read_outbox(read_one(q(get_outbox_row, {p(key)})));
        if (items.empty()) return std::nullopt;
        return std::move(items.front());
    }

    std::vector<outbox_item> list_outbox(const outbox_filter& f) override {
        std::string statuses = "{";
        for (auto s : f.statuses) {
            if (statuses.size() > 1) statuses += ",";
            statuses += to_string(s);
        }
        statuses += "}";
        return read_outbox(
            read_one(q(list_outbox_rows, {p(f.channel), p(f.session_id), p(f.uncertain_only),
                                          p(statuses), limit_param(f.limit), p(f.tenant)})));
    }

    outbox_counts count_outbox() override {
        auto r = read_one(q(count_outbox_rows));
        outbox_counts n;
        for (int i = 0; i < r.rows(); ++i) {
            auto st = parse_outbox_status(r.text(i, 0));
            if (!st) throw std::runtime_error("postgres: unknown outbox status '" + r.text(i, 0) + "'");
            n.by_status[static_cast<std::size_t>(*st)] += r.int64(i, 1);
            n.uncertain += r.int64(i, 2);
        }
        return n;
    }

    std::vector<usage_row> usage_by_day(const std::string& tenant, time_ms from) override {
        auto r = read_one(q(usage_rows, {p(tenant), p(from)}));
        std::vector<usage_row> out;
        for (int i = 0; i < r.rows(); ++i)
            out.push_back({r.text(i, 0), r.int64(i, 1), r.int64(i, 2), r.int64(i, 3), r.int64(i, 4)});
        return out;
    }

    std::optional<std::string> get_cursor(const std::string& name) override {
        auto r = read_one(q(get_cursor_row, {p(name)}));
        if (r.rows() == 0) return std::nullopt;
        return r.text(0, 0);
    }

    void set_cursor(const std::string& name, const std::string& value) override {
        check_text(value, "a cursor's value");
        run_one(q(set_cursor_row, {p(name), p(value), p(now_ms())}));
    }

    // Several nodes: no group commit. A batch holds the row locks of every session its calls
    // touched until it commits, and two nodes' batches would deadlock on two sessions taken in
    // opposite orders; one call at a time locks one session (a claim skips locked ones).
    void begin_batch() override {
        if (!opts_.cluster) start_batch();
    }

    void start_batch() {
        auto b = std::make_unique<batch>();
        b->conn = acquire();
        b->pending.push_back(sql("BEGIN"));
        std::lock_guard lock(batches_mutex_);
        batches_[std::this_thread::get_id()] = std::move(b);
    }

    void end_batch() override {
        auto b = take_batch();
        if (!b) return;
        if (b->broken) {
            give_back(std::move(b->conn));
            throw store_unavailable("postgres: the batch's transaction was lost: " + b->why);
        }
        if (!b->begun) { // nothing was sent: there is nothing to commit
            give_back(std::move(b->conn));
            return;
        }
        b->pending.push_back(sql("COMMIT"));
        try {
            exec(*b->conn, b->pending);
        } catch (const pg_error& e) {
            rollback_and_give_back(std::move(b->conn));
            if (e.connection_lost()) throw store_unavailable(e.what());
            throw;
        } catch (...) {
            rollback_and_give_back(std::move(b->conn));
            throw;
        }
        give_back(std::move(b->conn));
    }

private:
    // Runs a coroutine on the store's loop and waits for its result (never called on the loop).
    // No exception object crosses the threads: a failure is copied on the loop (pg_error as it is,
    // anything else as its message) and thrown anew here, so that every exception lives on one
    // thread (libstdc++'s exception_ptr counts its references where TSan cannot see them).
    template <class F> auto on_loop(F make) -> typename decltype(make())::value_type {
        using T = typename decltype(make())::value_type;
        using value_slot = std::conditional_t<std::is_void_v<T>, bool, T>;
        struct outcome {
            std::mutex m;
            std::condition_variable cv;
            bool done = false;
            std::optional<value_slot> value;
            std::optional<pg_error> pg;
            std::optional<std::string> other;
        };
        auto out = std::make_shared<outcome>();
        auto finish = [out](auto fill) {
            std::lock_guard lock(out->m);
            fill(*out);
            out->done = true;
            out->cv.notify_one();
        };
        auto fail = [finish](std::exception_ptr e) {
            try {
                std::rethrow_exception(e);
            } catch (const pg_error& x) {
                finish([&](outcome& o) { o.pg.emplace(x.what(), x.sqlstate(), x.constraint()); });
            } catch (const std::exception& x) {
                finish([&](outcome& o) { o.other.emplace(x.what()); });
            } catch (...) {
                finish([&](outcome& o) { o.other.emplace("postgres: unknown failure"); });
            }
        };
        if constexpr (std::is_void_v<T>) {
            asio::co_spawn(ioc_, make(), [finish, fail](std::exception_ptr e) {
                if (e) return fail(e);
                finish([](outcome& o) { o.value.emplace(true); });
            });
        } else {
            asio::co_spawn(ioc_, make(), [finish, fail](std::exception_ptr e, T v) {
                if (e) return fail(e);
                finish([&](outcome& o) { o.value.emplace(std::move(v)); });
            });
        }
        std::unique_lock lock(out->m);
        out->cv.wait(lock, [&] { return out->done; });
        if (out->pg) throw pg_error(out->pg->what(), out->pg->sqlstate(), out->pg->constraint());
        if (out->other) throw std::runtime_error(*out->other);
        if constexpr (!std::is_void_v<T>) return std::move(*out->value);
    }

    struct batch {
        std::unique_ptr<pg_connection> conn;
        std::vector<pg_query> pending; // sent ahead of the next call's statements
        bool begun = false;            // BEGIN has gone out
        bool broken = false;           // the transaction is gone (a lost connection)
        std::string why;
    };

    batch* current_batch() {
        std::lock_guard lock(batches_mutex_);
        auto it = batches_.find(std::this_thread::get_id());
        return it == batches_.end() ? nullptr : it->second.get();
    }

    std::unique_ptr<batch> take_batch() {
        std::lock_guard lock(batches_mutex_);
        auto it = batches_.find(std::this_thread::get_id());
        if (it == batches_.end()) return nullptr;
        auto b = std::move(it->second);
        batches_.erase(it);
        return b;
    }

    void abort_batch() {
        auto b = take_batch();
        if (b) rollback_and_give_back(std::move(b->conn));
    }

    // A connection whose transaction failed: rolled back and kept, or dropped.
    void rollback_and_give_back(std::unique_ptr<pg_connection> c) {
        if (c && c->ok() && c->transaction_status() != PQTRANS_IDLE) {
            std::vector<pg_query> rb{sql("ROLLBACK")};
            try {
                exec(*c, rb);
            } catch (const std::exception&) {
            }
        }
        give_back(std::move(c));
    }

    // Undoes the savepoint `name` of a batch after a failed call; a batch that cannot is broken.
    void undo(batch& b, const std::string& name) {
        if (b.broken) return;
        if (!b.begun) { // nothing of it reached the server yet: forget what was queued
            b.pending.erase(std::remove_if(b.pending.begin(), b.pending.end(),
                                           [&](const pg_query& x) {
                                               return x.sql == "SAVEPOINT " + name ||
                                                      x.sql == "RELEASE " + name;
                                           }),
                            b.pending.end());
            return;
        }
        b.pending.push_back(sql("ROLLBACK TO " + name));
        b.pending.push_back(sql("RELEASE " + name));
        try {
            exec(*b.conn, b.pending);
            b.pending.clear();
        } catch (const std::exception& e) {
            b.broken = true;
            b.why = e.what();
        }
    }

    // A read: in the thread's batch while that stands (it sees the batch's writes), else on a pooled
    // connection. A read that fails for want of the database is tried again (0.1 s doubling to
    // 1 s) for up to read_retry: a turn whose database restarts under it waits rather than fails.
    static constexpr std::chrono::milliseconds read_retry{5000};
    pg_result read_one(pg_query query) {
        auto give_up = clock::now() + read_retry;
        std::chrono::milliseconds pause{100};
        for (;;) {
            std::vector<pg_query> qs{query};
            try {
                check_node_lock();
                batch* b = current_batch();
                if (b && !b->broken) return std::move(run(qs).front());
                return std::move(run_pooled(qs).front());
            } catch (const pg_error& e) {
                if (!e.connection_lost()) throw;
                if (clock::now() + pause > give_up) throw store_unavailable(e.what());
            } catch (const store_unavailable&) {
                if (clock::now() + pause > give_up) throw;
            }
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::milliseconds(1000));
        }
    }

    void check_node_lock() const {
        if (lost_.load())
            throw store_unavailable("postgres: this node's lease expired (node " + node_ +
                                    "): its work belongs to other nodes now");
        if (opts_.exclusive && !node_lock_.load())
            throw store_unavailable("postgres: this node does not hold the database's node lock "
                                    "(lost with its connection; another node may have it)");
    }

    // One pipeline (one implicit transaction) on a pooled connection.
    std::vector<pg_result> run_pooled(std::vector<pg_query>& qs) {
        auto c = acquire();
        try {
            auto results = exec(*c, qs);
            give_back(std::move(c));
            return results;
        } catch (...) {
            rollback_and_give_back(std::move(c));
            throw;
        }
    }

    pg_result run_one(pg_query query) {
        std::vector<pg_query> qs;
        qs.push_back(std::move(query));
        return std::move(run(qs).front());
    }

    // Runs a call's statements: in the thread's batch as a savepoint, else as one pipeline (one
    // implicit transaction) on a pooled connection.
    std::vector<pg_result> run(std::vector<pg_query>& qs) {
        try {
            return run_unchecked(qs);
        } catch (const pg_error& e) {
            if (e.connection_lost()) throw store_unavailable(e.what());
            // A deadlock or serialization failure stored nothing: the caller may try again.
            if (e.sqlstate() == "40P01" || e.sqlstate() == "40001")
                throw store_unavailable(std::string(e.what()) + " (a conflict: nothing was stored)");
            throw;
        }
    }

    std::vector<pg_result> run_unchecked(std::vector<pg_query>& qs) {
        check_node_lock();
        if (batch* b = current_batch()) {
            if (b->broken)
                throw store_unavailable("postgres: the batch's transaction was lost: " + b->why);
            std::vector<pg_query> all = std::move(b->pending);
            b->pending.clear();
            all.push_back(sql("SAVEPOINT call"));
            std::size_t first = all.size();
            for (auto& x : qs)
                all.push_back(std::move(x));
            all.push_back(sql("RELEASE call"));
            try {
                auto results = exec(*b->conn, all);
                b->begun = true;
                return {std::make_move_iterator(results.begin() + static_cast<std::ptrdiff_t>(first)),
                        std::make_move_iterator(results.end() - 1)};
            } catch (const pg_error& e) {
                b->begun = true;
                if (e.connection_lost() || !b->conn->ok()) {
                    b->broken = true;
                    b->why = e.what();
                    throw;
                }
                // Only this call's savepoint is undone; BEGIN may have failed too (then broken).
                if (b->conn->transaction_status() != PQTRANS_INERROR &&
                    b->conn->transaction_status() != PQTRANS_INTRANS) {
                    b->broken = true;
                    b->why = e.what();
                    throw;
                }
                undo(*b, "call");
                throw;
            }
        }
        return run_pooled(qs);
    }

    std::vector<pg_result> exec(pg_connection& c, std::vector<pg_query>& qs) {
        try {
            return on_loop([&]() { return c.exec(qs, opts_.query_timeout); });
        } catch (const pg_error& e) {
            if (e.connection_lost()) {
                set_down(e.what());
                drop_idle(); // a restarted server: the idle ones are gone too
            }
            throw;
        }
    }

    void set_down(std::optional<std::string> why) {
        std::lock_guard lock(health_mutex_);
        down_ = std::move(why);
    }

    // Every probe_interval, on the loop: a connection of its own runs SELECT 1 (and, exclusive,
    // holds the node lock), so that unavailable() follows the database while the node is idle.
    asio::awaitable<void> probe_once() {
        try {
            if (!probe_ || !probe_->ok()) {
                node_lock_.store(false);
                probe_ = std::make_unique<pg_connection>(ioc_.get_executor(), statements_);
                co_await probe_->connect(opts_.conninfo, opts_.connect_timeout);
            }
            std::vector<pg_query> qs{sql(node_lock_.load() || !opts_.exclusive
                                             ? "SELECT true"
                                             : "SELECT pg_try_advisory_lock(hashtext(current_schema() "
                                               "|| '.baton_node'))")};
            auto r = co_await probe_->exec(qs, opts_.connect_timeout);
            if (opts_.exclusive) node_lock_.store(r.front().text(0, 0) == "t");
            set_down(std::nullopt);
        } catch (const std::exception& e) {
            probe_.reset();
            node_lock_.store(false);
            set_down(e.what());
        }
    }

    asio::awaitable<void> probe_loop() {
        if (opts_.cluster) {
            co_await cluster_loop();
            co_return;
        }
        while (!stopping_) {
            probe_timer_.expires_after(opts_.probe_interval);
            boost::system::error_code ec;
            co_await probe_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            if (stopping_) break;
            co_await probe_once();
        }
        probe_.reset();
    }

    std::optional<insert_result> find_key(const std::string& tenant, const idempotency& idem) {
        auto r = run_one(q(find_idem, {p(tenant), p(idem.key)}));
        if (r.rows() == 0) return std::nullopt;
        auto outcome =
            r.text(0, 1) == idem.fingerprint ? insert_outcome::replayed : insert_outcome::key_reused;
        return insert_result{outcome, r.text(0, 0)};
    }

    // The pool. A connection is made when none is idle and fewer than pool_size are open; after
    // a failed connect, calls fail at once until the backoff (0.1 s doubling to 5 s) has passed.
    std::unique_ptr<pg_connection> acquire() {
        std::unique_lock lock(pool_mutex_);
        auto deadline = clock::now() + opts_.acquire_timeout;
        for (;;) {
            if (!idle_.empty()) {
                auto c = std::move(idle_.back());
                idle_.pop_back();
                return c;
            }
            if (open_ < opts_.pool_size) {
                auto now = clock::now();
                if (now < retry_at_)
                    throw store_unavailable(
                        "postgres: the database is unreachable (next attempt in " +
                        std::to_string(
                            std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now)
                                .count()) +
                        " ms): " + last_error_);
                ++open_;
                lock.unlock();
                try {
                    auto c = std::make_unique<pg_connection>(ioc_.get_executor(), statements_);
                    on_loop([&]() { return c->connect(opts_.conninfo, opts_.connect_timeout); });
                    set_down(std::nullopt);
                    lock.lock();
                    backoff_ = {};
                    retry_at_ = {};
                    return c;
                } catch (const std::exception& e) {
                    set_down(e.what());
                    lock.lock();
                    --open_;
                    backoff_ = std::min<std::chrono::milliseconds>(
                        backoff_.count() ? backoff_ * 2 : std::chrono::milliseconds(100),
                        std::chrono::milliseconds(5000));
                    retry_at_ = clock::now() + backoff_;
                    last_error_ = e.what();
                    pool_wake_.notify_all();
                    throw store_unavailable(e.what());
                }
            }
            if (pool_wake_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
                open_ >= opts_.pool_size)
                throw store_unavailable("postgres: no connection free within " +
                                        std::to_string(opts_.acquire_timeout.count()) +
                                        " ms (pool_size " + std::to_string(opts_.pool_size) + ")");
        }
    }

    void give_back(std::unique_ptr<pg_connection> c) {
        if (!c) return;
        std::lock_guard lock(pool_mutex_);
        if (c->ok()) {
            idle_.push_back(std::move(c));
        } else {
            --open_;
            destroy(std::move(c));
        }
        pool_wake_.notify_one();
    }

    void drop_idle() {
        std::lock_guard lock(pool_mutex_);
        open_ -= idle_.size();
        for (auto& c : idle_)
            destroy(std::move(c));
        idle_.clear();
        pool_wake_.notify_all();
    }

    // Connections end on the loop, where their sockets are watched.
    void destroy(std::unique_ptr<pg_connection> c) {
        asio::post(ioc_, [c = std::move(c)]() mutable { c.reset(); });
    }

    void stop_loop() {
        {
            std::lock_guard lock(pool_mutex_);
            for (auto& c : idle_)
                destroy(std::move(c));
            idle_.clear();
        }
        asio::post(ioc_, [this] {
            stopping_ = true;
            probe_timer_.cancel();
        });
        work_.reset();
        if (thread_.joinable()) thread_.join();
    }

    // Brings the database to this build's schema, once across nodes that start together: under
    // an advisory lock of the schema (search_path's first), each migration in its own transaction.
    void migrate() {
        auto c = acquire();
        auto migrations = detail::postgres_migrations();
        try {
            std::vector<pg_query> lock{
                sql("SELECT pg_advisory_lock(hashtext(current_schema() || '.baton_schema'))"),
                sql("CREATE TABLE IF NOT EXISTS baton_schema (version integer NOT NULL, "
                    "migrated_at bigint NOT NULL)"),
                sql("SELECT coalesce(max(version), 0) FROM baton_schema")};
            auto r = exec(*c, lock);
            auto from = r[2].int64(0, 0);
            auto known = static_cast<std::int64_t>(migrations.size());
            std::string error;
            if (from > known)
                error = "postgres: database schema version " + std::to_string(from) +
                        " is newer than this build (" + std::to_string(known) + ")";
            for (auto v = from; error.empty() && v < known; ++v) {
                std::vector<pg_query> m;
                for (auto s : migrations[static_cast<std::size_t>(v)])
                    m.push_back(sql(std::string(s)));
                m.push_back(sql("INSERT INTO baton_schema (version, migrated_at) VALUES (" +
                                std::to_string(v + 1) + ", " + std::to_string(now_ms()) + ")"));
                exec(*c, m);
                log::info("postgres: schema migrated", {{"version", v + 1}});
            }
            std::vector<pg_query> unlock{
                sql("SELECT pg_advisory_unlock(hashtext(current_schema() || '.baton_schema'))")};
            exec(*c, unlock);
            if (!error.empty()) throw std::runtime_error(error);
        } catch (...) {
            if (c->ok()) { // a lost connection released its lock with it
                std::vector<pg_query> unlock{sql("SELECT pg_advisory_unlock_all()")};
                try {
                    exec(*c, unlock);
                } catch (const std::exception&) {
                }
            }
            give_back(std::move(c));
            throw;
        }
        give_back(std::move(c));
    }

    // ---- Several nodes (docs/design.md "Several nodes") ----

    param me() const { return opts_.cluster ? param(node_) : std::nullopt; }

    [[noreturn]] void unknown_turn(const std::string& turn_id) const {
        if (opts_.cluster)
            throw store_unavailable("postgres: turn " + turn_id +
                                    " is not this node's to write (unknown, or taken over by "
                                    "another node after this node's lease expired)");
        throw std::runtime_error("postgres: unknown turn: " + turn_id);
    }

    void join_cluster() {
        auto started = now_ms();
        std::vector<pg_query> qs{
            q(register_node_row,
              {p(node_), p(started), p(static_cast<std::int64_t>(opts_.lease.count()))}),
            q(release_turns_row, {p(node_), p(started)}), q(release_outbox_row, {p(node_), p(started)})};
        if (run_pooled(qs)[0].affected() == 0)
            throw std::runtime_error("postgres: node id '" + node_ +
                                     "' is already registered by a live node (its lease holds)");
        log::info("postgres: joined the cluster", {{"node", node_}, {"lease_ms", opts_.lease.count()}});
    }

    // A node that stops hands its sessions on at once: its lease ends now, and the others look.
    void leave_cluster() {
        if (lost_.load()) return;
        std::vector<pg_query> qs{q(leave_row, {p(node_)}), q(notify_row, {p("baton_claim"), p("")})};
        try {
            run_pooled(qs);
            log::info("postgres: left the cluster", {{"node", node_}});
        } catch (const std::exception& e) {
            log::warn("postgres: cannot leave the cluster (the lease will expire)",
                      {{"node", node_}, {"error", e.what()}});
        }
    }

    void poke() {
        std::function<void()> f;
        {
            std::lock_guard lock(callbacks_mutex_);
            f = on_work_;
        }
        if (f) f();
    }

    void lose_lease(const std::string& why) {
        if (lost_.exchange(true)) return;
        set_down("postgres: " + why);
        log::error("postgres: this node's lease expired; other nodes take its work over",
                   {{"node", node_}, {"why", why}});
        if (opts_.on_lease_lost) opts_.on_lease_lost(why);
    }

    static constexpr const char* alone_node_message =
        "postgres: a baton node without \"cluster\": true is using this database alone (the "
        "schema's node lock is held); stop it, or give it \"cluster\": true too";

    // The cluster probe's connection: it holds the schema's node lock shared for as long as it
    // lives (false: a node without `cluster` holds it), and listens for claims and events.
    asio::awaitable<bool> connect_cluster_probe() {
        probe_ = std::make_unique<pg_connection>(ioc_.get_executor(), statements_);
        co_await probe_->connect(opts_.conninfo, opts_.connect_timeout);
        std::vector<pg_query> qs{
            sql("SELECT pg_try_advisory_lock_shared(hashtext(current_schema() || '.baton_node'))"),
            sql("LISTEN baton_claim"), sql("LISTEN baton_events"), sql("LISTEN baton_watch")};
        auto r = co_await probe_->exec(qs, opts_.connect_timeout);
        co_return r.front().text(0, 0) == "t";
    }

    // The probe of a cluster node: its own connection LISTENs for work, relayed events and
    // followers, and renews the lease every probe_interval.
    asio::awaitable<void> cluster_loop() {
        auto renew_at = clock::now();
        bool failed = false;
        bool fresh = probe_ && probe_->ok(); // connected at open
        while (!stopping_ && !lost_.load()) {
            try {
                if (!probe_ || !probe_->ok()) {
                    // Reconnected after the database went away: a node without `cluster` may
                    // have taken it meanwhile. This node's turns are then that node's.
                    if (!co_await connect_cluster_probe()) {
                        lose_lease("a node without \"cluster\" took the database while this "
                                   "one was disconnected");
                        break;
                    }
                    fresh = true;
                }
                if (fresh) {
                    poke(); // what was stored while nobody listened
                    renew_at = clock::now();
                    fresh = false;
                }
                if (clock::now() >= renew_at) {
                    std::vector<pg_query> qs{q(heartbeat_row, {p(node_)}), q(live_nodes_row)};
                    auto r = co_await probe_->exec(qs, opts_.connect_timeout);
                    if (r[0].affected() == 0) {
                        lose_lease("its lease was not renewed within " +
                                   std::to_string(opts_.lease.count()) + " ms");
                        break;
                    }
                    live_nodes_.store(r[1].int64(0, 0));
                    set_down(std::nullopt);
                    renew_at = clock::now() + opts_.probe_interval;
                }
                dispatch(probe_->take_notifications());
                // Woken by a notification at once; 100 ms at most, so that a stop is seen.
                auto wait =
                    std::min<clock::duration>(renew_at - clock::now(), std::chrono::milliseconds(100));
                if (wait > clock::duration::zero())
                    co_await probe_->wait_input(
                        std::chrono::duration_cast<std::chrono::milliseconds>(wait) +
                        std::chrono::milliseconds(1));
                dispatch(probe_->take_notifications());
            } catch (const std::exception& e) {
                probe_.reset();
                set_down(e.what());
                failed = true;
            }
            if (failed) {
                // The lease may run out meanwhile: the next renewal finds out.
                failed = false;
                probe_timer_.expires_after(
                    std::min(opts_.probe_interval, std::chrono::milliseconds(500)));
                boost::system::error_code ec;
                co_await probe_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            }
        }
        probe_.reset();
    }

    void dispatch(std::vector<std::pair<std::string, std::string>> notes) {
        for (auto& [channel, payload] : notes) {
            if (channel == "baton_claim") {
                if (payload.empty() || payload == node_) poke();
                continue;
            }
            if (!payload.empty() && payload[0] == '~') {
                auto whole = reassemble(payload);
                if (!whole) continue;
                payload = std::move(*whole);
            }
            std::error_code ec;
            auto v = json::parse(payload, ec);
            if (ec || !v.is_object()) continue;
            auto& o = v.as_object();
            auto text = [&](const char* k) -> std::string {
                auto* x = o.if_contains(k);
                return x && x->is_string() ? std::string(x->as_string()) : std::string();
            };
            if (text("f") == node_) continue; // its own, come back
            if (channel == "baton_watch") {
                std::function<void(const std::string&)> f;
                {
                    std::lock_guard lock(callbacks_mutex_);
                    f = on_watch_;
                }
                if (f) f(text("t"));
                continue;
            }
            relayed_event e;
            e.to = text("to");
            if (!e.to.empty() && e.to != node_) continue;
            e.turn_id = text("t");
            e.session = session_ref(text("n"), text("s"));
            e.type = text("y");
            if (auto* q = o.if_contains("q"); q && q->is_int64()) e.seq = q->as_int64();
            if (auto* d = o.if_contains("d")) e.data = json::serialize(*d);
            relayed_in_.fetch_add(1);
            std::function<void(relayed_event)> f;
            {
                std::lock_guard lock(callbacks_mutex_);
                f = on_event_;
            }
            if (f) f(std::move(e));
        }
    }

    // A payload over NOTIFY's 8000 bytes goes in pieces: "~<id> <i> <n>\n<piece>", in order.
    static constexpr std::size_t piece_bytes = 7000;

    std::optional<std::string> reassemble(const std::string& payload) {
        auto nl = payload.find('\n');
        if (nl == std::string::npos) return std::nullopt;
        std::string id, head = payload.substr(1, nl - 1);
        std::size_t i = 0, n = 0;
        {
            auto a = head.find(' '), b = head.rfind(' ');
            if (a == std::string::npos || a == b) return std::nullopt;
            id = head.substr(0, a);
            i = std::strtoull(head.c_str() + a + 1, nullptr, 10);
            n = std::strtoull(head.c_str() + b + 1, nullptr, 10);
        }
        if (pieces_.size() > 256) pieces_.clear(); // a sender died between pieces
        auto& acc = pieces_[id];
        if (i == 0) acc.clear();
        acc += payload.substr(nl + 1);
        if (i + 1 < n) return std::nullopt;
        auto whole = std::move(acc);
        pieces_.erase(id);
        return whole;
    }

    static void append_json_string(std::string& out, std::string_view s) {
        out += json::serialize(json::string(s));
    }

    void send_relay(relayed_event e) {
        std::string m = "{\"f\":";
        append_json_string(m, node_);
        m += ",\"to\":";
        append_json_string(m, e.to);
        m += ",\"t\":";
        append_json_string(m, e.turn_id);
        m += ",\"s\":";
        append_json_string(m, e.session.id);
        m += ",\"n\":";
        append_json_string(m, e.session.tenant);
        m += ",\"y\":";
        append_json_string(m, e.type);
        m += ",\"q\":" + std::to_string(e.seq) + ",\"d\":";
        m += e.data.empty() ? "{}" : e.data;
        m += "}";
        relayed_out_.fetch_add(1);
        enqueue("baton_events", std::move(m));
    }

    void send_follow(const std::string& turn_id) {
        std::string m = "{\"f\":";
        append_json_string(m, node_);
        m += ",\"t\":";
        append_json_string(m, turn_id);
        m += "}";
        enqueue("baton_watch", std::move(m));
    }

    void enqueue(const char* channel, std::string payload) {
        bool start = false;
        {
            std::lock_guard lock(outgoing_mutex_);
            if (payload.size() <= piece_bytes) {
                outgoing_.emplace_back(channel, std::move(payload));
            } else {
                auto id = node_ + ":" + std::to_string(++piece_id_);
                std::vector<std::string> parts;
                std::size_t at = 0;
                while (at < payload.size()) {
                    auto end = std::min(payload.size(), at + piece_bytes);
                    // Never inside a UTF-8 sequence: the server checks each payload's encoding.
                    while (end < payload.size() && end > at + 1 &&
                           (static_cast<unsigned char>(payload[end]) & 0xC0) == 0x80)
                        --end;
                    parts.push_back(payload.substr(at, end - at));
                    at = end;
                }
                for (std::size_t i = 0; i < parts.size(); ++i)
                    outgoing_.emplace_back(channel, "~" + id + " " + std::to_string(i) + " " +
                                                        std::to_string(parts.size()) + "\n" + parts[i]);
            }
            if (!flushing_) start = flushing_ = true;
        }
        if (start) asio::co_spawn(ioc_, flush_outgoing(), asio::detached);
    }

    // On the loop: what was queued goes out, up to 256 notifications a round trip, on a
    // connection of its own. What cannot be sent is dropped (a follower then sees the turn's
    // end from its record).
    asio::awaitable<void> flush_outgoing() {
        for (;;) {
            std::vector<std::pair<std::string, std::string>> batch;
            {
                std::lock_guard lock(outgoing_mutex_);
                auto n = std::min<std::size_t>(outgoing_.size(), 256);
                if (n == 0 || stopping_) {
                    outgoing_.clear();
                    flushing_ = false;
                    if (stopping_) sender_.reset();
                    co_return;
                }
                batch.assign(
                    std::make_move_iterator(outgoing_.begin()),
                    std::make_move_iterator(outgoing_.begin() + static_cast<std::ptrdiff_t>(n)));
                outgoing_.erase(outgoing_.begin(), outgoing_.begin() + static_cast<std::ptrdiff_t>(n));
            }
            try {
                if (!sender_ || !sender_->ok()) {
                    sender_ = std::make_unique<pg_connection>(ioc_.get_executor(), statements_);
                    co_await sender_->connect(opts_.conninfo, opts_.connect_timeout);
                }
                std::vector<pg_query> qs;
                qs.reserve(batch.size());
                for (auto& [channel, payload] : batch)
                    qs.push_back(q(notify_row, {p(channel), p(payload)}));
                co_await sender_->exec(qs, opts_.query_timeout);
            } catch (const std::exception& e) {
                sender_.reset();
                relay_dropped_.fetch_add(static_cast<std::int64_t>(batch.size()));
                log::warn("postgres: cannot relay events",
                          {{"error", e.what()}, {"dropped", batch.size()}});
            }
        }
    }

    claimed_work claim() {
        claimed_work w;
        if (!opts_.cluster) return w;
        std::vector<pg_query> qs{q(claim_turn_rows, {p(node_), p(std::int64_t{1000})}),
                                 q(claim_outbox_rows, {p(node_), p(std::int64_t{1000})}),
                                 q(forget_nodes_row, {p(node_)})};
        auto r = run(qs);
        std::vector<std::pair<std::int64_t, claimed_work::turn>> turns;
        for (int i = 0; i < r[0].rows(); ++i)
            turns.emplace_back(
                r[0].int64(i, 23),
                claimed_work::turn{read_turn(r[0], i), r[0].text(i, 21), r[0].text(i, 22)});
        std::sort(turns.begin(), turns.end(), [](auto& a, auto& b) { return a.first < b.first; });
        for (auto& [seq, t] : turns) {
            if (!t.taken_from.empty()) taken_over_.fetch_add(1);
            w.turns.push_back(std::move(t));
        }
        auto items = read_outbox(r[1]);
        std::vector<std::pair<std::int64_t, std::size_t>> order;
        for (int i = 0; i < r[1].rows(); ++i)
            order.emplace_back(r[1].int64(i, 15), static_cast<std::size_t>(i));
        std::sort(order.begin(), order.end());
        for (auto& [seq, i] : order)
            w.outbox.push_back(std::move(items[i]));
        claims_.fetch_add(1);
        claimed_turns_.fetch_add(static_cast<std::int64_t>(w.turns.size()));
        return w;
    }

    cluster::stats cluster_stats() const {
        cluster::stats s;
        s.live_nodes = live_nodes_.load();
        s.claims = claims_.load();
        s.claimed_turns = claimed_turns_.load();
        s.taken_over_turns = taken_over_.load();
        s.relayed_out = relayed_out_.load();
        s.relayed_in = relayed_in_.load();
        std::lock_guard lock(pool_mutex_);
        s.pool_open = static_cast<std::int64_t>(open_);
        s.pool_idle = static_cast<std::int64_t>(idle_.size());
        s.pool_size = static_cast<std::int64_t>(opts_.pool_size);
        return s;
    }

    class cluster_part final : public baton::cluster {
    public:
        explicit cluster_part(postgres_store& s) : s_(s) {}
        const std::string& node_id() const override { return s_.node_; }
        claimed_work claim() override { return s_.claim(); }
        void subscribe(std::function<void()> work, std::function<void(relayed_event)> event,
                       std::function<void(const std::string&)> watch) override {
            std::lock_guard lock(s_.callbacks_mutex_);
            s_.on_work_ = std::move(work);
            s_.on_event_ = std::move(event);
            s_.on_watch_ = std::move(watch);
        }
        void relay(relayed_event e) override { s_.send_relay(std::move(e)); }
        void follow(const std::string& turn_id) override { s_.send_follow(turn_id); }
        stats status() const override { return s_.cluster_stats(); }
        activity session_activity(const session_ref& session) override {
            auto r = s_.run_one(q(session_activity_row, {p(session.tenant), p(session.id)}));
            return {r.int64(0, 0) > 0, r.int64(0, 1)};
        }

    private:
        postgres_store& s_;
    };

    postgres_options opts_;
    detail::pg_statement_table statements_;
    asio::io_context ioc_{1};
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::thread thread_;

    mutable std::mutex pool_mutex_;
    std::condition_variable pool_wake_;
    std::vector<std::unique_ptr<pg_connection>> idle_;
    std::size_t open_ = 0;
    std::chrono::milliseconds backoff_{0};
    clock::time_point retry_at_{};
    std::string last_error_;

    // The probe (loop thread only) and what it found.
    std::unique_ptr<pg_connection> probe_;
    asio::steady_timer probe_timer_{ioc_};
    bool stopping_ = false;
    std::atomic<bool> node_lock_{false};
    mutable std::mutex health_mutex_;
    std::optional<std::string> down_;

    std::mutex batches_mutex_;
    std::unordered_map<std::thread::id, std::unique_ptr<batch>> batches_;

    // The cluster's part: this node, its lease, the callbacks, the outgoing notifications.
    std::string node_;
    std::atomic<bool> lost_{false};
    std::atomic<std::int64_t> live_nodes_{0}, claims_{0}, claimed_turns_{0}, taken_over_{0},
        relayed_out_{0}, relayed_in_{0}, relay_dropped_{0};
    std::mutex callbacks_mutex_;
    std::function<void()> on_work_;
    std::function<void(relayed_event)> on_event_;
    std::function<void(const std::string&)> on_watch_;
    std::mutex outgoing_mutex_;
    std::deque<std::pair<std::string, std::string>> outgoing_;
    bool flushing_ = false;
    std::uint64_t piece_id_ = 0;
    std::unique_ptr<pg_connection> sender_;               // loop thread only
    std::unordered_map<std::string, std::string> pieces_; // loop thread only
    cluster_part cluster_{*this};
};

} // namespace

std::unique_ptr<store> make_postgres_store(const postgres_options& opts) {
    return std::make_unique<postgres_store>(opts);
}

std::optional<std::string> postgres_conninfo_error(const std::string& conninfo) {
    const auto& api = detail::pq();
    char* error = nullptr;
    PQconninfoOption* options = api.PQconninfoParse(conninfo.c_str(), &error);
    if (options) {
        api.PQconninfoFree(options);
        return std::nullopt;
    }
    std::string why = error ? error : "libpq cannot parse it";
    if (error) api.PQfreemem(error);
    while (!why.empty() && (why.back() == '\n' || why.back() == ' '))
        why.pop_back();
    return why;
}

} // namespace baton
