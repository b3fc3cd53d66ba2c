// The default turn (pipeline/): a hook for each of the seven stages, the agent loop with its tool
// calls, the session's context window with its token budget and pinned blocks, and compaction
// (on the budget and when idle). Register it first, so that every plugin registered after it
// overrides it (docs/hooks.md):
//
//     baton::framework fw(db);
//     fw.register_plugin(baton::make_default_plugin(db));
#pragma once

#include <baton/framework.hpp>

namespace baton {

// The plugin owns the sessions' context cache it shares between its hooks.
plugin make_default_plugin(store_runner& db);

} // namespace baton
