//! What the lock tables keep for the names of a prefix ([`LockBackend::footprint`]): the rows
//! of the lock table, of its holders table and of its queue of permit waiters (PostgreSQL's),
//! counted in one statement each.
//!
//! [`LockBackend::footprint`]: distlock_core::LockBackend::footprint

use distlock_core::{Footprint, Result};

use crate::SqlPool;
use crate::error::map_err;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use crate::keys::quote;
use crate::kinds::{holders_table, queue_table};

/// The rows of `table`, of its holders table and of its queue whose name starts with
/// `prefix`. A table that does not exist (the holders table is created with the first shared
/// hold or permit, the queue with PostgreSQL's functions) has none.
pub(crate) async fn count(pool: &SqlPool, table: &str, prefix: &str) -> Result<Footprint> {
    let holders = holders_table(table);
    let locks = rows(pool, table, prefix)
        .await
        .map_err(|e| map_err("footprint", e))?;
    let mut kept = [0; 2];
    for (n, table) in kept.iter_mut().zip([holders, queue_table(table)]) {
        *n = match rows(pool, &table, prefix).await {
            Ok(n) => n,
            Err(e) if missing_table(&e) => 0,
            Err(e) => return Err(map_err("footprint", e)),
        };
    }
    let [held, queued] = kept;
    Ok(Footprint::new("rows")
        .with("lock rows", locks)
        .with("holder rows", held)
        .with("queued waiter rows", queued))
}

/// Whether the error says the table does not exist.
pub(crate) fn missing_table(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            // PostgreSQL undefined_table, MySQL ER_NO_SUCH_TABLE; SQLite has only a message.
            matches!(db.code().as_deref(), Some("42P01" | "42S02" | "1146"))
                || db.message().contains("no such table")
        }
        _ => false,
    }
}

/// `count(*)` of the rows of `table` whose name starts with `prefix`.
async fn rows(pool: &SqlPool, table: &str, prefix: &str) -> std::result::Result<u64, sqlx::Error> {
    let count: i64 = match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(pool) => {
            let sql = format!(
                "SELECT count(*) FROM {} WHERE left(name, length($1)) = $1",
                quote(table, '"')
            );
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(prefix)
                .fetch_one(pool)
                .await?
        }
        #[cfg(feature = "mysql")]
        SqlPool::MySql(pool) => {
            let sql = format!(
                "SELECT count(*) FROM {} WHERE LEFT(name, LENGTH(?)) = ?",
                crate::keys::quote(table, '`')
            );
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(prefix)
                .bind(prefix)
                .fetch_one(pool)
                .await?
        }
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(pool) => {
            let sql = format!(
                "SELECT count(*) FROM {} WHERE substr(name, 1, length(?1)) = ?1",
                quote(table, '"')
            );
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(prefix)
                .fetch_one(pool)
                .await?
        }
    };
    Ok(u64::try_from(count).unwrap_or_default())
}
