// Append-only: a released migration is never edited, a change is a new one. Times are
// milliseconds since the epoch (bigint), JSON is kept as the text baton wrote (text, not jsonb:
// reads give back the very bytes), flags are integers as in the SQLite store.
#include "src/store/postgres_schema.hpp"

namespace baton::detail {
namespace {

const std::vector<std::vector<std::string_view>> migrations{
    {
        R"sql(CREATE TABLE sessions (
    tenant       text NOT NULL,
    session_id   text NOT NULL,
    agent        text NOT NULL,
    turns        bigint NOT NULL DEFAULT 0,
    last_turn_id text,
    state        text NOT NULL DEFAULT '{}',
    tape_next    bigint NOT NULL DEFAULT 1,
    created_at   bigint NOT NULL,
    PRIMARY KEY (tenant, session_id)
))sql",
        // seq: the accept order (a sequence never goes back).
        R"sql(CREATE TABLE turns (
    seq               bigserial PRIMARY KEY,
    turn_id           text NOT NULL UNIQUE,
    tenant            text NOT NULL,
    session_id        text NOT NULL,
    agent             text NOT NULL,
    status            text NOT NULL,
    input_text        text NOT NULL,
    input_channel     text NOT NULL,
    metadata          text NOT NULL,
    deliver           text,
    idem_key          text,
    idem_fingerprint  text,
    reply             text,
    steps             bigint NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    error_code        text,
    error_message     text,
    created_at        bigint NOT NULL,
    started_at        bigint,
    finished_at       bigint,
    refusal           integer NOT NULL DEFAULT 0,
    attempt           bigint NOT NULL DEFAULT 0,
    side_effects      integer NOT NULL DEFAULT 0,
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, session_id)
))sql",
        "CREATE UNIQUE INDEX turns_idem_key ON turns (tenant, idem_key) WHERE idem_key IS NOT NULL",
        "CREATE INDEX turns_unfinished ON turns (seq) WHERE status IN ('queued', 'running')",
        "CREATE INDEX turns_usage ON turns (tenant, finished_at) WHERE finished_at IS NOT NULL",
        R"sql(CREATE TABLE tape (
    tenant     text NOT NULL,
    session_id text NOT NULL,
    id         bigint NOT NULL,
    kind       text NOT NULL,
    payload    text NOT NULL,
    turn_id    text NOT NULL,
    created_at bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, id),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, session_id)
))sql",
        R"sql(CREATE TABLE outbox (
    seq             bigserial PRIMARY KEY,
    key             text NOT NULL UNIQUE,
    turn_id         text NOT NULL,
    tenant          text NOT NULL,
    session_id      text NOT NULL,
    channel         text NOT NULL,
    recipient       text NOT NULL,
    idx             bigint NOT NULL,
    text            text NOT NULL,
    status          text NOT NULL,
    attempts        bigint NOT NULL DEFAULT 0,
    uncertain       integer NOT NULL DEFAULT 0,
    next_attempt_at bigint NOT NULL DEFAULT 0,
    last_error      text,
    created_at      bigint NOT NULL,
    updated_at      bigint NOT NULL
))sql",
        "CREATE INDEX outbox_open ON outbox (channel, tenant, session_id, seq) "
        "WHERE status IN ('pending', 'sending')",
        R"sql(CREATE TABLE cursors (
    name       text PRIMARY KEY,
    value      text NOT NULL,
    updated_at bigint NOT NULL
))sql",
    },
    // Several nodes (docs/design.md "Several nodes"): the nodes and their leases (renewed on the
    // database's clock, so that the nodes' clocks need not agree), each session's owner, the node
    // that accepted a turn and the one running it, and the node delivering an outbox item.
    {
        R"sql(CREATE TABLE baton_nodes (
    node         text PRIMARY KEY,
    started_at   bigint NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    lease_ms     bigint NOT NULL
))sql",
        "ALTER TABLE sessions ADD COLUMN owner text",
        "ALTER TABLE turns ADD COLUMN node text",
        "ALTER TABLE turns ADD COLUMN accepted_by text",
        "ALTER TABLE outbox ADD COLUMN node text",
        "CREATE INDEX outbox_open_node ON outbox (node, seq) WHERE status IN ('pending', 'sending')",
    },
};

} // namespace

std::span<const std::vector<std::string_view>> postgres_migrations() {
    return migrations;
}

} // namespace baton::detail
