// A store that passes every call to an inner memory store: tests derive from it to fail, count or
// delay just the calls they are about.
#pragma once

#include <baton/store.hpp>

#include <memory>

namespace baton::test {

class delegating_store : public store {
public:
    bool blocking() const override { return false; }
    insert_result insert_turn(const turn_record& t, const idempotency& i) override {
        return inner->insert_turn(t, i);
    }
    std::optional<insert_result> find_idempotency(const std::string& t, const idempotency& i) override {
        return inner->find_idempotency(t, i);
    }
    void mark_running(const std::string& id, time_ms at) override { inner->mark_running(id, at); }
    void mark_side_effects(const std::string& id) override { inner->mark_side_effects(id); }
    void save_state(state_update& u) override { inner->save_state(u); }
    void finish_turn(const turn_record& t) override { inner->finish_turn(t); }
    std::optional<turn_record> get_turn(const std::string& id) override { return inner->get_turn(id); }
    std::optional<session_record> get_session(const session_ref& s) override {
        return inner->get_session(s);
    }
    std::vector<tape_entry> read_tape(const session_ref& s, std::int64_t a, std::size_t l) override {
        return inner->read_tape(s, a, l);
    }
    std::vector<tape_entry> tape_tail(const session_ref& s, std::size_t l) override {
        return inner->tape_tail(s, l);
    }
    std::vector<turn_record> unfinished_turns() override { return inner->unfinished_turns(); }
    bool add_outbox(const outbox_item& o) override { return inner->add_outbox(o); }
    bool update_outbox(const outbox_item& o) override { return inner->update_outbox(o); }
    std::optional<outbox_item> get_outbox(const std::string& k) override { return inner->get_outbox(k); }
    std::vector<outbox_item> list_outbox(const outbox_filter& f) override {
        return inner->list_outbox(f);
    }
    outbox_counts count_outbox() override { return inner->count_outbox(); }
    std::vector<usage_row> usage_by_day(const std::string& t, time_ms from) override {
        return inner->usage_by_day(t, from);
    }
    std::optional<std::string> get_cursor(const std::string& n) override { return inner->get_cursor(n); }
    void set_cursor(const std::string& n, const std::string& v) override { inner->set_cursor(n, v); }

    std::unique_ptr<store> inner = make_memory_store();
};

} // namespace baton::test
