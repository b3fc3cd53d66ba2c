#include "channels/http/api.hpp"
#include "channels/http/router.hpp"
#include "channels/web/page.hpp"

#include <baton/json_text.hpp>
#include <baton/log.hpp>

#include <boost/beast/core/string.hpp>

#include <cctype>
#include <limits>

namespace baton::http {

namespace {
reply json_reply(unsigned status, const json::value& v) {
    reply r;
    r.status = status;
    r.body = json_text(v);
    return r;
}

bool is_json_media_type(std::string_view ct) {
    auto semi = ct.find(';');
    std::string_view type = ct.substr(0, semi);
    while (!type.empty() && type.back() == ' ')
        type.remove_suffix(1);
    std::string lower(type);
    for (auto& c : lower)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return lower == "application/json" ||
           (lower.starts_with("application/") && lower.ends_with("+json"));
}

bool valid_idempotency_key(std::string_view k) {
    if (k.empty() || k.size() > 255) return false;
    for (char c : k)
        if (c < 0x21 || c > 0x7e) return false;
    return true;
}

json::object turn_links(const std::string& tid) {
    return {{"turn", "/v1/turns/" + tid}, {"events", "/v1/turns/" + tid + "/events"}};
}
} // namespace

std::optional<caller> api::identify(const request_view& req, bool& presented) const {
    // The header wins; an upgrade from a browser has only the subprotocol.
    presented = false;
    std::optional<std::string_view> token;
    if (req.has_authorization) {
        presented = true;
        token = parse_bearer(req.authorization);
    } else if (!req.ws_protocols.empty()) {
        auto offer = parse_ws_protocols(req.ws_protocols);
        if (offer.token) {
            presented = true;
            token = offer.token;
        }
    }
    return token ? access_.tokens.authenticate(*token) : std::nullopt;
}

bool api::token_valid(const request_view& req) const {
    bool presented = false;
    return access_.tokens.enabled() && identify(req, presented).has_value();
}

namespace {
// A Host header naming the loopback: localhost, 127.x.y.z or [::1], with or without a port.
bool loopback_host(std::string_view host) {
    // What nearly every request says, without a parse.
    for (std::string_view usual : {"127.0.0.1", "localhost"})
        if (host.starts_with(usual) && (host.size() == usual.size() || host[usual.size()] == ':'))
            return host.size() == usual.size() ||
                   host.find_first_not_of("0123456789", usual.size() + 1) == std::string_view::npos;
    bool has_port = host.starts_with('[') ? host.find("]:") != std::string_view::npos
                                          : host.find(':') != std::string_view::npos;
    std::string with_port(host);
    for (auto& c : with_port)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!has_port) with_port += ":80";
    return loopback_listen_address(with_port);
}

// Without tokens the daemon trusts its clients, which a web page the user visits is not: a
// request from another origin (Origin is not this Host), or one addressed by a name that is not
// the loopback's to a daemon on loopback (DNS rebinding), is refused.
std::optional<reply> cross_site(const request_view& req, const access_options& access) {
    if (access.loopback && !req.host.empty() && !loopback_host(req.host))
        return error_reply(errc::forbidden,
                           "Host: " + std::string(req.host) +
                               " is not a loopback name: without server.tokens a daemon on loopback "
                               "answers only requests addressed to localhost, 127.0.0.1 or [::1] "
                               "(set server.tokens to serve other names, or have a proxy send its "
                               "upstream's address as Host)");
    if (!req.has_origin) return std::nullopt;
    auto origin = req.origin;
    auto scheme_end = origin.find("://");
    auto authority =
        scheme_end == std::string_view::npos ? std::string_view{} : origin.substr(scheme_end + 3);
    if (!authority.empty() && boost::beast::iequals(authority, req.host)) return std::nullopt;
    return error_reply(errc::forbidden,
                       "Origin: " + std::string(origin) +
                           ": without server.tokens the daemon answers web pages of its own origin "
                           "only (set server.tokens to serve others)");
}
} // namespace

std::variant<caller, reply> api::authorize(const request_view& req, scope need) const {
    if (need == scope::open) return caller{};
    if (!access_.tokens.enabled()) {
        if (auto refused = cross_site(req, access_)) return std::move(*refused);
        caller everyone;
        everyone.admin = true;
        return everyone;
    }
    if (need == scope::metrics && access_.metrics_public) return caller{};
    bool presented = false;
    std::optional<caller> who = identify(req, presented);
    if (!who) {
        // Never the token itself, in the answer or anywhere else.
        auto r = error_reply(errc::unauthorized,
                             presented ? "the bearer token is not valid"
                                       : "this resource needs Authorization: Bearer <token>");
        r.headers.emplace_back("WWW-Authenticate", presented
                                                       ? R"(Bearer realm="baton", error="invalid_token")"
                                                       : R"(Bearer realm="baton")");
        return r;
    }
    bool allowed = need == scope::any || (need == scope::tenant ? who->tenant_scope : who->admin);
    if (!allowed) {
        std::string_view missing = need == scope::tenant ? "tenant" : "admin";
        auto r = error_reply(errc::forbidden, "this token lacks the " + std::string(missing) + " scope");
        r.headers.emplace_back("WWW-Authenticate",
                               R"(Bearer realm="baton", error="insufficient_scope", scope=")" +
                                   std::string(missing) + "\"");
        return r;
    }
    return std::move(*who);
}

reply error_reply(errc code, std::string_view message) {
    return error_reply(api_error{code, std::string(message)});
}

reply error_reply(const api_error& e) {
    reply r = json_reply(http_status(e.code),
                         json::object{{"error", {{"code", code_name(e.code)}, {"message", e.message}}}});
    if (auto s = retry_after(e); s > 0) r.headers.emplace_back("Retry-After", std::to_string(s));
    return r;
}

namespace {
api::scope scope_of(route_id id) {
    switch (id) {
    case route_id::healthz:
    case route_id::readyz:
    case route_id::web_page:
    case route_id::none:
        return api::scope::open;
    case route_id::list_outbox:
        return api::scope::admin;
    case route_id::metrics:
        return api::scope::metrics;
    default:
        return api::scope::tenant;
    }
}
} // namespace

asio::awaitable<reply> api::handle(const request_view& req) {
    auto m = match_route(req.method, req.target);
    // Every /v1 request needs a token, even to learn that a resource does not exist.
    auto need = m.error ? (req.target.starts_with("/v1") ? scope::any : scope::open) : scope_of(m.id);
    auto authorized = authorize(req, need);
    if (auto* refused = std::get_if<reply>(&authorized)) co_return std::move(*refused);
    const auto& who = std::get<caller>(authorized);
    if (m.error) {
        switch (*m.error) {
        case errc::method_not_allowed: {
            auto r = error_reply(errc::method_not_allowed,
                                 std::string(req.method) + " is not allowed here; allowed: " + m.allow);
            r.headers.emplace_back("Allow", m.allow);
            co_return r;
        }
        case errc::not_found:
            co_return error_reply(errc::not_found, "no such resource: " + std::string(req.target));
        default:
            co_return error_reply(*m.error, "malformed request target");
        }
    }
    switch (m.id) {
    case route_id::post_message:
        co_return co_await post_message(req, m.session_id, m.query, who);
    case route_id::get_turn:
        co_return co_await get_turn(m.turn_id, m.query, who);
    case route_id::cancel_turn:
        co_return co_await cancel_turn(m.turn_id, who);
    case route_id::get_session:
        co_return co_await get_session(m.session_id, who);
    case route_id::get_tape:
        co_return co_await get_tape(m.session_id, m.query, who);
    case route_id::list_outbox:
        co_return co_await list_outbox(m.query);
    case route_id::usage:
        co_return co_await usage(who);
    case route_id::turn_events:
    case route_id::websocket:
        // Streams: the server handles them before calling here.
        co_return error_reply(errc::invalid_request, "this resource needs a streaming connection");
    case route_id::healthz:
        co_return json_reply(200, json::object{{"status", "ok"}});
    case route_id::readyz:
        if (!ready_()) co_return error_reply(errc::draining, "not ready: starting or draining");
        if (auto why = rt_.store_unavailable())
            co_return error_reply(errc::store_unavailable, "not ready: " + *why);
        co_return json_reply(200, json::object{{"status", "ok"}});
    case route_id::metrics:
        co_return co_await metrics_page();
    case route_id::web_page: {
        reply r;
        r.body = std::string(web::chat_page());
        r.content_type = "text/html; charset=utf-8";
        co_return r;
    }
    case route_id::none:
        break;
    }
    co_return error_reply(errc::not_found, "no such resource");
}

namespace {
// baton_tenant_*: one series per tenant with limits or turns since start (tenant names are
// [A-Za-z0-9._-]: no label escaping needed).
// A metric family's # HELP and # TYPE lines.
void family_header(std::string& out, const char* name, const char* type, const char* help) {
    out += "# HELP ";
    out += name;
    out += ' ';
    out += help;
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type;
    out += '\n';
}

void append_tenant_metrics(std::string& out, const std::vector<tenant_stats>& all) {
    struct family {
        const char* name;
        const char* type;
        const char* help;
        std::int64_t tenant_stats::*field;
    };
    static constexpr family families[] = {
        {"baton_tenant_turns_running", "gauge", "Turns running, for tenants with max_running_turns.",
         &tenant_stats::running},
        {"baton_tenant_sessions_waiting", "gauge",
         "Sessions waiting for the tenant's max_running_turns.", &tenant_stats::waiting},
        {"baton_tenant_turns_today", "gauge", "Turns finished today (UTC).", &tenant_stats::turns_today},
        {"baton_tenant_tokens_today", "gauge",
         "Model tokens (prompt + completion) of today's turns (UTC).", &tenant_stats::tokens_today},
        {"baton_tenant_rate_limited_total", "counter", "Messages refused with 429 rate_limited.",
         &tenant_stats::rate_limited},
        {"baton_tenant_quota_exceeded_total", "counter", "Messages refused with 429 quota_exceeded.",
         &tenant_stats::quota_exceeded},
    };
    for (const auto& f : families) {
        family_header(out, f.name, f.type, f.help);
        for (const auto& t : all) {
            out += f.name;
            out += "{tenant=\"" + t.tenant + "\"} " + std::to_string(t.*(f.field)) + "\n";
        }
    }
}

// Several nodes: the cluster's and the PostgreSQL pool's series (docs/api.md "Metrics").
void append_cluster_metrics(std::string& out, const cluster::stats& c) {
    struct family {
        const char* name;
        const char* type;
        const char* help;
        std::int64_t cluster::stats::*field;
    };
    static constexpr family families[] = {
        {"baton_cluster_nodes_live", "gauge", "Nodes whose lease holds, this one included.",
         &cluster::stats::live_nodes},
        {"baton_cluster_claims_total", "counter", "Claims of queued work made by this node.",
         &cluster::stats::claims},
        {"baton_cluster_claimed_turns_total", "counter", "Turns this node claimed to run.",
         &cluster::stats::claimed_turns},
        {"baton_cluster_taken_over_turns_total", "counter",
         "Turns this node took over from nodes whose lease expired.", &cluster::stats::taken_over_turns},
        {"baton_cluster_relayed_events_sent_total", "counter",
         "Turn events this node relayed to other nodes.", &cluster::stats::relayed_out},
        {"baton_cluster_relayed_events_received_total", "counter",
         "Turn events other nodes relayed to this one.", &cluster::stats::relayed_in},
        {"baton_pg_pool_connections_open", "gauge", "PostgreSQL connections open in the pool.",
         &cluster::stats::pool_open},
        {"baton_pg_pool_connections_idle", "gauge", "Of them, idle.", &cluster::stats::pool_idle},
        {"baton_pg_pool_size", "gauge", "The pool's size (storage.postgres.pool_size).",
         &cluster::stats::pool_size},
    };
    for (const auto& f : families) {
        family_header(out, f.name, f.type, f.help);
        out += f.name;
        out += ' ' + std::to_string(c.*(f.field)) + '\n';
    }
}
} // namespace

// GET /metrics: the counters as they are, the gauges sampled now. The outbox is counted on the
// store's thread at most once a second, one count at a time; other scrapes reuse the last one.
asio::awaitable<reply> api::metrics_page() {
    metrics_gauges g;
    g.queue_depth = rt_.queued_turns();
    g.turns_running = static_cast<std::int64_t>(rt_.running_turns());
    g.sessions_live = static_cast<std::int64_t>(rt_.live_sessions());
    g.store_batches = rt_.store_batches();
    g.store_calls = rt_.store_calls();
    auto sample = outbox_sample_;
    bool count = false;
    {
        std::lock_guard lock(sample->mutex);
        auto fresh =
            sample->counts && std::chrono::steady_clock::now() - sample->taken < std::chrono::seconds(1);
        count = !fresh && !(sample->counting && sample->counts);
        if (count)
            sample->counting = true;
        else
            g.outbox = sample->counts;
    }
    if (count) {
        std::optional<store::outbox_counts> counted;
        try {
            counted = co_await rt_.count_outbox();
        } catch (const std::exception& e) {
            log::warn("metrics: cannot count the outbox", {{"error", e.what()}});
        }
        std::lock_guard lock(sample->mutex);
        sample->counting = false;
        if (counted) {
            sample->counts = counted;
            sample->taken = std::chrono::steady_clock::now();
        }
        g.outbox = counted;
    }
    reply r;
    r.body = rt_.fw().metrics().render(g);
    append_tenant_metrics(r.body, rt_.tenants());
    if (auto c = rt_.cluster_stats()) append_cluster_metrics(r.body, *c);
    r.content_type = std::string(metrics_content_type);
    co_return r;
}

asio::awaitable<reply> api::post_message(const request_view& req, const std::string& sid,
                                         std::string_view query, const caller& who) {
    // Checked before anything is stored: a bad ?wait= stores no message.
    auto wait = query_param_wait(query);
    if (!wait.error.empty()) co_return error_reply(errc::invalid_request, wait.error);
    if (!valid_session_id(sid))
        co_return error_reply(errc::invalid_request,
                              "invalid session id: 1-128 characters of A-Z a-z 0-9 . _ : @ - expected");
    // No Content-Type is taken as JSON; an empty one says nothing that is.
    if (req.has_content_type && !is_json_media_type(req.content_type))
        co_return error_reply(errc::unsupported_media_type,
                              "Content-Type must be application/json, not " +
                                  (req.content_type.empty() ? std::string("an empty one")
                                                            : std::string(req.content_type)));
    accept_request ar;
    if (auto err = parse_message_body(req.body, ar)) co_return error_reply(err->code, err->message);
    ar.session_id = sid;
    ar.tenant = who.tenant;
    if (req.has_idempotency_key) {
        if (!valid_idempotency_key(req.idempotency_key))
            co_return error_reply(errc::invalid_request,
                                  "Idempotency-Key: 1-255 visible ASCII characters expected");
        ar.idem.key = req.idempotency_key;
        ar.idem.fingerprint = sha256_hex(sid + "\n" + std::string(req.body));
    }
    auto result = co_await rt_.accept(std::move(ar));
    if (!result) co_return error_reply(result.error());
    auto& ok = *result;
    std::string status = "queued";
    if (wait.value) {
        // The synchronous form: the finished record when the turn ends in time, else the 202.
        auto rec = co_await rt_.wait_turn(ok.turn_id, who.tenant, *wait.value);
        if (rec && is_terminal(rec->status)) {
            reply r;
            r.body = baton::turn_json(*rec);
            // A replay says so here too: the record's object with one member more.
            if (ok.replayed && !r.body.empty() && r.body.back() == '}') {
                r.body.pop_back();
                r.body += ",\"replayed\":true}";
            }
            r.headers.emplace_back("Location", "/v1/turns/" + ok.turn_id);
            co_return r;
        }
        if (rec) status = to_string(rec->status);
    }
    json::object body{{"turn_id", ok.turn_id},
                      {"session_id", ok.session_id},
                      {"status", status},
                      {"links", turn_links(ok.turn_id)}};
    if (ok.replayed) {
        if (auto rec = co_await rt_.get_turn(ok.turn_id, who.tenant)) {
            body["session_id"] = rec->session_id;
            body["status"] = to_string(rec->status);
        }
        body["replayed"] = true;
    }
    // With ?wait= a 200 means the turn has ended, a replay's too: one still going answers 202.
    auto r = json_reply(ok.replayed && !wait.value ? 200 : 202, body);
    r.headers.emplace_back("Location", "/v1/turns/" + ok.turn_id);
    co_return r;
}

asio::awaitable<reply> api::get_turn(const std::string& tid, std::string_view query, const caller& who) {
    auto wait = query_param_wait(query);
    if (!wait.error.empty()) co_return error_reply(errc::invalid_request, wait.error);
    if (!plausible_turn_id(tid)) co_return error_reply(errc::not_found, "no such turn: " + tid);
    if (wait.value && *wait.value > std::chrono::milliseconds::zero()) {
        // A long poll: held until the turn ends, the wait passes or a drain begins.
        auto rec = co_await rt_.wait_turn(tid, who.tenant, *wait.value);
        if (!rec) co_return error_reply(errc::not_found, "no such turn: " + tid);
        reply r;
        r.body = baton::turn_json(*rec);
        co_return r;
    }
    auto text = co_await rt_.turn_json(tid, who.tenant);
    if (!text) co_return error_reply(errc::not_found, "no such turn: " + tid);
    reply r;
    r.status = 200;
    r.body = std::move(*text);
    co_return r;
}

asio::awaitable<reply> api::cancel_turn(const std::string& tid, const caller& who) {
    if (!plausible_turn_id(tid)) co_return error_reply(errc::not_found, "no such turn: " + tid);
    if (auto err = co_await rt_.cancel(tid, who.tenant)) co_return error_reply(err->code, err->message);
    co_return json_reply(
        202, json::object{{"turn_id", tid}, {"status", "stopping"}, {"links", turn_links(tid)}});
}

namespace {
json::object usage_json(const usage_day& d) {
    return {{"date", d.date},
            {"turns", d.turns},
            {"prompt_tokens", d.prompt_tokens},
            {"completion_tokens", d.completion_tokens},
            {"tokens", d.prompt_tokens + d.completion_tokens}};
}
json::value limit_json(std::int64_t v) {
    return v > 0 ? json::value(v) : json::value(nullptr);
}
} // namespace

// GET /v1/usage: the caller's tenant's turns and tokens, today and the last 30 days (UTC).
asio::awaitable<reply> api::usage(const caller& who) {
    auto u = co_await rt_.usage(who.tenant);
    json::array days;
    for (const auto& d : u.days)
        days.push_back(usage_json(d));
    co_return json_reply(200,
                         json::object{{"tenant", u.tenant},
                                      {"today", usage_json(u.today)},
                                      {"days", std::move(days)},
                                      {"limits",
                                       {{"max_running_turns", limit_json(u.limits.max_running_turns)},
                                        {"turns_per_minute", limit_json(u.limits.turns_per_minute)},
                                        {"tokens_per_day", limit_json(u.limits.tokens_per_day)}}}});
}

asio::awaitable<reply> api::get_session(const std::string& sid, const caller& who) {
    if (!valid_session_id(sid)) co_return error_reply(errc::invalid_request, "invalid session id");
    auto v = co_await rt_.get_session({who.tenant, sid});
    if (!v) co_return error_reply(errc::not_found, "no such session: " + sid);
    const auto& s = v->record;
    json::object body{
        {"session_id", s.session_id},
        {"agent", s.agent},
        {"turns", s.turns},
        {"busy", v->busy},
        {"queued", v->queued},
        {"last_turn_id", s.last_turn_id ? json::value(*s.last_turn_id) : json::value(nullptr)},
        {"state", s.state}};
    co_return json_reply(200, body);
}

asio::awaitable<reply> api::get_tape(const std::string& sid, std::string_view query, const caller& who) {
    if (!valid_session_id(sid)) co_return error_reply(errc::invalid_request, "invalid session id");
    auto after = query_param_int(query, "after");
    if (!after.error.empty()) co_return error_reply(errc::invalid_request, after.error);
    auto limit = query_param_int(query, "limit");
    if (!limit.error.empty()) co_return error_reply(errc::invalid_request, limit.error);
    std::int64_t lim = limit.value.value_or(100);
    if (lim < 1 || lim > 1000) co_return error_reply(errc::invalid_request, "limit: expected 1..1000");
    std::int64_t from = after.value.value_or(0);

    session_ref session{who.tenant, sid};
    auto entries = co_await rt_.read_tape(session, from, static_cast<std::size_t>(lim));
    if (entries.empty() && !co_await rt_.get_session(session))
        co_return error_reply(errc::not_found, "no such session: " + sid);
    json::array list;
    list.reserve(entries.size());
    for (const auto& e : entries)
        list.push_back(to_json(e));
    std::int64_t next = entries.empty() ? from : entries.back().id;
    co_return json_reply(200, json::object{{"entries", std::move(list)}, {"next_after", next}});
}

asio::awaitable<reply> api::list_outbox(std::string_view query) {
    store::outbox_filter f;
    auto status = query_param(query, "status");
    if (!status.error.empty()) co_return error_reply(errc::invalid_request, status.error);
    if (status.value) {
        if (*status.value == "pending")
            f.statuses = {outbox_status::pending, outbox_status::sending};
        else if (*status.value == "uncertain")
            f.uncertain_only = true;
        else if (*status.value == "failed")
            f.statuses = {outbox_status::failed};
        else if (*status.value == "delivered")
            f.statuses = {outbox_status::delivered};
        else
            co_return error_reply(errc::invalid_request,
                                  "status: expected pending, uncertain, failed or delivered");
    }
    auto limit = query_param_int(query, "limit");
    if (!limit.error.empty()) co_return error_reply(errc::invalid_request, limit.error);
    std::int64_t lim = limit.value.value_or(1000);
    if (lim < 1 || lim > 10000) co_return error_reply(errc::invalid_request, "limit: expected 1..10000");
    f.limit = static_cast<std::size_t>(lim);
    // The admin's listing: every tenant's items, or one tenant's.
    auto tenant = query_param(query, "tenant");
    if (!tenant.error.empty()) co_return error_reply(errc::invalid_request, tenant.error);
    if (const auto& name = tenant.value) {
        if (!valid_tenant_name(*name))
            co_return error_reply(errc::invalid_request, "tenant: 1-64 characters of A-Z a-z 0-9 . _ -");
        f.tenant = *name;
    }
    auto items = co_await rt_.list_outbox(std::move(f));
    json::array list;
    list.reserve(items.size());
    for (const auto& o : items)
        list.push_back(to_json(o));
    co_return json_reply(200, json::object{{"items", std::move(list)}});
}

asio::awaitable<std::variant<reply, event_stream>>
api::open_events(const request_view& req, const std::string& tid, std::string_view query) {
    auto authorized = authorize(req, scope::tenant);
    if (auto* refused = std::get_if<reply>(&authorized)) co_return std::move(*refused);
    const auto& who = std::get<caller>(authorized);
    if (!plausible_turn_id(tid)) co_return error_reply(errc::not_found, "no such turn: " + tid);
    event_stream es;
    // Last-Event-ID (what a reconnecting EventSource sends) wins over ?after=.
    auto after = query_param_int(query, "after");
    if (!after.error.empty()) co_return error_reply(errc::invalid_request, after.error);
    es.after = after.value.value_or(0);
    if (!req.last_event_id.empty()) {
        auto id = query_param_int("v=" + std::string(req.last_event_id), "v");
        if (!id.error.empty() || !id.value)
            co_return error_reply(errc::invalid_request,
                                  "Last-Event-ID: expected a non-negative integer");
        es.after = *id.value;
    }
    es.log = rt_.events().find(tid);
    if (es.log) {
        if (es.log->tenant() == who.tenant) co_return es;
        co_return error_reply(errc::not_found, "no such turn: " + tid);
    }
    auto rec = co_await rt_.get_turn(tid, who.tenant);
    if (!rec) co_return error_reply(errc::not_found, "no such turn: " + tid);
    if (!is_terminal(rec->status)) {
        // Stored but not run by this process yet (recovered): its events will go to this log.
        // Several nodes: perhaps another node runs it, which is asked to relay its events here.
        es.log = rt_.events().open(tid, session_of(*rec));
        rt_.follow(tid);
        co_return es;
    }
    // Its events are no longer kept: a late subscriber still learns how it ended.
    auto fin = std::make_shared<turn_event>();
    fin->seq = es.after < std::numeric_limits<std::int64_t>::max() ? es.after + 1 : es.after;
    fin->type = "turn.finished";
    fin->data = json::serialize(finished_event_data(*rec));
    es.final_only = std::move(fin);
    co_return es;
}

} // namespace baton::http
