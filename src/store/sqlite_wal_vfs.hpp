// The SQLite store's VFS: the default one, with the WAL's writes of a commit combined.
//
// SQLite writes every frame of a commit to the WAL as two pwrite calls, its 24-byte header and
// then the page, so a group commit of a few turns costs some twenty system calls. This VFS wraps
// the default VFS and, for a WAL file only, gathers contiguous writes in memory and hands them to
// the default VFS as one write when the commit frame (the one whose header carries the database
// size) is complete. The commit therefore reaches the kernel before SQLite publishes it in the
// WAL index, and a failed write fails the commit as it did before. Anything that looks at the WAL
// file (a read, its size, a sync, a truncate, a file control, closing) first writes what is
// pending, and so does a write elsewhere in the file or more than 1 MiB pending. The files on
// disk are exactly those of the default VFS; another process or connection may use either.
#pragma once

namespace baton::detail {

// The VFS's name, registered (not as the default) on the first call.
const char* sqlite_combining_vfs();

} // namespace baton::detail
