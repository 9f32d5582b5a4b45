//! Connection settings: the database URL plus the lock table's options.

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
/// removed before the URL is handed to sqlx (everything else, e.g. `sslmode`, is passed on):
///
/// | parameter | meaning | default |
/// |---|---|---|
/// | `table` | lock table name (`[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.table`) | `distlock_locks` |
/// | `pool_size` (or `max_connections`) | connections in the pool | 10 (1 for `sqlite::memory:`) |
/// | `connect_timeout` | bound on connecting and on waiting for a pooled connection (a duration: `500ms`, `5s`) | the client's operation timeout |
/// | `busy_timeout` | SQLite: how long a statement waits for another writer | `5s` |
/// | `synchronous` | SQLite: `normal` (WAL default, fast) or `full` (survives power loss) | `normal` |
/// | `create_table` | create the table when missing (`true`/`false`) | `true` |
///
/// Durations use [`humantime`](https://docs.rs/humantime) syntax and need a unit. The scheme is
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
    /// Create the table if it does not exist.
    pub create_table: bool,
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
            .finish()
    }
}

/// The default lock table.
pub const DEFAULT_TABLE: &str = "distlock_locks";

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
        let pool_size = match options.parse::<u32>("pool_size", "a positive integer")? {
            Some(n) => Some(n),
            None => options.parse::<u32>("max_connections", "a positive integer")?,
        };
        let connect_timeout = options.duration("connect_timeout")?;
        let busy_timeout = options.duration("busy_timeout")?;
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
        // Everything else (sslmode, SQLite's mode, ...) is sqlx's.
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

    /// Sets whether a missing table is created.
    #[must_use]
    pub fn with_create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Checks the options set through the `with_*` methods.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad table name or a zero pool size or timeout.
    pub fn validate(&self) -> Result<(), Error> {
        validate_table(&self.table)?;
        if self.max_connections == 0 {
            return Err(Error::InvalidConfig("pool_size must be at least 1".into()));
        }
        if self.connect_timeout.is_some_and(|t| t.is_zero()) || self.busy_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "connect_timeout and busy_timeout must be greater than zero".into(),
            ));
        }
        Ok(())
    }

    /// The URL with any password replaced by `***`, for messages.
    pub fn redacted_url(&self) -> String {
        service_url::redact(&self.url)
    }
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
