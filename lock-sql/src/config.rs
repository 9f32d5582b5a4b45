//! Connection settings: the database URL plus the lock table's options.

use std::time::Duration;

use distlock_core::Error;

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
    /// The cargo feature of `lock-sql` that provides this database.
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
/// | `connect_timeout` | bound on connecting and on waiting for a pooled connection (`500ms`, `5s`, or milliseconds) | the client's operation timeout |
/// | `busy_timeout` | SQLite: how long a statement waits for another writer | `5s` |
/// | `synchronous` | SQLite: `normal` (WAL default, fast) or `full` (survives power loss) | `normal` |
/// | `create_table` | create the table when missing (`true`/`false`) | `true` |
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
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// The default lock table.
pub const DEFAULT_TABLE: &str = "distlock_locks";

impl SqlConfig {
    /// Parses a database URL with optional lock parameters (see the table above).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an unknown scheme, a scheme whose cargo feature is off, a
    /// bad table name or a malformed parameter value.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let url = url.trim();
        let dialect = dialect_of(url)?;
        if !dialect.is_enabled() {
            return Err(Error::InvalidConfig(format!(
                "{} URLs need the `{}` cargo feature of lock-sql (or distlock)",
                dialect.feature(),
                dialect.feature()
            )));
        }
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (url, ""),
        };
        let memory = dialect == Dialect::Sqlite && base.contains(":memory:");
        let mut config = Self {
            dialect,
            url: base.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: if memory { 1 } else { 10 },
            connect_timeout: None,
            busy_timeout: Duration::from_secs(5),
            sync_full: false,
            create_table: true,
        };
        let mut rest = url::form_urlencoded::Serializer::new(String::new());
        let mut passed = 0;
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match key.as_ref() {
                "table" => config.table = value.into_owned(),
                "pool_size" | "max_connections" => {
                    config.max_connections = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad(&key, &value, "a positive integer"))?;
                }
                "connect_timeout" => {
                    config.connect_timeout = Some(parse_duration(&value).ok_or_else(|| {
                        bad(&key, &value, "a positive duration such as 500ms or 5s")
                    })?);
                }
                "busy_timeout" => {
                    config.busy_timeout = parse_duration(&value).ok_or_else(|| {
                        bad(&key, &value, "a positive duration such as 500ms or 5s")
                    })?;
                }
                "synchronous" => {
                    config.sync_full = match value.to_ascii_lowercase().as_str() {
                        "full" => true,
                        "normal" => false,
                        _ => return Err(bad(&key, &value, "`normal` or `full`")),
                    }
                }
                "create_table" => {
                    config.create_table = match value.as_ref() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(bad(&key, &value, "true or false")),
                    }
                }
                _ => {
                    rest.append_pair(&key, &value);
                    passed += 1;
                }
            }
        }
        if passed > 0 {
            config.url = format!("{base}?{}", rest.finish());
        }
        if memory && config.max_connections != 1 {
            return Err(Error::InvalidConfig(
                "sqlite::memory: is one database per connection pool and needs pool_size=1".into(),
            ));
        }
        validate_table(&config.table)?;
        Ok(config)
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
        redact(&self.url)
    }
}

fn dialect_of(url: &str) -> Result<Dialect, Error> {
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("postgres" | "postgresql") => Ok(Dialect::Postgres),
        Some("mysql" | "mariadb") => Ok(Dialect::MySql),
        Some("sqlite") => Ok(Dialect::Sqlite),
        _ => Err(Error::InvalidConfig(format!(
            "unsupported URL {:?}: lock-sql expects postgres://, mysql://, mariadb://, sqlite://PATH or sqlite::memory:",
            redact(url)
        ))),
    }
}

fn bad(key: &str, value: &str, expected: &str) -> Error {
    Error::InvalidConfig(format!(
        "URL parameter {key}={value:?}: expected {expected}"
    ))
}

/// `500ms`, `5s`, `2m`, or plain milliseconds.
pub(crate) fn parse_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    let (number, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => value.split_at(at),
        None => (value, "ms"),
    };
    let n: u64 = number.parse().ok()?;
    let duration = match unit.trim() {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        _ => return None,
    };
    (!duration.is_zero()).then_some(duration)
}

fn is_ident(part: &str) -> bool {
    let mut chars = part.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && part.len() <= 63
}

/// Checks a table (or `schema.table`) or column identifier.
pub(crate) fn validate_ident(what: &str, name: &str) -> Result<(), String> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| is_ident(p)) {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?} is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes, optionally schema.name)"
        ))
    }
}

fn validate_table(table: &str) -> Result<(), Error> {
    validate_ident("table name", table).map_err(Error::InvalidConfig)
}

/// Quotes a validated identifier: `"a"."b"` or `` `a`.`b` ``.
pub(crate) fn quote(name: &str, quote: char) -> String {
    name.split('.')
        .map(|p| format!("{quote}{p}{quote}"))
        .collect::<Vec<_>>()
        .join(".")
}

fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("0"), None);
        assert_eq!(parse_duration("fast"), None);
    }

    #[test]
    fn identifiers() {
        assert!(validate_ident("t", "locks").is_ok());
        assert!(validate_ident("t", "app.locks").is_ok());
        for bad in ["", "1x", "a-b", "a.b.c", "x;drop", "\"x\"", "a b"] {
            assert!(validate_ident("t", bad).is_err(), "{bad}");
        }
        assert_eq!(quote("a.b", '`'), "`a`.`b`");
    }

    #[test]
    fn urls() {
        assert!(matches!(
            SqlConfig::from_url("ftp://x"),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            SqlConfig::from_url("sqlite://x.db?table=a-b"),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            SqlConfig::from_url("sqlite://x.db?pool_size=0"),
            Err(Error::InvalidConfig(_))
        ));
        #[cfg(feature = "sqlite")]
        {
            let c = SqlConfig::from_url("sqlite::memory:").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.max_connections, 1);
        }
        assert_eq!(
            redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db".to_owned()
        );
    }
}
