// The web chat page served at GET / (docs/api.md): channels/web/chat.html, embedded in the binary at
// build time (cmake/embed_text.cmake), so the daemon needs no files next to it.
#pragma once

#include <string_view>

namespace baton::web {

// The whole HTML document (UTF-8); valid for the life of the program.
std::string_view chat_page();

} // namespace baton::web
