//! MySQL / MariaDB: `INSERT .. ON DUPLICATE KEY UPDATE` with `UTC_TIMESTAMP(6)` as the clock;
//! the new version comes back through `LAST_INSERT_ID(expr)`.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::{Error, Result};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{AssertSqlSafe, Executor, Row};

use crate::backend::SqlPool;
use crate::config::SqlConfig;
use crate::db::{Db, Sessions};
use crate::dialect::{Common, Shared, Sql, prepare_all, q, server_pool};
use crate::error::{connect_err, map_err};
use crate::holds::{HolderSql, Holds, holders_table};
use crate::keys::quote;
use crate::pool::{HotConns, open_pool};

const NOW: &str = "UTC_TIMESTAMP(6)";

/// The lock table's statements in this dialect.
fn statements(table: &str) -> (Sql, Arc<str>, HolderSql) {
    let t = quote(table, '`');
    let peek = format!(
        "SELECT owner, version, IF(owner IS NOT NULL AND expires_at > {NOW}, \
         TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), NULL), next_owner, next_since, \
         IF(next_owner IS NOT NULL AND next_expires > {NOW}, \
         TIMESTAMPDIFF(MICROSECOND, {NOW}, next_expires), NULL) FROM {t} WHERE name = ?"
    );
    let sql = Sql {
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
            peek: peek.as_str().into(),
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
    };
    let check = format!("SELECT version FROM {t} WHERE name = ? AND owner = ?").into();
    (sql, check, holder_statements(table, &peek))
}

/// The holders' statements (see [`crate::holds`]).
fn holder_statements(table: &str, peek: &str) -> HolderSql {
    let t = quote(table, '`');
    let h = quote(&holders_table(table), '`');
    let live = format!("FROM {h} WHERE name = ? AND expires_at > {NOW}");
    let setup = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {h} (name VARBINARY(512) NOT NULL, \
             owner VARBINARY(255) NOT NULL, token BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
             permits BIGINT NOT NULL, PRIMARY KEY (name, owner)) ENGINE=InnoDB"
        )
        .into(),
    ];
    HolderSql {
        lock: format!("{peek} FOR UPDATE").into(),
        // A no-op update rather than INSERT IGNORE, which would hide other errors.
        ensure: format!(
            "INSERT INTO {t} (name, owner, version, expires_at) VALUES (?, NULL, 0, {NOW}) \
             ON DUPLICATE KEY UPDATE name = name"
        )
        .into(),
        purge: format!("DELETE FROM {h} WHERE name = ? AND (expires_at <= {NOW} OR owner = ?)")
            .into(),
        purge_all: format!("DELETE FROM {h} WHERE name = ?").into(),
        count: format!(
            "SELECT COUNT(*), MIN(TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)) {live}"
        )
        .into(),
        // Assignments run left to right: the reservation's columns before `next_owner`.
        mark: format!(
            "UPDATE {t} SET owner = ?, version = version + 1, \
             expires_at = GREATEST(expires_at, {NOW} + INTERVAL ? MICROSECOND), \
             next_since = IF(next_owner <=> ?, NULL, next_since), \
             next_expires = IF(next_owner <=> ?, NULL, next_expires), \
             next_owner = IF(next_owner <=> ?, NULL, next_owner) WHERE name = ?"
        )
        .into(),
        insert: format!(
            "INSERT INTO {h} (name, owner, token, expires_at, permits) \
             VALUES (?, ?, ?, {NOW} + INTERVAL ? MICROSECOND, ?)"
        )
        .into(),
        extend: format!(
            "UPDATE {h} SET expires_at = {NOW} + INTERVAL ? MICROSECOND \
             WHERE name = ? AND owner = ? AND token = ? AND expires_at > {NOW}"
        )
        .into(),
        stretch: format!(
            "UPDATE {t} SET expires_at = GREATEST(expires_at, {NOW} + INTERVAL ? MICROSECOND) \
             WHERE name = ?"
        )
        .into(),
        leave: format!(
            "DELETE FROM {h} WHERE name = ? AND owner = ? AND token = ? AND expires_at > {NOW}"
        )
        .into(),
        free: format!("UPDATE {t} SET owner = NULL, expires_at = {NOW} WHERE name = ?").into(),
        shrink: format!(
            "UPDATE {t} SET expires_at = COALESCE((SELECT MAX(expires_at) {live}), {NOW}) \
             WHERE name = ?"
        )
        .into(),
        info: format!(
            "SELECT owner, token, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), \
             (SELECT COUNT(*) {live}) FROM {h} WHERE name = ? AND expires_at > {NOW} \
             ORDER BY token DESC LIMIT 1"
        )
        .into(),
        notify: None,
        setup,
    }
}

#[derive(Debug)]
pub(crate) struct MyDb {
    check: Arc<str>,
    common: Common<sqlx::MySql>,
}

impl MyDb {
    pub(crate) async fn open(config: &SqlConfig, sessions: Arc<Sessions>) -> Result<Self> {
        let options = MySqlConnectOptions::from_str(&config.url).map_err(|e| {
            Error::InvalidConfig(format!("bad MySQL URL {}: {e}", config.redacted_url()))
        })?;
        let session_id = "SELECT CAST(CONNECTION_ID() AS SIGNED)";
        let pool = server_pool::<sqlx::MySql>(config, session_id, sessions);
        let probe = config.effective_connect_timeout() / 4;
        let pool = open_pool(pool, options, probe)
            .await
            .map_err(|e| connect_err(config, e))?;
        Self::on_pool(pool, config, config.max_connections / 2).await
    }

    /// Sets up the lock table and its statements on `pool`, keeping at most `keep`
    /// connections checked out between statements (see [`HotConns`]).
    pub(crate) async fn on_pool(
        pool: sqlx::MySqlPool,
        config: &SqlConfig,
        keep: u32,
    ) -> Result<Self> {
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
        let (sql, check, holds) = statements(&config.table);
        let holds = Holds::new(holds, config.create_table);
        let mut prepared = sql.prepared();
        prepared.push(&check);
        prepare_all(&pool, &prepared, &table).await?;
        Ok(Self {
            common: Common {
                conns: HotConns::new(pool, keep),
                sql,
                holds,
            },
            check,
        })
    }
}

#[async_trait]
impl Db for MyDb {
    fn common(&self) -> &dyn Shared {
        &self.common
    }

    async fn take(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        _wake_waiters: bool,
    ) -> Result<Option<i64>, sqlx::Error> {
        // Two statements on one connection: LAST_INSERT_ID and the check belong to the take.
        let mut hot = self.common.conns.get().await?;
        let result = q(&self.common.sql.take)
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
        let result = q(&self.check)
            .bind(name)
            .bind(owner)
            .fetch_optional(hot.conn())
            .await;
        let row = hot.keep(result)?;
        row.map(|r| r.try_get::<i64, _>(0)).transpose()
    }

    fn pool(&self) -> SqlPool {
        SqlPool::MySql(self.common.conns.pool().clone())
    }
}
