//! The fenced write: a write to a row of the same database that a stale token cannot make.

use async_trait::async_trait;
use distlock_core::{Error, FencingToken};

use crate::keys::validate_ident;

/// A value to bind in a [`FencedUpdate`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SqlValue {
    /// SQL `NULL`.
    Null,
    /// A 64-bit integer.
    Int(i64),
    /// A double.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl From<i64> for SqlValue {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<i32> for SqlValue {
    fn from(v: i32) -> Self {
        Self::Int(v.into())
    }
}

impl From<f64> for SqlValue {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}

impl From<bool> for SqlValue {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}

impl From<&str> for SqlValue {
    fn from(v: &str) -> Self {
        Self::Text(v.to_owned())
    }
}

impl From<String> for SqlValue {
    fn from(v: String) -> Self {
        Self::Text(v)
    }
}

impl From<Vec<u8>> for SqlValue {
    fn from(v: Vec<u8>) -> Self {
        Self::Bytes(v)
    }
}

/// An `UPDATE` of one row of the protected resource that only goes through if the caller's
/// fencing token is at least the one stored on the row, run by
/// [`SqlBackend::fenced_update`](crate::SqlBackend::fenced_update):
///
/// ```sql
/// UPDATE table SET col = ?, ..., fence = :token
///  WHERE key = ? AND (fence IS NULL OR fence <= :token)
/// ```
///
/// The row keeps the highest token that wrote it. A holder that paused past its lease (GC,
/// SIGSTOP, a slow network) and writes after the next holder already did carries a lower token,
/// so its late write changes nothing and [`fenced_update`](crate::SqlBackend::fenced_update)
/// answers `false`. `<=` rather than `<` lets one holder write several times with its token.
/// The fence column must be a nullable (or zero-defaulted) `BIGINT`.
///
/// ```no_run
/// # async fn demo() -> Result<(), distlock_core::Error> {
/// use distlock_sql::{FencedUpdate, distlock_core::{AcquireOptions, DistributedLock}};
///
/// // CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT, fence BIGINT);
/// let client = distlock_sql::connect("sqlite://app.db", Default::default()).await?;
/// let guard = client.acquire("account-7", &AcquireOptions::default()).await?;
/// let write = FencedUpdate::new("accounts", "id", 7, "fence").set("balance", 120);
/// if !client.backend_ref().fenced_update(&write, guard.token()).await? {
///     // A later holder already wrote this row: our lock is gone, do not retry blindly.
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct FencedUpdate {
    pub(crate) table: String,
    pub(crate) key_column: String,
    pub(crate) key: SqlValue,
    pub(crate) fence_column: String,
    pub(crate) set: Vec<(String, SqlValue)>,
}

impl FencedUpdate {
    /// An update of the row of `table` whose `key_column` equals `key`, fenced by
    /// `fence_column`. Identifiers are checked when the update runs.
    pub fn new(
        table: impl Into<String>,
        key_column: impl Into<String>,
        key: impl Into<SqlValue>,
        fence_column: impl Into<String>,
    ) -> Self {
        Self {
            table: table.into(),
            key_column: key_column.into(),
            key: key.into(),
            fence_column: fence_column.into(),
            set: Vec::new(),
        }
    }

    /// Adds `column = value` to the update.
    #[must_use]
    pub fn set(mut self, column: impl Into<String>, value: impl Into<SqlValue>) -> Self {
        self.set.push((column.into(), value.into()));
        self
    }

    /// Runs the update on the application's own connection or transaction (`&mut *tx` for
    /// a `sqlx::Transaction`), so that it commits or rolls back with the application's other
    /// statements: `true` if the row was written, `false` if it is missing or already carries
    /// a higher token (a later holder wrote it; roll back). The lock itself is not touched:
    /// the guard still renews and releases it through the backend. See [`crate::from_pool`]
    /// for an example.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a bad identifier or a token beyond `i64`; the database's
    /// error otherwise ([`Error::Backend`], or [`Error::Unavailable`] for a dropped
    /// connection).
    pub async fn execute<C: FenceConnection>(
        &self,
        conn: &mut C,
        token: FencingToken,
    ) -> Result<bool, Error> {
        self.validate()?;
        let token = i64::try_from(token.get())
            .map_err(|_| Error::InvalidOptions(format!("token {token} is out of range")))?;
        conn.run_fenced(self, token)
            .await
            .map_err(|e| crate::error::map_err("fenced update", e))
    }

    /// Checks the identifiers.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let check = |what: &str, name: &str| validate_ident(what, name);
        check("table", &self.table)
            .and_then(|()| check("key column", &self.key_column))
            .and_then(|()| check("fence column", &self.fence_column))
            .map_err(Error::InvalidOptions)?;
        for (column, _) in &self.set {
            if column.contains('.') {
                return Err(Error::InvalidOptions(format!(
                    "column {column:?} must not be qualified"
                )));
            }
            validate_ident("column", column).map_err(Error::InvalidOptions)?;
        }
        Ok(())
    }

    /// The statement with `quote` as identifier quote and `param(i)` as the i-th (1-based)
    /// placeholder. Parameters: the set values, the token, the key, the token.
    pub(crate) fn sql(&self, quote: char, param: impl Fn(usize) -> String) -> String {
        let q = |name: &str| crate::keys::quote(name, quote);
        let mut sql = format!("UPDATE {} SET ", q(&self.table));
        let mut n = 0;
        for (column, _) in &self.set {
            n += 1;
            sql.push_str(&format!("{} = {}, ", q(column), param(n)));
        }
        let fence = q(&self.fence_column);
        sql.push_str(&format!(
            "{fence} = {} WHERE {} = {} AND ({fence} IS NULL OR {fence} <= {})",
            param(n + 1),
            q(&self.key_column),
            param(n + 2),
            param(n + 3)
        ));
        sql
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A connection a [`FencedUpdate`] can run on: `sqlx::PgConnection`, `sqlx::MySqlConnection`
/// or `sqlx::SqliteConnection` (a pooled connection or a transaction dereferences to one).
/// Sealed: implemented for those only.
#[async_trait]
pub trait FenceConnection: sealed::Sealed + Send {
    /// Runs `update` with `token`; whether one row changed.
    #[doc(hidden)]
    async fn run_fenced(&mut self, update: &FencedUpdate, token: i64) -> Result<bool, sqlx::Error>;
}

macro_rules! fence_connection {
    ($feature:literal, $conn:ty, $db:ty) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for $conn {}

        #[cfg(feature = $feature)]
        #[async_trait]
        impl FenceConnection for $conn {
            async fn run_fenced(
                &mut self,
                update: &FencedUpdate,
                token: i64,
            ) -> Result<bool, sqlx::Error> {
                use crate::dialect::Dialect;
                let result = crate::dialect::fenced_query::<$db>(update, token)
                    .execute(&mut *self)
                    .await?;
                Ok(<$db>::changed(&result) == 1)
            }
        }
    };
}

fence_connection!("postgres", sqlx::PgConnection, sqlx::Postgres);
fence_connection!("mysql", sqlx::MySqlConnection, sqlx::MySql);
fence_connection!("sqlite", sqlx::SqliteConnection, sqlx::Sqlite);
