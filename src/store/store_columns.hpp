// The column lists the SQL stores (SQLite, PostgreSQL) read records with, in the order their
// readers take the values: both schemas name the columns alike.
#pragma once

#include <string>

namespace baton::detail {

inline const std::string turn_columns =
    "turn_id, session_id, agent, tenant, status, input_text, input_channel, metadata, deliver, reply, "
    "steps, prompt_tokens, completion_tokens, error_code, error_message, created_at, started_at, "
    "finished_at, refusal, attempt, side_effects";

inline const std::string tape_columns = "id, kind, payload, created_at, turn_id";

inline const std::string outbox_columns =
    "key, turn_id, tenant, session_id, channel, recipient, idx, text, status, attempts, uncertain, "
    "created_at, updated_at, next_attempt_at, coalesce(last_error, '')";

} // namespace baton::detail
