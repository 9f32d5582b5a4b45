//! The raw floor of each database for the shared benchmark harness (feature `bench`): the
//! cheapest correct lock the database allows, two single-row `UPDATE`s on the lock table.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_bench::RawFloor;
use distlock_core::{Error, Result};
use sqlx::{AssertSqlSafe, Executor};

use crate::backend::{SqlBackend, SqlPool};
use crate::config::{Dialect, SqlConfig};
use crate::error::map_err;
use crate::keys::quote;

/// One connection taken out of its pool (a pooled statement costs an extra ping when the
/// connection goes back).
#[derive(Debug)]
enum RawConn {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlConnection),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqliteConnection),
}

/// Acquire = `UPDATE .. SET owner, version + 1, expires_at WHERE name = ? AND (owner IS NULL OR
/// expires_at <= now)`, release = `UPDATE .. SET owner = NULL WHERE name = ? AND owner = ?`,
/// each checked by its affected-row count, on one connection, without any of distlock's
/// machinery (no upsert, no reservation, no NOTIFY, no guard).
#[derive(Debug)]
pub struct SqlFloor {
    conn: RawConn,
    dialect: Dialect,
    acquire: Arc<str>,
    release: Arc<str>,
    insert: Arc<str>,
    seen: HashSet<String>,
    counter: u64,
}

impl SqlFloor {
    /// Opens one connection to `url` (lock table created if missing).
    ///
    /// # Errors
    /// As [`crate::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        // Two: PostgreSQL's LISTEN connection comes from the pool too.
        let config = SqlConfig::from_url(url)?.with_max_connections(2);
        let dialect = config.dialect;
        let backend = SqlBackend::connect(config).await?;
        let table = &backend.config().table;
        let (t, now, p, ttl) = match dialect {
            Dialect::Postgres => (
                quote(table, '"'),
                "now()",
                ["$1", "$2"],
                "now() + interval '10 seconds'",
            ),
            Dialect::MySql => (
                quote(table, '`'),
                "UTC_TIMESTAMP(6)",
                ["?", "?"],
                "UTC_TIMESTAMP(6) + INTERVAL 10 SECOND",
            ),
            Dialect::Sqlite => (
                quote(table, '"'),
                "CAST(unixepoch('subsec') * 1000000 AS INTEGER)",
                ["?1", "?2"],
                "CAST(unixepoch('subsec') * 1000000 AS INTEGER) + 10000000",
            ),
        };
        let [p1, p2] = p;
        let conn = match backend.pool() {
            #[cfg(feature = "postgres")]
            SqlPool::Postgres(p) => {
                RawConn::Postgres(p.acquire().await.map_err(|e| map_err("floor", e))?.detach())
            }
            #[cfg(feature = "mysql")]
            SqlPool::MySql(p) => {
                RawConn::MySql(p.acquire().await.map_err(|e| map_err("floor", e))?.detach())
            }
            #[cfg(feature = "sqlite")]
            SqlPool::Sqlite(p) => {
                RawConn::Sqlite(p.acquire().await.map_err(|e| map_err("floor", e))?.detach())
            }
        };
        Ok(Self {
            conn,
            dialect,
            acquire: format!(
                "UPDATE {t} SET owner = {p2}, version = version + 1, expires_at = {ttl} \
                 WHERE name = {p1} AND (owner IS NULL OR expires_at <= {now})"
            )
            .into(),
            release: format!("UPDATE {t} SET owner = NULL WHERE name = {p1} AND owner = {p2}").into(),
            insert: match dialect {
                Dialect::MySql => format!(
                    "INSERT IGNORE INTO {t} (name, owner, version, expires_at) VALUES ({p1}, NULL, 0, {now})"
                ),
                _ => format!(
                    "INSERT INTO {t} (name, owner, version, expires_at) VALUES ({p1}, NULL, 0, {now}) \
                     ON CONFLICT (name) DO NOTHING"
                ),
            }
            .into(),
            seen: HashSet::new(),
            counter: 0,
        })
    }

    async fn run(&mut self, sql: &Arc<str>, binds: &[&str]) -> Result<u64> {
        let sql = AssertSqlSafe(sql.clone());
        let done = match &mut self.conn {
            #[cfg(feature = "postgres")]
            RawConn::Postgres(conn) => {
                let mut q = sqlx::query(sql);
                for b in binds {
                    q = q.bind(*b);
                }
                conn.execute(q).await.map(|r| r.rows_affected())
            }
            #[cfg(feature = "mysql")]
            RawConn::MySql(conn) => {
                let mut q = sqlx::query(sql);
                for b in binds {
                    q = q.bind(*b);
                }
                conn.execute(q).await.map(|r| r.rows_affected())
            }
            #[cfg(feature = "sqlite")]
            RawConn::Sqlite(conn) => {
                let mut q = sqlx::query(sql);
                for b in binds {
                    q = q.bind((*b).to_owned());
                }
                conn.execute(q).await.map(|r| r.rows_affected())
            }
        };
        done.map_err(|e| map_err("floor", e))
    }
}

#[async_trait]
impl RawFloor for SqlFloor {
    fn label(&self) -> &str {
        match self.dialect {
            Dialect::Postgres => "postgres: UPDATE take + UPDATE release",
            Dialect::MySql => "mysql: UPDATE take + UPDATE release",
            Dialect::Sqlite => "sqlite: UPDATE take + UPDATE release",
        }
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        if !self.seen.contains(name) {
            let insert = self.insert.clone();
            self.run(&insert, &[name]).await?;
            self.seen.insert(name.to_owned());
        }
        self.counter += 1;
        let owner = format!("floor-{}", self.counter);
        let (acquire, release) = (self.acquire.clone(), self.release.clone());
        // `?` placeholders bind in text order: MySQL's statement names the owner first.
        let take_binds = if self.dialect == Dialect::MySql {
            [owner.as_str(), name]
        } else {
            [name, owner.as_str()]
        };
        if self.run(&acquire, &take_binds).await? != 1 {
            return Err(Error::Backend {
                message: format!("floor: {name:?} is held"),
                source: None,
            });
        }
        if self.run(&release, &[name, owner.as_str()]).await? != 1 {
            return Err(Error::NotHeld {
                name: name.to_owned(),
            });
        }
        Ok(())
    }
}

/// The raw floor for a lock URL: [`SqlFloor`]. `distlock bench` calls it.
///
/// # Errors
/// As [`SqlFloor::connect`].
pub async fn floor(url: &str) -> Result<Box<dyn RawFloor>> {
    Ok(Box::new(SqlFloor::connect(url).await?))
}
