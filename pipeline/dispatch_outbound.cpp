#include "pipeline/stages.hpp"

namespace baton::pipeline {

// The HTTP channel is pull-based: its reply is the turn record, which the runtime stores when the
// turn ends, so the default has nothing to push. Pushing channels register their own dispatch hook.
asio::awaitable<bool> dispatch_outbound(turn_context&, const outbound&) {
    co_return true;
}

} // namespace baton::pipeline
