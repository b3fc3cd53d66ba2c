// Direct commands (`/help`, `/model`, `/handoff [name]`, `/reset`, `/stop`): one parser for the
// runtime, which stops a running turn at once on `/stop`, and for build_prompt, which answers them.
#pragma once

#include <optional>
#include <string_view>

namespace baton {

struct direct_command {
    std::string_view word; // "/stop", with its slash
    std::string_view arg;  // what follows, without the white space around it; may be empty
};

// A text is a command when, without the white space (space, tab, CR, LF) around it, it starts with
// '/'; the word ends at the first white space. Whether the word is a known command is the caller's
// question. The views point into `text`.
std::optional<direct_command> parse_command(std::string_view text);

// `/stop`, with or without an argument ("/stop now").
bool is_stop_command(std::string_view text);

} // namespace baton
