// Real providers' recorded responses (OpenAI, Azure, DeepSeek, xAI, Mistral, Groq, OpenRouter,
// Perplexity, Moonshot, Alibaba, Ollama, Cerebras, Snowflake, ...), replayed through the OpenAI
// client over loopback four ways: byte for byte, in 7-byte HTTP chunks, without `data: [DONE]`,
// and with CRLF line endings. Each run is checked against a plain reading of the whole recording
// (reference() below: line by line, no SSE parser, no assembler) and against facts read off the
// recordings by hand; a completed answer is then sent back as the next request of the turn would
// send it. The recordings are other projects' test data and are not in this repository: they are
// read from $BATON_PROVIDER_STREAMS (scripts/test points it at ../shared/provider-streams).
#include "tests/fake_openai.hpp"
#include "tests/test_util.hpp"

#include <baton/framework.hpp>
#include <baton/openai_client.hpp>

#include <boost/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

using namespace baton;
using namespace baton::test;
namespace json = boost::json;
namespace utf = boost::unit_test;
using std::chrono::milliseconds;

namespace {

const char* streams_dir() {
    const char* d = std::getenv("BATON_PROVIDER_STREAMS");
    return d && *d ? d : nullptr;
}

struct recordings_present {
    boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
        const bool present =
            streams_dir() != nullptr &&
            std::filesystem::exists(std::filesystem::path(streams_dir()) / "manifest.json");
        boost::test_tools::assertion_result r(present);
        if (!r)
            r.message() << "skipped: set BATON_PROVIDER_STREAMS to a directory of recorded provider "
                           "responses with a manifest.json (scripts/test does when "
                           "../shared/provider-streams exists)";
        return r;
    }
};

std::string read_file(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// ---- The reference reading: what a recording says, taken whole and line by line. ----

struct expected {
    bool completed = false;
    std::string error; // a failed answer's message contains this
    std::string text, reasoning, field;
    bool refusal = false;
    json::array details;
    std::vector<tool_call> calls;
    bool has_usage = false;
    std::int64_t prompt = 0, completion = 0;
    std::string finish_reason;
};

std::string str_or_empty(const json::value* v) {
    return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

// Text, refusal and reasoning of a delta or a message.
void fold_message(const json::object& m, expected& e) {
    if (auto* c = m.if_contains("content")) {
        if (c->is_string()) e.text += c->get_string();
        if (c->is_array())
            for (const auto& part : c->get_array()) {
                const auto& p = part.get_object();
                auto type = str_or_empty(p.if_contains("type"));
                if (type == "text") e.text += str_or_empty(p.if_contains("text"));
                if (type != "thinking") continue;
                const auto& t = p.at("thinking");
                if (t.is_string()) e.reasoning += t.get_string();
                if (t.is_array())
                    for (const auto& q : t.get_array())
                        e.reasoning += str_or_empty(q.get_object().if_contains("text"));
            }
    }
    if (auto r = str_or_empty(m.if_contains("refusal")); !r.empty()) {
        e.text += r;
        e.refusal = true;
    }
    bool took = false;
    for (const char* f : {"reasoning_content", "reasoning"})
        if (auto r = str_or_empty(m.if_contains(f)); !r.empty() && !took) {
            e.reasoning += r;
            if (e.field.empty()) e.field = f;
            took = true;
        }
    auto* d = m.if_contains("reasoning_details");
    if (!d || !d->is_array()) return;
    for (const auto& item : d->get_array()) {
        const auto& o = item.get_object();
        if (!took)
            for (const char* k : {"text", "summary"})
                e.reasoning += str_or_empty(o.if_contains(k));
        // Pieces of one item share its index and type; their strings are its text in pieces.
        json::object* same = nullptr;
        for (auto& have : e.details) {
            auto& h = have.get_object();
            if (o.contains("index") && h.contains("index") && h.at("index") == o.at("index") &&
                (!o.contains("type") || !h.contains("type") || h.at("type") == o.at("type")))
                same = &h;
        }
        if (!same) {
            e.details.push_back(o);
            continue;
        }
        for (const auto& [k, v] : o) {
            auto* old = same->if_contains(k);
            bool joined = k == "text" || k == "summary" || k == "data";
            if (old && joined && old->is_string() && v.is_string())
                old->get_string().append(v.get_string());
            else if (!old || old->is_null() || (old->is_string() && old->get_string().empty()))
                (*same)[k] = v;
        }
    }
}

void read_usage(const json::object& o, expected& e) {
    const json::value* u = o.if_contains("usage");
    if (!u || u->is_null())
        if (auto* g = o.if_contains("x_groq"); g && g->is_object())
            u = g->get_object().if_contains("usage");
    if (!u || !u->is_object()) return;
    e.has_usage = true;
    e.prompt = u->get_object().at("prompt_tokens").to_number<std::int64_t>();
    e.completion = u->get_object().at("completion_tokens").to_number<std::int64_t>();
}

std::string error_message(const json::value& err) {
    if (err.is_object())
        if (auto m = str_or_empty(err.get_object().if_contains("message")); !m.empty()) return m;
    return json::serialize(err);
}

const json::object* choice0(const json::object& o) {
    auto* cs = o.if_contains("choices");
    if (!cs || !cs->is_array()) return nullptr;
    for (const auto& c : cs->get_array()) {
        auto* i = c.get_object().if_contains("index");
        if (!i || i->to_number<std::int64_t>() == 0) return &c.get_object();
    }
    return nullptr;
}

expected reference_whole(const std::string& body, unsigned status) {
    expected e;
    auto o = json::parse(body).as_object();
    if (auto* err = o.if_contains("error"); err && !err->is_null()) {
        e.error = (status != 200 ? "HTTP " + std::to_string(status) + ": " : "") + error_message(*err);
        return e;
    }
    auto* c = choice0(o);
    const auto& m = c->at("message").get_object();
    fold_message(m, e);
    if (auto* d = m.if_contains("reasoning_details"); d && d->is_array()) e.details = d->get_array();
    if (auto* tcs = m.if_contains("tool_calls"); tcs && tcs->is_array())
        for (const auto& t : tcs->get_array()) {
            const auto& fn = t.at("function").get_object();
            e.calls.push_back({str_or_empty(t.get_object().if_contains("id")),
                               str_or_empty(fn.if_contains("name")),
                               str_or_empty(fn.if_contains("arguments"))});
        }
    e.finish_reason = str_or_empty(c->if_contains("finish_reason"));
    read_usage(o, e);
    e.completed = true;
    return e;
}

expected reference_stream(std::string body) {
    expected e;
    for (std::size_t at; (at = body.find("\r\n")) != std::string::npos;)
        body.replace(at, 2, "\n");
    std::istringstream lines(body);
    std::string line;
    bool done = false, last_ended = true;
    std::map<std::int64_t, tool_call> calls;
    std::int64_t last = -1;
    while (std::getline(lines, line)) {
        if (line.empty()) {
            last_ended = true;
            continue;
        }
        if (line.rfind("data:", 0) != 0) continue;
        last_ended = false;
        auto data = line.substr(line[5] == ' ' ? 6 : 5);
        if (data == "[DONE]") {
            done = true;
            break;
        }
        auto o = json::parse(data).as_object();
        if (auto* err = o.if_contains("error"); err && !err->is_null()) {
            e.error = error_message(*err);
            return e;
        }
        read_usage(o, e);
        auto* c = choice0(o);
        if (!c) continue;
        if (auto f = str_or_empty(c->if_contains("finish_reason")); !f.empty()) e.finish_reason = f;
        auto* d = c->if_contains("delta");
        if (!d || !d->is_object()) continue;
        fold_message(d->get_object(), e);
        auto* tcs = d->get_object().if_contains("tool_calls");
        if (!tcs || !tcs->is_array()) continue;
        for (const auto& tv : tcs->get_array()) {
            const auto& t = tv.get_object();
            auto id = str_or_empty(t.if_contains("id"));
            std::int64_t i = -1;
            if (auto* ix = t.if_contains("index")) {
                i = ix->to_number<std::int64_t>();
            } else {
                for (const auto& [k, have] : calls)
                    if (!id.empty() && have.id == id) i = k;
                if (i < 0)
                    i = id.empty() && last >= 0 ? last : (calls.empty() ? 0 : calls.rbegin()->first + 1);
            }
            last = i;
            auto& call = calls[i];
            if (call.id.empty()) call.id = id;
            if (auto* fn = t.if_contains("function"); fn && fn->is_object()) {
                if (call.name.empty()) call.name = str_or_empty(fn->get_object().if_contains("name"));
                call.arguments += str_or_empty(fn->get_object().if_contains("arguments"));
            }
        }
    }
    for (auto& [k, c] : calls)
        e.calls.push_back(c);
    e.completed = done || (!e.finish_reason.empty() && last_ended);
    if (!e.completed) e.error = "the stream ended without [DONE] or a finish_reason";
    return e;
}

// ---- The four ways. ----

enum class way { as_recorded, pieces, without_done, crlf };
const char* name_of(way w) {
    switch (w) {
    case way::as_recorded:
        return "byte for byte";
    case way::pieces:
        return "7-byte pieces";
    case way::without_done:
        return "without [DONE]";
    case way::crlf:
        return "CRLF";
    }
    return "";
}

std::string without_done(std::string body) {
    auto at = body.rfind("data: [DONE]");
    if (at != std::string::npos) body.erase(at);
    return body;
}

std::string with_crlf(const std::string& body) {
    std::string out;
    for (std::size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '\n' && (i == 0 || body[i - 1] != '\r')) out += '\r';
        out += body[i];
    }
    return out;
}

fake_reply reply_for(const std::string& body, bool stream, unsigned status, way w) {
    fake_reply r;
    r.status = status;
    r.headers = {{"Content-Type", stream ? "text/event-stream" : "application/json"}};
    if (w == way::pieces) {
        r.chunked = true;
        for (std::size_t i = 0; i < body.size(); i += 7)
            r.pieces.push_back(body.substr(i, 7));
    } else {
        r.pieces = {body};
    }
    return r;
}

struct replay_fixture : io_fixture {
    fake_openai server;
    std::shared_ptr<http_client> http = std::make_shared<http_client>(ctx.get_executor());
    json::object manifest;
    std::filesystem::path dir{streams_dir() ? streams_dir() : "."};

    replay_fixture() {
        if (std::filesystem::exists(dir / "manifest.json"))
            manifest = json::parse(read_file(dir / "manifest.json")).as_object();
    }

    struct outcome {
        std::optional<chat_completion> completion;
        std::string error;
        std::string shown; // reply text as on_delta reported it
        std::string shown_reasoning;
    };

    outcome call(bool stream, const model_request& req) {
        model_config cfg;
        cfg.provider = "openai";
        cfg.base_url = server.base_url();
        cfg.model = "replay";
        cfg.stream = stream;
        cfg.timeout = milliseconds(10000);
        // One attempt: what a recording does, not what a retry of it does.
        auto m = make_openai_model(ctx.get_executor(), cfg, http, {1, milliseconds(1), milliseconds(1)});
        outcome out;
        delta_handler on_delta = [&out](const model_delta& d) {
            out.shown += d.text;
            out.shown_reasoning += d.reasoning;
        };
        auto run = [](std::shared_ptr<model_client> m, model_request req,
                      delta_handler h) -> asio::awaitable<chat_completion> {
            co_return co_await m->complete(req, h);
        };
        try {
            out.completion = run_bounded(ctx, run(m, req, on_delta), 20s);
        } catch (const turn_error& e) {
            out.error = e.what();
        }
        return out;
    }
};

model_request ask() {
    model_request r;
    r.messages.push_back({"user", "hi", {}, {}});
    return r;
}

unsigned status_of(const json::object& entry) {
    auto note = str_or_empty(entry.if_contains("note"));
    auto at = note.find("http=");
    return at == std::string::npos ? 200 : static_cast<unsigned>(std::stoul(note.substr(at + 5)));
}

void check(const expected& want, const replay_fixture::outcome& got) {
    BOOST_TEST(got.completion.has_value() == want.completed, got.error);
    if (!want.completed) {
        BOOST_TEST(got.error.find(want.error) != std::string::npos,
                   "error '" << got.error << "' should contain '" << want.error << "'");
        return;
    }
    if (!got.completion) return;
    const auto& c = *got.completion;
    BOOST_TEST(c.text == want.text);
    BOOST_TEST(got.shown == want.text);
    BOOST_TEST(c.refusal == want.refusal);
    BOOST_TEST(c.reasoning.text == want.reasoning);
    BOOST_TEST(got.shown_reasoning == want.reasoning);
    BOOST_TEST(c.reasoning.field == want.field);
    BOOST_TEST(json::serialize(c.reasoning.details) == json::serialize(want.details));
    BOOST_TEST(c.finish_reason == want.finish_reason);
    BOOST_TEST(c.has_usage == want.has_usage);
    BOOST_TEST(c.prompt_tokens == want.prompt);
    BOOST_TEST(c.completion_tokens == want.completion);
    BOOST_REQUIRE_EQUAL(c.tool_calls.size(), want.calls.size());
    for (std::size_t i = 0; i < want.calls.size(); ++i) {
        BOOST_TEST(c.tool_calls[i].id == want.calls[i].id);
        BOOST_TEST(c.tool_calls[i].name == want.calls[i].name);
        BOOST_TEST(c.tool_calls[i].arguments == want.calls[i].arguments);
    }
}

// The next request of the turn: the assistant message as the agent loop makes it, then an
// observation per tool call. What it carries must be what the provider sent.
void check_sent_back(replay_fixture& f, bool stream, const chat_completion& c, const expected& want) {
    auto req = ask();
    req.messages.push_back(assistant_message(c.text, c));
    for (const auto& t : c.tool_calls)
        req.messages.push_back({"tool", "observed", {}, t.id});
    f.server.push(fake_reply::completion("next"));
    auto before = f.server.requests().size();
    auto next = f.call(false, req);
    (void)stream;
    BOOST_TEST(next.error == "");
    auto requests = f.server.requests();
    BOOST_REQUIRE_EQUAL(requests.size(), before + 1);
    const auto& m = requests.back().body.at("messages").at(1).as_object();
    BOOST_TEST(m.at("role") == "assistant");
    if (want.calls.empty()) {
        BOOST_TEST(!m.contains("tool_calls"));
    } else {
        const auto& calls = m.at("tool_calls").as_array();
        BOOST_REQUIRE_EQUAL(calls.size(), want.calls.size());
        for (std::size_t i = 0; i < calls.size(); ++i) {
            BOOST_TEST(calls[i].at("id").as_string() == want.calls[i].id);
            BOOST_TEST(calls[i].at("function").at("name").as_string() == want.calls[i].name);
            BOOST_TEST(calls[i].at("function").at("arguments").as_string() == want.calls[i].arguments);
        }
    }
    for (const char* field : {"reasoning_content", "reasoning"}) {
        if (field == want.field && !want.reasoning.empty())
            BOOST_TEST((m.contains(field) && m.at(field).as_string() == want.reasoning), field);
        else
            BOOST_TEST(!m.contains(field), field);
    }
    if (want.details.empty())
        BOOST_TEST(!m.contains("reasoning_details"));
    else
        BOOST_TEST(
            (m.contains("reasoning_details") && m.at("reasoning_details") == json::value(want.details)));
}

} // namespace

BOOST_AUTO_TEST_SUITE(provider_replay, *utf::precondition(recordings_present()))

// Every recording, four ways, against its reference reading.
BOOST_FIXTURE_TEST_CASE(every_recording_four_ways, replay_fixture) {
    BOOST_REQUIRE(!manifest.empty());
    std::size_t runs = 0, completed = 0, sent_back = 0;
    for (const auto& [name, v] : manifest) {
        const auto& entry = v.as_object();
        const bool stream = entry.at("kind") == "stream";
        const unsigned status = status_of(entry);
        const auto body = read_file(dir / std::string(entry.at("file").as_string()));
        for (way w : {way::as_recorded, way::pieces, way::without_done, way::crlf}) {
            if (!stream && w == way::without_done) continue;
            std::string b = w == way::without_done ? without_done(body)
                            : w == way::crlf       ? with_crlf(body)
                                                   : body;
            BOOST_TEST_CONTEXT(std::string(name)
                               << " (" << entry.at("note").as_string() << "), " << name_of(w)) {
                auto want = stream ? reference_stream(b) : reference_whole(b, status);
                server.push(reply_for(b, stream, status, w));
                auto got = call(stream, ask());
                check(want, got);
                ++runs;
                if (got.completion) ++completed;
                if (w == way::as_recorded && got.completion &&
                    (!got.completion->tool_calls.empty() || !got.completion->reasoning.empty())) {
                    check_sent_back(*this, stream, *got.completion, want);
                    ++sent_back;
                }
            }
        }
    }
    BOOST_TEST_MESSAGE(runs << " runs of " << manifest.size() << " recordings: " << completed
                            << " completed, the rest failed as their reference reading says; "
                            << sent_back << " answers sent back");
}

// Facts read off the recordings by hand, so that the reference reading itself is checked.
BOOST_FIXTURE_TEST_CASE(facts_read_by_hand, replay_fixture) {
    auto run = [&](const std::string& name) {
        const auto& entry = manifest.at(name).as_object();
        const bool stream = entry.at("kind") == "stream";
        auto body = read_file(dir / std::string(entry.at("file").as_string()));
        server.push(reply_for(body, stream, status_of(entry), way::as_recorded));
        return call(stream, ask());
    };
    auto has = [&](const std::string& name) { return manifest.contains(name); };

    if (has("v-mistral-tool-call")) { // Mistral: tool-call deltas without an index
        auto r = run("v-mistral-tool-call");
        BOOST_REQUIRE(r.completion);
        BOOST_REQUIRE_EQUAL(r.completion->tool_calls.size(), 1u);
        BOOST_TEST(r.completion->tool_calls[0].id == "gSIMJiOkT");
        BOOST_TEST(r.completion->tool_calls[0].name == "weather");
        BOOST_TEST(r.completion->tool_calls[0].arguments == R"({"location": "San Francisco"})");
        BOOST_TEST(r.completion->prompt_tokens == 124);
        BOOST_TEST(r.completion->completion_tokens == 22);
    }
    if (has("v-moonshotai-stream")) { // reasoning_content beside the reply
        auto r = run("v-moonshotai-stream");
        BOOST_REQUIRE(r.completion);
        BOOST_TEST(r.completion->text == "Hello!");
        BOOST_TEST(r.completion->reasoning.text == "Thinking aloud. ");
        BOOST_TEST(r.completion->reasoning.field == "reasoning_content");
    }
    if (has("v-mistral-reasoning")) { // Magistral: content as thinking and text parts
        auto r = run("v-mistral-reasoning");
        BOOST_REQUIRE(r.completion);
        BOOST_TEST(r.completion->text == "2 + 2 = 4");
        BOOST_TEST(r.completion->reasoning.text ==
                   "The user is asking for 2+2. This is basic arithmetic. 2+2=4.");
        BOOST_TEST(r.completion->reasoning.field == "");
    }
    if (has("o-173417d55340")) { // an OpenAI refusal
        auto r = run("o-173417d55340");
        BOOST_REQUIRE(r.completion);
        BOOST_TEST(r.completion->refusal);
        BOOST_TEST(r.completion->text == "I'm sorry, I can't assist with that request.");
    }
    if (has("p-groq-thinking-iter-0")) { // usage only under x_groq
        auto r = run("p-groq-thinking-iter-0");
        BOOST_REQUIRE(r.completion);
        BOOST_TEST(r.completion->prompt_tokens == 21);
        BOOST_TEST(r.completion->completion_tokens == 988);
    }
    if (has("d-openai-text-done-eof")) { // [DONE] at the end of the body, no line end
        auto r = run("d-openai-text-done-eof");
        BOOST_REQUIRE(r.completion);
        BOOST_TEST(r.completion->text.size() == 1730u); // bytes
        BOOST_TEST(r.completion->completion_tokens == 300);
    }
    if (has("v-anthropic-fallback-tool-call")) { // "data: [DONE]\n" and tool index 1
        auto r = run("v-anthropic-fallback-tool-call");
        BOOST_REQUIRE(r.completion);
        BOOST_TEST(r.completion->text == "Reading it.");
        BOOST_REQUIRE_EQUAL(r.completion->tool_calls.size(), 1u);
        BOOST_TEST(r.completion->tool_calls[0].id == "toolu_sanitized");
        BOOST_TEST(r.completion->tool_calls[0].arguments == R"({"path": "a.txt"})");
    }
    if (has("p-groq-tool-use-failed-stream-0")) { // an error event in the stream
        auto r = run("p-groq-tool-use-failed-stream-0");
        BOOST_TEST(!r.completion);
        BOOST_TEST(r.error.find("Tool call validation failed") != std::string::npos, r.error);
    }
    if (has("p-or-errors-raised-0")) { // 429 with OpenRouter's error body
        auto r = run("p-or-errors-raised-0");
        BOOST_TEST(!r.completion);
        BOOST_TEST(r.error.find("HTTP 429: Provider returned error") != std::string::npos, r.error);
    }
    if (has("p-or-streaming-reasoning")) { // OpenRouter: reasoning_details merged into one block
        auto r = run("p-or-streaming-reasoning");
        BOOST_REQUIRE(r.completion);
        BOOST_TEST(r.completion->reasoning.field == "reasoning");
        BOOST_REQUIRE_EQUAL(r.completion->reasoning.details.size(), 1u);
        const auto& d = r.completion->reasoning.details[0].as_object();
        BOOST_TEST(d.at("type") == "reasoning.text");
        BOOST_TEST(d.at("text") == "This is a simple arithmetic question. 2+2 equals 4.");
        BOOST_TEST(!d.at("signature").as_string().empty());
    }
}

BOOST_AUTO_TEST_SUITE_END()
