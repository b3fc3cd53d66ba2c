// The turn: process_inbound() awaits the seven stages in order, each a hook that plugins extend or
// replace. Ordering (docs/design.md): the last registered runs first; resolve_session, build_prompt and
// run_model take the first result; load_state merges (higher priority wins a key); save_state runs
// every implementation; render_outbound concatenates; dispatch_outbound runs per item until one
// handles it. on_error observes every unhandled failure, which is then re-raised.
#pragma once

#include <baton/config.hpp>
#include <baton/errors.hpp>
#include <baton/events.hpp>
#include <baton/metrics.hpp>
#include <baton/model.hpp>
#include <baton/store_runner.hpp>
#include <baton/tools.hpp>
#include <baton/turn_state.hpp>
#include <baton/types.hpp>

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton {

namespace asio = boost::asio;

// A message folded into another turn (admission modes `collect` and `steer`): its own turn ends
// with the turn that answered it. Its channel and `deliver` are where its sender waits for the
// reply: the default render_outbound sends the turn's reply there too when it is another route.
struct steered_message {
    std::string turn_id;
    std::string text;
    std::string channel = "http";
    json::value deliver;
};

// What a turn has produced so far, shared with whoever runs it: when a turn is cancelled or
// times out, its partial reply, steps and usage are still known.
struct turn_progress {
    std::string reply;
    std::int64_t steps = 0;
    baton::usage usage;
    std::string stop_reason; // set by whoever cancels the turn: "stopped", "timed_out"
    // The turn's live events (events.hpp); null when nobody runs an event hub (embedded use).
    std::shared_ptr<turn_log> events;
    // Admission mode `steer`: messages that arrived while this turn ran, taken at a step boundary
    // (each becomes a user message of this turn; it is stored as running before it is given).
    // Empty when nothing can steer the turn.
    std::function<boost::asio::awaitable<std::vector<steered_message>>()> take_steering;

    // The turn's end, one transaction (store::end_turn). A runtime sets `deferred`: the default
    // save_state and the pushing channels then add their writes here instead of writing at once,
    // and the runtime writes them with the final record. Unset (a framework driven without a
    // runtime), they write at once.
    bool deferred = false;
    turn_end end;
    // Called once the end is stored (true; end.state carries the entries' ids, `added` the outbox
    // items whose key was new) or given up (false): what waits on the writes, such as handing the
    // session's window back or waking a channel's sender.
    using end_callback =
        std::function<void(bool stored, const turn_end& end, const std::vector<outbox_item>& added)>;
    std::vector<end_callback> after_end;
    // Set once the store knows that the turn began side effects (store::mark_side_effects).
    bool side_effects = false;
    // The turns this one answers too (collect, steer): they share its side effects.
    std::vector<std::string> folded;
};

// One inbound message, from whichever channel.
struct inbound {
    std::string turn_id; // assigned on accept; made by the framework when empty
    std::string channel = "http";
    std::string session_id; // empty: resolve_session derives `<channel>:<chat_id>`
    std::string chat_id;
    std::string agent = "default";
    std::string tenant{default_tenant}; // whose session: sessions of two tenants never meet
    std::string text;
    json::object metadata;
    json::value deliver;
    // Admission mode `collect`: messages queued behind this one, answered by this turn (each a
    // user message after `text`).
    std::vector<steered_message> collected;
    std::shared_ptr<turn_progress> progress; // made by the framework when empty
};

// What build_prompt produces. A direct command sets `direct_reply` and the model is not run; the
// hook that answers it records the exchange in ctx.new_entries (save_state persists it).
struct prompt {
    std::vector<chat_message> messages;
    std::optional<std::string> direct_reply;
    // Set by the default build_prompt: how many leading messages are the session's window lent
    // by the context cache (turn_context::history), and the prompt's raw token estimate. The
    // default run_model hands the window back when the turn ends.
    std::size_t lent = 0;
    std::int64_t estimated_tokens = 0;
};

struct model_output {
    std::string reply;
    std::int64_t steps = 0;
    baton::usage usage;
    turn_status status = turn_status::completed; // or step_limit
    bool refusal = false;                        // the reply is the model's refusal
};

struct outbound {
    std::string channel;
    std::string to;
    std::string text;
    std::int64_t index = 0;
};

struct agent {
    agent_config config;
    std::shared_ptr<model_client> model;
};

class framework;
namespace pipeline {
class context_window;
} // namespace pipeline

namespace detail {
// What the framework and the default pipeline keep about a turn for themselves; hooks of one's
// own neither read nor write it.
struct turn_bookkeeping {
    std::shared_ptr<pipeline::context_window> window; // the session's cached window (pipeline/)
    std::chrono::steady_clock::time_point stage_mark; // when the last stage ended (metrics)
};
} // namespace detail

// Everything one turn carries between its stages.
struct turn_context {
    baton::inbound inbound;
    std::string session_id;
    const baton::agent* agent = nullptr;
    turn_state state;
    json::object session_state; // restored by load_state, persisted by save_state
    // The context restored by load_state, as the default prompt starts: the agent's pinned
    // blocks, the last anchor's summary, then the messages and tool round-trips since, oldest
    // first, already within the token budget. It is lent by the session's context cache: read it,
    // copy it or move it into a prompt, but do not edit it in place (save_state gives it back).
    std::vector<chat_message> history;
    std::vector<tape_entry> new_entries; // appended by this turn, persisted by save_state
    // Admission mode `steer`: the messages that joined this turn at a step boundary (as
    // inbound.collected holds those of `collect`).
    std::vector<steered_message> steered;
    model_output output;
    std::vector<outbound> outbox;
    bool direct_command = false;
    bool entered_run_model = false;
    baton::framework* framework = nullptr;
    detail::turn_bookkeeping internal; // not for hooks
    // For a load_state hook that supplies a history of its own: the default build_prompt then
    // prepends the agent's instructions and skips its budget check and compaction (the session's
    // cached window is let go).
    void replace_history(std::vector<chat_message> h) {
        history = std::move(h);
        internal.window.reset();
    }
    // The session the turn runs in (its tenant and id), once resolve_session has run.
    session_ref session() const { return {inbound.tenant, session_id}; }
    turn_progress& progress() { return *inbound.progress; }
    // Publishes a turn event (docs/api.md) when someone keeps the turn's events.
    void emit(std::string_view type, const json::object& data) {
        if (inbound.progress && inbound.progress->events) inbound.progress->events->publish(type, data);
    }
    // The same with the data already written (a JSON object's text): the frequent events.
    void emit_text(std::string_view type, std::string data) {
        if (inbound.progress && inbound.progress->events)
            inbound.progress->events->publish_text(type, std::move(data));
    }
    bool emitting() const { return inbound.progress && inbound.progress->events != nullptr; }
};

// before_tool_call's answer: run the tool, answer for it, or refuse it.
struct tool_decision {
    enum class kind { proceed, replace, deny } action = kind::proceed;
    tool_result result; // replace: the observation; deny: result.output is the reason
};

struct turn_result {
    std::string turn_id;
    std::string session_id;
    std::string reply;
    std::int64_t steps = 0;
    baton::usage usage;
    turn_status status = turn_status::completed;
    bool direct_command = false;
    bool refusal = false; // the reply is the model's refusal
};

// A plugin: any subset of hooks; an empty std::function leaves that hook to the other plugins.
struct plugin {
    template <class T> using hook = std::function<T>;
    std::string name;
    hook<asio::awaitable<std::optional<std::string>>(turn_context&)> resolve_session;
    hook<asio::awaitable<std::optional<json::object>>(turn_context&)> load_state;
    hook<asio::awaitable<std::optional<prompt>>(turn_context&)> build_prompt;
    // The hook that answers may take the prompt's messages (the default one moves them).
    hook<asio::awaitable<std::optional<model_output>>(turn_context&, prompt&)> run_model;
    hook<asio::awaitable<void>(turn_context&)> save_state;
    hook<asio::awaitable<std::vector<outbound>>(turn_context&)> render_outbound;
    hook<asio::awaitable<bool>(turn_context&, const outbound&)> dispatch_outbound;
    hook<void(std::string_view stage, std::exception_ptr error, const inbound&)> on_error;
    // Agent-loop hooks; every implementation runs, last registered first.
    hook<asio::awaitable<void>(turn_context&, model_request&)> before_model_call;
    hook<asio::awaitable<void>(turn_context&, const chat_completion&)> after_model_call;
    // The first decision other than `proceed` wins.
    hook<asio::awaitable<tool_decision>(turn_context&, const tool_call&)> before_tool_call;
    hook<asio::awaitable<void>(turn_context&, const tool_call&, tool_result&)> after_tool_call;
    // Idle compaction of one session (the runtime calls it in the session's queue, never beside
    // a turn, after on_compaction_due asked for it); every implementation runs
    // until one throws (the rest are skipped; the runtime logs the failure).
    hook<asio::awaitable<void>(framework&, const baton::agent&, const session_ref& session)>
        compact_idle;
    // True for make_default_plugin's hooks (<baton/pipeline.hpp>), which hand the session's
    // context to the model as stored; any other load_state, build_prompt, run_model or
    // before_model_call hook makes the agent loop write every request afresh.
    bool keeps_context = false;
};

class framework {
public:
    // A framework without hooks: register the default pipeline first (<baton/pipeline.hpp>,
    // make_default_plugin), then the plugins that override it. The second form does the first
    // step: framework fw{db, make_default_plugin(db)}.
    explicit framework(store_runner& db);
    framework(store_runner& db, plugin defaults);
    ~framework();

    void register_plugin(plugin p);
    void add_agent(agent a);
    const baton::agent* find_agent(std::string_view name) const;
    store_runner& db() { return db_; }
    tool_registry& tools() { return tools_; }
    // This framework's metrics (GET /metrics): its stages, the runtime's turns, the channels.
    metrics_registry& metrics() { return *metrics_; }

    // The agent loop's hook points (pipeline/run_model.cpp calls them).
    asio::awaitable<void> before_model_call(turn_context& ctx, model_request& req);
    asio::awaitable<void> after_model_call(turn_context& ctx, const chat_completion& c);
    asio::awaitable<tool_decision> before_tool_call(turn_context& ctx, const tool_call& call);
    asio::awaitable<void> after_tool_call(turn_context& ctx, const tool_call& call, tool_result& r);
    // False when no plugin has a before_model_call hook (the agent loop then skips a copy).
    bool has_before_model_call() const { return has_before_model_call_; }
    // False once a plugin has a hook that could change a turn's messages on their way from the
    // session's context to the model (load_state, build_prompt, run_model, before_model_call):
    // the agent loop then has every request written afresh instead of reusing the context's JSON.
    bool context_reaches_model_unchanged() const { return !context_hooked_; }

    // Runs one turn. Throws what a stage threw (after on_error saw it); cancellation follows the
    // awaiting coroutine's slot and still lets save_state run once run_model was entered.
    asio::awaitable<turn_result> process_inbound(inbound in);

    // Idle compaction (the runtime's timer calls it in the session's queue, never beside a turn):
    // compacts the session's cached window when its estimate crossed the first threshold.
    asio::awaitable<void> compact_session(session_ref session, std::string agent);
    // Told after a turn whose session would be compacted when idle: (session, agent, after).
    std::function<void(const session_ref&, const std::string&, std::chrono::milliseconds)>
        on_compaction_due;

private:
    asio::awaitable<void> stage(turn_stage s, turn_context& ctx, prompt& p);
    void close_stage(turn_context& ctx, turn_stage stage, std::chrono::steady_clock::time_point started,
                     std::exception_ptr error) const;
    void report(std::string_view stage, std::exception_ptr e, const inbound& in) const;
    asio::awaitable<void> resolve_session(turn_context& ctx);
    asio::awaitable<void> load_state(turn_context& ctx);
    asio::awaitable<void> build_prompt(turn_context& ctx, prompt& out);
    asio::awaitable<void> run_model(turn_context& ctx, prompt& p);
    asio::awaitable<void> save_state(turn_context& ctx);
    asio::awaitable<void> render_outbound(turn_context& ctx);
    asio::awaitable<void> dispatch_outbound(turn_context& ctx);

    store_runner& db_;
    std::shared_ptr<metrics_registry> metrics_ = std::make_shared<metrics_registry>();
    bool has_before_model_call_ = false;
    bool context_hooked_ = false;
    std::vector<plugin> plugins_; // registration order; hooks run from the back
    std::map<std::string, baton::agent, std::less<>> agents_;
    tool_registry tools_;
};

} // namespace baton
