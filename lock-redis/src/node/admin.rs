//! Operators' requests on one master: who holds a lock ([`Node::inspect`]), its forced
//! release, and the names and keys under a prefix (by `SCAN`).

use distlock_core::{LockKind, LockName, Result};

use super::{Node, ReleaseMode};
use crate::RedisConfig;
use crate::error::RedisError;
use crate::keys::LockKeys;
use crate::kinds::{self, Holder, marker_kind};
use crate::scripts;

/// The answer of [`scripts::INSPECT`]: the lock key's value and `PTTL`, the data and the
/// fencing counter.
type Inspected = (Option<Vec<u8>>, i64, Option<String>, Option<u64>);

/// Who holds a lock on one master, as [`Node::inspect`] reads it.
#[derive(Debug)]
pub(crate) enum Holding {
    Free,
    /// An exclusive holder, its remaining lease (ms), the data stored with its hold, and the
    /// fencing counter (on one master, the holder's token: see [`Node::inspect`]).
    Exclusive {
        owner: String,
        pttl: i64,
        data: Option<String>,
        counter: Option<u64>,
    },
    /// Live shared or permit holders (never empty).
    Holds {
        kind: LockKind,
        holders: Vec<Holder>,
    },
}

/// How many times a forced release reads the holder and tries to end it, when the holder
/// changes between the two.
const FORCE_TRIES: usize = 8;

impl Node {
    /// Frees the lock whoever holds it: reads the holder and runs the owner-checked release
    /// script as that owner (shared or permit holders: the hold release script ending them
    /// all), so waiters are handed the lock and woken exactly as by a release. The fencing
    /// counter is untouched. Returns the owners of the live holds it ended (the exclusive
    /// holder read and released by owner, or the shared or permit holders the script found
    /// live), for a Redlock client to count on how many masters each held; none: free (or
    /// only reserved for a waiter). [`RedisErrorKind::Contended`](crate::RedisErrorKind) if the
    /// holder changed at each of its reads.
    pub(crate) async fn force_release(
        &self,
        keys: &LockKeys,
        config: &RedisConfig,
    ) -> Result<Vec<String>, RedisError> {
        for _ in 0..FORCE_TRIES {
            match self.inspect(keys).await? {
                Holding::Free => return Ok(Vec::new()),
                Holding::Exclusive { owner, .. } => {
                    let (mode, kind) = (ReleaseMode::Release, LockKind::Exclusive);
                    if self.release(keys, &owner, config, mode, kind, None).await? {
                        return Ok(vec![owner]);
                    }
                }
                Holding::Holds { kind, .. } => {
                    let mut conn = self.conn.clone();
                    let call =
                        kinds::release_call(keys, "", config, ReleaseMode::Force, kind, None);
                    let answer: redis::Value =
                        call.invoke(&mut conn).await.map_err(|e| self.classify(e))?;
                    // An array of the owners ended; 0: the key held no marker of `kind`.
                    if let redis::Value::Array(owners) = answer
                        && !owners.is_empty()
                    {
                        return owners
                            .iter()
                            .map(redis::from_redis_value_ref::<String>)
                            .collect::<Result<_, _>>()
                            .map_err(|e| self.classify(e.into()));
                    }
                }
            }
            // The holder changed between the read and the script: look again.
        }
        Err(RedisError::contended(
            &self.addr,
            format!("another holder at each of {FORCE_TRIES} reads"),
        ))
    }

    /// Releases the one hold of `owner` with `token`, as its holder's release would (the
    /// owner-checked release script, waiters handed the lock and woken). The token is read
    /// first (by [`Self::inspect`]): an exclusive holder's is the fencing counter (nothing
    /// steps it while the lock is held), a shared or permit holder's its entry in the tokens
    /// hash. Owners are unique per
    /// acquisition, so the owner-checked script that follows removes that very hold, or
    /// nothing if it ended meanwhile. `false`: no live hold with that owner and token.
    pub(crate) async fn release_hold(
        &self,
        keys: &LockKeys,
        config: &RedisConfig,
        owner: &str,
        token: u64,
    ) -> Result<bool, RedisError> {
        let kind = match self.inspect(keys).await? {
            Holding::Exclusive {
                owner: holder,
                counter,
                ..
            } if holder == owner => {
                if counter != Some(token) {
                    return Ok(false);
                }
                LockKind::Exclusive
            }
            Holding::Holds { kind, holders }
                if holders
                    .iter()
                    .any(|h| h.owner == owner && h.token == Some(token)) =>
            {
                kind
            }
            _ => return Ok(false),
        };
        self.release(keys, owner, config, ReleaseMode::Release, kind, None)
            .await
    }

    /// The names whose lock key exists and starts with `prefix`, by `SCAN` (never `KEYS`), until
    /// the scan ends or `enough` are found.
    pub(crate) async fn scan_names(
        &self,
        prefix: &str,
        enough: usize,
    ) -> Result<Vec<LockName>, RedisError> {
        self.scan_names_on(self.conn.clone(), prefix, enough).await
    }

    /// [`Self::scan_names`] on `conn` (a cluster master's own connection).
    pub(crate) async fn scan_names_on(
        &self,
        mut conn: impl redis::aio::ConnectionLike,
        prefix: &str,
        enough: usize,
    ) -> Result<Vec<LockName>, RedisError> {
        let pattern = crate::keys::lock_key_pattern(prefix);
        let mut names = std::collections::BTreeSet::new();
        self.scan(&mut conn, &pattern, |keys| {
            names.extend(keys.iter().filter_map(|k| crate::keys::name_of_lock_key(k)));
            names.len() < enough
        })
        .await?;
        Ok(names.into_iter().collect())
    }

    /// `SCAN MATCH pattern` on `conn`, each batch of keys given to `each` until it answers
    /// `false` or the scan is complete.
    async fn scan(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        pattern: &str,
        mut each: impl FnMut(&[String]) -> bool,
    ) -> Result<(), RedisError> {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await
                .map_err(|e| self.classify(e))?;
            cursor = next;
            if !each(&keys) || cursor == 0 {
                return Ok(());
            }
        }
    }

    /// Counts the keys of every kind of the names starting with `prefix` on `conn` (one
    /// master), into `footprint`, by kind (see [`crate::keys::kind_of_key`]).
    pub(crate) async fn count_keys_on(
        &self,
        mut conn: impl redis::aio::ConnectionLike,
        prefix: &str,
        footprint: &mut distlock_core::Footprint,
    ) -> Result<(), RedisError> {
        let pattern = crate::keys::any_key_pattern(prefix);
        self.scan(&mut conn, &pattern, |keys| {
            for kind in keys.iter().filter_map(|k| crate::keys::kind_of_key(k)) {
                footprint.add(kind, 1);
            }
            true
        })
        .await
    }

    /// Who holds the lock. An exclusive holder is read with its data and the fencing counter
    /// in one script ([`scripts::INSPECT`]). On one master (also Sentinel, Cluster) the
    /// counter is the holder's token: only a granted acquisition steps it, and none is
    /// granted while the lock is held (the acquire script's retry and
    /// [`Self::release_hold`] rely on the same); it is missing once forgotten
    /// ([`RedisConfig::forget_after`] after the acquisition, for a lock held longer). Under
    /// Redlock it is not the token (that is the majority's largest counter, and a master's
    /// counter is raised to it), so Redlock does not report it. Shared and permit
    /// holders are read from their sorted set (live: lease not over by the server's clock)
    /// with their tokens, in a second round trip (their data: [`Self::data_of`]).
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> Result<Holding, RedisError> {
        let classify = |e| self.classify(e);
        let mut conn = self.conn.clone();
        let (value, pttl, data, counter): Inspected =
            scripts::Invocation::new(&scripts::INSPECT, &[&keys.lock, &keys.data(), &keys.fence])
                .invoke(&mut conn)
                .await
                .map_err(classify)?;
        let Some(value) = value else {
            return Ok(Holding::Free);
        };
        if let Some(kind) = marker_kind(&value) {
            return kinds::read_holders(&mut conn, keys, kind)
                .await
                .map_err(classify);
        }
        // A reservation for a waiter is nobody's lock (yet).
        match String::from_utf8(value) {
            Ok(owner) if !owner.starts_with(scripts::RESERVED_PREFIX) => Ok(Holding::Exclusive {
                owner,
                pttl,
                data,
                counter,
            }),
            _ => Ok(Holding::Free),
        }
    }

    /// The data stored with `owner`'s hold (its field of the data hash, see
    /// [`scripts::SET_DATA`]), if any: that of a shared or permit holder that
    /// [`Self::inspect`] showed.
    pub(crate) async fn data_of(
        &self,
        keys: &LockKeys,
        owner: &str,
    ) -> Result<Option<String>, RedisError> {
        let mut conn = self.conn.clone();
        redis::cmd("HGET")
            .arg(keys.data())
            .arg(owner)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.classify(e))
    }
}
