#include "pipeline/context_cache.hpp"
#include "pipeline/stages.hpp"

namespace baton {

plugin make_default_plugin(store_runner& db, pipeline::context_cache& cache) {
    plugin p;
    p.name = "builtin";
    p.resolve_session = pipeline::resolve_session;
    p.load_state = [&db, &cache](turn_context& ctx) { return pipeline::load_state(db, cache, ctx); };
    p.build_prompt = pipeline::build_prompt;
    p.run_model = pipeline::run_model;
    p.save_state = [&db, &cache](turn_context& ctx) { return pipeline::save_state(db, cache, ctx); };
    p.render_outbound = pipeline::render_outbound;
    p.dispatch_outbound = pipeline::dispatch_outbound;
    return p;
}

} // namespace baton
