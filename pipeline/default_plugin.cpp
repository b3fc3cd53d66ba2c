#include <baton/pipeline.hpp>

#include "pipeline/context_cache.hpp"
#include "pipeline/stages.hpp"

#include <memory>

namespace baton {

plugin make_default_plugin(store_runner& db) {
    auto cache = std::make_shared<pipeline::context_cache>();
    plugin p;
    p.name = "builtin";
    p.keeps_context = true;
    p.resolve_session = pipeline::resolve_session;
    p.load_state = [&db, cache](turn_context& ctx) { return pipeline::load_state(db, *cache, ctx); };
    p.build_prompt = pipeline::build_prompt;
    p.run_model = pipeline::run_model;
    p.save_state = [&db, cache](turn_context& ctx) { return pipeline::save_state(db, *cache, ctx); };
    p.render_outbound = pipeline::render_outbound;
    p.dispatch_outbound = pipeline::dispatch_outbound;
    p.compact_idle = [&db, cache](framework& fw, const agent& a, const session_ref& session) {
        return pipeline::compact_idle(db, *cache, a, session, fw.metrics());
    };
    return p;
}

} // namespace baton
