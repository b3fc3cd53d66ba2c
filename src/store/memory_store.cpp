// The in-memory store: same semantics as the SQLite store (tests/store_test.cpp runs both), nothing
// survives the process. Used by tests, benches and embedders that need no durability.
#include <baton/json_text.hpp>
#include <baton/store.hpp>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include <pthread.h>

namespace baton {
namespace {

// Every critical section here is a few map operations: a waiter spins briefly (glibc's adaptive
// mutex) instead of sleeping in the kernel at once, which costs more than the section itself.
class short_mutex {
public:
    short_mutex() {
        pthread_mutexattr_t attr;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
        pthread_mutex_init(&m_, &attr);
        pthread_mutexattr_destroy(&attr);
    }
    ~short_mutex() { pthread_mutex_destroy(&m_); }
    short_mutex(const short_mutex&) = delete;
    short_mutex& operator=(const short_mutex&) = delete;
    void lock() { pthread_mutex_lock(&m_); }
    void unlock() { pthread_mutex_unlock(&m_); }

private:
    pthread_mutex_t m_;
};

// A payload as stored: a plain message ({"role", "text"} with a usual role, most of a tape) as its
// role's number and its raw text; anything else serialized.
constexpr std::array<std::string_view, 4> plain_roles{"user", "assistant", "system", "tool"};
struct packed_payload {
    std::uint8_t role = 0; // 1 + index in plain_roles; 0: `json` is the serialized payload
    std::string_view text; // a plain message's text (in the entry, which outlives this)
    std::string json;
    // What is stored (not kept as a view of `json`: moving a short string moves its bytes).
    std::string_view stored() const { return role ? text : std::string_view(json); }
};

packed_payload pack(const tape_entry& e) {
    packed_payload p;
    if (e.kind == tape_kind::message && e.payload.size() == 2) {
        const auto* kv = e.payload.begin();
        if (kv[0].key() == "role" && kv[1].key() == "text" && kv[0].value().is_string() &&
            kv[1].value().is_string()) {
            for (std::size_t i = 0; i < plain_roles.size(); ++i) {
                if (plain_roles[i] != kv[0].value().get_string()) continue;
                p.role = static_cast<std::uint8_t>(i + 1);
                p.text = kv[1].value().get_string();
                return p;
            }
        }
    }
    p.json = json_text(e.payload);
    return p;
}

// A session's tape, packed: each entry's payload is kept as text (see pack), and its turn id once per
// run of entries of the same turn, in append-only text chunks. An entry then costs ~48 bytes plus its
// text, not a JSON object with an allocation per key (a long-running process's memory store grew
// by ~600 bytes per turn, and the page faults of that growth were a quarter of a turn's time).
class packed_tape {
public:
    std::size_t size() const { return entries_.size(); }

    // Appends `e` (id, created_at and turn id already set) with its packed payload.
    void append(const tape_entry& e, const packed_payload& payload) {
        entry out{e.id, e.created_at, put(payload.stored()), {}, e.kind, payload.role};
        if (!entries_.empty() && text(entries_.back().turn) == e.turn_id)
            out.turn = entries_.back().turn;
        else
            out.turn = put(e.turn_id);
        entries_.push_back(out);
    }

    // The position of the first entry with an id greater than `id` (ids strictly increase).
    std::size_t after(std::int64_t id) const {
        auto it = std::upper_bound(entries_.begin(), entries_.end(), id,
                                   [](std::int64_t a, const entry& e) { return a < e.id; });
        return static_cast<std::size_t>(it - entries_.begin());
    }

    std::vector<tape_entry> unpack(std::size_t first, std::size_t n) const {
        std::vector<tape_entry> out;
        out.reserve(n);
        for (std::size_t i = first; i < first + n; ++i) {
            const auto& e = entries_[i];
            tape_entry t;
            t.id = e.id;
            t.kind = e.kind;
            t.created_at = e.created_at;
            t.turn_id = std::string(text(e.turn));
            if (e.role)
                t.payload = {{"role", plain_roles[e.role - 1u]}, {"text", text(e.payload)}};
            else
                t.payload = json::parse(text(e.payload)).as_object();
            out.push_back(std::move(t));
        }
        return out;
    }

private:
    struct text_ref {
        std::uint32_t chunk = 0, offset = 0, size = 0;
    };
    struct entry {
        std::int64_t id;
        time_ms created_at;
        text_ref payload;
        text_ref turn;
        tape_kind kind;
        std::uint8_t role; // packed_payload::role
    };

    text_ref put(std::string_view s) {
        if (chunks_.empty() || chunks_.back().capacity() - chunks_.back().size() < s.size()) {
            // Chunks start small (most sessions are short) and double up to 64 KiB; each is
            // reserved once and never reallocated.
            std::size_t next =
                chunks_.empty() ? 256 : std::min<std::size_t>(chunks_.back().capacity() * 2, 65536);
            chunks_.emplace_back();
            chunks_.back().reserve(std::max(next, s.size()));
        }
        auto& c = chunks_.back();
        text_ref r{static_cast<std::uint32_t>(chunks_.size() - 1), static_cast<std::uint32_t>(c.size()),
                   static_cast<std::uint32_t>(s.size())};
        c.append(s);
        return r;
    }
    std::string_view text(text_ref r) const {
        return std::string_view(chunks_[r.chunk]).substr(r.offset, r.size);
    }

    std::deque<entry> entries_;
    std::vector<std::string> chunks_;
};

struct session_data {
    session_record record;
    packed_tape tape;
    std::int64_t tape_next = 1;
};

struct idem_entry {
    std::string fingerprint;
    std::string turn_id;
};

class memory_store final : public store {
public:
    bool blocking() const override { return false; }

    insert_result insert_turn(const turn_record& t, const idempotency& idem) override {
        std::lock_guard<short_mutex> lock(mutex_);
        // A key is the tenant's: "<tenant>/<key>".
        std::string idem_key = idem.key.empty() ? std::string() : t.tenant + "/" + idem.key;
        if (!idem.key.empty())
            if (auto found = find_key(idem_key, idem)) return *found;
        // Checked before any change so that a failed insert leaves nothing behind, as a rollback would.
        if (turns_.contains(t.turn_id))
            throw std::runtime_error("memory store: turn id already exists: " + t.turn_id);
        turns_.emplace(t.turn_id, t);
        if (!is_terminal(t.status)) unfinished_.emplace(next_seq_, t.turn_id);
        seq_of_.emplace(t.turn_id, next_seq_++);
        if (!idem.key.empty())
            idem_.emplace(std::move(idem_key), idem_entry{idem.fingerprint, t.turn_id});

        auto& s = session(session_of(t), t.agent, t.created_at);
        s.record.turns += 1;
        s.record.last_turn_id = t.turn_id;
        return {insert_outcome::inserted, t.turn_id};
    }

    void mark_running(const std::string& turn_id, time_ms started_at) override {
        std::lock_guard<short_mutex> lock(mutex_);
        auto& t = find_turn(turn_id);
        t.status = turn_status::running;
        t.started_at = started_at;
        t.attempt += 1;
        track_unfinished(t);
    }

    void mark_side_effects(const std::string& turn_id) override {
        std::lock_guard<short_mutex> lock(mutex_);
        find_turn(turn_id).side_effects = true;
    }

    std::vector<outbox_item> end_turn(turn_end& e) override {
        // Checked first, so that a bad call changes nothing (as a rollback would).
        {
            std::lock_guard<short_mutex> lock(mutex_);
            for (const auto& t : e.finished)
                find_turn(t.turn_id);
        }
        return store::end_turn(e);
    }

    void save_state(state_update& u) override {
        // Packed before the lock is taken.
        std::vector<packed_payload> payloads;
        payloads.reserve(u.entries.size());
        for (const auto& e : u.entries)
            payloads.push_back(pack(e));
        std::lock_guard<short_mutex> lock(mutex_);
        auto& s = session({u.tenant, u.session_id}, "default", now_ms());
        for (std::size_t i = 0; i < u.entries.size(); ++i) {
            auto& e = u.entries[i];
            e.id = s.tape_next++;
            if (e.created_at == 0) e.created_at = now_ms();
            if (e.turn_id.empty()) e.turn_id = u.turn_id;
            s.tape.append(e, payloads[i]);
        }
        if (u.state) s.record.state = *u.state;
    }

    void finish_turn(const turn_record& t) override {
        std::lock_guard<short_mutex> lock(mutex_);
        auto& stored = find_turn(t.turn_id);
        stored.status = t.status;
        stored.reply = t.reply;
        stored.refusal = t.refusal;
        stored.steps = t.steps;
        stored.usage = t.usage;
        stored.error = t.error;
        stored.started_at = t.started_at;
        stored.finished_at = t.finished_at;
        stored.attempt = t.attempt;
        track_unfinished(stored);
    }

    std::optional<insert_result> find_idempotency(const std::string& tenant,
                                                  const idempotency& idem) override {
        std::lock_guard<short_mutex> lock(mutex_);
        return find_key(tenant + "/" + idem.key, idem);
    }

    std::optional<turn_record> get_turn(const std::string& turn_id) override {
        std::lock_guard<short_mutex> lock(mutex_);
        auto it = turns_.find(turn_id);
        if (it == turns_.end()) return std::nullopt;
        return it->second;
    }

    std::optional<session_record> get_session(const session_ref& session) override {
        auto key = session.key();
        std::lock_guard<short_mutex> lock(mutex_);
        auto it = sessions_.find(key);
        if (it == sessions_.end()) return std::nullopt;
        return it->second.record;
    }

    std::vector<tape_entry> read_tape(const session_ref& session, std::int64_t after,
                                      std::size_t limit) override {
        auto key = session.key();
        std::lock_guard<short_mutex> lock(mutex_);
        auto it = sessions_.find(key);
        if (it == sessions_.end()) return {};
        const auto& tape = it->second.tape;
        auto first = tape.after(after);
        return tape.unpack(first, std::min(limit, tape.size() - first));
    }

    std::vector<tape_entry> tape_tail(const session_ref& session, std::size_t limit) override {
        auto key = session.key();
        std::lock_guard<short_mutex> lock(mutex_);
        auto it = sessions_.find(key);
        if (it == sessions_.end()) return {};
        const auto& tape = it->second.tape;
        auto n = std::min(limit, tape.size());
        return tape.unpack(tape.size() - n, n);
    }

    std::vector<turn_record> unfinished_turns() override {
        std::lock_guard<short_mutex> lock(mutex_);
        std::vector<turn_record> out;
        out.reserve(unfinished_.size());
        for (const auto& [seq, id] : unfinished_)
            out.push_back(turns_.at(id));
        return out;
    }

    bool add_outbox(const outbox_item& item) override {
        std::lock_guard<short_mutex> lock(mutex_);
        auto [it, inserted] = outbox_.try_emplace(item.key, item);
        if (!inserted) return false;
        if (it->second.created_at == 0) it->second.created_at = now_ms();
        it->second.updated_at = it->second.created_at;
        outbox_order_.push_back(item.key);
        return true;
    }

    bool update_outbox(const outbox_item& item) override {
        std::lock_guard<short_mutex> lock(mutex_);
        auto it = outbox_.find(item.key);
        if (it == outbox_.end()) return false;
        it->second.status = item.status;
        it->second.attempts = item.attempts;
        it->second.uncertain = item.uncertain;
        it->second.next_attempt_at = item.next_attempt_at;
        it->second.last_error = item.last_error;
        it->second.updated_at = now_ms();
        return true;
    }

    std::optional<std::string> get_cursor(const std::string& name) override {
        std::lock_guard<short_mutex> lock(mutex_);
        auto it = cursors_.find(name);
        if (it == cursors_.end()) return std::nullopt;
        return it->second;
    }

    void set_cursor(const std::string& name, const std::string& value) override {
        std::lock_guard<short_mutex> lock(mutex_);
        cursors_[name] = value;
    }

    std::optional<outbox_item> get_outbox(const std::string& key) override {
        std::lock_guard<short_mutex> lock(mutex_);
        auto it = outbox_.find(key);
        if (it == outbox_.end()) return std::nullopt;
        return it->second;
    }

    std::vector<outbox_item> list_outbox(const outbox_filter& f) override {
        std::lock_guard<short_mutex> lock(mutex_);
        std::vector<outbox_item> out;
        for (const auto& key : outbox_order_) {
            if (out.size() >= f.limit) break;
            const auto& o = outbox_.at(key);
            if (matches(o, f)) out.push_back(o);
        }
        return out;
    }

    std::vector<usage_row> usage_by_day(const std::string& tenant, time_ms from) override {
        std::map<std::pair<std::string, std::int64_t>, usage_row> rows;
        std::lock_guard<short_mutex> lock(mutex_);
        for (const auto& [id, t] : turns_) {
            if (!t.finished_at || *t.finished_at < from) continue;
            if (!tenant.empty() && t.tenant != tenant) continue;
            auto day = *t.finished_at / 86'400'000;
            auto& r = rows[{t.tenant, day}];
            r.tenant = t.tenant;
            r.day = day;
            r.turns += 1;
            r.prompt_tokens += t.usage.prompt_tokens;
            r.completion_tokens += t.usage.completion_tokens;
        }
        std::vector<usage_row> out;
        for (auto& [k, r] : rows)
            out.push_back(std::move(r));
        return out;
    }

    outbox_counts count_outbox() override {
        std::lock_guard<short_mutex> lock(mutex_);
        outbox_counts n;
        for (const auto& [key, o] : outbox_)
            n.add(o);
        return n;
    }

private:
    // `key`: "<tenant>/<key>". Under mutex_.
    std::optional<insert_result> find_key(const std::string& key, const idempotency& idem) const {
        auto it = idem_.find(key);
        if (it == idem_.end()) return std::nullopt;
        auto outcome = it->second.fingerprint == idem.fingerprint ? insert_outcome::replayed
                                                                  : insert_outcome::key_reused;
        return insert_result{outcome, it->second.turn_id};
    }

    static bool matches(const outbox_item& o, const outbox_filter& f) {
        if (!f.statuses.empty() &&
            std::find(f.statuses.begin(), f.statuses.end(), o.status) == f.statuses.end())
            return false;
        if (f.uncertain_only && !o.uncertain) return false;
        if (!f.channel.empty() && o.channel != f.channel) return false;
        if (!f.tenant.empty() && o.tenant != f.tenant) return false;
        return f.session_id.empty() || o.session_id == f.session_id;
    }

    // The session row, created on first use with the given defaults (never overwritten later).
    session_data& session(const session_ref& ref, const std::string& agent, time_ms created_at) {
        auto [it, inserted] = sessions_.try_emplace(ref.key());
        if (inserted) {
            auto& r = it->second.record;
            r.session_id = ref.id;
            r.agent = agent;
            r.tenant = ref.tenant;
            r.created_at = created_at;
        }
        return it->second;
    }

    turn_record& find_turn(const std::string& turn_id) {
        auto it = turns_.find(turn_id);
        if (it == turns_.end()) throw std::runtime_error("memory store: unknown turn: " + turn_id);
        return it->second;
    }

    // Keeps the accept-ordered index of queued/running turns in step with a status change.
    void track_unfinished(const turn_record& t) {
        auto seq = seq_of_.at(t.turn_id);
        if (is_terminal(t.status))
            unfinished_.erase(seq);
        else
            unfinished_.emplace(seq, t.turn_id);
    }

    short_mutex mutex_;
    std::unordered_map<std::string, turn_record> turns_;
    std::unordered_map<std::string, std::int64_t> seq_of_;   // accept order of each turn
    std::map<std::int64_t, std::string> unfinished_;         // accept order -> turn id
    std::unordered_map<std::string, idem_entry> idem_;       // "<tenant>/<key>"
    std::unordered_map<std::string, session_data> sessions_; // by session_ref::key()
    std::int64_t next_seq_ = 1;
    std::unordered_map<std::string, outbox_item> outbox_;
    std::vector<std::string> outbox_order_; // creation order
    std::unordered_map<std::string, std::string> cursors_;
};

} // namespace

std::unique_ptr<store> make_memory_store() {
    return std::make_unique<memory_store>();
}

} // namespace baton
