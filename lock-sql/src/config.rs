//! Connection settings: the database URL plus the lock table's options.

use std::ops::RangeInclusive;
use std::time::Duration;

use distlock_core::Error;
use distlock_core::service_url::{self, UrlOptions};

use crate::keys::validate_ident;

/// The databases this crate speaks, each behind its own cargo feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// PostgreSQL (`postgres://`, `postgresql://`), feature `postgres`.
    Postgres,
    /// MySQL or MariaDB (`mysql://`, `mariadb://`), feature `mysql`.
    MySql,
    /// SQLite (`sqlite://PATH`, `sqlite:PATH`, `sqlite::memory:`), feature `sqlite`.
    Sqlite,
}

impl Dialect {
    /// The cargo feature of `distlock-sql` that provides this database.
    pub fn feature(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Sqlite => "sqlite",
        }
    }

    /// Whether the feature is compiled in.
    pub fn is_enabled(self) -> bool {
        match self {
            Self::Postgres => cfg!(feature = "postgres"),
            Self::MySql => cfg!(feature = "mysql"),
            Self::Sqlite => cfg!(feature = "sqlite"),
        }
    }
}

/// How the backend connects and which table it uses.
///
/// Built from a URL by [`SqlConfig::from_url`]; the lock options are query parameters that are
/// removed before the URL is handed to sqlx. sqlx's own options (`sslmode` and the others of
/// PostgreSQL and MySQL, SQLite's `mode`, `cache`, `immutable`, `vfs`) are passed on; any other
/// option is an error that lists the known ones:
///
/// | parameter | meaning | default |
/// |---|---|---|
/// | `table` | lock table name (`[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.table`) | `distlock_locks` |
/// | `pool_size` (or `max_connections`) | connections in the pool, 1 to 1000 ([`POOL_SIZE`]) | 10 (1 for `sqlite::memory:`) |
/// | `connect_timeout` | bound on connecting and on waiting for a pooled connection (a duration: `500ms`, `5s`), 1 ms to 1 h ([`CONNECT_TIMEOUT`]) | the client's operation timeout (within that range) |
/// | `busy_timeout` | SQLite: how long a statement waits for another writer, 1 ms to 1 h ([`BUSY_TIMEOUT`]) | `5s` |
/// | `synchronous` | SQLite: `normal` (WAL default, fast) or `full` (survives power loss) | `normal` |
/// | `create_table` | create the table when missing (`true`/`false`) | `true` |
/// | `forget_after` | a lock row free this long is deleted by a sweep, 1 ms to 30 days ([`FORGET_AFTER`]; see [`SqlConfig::forget_after`]) | `10m` |
///
/// Durations use [`humantime`](https://docs.rs/humantime) syntax and need a unit. A number
/// outside its range is an error naming the option, the value and the range. The scheme is
/// case-insensitive.
///
/// ```
/// use distlock_sql::{Dialect, SqlConfig};
///
/// let config = SqlConfig::from_url("sqlite://data/locks.db?table=app_locks&pool_size=4&mode=rwc")?;
/// assert_eq!(config.dialect, Dialect::Sqlite);
/// assert_eq!(config.table, "app_locks");
/// assert_eq!(config.max_connections, 4);
/// assert_eq!(config.url, "sqlite://data/locks.db?mode=rwc"); // sqlx's own options pass through
/// # Ok::<(), distlock_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlConfig {
    /// The database.
    pub dialect: Dialect,
    /// The URL as handed to sqlx (lock options removed).
    pub url: String,
    /// The lock table (validated identifier, unquoted).
    pub table: String,
    /// Pool size.
    pub max_connections: u32,
    /// Bound on connecting and on waiting for a pooled connection; `None`: the client's
    /// operation timeout (5 s when the backend is built directly).
    pub connect_timeout: Option<Duration>,
    /// SQLite busy timeout.
    pub busy_timeout: Duration,
    /// SQLite `synchronous=full` instead of `normal`.
    pub sync_full: bool,
    /// Create the tables (and on PostgreSQL and MySQL the routines) that do not exist, and
    /// add the columns of this version to tables of an earlier one: the lock table at
    /// connect, the holders table on the first shared or permit hold. The catalog is read
    /// first: once everything exists as this version makes it, nothing is created, so a user
    /// without the right to create tables or routines can keep this on.
    pub create_table: bool,
    /// How long a lock row stays once its lock is free (released, or its lease over, and no
    /// waiter's reservation): a client whose lock ends (released or lost) sweeps such rows
    /// away (and holders' rows expired as long), in a round every half of this (between 1 s
    /// and 5 min), all clients of the table together at most twice a round, so the table
    /// holds the names used within about this long, not every name ever used. The clients
    /// of a table should agree on it: each sweeps by its own. A name whose row was swept
    /// starts again from the database's clock in microseconds, above every earlier token of
    /// that name unless the database's clock went back by more than this in between.
    /// Default 10 minutes (longer than any step a time daemon makes).
    pub forget_after: Duration,
}

/// Shows the URL with its password replaced by `***`.
impl std::fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlConfig")
            .field("dialect", &self.dialect)
            .field("url", &self.redacted_url())
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("busy_timeout", &self.busy_timeout)
            .field("sync_full", &self.sync_full)
            .field("create_table", &self.create_table)
            .field("forget_after", &self.forget_after)
            .finish()
    }
}

/// The default lock table.
pub const DEFAULT_TABLE: &str = "distlock_locks";

/// The pool sizes accepted (`pool_size`, `max_connections`): a pool of more connections than a
/// database server serves would fail anyway, after allocating for all of them.
pub const POOL_SIZE: RangeInclusive<u32> = 1..=1000;

/// The connect timeouts accepted (`connect_timeout`).
pub const CONNECT_TIMEOUT: RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);

/// The `forget_after`s accepted.
pub const FORGET_AFTER: RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(30 * 24 * 3600);

/// The default [`SqlConfig::forget_after`].
pub const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(600);

/// The SQLite busy timeouts accepted (`busy_timeout`; SQLite takes milliseconds in an `int`).
pub const BUSY_TIMEOUT: RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);

impl SqlConfig {
    /// Parses a database URL with optional lock parameters (see the table above).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a scheme whose cargo feature is off (as the facade says);
    /// [`Error::InvalidConfig`] for an unknown scheme, a
    /// bad table name or a malformed parameter value.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let url = url.trim();
        let dialect = dialect_of(url)?;
        if !dialect.is_enabled() {
            return Err(Error::Unsupported(format!(
                "{} URLs need the `{}` cargo feature of distlock-sql (or distlock)",
                dialect.feature(),
                dialect.feature()
            )));
        }
        // Schemes are case-insensitive; sqlx's SQLite parser is not.
        let (scheme, rest) = url.split_once(':').unwrap_or((url, ""));
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let base = format!("{}:{rest}", scheme.to_ascii_lowercase());
        let mut options = UrlOptions::from_query(query, url);
        let table = options.take("table");
        let pool_size = match options.integer("pool_size", POOL_SIZE)? {
            Some(n) => Some(n),
            None => options.integer("max_connections", POOL_SIZE)?,
        };
        let connect_timeout = options.duration_in("connect_timeout", CONNECT_TIMEOUT)?;
        let busy_timeout = options.duration_in("busy_timeout", BUSY_TIMEOUT)?;
        let sync_full = match options.take("synchronous") {
            None => false,
            Some(value) => match value.to_ascii_lowercase().as_str() {
                "full" => true,
                "normal" => false,
                _ => {
                    return Err(Error::InvalidConfig(format!(
                        "option synchronous={:?}: expected normal or full (in {})",
                        service_url::echo(&value),
                        service_url::redact(url)
                    )));
                }
            },
        };
        let create_table = options.bool("create_table")?.unwrap_or(true);
        let forget_after = options.duration_in("forget_after", FORGET_AFTER)?;
        check_sqlx_options(dialect, &options)?;
        // The rest (sslmode, SQLite's mode, ...) is sqlx's.
        let mut passed = url::form_urlencoded::Serializer::new(String::new());
        for (key, value) in options.remaining() {
            passed.append_pair(key, value);
        }
        let passed = passed.finish();
        let memory = dialect == Dialect::Sqlite && sqlite_in_memory(&base, &passed);
        if dialect == Dialect::Sqlite && !memory && sqlite_path(&base).is_empty() {
            return Err(Error::InvalidConfig(format!(
                "a SQLite URL needs a file path: sqlite://PATH (relative), sqlite:///PATH \
                 (absolute) or sqlite::memory: (in {})",
                service_url::redact(url)
            )));
        }
        let config = Self {
            dialect,
            url: if passed.is_empty() {
                base
            } else {
                format!("{base}?{passed}")
            },
            table: table.unwrap_or_else(|| DEFAULT_TABLE.to_owned()),
            max_connections: pool_size.unwrap_or(if memory { 1 } else { 10 }),
            connect_timeout,
            busy_timeout: busy_timeout.unwrap_or(Duration::from_secs(5)),
            sync_full,
            create_table,
            forget_after: forget_after.unwrap_or(DEFAULT_FORGET_AFTER),
        };
        if memory && config.max_connections != 1 {
            return Err(Error::InvalidConfig(
                "an in-memory SQLite database is one database per connection and needs pool_size=1"
                    .into(),
            ));
        }
        config.validate()?;
        Ok(config)
    }

    /// The database file of a SQLite configuration (`None` for an in-memory database or another
    /// database), as sqlx will open it: relative paths are relative to the current directory.
    ///
    /// ```
    /// use std::path::Path;
    /// use distlock_sql::SqlConfig;
    ///
    /// let config = SqlConfig::from_url("sqlite:///var/lib/app/locks.db?table=t")?;
    /// assert_eq!(config.sqlite_file().as_deref(), Some(Path::new("/var/lib/app/locks.db")));
    /// assert_eq!(SqlConfig::from_url("sqlite::memory:")?.sqlite_file(), None);
    /// # Ok::<(), distlock_core::Error>(())
    /// ```
    #[cfg(feature = "sqlite")]
    pub fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        use std::str::FromStr;
        let (base, query) = self.url.split_once('?').unwrap_or((&self.url, ""));
        if self.dialect != Dialect::Sqlite || sqlite_in_memory(base, query) {
            return None;
        }
        sqlx::sqlite::SqliteConnectOptions::from_str(&self.url)
            .ok()
            .map(|options| options.get_filename().to_path_buf())
    }

    /// The connect timeout in effect: the configured one, else the default operation timeout
    /// of [`ClientConfig`](distlock_core::ClientConfig) (5 s). [`crate::connect`] sets it
    /// from the client's operation timeout when the URL does not.
    pub fn effective_connect_timeout(&self) -> Duration {
        self.connect_timeout
            .unwrap_or(distlock_core::ClientConfig::default().operation_timeout)
    }

    /// A configuration for the application's own `pool` (see
    /// [`SqlBackend::from_pool`](crate::SqlBackend::from_pool)): its database, described
    /// without credentials, and the default lock options, to change with the `with_*` methods.
    pub fn for_pool(pool: &crate::SqlPool) -> Self {
        Self {
            dialect: pool.dialect(),
            url: pool.describe(),
            table: DEFAULT_TABLE.into(),
            max_connections: 10,
            connect_timeout: None,
            busy_timeout: Duration::from_secs(5),
            sync_full: false,
            create_table: true,
            forget_after: DEFAULT_FORGET_AFTER,
        }
    }

    /// Sets the lock table.
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Sets the pool size.
    #[must_use]
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets the connect timeout.
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Sets how long a free lock row stays before a sweep deletes it
    /// ([`Self::forget_after`]).
    #[must_use]
    pub fn with_forget_after(mut self, forget_after: Duration) -> Self {
        self.forget_after = forget_after;
        self
    }

    /// Sets whether a missing table is created.
    #[must_use]
    pub fn with_create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Checks the options set through the `with_*` methods.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad table name, or a pool size or timeout outside
    /// [`POOL_SIZE`], [`CONNECT_TIMEOUT`] or [`BUSY_TIMEOUT`].
    pub fn validate(&self) -> Result<(), Error> {
        validate_table(&self.table)?;
        if self.dialect == Dialect::Postgres && self.table.len() > PG_TABLE_MAX {
            return Err(Error::InvalidConfig(format!(
                "table name {:?} is {} bytes; on PostgreSQL at most {PG_TABLE_MAX} (its \
                 wake-up channel, \"distlock:\" and the name, must fit the server's 63)",
                self.table,
                self.table.len()
            )));
        }
        service_url::check_integer("pool_size", self.max_connections, &POOL_SIZE)
            .map_err(Error::InvalidConfig)?;
        let duration = |key: &str, value: Duration, range: &RangeInclusive<Duration>| {
            service_url::check_duration(key, &format!("{value:?}"), value, range)
                .map_err(Error::InvalidConfig)
        };
        if let Some(timeout) = self.connect_timeout {
            duration("connect_timeout", timeout, &CONNECT_TIMEOUT)?;
        }
        duration("busy_timeout", self.busy_timeout, &BUSY_TIMEOUT)?;
        duration("forget_after", self.forget_after, &FORGET_AFTER)?;
        Ok(())
    }

    /// The URL with any password replaced by `***`, for messages.
    pub fn redacted_url(&self) -> String {
        service_url::redact(&self.url)
    }
}

/// The connect timeout that follows an operation timeout `op`: `op`, within
/// [`CONNECT_TIMEOUT`] (an operation timeout has no upper bound).
pub(crate) fn connect_timeout_for(op: Duration) -> Duration {
    op.clamp(*CONNECT_TIMEOUT.start(), *CONNECT_TIMEOUT.end())
}

/// The lock's own URL options, taken out before the URL goes to sqlx.
const LOCK_OPTIONS: &[&str] = &[
    "table",
    "pool_size",
    "max_connections",
    "connect_timeout",
    "busy_timeout",
    "synchronous",
    "create_table",
    "forget_after",
];

/// The options sqlx 0.9 reads from each database's URL (PostgreSQL's `options[NAME]` too).
/// sqlx refuses other SQLite options but ignores other PostgreSQL and MySQL ones, so a
/// misspelt `sslmode` would silently leave TLS to its default.
fn sqlx_options(dialect: Dialect) -> &'static [&'static str] {
    match dialect {
        Dialect::Sqlite => &["mode", "cache", "immutable", "vfs"],
        Dialect::Postgres => &[
            "sslmode",
            "ssl-mode",
            "sslrootcert",
            "ssl-root-cert",
            "ssl-ca",
            "sslcert",
            "ssl-cert",
            "sslkey",
            "ssl-key",
            "statement-cache-capacity",
            "host",
            "hostaddr",
            "port",
            "dbname",
            "user",
            "password",
            "application_name",
            "options",
        ],
        Dialect::MySql => &[
            "sslmode",
            "ssl-mode",
            "sslca",
            "ssl-ca",
            "sslcert",
            "ssl-cert",
            "sslkey",
            "ssl-key",
            "charset",
            "collation",
            "statement-cache-capacity",
            "socket",
            "timezone",
            "time-zone",
        ],
    }
}

/// Refuses an option that neither the lock nor sqlx knows, listing the known ones, as every
/// backend does.
fn check_sqlx_options(dialect: Dialect, options: &UrlOptions) -> Result<(), Error> {
    let sqlx = sqlx_options(dialect);
    let mut rest = options.clone();
    for key in sqlx {
        rest.take(key);
    }
    if dialect == Dialect::Postgres {
        let named: Vec<String> = rest
            .remaining()
            .iter()
            .map(|(key, _)| key.clone())
            .filter(|key| key.starts_with("options[") && key.ends_with(']'))
            .collect();
        for key in named {
            rest.take(&key);
        }
    }
    let mut known = LOCK_OPTIONS.to_vec();
    known.extend_from_slice(sqlx);
    if dialect == Dialect::Postgres {
        known.push("options[NAME]");
    }
    rest.finish(&known)
}

fn dialect_of(url: &str) -> Result<Dialect, Error> {
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("postgres" | "postgresql") => Ok(Dialect::Postgres),
        Some("mysql" | "mariadb") => Ok(Dialect::MySql),
        Some("sqlite") => Ok(Dialect::Sqlite),
        _ => Err(Error::InvalidConfig(format!(
            "unsupported URL {}: distlock-sql expects postgres://, mysql://, mariadb://, sqlite://PATH or sqlite::memory:",
            service_url::redact(url)
        ))),
    }
}

/// The path part of a SQLite URL (`sqlite://PATH` or `sqlite:PATH`), without the query.
fn sqlite_path(base: &str) -> &str {
    base.strip_prefix("sqlite://")
        .or_else(|| base.strip_prefix("sqlite:"))
        .unwrap_or(base)
}

/// Whether a SQLite URL names an in-memory database (`:memory:` or `mode=memory`).
fn sqlite_in_memory(base: &str, query: &str) -> bool {
    sqlite_path(base) == ":memory:"
        || url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "mode" && v == "memory")
}

/// The longest table name (`schema.table` whole) on PostgreSQL: the channel its waiters
/// listen on is `distlock:` and the name, and a channel of 64 bytes or more fails every
/// `NOTIFY` (the hand-overs and wake-ups of a contended lock) while `LISTEN` cuts it short;
/// the tables `<table>_holders` and `<table>_queue` fit within 63 bytes with it too.
pub(crate) const PG_TABLE_MAX: usize = 63 - "distlock:".len();

fn validate_table(table: &str) -> Result<(), Error> {
    validate_ident("table name", table).map_err(Error::InvalidConfig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[test]
    fn durations_need_a_unit() {
        let c = SqlConfig::from_url("postgres://h/db?connect_timeout=250ms&busy_timeout=1m")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.connect_timeout, Some(Duration::from_millis(250)));
        assert_eq!(c.busy_timeout, Duration::from_secs(60));
        for bad in ["250", "0s", "fast"] {
            let url = format!("postgres://h/db?connect_timeout={bad}");
            assert!(
                matches!(SqlConfig::from_url(&url), Err(Error::InvalidConfig(_))),
                "{url}"
            );
        }
    }

    /// A PostgreSQL table name whose wake-up channel (`distlock:` and the name) would not fit
    /// the server's 63 bytes is refused: its NOTIFYs failed, so every hand-over of a
    /// contended lock did, while uncontended locks worked.
    #[cfg(feature = "postgres")]
    #[test]
    fn a_postgres_table_name_leaves_room_for_its_channel() {
        let config = SqlConfig::from_url("postgres://h/db").unwrap_or_else(|e| panic!("{e}"));
        let fits = format!("s.{}", "t".repeat(PG_TABLE_MAX - 2));
        assert!(config.clone().with_table(fits).validate().is_ok());
        let long = format!("s.{}", "t".repeat(PG_TABLE_MAX - 1));
        match config.with_table(long).validate() {
            Err(Error::InvalidConfig(message)) => assert!(message.contains("channel"), "{message}"),
            other => panic!("{other:?}"),
        }
        let url = format!("postgres://h/db?table={}", "t".repeat(PG_TABLE_MAX + 1));
        assert!(matches!(
            SqlConfig::from_url(&url),
            Err(Error::InvalidConfig(_))
        ));
    }

    /// Issue 47: `pool_size=100000000` was accepted and allocated gigabytes before failing.
    /// Every numeric option has a range; a value outside it names the option, the value and
    /// the range, in the URL and through the builder methods alike.
    #[cfg(feature = "sqlite")]
    #[test]
    fn numeric_options_are_bounded() {
        let ok =
            SqlConfig::from_url("sqlite://x.db?pool_size=1000&connect_timeout=1h&busy_timeout=1ms")
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.max_connections, 1000);
        for (option, range) in [
            (
                "pool_size=100000000",
                "pool_size=100000000 is out of range: expected 1 to 1000",
            ),
            (
                "max_connections=1001",
                "max_connections=1001 is out of range: expected 1 to 1000",
            ),
            (
                "pool_size=0",
                "pool_size=0 is out of range: expected 1 to 1000",
            ),
            (
                "pool_size=-3",
                "pool_size=-3 is out of range: expected 1 to 1000",
            ),
            (
                "pool_size=99999999999999999999999",
                "pool_size=99999999999999999999999 is out of range",
            ),
            (
                "pool_size=ten",
                "pool_size=\"ten\": expected an integer from 1 to 1000",
            ),
            (
                "connect_timeout=2h",
                "connect_timeout=2h is out of range: expected 1ms to 1h",
            ),
            (
                "busy_timeout=30days",
                "busy_timeout=30days is out of range: expected 1ms to 1h",
            ),
            (
                "busy_timeout=10us",
                "busy_timeout=10us is out of range: expected 1ms to 1h",
            ),
        ] {
            let url = format!("sqlite://x.db?{option}");
            let err = SqlConfig::from_url(&url).unwrap_err();
            assert!(matches!(err, Error::InvalidConfig(_)), "{url}: {err:?}");
            let err = err.to_string();
            assert!(err.contains(range), "{url}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let err = ok
            .clone()
            .with_max_connections(5000)
            .validate()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("option pool_size=5000 is out of range: expected 1 to 1000"),
            "{err}"
        );
        let err = ok
            .with_connect_timeout(Duration::from_secs(7200))
            .validate()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("option connect_timeout=7200s is out of range: expected 1ms to 1h"),
            "{err}"
        );
        // An operation timeout beyond the range gives the longest connect timeout, not an error.
        assert_eq!(
            connect_timeout_for(Duration::from_secs(1 << 40)),
            Duration::from_secs(3600)
        );
    }

    /// Issue 47 (and the README: "an unknown option is an error that lists the known ones"):
    /// sqlx said only "unknown query parameter `bogus`" for SQLite, and ignored a misspelt
    /// PostgreSQL or MySQL option (`sslmdoe=verify-full`: TLS left at its default).
    #[test]
    fn an_unknown_option_lists_the_known_ones() {
        for (dialect, url, known) in [
            (
                Dialect::Sqlite,
                "sqlite:///tmp/x.db?table=t&bogus=1",
                "unknown option \"bogus\" (known: table, pool_size, max_connections, \
                 connect_timeout, busy_timeout, synchronous, create_table, forget_after, mode, \
                 cache, immutable, vfs) (in sqlite:///tmp/x.db?table=t&bogus=1)",
            ),
            (
                Dialect::Postgres,
                "postgres://u:s3cret@h/db?sslmdoe=verify-full",
                "unknown option \"sslmdoe\" (known: table, ",
            ),
            (
                Dialect::MySql,
                "mysql://u:s3cret@h/db?ssl_mode=required",
                "unknown option \"ssl_mode\" (known: table, ",
            ),
        ] {
            if !dialect.is_enabled() {
                continue;
            }
            let err = SqlConfig::from_url(url).unwrap_err();
            assert!(matches!(err, Error::InvalidConfig(_)), "{url}: {err:?}");
            let err = err.to_string();
            assert!(err.contains(known), "{url}: {err}");
            assert!(!err.contains("s3cret") && !err.contains('\n'), "{err}");
        }
        // What sqlx knows still passes, unchanged.
        for url in [
            "sqlite://x.db?mode=rwc&cache=private&immutable=false&vfs=unix",
            "postgres://h/db?sslmode=require&application_name=a&options[search_path]=s",
            "mysql://h/db?ssl-mode=required&charset=utf8mb4&time-zone=%2B00:00",
        ] {
            match SqlConfig::from_url(url) {
                Ok(config) => assert!(config.url.contains('?'), "{url}: {}", config.url),
                Err(Error::Unsupported(_)) => {}
                Err(err) => panic!("{url}: {err}"),
            }
        }
    }

    #[test]
    fn a_dialect_whose_feature_is_off_is_unsupported() {
        for (url, dialect) in [
            ("postgres://h/db", Dialect::Postgres),
            ("mysql://h/db", Dialect::MySql),
            ("sqlite://x.db", Dialect::Sqlite),
        ] {
            match SqlConfig::from_url(url) {
                Ok(config) => assert!(dialect.is_enabled() && config.dialect == dialect),
                Err(err) => assert!(
                    !dialect.is_enabled() && matches!(err, Error::Unsupported(_)),
                    "{url}: {err}"
                ),
            }
        }
    }

    #[test]
    fn urls() {
        assert!(matches!(
            SqlConfig::from_url("ftp://x"),
            Err(Error::InvalidConfig(_))
        ));
        #[cfg(feature = "sqlite")]
        {
            for bad in ["sqlite://x.db?table=a-b", "sqlite://x.db?pool_size=0"] {
                assert!(
                    matches!(SqlConfig::from_url(bad), Err(Error::InvalidConfig(_))),
                    "{bad}"
                );
            }
            let c = SqlConfig::from_url("sqlite::memory:").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.max_connections, 1);
            for url in ["sqlite:", "sqlite://", "SQLITE://?table=t"] {
                let err = SqlConfig::from_url(url).unwrap_err().to_string();
                assert!(err.contains("needs a file path"), "{url}: {err}");
            }
            let c = SqlConfig::from_url("SQLite://x.db?table=t&mode=rwc")
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.url, "sqlite://x.db?mode=rwc");
        }
        #[cfg(feature = "postgres")]
        {
            let c = SqlConfig::from_url("postgres://u:secret@h/db?sslmode=require")
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.redacted_url(), "postgres://u:***@h/db?sslmode=require");
        }
    }
}
