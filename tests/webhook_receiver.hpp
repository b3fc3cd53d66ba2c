// A webhook receiver for delivery tests: a Beast server on 127.0.0.1:0 with its own io_context
// thread, recording every POST (its Idempotency-Key and JSON body) and answering with the status
// the test chose (200 unless told otherwise), optionally after a delay or with a Retry-After.
#pragma once

#include "tests/fake_openai.hpp" // recorded_request

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace baton::test {

struct receiver_answer {
    unsigned status = 200;
    std::string retry_after; // sent as Retry-After when not empty
    std::chrono::milliseconds delay{0};
};

class webhook_receiver {
public:
    webhook_receiver();
    ~webhook_receiver();
    webhook_receiver(const webhook_receiver&) = delete;
    webhook_receiver& operator=(const webhook_receiver&) = delete;

    unsigned short port() const;
    std::string url(const std::string& path = "/hook") const;

    // Decides each answer (called on the receiver's thread); default: 200.
    void answer_with(std::function<receiver_answer(const recorded_request&)> f);
    // Every request received, in arrival order (answered or not).
    std::vector<recorded_request> requests() const;
    // How many requests carried each Idempotency-Key, counting only those answered 2xx.
    std::map<std::string, int> delivered_keys() const;
    // Waits (bounded) until `n` requests have been answered 2xx; false on timeout.
    bool wait_delivered(std::size_t n, std::chrono::milliseconds limit) const;

    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

} // namespace baton::test
