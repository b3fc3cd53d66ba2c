// A daemon whose default agent talks to a scripted fake OpenAI server (tests/fake_openai.hpp),
// driven through the public interfaces only.
#pragma once

#include "tests/daemon_fixture.hpp"
#include "tests/fake_openai.hpp"

namespace baton::test {

struct model_daemon : daemon_fixture {
    fake_openai model;

    // `limits` and `tools` as in the config; `agent_extra` keys are merged into the agent (e.g.
    // "admission"), `config_extra` keys into the file (e.g. "server", "channels").
    explicit model_daemon(json::object limits = {}, bool stream = false, json::object tools = {},
                          json::object agent_extra = {}, json::object config_extra = {})
        : daemon_fixture(deferred{}) {
        json::array allowed{"clock"};
        for (auto& kv : tools)
            allowed.emplace_back(kv.key());
        json::object agent{{"model",
                            {{"provider", "openai"},
                             {"base_url", model.base_url()},
                             {"model", "fake-1"},
                             {"stream", stream},
                             {"timeout_ms", 2000}}},
                           {"instructions", json::array{"You are a test agent."}},
                           {"tools", std::move(allowed)},
                           {"limits", std::move(limits)}};
        for (auto& kv : agent_extra) {
            // "model" keys are merged into the model object (e.g. a longer timeout_ms).
            if (kv.key() == "model" && kv.value().is_object()) {
                for (auto& m : kv.value().get_object())
                    agent["model"].as_object()[m.key()] = m.value();
                continue;
            }
            agent[kv.key()] = kv.value();
        }
        json::object cfg{{"storage", {{"sqlite", {{"path", (data_dir() / "baton.db").string()}}}}},
                         {"agents", {{"default", std::move(agent)}}},
                         {"tools", std::move(tools)}};
        for (auto& kv : config_extra)
            cfg[kv.key()] = kv.value();
        start({"--config", write_file("baton.json", json::serialize(cfg)).string()});
    }

    std::string post(std::string_view text, std::string_view sid = "s1") {
        auto r = post_message(sid, text);
        BOOST_REQUIRE_EQUAL(r.status, 202u);
        return std::string(r.json.at("turn_id").as_string());
    }
};

} // namespace baton::test
