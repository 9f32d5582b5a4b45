//! SQLite: the PostgreSQL statements in SQLite's dialect, times as integer microseconds of
//! `unixepoch('subsec')`, WAL journal and a busy timeout so that several processes share a file.

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::unpoisoned;
use distlock_core::{Error, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Executor, Row, SqlSafeStr};

use crate::backend::SqlPool;
use crate::config::SqlConfig;
use crate::db::Db;
use crate::dialect::{Common, CommonStatements, DataColumn, Sql, granted_to, q};
use crate::error::{connect_err, map_err, shape_err, sqlite_busy};
use crate::hot::HotConns;
use crate::keys::quote;
use crate::kinds::{HolderSql, Holds, holders_table};
use crate::pool::open_pool;
use crate::renew::{BySize, LIST_MAX_BATCH, Renewal, padded, renewed_by_rows, too_many};

/// The text of [`NOW`], for the constants built from it.
macro_rules! clock {
    () => {
        "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"
    };
}

/// The database's clock in microseconds since the Unix epoch: lease ends, and the first
/// version of a new row (see the crate docs, "A store emptied or recreated").
const NOW: &str = clock!();

/// The instant a lease starts from: the clock's reading rounded up. `unixepoch('subsec')` has
/// millisecond resolution, truncated, so [`NOW`] may stand up to a millisecond before the
/// statement ran; a lease of `ttl` from it then ended up to a millisecond before `ttl` after
/// the request was sent (in-process SQLite answers within well under a millisecond), before
/// the `valid_until` its client computed with no drift margin. Reservations, hints, keep
/// [`NOW`].
const LEASE_FROM: &str = concat!("(", clock!(), " + 1000)");

/// What is left of a live lease (`expires_at` above [`NOW`]), in microseconds: counted from
/// [`LEASE_FROM`], so never more than the ttl right after a take (a reading in the take's
/// millisecond says the whole ttl), never more than the server's lease; 0 in its last
/// millisecond.
const LEFT: &str = concat!("max(expires_at - (", clock!(), " + 1000), 0)");

/// The lock table's statements in this dialect; with `data` (the table has the `data`
/// column), holds carry data, which every take, release, abandon and forced release clears.
fn statements(table: &str, data: DataColumn) -> (Sql, HolderSql) {
    let t = quote(table, '"');
    let clear_data = data.clear();
    let peek_columns = format!(
        "owner, version, CASE WHEN owner IS NOT NULL AND expires_at > {NOW} \
         THEN {LEFT} END, next_owner, next_since, \
         CASE WHEN next_owner IS NOT NULL AND next_expires > {NOW} THEN next_expires - {NOW} END"
    );
    let peek = format!("SELECT {peek_columns} FROM {t} WHERE name = ?1");
    let sql = Sql {
            take: format!(
                "INSERT INTO {t} AS l (name, owner, version, expires_at) VALUES (?1, ?2, {NOW}, {LEASE_FROM} + ?3) \
                 ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, version = l.version + 1, \
                 expires_at = excluded.expires_at, next_owner = NULL, next_since = NULL, next_expires = NULL{clear_data} \
                 WHERE (l.owner IS NULL OR l.owner = excluded.owner OR l.expires_at <= {NOW}) \
                 AND (l.next_owner IS NULL OR l.next_owner = excluded.owner OR l.next_expires <= {NOW}) \
                 RETURNING version, owner"
            )
            .into(),
            peek: peek.as_str().into(),
            reserve: format!(
                "UPDATE {t} SET next_since = ?1, next_expires = {NOW} + ?2, next_owner = ?3 \
                 WHERE name = ?4 AND (next_owner IS NULL OR next_owner = ?5 OR next_expires <= {NOW} \
                 OR next_since > ?6)"
            )
            .into(),
            renew: format!(
                "UPDATE {t} SET expires_at = {LEASE_FROM} + ?1 \
                 WHERE name = ?2 AND owner = ?3 AND version = ?4 AND expires_at > {NOW}"
            )
            .into(),
            release: format!(
                "UPDATE {t} SET owner = NULL, expires_at = {NOW}{clear_data} \
                 WHERE name = ?1 AND owner = ?2 AND version = ?3 AND expires_at > {NOW}"
            )
            .into(),
            abandon: format!(
                "UPDATE {t} SET \
                 expires_at = CASE WHEN owner = ?1 THEN {NOW} ELSE expires_at END, \
                 owner = CASE WHEN owner = ?2 THEN NULL ELSE owner END, \
                 next_expires = CASE WHEN next_owner = ?3 THEN NULL ELSE next_expires END, \
                 next_since = CASE WHEN next_owner = ?4 THEN NULL ELSE next_since END, \
                 next_owner = CASE WHEN next_owner = ?5 THEN NULL ELSE next_owner END{} \
                 WHERE name = ?6 AND (owner = ?7 OR next_owner = ?8)",
                if data.0 { ", data = CASE WHEN owner = ?2 THEN NULL ELSE data END" } else { "" }
            )
            .into(),
            force: format!(
                "UPDATE {t} SET owner = NULL, expires_at = {NOW}{clear_data} \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {NOW}"
            )
            .into(),
            list: format!(
                "SELECT name, owner, version, {LEFT}, {} \
                 FROM {t} WHERE owner IS NOT NULL AND expires_at > {NOW} \
                 AND substr(name, 1, length(?1)) = ?2 ORDER BY name LIMIT ?3",
                data.select()
            )
            .into(),
            inspect: format!(
                "SELECT {peek_columns}, {} FROM {t} WHERE name = ?1",
                data.select()
            )
            .into(),
            set_data: data.0.then(|| {
                format!(
                    "UPDATE {t} SET data = ?1 \
                     WHERE name = ?2 AND owner = ?3 AND version = ?4 AND expires_at > {NOW}"
                )
                .into()
            }),
        };
    (sql, holder_statements(table, &peek, data))
}

/// The batched renewal's statement (see [`crate::renew`]), by padded list size. ARGS: name,
/// owner, version, ttl_us for each lease (`NULL`s for padding). Returns the renewed rows'
/// `name, owner, version` (an `UPDATE .. FROM`'s `RETURNING` sees the updated table only).
fn renew_many_sql(table: &str) -> BySize {
    let t = quote(table, '"');
    BySize::new(LIST_MAX_BATCH, |rows| {
        let list = (0..rows)
            .map(|i| {
                let n = 4 * i;
                format!("(?{}, ?{}, ?{}, ?{})", n + 1, n + 2, n + 3, n + 4)
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "WITH v(name, owner, version, ttl) AS (VALUES {list}) \
             UPDATE {t} AS l SET expires_at = {LEASE_FROM} + v.ttl FROM v \
             WHERE l.name = v.name AND l.owner = v.owner AND l.version = v.version \
             AND l.expires_at > {NOW} RETURNING name, owner, version"
        )
    })
}

/// The holders' statements (see [`crate::kinds`]). The
/// transaction's `BEGIN IMMEDIATE` locks the file, so the row is read without `FOR UPDATE`.
/// `data`: whether the lock table has the `data` column, cleared when the row gets the
/// marker or is freed.
fn holder_statements(table: &str, peek: &str, data: DataColumn) -> HolderSql {
    let t = quote(table, '"');
    let h = quote(&holders_table(table), '"');
    let clear_data = data.clear();
    let live = format!("FROM {h} WHERE name = ?1 AND expires_at > {NOW}");
    let info = |data: &str| {
        format!(
            "SELECT owner, token, {LEFT}, (SELECT count(*) {live}), {data} \
             FROM {h} WHERE name = ?2 AND expires_at > {NOW} ORDER BY token DESC LIMIT 1"
        )
    };
    let setup = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {h} (name TEXT NOT NULL, owner TEXT NOT NULL, \
             token INTEGER NOT NULL, expires_at INTEGER NOT NULL, permits INTEGER NOT NULL, \
             data TEXT, PRIMARY KEY (name, owner)) WITHOUT ROWID"
        )
        .into(),
    ];
    HolderSql {
        lock: peek.into(),
        ensure: format!(
            "INSERT INTO {t} (name, owner, version, expires_at) VALUES (?1, NULL, {NOW}, {NOW}) \
             ON CONFLICT (name) DO NOTHING"
        )
        .into(),
        purge: format!("DELETE FROM {h} WHERE name = ?1 AND (expires_at <= {NOW} OR owner = ?2)")
            .into(),
        purge_all: format!("DELETE FROM {h} WHERE name = ?1").into(),
        count: format!("SELECT count(*), min({LEFT}) {live}").into(),
        mark: format!(
            "UPDATE {t} SET owner = ?1, version = version + 1, expires_at = max(expires_at, {LEASE_FROM} + ?2), \
             next_since = CASE WHEN next_owner = ?3 THEN NULL ELSE next_since END, \
             next_expires = CASE WHEN next_owner = ?4 THEN NULL ELSE next_expires END, \
             next_owner = CASE WHEN next_owner = ?5 THEN NULL ELSE next_owner END{clear_data} \
             WHERE name = ?6"
        )
        .into(),
        insert: format!(
            "INSERT INTO {h} (name, owner, token, expires_at, permits) \
             VALUES (?1, ?2, ?3, {LEASE_FROM} + ?4, ?5)"
        )
        .into(),
        extend: format!(
            "UPDATE {h} SET expires_at = {LEASE_FROM} + ?1 \
             WHERE name = ?2 AND owner = ?3 AND token = ?4 AND expires_at > {NOW}"
        )
        .into(),
        stretch: format!(
            "UPDATE {t} SET expires_at = max(expires_at, {LEASE_FROM} + ?1) WHERE name = ?2"
        )
        .into(),
        leave: format!(
            "DELETE FROM {h} WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > {NOW}"
        )
        .into(),
        free: format!("UPDATE {t} SET owner = NULL, expires_at = {NOW}{clear_data} WHERE name = ?1")
            .into(),
        shrink: format!(
            "UPDATE {t} SET expires_at = coalesce((SELECT max(expires_at) {live}), {NOW}) \
             WHERE name = ?2"
        )
        .into(),
        info: info("data").into(),
        info_without_data: info("NULL").into(),
        set_data: format!(
            "UPDATE {h} SET data = ?1 \
             WHERE name = ?2 AND owner = ?3 AND token = ?4 AND expires_at > {NOW}"
        )
        .into(),
        has_data: data_columns(&holders_table(table)).into(),
        // The table a `CREATE` makes is the one found.
        set_up: None,
        add_data: format!("ALTER TABLE {h} ADD COLUMN data TEXT").into(),
        notify: None,
        setup,
    }
}

#[derive(Debug)]
pub(crate) struct LiteDb {
    common: Common<sqlx::Sqlite>,
    /// The batched renewal, by list size.
    renew_many: BySize,
    /// The database file, watched for deletion or replacement (a file of a pool of ours).
    watch: Option<Arc<FileWatch>>,
}

/// The database file of a pool, checked before each statement: deleted, or replaced by another
/// file at the same path (a new file after a deletion), the old one lives on in the
/// connections that have it open, in WAL mode without any error. Their locks are then on a
/// file nobody else sees, and a renewal there would keep a lease that is gone. So the
/// connections opened before the change are closed (the pool's idle ones when next taken out,
/// through the pool's `before_acquire`), new ones open the file at the path, and their first
/// statement creates the tables again (when `create_table` allows): the holder's renewal finds
/// no row and is refused, new acquisitions meet the other clients of the new file.
#[derive(Debug)]
struct FileWatch {
    path: std::path::PathBuf,
    /// The file's identity when last seen; `None`: it was missing then.
    seen: Mutex<Option<FileId>>,
    /// When a change was last seen: connections older than that are to the old file.
    changed_at: Arc<Mutex<Option<std::time::Instant>>>,
}

/// What tells two files at one path apart: (device, inode).
type FileId = (u64, u64);

impl FileWatch {
    /// Watches the file at `path`, as it is now; `changed_at` is shared with the pool.
    fn new(path: std::path::PathBuf, changed_at: Arc<Mutex<Option<std::time::Instant>>>) -> Self {
        let seen = Mutex::new(file_id(&path));
        Self {
            path,
            seen,
            changed_at,
        }
    }

    /// Whether the file at the path is no longer the one seen before: deleted, or another
    /// file. A file found where none was (a new one after a change) is taken as the file.
    fn changed(&self) -> bool {
        let now = file_id(&self.path);
        let mut seen = unpoisoned(&self.seen);
        let changed = seen.is_some() && *seen != now;
        *seen = now;
        if changed {
            *unpoisoned(&self.changed_at) = Some(std::time::Instant::now());
        }
        changed
    }

    /// Whether a pooled connection of `age` was opened before the last change seen.
    fn stale(changed_at: &Mutex<Option<std::time::Instant>>, age: Duration) -> bool {
        unpoisoned(changed_at).is_some_and(|at| age >= at.elapsed())
    }
}

#[cfg(unix)]
fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Elsewhere no identity: the file is not watched.
#[cfg(not(unix))]
fn file_id(_path: &Path) -> Option<FileId> {
    None
}

impl LiteDb {
    pub(crate) async fn open(config: &SqlConfig) -> Result<Self> {
        // A database this process cannot write takes no lock: say so now, with the path and
        // the cause, rather than as SQLite's "unable to open database file" or at the first
        // acquire. A URL that asks for read-only access (mode=ro, immutable) gets it.
        let file = config.sqlite_file();
        if let Some(file) = file.as_deref() {
            let check_writes = !read_only_asked(&config.url);
            let why = missing_place(file)
                .or_else(|| check_writes.then(|| unwritable_files(file)).flatten());
            if let Some(why) = why {
                return Err(cannot_open(file, &why));
            }
        }
        let memory = config.url.contains(":memory:");
        let options = SqliteConnectOptions::from_str(&config.url)
            .map_err(|e| {
                Error::InvalidConfig(format!("bad SQLite URL {}: {e}", config.redacted_url()))
            })?
            .create_if_missing(true)
            .busy_timeout(config.busy_timeout)
            .synchronous(if config.sync_full {
                SqliteSynchronous::Full
            } else {
                SqliteSynchronous::Normal
            });
        let options = if memory {
            options
        } else {
            options.journal_mode(SqliteJournalMode::Wal)
        };
        let timeout = config.effective_connect_timeout();
        let mut pool = SqlitePoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(timeout / 2)
            .test_before_acquire(false);
        let changed_at: Arc<Mutex<Option<std::time::Instant>>> = Arc::default();
        if file.is_some() {
            let changed = changed_at.clone();
            pool = pool.before_acquire(move |_, meta| {
                let fresh = !FileWatch::stale(&changed, meta.age);
                Box::pin(async move { Ok(fresh) })
            });
            // After a change, a new connection may open a new, empty file.
            let changed_at = changed_at.clone();
            let tables = if config.create_table {
                table_setup(&config.table)
            } else {
                Vec::new()
            };
            pool = pool.after_connect(move |conn, _| {
                let tables = if unpoisoned(&changed_at).is_some() {
                    tables.clone()
                } else {
                    Vec::new()
                };
                Box::pin(async move {
                    for create in tables {
                        conn.execute(AssertSqlSafe(create)).await?;
                    }
                    Ok(())
                })
            });
        }
        if memory {
            // The database lives as long as a connection does.
            pool = pool
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let patience = config.busy_timeout;
        let pool = while_busy(patience, || {
            open_pool(pool.clone(), options.clone(), timeout / 4)
        })
        .await
        .map_err(|e| unusable_file(config, &e).unwrap_or_else(|| connect_err(config, e)))?;
        let mut db = Self::on_pool(pool, config, config.max_connections / 2).await?;
        // The file exists now: the one to watch.
        db.watch = file.map(|file| Arc::new(FileWatch::new(file, changed_at)));
        Ok(db)
    }

    /// The statements, after a look at the database file (see [`FileWatch`]).
    fn watched(&self) -> &Common<sqlx::Sqlite> {
        if let Some(watch) = &self.watch
            && watch.changed()
        {
            tracing::warn!(
                file = %watch.path.display(),
                "the SQLite database file was deleted or replaced: its locks are gone, \
                 going on with the file now at that path"
            );
            self.common.conns.forget_kept();
        }
        &self.common
    }

    /// Sets up the lock table and its statements on `pool`, keeping at most `keep`
    /// connections checked out between statements (see [`HotConns`]).
    pub(crate) async fn on_pool(
        pool: sqlx::SqlitePool,
        config: &SqlConfig,
        keep: u32,
    ) -> Result<Self> {
        let patience = config.busy_timeout;
        let table = quote(&config.table, '"');
        if config.create_table {
            let create = lock_table(&config.table);
            while_busy(patience, || pool.execute(AssertSqlSafe(create.clone())))
                .await
                .map_err(|e| {
                    unusable_file(config, &e)
                        .unwrap_or_else(|| map_err(&format!("creating the lock table {table}"), e))
                })?;
        }
        let data = has_data(&pool, &config.table, patience).await?;
        let data = if data || !config.create_table {
            data
        } else {
            // A table of an earlier version: the column of the holder data. Another client
            // may have added it meanwhile (a duplicate column).
            let alter = format!("ALTER TABLE {table} ADD COLUMN data TEXT");
            let added = while_busy(patience, || pool.execute(AssertSqlSafe(alter.clone()))).await;
            let data = has_data(&pool, &config.table, patience).await?;
            if let Err(err) = added
                && !data
            {
                return Err(map_err(&format!("adding data to {table}"), err));
            }
            data
        };
        let (sql, holds) = statements(&config.table, DataColumn(data));
        let holds = Holds::new(holds, config.create_table);
        let renew_many = renew_many_sql(&config.table);
        for statement in sql.prepared().into_iter().chain(renew_many.first()) {
            while_busy(patience, || {
                pool.prepare(AssertSqlSafe(statement.clone()).into_sql_str())
            })
            .await
            .map_err(|e| shape_err(&table, e))?;
        }
        Ok(Self {
            common: Common {
                conns: HotConns::new(pool, keep),
                sql,
                holds,
                routines: None,
            },
            renew_many,
            watch: None,
        })
    }
}

/// The statement that creates the lock table.
fn lock_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
         version INTEGER NOT NULL, expires_at INTEGER NOT NULL, next_owner TEXT, \
         next_since INTEGER, next_expires INTEGER, data TEXT) WITHOUT ROWID",
        quote(table, '"')
    )
}

/// The statement that counts the `data` columns (0 or 1) of `table` (unquoted, maybe
/// `schema.table`; plain identifiers, safe in literals).
fn data_columns(table: &str) -> String {
    let source = match table.split_once('.') {
        Some((schema, name)) => format!("pragma_table_info('{name}', '{schema}')"),
        None => format!("pragma_table_info('{table}')"),
    };
    format!("SELECT count(*) FROM {source} WHERE name = 'data'")
}

/// Whether the lock table has the `data` column: a table created by an earlier version and
/// not altered (`create_table` off) has not, and its holds carry no data.
async fn has_data(pool: &sqlx::SqlitePool, table: &str, patience: Duration) -> Result<bool> {
    let sql = data_columns(table);
    let found: i64 = while_busy(patience, || {
        sqlx::query_scalar(AssertSqlSafe(sql.clone())).fetch_one(pool)
    })
    .await
    .map_err(|e| map_err(&format!("reading the columns of {table}"), e))?;
    Ok(found > 0)
}

/// The statements that create every table: the lock table and the holders'.
fn table_setup(table: &str) -> Vec<String> {
    let (_, holds) = statements(table, DataColumn(true));
    std::iter::once(lock_table(table))
        .chain(holds.setup.iter().map(|s| s.to_string()))
        .collect()
}

/// The error of a database file SQLite cannot open or write: the path and the cause, as a
/// configuration error (the file, its directory or their permissions are the caller's to fix).
fn cannot_open(file: &Path, why: &str) -> Error {
    Error::InvalidConfig(format!(
        "cannot open the SQLite database {}: {why}",
        file.display()
    ))
}

/// When SQLite answers that it cannot open the file (`SQLITE_CANTOPEN`, "unable to open
/// database file") or cannot write it (`SQLITE_READONLY`), the cause found on the file system,
/// as [`cannot_open`]; `None` for another error, or when the file system shows no cause.
fn unusable_file(config: &SqlConfig, err: &sqlx::Error) -> Option<Error> {
    let sqlx::Error::Database(db) = err else {
        return None;
    };
    let code = db.code()?.parse::<i32>().ok()?;
    if !matches!(code & 0xff, 8 | 14) {
        return None;
    }
    let file = config.sqlite_file()?;
    let writes = !read_only_asked(&config.url);
    let absent = || {
        (!writes && !file.exists()).then(|| {
            "the file does not exist (a read-only URL, mode=ro or immutable, creates none)"
                .to_owned()
        })
    };
    let asked = || {
        (!writes && code & 0xff == 8).then(|| {
            "its URL opens it read-only (mode=ro or immutable), and a lock needs writes".to_owned()
        })
    };
    let why = missing_place(&file)
        .or_else(absent)
        .or_else(|| writes.then(|| unwritable_files(&file)).flatten())
        .or_else(|| closed_directory(&file))
        .or_else(asked)?;
    Some(cannot_open(&file, &why))
}

/// Whether a SQLite URL opens its file read-only (`mode=ro`, `immutable=true`).
fn read_only_asked(url: &str) -> bool {
    let query = url.split_once('?').map_or("", |(_, query)| query);
    url::form_urlencoded::parse(query.as_bytes()).any(|(key, value)| {
        (key == "mode" && value == "ro") || (key == "immutable" && matches!(&*value, "true" | "1"))
    })
}

/// The directory of `file` as SQLite sees it (`.` for a bare file name).
fn directory_of(file: &Path) -> &Path {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Why `file` cannot be where it is: its directory is missing or not a directory, or the
/// path names a directory. Checked before connecting: it needs no write.
fn missing_place(file: &Path) -> Option<String> {
    let dir = directory_of(file);
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => return Some(format!("{} is not a directory", dir.display())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!("the directory {} does not exist", dir.display()));
        }
        Err(e) => {
            return Some(format!(
                "the directory {} cannot be reached: {}",
                dir.display(),
                distlock_core::io_cause(&e).unwrap_or_default()
            ));
        }
    }
    std::fs::metadata(file)
        .is_ok_and(|meta| meta.is_dir())
        .then(|| format!("{} is a directory, not a database file", file.display()))
}

/// Why this process cannot write `file` or its `-wal` and `-shm` files (WAL mode), of those
/// that exist. Opening them for writing changes nothing.
fn unwritable_files(file: &Path) -> Option<String> {
    let os = |e: &std::io::Error| distlock_core::io_cause(e).unwrap_or_default();
    let name = file.file_name()?.to_string_lossy().into_owned();
    for path in [
        file.to_path_buf(),
        file.with_file_name(format!("{name}-wal")),
        file.with_file_name(format!("{name}-shm")),
    ] {
        if !path.exists() {
            continue;
        }
        if let Err(e) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            return Some(match e.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    format!("{} is read-only for this user ({})", path.display(), os(&e))
                }
                _ => format!("{} cannot be written ({})", path.display(), os(&e)),
            });
        }
    }
    None
}

/// Why this process cannot create files in the directory of `file` (SQLite creates the file
/// when missing, and its `-wal` and `-shm` files), tried with a file of its own removed at
/// once: only after SQLite has failed.
fn closed_directory(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_string_lossy().into_owned();
    let dir = directory_of(file);
    let probe = dir.join(format!(".{name}.distlock-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
        Err(e) => Some(format!(
            "the directory {} takes no new files ({}): SQLite creates {name}-wal and \
             {name}-shm next to the database",
            dir.display(),
            distlock_core::io_cause(&e).unwrap_or_default()
        )),
    }
}

/// Runs a setup step again while the file is busy, for up to `patience`.
///
/// The busy timeout does not cover every contended step: SQLite answers `BUSY` at once, without
/// calling the busy handler, where waiting could deadlock, as when two processes open a new file
/// together and both switch it to WAL. Such a step succeeds once the other process is done.
async fn while_busy<T, F, Fut>(patience: Duration, mut step: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let started = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(2);
    loop {
        match step().await {
            Err(e) if is_busy(&e) && started.elapsed() + delay < patience => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(100));
            }
            done => return done,
        }
    }
}

fn is_busy(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().is_some_and(|c| sqlite_busy(&c)))
}

#[async_trait]
impl Db for LiteDb {
    fn common(&self) -> &dyn CommonStatements {
        self.watched()
    }

    async fn take(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        _wake_waiters: bool,
    ) -> Result<Option<i64>, sqlx::Error> {
        let row = self
            .watched()
            .conns
            .fetch_optional(
                q(&self.common.sql.take)
                    .bind(name.to_owned())
                    .bind(owner.to_owned())
                    .bind(ttl_us),
            )
            .await?;
        row.map(|r| granted_to(&r, owner)).transpose()
    }

    async fn renew_many(&self, batch: &[Renewal<'_>]) -> Result<Vec<bool>, sqlx::Error> {
        let sql = self
            .renew_many
            .get(batch.len())
            .ok_or(too_many(batch.len()))?;
        let mut query = q(sql);
        for r in batch {
            query = query.bind(r.name.to_owned()).bind(r.owner.to_owned());
            query = query.bind(r.version).bind(r.ttl_us);
        }
        for _ in batch.len()..padded(batch.len()) {
            query = query.bind(None::<String>).bind(None::<String>);
            query = query.bind(None::<i64>).bind(None::<i64>);
        }
        let rows = self.watched().conns.fetch_all(query).await?;
        let rows = rows
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(renewed_by_rows(batch, rows))
    }

    fn max_batch(&self) -> usize {
        LIST_MAX_BATCH
    }

    fn pool(&self) -> SqlPool {
        SqlPool::Sqlite(self.common.conns.pool().clone())
    }
}
