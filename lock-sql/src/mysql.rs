//! MySQL / MariaDB: `INSERT .. ON DUPLICATE KEY UPDATE` with `UTC_TIMESTAMP(6)` as the clock;
//! the new version comes back through `LAST_INSERT_ID(expr)`.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::{Error, Result};
use futures::FutureExt;
use sqlx::mysql::{MySqlArguments, MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Executor, Row, SqlSafeStr};

use crate::backend::SqlPool;
use crate::config::SqlConfig;
use crate::db::{Claim, Db, Listed, Peek, Sessions, bind_value};
use crate::error::{connect_err, map_err, shape_err};
use crate::fence::FencedUpdate;
use crate::keys::quote;
use crate::pool::{HotConns, open_pool};

const NOW: &str = "UTC_TIMESTAMP(6)";

#[derive(Debug)]
struct Statements {
    take: Arc<str>,
    check: Arc<str>,
    peek: Arc<str>,
    reserve: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
    abandon: Arc<str>,
    force: Arc<str>,
    /// Not prepared at connect: operators' reads only.
    list: Arc<str>,
}

impl Statements {
    fn new(table: &str) -> Self {
        let t = quote(table, '`');
        Self {
            // Assignments run left to right and see earlier ones, so the decision is taken once,
            // into a session variable, before any column changes.
            take: format!(
                "INSERT INTO {t} (name, owner, version, expires_at) \
                 VALUES (?, ?, LAST_INSERT_ID(1), {NOW} + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                 version = IF(@distlock_take := ((owner IS NULL OR owner = VALUES(owner) OR expires_at <= {NOW}) \
                   AND (next_owner IS NULL OR next_owner = VALUES(owner) OR next_expires <= {NOW})), \
                   LAST_INSERT_ID(version + 1), version), \
                 owner = IF(@distlock_take, VALUES(owner), owner), \
                 expires_at = IF(@distlock_take, VALUES(expires_at), expires_at), \
                 next_owner = IF(@distlock_take, NULL, next_owner), \
                 next_since = IF(@distlock_take, NULL, next_since), \
                 next_expires = IF(@distlock_take, NULL, next_expires)"
            )
            .into(),
            check: format!("SELECT version FROM {t} WHERE name = ? AND owner = ?").into(),
            peek: format!(
                "SELECT owner, version, IF(owner IS NOT NULL AND expires_at > {NOW}, \
                 TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), NULL), next_owner, next_since, \
                 IF(next_owner IS NOT NULL AND next_expires > {NOW}, \
                 TIMESTAMPDIFF(MICROSECOND, {NOW}, next_expires), NULL) FROM {t} WHERE name = ?"
            )
            .into(),
            reserve: format!(
                "UPDATE {t} SET next_since = ?, next_expires = {NOW} + INTERVAL ? MICROSECOND, next_owner = ? \
                 WHERE name = ? AND (next_owner IS NULL OR next_owner = ? OR next_expires <= {NOW} \
                 OR next_since > ?)"
            )
            .into(),
            renew: format!(
                "UPDATE {t} SET expires_at = {NOW} + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND version = ? AND expires_at > {NOW}"
            )
            .into(),
            release: format!(
                "UPDATE {t} SET owner = NULL, expires_at = {NOW} \
                 WHERE name = ? AND owner = ? AND version = ? AND expires_at > {NOW}"
            )
            .into(),
            abandon: format!(
                "UPDATE {t} SET expires_at = IF(owner <=> ?, {NOW}, expires_at), \
                 owner = IF(owner <=> ?, NULL, owner), \
                 next_expires = IF(next_owner <=> ?, NULL, next_expires), \
                 next_since = IF(next_owner <=> ?, NULL, next_since), \
                 next_owner = IF(next_owner <=> ?, NULL, next_owner) \
                 WHERE name = ? AND (owner = ? OR next_owner = ?)"
            )
            .into(),
            force: format!(
                "UPDATE {t} SET owner = NULL, expires_at = {NOW} \
                 WHERE name = ? AND owner IS NOT NULL AND expires_at > {NOW}"
            )
            .into(),
            list: format!(
                "SELECT CAST(name AS CHAR CHARACTER SET utf8mb4), CAST(owner AS CHAR CHARACTER SET utf8mb4), \
                 version, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at) \
                 FROM {t} WHERE owner IS NOT NULL AND expires_at > {NOW} \
                 AND LEFT(name, LENGTH(?)) = ? ORDER BY name LIMIT ?"
            )
            .into(),
        }
    }

    fn all(&self) -> [&Arc<str>; 8] {
        [
            &self.take,
            &self.check,
            &self.peek,
            &self.reserve,
            &self.renew,
            &self.release,
            &self.abandon,
            &self.force,
        ]
    }
}

#[derive(Debug)]
pub(crate) struct MyDb {
    conns: HotConns<sqlx::MySql>,
    sql: Statements,
}

impl MyDb {
    pub(crate) async fn open(config: &SqlConfig, sessions: Arc<Sessions>) -> Result<Self> {
        let options = MySqlConnectOptions::from_str(&config.url).map_err(|e| {
            Error::InvalidConfig(format!("bad MySQL URL {}: {e}", config.redacted_url()))
        })?;
        let timeout = config.effective_connect_timeout();
        let pool = open_pool(
            MySqlPoolOptions::new()
                .max_connections(config.max_connections)
                .acquire_timeout(timeout / 2)
                .test_before_acquire(false)
                .after_connect(move |conn, _meta| {
                    let sessions = sessions.clone();
                    async move {
                        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                            .fetch_one(conn)
                            .await?;
                        sessions.add(i64::try_from(id).unwrap_or(i64::MAX));
                        Ok(())
                    }
                    .boxed()
                }),
            options,
            timeout / 4,
        )
        .await
        .map_err(|e| connect_err(config, e))?;
        let table = quote(&config.table, '`');
        if config.create_table {
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {table} (name VARBINARY(512) NOT NULL PRIMARY KEY, \
                 owner VARBINARY(255) NULL, version BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
                 next_owner VARBINARY(255) NULL, next_since BIGINT NULL, next_expires DATETIME(6) NULL) \
                 ENGINE=InnoDB"
            );
            pool.execute(AssertSqlSafe(create))
                .await
                .map_err(|e| map_err(&format!("creating the lock table {table}"), e))?;
        }
        let sql = Statements::new(&config.table);
        for statement in sql.all() {
            pool.prepare(AssertSqlSafe(statement.clone()).into_sql_str())
                .await
                .map_err(|e| shape_err(&table, e))?;
        }
        Ok(Self {
            conns: HotConns::new(pool, config.max_connections),
            sql,
        })
    }
}

fn q(sql: &Arc<str>) -> sqlx::query::Query<'static, sqlx::MySql, MySqlArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}

#[async_trait]
impl Db for MyDb {
    fn has_events(&self) -> bool {
        false
    }

    async fn take(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        _wake_waiters: bool,
    ) -> Result<Option<i64>, sqlx::Error> {
        // Two statements on one connection: LAST_INSERT_ID and the check belong to the take.
        let mut hot = self.conns.get().await?;
        let result = q(&self.sql.take)
            .bind(name)
            .bind(owner)
            .bind(ttl_us)
            .execute(hot.conn())
            .await;
        let done = match result {
            Ok(done) => done,
            Err(err) => return hot.keep(Err(err)),
        };
        // 2: an existing row was taken (LAST_INSERT_ID carries the new version); 1: a new row was
        // inserted, or the row was left alone (found, unchanged): ask.
        if done.rows_affected() == 2 && done.last_insert_id() > 1 {
            return hot.keep(Ok(i64::try_from(done.last_insert_id()).ok()));
        }
        let result = q(&self.sql.check)
            .bind(name)
            .bind(owner)
            .fetch_optional(hot.conn())
            .await;
        let row = hot.keep(result)?;
        row.map(|r| r.try_get::<i64, _>(0)).transpose()
    }

    async fn peek(&self, name: &str) -> Result<Option<Peek>, sqlx::Error> {
        let row = self
            .conns
            .fetch_optional(q(&self.sql.peek).bind(name))
            .await?;
        row.map(|r| {
            Peek::from_row(&r, |o: Option<Vec<u8>>| {
                o.map(|o| String::from_utf8_lossy(&o).into_owned())
            })
        })
        .transpose()
    }

    async fn reserve(
        &self,
        name: &str,
        owner: &str,
        since: i64,
        hold_us: i64,
    ) -> Result<Claim, sqlx::Error> {
        let done = self
            .conns
            .execute(
                q(&self.sql.reserve)
                    .bind(since)
                    .bind(hold_us)
                    .bind(owner)
                    .bind(name)
                    .bind(owner)
                    .bind(since),
            )
            .await?;
        Ok(Claim::granted(done.rows_affected() == 1))
    }

    async fn renew(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        ttl_us: i64,
    ) -> Result<bool, sqlx::Error> {
        let done = self
            .conns
            .execute(
                q(&self.sql.renew)
                    .bind(ttl_us)
                    .bind(name)
                    .bind(owner)
                    .bind(version),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, name: &str, owner: &str, version: i64) -> Result<bool, sqlx::Error> {
        let done = self
            .conns
            .execute(q(&self.sql.release).bind(name).bind(owner).bind(version))
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn abandon(&self, name: &str, owner: &str) -> Result<(), sqlx::Error> {
        let mut query = q(&self.sql.abandon);
        for _ in 0..5 {
            query = query.bind(owner);
        }
        self.conns
            .execute(query.bind(name).bind(owner).bind(owner))
            .await?;
        Ok(())
    }

    async fn force_release(&self, name: &str) -> Result<bool, sqlx::Error> {
        let done = self.conns.execute(q(&self.sql.force).bind(name)).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn list(&self, prefix: &str, limit: i64) -> Result<Vec<Listed>, sqlx::Error> {
        let rows = q(&self.sql.list)
            .bind(prefix)
            .bind(prefix)
            .bind(limit)
            .fetch_all(self.conns.pool())
            .await?;
        rows.iter().map(Listed::from_row).collect()
    }

    async fn fenced_update(&self, update: &FencedUpdate, token: i64) -> Result<bool, sqlx::Error> {
        let sql = update.sql('`', |_| "?".to_owned());
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (_, value) in &update.set {
            query = bind_value!(query, value);
        }
        query = query.bind(token);
        query = bind_value!(query, &update.key);
        query = query.bind(token);
        Ok(self.conns.execute(query).await?.rows_affected() == 1)
    }

    fn pool(&self) -> SqlPool {
        SqlPool::MySql(self.conns.pool().clone())
    }
}
