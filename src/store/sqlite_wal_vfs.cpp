// The combining VFS of sqlite_wal_vfs.hpp. Every method forwards to the default VFS's file; only
// a WAL file's writes are held back, and only until the commit frame, the next look at the file
// or a write elsewhere in it.
#include "src/store/sqlite_wal_vfs.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

namespace baton::detail {
namespace {

constexpr int frame_header_size = 24;                       // WAL_FRAME_HDRSIZE in SQLite's wal.c
constexpr std::size_t pending_limit = std::size_t{1} << 20; // a big transaction goes out in MiBs
// The unix VFS writes at most 128 KiB - 1 at a time (it masks the size with 0x1ffff: SQLite's
// own writes are pages), so what is pending goes out in pieces below that.
constexpr std::size_t write_limit = 124 * 1024;
constexpr std::size_t kept_capacity = 256 * 1024;

// What a WAL file holds back: one contiguous run of bytes, from `start`.
struct pending {
    std::string bytes;
    sqlite3_int64 start = 0;
    // Where the page of a commit frame goes whose header was the last write, else -1.
    sqlite3_int64 commit_page_at = -1;
};

// SQLite allocates vfs.szOsFile bytes for a file: this struct, then the default VFS's file.
struct file {
    sqlite3_file base; // pMethods: one of the tables below
    sqlite3_file* inner;
    pending* wal; // null unless this is a WAL file
};

constexpr std::size_t inner_offset = (sizeof(file) + alignof(std::max_align_t) - 1) /
                                     alignof(std::max_align_t) * alignof(std::max_align_t);

file* as_file(sqlite3_file* f) {
    return reinterpret_cast<file*>(f);
}
sqlite3_file* inner(sqlite3_file* f) {
    return as_file(f)->inner;
}
const sqlite3_io_methods& methods(sqlite3_file* f) {
    return *inner(f)->pMethods;
}

// A frame header's bytes 4..7 are the database's size in pages after a commit, 0 in other frames.
bool commit_header(const void* data, int n) {
    if (n != frame_header_size) return false;
    auto* b = static_cast<const unsigned char*>(data);
    return (b[4] | b[5] | b[6] | b[7]) != 0;
}

int flush(sqlite3_file* f) {
    pending* p = as_file(f)->wal;
    if (!p || p->bytes.empty()) return SQLITE_OK;
    int rc = SQLITE_OK;
    for (std::size_t at = 0; at < p->bytes.size() && rc == SQLITE_OK; at += write_limit) {
        auto n = std::min(write_limit, p->bytes.size() - at);
        rc = methods(f).xWrite(inner(f), p->bytes.data() + at, static_cast<int>(n),
                               p->start + static_cast<sqlite3_int64>(at));
    }
    // Failed or not, what was pending is SQLite's to write again: a failed commit is rolled back.
    // A big transaction's buffer is let go, so that an idle store holds a group commit's at most.
    if (p->bytes.capacity() > kept_capacity)
        std::string().swap(p->bytes);
    else
        p->bytes.clear();
    p->commit_page_at = -1;
    return rc;
}

int x_write(sqlite3_file* f, const void* data, int n, sqlite3_int64 off) {
    pending* p = as_file(f)->wal;
    if (!p || n <= 0) return methods(f).xWrite(inner(f), data, n, off);
    bool completes_commit = off == p->commit_page_at;
    if (!p->bytes.empty() && off != p->start + static_cast<sqlite3_int64>(p->bytes.size()))
        if (int rc = flush(f)) return rc;
    if (p->bytes.empty()) p->start = off;
    try {
        p->bytes.append(static_cast<const char*>(data), static_cast<std::size_t>(n));
    } catch (const std::bad_alloc&) {
        // Written at once instead; a commit header's page that follows is still caught below.
        if (int rc = flush(f)) return rc;
        if (int rc = methods(f).xWrite(inner(f), data, n, off)) return rc;
    }
    p->commit_page_at = commit_header(data, n) ? off + n : -1;
    if (completes_commit || p->bytes.size() >= pending_limit) return flush(f);
    return SQLITE_OK;
}

int x_close(sqlite3_file* f) {
    int flushed = flush(f);
    int rc = methods(f).xClose(inner(f));
    delete as_file(f)->wal;
    as_file(f)->wal = nullptr;
    return rc ? rc : flushed;
}

int x_read(sqlite3_file* f, void* data, int n, sqlite3_int64 off) {
    if (int rc = flush(f)) return rc;
    return methods(f).xRead(inner(f), data, n, off);
}
int x_truncate(sqlite3_file* f, sqlite3_int64 size) {
    if (int rc = flush(f)) return rc;
    return methods(f).xTruncate(inner(f), size);
}
int x_sync(sqlite3_file* f, int flags) {
    if (int rc = flush(f)) return rc;
    return methods(f).xSync(inner(f), flags);
}
int x_file_size(sqlite3_file* f, sqlite3_int64* size) {
    if (int rc = flush(f)) return rc;
    return methods(f).xFileSize(inner(f), size);
}
int x_file_control(sqlite3_file* f, int op, void* arg) {
    if (int rc = flush(f)) return rc;
    return methods(f).xFileControl(inner(f), op, arg);
}
int x_lock(sqlite3_file* f, int level) {
    return methods(f).xLock(inner(f), level);
}
int x_unlock(sqlite3_file* f, int level) {
    return methods(f).xUnlock(inner(f), level);
}
int x_check_reserved_lock(sqlite3_file* f, int* out) {
    return methods(f).xCheckReservedLock(inner(f), out);
}
int x_sector_size(sqlite3_file* f) {
    return methods(f).xSectorSize(inner(f));
}
int x_device_characteristics(sqlite3_file* f) {
    return methods(f).xDeviceCharacteristics(inner(f));
}
int x_shm_map(sqlite3_file* f, int region, int size, int extend, void volatile** out) {
    return methods(f).xShmMap(inner(f), region, size, extend, out);
}
int x_shm_lock(sqlite3_file* f, int offset, int n, int flags) {
    return methods(f).xShmLock(inner(f), offset, n, flags);
}
void x_shm_barrier(sqlite3_file* f) {
    methods(f).xShmBarrier(inner(f));
}
int x_shm_unmap(sqlite3_file* f, int delete_flag) {
    return methods(f).xShmUnmap(inner(f), delete_flag);
}
int x_fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** out) {
    return methods(f).xFetch(inner(f), off, n, out);
}
int x_unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
    return methods(f).xUnfetch(inner(f), off, p);
}

// One table per version of the default VFS's files, so that SQLite sees what they can do.
sqlite3_io_methods make_methods(int version) {
    sqlite3_io_methods m{};
    m.iVersion = version;
    m.xClose = x_close;
    m.xRead = x_read;
    m.xWrite = x_write;
    m.xTruncate = x_truncate;
    m.xSync = x_sync;
    m.xFileSize = x_file_size;
    m.xLock = x_lock;
    m.xUnlock = x_unlock;
    m.xCheckReservedLock = x_check_reserved_lock;
    m.xFileControl = x_file_control;
    m.xSectorSize = x_sector_size;
    m.xDeviceCharacteristics = x_device_characteristics;
    if (version >= 2) {
        m.xShmMap = x_shm_map;
        m.xShmLock = x_shm_lock;
        m.xShmBarrier = x_shm_barrier;
        m.xShmUnmap = x_shm_unmap;
    }
    if (version >= 3) {
        m.xFetch = x_fetch;
        m.xUnfetch = x_unfetch;
    }
    return m;
}
const sqlite3_io_methods methods_v1 = make_methods(1);
const sqlite3_io_methods methods_v2 = make_methods(2);
const sqlite3_io_methods methods_v3 = make_methods(3);

const sqlite3_io_methods* methods_for(const sqlite3_io_methods* m) {
    if (m->iVersion >= 3) return &methods_v3;
    // A version-2 table without shared memory would claim WAL support it does not have.
    if (m->iVersion == 2 && m->xShmMap) return &methods_v2;
    return &methods_v1;
}

sqlite3_vfs* base_of(sqlite3_vfs* vfs) {
    return static_cast<sqlite3_vfs*>(vfs->pAppData);
}

int v_open(sqlite3_vfs* vfs, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
    auto* w = as_file(f);
    w->inner = reinterpret_cast<sqlite3_file*>(reinterpret_cast<char*>(f) + inner_offset);
    w->wal = nullptr;
    w->inner->pMethods = nullptr;
    sqlite3_vfs* base = base_of(vfs);
    int rc = base->xOpen(base, name, w->inner, flags, out_flags);
    // As SQLite requires of xOpen: pMethods valid whenever there is a file to close, else null.
    f->pMethods = w->inner->pMethods ? methods_for(w->inner->pMethods) : nullptr;
    // Without memory for a buffer the WAL is written as the default VFS writes it.
    if (rc == SQLITE_OK && f->pMethods && (flags & SQLITE_OPEN_WAL)) w->wal = new (std::nothrow) pending;
    return rc;
}
int v_delete(sqlite3_vfs* vfs, const char* name, int sync_dir) {
    return base_of(vfs)->xDelete(base_of(vfs), name, sync_dir);
}
int v_access(sqlite3_vfs* vfs, const char* name, int flags, int* out) {
    return base_of(vfs)->xAccess(base_of(vfs), name, flags, out);
}
int v_full_pathname(sqlite3_vfs* vfs, const char* name, int n, char* out) {
    return base_of(vfs)->xFullPathname(base_of(vfs), name, n, out);
}
void* v_dl_open(sqlite3_vfs* vfs, const char* name) {
    return base_of(vfs)->xDlOpen(base_of(vfs), name);
}
void v_dl_error(sqlite3_vfs* vfs, int n, char* out) {
    base_of(vfs)->xDlError(base_of(vfs), n, out);
}
void (*v_dl_sym(sqlite3_vfs* vfs, void* handle, const char* symbol))(void) {
    return base_of(vfs)->xDlSym(base_of(vfs), handle, symbol);
}
void v_dl_close(sqlite3_vfs* vfs, void* handle) {
    base_of(vfs)->xDlClose(base_of(vfs), handle);
}
int v_randomness(sqlite3_vfs* vfs, int n, char* out) {
    return base_of(vfs)->xRandomness(base_of(vfs), n, out);
}
int v_sleep(sqlite3_vfs* vfs, int us) {
    return base_of(vfs)->xSleep(base_of(vfs), us);
}
int v_current_time(sqlite3_vfs* vfs, double* out) {
    return base_of(vfs)->xCurrentTime(base_of(vfs), out);
}
int v_get_last_error(sqlite3_vfs* vfs, int n, char* out) {
    return base_of(vfs)->xGetLastError ? base_of(vfs)->xGetLastError(base_of(vfs), n, out) : 0;
}
int v_current_time_int64(sqlite3_vfs* vfs, sqlite3_int64* out) {
    return base_of(vfs)->xCurrentTimeInt64(base_of(vfs), out);
}
int v_set_system_call(sqlite3_vfs* vfs, const char* name, sqlite3_syscall_ptr p) {
    return base_of(vfs)->xSetSystemCall(base_of(vfs), name, p);
}
sqlite3_syscall_ptr v_get_system_call(sqlite3_vfs* vfs, const char* name) {
    return base_of(vfs)->xGetSystemCall(base_of(vfs), name);
}
const char* v_next_system_call(sqlite3_vfs* vfs, const char* name) {
    return base_of(vfs)->xNextSystemCall(base_of(vfs), name);
}

sqlite3_vfs combining;

void register_vfs() {
    sqlite3_vfs* base = sqlite3_vfs_find(nullptr);
    if (!base) throw std::runtime_error("sqlite: no default VFS");
    combining.iVersion = std::min(base->iVersion, 3);
    combining.szOsFile = static_cast<int>(inner_offset) + base->szOsFile;
    combining.mxPathname = base->mxPathname;
    combining.zName = "baton-wal";
    combining.pAppData = base;
    combining.xOpen = v_open;
    combining.xDelete = v_delete;
    combining.xAccess = v_access;
    combining.xFullPathname = v_full_pathname;
    combining.xDlOpen = v_dl_open;
    combining.xDlError = v_dl_error;
    combining.xDlSym = v_dl_sym;
    combining.xDlClose = v_dl_close;
    combining.xRandomness = v_randomness;
    combining.xSleep = v_sleep;
    combining.xCurrentTime = v_current_time;
    combining.xGetLastError = v_get_last_error;
    if (combining.iVersion >= 2) combining.xCurrentTimeInt64 = v_current_time_int64;
    if (combining.iVersion >= 3) {
        combining.xSetSystemCall = v_set_system_call;
        combining.xGetSystemCall = v_get_system_call;
        combining.xNextSystemCall = v_next_system_call;
    }
    if (sqlite3_vfs_register(&combining, 0) != SQLITE_OK)
        throw std::runtime_error("sqlite: cannot register the baton-wal VFS");
}

} // namespace

const char* sqlite_combining_vfs() {
    static std::once_flag once;
    std::call_once(once, register_vfs);
    return combining.zName;
}

} // namespace baton::detail
