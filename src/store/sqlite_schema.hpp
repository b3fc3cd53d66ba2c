// The SQLite store's schema: an ordered list of migrations, recorded in `PRAGMA user_version`.
// Kept apart from the store so the schema reads in one place and tests can check the versioning.
#pragma once

struct sqlite3;

namespace baton::detail {

// The schema version this build writes: the number of migrations.
int sqlite_schema_version();

// Applies the migrations the database has not seen yet, in one transaction; returns how many ran.
// Throws std::runtime_error on SQLite errors or when the database is newer than this build.
// `upto` (tests: a database as an older build left it) stops after that version.
int migrate_sqlite(sqlite3* db, int upto = -1);
// Throws when the file holds another program's tables (schema version 0): the store checks it
// before anything is written to the file, its journal mode included, and before migrate_sqlite.
void refuse_foreign_database(sqlite3* db);

} // namespace baton::detail
