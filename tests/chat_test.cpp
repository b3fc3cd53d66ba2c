// `baton chat` driven like a user drives it: the real binary, messages on its stdin, its output
// read back. In-process with the echo model and with a scripted fake OpenAI server; over the
// daemon's WebSocket channel with `--url`. Also the chat's printer (chat_view) on its own.
#include "src/app/chat_view.hpp"
#include "tests/daemon_fixture.hpp"
#include "tests/fake_openai.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/test/unit_test.hpp>

#include <csignal>
#include <sstream>
#include <thread>

using namespace baton;
using namespace baton::test;

namespace {

// Where `needles` appear in `text`, each after the previous one; fails on the first missing.
void check_in_order(const std::string& text, const std::vector<std::string>& needles) {
    std::size_t at = 0;
    for (const auto& n : needles) {
        auto found = text.find(n, at);
        BOOST_TEST_REQUIRE(found != std::string::npos, "missing (in this order) \"" << n << "\" in:\n"
                                                                                    << text);
        at = found + n.size();
    }
}

// A config whose default agent streams from the fake server and may call the clock.
std::string fake_model_config(const daemon_fixture& f, const fake_openai& model) {
    json::object agent{{"model",
                        {{"provider", "openai"},
                         {"base_url", model.base_url()},
                         {"model", "fake-1"},
                         {"stream", true},
                         {"timeout_ms", 5000}}},
                       {"tools", json::array{"clock"}}};
    json::object cfg{{"agents", {{"default", std::move(agent)}}}};
    return f.write_file("chat.json", json::serialize(cfg)).string();
}

// A streamed completion that asks for the clock (the call's arguments come in two pieces).
fake_reply clock_call_stream() {
    json::object start{{"index", 0},
                       {"id", "call_1"},
                       {"type", "function"},
                       {"function", {{"name", "clock"}, {"arguments", "{"}}}};
    json::object rest{{"index", 0}, {"function", {{"arguments", "}"}}}};
    return fake_reply::sse({chunk({{"role", "assistant"}, {"tool_calls", json::array{start}}}),
                            chunk({{"tool_calls", json::array{rest}}}), chunk({}, "tool_calls")});
}

// A port on 127.0.0.1 where nothing listens (bound, then released).
unsigned short closed_port() {
    boost::asio::io_context ctx;
    boost::asio::ip::tcp::acceptor a(ctx, {boost::asio::ip::make_address("127.0.0.1"), 0});
    return a.local_endpoint().port();
}

// Until the daemon serves the WebSocket channel the --url cases cannot run (a plain GET of /v1/ws
// is then 404): they say so and pass.
bool serves_ws(const daemon_fixture& d, std::string_view test) {
    if (d.request("GET", "/v1/ws").status != 404) return true;
    BOOST_TEST_MESSAGE("SKIPPED " << test << ": this daemon does not serve /v1/ws yet");
    return false;
}

} // namespace

BOOST_AUTO_TEST_SUITE(chat_cli)

BOOST_AUTO_TEST_CASE(in_process_each_line_gets_its_reply_in_order_and_eof_exits_0) {
    auto r = run_baton({"chat", "--session", "c1"}, "hello\n\nsecond line\n");
    BOOST_TEST(r.exit_code == 0, r.output);
    check_in_order(r.output, {"baton> echo: hello\n", "baton> echo: second line\n"});
    // Not a terminal: no prompt; the blank line is no message.
    BOOST_TEST(r.output.find("you> ") == std::string::npos, r.output);
    BOOST_TEST(r.output.find("echo: \n") == std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(more_lines_than_the_session_queue_holds_all_get_their_reply_in_order) {
    // max_queued is 32: a pipe outruns the session, and the chat waits for room instead of failing.
    std::string input;
    std::vector<std::string> expected;
    for (int i = 1; i <= 100; ++i) {
        input += "line " + std::to_string(i) + "\n";
        expected.push_back("baton> echo: line " + std::to_string(i) + "\n");
    }
    auto r = run_baton({"chat"}, input, 30s);
    BOOST_TEST(r.exit_code == 0, r.output);
    check_in_order(r.output, expected);
    BOOST_TEST(r.output.find("[error") == std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(a_direct_command_is_answered_without_the_model) {
    auto r = run_baton({"chat"}, "/help\n/model\n");
    BOOST_TEST(r.exit_code == 0, r.output);
    check_in_order(r.output, {"baton> commands: /help", "baton> agent default uses echo:echo"});
    BOOST_TEST(r.output.find("echo: /") == std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(bad_options_exit_2_with_a_message) {
    for (std::vector<std::string> args : {std::vector<std::string>{"chat", "--session", "not valid!"},
                                          {"chat", "--session", std::string(129, 'a')},
                                          {"chat", "--session", ""},
                                          {"chat", "--bogus", "1"},
                                          {"chat", "--url", "ftp://127.0.0.1:1"},
                                          {"chat", "--url", "ws://127.0.0.1:1", "--cacert", "/tmp/x"},
                                          {"chat", "--cacert", "/tmp/x"},
                                          {"chat", "--url", "ws://127.0.0.1:1", "--data", "/tmp/x"},
                                          {"chat", "--token=x"}, // found by a docs review
                                          {"chat", "--data", ""}}) {
        // baton may exit before it reads its input, so the write may fail: not checked.
        cli_process p(args);
        (void)p.write("hello\n");
        auto code = p.wait(10s);
        BOOST_TEST(code == 2, args.back() << ": " << p.output());
        BOOST_TEST(p.output().find("baton: ") != std::string::npos, p.output());
        BOOST_TEST(p.output().find("echo: hello") == std::string::npos, p.output());
    }
    // Each named for what it is, not as an option lacking its value.
    for (auto [arg, said] : {std::pair<std::string, std::string>{"--bogus", "unknown option --bogus"},
                             {"stray", "unexpected argument stray"}}) {
        auto r = run_baton({"chat", arg});
        BOOST_TEST(r.exit_code == 2);
        BOOST_TEST(r.output.find(said) != std::string::npos, r.output);
    }
    auto ok = run_baton({"chat", "--session", std::string(128, 'a')}, "x\n");
    BOOST_TEST(ok.exit_code == 0, ok.output);
}

BOOST_AUTO_TEST_CASE(help_texts_name_the_chat) {
    auto top = run_baton({"--help"});
    BOOST_TEST(top.output.find("chat ") != std::string::npos, top.output);
    auto r = run_baton({"chat", "--help"});
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.output.find("--url URL") != std::string::npos, r.output);
    BOOST_TEST(r.output.find("[--token TOKEN] [--cacert FILE]") != std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(tool_calls_steps_and_streamed_text_are_shown_as_they_happen) {
    daemon_fixture f(daemon_fixture::deferred{});
    fake_openai model;
    model.push(clock_call_stream());
    auto text = fake_reply::stream_text({"It is ", "about ", "noon"});
    text.piece_delay = std::chrono::milliseconds(600);
    model.push(text);
    cli_process chat({"chat", "--config", fake_model_config(f, model), "--session", "s1"});
    BOOST_REQUIRE(chat.write("what time is it?\n"));
    // The first words are out while the model is still writing the rest.
    BOOST_TEST_REQUIRE(chat.wait_for("baton> It is "), chat.output());
    BOOST_TEST(chat.output().find("noon") == std::string::npos, chat.output());
    BOOST_TEST(chat.wait(10s) == 0, chat.output());
    check_in_order(chat.output(), {"  [tool clock {}]\n", "  [tool clock -> ok: 20", "  [step 2]\n",
                                   "baton> It is about noon\n"});
    // Streamed once, not printed again at the end.
    BOOST_TEST(chat.output().find("noon", chat.output().find("noon") + 1) == std::string::npos,
               chat.output());
    BOOST_TEST(model.requests().size() == 2u);
}

BOOST_AUTO_TEST_CASE(a_turn_that_does_not_complete_shows_how_it_ended) {
    daemon_fixture f(daemon_fixture::deferred{});
    fake_openai model;
    model.push(fake_reply::error(400, "no such model"));
    model.push(fake_reply::stream_text({"fine"}));
    auto r = run_baton({"chat", "--config", fake_model_config(f, model)}, "first\nsecond\n");
    BOOST_TEST(r.exit_code == 0, r.output);
    check_in_order(r.output, {"[failed: model_error: ", "baton> fine\n"});
}

BOOST_AUTO_TEST_CASE(ctrl_c_stops_the_running_turn_and_exits_130) {
    daemon_fixture f(daemon_fixture::deferred{});
    fake_openai model;
    model.push(fake_reply::stream_text({"too late"}).after(std::chrono::milliseconds(8000)));
    cli_process chat({"chat", "--config", fake_model_config(f, model)});
    BOOST_REQUIRE(chat.write("slow one\n"));
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (model.requests().empty() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
    BOOST_REQUIRE_MESSAGE(!model.requests().empty(), "the turn never called the model");
    auto t0 = std::chrono::steady_clock::now();
    chat.signal(SIGINT);
    int code = chat.wait(5s);
    BOOST_TEST(code == 130, "exit " << code << ": " << chat.output());
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < 4s));
    check_in_order(chat.output(), {"[interrupted]", "[stopped]"});
}

BOOST_AUTO_TEST_CASE(data_dir_keeps_the_conversation_for_the_next_chat) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto data = (f.dir.root / "chat-data").string();
    auto first = run_baton({"chat", "--data", data, "--session", "kept"}, "remember me\n");
    BOOST_TEST(first.exit_code == 0, first.output);
    BOOST_TEST(std::filesystem::exists(f.dir.root / "chat-data" / "baton.db"));
    // The daemon on the same directory sees the chat's turn in the session.
    f.daemon = std::make_unique<daemon_process>(
        std::vector<std::string>{"serve", "--listen", "127.0.0.1:0", "--data", data},
        f.dir.root / "daemon.log");
    auto s = f.request("GET", "/v1/sessions/kept");
    BOOST_TEST(s.status == 200u, s.body);
    BOOST_TEST(int_at(body_object(s), "turns") == 1);
    // While it runs, neither a chat nor a second daemon may use that database (they would take
    // its running turns for abandoned).
    for (std::vector<std::string> args : {std::vector<std::string>{"chat", "--data", data},
                                          {"serve", "--listen", "127.0.0.1:0", "--data", data}}) {
        cli_process p(args);
        (void)p.write("hello\n"); // it may exit before it reads
        BOOST_TEST(p.wait(20s) == 1, args.front() << ": " << p.output());
        BOOST_TEST(p.output().find("is in use by another baton process") != std::string::npos,
                   p.output());
    }
    BOOST_TEST(f.request("GET", "/readyz").status == 200u);
}

BOOST_AUTO_TEST_CASE(an_unreachable_daemon_exits_1) {
    auto port = std::to_string(closed_port());
    auto r = run_baton({"chat", "--url", "ws://127.0.0.1:" + port}, "hello\n");
    BOOST_TEST(r.exit_code == 1, r.output);
    BOOST_TEST(r.output.find("cannot connect to ws://127.0.0.1:" + port) != std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(over_websocket_more_lines_than_the_session_queue_holds_all_get_their_reply) {
    daemon_fixture d;
    if (!serves_ws(d, "over_websocket_more_lines_than_the_session_queue_holds_all_get_their_reply"))
        return;
    // max_queued is 32: the lines arrive at once, those refused with session_queue_full are sent
    // again after the daemon's retry_after instead of being lost.
    std::string input;
    std::vector<std::string> expected;
    for (int i = 1; i <= 100; ++i) {
        input += "line " + std::to_string(i) + "\n";
        expected.push_back("baton> echo: line " + std::to_string(i) + "\n");
    }
    auto r = run_baton(
        {"chat", "--url", "ws://127.0.0.1:" + std::to_string(d.daemon->port()), "--session", "q1"},
        input, 60s);
    BOOST_TEST(r.exit_code == 0, r.output);
    for (const auto& line : expected)
        BOOST_TEST(r.output.find(line) != std::string::npos, line);
    BOOST_TEST(r.output.find("[error") == std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(over_websocket_each_reply_is_shown_once_and_acked) {
    daemon_fixture d;
    if (!serves_ws(d, "over_websocket_each_reply_is_shown_once_and_acked")) return;
    std::string port = std::to_string(d.daemon->port());
    auto r = run_baton({"chat", "--url", "ws://127.0.0.1:" + port + "/v1/ws", "--session", "w1"},
                       "hello\n/help\nagain\n", 20s);
    BOOST_TEST(r.exit_code == 0, r.output);
    check_in_order(r.output, {"baton> echo: hello\n", "baton> commands: /help", "baton> echo: again\n"});
    // Each reply once, although events and reply frames both carry it.
    auto first = r.output.find("echo: hello");
    BOOST_TEST(r.output.find("echo: hello", first + 1) == std::string::npos, r.output);
    // Every reply was acked: a later chat on the session gets none of them again.
    auto later = run_baton({"chat", "--url", "http://127.0.0.1:" + port, "--session", "w1"}, "", 20s);
    BOOST_TEST(later.exit_code == 0, later.output);
    BOOST_TEST(later.output.find("echo:") == std::string::npos, later.output);
}

BOOST_AUTO_TEST_CASE(reasoning_is_shown_folded_on_its_own_line_and_never_in_the_reply) {
    daemon_fixture f(daemon_fixture::deferred{});
    fake_openai model;
    model.push(
        fake_reply::sse({chunk({{"role", "assistant"}, {"reasoning_content", "The user says hi."}}),
                         chunk({{"reasoning_content", " Greet back."}}), chunk({{"content", "Hi "}}),
                         chunk({{"content", "there"}}), chunk({}, "stop")}));
    auto r = run_baton({"chat", "--config", fake_model_config(f, model)}, "hi\n");
    BOOST_TEST(r.exit_code == 0, r.output);
    check_in_order(r.output, {"  [thinking: The user says hi. Greet back.]\n", "baton> Hi there\n"});
    // Not a terminal: no escape codes; the reasoning shown once, folded, never as the reply.
    BOOST_TEST(r.output.find('\x1b') == std::string::npos, r.output);
    BOOST_TEST(r.output.find("Greet back", r.output.find("Greet back") + 1) == std::string::npos,
               r.output);
    BOOST_TEST(r.output.find("baton> The user") == std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(over_websocket_tool_calls_and_steps_are_shown_as_in_process) {
    daemon_fixture d(daemon_fixture::deferred{});
    fake_openai model;
    model.push(clock_call_stream());
    model.push(fake_reply::stream_text({"It is ", "about ", "noon"}));
    d.start({"--config", fake_model_config(d, model)});
    if (!serves_ws(d, "over_websocket_tool_calls_and_steps_are_shown_as_in_process")) return;
    std::string url = "ws://127.0.0.1:" + std::to_string(d.daemon->port());
    auto r = run_baton({"chat", "--url", url, "--session", "t1"}, "what time is it?\n", 20s);
    BOOST_TEST(r.exit_code == 0, r.output);
    check_in_order(r.output, {"  [tool clock {}]\n", "  [tool clock -> ok: 20", "  [step 2]\n",
                              "baton> It is about noon\n"});
    // The streamed text and the reply frame are one reply.
    BOOST_TEST(r.output.find("noon", r.output.find("noon") + 1) == std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(over_websocket_the_chat_reconnects_when_the_daemon_restarts) {
    daemon_fixture d;
    if (!serves_ws(d, "over_websocket_the_chat_reconnects_when_the_daemon_restarts")) return;
    std::string port = std::to_string(d.daemon->port());
    cli_process chat({"chat", "--url", "ws://127.0.0.1:" + port, "--session", "r1"});
    BOOST_REQUIRE(chat.write("one\n"));
    BOOST_TEST_REQUIRE(chat.wait_for("baton> echo: one\n"), chat.output());
    d.stop();
    d.start({"--listen", "127.0.0.1:" + port});
    BOOST_REQUIRE(chat.write("two\n"));
    BOOST_TEST_REQUIRE(chat.wait_for("baton> echo: two\n", 15s), chat.output());
    int code = chat.wait(10s);
    BOOST_TEST(code == 0, "exit " << code << ": " << chat.output());
    check_in_order(chat.output(), {"baton> echo: one\n", "[reconnected]", "baton> echo: two\n"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(chat_view_lines)

BOOST_AUTO_TEST_CASE(in_process_streams_deltas_and_prints_the_reply_once) {
    std::ostringstream out;
    chat_view v(out, chat_view::mode::in_process);
    v.on_event("t1", "model.call", {{"step", 1}});
    v.on_event("t1", "model.delta", {{"text", "hel"}});
    v.on_event("t1", "model.delta", {{"text", "lo"}});
    v.on_event("t1", "model.result", {{"step", 1}});
    v.on_event("t1", "turn.finished", {{"status", "completed"}, {"reply", "hello"}});
    v.on_event("t2", "turn.finished", {{"status", "completed"}, {"reply", "direct\nanswer"}});
    BOOST_TEST(out.str() == "baton> hello\nbaton> direct\nanswer\n");
}

BOOST_AUTO_TEST_CASE(tools_steps_and_endings) {
    std::ostringstream out;
    chat_view v(out, chat_view::mode::in_process);
    v.on_event("t1", "model.delta", {{"text", "let me look"}});
    v.on_event("t1", "tool.call",
               {{"step", 1},
                {"call_id", "c1"},
                {"name", "weather"},
                {"arguments", "{ \"city\" : \"Paris\" }"}});
    std::string long_output = "down\n";
    long_output.append(300, 'x');
    v.on_event("t1", "tool.result", {{"call_id", "c1"}, {"ok", false}, {"output", long_output}});
    v.on_event("t1", "model.call", {{"step", 2}});
    v.on_event("t1", "turn.finished",
               {{"status", "failed"},
                {"reply", nullptr},
                {"error", {{"code", "model_error"}, {"message", "HTTP 500"}}}});
    v.on_event("t2", "turn.finished", {{"status", "stopped"}, {"reply", "partial"}});
    std::string expected = "baton> let me look\n"
                           "  [tool weather {\"city\":\"Paris\"}]\n"
                           "  [tool weather -> error: down ";
    expected.append(115, 'x');
    expected += "...]\n"
                "  [step 2]\n"
                "[failed: model_error: HTTP 500]\n"
                "baton> partial\n"
                "[stopped]\n";
    BOOST_TEST(out.str() == expected);
}

BOOST_AUTO_TEST_CASE(remote_prints_reply_frames_unless_already_streamed) {
    std::ostringstream out;
    chat_view v(out, chat_view::mode::remote);
    v.on_event("t1", "model.delta", {{"text", "streamed"}});
    v.on_event("t1", "turn.finished", {{"status", "completed"}, {"reply", "streamed"}});
    v.on_reply("t1", "streamed");
    v.on_event("t2", "turn.finished", {{"status", "completed"}, {"reply", "echo: hi"}});
    v.on_reply("t2", "echo: hi");
    v.on_reply("t0", "from an earlier chat");
    v.on_error("invalid_request", "text is empty");
    BOOST_TEST(out.str() == "baton> streamed\nbaton> echo: hi\nbaton> from an earlier chat\n"
                            "[error: invalid_request: text is empty]\n");
}

BOOST_AUTO_TEST_CASE(reasoning_is_one_folded_line_above_the_reply_and_not_in_it) {
    std::ostringstream out;
    chat_view v(out, chat_view::mode::in_process);
    v.on_event("t1", "model.call", {{"step", 1}});
    v.on_event("t1", "model.reasoning", {{"text", "The user greets me.\n"}});
    v.on_event("t1", "model.reasoning",
               {{"text", "  I should greet back, briefly and warmly, without any further questions."}});
    // Nothing shown while it thinks.
    BOOST_TEST(out.str() == "");
    v.on_event("t1", "model.delta", {{"text", "hel"}});
    v.on_event("t1", "model.delta", {{"text", "lo"}});
    v.on_event("t1", "model.result", {{"step", 1}});
    v.on_event("t1", "turn.finished", {{"status", "completed"}, {"reply", "hello"}});
    BOOST_TEST(out.str() ==
               "  [thinking: The user greets me. I should greet back, briefly and warmly,...]\n"
               "baton> hello\n");
}

BOOST_AUTO_TEST_CASE(reasoning_ends_at_a_tool_call_a_result_or_the_end_of_the_reply_line) {
    std::ostringstream out;
    chat_view v(out, chat_view::mode::in_process);
    v.on_event("t1", "model.call", {{"step", 1}});
    v.on_event("t1", "model.reasoning", {{"text", "need the time"}});
    v.on_event("t1", "tool.call", {{"call_id", "c1"}, {"name", "clock"}, {"arguments", "{}"}});
    v.on_event("t1", "tool.result", {{"call_id", "c1"}, {"ok", true}, {"output", "12:00"}});
    v.on_event("t1", "model.call", {{"step", 2}});
    v.on_event("t1", "model.reasoning", {{"text", " \n "}}); // blank: no line
    v.on_event("t1", "model.delta", {{"text", "It is "}});
    // Mid-reply reasoning does not break the reply's line.
    v.on_event("t1", "model.reasoning", {{"text", "late thought"}});
    v.on_event("t1", "model.delta", {{"text", "noon"}});
    v.on_event("t1", "model.result", {{"step", 2}});
    v.on_event("t1", "turn.finished", {{"status", "completed"}, {"reply", "It is noon"}});
    // A turn stopped while it thought still shows it, in remote mode too, and dim on a terminal.
    std::ostringstream remote;
    chat_view r(remote, chat_view::mode::remote, true);
    r.on_event("t2", "model.reasoning", {{"text", "hmm"}});
    r.on_event("t2", "turn.finished", {{"status", "stopped"}, {"reply", nullptr}});
    BOOST_TEST(out.str() == "  [thinking: need the time]\n"
                            "  [tool clock {}]\n"
                            "  [tool clock -> ok: 12:00]\n"
                            "  [step 2]\n"
                            "baton> It is noon\n"
                            "  [thinking: late thought]\n");
    BOOST_TEST(remote.str() == "\x1b[2m  [thinking: hmm]\x1b[0m\n[stopped]\n");
}

BOOST_AUTO_TEST_CASE(previews_are_one_line_and_cut_at_a_character_boundary) {
    BOOST_TEST(one_line_preview("  a\n\n b\tc ", 10) == "a b c");
    BOOST_TEST(one_line_preview("ab\xc3\xa9", 3) == "ab...");
    BOOST_TEST(one_line_preview("abcd", 4) == "abcd");
}

BOOST_AUTO_TEST_SUITE_END()
