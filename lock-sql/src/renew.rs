//! Batched renewal (see [`Renewer`]): the watchdog's renewals of many exclusive leases of
//! one backend go to the database together, as one statement per batch.
//!
//! Each lease is renewed exactly as [`Lease::renew`] does it, by the same `UPDATE .. WHERE
//! name = ? AND owner = ? AND version = ? AND expires_at > now`, joined to the batch's list
//! (name, owner, version, ttl) instead of one lock's arguments: owner- and version-checked on
//! the row, the new expiry on the database's clock, and a refused lock does not stop the
//! others. The statement learns which rows it changed: PostgreSQL and SQLite by `RETURNING`,
//! MySQL/MariaDB (no `RETURNING` on `UPDATE`) by the matched-row count, and, only when fewer
//! rows matched than were asked, by a second statement that reads which of them are still
//! held (a lease refused by the update can never be held again: its version is gone or its
//! lease ended, and only an owner-checked renewal of a live lease extends it).
//!
//! A batch is sorted by name, so that two batches that meet on a row (a stale lease of one
//! client on a lock another client holds now) lock their rows in the same order. Shared holds
//! and permits: their renewal locks the lock row, extends the holder and stretches the lock
//! row's expiry over it, which no single statement of the three dialects expresses with the
//! same checks. On PostgreSQL and MySQL/MariaDB, where those statements run in a function
//! or procedure, a fourth one runs them for each hold of a batch (sorted by name, as the
//! exclusive batch), one call per batch ([`Db::renew_holds`](crate::db::Db::renew_holds));
//! on SQLite each hold is renewed by its own [`Lease::renew`] (a transaction).
//!
//! The batch sizes ([`Db::max_batch`](crate::db::Db::max_batch)) per database:
//! - PostgreSQL: [`PG_MAX_BATCH`]; the list goes as four arrays (`unnest($1::text[], ..)`),
//!   so every batch size is the same prepared statement of four parameters.
//! - MySQL/MariaDB and SQLite: [`LIST_MAX_BATCH`]; the list is written into the statement
//!   (four parameters a lease), padded with `NULL` rows to the next power of two, so that a
//!   connection prepares at most a dozen shapes.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::backend::{RenewItem, Renewer, downcast_lease};
use distlock_core::{Error, Lease, LockKind, Result};

use crate::backend::{Inner, micros};
use crate::error::map_err;
use crate::lease::SqlLease;

/// The most leases a PostgreSQL batch takes. The arrays have no parameter limit; the bound
/// is the statement's own work: 1,024 row updates (and row locks) in one transaction take a
/// few milliseconds, well within any operation timeout, and a failed statement makes the
/// core retry at most that many renewals.
#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "PostgreSQL only")
)]
pub(crate) const PG_MAX_BATCH: usize = 1024;

/// The most leases a MySQL/MariaDB or SQLite batch takes: a power of two (the padded list
/// sizes are). 512 leases are 2,048 parameters (SQLite allows 32,766, MySQL 65,535) and a
/// statement of about 20 KB (far below MySQL's `max_allowed_packet`); SQLite holds its
/// file's write lock while the statement runs, and 512 updates keep that about a
/// millisecond.
#[cfg_attr(
    not(any(feature = "mysql", feature = "sqlite")),
    allow(dead_code, reason = "MySQL and SQLite only")
)]
pub(crate) const LIST_MAX_BATCH: usize = 512;

/// One lease of a batch, as the statements bind it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Renewal<'a> {
    pub(crate) name: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) version: i64,
    pub(crate) ttl_us: i64,
}

/// The padded size of a list of `n` leases: the next power of two.
#[cfg_attr(
    not(any(feature = "mysql", feature = "sqlite")),
    allow(dead_code, reason = "MySQL and SQLite only")
)]
pub(crate) fn padded(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// Which of `batch` the rows `(name, owner, version)` that a statement returned are: whether
/// each lease was renewed, in order.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code, reason = "SQLite only"))]
pub(crate) fn renewed_by_rows(
    batch: &[Renewal<'_>],
    rows: impl IntoIterator<Item = (String, String, i64)>,
) -> Vec<bool> {
    let mut at: HashMap<(&str, &str, i64), Vec<usize>> = HashMap::with_capacity(batch.len());
    for (i, r) in batch.iter().enumerate() {
        at.entry((r.name, r.owner, r.version)).or_default().push(i);
    }
    let mut renewed = vec![false; batch.len()];
    for (name, owner, version) in rows {
        for &i in at
            .get(&(name.as_str(), owner.as_str(), version))
            .into_iter()
            .flatten()
        {
            renewed[i] = true;
        }
    }
    renewed
}

/// Whether each of `n` leases was renewed, from the 0-based positions a statement returned.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(dead_code, reason = "PostgreSQL and MySQL only")
)]
pub(crate) fn renewed_at(n: usize, positions: impl IntoIterator<Item = i64>) -> Vec<bool> {
    let mut renewed = vec![false; n];
    for i in positions {
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| renewed.get_mut(i)) {
            *slot = true;
        }
    }
    renewed
}

/// The renewer of one backend's exclusive leases, kept in its shared state: every lease of
/// the backend names the same one, so the watchdog batches them all.
#[derive(Debug)]
pub(crate) struct SqlRenewer {
    max_batch: usize,
}

impl SqlRenewer {
    pub(crate) fn shared(max_batch: usize) -> Arc<dyn Renewer> {
        Arc::new(Self { max_batch })
    }
}

/// Where an item's answer comes from.
enum Slot<'a> {
    /// Position in the batch of exclusive leases.
    Batched(usize),
    /// Position in the batch of shared holds and permits.
    Held(usize),
    /// Renewed on its own: a lease this batch cannot take (another backend's, or a hold
    /// where the database renews holds one by one).
    Single(&'a dyn Lease),
    /// Not a lease of this crate.
    Foreign,
}

/// The positions of `batch` in the order of their names: batches that meet lock their rows
/// in one order.
fn name_order<T>(batch: &[T], name: impl Fn(&T) -> &str) -> Vec<usize> {
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by(|&a, &b| name(&batch[a]).cmp(name(&batch[b])));
    order
}

/// The answers to a batch sent in `order` ([`name_order`]), back in the batch's order.
fn unsorted(order: &[usize], answers: Vec<bool>) -> Vec<bool> {
    let mut renewed = vec![false; order.len()];
    for (&i, ok) in order.iter().zip(answers) {
        renewed[i] = ok;
    }
    renewed
}

#[async_trait]
impl Renewer for SqlRenewer {
    fn max_batch(&self) -> usize {
        self.max_batch
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Result<()>>> {
        let mut home: Option<&Arc<Inner>> = None;
        let mut slots = Vec::with_capacity(items.len());
        let (mut batch, mut holds) = (Vec::new(), Vec::new());
        for item in items {
            let slot = match downcast_lease::<SqlLease>(item.lease) {
                Some(lease)
                    if home.is_none_or(|h| Arc::ptr_eq(h, &lease.inner))
                        && (lease.kind == LockKind::Exclusive
                            || lease.inner.db.batches_holds()) =>
                {
                    home = Some(&lease.inner);
                    match lease.held() {
                        None => {
                            batch.push(Renewal {
                                name: lease.name.as_str(),
                                owner: &lease.owner,
                                version: lease.version,
                                ttl_us: micros(item.ttl),
                            });
                            Slot::Batched(batch.len() - 1)
                        }
                        Some(held) => {
                            holds.push((held, micros(item.ttl)));
                            Slot::Held(holds.len() - 1)
                        }
                    }
                }
                Some(_) => Slot::Single(item.lease),
                None => Slot::Foreign,
            };
            slots.push((slot, item.ttl));
        }
        let (mut renewed, mut held) = (Vec::new(), Vec::new());
        if let Some(inner) = home {
            let db = &inner.db;
            if !batch.is_empty() {
                let order = name_order(&batch, |r| r.name);
                let sorted: Vec<Renewal<'_>> = order.iter().map(|&i| batch[i]).collect();
                let answers = db.renew_many(&sorted).await;
                renewed = unsorted(&order, answers.map_err(|e| map_err("renew", e))?);
            }
            if !holds.is_empty() {
                let order = name_order(&holds, |(h, _)| h.name);
                let sorted: Vec<_> = order.iter().map(|&i| holds[i]).collect();
                let answers = db.renew_holds(&sorted).await;
                held = unsorted(&order, answers.map_err(|e| map_err("renew", e))?);
            }
        }
        let answer = |ok: Option<&bool>, name: &str| {
            if ok.copied().unwrap_or(false) {
                Ok(())
            } else {
                Err(Error::NotHeld {
                    name: name.to_owned(),
                })
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (slot, ttl) in slots {
            out.push(match slot {
                Slot::Batched(i) => answer(renewed.get(i), batch[i].name),
                Slot::Held(i) => answer(held.get(i), holds[i].0.name),
                Slot::Single(lease) => lease.renew(ttl).await,
                Slot::Foreign => Err(Error::Backend {
                    message: "a lease of another backend in a distlock-sql renewal".to_owned(),
                    source: None,
                }),
            });
        }
        Ok(out)
    }
}

/// A list batch's statements, one per padded size (1, 2, 4, .. the most).
#[derive(Debug)]
#[cfg_attr(
    not(any(feature = "mysql", feature = "sqlite")),
    allow(dead_code, reason = "MySQL and SQLite only")
)]
pub(crate) struct BySize(Vec<Arc<str>>);

#[cfg_attr(
    not(any(feature = "mysql", feature = "sqlite")),
    allow(dead_code, reason = "MySQL and SQLite only")
)]
impl BySize {
    /// `make(rows)` writes the statement of a list of `rows` leases; `max` is a power of two.
    pub(crate) fn new(max: usize, make: impl Fn(usize) -> String) -> Self {
        let mut all = Vec::new();
        let mut rows = 1;
        while rows <= max {
            all.push(make(rows).into());
            rows *= 2;
        }
        Self(all)
    }

    /// The statement for `n` leases (of [`padded`]`(n)` rows), if `n` is within the most.
    pub(crate) fn get(&self, n: usize) -> Option<&Arc<str>> {
        let at = usize::try_from(padded(n).trailing_zeros()).ok()?;
        self.0.get(at)
    }

    /// The statement of one lease, prepared at connect (a table of the wrong shape is
    /// reported then).
    pub(crate) fn first(&self) -> Option<&Arc<str>> {
        self.0.first()
    }
}

/// The error of a batch larger than the dialect's most (the core splits batches by
/// [`Renewer::max_batch`], so this is a bug, not a database's answer).
#[cfg_attr(
    not(any(feature = "mysql", feature = "sqlite")),
    allow(dead_code, reason = "MySQL and SQLite only")
)]
pub(crate) fn too_many(n: usize) -> sqlx::Error {
    sqlx::Error::InvalidArgument(format!("a renewal batch of {n} leases is over the limit"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease<'a>(name: &'a str, owner: &'a str, version: i64) -> Renewal<'a> {
        Renewal {
            name,
            owner,
            version,
            ttl_us: 1,
        }
    }

    #[test]
    fn lists_are_padded_to_powers_of_two_up_to_the_most() {
        assert_eq!([0, 1, 2, 3, 5, 512].map(padded), [1, 1, 2, 4, 8, 512]);
        let sizes = BySize::new(8, |rows| rows.to_string());
        let got = [1, 2, 3, 4, 5, 8].map(|n| sizes.get(n).map(|s| s.to_string()));
        let want = ["1", "2", "4", "4", "8", "8"].map(|s| Some(s.to_owned()));
        assert_eq!(got, want);
        assert!(sizes.get(9).is_none(), "over the most");
        assert_eq!(sizes.first().map(|s| s.as_ref()), Some("1"));
    }

    #[test]
    fn answers_follow_the_batch_order() {
        assert_eq!(renewed_at(4, [2, 0, 9, -1]), [true, false, true, false]);
        let batch = [lease("a", "x", 1), lease("b", "x", 2), lease("a", "y", 3)];
        let rows = [
            ("a".to_owned(), "y".to_owned(), 3),
            ("b".to_owned(), "x".to_owned(), 2),
        ];
        assert_eq!(renewed_by_rows(&batch, rows), [false, true, true]);
        // Another version of a held name is not this lease.
        let rows = [("a".to_owned(), "x".to_owned(), 7)];
        assert_eq!(renewed_by_rows(&batch, rows), [false, false, false]);
    }
}
