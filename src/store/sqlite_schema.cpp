#include "src/store/sqlite_schema.hpp"

#include <sqlite3.h>

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

namespace baton::detail {
namespace {

// Append only: a released migration is never edited, a change is a new entry at the end.
constexpr std::array<std::string_view, 8> migrations{
    // 1: sessions, turns, tape.
    R"sql(
CREATE TABLE sessions (
    session_id   TEXT PRIMARY KEY NOT NULL,
    tenant       TEXT NOT NULL,
    agent        TEXT NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    last_turn_id TEXT,
    state        TEXT NOT NULL DEFAULT '{}',
    tape_next    INTEGER NOT NULL DEFAULT 1,
    created_at   INTEGER NOT NULL
);
-- seq is the global accept order; AUTOINCREMENT so it never goes back, even if turns are pruned.
CREATE TABLE turns (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id           TEXT NOT NULL UNIQUE,
    session_id        TEXT NOT NULL REFERENCES sessions(session_id),
    agent             TEXT NOT NULL,
    tenant            TEXT NOT NULL,
    status            TEXT NOT NULL,
    input_text        TEXT NOT NULL,
    input_channel     TEXT NOT NULL,
    metadata          TEXT NOT NULL,
    deliver           TEXT,
    idem_key          TEXT,
    idem_fingerprint  TEXT,
    reply             TEXT,
    steps             INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    error_code        TEXT,
    error_message     TEXT,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER
);
-- The store writes NULL for "no key"; IS NOT NULL alone lets `idem_key = ?` use this index.
CREATE UNIQUE INDEX turns_idem_key ON turns(idem_key) WHERE idem_key IS NOT NULL;
-- Partial: holds only the turns a restart must look at, already in accept order.
CREATE INDEX turns_unfinished ON turns(seq) WHERE status IN ('queued', 'running');
CREATE TABLE tape (
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    id         INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    turn_id    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, id)
) WITHOUT ROWID;
)sql",
    // 2: the outbox.
    R"sql(
CREATE TABLE outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    key             TEXT NOT NULL UNIQUE,
    turn_id         TEXT NOT NULL,
    session_id      TEXT NOT NULL,
    channel         TEXT NOT NULL,
    recipient       TEXT NOT NULL,
    idx             INTEGER NOT NULL,
    text            TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    uncertain       INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
-- What is still to deliver, per channel and session, in creation order.
CREATE INDEX outbox_open ON outbox(channel, session_id, seq) WHERE status IN ('pending', 'sending');
)sql",
    // 3: channel cursors (Telegram's update offset, schedules' last fires).
    R"sql(
CREATE TABLE cursors (
    name       TEXT PRIMARY KEY NOT NULL,
    value      TEXT NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
)sql",
    // 4: outbox items counted by status and uncertain flag, kept by triggers, so that GET /metrics
    // reads a few rows instead of scanning an outbox that grows by an item per turn.
    R"sql(
CREATE TABLE outbox_counts (
    status    TEXT NOT NULL,
    uncertain INTEGER NOT NULL,
    n         INTEGER NOT NULL,
    PRIMARY KEY (status, uncertain)
) WITHOUT ROWID;
INSERT INTO outbox_counts (status, uncertain, n)
    SELECT status, uncertain != 0, count(*) FROM outbox GROUP BY status, uncertain != 0;
CREATE TRIGGER outbox_counts_insert AFTER INSERT ON outbox BEGIN
    INSERT INTO outbox_counts (status, uncertain, n) VALUES (NEW.status, NEW.uncertain != 0, 1)
        ON CONFLICT (status, uncertain) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER outbox_counts_update AFTER UPDATE OF status, uncertain ON outbox
    WHEN OLD.status IS NOT NEW.status OR (OLD.uncertain != 0) IS NOT (NEW.uncertain != 0) BEGIN
    UPDATE outbox_counts SET n = n - 1 WHERE status = OLD.status AND uncertain = (OLD.uncertain != 0);
    INSERT INTO outbox_counts (status, uncertain, n) VALUES (NEW.status, NEW.uncertain != 0, 1)
        ON CONFLICT (status, uncertain) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER outbox_counts_delete AFTER DELETE ON outbox BEGIN
    UPDATE outbox_counts SET n = n - 1 WHERE status = OLD.status AND uncertain = (OLD.uncertain != 0);
END;
)sql",
    // 5: a turn whose reply is the model's refusal.
    R"sql(
ALTER TABLE turns ADD COLUMN refusal INTEGER NOT NULL DEFAULT 0;
)sql",
    // 6: tenants. A session is named by (tenant, session_id): sessions, turns and tape are rebuilt
    // on that key (SQLite cannot change a primary key in place), idempotency keys are unique per
    // tenant, outbox items carry their tenant. What was stored before (tenant '') is the tenant
    // 'default'. Children are dropped before their parent; renaming sessions_v6 rewrites the
    // foreign keys that name it.
    R"sql(
CREATE TABLE sessions_v6 (
    tenant       TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    agent        TEXT NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    last_turn_id TEXT,
    state        TEXT NOT NULL DEFAULT '{}',
    tape_next    INTEGER NOT NULL DEFAULT 1,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (tenant, session_id)
);
INSERT INTO sessions_v6 (tenant, session_id, agent, turns, last_turn_id, state, tape_next, created_at)
    SELECT CASE WHEN tenant = '' THEN 'default' ELSE tenant END, session_id, agent, turns,
           last_turn_id, state, tape_next, created_at FROM sessions;
CREATE TABLE turns_v6 (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id           TEXT NOT NULL UNIQUE,
    tenant            TEXT NOT NULL,
    session_id        TEXT NOT NULL,
    agent             TEXT NOT NULL,
    status            TEXT NOT NULL,
    input_text        TEXT NOT NULL,
    input_channel     TEXT NOT NULL,
    metadata          TEXT NOT NULL,
    deliver           TEXT,
    idem_key          TEXT,
    idem_fingerprint  TEXT,
    reply             TEXT,
    steps             INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    error_code        TEXT,
    error_message     TEXT,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER,
    refusal           INTEGER NOT NULL DEFAULT 0,
    FOREIGN KEY (tenant, session_id) REFERENCES sessions_v6 (tenant, session_id)
);
INSERT INTO turns_v6 (seq, turn_id, tenant, session_id, agent, status, input_text, input_channel,
                      metadata, deliver, idem_key, idem_fingerprint, reply, steps, prompt_tokens,
                      completion_tokens, error_code, error_message, created_at, started_at,
                      finished_at, refusal)
    SELECT seq, turn_id, CASE WHEN tenant = '' THEN 'default' ELSE tenant END, session_id, agent,
           status, input_text, input_channel, metadata, deliver, idem_key, idem_fingerprint, reply,
           steps, prompt_tokens, completion_tokens, error_code, error_message, created_at,
           started_at, finished_at, refusal FROM turns;
CREATE TABLE tape_v6 (
    tenant     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    id         INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    turn_id    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, session_id, id),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions_v6 (tenant, session_id)
) WITHOUT ROWID;
INSERT INTO tape_v6 (tenant, session_id, id, kind, payload, turn_id, created_at)
    SELECT coalesce((SELECT CASE WHEN s.tenant = '' THEN 'default' ELSE s.tenant END
                     FROM sessions s WHERE s.session_id = tape.session_id), 'default'),
           session_id, id, kind, payload, turn_id, created_at FROM tape;
DROP TABLE tape;
DROP TABLE turns;
DROP TABLE sessions;
ALTER TABLE sessions_v6 RENAME TO sessions;
ALTER TABLE turns_v6 RENAME TO turns;
ALTER TABLE tape_v6 RENAME TO tape;
CREATE UNIQUE INDEX turns_idem_key ON turns(tenant, idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX turns_unfinished ON turns(seq) WHERE status IN ('queued', 'running');
ALTER TABLE outbox ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
UPDATE outbox SET tenant = coalesce((SELECT t.tenant FROM turns t WHERE t.turn_id = outbox.turn_id),
                                    'default');
DROP INDEX outbox_open;
CREATE INDEX outbox_open ON outbox(channel, tenant, session_id, seq)
    WHERE status IN ('pending', 'sending');
)sql",
    // 7: usage per tenant and day (GET /v1/usage, tokens_per_day after a restart) is counted from
    // the finished turns.
    R"sql(
CREATE INDEX turns_usage ON turns(tenant, finished_at) WHERE finished_at IS NOT NULL;
)sql",
    // 8: the lean turn's crash semantics. `attempt` counts the starts of a turn (a turn found
    // running without side effects runs again); `side_effects` is set before its first tool call.
    R"sql(
ALTER TABLE turns ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN side_effects INTEGER NOT NULL DEFAULT 0;
UPDATE turns SET attempt = 1 WHERE started_at IS NOT NULL;
)sql",
};

void exec(sqlite3* db, const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
        std::string msg = err ? err : sqlite3_errmsg(db);
        sqlite3_free(err);
        throw std::runtime_error("sqlite: migration: " + msg);
    }
}

// The one integer a query answers (0 when it answers no row); `what` names it in an error.
int query_int(sqlite3* db, const char* sql, const char* what) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK)
        throw std::runtime_error(std::string("sqlite: ") + what + ": " + sqlite3_errmsg(db));
    int v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    sqlite3_finalize(st);
    return v;
}

int user_version(sqlite3* db) {
    return query_int(db, "PRAGMA user_version", "user_version");
}

} // namespace

int sqlite_schema_version() {
    return static_cast<int>(migrations.size());
}

// Found by a new-user check: another program's database was taken and baton's tables written
// into it (and its journal mode switched to WAL).
void refuse_foreign_database(sqlite3* db) {
    // Tables of anyone's in a file whose schema version is 0: another program's database.
    if (user_version(db) == 0 &&
        query_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table'", "sqlite_master") > 0)
        throw std::runtime_error("sqlite: the file holds tables but is not a baton database "
                                 "(schema version 0): refusing to write into it");
}

int migrate_sqlite(sqlite3* db, int upto) {
    const int target = upto < 0 || upto > sqlite_schema_version() ? sqlite_schema_version() : upto;
    // IMMEDIATE takes the write lock first, so two processes opening one file cannot both migrate.
    exec(db, "BEGIN IMMEDIATE");
    try {
        int from = user_version(db);
        if (from > sqlite_schema_version())
            throw std::runtime_error("sqlite: database schema version " + std::to_string(from) +
                                     " is newer than this build (" +
                                     std::to_string(sqlite_schema_version()) + ")");
        for (int v = from; v < target; ++v)
            exec(db, std::string(migrations[v]));
        // user_version lives in the file header, which the transaction covers: it commits with the
        // tables.
        if (from < target) exec(db, "PRAGMA user_version = " + std::to_string(target));
        exec(db, "COMMIT");
        return from < target ? target - from : 0;
    } catch (...) {
        if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
    }
}

} // namespace baton::detail
