//! sqlx errors as distlock errors, and which SQLSTATEs and SQLite codes are worth retrying.

use std::time::Duration;

use distlock_core::Error;
use distlock_core::backend::RetryPolicy;

use crate::{Dialect, SqlConfig};

/// Classifies sqlx's error: transport trouble is retryable, the rest is the database's word.
pub(crate) fn map_err(what: &str, err: sqlx::Error) -> Error {
    let transient = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| transient_code(&code)),
        _ => false,
    };
    if transient {
        Error::unavailable(format!("{what} failed: {err}"), err)
    } else {
        Error::backend(format!("{what} failed: {err}"), err)
    }
}

/// SQLSTATEs (PostgreSQL, MySQL) and SQLite result codes that mean "try again".
pub(crate) fn transient_code(code: &str) -> bool {
    sqlite_busy(code)
        || code.starts_with("08") // connection exception
        || code.starts_with("57P") // admin shutdown, crash shutdown, cannot connect now
        || rolled_back_code(code)
        || matches!(code, "53300" | "70100" | "HYT00")
}

/// Whether nothing of the statement was applied, so that the same statement may be sent
/// again: the database rolled its transaction back to break a deadlock or a serialization
/// conflict (SQLSTATE `40001`, which MySQL/MariaDB give their error 1213, or PostgreSQL's
/// `40P01`), or SQLite refused it with `BUSY`/`LOCKED` (the busy timeout passed before the
/// statement, or its transaction's `BEGIN IMMEDIATE`, got the file's write lock; SQLite's
/// busy handler is not fair, and 8 clients of one semaphore on a loaded CI machine kept a
/// release out for the whole 1 s of the test's busy timeout).
pub(crate) fn not_applied(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.code().is_some_and(|c| rolled_back_code(&c) || sqlite_busy(&c)))
}

/// How a release that applied nothing (see [`not_applied`]) is sent again: at most twice
/// more, about 2 and 4 ms later (each pause jittered down by up to a quarter), within the
/// caller's operation timeout. A release the database rolled back to break a deadlock
/// (MariaDB, shared releases beside joins of the same name: CI, 2026-11-30), or that SQLite's
/// busy timeout kept from the write lock (a permit's release, CI 2026-11-30), left the hold to
/// its ttl. Not for an abandoned attempt's clean-up: sent again after SQLite's busy timeout,
/// it made a refused `try_acquire` during an outage (the file's write lock held) take the
/// whole operation timeout more (3.01 s against the conformance bound of 3 s, CI 2026-12-06),
/// for a deadlock never seen there.
pub(crate) const RELEASE_RETRY: RetryPolicy = RetryPolicy {
    retries: 2,
    first: Duration::from_millis(2),
    max: Duration::from_millis(4),
};

/// The SQLSTATEs of a deadlock or serialization rollback (see [`not_applied`]).
fn rolled_back_code(code: &str) -> bool {
    matches!(code, "40001" | "40P01")
}

/// `SQLITE_BUSY`, `SQLITE_LOCKED` and their extended codes. SQLite's codes have at most four
/// digits, so an all-digit SQLSTATE such as `40001` is never taken for one.
pub(crate) fn sqlite_busy(code: &str) -> bool {
    code.len() < 5 && code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

/// Classifies a connect error: wrong database or credentials, and a TLS handshake the client
/// refuses (an untrusted or expired certificate, a server without TLS), are the caller's to
/// fix; a network failure names the server and the cause in one line.
pub(crate) fn connect_err(config: &SqlConfig, err: sqlx::Error) -> Error {
    let url = config.redacted_url();
    let server = || server_name(config);
    match &err {
        // rustls reports a refused handshake (an untrusted, expired or misnamed certificate) as
        // invalid data: retrying cannot help.
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => Error::backend(
            format!(
                "TLS with {} failed: {}",
                server(),
                distlock_core::io_cause(io).unwrap_or_default()
            ),
            err,
        ),
        sqlx::Error::Io(io) => Error::unavailable(
            format!(
                "cannot connect to {}: {}",
                server(),
                distlock_core::io_cause(io).unwrap_or_default()
            ),
            err,
        ),
        sqlx::Error::Tls(cause) => {
            Error::backend(format!("TLS with {} failed: {cause}", server()), err)
        }
        sqlx::Error::Database(db)
            if matches!(
                db.code().as_deref(),
                Some("3D000" | "28000" | "28P01" | "42000")
            ) =>
        {
            Error::backend(format!("cannot use {url}: {err}"), err)
        }
        sqlx::Error::Configuration(_) => Error::InvalidConfig(format!("{url}: {err}")),
        _ => map_err(&format!("connecting to {url}"), err),
    }
}

/// The database and where it is, for messages: `PostgreSQL at host:port` (no credentials).
pub(crate) fn server_name(config: &SqlConfig) -> String {
    let url = config.redacted_url();
    let server = url::Url::parse(&config.url)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.to_owned();
            Some(match u.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            })
        })
        .map_or(url, |s| distlock_core::service_url::echo(&s));
    let name = match config.dialect {
        Dialect::Postgres => "PostgreSQL",
        Dialect::MySql => "MySQL",
        Dialect::Sqlite => "SQLite",
    };
    format!("{name} at {server}")
}

/// A pooler between the client and PostgreSQL that gives one client connection's
/// transactions to different server sessions, found out as `evidence` says (a notification
/// lost or delivered to the wrong connection): refused, since the backend's LISTEN,
/// prepared statements and session settings belong to a session.
#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "PostgreSQL poolers only")
)]
pub(crate) fn pooler_err(config: &SqlConfig, evidence: &str) -> Error {
    Error::Unsupported(format!(
        "{} does not keep a session per connection ({evidence}): a pooler in transaction \
         pooling mode (PgBouncer pool_mode=transaction or statement) gives a connection's \
         transactions to different server sessions, so wake-ups, prepared statements and \
         session settings do not carry over; connect to PostgreSQL directly or through a \
         pooler in session mode (PgBouncer pool_mode=session)",
        server_name(config)
    ))
}

/// A statement that does not prepare: the table is missing or of the wrong shape.
pub(crate) fn shape_err(table: &str, err: sqlx::Error) -> Error {
    match &err {
        sqlx::Error::Database(_) => Error::backend(
            format!(
                "the lock table {table} is missing or has the wrong shape (expected columns name, owner, \
                 version, expires_at, next_owner, next_since, next_expires with name as primary key): {err}"
            ),
            err,
        ),
        _ => map_err("checking the lock table", err),
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use distlock_core::backend::retrying;

    use super::{RELEASE_RETRY, not_applied, rolled_back_code, transient_code};

    /// A database's refusal with SQLSTATE `.0`.
    #[derive(Debug)]
    struct Refused(&'static str);

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "refused with {}", self.0)
        }
    }

    impl std::error::Error for Refused {}

    impl sqlx::error::DatabaseError for Refused {
        fn message(&self) -> &str {
            "refused"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    /// How many times a release is sent ([`RELEASE_RETRY`] on [`not_applied`]) whose answers
    /// are `answers`, in turn (the last one again once they run out), and its final answer's
    /// code (`None`: applied).
    async fn sends(answers: &[Option<&'static str>]) -> (usize, Option<String>) {
        let sent = AtomicUsize::new(0);
        let answer = retrying("release", RELEASE_RETRY, not_applied, || async {
            let now = sent.fetch_add(1, Ordering::Relaxed);
            match answers[now.min(answers.len() - 1)] {
                None => Ok(()),
                Some(code) => Err(sqlx::Error::Database(Box::new(Refused(code)))),
            }
        })
        .await;
        let code = answer.err().map(|err| match err {
            sqlx::Error::Database(db) => db.code().unwrap_or_default().into_owned(),
            other => other.to_string(),
        });
        (sent.into_inner(), code)
    }

    /// Asserts that `answers` took `count` sends and paused `low` to `high` µs in all.
    async fn paused(answers: &[Option<&'static str>], count: usize, low: u64, high: u64) {
        let started = tokio::time::Instant::now();
        assert_eq!(sends(answers).await, (count, None), "{answers:?}");
        let took = started.elapsed();
        let (low, high) = (Duration::from_micros(low), Duration::from_micros(high));
        assert!(low <= took && took <= high, "{answers:?} paused {took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn only_what_applied_nothing_is_sent_again_at_most_twice() {
        // Applied at once: no pause.
        paused(&[None], 1, 0, 0).await;
        // A deadlock's rollback, then applied: sent again about 2 ms later.
        paused(&[Some("40001"), None], 2, 1_500, 2_000).await;
        // SQLite's BUSY and LOCKED (extended codes too): then about 4 ms after the second.
        paused(&[Some("517"), Some("6"), None], 3, 4_500, 6_000).await;
        // Rolled back every time: three sends, the last answer kept.
        let rolled = [Some("40P01"), Some("262"), Some("5")];
        assert_eq!(sends(&rolled).await, (3, Some("5".into())));
        // A statement that may have applied (a lost connection, a unique violation): once.
        for code in ["08006", "23505"] {
            assert_eq!(sends(&[Some(code), None]).await, (1, Some(code.into())));
        }
    }

    #[tokio::test]
    async fn a_transport_error_is_not_sent_again() {
        let sent = AtomicUsize::new(0);
        let answer: Result<(), _> = retrying("release", RELEASE_RETRY, not_applied, || async {
            sent.fetch_add(1, Ordering::Relaxed);
            Err(sqlx::Error::PoolTimedOut)
        })
        .await;
        assert!(matches!(answer, Err(sqlx::Error::PoolTimedOut)));
        assert_eq!(sent.into_inner(), 1);
    }

    #[test]
    fn only_deadlocks_and_serialization_failures_are_sent_again() {
        assert!(rolled_back_code("40001") && rolled_back_code("40P01"));
        for code in ["08006", "53300", "57P01", "23505", "5", "HYT00"] {
            assert!(!rolled_back_code(code), "{code}");
        }
    }

    #[test]
    fn retryable_codes_are_told_apart_by_dialect() {
        // SQLite: BUSY, LOCKED, BUSY_SNAPSHOT (517), LOCKED_SHAREDCACHE (262); not CONSTRAINT.
        for code in ["5", "6", "517", "262"] {
            assert!(transient_code(code), "{code}");
        }
        assert!(!transient_code("19"));
        // All-digit SQLSTATEs are not SQLite codes: serialization failure, connection failure,
        // too many connections are retryable; a unique violation is not.
        for code in ["40001", "08006", "53300", "40P01", "57P01", "HYT00"] {
            assert!(transient_code(code), "{code}");
        }
        for code in ["23505", "42P01", "00005"] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
