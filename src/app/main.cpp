// The `baton` command: serve, chat, check-config, --version, --help.
#include "channels/http/server.hpp"
#include "src/app/chat.hpp"
#include "src/app/serve.hpp"

#include <baton/auth.hpp>
#include <baton/config.hpp>
#include <baton/store.hpp>
#include <baton/types.hpp>

#include <boost/json/serialize.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* version = BATON_VERSION;

const char* usage_text = R"(usage: baton <command> [options]

commands:
  serve          run the daemon (HTTP API on 127.0.0.1:8080 by default)
  chat           terminal chat, in-process or with a running daemon (--url)
  check-config   validate a config file
  token          make a bearer token (token new) or hash one (token hash)
options:
  --version      print the version
  --help         this text; `baton <command> --help` for a command's options
)";

const char* serve_help =
    R"(usage: baton serve [--config FILE] [--listen HOST:PORT] [--data DIR] [--threads N]
                   [--insecure-no-auth]

  --config FILE        JSON config (docs/api.md); without it: agent "default", SQLite under --data,
                       the echo model unless BATON_MODEL=openai:<model>
  --listen HOST:PORT   listen address (default 127.0.0.1:8080; port 0 picks a free one)
  --data DIR           data directory for the SQLite store (default ./var)
  --threads N          io threads (default: hardware concurrency)
  --insecure-no-auth   allow a non-loopback address without server.tokens
Prints `listening on http://HOST:PORT` when ready; SIGTERM/SIGINT/SIGHUP drain and stop.
)";

const char* chat_help =
    R"(usage: baton chat [--session ID] [--config FILE] [--data DIR]
       baton chat [--session ID] --url URL [--token TOKEN] [--cacert FILE]

Reads messages from stdin, one per line, sends each to the session and prints what the turn does
as it happens: streamed text (`baton> ...`), tool calls and their results (`  [tool ...]`), later
model steps, and how a turn ended when it did not complete (`[failed: model_error: ...]`).
Lines starting with / are direct commands (/help, /model, /reset, /handoff, /stop).

  --session ID     the session (1-128 of A-Z a-z 0-9 . _ : @ -; default chat:$USER)
  --url URL        talk to a running daemon over its WebSocket channel: ws://HOST:PORT[/v1/ws]
                   or http://HOST:PORT (mapped to ws://HOST:PORT/v1/ws); wss:// or https:// for
                   a daemon with server.tls
  --token TOKEN    with --url: the bearer token (default: $BATON_TOKEN)
  --cacert FILE    with a wss:// or https:// URL: the PEM certificates to trust (a self-signed
                   daemon's certificate); default: the system's
  --config FILE    in-process: the JSON config (docs/api.md); without it the embedded default
                   (agent "default", the echo model unless BATON_MODEL=openai:<model>)
  --data DIR       in-process: keep the conversation in SQLite at DIR/baton.db (default: in
                   memory, gone at exit)
At the end of stdin it waits for every answer, then exits 0. Ctrl-C stops the running turn and
exits 130. Exit 2 for bad options, 1 when the daemon cannot be reached.
)";

const char* check_help = R"(usage: baton check-config FILE

Validates FILE and prints every error with its JSON path, then every warning (a token in clear
text; a non-loopback address with tokens but no TLS). Exit 0 valid (warnings or not), 2 invalid.
)";

const char* token_help = R"(usage: baton token new --tenant NAME [--scope tenant|admin]...
       baton token hash < TOKEN

  new    prints a fresh random bearer token on the first line and, on the second, the entry of
         server.tokens that holds only its SHA-256. Keep the token; put the entry in the config.
         --scope may be given more than once (default: tenant).
  hash   reads a token from stdin (one line) and prints its SHA-256, for a server.tokens entry.
)";

int usage_error(const std::string& msg, const char* help) {
    std::cerr << "baton: " << msg << "\n" << help;
    return 2;
}

// `--name value` or `--name=value` at args[i] (i moves past the value); false when it has none.
bool option_value(const std::vector<std::string>& args, std::size_t& i, std::string& name,
                  std::string& value) {
    const std::string& a = args[i];
    name = a;
    if (auto eq = a.find('='); a.starts_with("--") && eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        return true;
    }
    if (i + 1 >= args.size()) return false;
    value = args[++i];
    return true;
}

// The option at args[i], `--name value` or `--name=value`, one of `known`: nullopt, or the usage
// error's message (not an option of the command, no value, an empty --data).
std::optional<std::string> read_option(const std::vector<std::string>& args, std::size_t& i,
                                       std::initializer_list<std::string_view> known, std::string& name,
                                       std::string& value) {
    const std::string& a = args[i];
    name = a.substr(0, a.find('='));
    if (std::find(known.begin(), known.end(), name) == known.end())
        return (a.starts_with("-") ? "unknown option " : "unexpected argument ") + a;
    if (!option_value(args, i, name, value)) return a + " needs a value";
    if (name == "--data" && value.empty()) return "--data: expected a directory, not an empty string";
    return std::nullopt;
}

int serve(const std::vector<std::string>& args) {
    baton::serve_options opts;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--help" || a == "-h") {
            std::cout << serve_help;
            return 0;
        }
        if (a == "--insecure-no-auth") {
            opts.insecure_no_auth = true;
            continue;
        }
        std::string name, value;
        if (auto bad =
                read_option(args, i, {"--config", "--listen", "--data", "--threads"}, name, value))
            return usage_error(*bad, serve_help);
        if (name == "--config")
            opts.config_file = value;
        else if (name == "--listen") {
            // Checked as server.listen is: the refusal of a non-loopback address without tokens
            // must not be the first thing said about a malformed one.
            if (!baton::valid_listen_address(value))
                return usage_error("--listen: expected IP:PORT (an IPv4 address, [IPv6] or localhost; "
                                   "port 0..65535), not " +
                                       value,
                                   serve_help);
            opts.listen = value;
        } else if (name == "--data")
            opts.data_dir = value;
        else if (name == "--threads") {
            try {
                std::size_t used = 0;
                int n = std::stoi(value, &used);
                if (used != value.size() || n < 1 || n > 1024) throw std::invalid_argument(value);
                opts.threads = n;
            } catch (...) {
                return usage_error("--threads: expected an integer from 1 to 1024", serve_help);
            }
        } else {
            return usage_error("unknown option " + a, serve_help);
        }
    }
    return baton::run_daemon(opts);
}

int chat(const std::vector<std::string>& args) {
    baton::chat_options opts;
    opts.session = baton::default_chat_session();
    bool token_option = false; // --token X or --token=X, not BATON_TOKEN
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--help" || a == "-h") {
            std::cout << chat_help;
            return 0;
        }
        std::string name, value;
        if (auto bad =
                read_option(args, i, {"--session", "--url", "--config", "--data", "--token", "--cacert"},
                            name, value))
            return usage_error(*bad, chat_help);
        if (name == "--token") token_option = true;
        if (name == "--session")
            opts.session = value;
        else if (name == "--url")
            opts.url = value;
        else if (name == "--config")
            opts.config_file = value;
        else if (name == "--data")
            opts.data_dir = value;
        else if (name == "--token")
            opts.token = value;
        else if (name == "--cacert")
            opts.ca_file = value;
        else
            return usage_error("unknown option " + a, chat_help);
    }
    if (!opts.token) {
        if (const char* env = std::getenv("BATON_TOKEN"); env && *env) opts.token = env;
    }
    if (token_option && !opts.url)
        return usage_error("--token is for a daemon (--url), not the in-process chat", chat_help);
    if (opts.ca_file && !opts.url)
        return usage_error("--cacert is for a daemon (--url), not the in-process chat", chat_help);
    if (!baton::valid_session_id(opts.session))
        return usage_error("--session: expected 1-128 characters of A-Z a-z 0-9 . _ : @ -", chat_help);
    if (opts.url && (opts.config_file || opts.data_dir))
        return usage_error("--config and --data are for the in-process chat, not with --url", chat_help);
    return opts.url ? baton::run_remote_chat(opts) : baton::run_local_chat(opts);
}

int check_config(const std::vector<std::string>& args) {
    if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
        std::cout << check_help;
        return 0;
    }
    if (args.size() != 1) return usage_error("check-config takes one FILE", check_help);
    auto result = baton::load_config_file(args[0]);
    for (const auto& e : result.errors)
        std::cout << args[0] << ": " << e.to_string() << "\n";
    for (const auto& w : result.warnings)
        std::cout << args[0] << ": warning: " << w.to_string() << "\n";
    if (!result.errors.empty()) return 2;
    // The conninfo as libpq reads it at start (the value of conninfo_env when it is set here).
    if (result.cfg.storage.type == baton::storage_config::kind::postgres) {
        std::string path = "storage.postgres.conninfo", conninfo = result.cfg.storage.postgres_conninfo;
        if (const auto& env = result.cfg.storage.postgres_conninfo_env; !env.empty()) {
            const char* v = std::getenv(env.c_str());
            path = "storage.postgres.conninfo_env (" + env + ")";
            conninfo = v ? v : "";
        }
        try {
            if (auto why = conninfo.empty() ? std::nullopt : baton::postgres_conninfo_error(conninfo)) {
                std::cout << args[0] << ": " << path << ": " << *why << "\n";
                return 2;
            }
        } catch (const std::exception& e) {
            std::cout << args[0] << ": " << path << ": " << e.what() << "\n";
            return 2;
        }
    }
    // The files it names are read as `serve` would read them at start.
    if (const auto& tls = result.cfg.server.tls) {
        try {
            baton::check_tls_files(*tls);
        } catch (const std::exception& e) {
            std::cout << args[0] << ": " << e.what() << "\n";
            return 2;
        }
    }
    std::cout << args[0] << ": ok\n";
    return 0;
}

int token(const std::vector<std::string>& args) {
    if (args.empty() || args[0] == "--help" || args[0] == "-h") {
        std::cout << token_help;
        return args.empty() ? 2 : 0;
    }
    if (args[0] == "hash") {
        if (args.size() == 2 && (args[1] == "--help" || args[1] == "-h")) {
            std::cout << token_help;
            return 0;
        }
        if (args.size() != 1) return usage_error("token hash takes no options", token_help);
        std::string line;
        std::getline(std::cin, line);
        while (!line.empty() && (line.back() == '\r' || line.back() == ' '))
            line.pop_back();
        if (line.empty()) return usage_error("token hash: no token on stdin", token_help);
        std::cout << baton::sha256_hex(line) << "\n";
        return 0;
    }
    if (args[0] != "new") return usage_error("unknown token command " + args[0], token_help);
    std::string tenant;
    boost::json::array scopes;
    for (std::size_t i = 1; i < args.size(); ++i) {
        std::string name, value;
        if (args[i] == "--help" || args[i] == "-h") {
            std::cout << token_help;
            return 0;
        }
        if (!option_value(args, i, name, value))
            return usage_error(args[i] + " needs a value", token_help);
        if (name == "--tenant") {
            tenant = value;
        } else if (name == "--scope") {
            if (value != "tenant" && value != "admin")
                return usage_error("--scope: expected tenant or admin", token_help);
            if (std::find(scopes.begin(), scopes.end(), boost::json::value(value)) == scopes.end())
                scopes.emplace_back(value);
        } else {
            return usage_error("unknown option " + args[i], token_help);
        }
    }
    if (tenant.empty()) return usage_error("token new needs --tenant NAME", token_help);
    if (!baton::valid_tenant_name(tenant))
        return usage_error("--tenant: expected 1-64 characters of A-Z a-z 0-9 . _ -", token_help);
    if (scopes.empty()) scopes.emplace_back("tenant");
    auto t = baton::make_token();
    boost::json::object entry{{"sha256", baton::sha256_hex(t)}, {"tenant", tenant}, {"scopes", scopes}};
    std::cout << t << "\n" << boost::json::serialize(entry) << "\n";
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) return usage_error("no command", usage_text);
    std::string cmd = args.front();
    args.erase(args.begin());
    if (cmd == "--version" || cmd == "version") {
        std::cout << "baton " << version << "\n";
        return 0;
    }
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
        std::cout << usage_text;
        return 0;
    }
    if (cmd == "serve") return serve(args);
    if (cmd == "chat") return chat(args);
    if (cmd == "check-config") return check_config(args);
    if (cmd == "token") return token(args);
    return usage_error("unknown command " + cmd, usage_text);
}
