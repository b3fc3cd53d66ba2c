// The SQLite store: one connection in WAL mode behind a mutex, statements prepared once at open,
// every write in an IMMEDIATE transaction. The schema and its migrations live in sqlite_schema.cpp.
#include <baton/json_text.hpp>
#include <baton/store.hpp>

#include "src/store/sqlite_query.hpp"
#include "src/store/sqlite_schema.hpp"
#include "src/store/sqlite_wal_vfs.hpp"
#include "src/store/store_columns.hpp"

#include <sqlite3.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <stdexcept>

namespace baton {
namespace {

using detail::fail;
using detail::query;
using detail::sql_limit;
using detail::statement;
using detail::step_and_reset;

struct db_closer {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using db_ptr = std::unique_ptr<sqlite3, db_closer>;

void exec(sqlite3* db, const std::string& sql) {
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) fail(db, sql);
}

std::string checked_synchronous(std::string mode) {
    std::transform(mode.begin(), mode.end(), mode.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (mode != "off" && mode != "normal" && mode != "full")
        throw std::runtime_error("sqlite: synchronous must be off, normal or full, not '" + mode + "'");
    return mode;
}

// One store at a time runs turns on a database: a second one (another `baton serve` on the same
// --data, or a second store in one program) would take the first one's running turns for
// abandoned and run them again, and deliver its outbox too. So a store holds flock(2) on
// "<path>-lock" for its life; the kernel lets go when the process ends, however it ends. A file
// of its own, not the database: closing any descriptor of the database would drop the process's
// fcntl(2) locks on it, which are SQLite's. Readers that are not stores (the sqlite3 shell, a
// backup) take no part and are not held.
class sole_store {
public:
    explicit sole_store(const std::string& db_path) {
        std::filesystem::path path(db_path);
        if (path.has_parent_path()) {
            std::error_code ec;
            std::filesystem::create_directories(path.parent_path(), ec);
            if (ec)
                throw std::runtime_error("sqlite: cannot create " + path.parent_path().string() + ": " +
                                         ec.message());
        }
        if (std::filesystem::is_directory(path))
            throw std::runtime_error("sqlite: " + db_path + " is a directory");
        // Beside the file the path leads to, as SQLite's own -wal and -shm are: a symlink to the
        // database (or through a linked directory) must meet the same lock.
        std::error_code cec;
        auto real = std::filesystem::weakly_canonical(path, cec);
        const std::string lock_path = (cec ? db_path : real.string()) + "-lock";
        fd_ = ::open(lock_path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0)
            throw std::runtime_error("sqlite: cannot open " + lock_path + ": " + std::strerror(errno));
        if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            ::close(fd_);
            if (err == EWOULDBLOCK)
                throw std::runtime_error("sqlite: " + db_path +
                                         " is in use by another baton process (or another store in "
                                         "this one); one at a time may run turns on a database");
            throw std::runtime_error("sqlite: cannot lock " + lock_path + ": " + std::strerror(err));
        }
    }
    ~sole_store() { ::close(fd_); }
    sole_store(const sole_store&) = delete;
    sole_store& operator=(const sole_store&) = delete;

private:
    int fd_ = -1;
};

// Opens the file (its directory exists: sole_store made it) and brings it to the current schema;
// closes it again if anything fails.
db_ptr open_database(const sqlite_options& opts) {
    sqlite3* raw = nullptr;
    // NOMUTEX: the store's own mutex already serialises every use of the connection. The VFS
    // writes a commit's WAL frames in one system call (sqlite_wal_vfs.hpp).
    int rc = sqlite3_open_v2(opts.path.c_str(), &raw,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             detail::sqlite_combining_vfs());
    db_ptr db(raw);
    if (rc != SQLITE_OK) {
        if (!db) throw std::runtime_error("sqlite: cannot open " + opts.path + ": out of memory");
        fail(db.get(), "cannot open " + opts.path);
    }
    sqlite3_extended_result_codes(db.get(), 1);
    // Another process (a backup, the CLI) may hold the lock briefly: wait rather than fail.
    sqlite3_busy_timeout(db.get(), 5000);
    try {
        detail::refuse_foreign_database(db.get());
        exec(db.get(), "PRAGMA journal_mode = WAL");
        exec(db.get(), "PRAGMA synchronous = " + checked_synchronous(opts.synchronous));
        exec(db.get(), "PRAGMA foreign_keys = ON");
        // Statement journals (every call of a group commit is a savepoint) stay in memory: past
        // 64 KiB SQLite would spill one to a temporary file, created, written page by page and
        // deleted again in every such transaction.
        exec(db.get(), "PRAGMA temp_store = MEMORY");
        detail::migrate_sqlite(db.get());
    } catch (const std::exception& e) {
        // The file's name first, then why (a read-only directory, a file that is not a database):
        // found by a new-user check, the message named neither.
        std::string why = e.what();
        if (why.starts_with("sqlite: ")) why.erase(0, 8);
        int err = sqlite3_system_errno(db.get());
        throw std::runtime_error("sqlite: " + opts.path + ": " + why +
                                 (err != 0 ? std::string(" (") + std::strerror(err) + ")" : ""));
    }
    return db;
}

using detail::outbox_columns;
using detail::tape_columns;
using detail::turn_columns;

// Every statement the store runs, prepared once when the store opens.
struct statements {
    explicit statements(sqlite3* db)
        : begin(db, "BEGIN IMMEDIATE"), commit(db, "COMMIT"), rollback(db, "ROLLBACK"),
          savepoint(db, "SAVEPOINT call"), release(db, "RELEASE call"),
          rollback_to(db, "ROLLBACK TO call"),
          find_idem(db, "SELECT turn_id, idem_fingerprint FROM turns WHERE tenant = ?1 AND "
                        "idem_key = ?2"),
          touch_session_for_turn(
              db, "INSERT INTO sessions (session_id, tenant, agent, turns, last_turn_id, created_at) "
                  "VALUES (?1, ?2, ?3, 1, ?4, ?5) ON CONFLICT (tenant, session_id) DO UPDATE SET "
                  "turns = turns + 1, last_turn_id = excluded.last_turn_id"),
          insert_turn(
              db, "INSERT INTO turns (turn_id, session_id, agent, tenant, status, input_text, "
                  "input_channel, metadata, deliver, idem_key, idem_fingerprint, reply, steps, "
                  "prompt_tokens, completion_tokens, error_code, error_message, created_at, "
                  "started_at, finished_at, attempt) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
                  "?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)"),
          mark_running(db, "UPDATE turns SET status = 'running', started_at = ?2, attempt = attempt + 1 "
                           "WHERE turn_id = ?1"),
          mark_side_effects(db, "UPDATE turns SET side_effects = 1 WHERE turn_id = ?1"),
          finish_turn(db,
                      "UPDATE turns SET status = ?2, reply = ?3, steps = ?4, prompt_tokens = ?5, "
                      "completion_tokens = ?6, error_code = ?7, error_message = ?8, started_at = ?9, "
                      "finished_at = ?10, refusal = ?11, attempt = ?12 WHERE turn_id = ?1"),
          ensure_session(db, "INSERT INTO sessions (session_id, tenant, agent, created_at) "
                             "VALUES (?1, ?3, 'default', ?2) ON CONFLICT (tenant, session_id) "
                             "DO NOTHING"),
          tape_next(db, "SELECT tape_next FROM sessions WHERE tenant = ?2 AND session_id = ?1"),
          append_tape(db, "INSERT INTO tape (session_id, id, kind, payload, turn_id, created_at, "
                          "tenant) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
          update_session(db, "UPDATE sessions SET tape_next = ?2, state = coalesce(?3, state) "
                             "WHERE tenant = ?4 AND session_id = ?1"),
          get_turn(db, "SELECT " + turn_columns + " FROM turns WHERE turn_id = ?1"),
          get_session(db, "SELECT session_id, tenant, agent, turns, last_turn_id, state, created_at "
                          "FROM sessions WHERE tenant = ?2 AND session_id = ?1"),
          read_tape(db, "SELECT " + tape_columns +
                            " FROM tape WHERE tenant = ?4 AND session_id = ?1 AND id > ?2 "
                            "ORDER BY id LIMIT ?3"),
          tape_tail(db, "SELECT " + tape_columns +
                            " FROM tape WHERE tenant = ?3 AND session_id = ?1 ORDER BY id DESC "
                            "LIMIT ?2"),
          unfinished(db, "SELECT " + turn_columns +
                             " FROM turns WHERE status IN ('queued', 'running') ORDER BY seq"),
          add_outbox(db, "INSERT INTO outbox (key, turn_id, session_id, channel, recipient, idx, text, "
                         "status, attempts, uncertain, created_at, updated_at, tenant) VALUES (?1, ?2, "
                         "?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, ?12) ON CONFLICT (key) DO NOTHING"),
          update_outbox(db, "UPDATE outbox SET status = ?2, attempts = ?3, uncertain = ?4, "
                            "updated_at = ?5, next_attempt_at = ?6, last_error = nullif(?7, '') "
                            "WHERE key = ?1"),
          get_cursor(db, "SELECT value FROM cursors WHERE name = ?1"),
          set_cursor(db, "INSERT INTO cursors (name, value, updated_at) VALUES (?1, ?2, ?3) "
                         "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                         "updated_at = excluded.updated_at"),
          get_outbox(db, "SELECT " + outbox_columns + " FROM outbox WHERE key = ?1"),
          // Empty filter values match everything; ?4 is a list like ",pending,sending,".
          list_outbox(db, "SELECT " + outbox_columns +
                              " FROM outbox WHERE (?1 = '' OR channel = ?1) AND (?2 = '' OR "
                              "session_id = ?2) AND (?3 = 0 OR uncertain = 1) AND (?4 = '' OR "
                              "instr(?4, ',' || status || ',') > 0) AND (?6 = '' OR tenant = ?6) "
                              "ORDER BY seq LIMIT ?5"),
          // A channel's undelivered items for one session (served by the outbox_open index).
          open_outbox(db, "SELECT " + outbox_columns +
                              " FROM outbox WHERE channel = ?1 AND tenant = ?4 AND session_id = ?2 "
                              "AND status IN ('pending', 'sending') ORDER BY seq LIMIT ?3"),
          usage(db, "SELECT tenant, finished_at / 86400000 AS day, count(*), sum(prompt_tokens), "
                    "sum(completion_tokens) FROM turns WHERE (?1 = '' OR tenant = ?1) AND "
                    "finished_at IS NOT NULL AND finished_at >= ?2 GROUP BY tenant, day "
                    "ORDER BY tenant, day"),
          count_outbox(db,
                       "SELECT status, sum(n), sum(uncertain * n) FROM outbox_counts GROUP BY status") {}

    statement begin, commit, rollback, savepoint, release, rollback_to;
    statement find_idem, touch_session_for_turn, insert_turn, mark_running, mark_side_effects,
        finish_turn;
    statement ensure_session, tape_next, append_tape, update_session;
    statement get_turn, get_session, read_tape, tape_tail, unfinished;
    statement add_outbox, update_outbox, get_cursor, set_cursor;
    statement get_outbox, list_outbox, open_outbox;
    statement usage, count_outbox;
};

// A group commit in progress (store_runner): calls run as savepoints of one open transaction.
struct batch_state {
    bool open = false;
    bool broken = false;  // SQLite rolled the whole transaction back (I/O error, disk full)
    bool bare = false;    // optimistic: calls run without a savepoint each
    bool tainted = false; // a bare call failed: its writes are in, so the batch must not commit
};

// Rolls back unless committed, so that an exception anywhere in a write leaves no trace. Inside a
// batch it is a savepoint: only this call is undone, the batch goes on.
class transaction {
public:
    transaction(statements& st, batch_state& batch)
        : st_(st), batch_(batch), nested_(batch.open), bare_(batch.open && batch.bare),
          changes_(bare_ ? sqlite3_total_changes64(st.begin.db()) : 0) {
        if (nested_ && batch_.broken)
            throw std::runtime_error("sqlite: the batch's transaction was rolled back");
        if (bare_) refuse_if_tainted();
        // In an optimistic batch a call opens no savepoint: journalling every page it changes
        // for an undo that a failure never needs alone (the whole batch is rolled back and run
        // again) was a tenth of a turn's instructions.
        if (!bare_) query(nested_ ? st_.savepoint : st_.begin).run();
    }
    transaction(const transaction&) = delete;
    transaction& operator=(const transaction&) = delete;
    ~transaction() {
        if (committed_) return;
        // SQLite may already have rolled back on its own (e.g. after SQLITE_FULL or an I/O error).
        bool open = !sqlite3_get_autocommit(st_.rollback.db());
        if (!nested_) {
            if (open) step_and_reset(st_.rollback);
            return;
        }
        if (!open) {
            // Every earlier call of the batch went with it, bare or not; the calls after this
            // one must not run outside a transaction.
            batch_.broken = true;
            return;
        }
        if (bare_) {
            // Ended without its commit (a throw, or an early return after a read): only a call
            // that wrote something leaves writes that the batch must not commit.
            if (sqlite3_total_changes64(st_.begin.db()) != changes_) batch_.tainted = true;
            return;
        }
        step_and_reset(st_.rollback_to);
        step_and_reset(st_.release);
    }
    void commit() {
        if (bare_)
            refuse_if_tainted(); // a nested call that failed and was caught left its writes in
        else
            query(nested_ ? st_.release : st_.commit).run();
        committed_ = true;
    }

private:
    void refuse_if_tainted() const {
        if (batch_.tainted)
            throw std::runtime_error("sqlite: a call of this batch failed; it must be rolled back");
    }

    statements& st_;
    batch_state& batch_;
    bool nested_;
    bool bare_;
    sqlite3_int64 changes_; // rows changed on the connection when a bare call began
    bool committed_ = false;
};

turn_status status_column(const query& q, int c) {
    auto text = q.text(c);
    auto s = parse_turn_status(text);
    if (!s) throw std::runtime_error("sqlite: unknown turn status '" + text + "'");
    return *s;
}

turn_record read_turn(const query& q) {
    turn_record t;
    t.turn_id = q.text(0);
    t.session_id = q.text(1);
    t.agent = q.text(2);
    t.tenant = q.text(3);
    t.status = status_column(q, 4);
    t.input.text = q.text(5);
    t.input.channel = q.text(6);
    t.input.metadata = q.json_object(7);
    t.input.deliver = q.json_value(8);
    t.reply = q.opt_text(9);
    t.steps = q.int64(10);
    t.usage.prompt_tokens = q.int64(11);
    t.usage.completion_tokens = q.int64(12);
    if (!q.is_null(13)) t.error = error_info{q.text(13), q.text(14)};
    t.created_at = q.int64(15);
    t.started_at = q.opt_int64(16);
    t.finished_at = q.opt_int64(17);
    t.refusal = q.int64(18) != 0;
    t.attempt = q.int64(19);
    t.side_effects = q.int64(20) != 0;
    return t;
}

tape_entry read_entry(const query& q) {
    tape_entry e;
    e.id = q.int64(0);
    auto kind = q.text(1);
    auto k = parse_tape_kind(kind);
    if (!k) throw std::runtime_error("sqlite: unknown tape kind '" + kind + "'");
    e.kind = *k;
    e.payload = q.json_object(2);
    e.created_at = q.int64(3);
    e.turn_id = q.text(4);
    return e;
}

outbox_item read_outbox(const query& q) {
    outbox_item o;
    o.key = q.text(0);
    o.turn_id = q.text(1);
    o.tenant = q.text(2);
    o.session_id = q.text(3);
    o.channel = q.text(4);
    o.recipient = q.text(5);
    o.index = q.int64(6);
    o.text = q.text(7);
    auto status = q.text(8);
    auto st = parse_outbox_status(status);
    if (!st) throw std::runtime_error("sqlite: unknown outbox status '" + status + "'");
    o.status = *st;
    o.attempts = q.int64(9);
    o.uncertain = q.int64(10) != 0;
    o.created_at = q.int64(11);
    o.updated_at = q.int64(12);
    o.next_attempt_at = q.int64(13);
    o.last_error = q.text(14);
    return o;
}

std::optional<std::string> optional_key(const std::string& s) {
    return s.empty() ? std::nullopt : std::optional(s);
}

class sqlite_store final : public store {
public:
    explicit sqlite_store(const sqlite_options& opts)
        : sole_(opts.path), db_(open_database(opts)), st_(db_.get()) {}

    bool blocking() const override { return true; }

    insert_result insert_turn(const turn_record& t, const idempotency& idem) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        if (!idem.key.empty())
            if (auto found = find_key(t.tenant, idem)) return *found;
        // The session row first: the turn's foreign key needs it.
        query(st_.touch_session_for_turn)
            .bind(1, t.session_id)
            .bind(2, t.tenant)
            .bind(3, t.agent)
            .bind(4, t.turn_id)
            .bind(5, t.created_at)
            .run();
        auto deliver =
            t.input.deliver.is_null() ? std::nullopt : std::optional(json::serialize(t.input.deliver));
        std::optional<std::string> error_code, error_message;
        if (t.error) {
            error_code = t.error->code;
            error_message = t.error->message;
        }
        query(st_.insert_turn)
            .bind(1, t.turn_id)
            .bind(2, t.session_id)
            .bind(3, t.agent)
            .bind(4, t.tenant)
            .bind(5, to_string(t.status))
            .bind(6, t.input.text)
            .bind(7, t.input.channel)
            .bind(8, json::serialize(t.input.metadata))
            .bind(9, deliver)
            .bind(10, optional_key(idem.key))
            .bind(11, optional_key(idem.key) ? std::optional(idem.fingerprint) : std::nullopt)
            .bind(12, t.reply)
            .bind(13, t.steps)
            .bind(14, t.usage.prompt_tokens)
            .bind(15, t.usage.completion_tokens)
            .bind(16, error_code)
            .bind(17, error_message)
            .bind(18, t.created_at)
            .bind(19, t.started_at)
            .bind(20, t.finished_at)
            .bind(21, t.attempt)
            .run();
        tx.commit();
        return {insert_outcome::inserted, t.turn_id};
    }

    void mark_running(const std::string& turn_id, time_ms started_at) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        if (query(st_.mark_running).bind(1, turn_id).bind(2, started_at).run() == 0)
            throw std::runtime_error("sqlite: unknown turn: " + turn_id);
        tx.commit();
    }

    void mark_side_effects(const std::string& turn_id) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        if (query(st_.mark_side_effects).bind(1, turn_id).run() == 0)
            throw std::runtime_error("sqlite: unknown turn: " + turn_id);
        tx.commit();
    }

    std::vector<outbox_item> end_turn(turn_end& e) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        // The calls below nest in this one as savepoints; all of them or none.
        struct nest {
            batch_state& b;
            bool was;
            explicit nest(batch_state& s) : b(s), was(s.open) { b.open = true; }
            ~nest() { b.open = was; }
        } nested(batch_);
        auto added = store::end_turn(e);
        tx.commit();
        return added;
    }

    void save_state(state_update& u) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        std::int64_t next = 1;
        bool known = false;
        {
            query q(st_.tape_next);
            if (q.bind(1, u.session_id).bind(2, u.tenant).step()) {
                next = q.int64(0);
                known = true;
            }
        }
        // A session no turn has named yet (a library's own save) gets its row here.
        if (!known)
            query(st_.ensure_session).bind(1, u.session_id).bind(2, now_ms()).bind(3, u.tenant).run();
        // Written into `u` before the commit: a failed save leaves ids that a retry simply reassigns.
        for (auto& e : u.entries) {
            e.id = next++;
            if (e.created_at == 0) e.created_at = now_ms();
            if (e.turn_id.empty()) e.turn_id = u.turn_id;
            query(st_.append_tape)
                .bind(1, u.session_id)
                .bind(2, e.id)
                .bind(3, to_string(e.kind))
                .bind(4, json_text(e.payload))
                .bind(5, e.turn_id)
                .bind(6, e.created_at)
                .bind(7, u.tenant)
                .run();
        }
        auto state = u.state ? std::optional(json_text(*u.state)) : std::nullopt;
        query(st_.update_session)
            .bind(1, u.session_id)
            .bind(2, next)
            .bind(3, state)
            .bind(4, u.tenant)
            .run();
        tx.commit();
    }

    void finish_turn(const turn_record& t) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        std::optional<std::string> error_code, error_message;
        if (t.error) {
            error_code = t.error->code;
            error_message = t.error->message;
        }
        auto changed = query(st_.finish_turn)
                           .bind(1, t.turn_id)
                           .bind(2, to_string(t.status))
                           .bind(3, t.reply)
                           .bind(4, t.steps)
                           .bind(5, t.usage.prompt_tokens)
                           .bind(6, t.usage.completion_tokens)
                           .bind(7, error_code)
                           .bind(8, error_message)
                           .bind(9, t.started_at)
                           .bind(10, t.finished_at)
                           .bind(11, static_cast<std::int64_t>(t.refusal))
                           .bind(12, t.attempt)
                           .run();
        if (changed == 0) throw std::runtime_error("sqlite: unknown turn: " + t.turn_id);
        tx.commit();
    }

    std::optional<insert_result> find_idempotency(const std::string& tenant,
                                                  const idempotency& idem) override {
        std::lock_guard lock(mutex_);
        return find_key(tenant, idem);
    }

    std::optional<turn_record> get_turn(const std::string& turn_id) override {
        std::lock_guard lock(mutex_);
        query q(st_.get_turn);
        if (!q.bind(1, turn_id).step()) return std::nullopt;
        return read_turn(q);
    }

    std::optional<session_record> get_session(const session_ref& session) override {
        std::lock_guard lock(mutex_);
        query q(st_.get_session);
        if (!q.bind(1, session.id).bind(2, session.tenant).step()) return std::nullopt;
        session_record s;
        s.session_id = q.text(0);
        s.tenant = q.text(1);
        s.agent = q.text(2);
        s.turns = q.int64(3);
        s.last_turn_id = q.opt_text(4);
        s.state = q.json_object(5);
        s.created_at = q.int64(6);
        return s;
    }

    std::vector<tape_entry> read_tape(const session_ref& session, std::int64_t after,
                                      std::size_t limit) override {
        std::lock_guard lock(mutex_);
        query q(st_.read_tape);
        q.bind(1, session.id).bind(2, after).bind(3, sql_limit(limit)).bind(4, session.tenant);
        std::vector<tape_entry> out;
        while (q.step())
            out.push_back(read_entry(q));
        return out;
    }

    std::vector<tape_entry> tape_tail(const session_ref& session, std::size_t limit) override {
        std::lock_guard lock(mutex_);
        query q(st_.tape_tail);
        q.bind(1, session.id).bind(2, sql_limit(limit)).bind(3, session.tenant);
        std::vector<tape_entry> out;
        while (q.step())
            out.push_back(read_entry(q));
        // Read newest first so the LIMIT applies to the end of the tape; callers want ascending.
        std::reverse(out.begin(), out.end());
        return out;
    }

    bool add_outbox(const outbox_item& o) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        auto added = query(st_.add_outbox)
                         .bind(1, o.key)
                         .bind(2, o.turn_id)
                         .bind(3, o.session_id)
                         .bind(4, o.channel)
                         .bind(5, o.recipient)
                         .bind(6, o.index)
                         .bind(7, o.text)
                         .bind(8, to_string(o.status))
                         .bind(9, o.attempts)
                         .bind(10, std::int64_t{o.uncertain})
                         .bind(11, o.created_at ? o.created_at : now_ms())
                         .bind(12, o.tenant)
                         .run();
        tx.commit();
        return added > 0;
    }

    bool update_outbox(const outbox_item& o) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        auto changed = query(st_.update_outbox)
                           .bind(1, o.key)
                           .bind(2, to_string(o.status))
                           .bind(3, o.attempts)
                           .bind(4, std::int64_t{o.uncertain})
                           .bind(5, now_ms())
                           .bind(6, o.next_attempt_at)
                           .bind(7, o.last_error)
                           .run();
        tx.commit();
        return changed > 0;
    }

    std::optional<std::string> get_cursor(const std::string& name) override {
        std::lock_guard lock(mutex_);
        query q(st_.get_cursor);
        if (!q.bind(1, name).step()) return std::nullopt;
        return q.text(0);
    }

    void set_cursor(const std::string& name, const std::string& value) override {
        std::lock_guard lock(mutex_);
        transaction tx(st_, batch_);
        query(st_.set_cursor).bind(1, name).bind(2, value).bind(3, now_ms()).run();
        tx.commit();
    }

    std::optional<outbox_item> get_outbox(const std::string& key) override {
        std::lock_guard lock(mutex_);
        query q(st_.get_outbox);
        if (!q.bind(1, key).step()) return std::nullopt;
        return read_outbox(q);
    }

    std::vector<outbox_item> list_outbox(const outbox_filter& f) override {
        std::string statuses;
        for (auto s : f.statuses)
            statuses += "," + std::string(to_string(s));
        if (!statuses.empty()) statuses += ",";
        std::lock_guard lock(mutex_);
        if (statuses == ",pending,sending," && !f.uncertain_only && !f.channel.empty() &&
            !f.tenant.empty() && !f.session_id.empty()) {
            query q(st_.open_outbox);
            q.bind(1, f.channel).bind(2, f.session_id).bind(3, sql_limit(f.limit)).bind(4, f.tenant);
            std::vector<outbox_item> out;
            while (q.step())
                out.push_back(read_outbox(q));
            return out;
        }
        query q(st_.list_outbox);
        q.bind(1, f.channel)
            .bind(2, f.session_id)
            .bind(3, std::int64_t{f.uncertain_only})
            .bind(4, statuses)
            .bind(5, sql_limit(f.limit))
            .bind(6, f.tenant);
        std::vector<outbox_item> out;
        while (q.step())
            out.push_back(read_outbox(q));
        return out;
    }

    std::vector<usage_row> usage_by_day(const std::string& tenant, time_ms from) override {
        std::lock_guard lock(mutex_);
        query q(st_.usage);
        q.bind(1, tenant).bind(2, from);
        std::vector<usage_row> out;
        while (q.step())
            out.push_back({q.text(0), q.int64(1), q.int64(2), q.int64(3), q.int64(4)});
        return out;
    }

    outbox_counts count_outbox() override {
        std::lock_guard lock(mutex_);
        query q(st_.count_outbox);
        outbox_counts n;
        while (q.step()) {
            auto st = parse_outbox_status(q.text(0));
            if (!st) throw std::runtime_error("sqlite: unknown outbox status '" + q.text(0) + "'");
            n.by_status[static_cast<std::size_t>(*st)] += q.int64(1);
            n.uncertain += q.int64(2);
        }
        return n;
    }

    void begin_batch() override { begin(false); }

    bool begin_optimistic_batch() override {
        begin(true);
        return true;
    }

    void abort_batch() override {
        std::lock_guard lock(mutex_);
        batch_ = batch_state{};
        if (!sqlite3_get_autocommit(db_.get())) step_and_reset(st_.rollback);
    }

    void end_batch() override {
        std::lock_guard lock(mutex_);
        bool broken = batch_.broken, tainted = batch_.tainted;
        batch_ = batch_state{};
        try {
            if (broken) throw std::runtime_error("sqlite: the batch's transaction was rolled back");
            if (tainted)
                throw batch_replay("sqlite: a call of this batch failed; nothing of it is stored");
            query(st_.commit).run();
        } catch (...) {
            if (!sqlite3_get_autocommit(db_.get())) step_and_reset(st_.rollback);
            throw;
        }
    }

    std::vector<turn_record> unfinished_turns() override {
        std::lock_guard lock(mutex_);
        query q(st_.unfinished);
        std::vector<turn_record> out;
        while (q.step())
            out.push_back(read_turn(q));
        return out;
    }

private:
    // Under mutex_.
    std::optional<insert_result> find_key(const std::string& tenant, const idempotency& idem) {
        query q(st_.find_idem);
        if (!q.bind(1, tenant).bind(2, idem.key).step()) return std::nullopt;
        auto outcome =
            q.text(1) == idem.fingerprint ? insert_outcome::replayed : insert_outcome::key_reused;
        return insert_result{outcome, q.text(0)};
    }

    // A group commit's transaction; `bare`: its calls open no savepoint each.
    void begin(bool bare) {
        std::lock_guard lock(mutex_);
        query(st_.begin).run();
        batch_ = batch_state{true, false, bare, false};
    }

    std::recursive_mutex mutex_; // recursive: end_turn makes the other writes inside its own
    batch_state batch_;
    sole_store sole_; // first: held until the connection has closed
    db_ptr db_; // declared before st_: statements are finalised before the connection closes
    statements st_;
};

} // namespace

std::unique_ptr<store> make_sqlite_store(const sqlite_options& opts) {
    return std::make_unique<sqlite_store>(opts);
}

} // namespace baton
