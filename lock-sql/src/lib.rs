#![doc = include_str!("../README.md")]
//!
//! PostgreSQL, MySQL/MariaDB and SQLite backends for distlock, one cargo feature each
//! (`postgres`, `mysql`, `sqlite`; `sqlite` is the default and the project's embedded backend).
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_core::Error> {
//! use distlock_sql::distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
//!
//! // A file next to the program: created on first use, with its table, in WAL mode.
//! let client = distlock_sql::connect("sqlite://locks.db", ClientConfig::default()).await?;
//! let guard = client.acquire("nightly-report", &AcquireOptions::default()).await?;
//! println!("fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The protocol
//!
//! One table (default `distlock_locks`, created at connect unless `create_table=false`; the
//! connect step also prepares every statement, so a table of the wrong shape is reported then):
//!
//! | column | meaning |
//! |---|---|
//! | `name` | the lock name, primary key, bound as a parameter and compared byte for byte (`TEXT COLLATE "C"` on PostgreSQL, `VARBINARY` on MySQL, `TEXT` with SQLite's binary collation), so no two distinct names collide |
//! | `owner` | the holder's unique owner value, `NULL` when released |
//! | `version` | **the fencing token**: raised by every acquisition (by one; by 16 when a PostgreSQL reader sets a range of readers' tokens, see [below](#fencing-and-readers-beside-readers)), never reset, kept on release; a new row starts at the database's clock in microseconds (see [below](#a-store-emptied-or-recreated)); a row free for [`forget_after`](SqlConfig::forget_after) is deleted (see [below](#what-is-left-in-the-tables)) |
//! | `expires_at` | end of the lease, on the **database's** clock |
//! | `next_owner`, `next_since`, `next_expires`, `next_ttl` | the waiter reservation (below); `next_ttl` is the lease an exclusive waiter asks for, for a hand-over (a permit waiter's negated, see [Shared holds and permits](#shared-holds-and-permits)) |
//! | `data` | the holder data of the exclusive hold (see below), `NULL` when none: `TEXT` (PostgreSQL, SQLite), `VARBINARY(2048)` (MySQL, the UTF-8 bytes) |
//!
//! - **Acquire** is one upsert statement (PostgreSQL: an `UPDATE .. WHERE free` and, for a
//!   missing row, an `INSERT .. ON CONFLICT DO NOTHING` in one statement, so that a refused
//!   take locks no row and writes nothing; MySQL `ON DUPLICATE KEY UPDATE`; SQLite
//!   `ON CONFLICT DO UPDATE .. WHERE`) that takes the row only when it is free, expired (compared with
//!   `now()` / `UTC_TIMESTAMP(6)` / SQLite's `unixepoch('subsec')`, never the client's clock) or
//!   already this attempt's, and not reserved by another waiter; it sets the owner and the
//!   expiry and increments `version`. (SQLite's clock reads in milliseconds, truncated: its
//!   leases end a millisecond after the reading plus the ttl, never before the ttl has passed.) The database serializes upserts of one row, so at most one
//!   owner is live and versions are strictly increasing: [`FencingGuarantee::Linearizable`](distlock_core::FencingGuarantee::Linearizable)
//!   (releases keep the row; for rows deleted anyway, see below).
//! - **Renew** and **release** are `UPDATE .. WHERE name = ? AND owner = ? AND version = ? AND
//!   expires_at > now`; the affected-row count decides, and zero answers
//!   [`Error::NotHeld`](distlock_core::Error::NotHeld).
//! - **Batched renewal**: the watchdog renews a client's exclusive locks together, the same
//!   `UPDATE` joined to a list of (name, owner, version, ttl): one statement per batch of up
//!   to 1,024 locks on PostgreSQL (the list as four arrays, `unnest`, `RETURNING` the renewed),
//!   512 on SQLite (`UPDATE .. FROM (VALUES ..) RETURNING`) and on MySQL/MariaDB (a join to a
//!   `UNION ALL` list; the matched-row count answers, and only when some lock was refused a
//!   second statement reads which). Each lock is checked as a single renewal checks it, and a
//!   refused one is lost alone. Shared holds and permits: one function call per batch of up
//!   to 1,024 on PostgreSQL (four arrays) and one procedure call per batch of up to 512 on
//!   MySQL/MariaDB (a JSON array), each hold checked and extended by the statements of its
//!   single renewal, the rows locked in name order; on SQLite one by one (a short
//!   transaction of several statements each).
//! - **Abandon** (an attempt that ends without a guard) clears the owner's lock and
//!   reservation by owner value, so a lock granted by a reply that never arrived is freed.
//! - **Waiters**: a waiting attempt that finds the lock busy claims the single reservation
//!   slot of the row unless an *older* waiter (one that first saw a lower `version`) holds a
//!   live one; the upsert refuses everybody else while the reservation lives (1 s, renewed by
//!   the waiter's polls). The oldest waiter therefore gets the lock next, so a client that
//!   releases and re-acquires at once cannot starve the others. It is not strict FIFO (the
//!   slot goes to the oldest waiter *that has polled*), so `fifo` is not declared. After its
//!   first busy answer a waiter reads the row before it writes: busy polls cost no commit, and
//!   the reservation is written only when it is claimed or half expired.
//! - **Hand-over**: on PostgreSQL and MySQL/MariaDB, a release finding a live reservation of
//!   an exclusive waiter (`next_ttl` positive) hands the lock to that waiter in the releasing
//!   statement itself: the row becomes the waiter's, with the next `version` and the waiter's
//!   ttl from now, and the reservation is cleared. A handoff is then one statement and one
//!   commit (the waiter's take is done in it), instead of a release and a take. That commit
//!   hands out a fencing token, so it waits for its flush like a take. The waiter learns it
//!   holds the lock from its wake-up (below) or, should that be lost, from its next read of the
//!   row (its own owner value, unique per attempt); its local deadline counts from a request
//!   sent before the release (a read that saw the previous holder, or the locking read after
//!   its wake-up, minus the lease already used), so it never outlives the server's lease. A
//!   grant that arrives after its lease ran out (a paused waiter) is released and asked for
//!   again by the core, so a paused or killed waiter at the head blocks the others for its
//!   ttl at most, as before. A lock table of an earlier version gets the column at connect
//!   when `create_table` is on (checked first, so that no `ALTER` waits on a busy table);
//!   without it (and on SQLite), releases free the lock and the waiter takes it.
//! - **Wake-ups**: on PostgreSQL the releasing statement runs
//!   `pg_notify('distlock:<table>', ...)`: a hand-over notification names the new holder and
//!   its version (`h<version>:..`), and tells the other waiters of this client that the
//!   reservation is free, which they claim at once without a read; a release without a
//!   hand-over (a shared waiter holds the reservation) is addressed to that waiter; a
//!   `LISTEN`ing connection per backend wakes only the tasks concerned
//!   ([`WakeUp::Event`](distlock_core::WakeUp::Event)). The taking statement of a reserved
//!   waiter wakes the other waiters, so the next one claims the reservation (a claim returns
//!   whether the lock is free by then, so a release between a waiter's read and its claim is
//!   not missed). A lost notification (listener reconnect) wakes everybody; the core's
//!   backoff maximum is the safety net. The freeing releases and the reservations commit
//!   without waiting for their WAL flush (`synchronous_commit` off for that transaction
//!   only): neither needs to survive a database crash on its own (a lost release leaves the
//!   lock held until its lease ends), and the next take or hand-over commits synchronously,
//!   which flushes them with it.
//! - **MySQL/MariaDB wake locks**: a take of an existing row also takes a user-level lock,
//!   the holder's *wake lock* (`GET_LOCK('distlock:<hash of table and name>:<version>', 0)`,
//!   in the same statement), and its connection stays with the lease until the release, which
//!   gives the wake lock up in its own statement. The waiter holding the reservation waits for
//!   it on the server (`GET_LOCK(.., at most 2 s)`, on a connection of its own, in a task of
//!   its own that survives the core's polls). When it is given up, a locking read (which
//!   waits for the release's commit) on the same connection tells whether the release handed
//!   the waiter the lock, and takes the waiter's own wake lock in the same statement, so its
//!   connection stays with the lease for the next waiter; otherwise the waiter takes the lock
//!   at once. A waiter that finds the new holder's wake lock not yet taken (it is taken just
//!   after a hand-over) reads and waits again, up to 3 times, before it polls that holder. At most a quarter of the pool is kept by holders and at most a
//!   quarter waits (none of a pool under 4); beyond that, for a first take (which inserts the
//!   row) and when the holder has no wake lock, the waiter polls as before. A cancelled wait
//!   is killed on the server (`KILL QUERY`, its connection then closed); a cancelled take or
//!   release closes its connection, which gives the wake lock up. Wake locks are hints only:
//!   exclusion and fencing rest on the row alone. Statement-based binary logging
//!   (`binlog_format=STATEMENT`) logs every take as unsafe; use `ROW` or `MIXED`.
//!   A writer waiting for readers waits on the latest reader's (see "MySQL/MariaDB's readers
//!   take a wake lock" below). Other waiters, and SQLite's, poll
//!   ([`WakeUp::Polling`](distlock_core::WakeUp::Polling)) with the core's jittered backoff
//!   bounded by the holder's remaining lease; a reserved waiter without a wake lock to wait
//!   on reads every 1-20 ms.
//! - **Loss** is detected by renewal (a refused owner-checked renewal, or the local deadline).
//! - **Holder data** ([`AcquireOptions::with_data`](distlock_core::AcquireOptions::with_data),
//!   [`LockGuard::set_data`](distlock_core::LockGuard::set_data)) is the `data` column of
//!   the hold's row, written by one `UPDATE .. SET data = ? WHERE name = ? AND owner = ? AND
//!   version = ? AND expires_at > now`, checked as a renewal is (zero rows answers
//!   [`Error::NotHeld`](distlock_core::Error::NotHeld)) but leaving the lease as it is. It
//!   ends with the hold: every statement that takes, frees or hands over the row (take,
//!   release, hand-over, abandon, forced release, a shared holder's marker) clears it in the
//!   same statement, so an inspection (one statement reading the owner, version, lease and
//!   data together) never shows a former hold's data; renewals keep it. A lock table of an
//!   earlier version gets the column at connect when `create_table` is on (checked first, as
//!   `next_ttl`); without it, holds carry no data and
//!   [`Capabilities::holder_data`](distlock_core::Capabilities::holder_data) is off. During
//!   a rolling upgrade from a version without the column, a hold an older client took shows
//!   its predecessor's data (the older client does not clear a column it does not know).
//!
//! # Shared holds and permits
//!
//! Read-write locks ([`LockKind::Shared`](distlock_core::LockKind::Shared)) and semaphores of
//! up to [`MAX_PERMITS`] permits ([`LockKind::Permit`](distlock_core::LockKind::Permit)) keep
//! one row per holder in a second table, `<table>_holders` (`name`, `owner`, `token`,
//! `expires_at`, `permits`, `data`: the holder's data, as in the lock table; primary key
//! `(name, owner)`), created at the first shared or permit acquisition unless
//! `create_table=false` (with it, a holders table of an earlier version gets the `data`
//! column at that first use). Lock tables of earlier versions keep working as they are;
//! exclusive locks never touch the second table.
//!
//! - An acquisition, renewal or release of a shared hold or permit is one short transaction
//!   (at READ COMMITTED; SQLite `BEGIN IMMEDIATE`) that first locks the name's row of the lock
//!   table (`SELECT .. FOR UPDATE`, inserting a free row if missing), so that every change of
//!   one name's holders is serialized by that row (but a reader's release: below, "A reader
//!   leaves without locking the name's row"; a MariaDB/MySQL reader joining live readers,
//!   which locks the row by the `UPDATE` that steps its version: join procedure `_v4`; and a
//!   MariaDB/MySQL permit's release with a waiter queued, which locks it the same way and
//!   hands the permit over in place: release procedure `_v7`; and a PostgreSQL permit
//!   waiter's first join into a full semaphore, refused and queued without the row's lock:
//!   join function `_v10`, below). A refused acquisition rolls back.
//! - **PostgreSQL and MySQL/MariaDB** run each of those transactions as one call of a
//!   server-side routine (PL/pgSQL functions `<table>_dl_join_v10`, `<table>_dl_renew_v10`,
//!   `<table>_dl_release_v10`; stored procedures `<table>_dl_join_v5`, `<table>_dl_renew_v1`,
//!   `<table>_dl_release_v7`; created with the lock table when missing; the same statements
//!   in the same order, but for the shortcuts of readers named above, a refused join writing
//!   nothing): one round trip (a PostgreSQL reader's release: two when it may be the last to
//!   leave and another transaction holds the name's row) instead of five to eight, so the
//!   name's row stays locked for a fraction of one. On PostgreSQL a refusal and a release
//!   commit without waiting for their WAL flush (as an exclusive release does: a release lost
//!   in a database crash leaves the hold until its lease ends); a join that takes and a
//!   renewal flush. With `create_table=false` the routines are used when they exist, else
//!   the transactions run (so does a client of an earlier version; both lock the row first,
//!   so they mix). The database user needs the right to create routines in the table's
//!   schema (MySQL: `CREATE ROUTINE`), as it needs it for tables; when the creation fails, a
//!   warning is logged and the transactions run. SQLite runs the transactions: its round
//!   trips stay in the process.
//! - While holders live, the lock row's `owner` is a **marker** (`\u{1}shared`,
//!   `\u{1}permits:N`, never a real owner) and its `expires_at` at least the latest holder
//!   expiry: the exclusive take (unchanged, one statement) refuses the name while they live
//!   and takes it when they have all expired, as it takes any expired lease. The last holder
//!   to leave frees the row.
//! - **Fencing**: every acquisition of any kind increments the row's `version` and takes it
//!   as its token (but a PostgreSQL reader beside live readers, below), so a shared holder's
//!   token lies between the writers before and after it, and permit tokens are unique and
//!   increasing (but those of PostgreSQL's permits handed over together, below).
//! - **Writer preference**: a waiting writer claims the waiter reservation as it does on a
//!   held lock, and a shared acquisition refuses while another waiter's reservation lives, so
//!   readers arriving after a waiting writer queue behind it. Waiting readers use the same
//!   reservation, the oldest first, and so do permit waiters, except with PostgreSQL's
//!   functions and MySQL's procedures, where they queue (below).
//! - A semaphore asked for with another number of permits, or a name used both as a
//!   semaphore and as a lock, answers [`Error::Mismatch`](distlock_core::Error::Mismatch)
//!   (read from the marker).
//! - A holder is live while its row has not expired **and** the lock row carries the marker:
//!   a forced release clears the marker and so ends every holder at once (the `version` is
//!   kept); the next shared or permit acquisition of a row without a live marker deletes the
//!   holder rows left behind. [`inspect`](distlock_core::DistributedLock::inspect) and
//!   [`list`](distlock_core::DistributedLock::list) show the latest holder (with its data)
//!   and how many hold. A holder's data is replaced in its own transaction, checked as its
//!   renewal (live marker, owner, token, unexpired row); a new holder row starts without.
//! - On PostgreSQL the last reader's release (any permit's release) notifies the waiter with
//!   the reservation, and a taker that held the reservation notifies the others, so readers
//!   behind one writer all wake.
//! - **Permit hand-over** (PostgreSQL's functions, a lock table with `next_ttl`): a permit
//!   waiter reserves with its ttl negated in `next_ttl` (an exclusive release hands over only
//!   to a positive one), and the release of a permit that leaves its semaphore one short of
//!   full gives that permit to the reserved waiter in the same transaction, as the waiter's
//!   own join would (a holder row of the waiter's, the next `version` as its token, its ttl
//!   from now), then notifies `h<version>:..` as the exclusive hand-over does: a permit
//!   changes hands in one call instead of a release, a wake-up and a join. Its commit hands
//!   out a token, so it waits for its flush. A waiter whose wake-up is lost finds no
//!   reservation on its next read and joins, which replaces the handed row by a new one of
//!   its own; an attempt abandoned while it held the reservation leaves the holders by owner
//!   as well. Functions of earlier clients (`_v1`) wake the waiter to join instead.
//! - **A queue of permit waiters** (PostgreSQL's functions, `_v4`): the single reservation
//!   serves one waiter at a time, and a semaphore's releases come faster than the next
//!   waiter's claim of it (three permits hand over three times as often as a lock): a
//!   release that found no reservation woke every waiter to join, and every hand-over woke
//!   every other waiter to claim the reservation (8 round trips per acquisition with 8
//!   contenders, issue 44). Now a refused permit join (waiting, not a try) puts its waiter in
//!   `<table>_queue (name, owner, seq, expires_at, ttl, permits)` in the same call (created
//!   with the functions), or keeps its place there, live for the reservation's lease (1 s, at
//!   most the ttl, from the clock once the row is locked; the waiter polls, so renews it,
//!   every third of that); a join takes only while the holders and the live waiters queued
//!   ahead of it (for the same number of permits) leave a permit, so waiters are served in
//!   the order they queued. A release hands each permit it leaves free to the
//!   first live waiter of the queue (its holder row, the next `version`, its ttl from the
//!   clock once the row is locked, which follows the waiter's last poll: `now()`, the
//!   transaction's start, may precede it; its place deleted), notifies it `h<version>:..` and wakes nobody else: an acquisition
//!   is a join and the release that ends it, two calls. A release hands only to places of
//!   its own number of permits (a waiter asking for another number gets
//!   [`Error::Mismatch`](distlock_core::Error::Mismatch) from its next poll). A waiter that
//!   gives up leaves in one call, its release by owner, which takes its place for good (a
//!   negative ttl that a poll still on its way cannot renew) and a permit handed to it
//!   meanwhile; a crashed waiter's place expires and is passed over, and a permit handed to
//!   it in its last second stays taken until that ttl ends, as with the reservation. The
//!   transactions, and clients of earlier versions, neither queue nor read the queue: they
//!   stay safe beside it (every join that takes and every release locks the row first), not
//!   fair (a release serves the queue before their reservation, and wakes them when permits
//!   stay free).
//!   Since `_v10` a waiter's first join that finds the semaphore full (the live holders and
//!   live places at least its permits, read without a lock) queues it and is refused
//!   without locking the name's row, so the refusals of a full semaphore no longer queue
//!   on that row with its releases; a release that counted before the place was committed
//!   and hands nothing wakes the waiters, as above, and their joins lock the row.
//!   Since `_v11` a release hands its permit to the first waiter without locking the name's
//!   row for update where it can: the row locked for share, the token drawn from the row's
//!   range of tokens (as a reader beside readers draws its own, below), which a hand-over
//!   with the row locked sets (the marker's expiry then covers half a lease more than the
//!   waiter's). Such hand-overs of different permits no longer wait for each other's commit
//!   and its flush on the name's one row. A waiter's refusal answers the last token drawn
//!   from the range as its version, so that the waiter, told of a later token, bounds its
//!   lease by that refusal's read, as it does for a hand-over with the row locked. Permits
//!   whose holds overlap may get their tokens in another order than they were handed over:
//!   unique, not ordered. A semaphore whose last holders die holding stays marked up to half
//!   a lease longer.
//! - **MySQL/MariaDB's queue of permit waiters** (stored procedures `_v2`): the same queue
//!   (`<table>_queue`, created with the procedures), the same rule for a join and the same
//!   hand-over in the release, but nothing notifies the waiter. A queued waiter reads
//!   instead, between its joins (which it repeats only to renew its place, every third of
//!   its lease): one statement that locks nothing says how many live waiters are ahead of
//!   it and whether a release handed it a permit (its token and the lease left, from which
//!   the waiter's local deadline counts: it never outlives the server's). It reads a
//!   millisecond per place ahead of it, half a millisecond later for each read in a row that
//!   found the same, at most every 20 ms. The read that finds a handed permit also takes
//!   the holder's wake lock (prefix, then the token) in the same statement, as a take does,
//!   and its connection stays with the lease: the release runs on it and gives the wake lock
//!   up once it committed. The waiter `k` places from the head waits on the server for the
//!   wake lock of the `k`-th oldest holder that has one (the queue is served in order, and
//!   holders mostly release in the order they took) and reads at once when it is given up;
//!   when another holder releases first, the brisk reads find it. A wait no longer needed
//!   (the waiter moved up, or holds) runs to its end in the background (the holder's
//!   release, a second at most) and keeps its connection, instead of being killed. Clients of
//!   earlier versions (`_v1`) neither queue nor read the queue: safe beside it, not fair.
//! - **MySQL/MariaDB's readers take a wake lock** (join procedure `_v3`): a join that takes
//!   also takes the new holder's wake lock (prefix, then its token) before its commit, on a
//!   connection that then stays with the lease (pinned, released on it), while two of the
//!   client's pin slots are free (one stays for its exclusive takes). The row's version is
//!   the latest reader's token, so a writer waiting at the head for the readers waits on the
//!   server for that reader's wake lock, mostly the last to leave, as it waits for a writer;
//!   should an older reader still hold, the wait finds the lock given up and the writer polls
//!   briskly. A reader's wait at the head runs to its end in the background when no longer
//!   needed (it keeps nothing), instead of being killed. Permit holders that joined get a wake lock the same way, which their
//!   queued waiters wait on. Joins of earlier clients (`_v2`) take none: their readers are
//!   polled. With `create_table=false`, the procedures of this version must exist (created
//!   by a client of this version with `create_table=true`), else the transactions are
//!   used.
//! - **Writer hand-over after the last reader** (PostgreSQL's functions, `_v3`; MySQL's
//!   release procedure, `_v3`): the release of the last shared holder (or permit) hands the
//!   lock to the exclusive waiter holding a live reservation (`next_ttl` positive) in the
//!   same transaction, as an exclusive release does: the row becomes the writer's with the
//!   next `version` (above every reader's token) and its ttl from now, committed before the
//!   writer can learn of it (on PostgreSQL the commit waits for its flush). On PostgreSQL
//!   `h<version>:..` tells the writer; on MySQL the writer, woken by the latest reader's
//!   wake lock, reads whether the row is its own (a locking read that takes its own wake
//!   lock, as after a writer's release) instead of writing it, and a writer that polls finds
//!   it in its read. Routines of earlier clients (PostgreSQL `_v2`, `_v1`; MySQL `_v2`) wake
//!   the writer to take the row itself; a MySQL writer of an earlier client woken by the
//!   wake lock after a hand-over takes its own row again (the next version).
//! - **A reader leaves without locking the name's row** (PostgreSQL's functions, `_v5`):
//!   every join and release of a name locked its one row until its commit, so readers of one
//!   name took turns on it (issue 44: 16 readers of one name made a third of the
//!   acquisitions of 16 clients on 1,000 names). A read hold's release now runs in steps.
//!   The first reads the row (not locked), deletes the holder's own row and looks for another
//!   live holder whose row no release or purge has locked, locking it (`FOR KEY SHARE SKIP
//!   LOCKED`) until its commit, which needs no flush: found, that holder's release comes
//!   after this one and sees it gone, and this release is done. Otherwise the holder was
//!   maybe the last, and the row locked does the rest (frees the name, or hands it to the
//!   reserved writer, or leaves it to holders that joined since): since `_v7` the first step
//!   itself when it can lock the row without waiting (`FOR UPDATE SKIP LOCKED`), else a
//!   second call (tried again on failure under
//!   [`RetryPolicy::TRANSIENT`](distlock_core::backend::RetryPolicy), since a release tried
//!   again from the start would find no hold). A holder the unlocked read cannot tell live
//!   (an expiry while its renewal is on its way) releases as before, the row locked. The
//!   first step waits for nothing once it holds a lock (it never waits for the name's row,
//!   and its look skips locked rows), so it cannot be part of a deadlock. A
//!   release that leaves others holding no longer lowers the row's `expires_at` to the latest
//!   live holder's: after a reader dies holding, a writer may wait for the end of a lease
//!   that a reader who left had (at most a ttl after its last renewal, or half a ttl more
//!   since `_v6`, below). A release stopped
//!   between the two steps (its future cancelled or timed out by the client's operation
//!   timeout, the process gone, the second step failing every retry) leaves the name to
//!   expire. MySQL/MariaDB's release procedure does the same since `_v4`, in one call: the
//!   first step's look locks the other holder's row `FOR UPDATE SKIP LOCKED` (MySQL has no
//!   `FOR KEY SHARE`), and a release that may be the last, finding the name's row locked by
//!   another transaction, commits its leave and goes on in a second transaction of the same
//!   call, which waits for that row holding nothing else (an error or a connection lost
//!   between the two leaves the name to expire, as above; the release answers that the hold
//!   is gone). Transactions and SQLite release as before.
//! - <a id="fencing-and-readers-beside-readers"></a>**A reader joins live readers without
//!   locking the name's row for update** (PostgreSQL's functions, `_v6`): each join locked
//!   the row until its commit, which waits for its flush, so joins of one name still took
//!   turns. A reader that finds the row carrying the live read marker, with a lease left of
//!   at least its ttl, no live reservation and a range of readers' tokens that is the row's,
//!   now locks the row only for share (which other such joins share; a writer's take, a
//!   reservation, a renewal or a release that locks it waits for their commits, and they for
//!   its), reads it again, and takes a token of the range: `read_base` plus the next value of
//!   the table's sequence `<table>_dl_reads`, kept only if it lies above `read_from` and
//!   below the row's `version`. The range is set by a reader that locks the row for update
//!   and joins live readers (the first reader of an epoch sets none: most names have one
//!   reader at a time, and a range would only cost them): its token is the next `version` as
//!   before, `read_from` that token, `version` moves 16 past it, and the row's expiry gets
//!   half a ttl more than the reader's lease, so that the readers after it join beside it. A
//!   range that draws for the table's other names spent (the sequence is the table's) is
//!   seen from the sequence's `last_value` before any lock for share. So a reader's token lies above the writer before it and below the
//!   writer after it (who takes `version` plus one), and tokens within a range are unique
//!   (the sequence hands each value once; a value cached by a session, a sequence made again
//!   or a range that a client of an earlier version moved past fails the checks and the
//!   reader locks the row for update). A join that would write the row (a new epoch or
//!   range, a longer lease) or be refused locks it for update without waiting when nobody
//!   holds it, else waits for the holder's commit while locking for share, and joins beside
//!   the readers that holder let in; a lock for share that finds the row changed is let go
//!   (a subtransaction rolled back) and the join looks again, at most three times, then
//!   locks the row for update. PostgreSQL lets a lock for share by-pass a lock for update
//!   that waits while only locks for share hold the row: a writer's reservation, a renewal
//!   or a release may wait for up to 15 readers' joins (a range) before the next join must
//!   lock the row for update behind it. Costs: a row whose last readers die holding stays
//!   held half a ttl longer (at most one and a half ttl after the latest join that set a
//!   range); each range moves the version 16 on (as 16 acquisitions, for "A store emptied
//!   or recreated"); the sequence starts at the database's clock in microseconds, like a
//!   new row, so one made again starts above the old one. A database user who may not use
//!   the sequence (`USAGE` or `UPDATE` on it) joins as before, the row locked for update;
//!   the sequence and the columns `read_base`, `read_from` are created with the functions
//!   and the table (`create_table`).
//!
//!   MySQL/MariaDB's join procedure does it differently since `_v4`: a reader that finds the
//!   row carrying the live read marker with no live reservation steps the row's version by
//!   one `UPDATE` that says so in its `WHERE` (its token, read back by `LAST_INSERT_ID`),
//!   then deletes a holder row of its own left from before and inserts its new one, so the
//!   row is locked for those statements and the commit, not from the join's first read; no
//!   other holder's row is read or locked (the join before purged the name's holder rows
//!   under the row's lock, so it waited for each leaving reader's release); lapsed rows are
//!   left to other joins and the sweeper. An `UPDATE` that finds the row otherwise changes
//!   nothing, and the join goes on as before.
//!
//!   On MySQL the writer's wait on the latest reader is cancelled on the server when no
//!   longer needed (as its wait on a writer is: its wake-up may keep a connection), not left
//!   to run to its end as a reader's is.
//! - **Reader hand-over after a writer** (PostgreSQL's functions, since `_v8`; every queued
//!   reader since `_v9`): a reader waiting
//!   for a writer reserves the next turn with its ttl negated in `next_ttl` (a writer's is
//!   positive), and the writer's release statement, finding that live reservation, frees
//!   the row and calls `<table>_dl_hand_read_v10` in the same statement, which does what the
//!   reader's join would: a new epoch, the row marked shared with the next `version`, a
//!   holder row of the reader's with that token and its ttl from the call's clock, and
//!   `h<version>:..` tells the reader, which reads its holder row and counts its lease from
//!   that read's send, with the server's remaining lease then: a round trip more in a
//!   writer's turn to the readers. Nothing a reader sent before bounds when the release's
//!   statement ran: a read sent while the release's commit waits for its flush still finds
//!   the writer, and a claim of the reservation sent then waits for that commit and is
//!   granted (a stale reservation). Counted from the last read that found the writer, as
//!   until then, a lease handed over with a commit made 500 ms slow ended 0.45-0.48 s after
//!   the server's (19 of 20 read holds, the reserved reader's and a queued one's), now
//!   0.012-0.032 s before it (mostly the drift margin); a writer handed the lock counts from
//!   the earlier of its last read and its last claim of the reservation, which the release
//!   read (its later claims are refused), so never late (a bound that leaves less than half
//!   the lease: from a read of the row). Since `_v9` the readers behind it are handed theirs
//!   in the same call: a waiting reader that a writer refuses (holding, or reserving the next
//!   turn) queues in the table of permit waiters (`permits` 0, its place live for a second from
//!   its last refused join; after its first it mostly looks without joining, so about a
//!   second), and the hand-over gives each live place, in order, a holder row with the next
//!   token and the ttl it queued with, told by its own `H<version>:..` (which wakes nobody
//!   else; the reserved reader's `h`, last, wakes the other waiters), and takes every
//!   reader's place of the name out. A reader's take, and its release (should a hand-over of
//!   a client before `_v9`, which keeps no queue, have left its place), takes its own place
//!   out; the hand-over and the queue need the user's rights on the queue table (else
//!   readers do not queue), as permit waiters do. One that gives
//!   up leaves its place barred (a negative ttl), as a permit waiter does, and releases by
//!   owner what it may have been handed. A reader whose place lapsed (a writer that held
//!   longer than a second) or that never queued (a client before `_v9`), told of the
//!   hand-over, joins it (the first of them sets a range of readers' tokens, the rest join
//!   beside), as every reader but the reserved one did before: each such join a commit that
//!   waits for its flush under the name's row lock, one after the other, which the last
//!   reader's release, and the writer after it, waited behind. The commit waits for its
//!   flush (it hands out a token). Until then the release woke the reserved reader,
//!   which joined: a round trip and a commit more in each writer's turn to the readers
//!   (`distlock bench --scenario rw-mix --clients 8`, four runs of each interleaved: writer →
//!   readers p50 1.06-1.27 ms before, 0.69-0.78 after). Races the hand-over leaves: a
//!   reader's poll that renews its reservation just after it was handed its hold leaves a
//!   stale reservation, which a join of another reader clears (one that finds its owner
//!   holding) and the release of any reader clears (a reader's reservation on a name read
//!   keeps its reader out of nothing; joins and releases of `_v7` clients clear neither);
//!   a reader whose reservation vanished while the name turned read
//!   joins instead of looking, and its join takes a read hold it was handed and not told of
//!   (the notification lost), renewed; a reader that gives up clears its reservation before
//!   it releases by owner what it may have been handed. Releases of earlier clients wake
//!   the reserved reader, which joins, as before. The release statement calls the function
//!   only where the functions exist and the user may execute it; a permit waiter of a client
//!   before `_v4`, which reserved with its ttl negated too, is taken for a reader only on a
//!   name used both as a semaphore and as a lock (a mismatch of kinds): it is then handed a
//!   read hold, never the exclusive lock, and its renewal fails.
//!
//! Errors: a dropped connection, a refused connection, SQLite `BUSY` and deadlocks are
//! [`Error::Unavailable`](distlock_core::Error::Unavailable) (retried by the core); anything else
//! the database says is [`Error::Backend`](distlock_core::Error::Backend) with sqlx's error as
//! the source.
//!
//! SQLite: a file (`sqlite://PATH`, created if missing) or `sqlite::memory:` (one database
//! for the pool, so `pool_size=1`). Journal mode WAL, `synchronous=NORMAL` (a process crash
//! loses nothing; a power loss can roll back the last acquisitions, and with them their
//! versions: use `synchronous=full` when tokens must survive power loss), busy timeout 5 s.
//! Several processes on one file exclude each other through SQLite's file locks, and may open
//! a new file at the same moment: setup steps that SQLite refuses at once as busy (the switch
//! to WAL) are retried for up to the busy timeout. Expiry uses the machine's wall clock,
//! shared by every process on the file.
//!
//! # A store emptied or recreated
//!
//! A row deleted by hand, a truncated table or a deleted SQLite file loses the counter of its
//! names. So a new row does not start at 1 but, as a missing Redis counter does, at the
//! database's clock in microseconds since the Unix epoch, and every version after it counts
//! up from there: tokens keep growing across the loss, as long as the database's clock did not
//! go back across it and the name was acquired fewer than once per microsecond on average
//! since its row was created. The holder of a deleted row learns it at its next renewal, which
//! finds no row: refused, the guard is lost. A SQLite client notices that its file was deleted
//! or replaced (it compares the file's identity before each statement): its connections to the
//! old file are closed, and it goes on with the file now at the path, with the lock table
//! created again if `create_table` allows.
//!
//! # What is left in the tables
//!
//! A name's row stays while its lock is used, so that a lock taken again and again is one
//! update of one row; once it has been free (released or expired, no waiter's reservation)
//! for [`SqlConfig::forget_after`] (`forget_after=` in the URL, 10 minutes by default) and
//! its version is below the database's clock by as much, a sweep deletes it, and the holders'
//! rows whose lease ended as long ago. Each client whose lock ends (released or lost)
//! sweeps the table in a round every half of `forget_after` (between 1 s and 5 min), all
//! clients of a table together at most twice a round (the claim is the `expires_at` of the
//! table's one reserved row, the one named `''`, which no lock name can be), in batches of
//! 1,000 rows, for as long as it was active within `forget_after`. So the table holds the
//! names used within about `forget_after` (before any client is active again after that),
//! not every name ever used: 100,000 names acquired and released once each left 100,000
//! rows (100 to 225 bytes each, indexes included) for good before; now they are gone one
//! sweep after `forget_after`. A swept name starts again from the database's clock, as a
//! new name does (see above): its tokens keep growing unless the database's clock went back
//! by more than `forget_after`.
//! Count what is kept with [`DistributedLock::footprint`](distlock_core::DistributedLock::footprint).
//!
//! Protected resources in the same database can be written with
//! [`SqlBackend::fenced_update`] ([`FencedUpdate`]).

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "mysql")]
pub use descriptor::MYSQL;
#[cfg(feature = "postgres")]
pub use descriptor::POSTGRES;
#[cfg(feature = "sqlite")]
pub use descriptor::SQLITE;
pub use distlock_core;
use distlock_core::{ClientConfig, LockClient, Result};
pub use sqlx;

mod attempt;
mod backend;
#[cfg(feature = "bench")]
#[cfg_attr(docsrs, doc(cfg(feature = "bench")))]
pub mod bench;
mod config;
mod db;
mod descriptor;
mod dialect;
mod error;
mod fence;
mod footprint;
mod hot;
mod keys;
mod kinds;
mod lease;
#[cfg(feature = "mysql")]
mod mysql;
mod pool;
#[cfg(feature = "postgres")]
mod postgres;
mod renew;
#[cfg(feature = "sqlite")]
mod sqlite;
mod sweep;
mod wake;

pub use backend::{MAX_PERMITS, SqlBackend, SqlPool};
pub use config::{
    BUSY_TIMEOUT, CONNECT_TIMEOUT, DEFAULT_FORGET_AFTER, DEFAULT_TABLE, Dialect, FORGET_AFTER,
    POOL_SIZE, SqlConfig,
};
pub use fence::{FenceConnection, FencedUpdate, SqlValue};

/// Connects to the database at `url` and returns a lock client over it. This is what
/// `distlock::connect` calls for `postgres://`, `mysql://` and `sqlite:` URLs.
///
/// # Errors
/// [`Error::InvalidConfig`](distlock_core::Error::InvalidConfig) for a bad URL or option; [`Error::Unavailable`](distlock_core::Error::Unavailable) when the server
/// cannot be reached within the connect timeout (default: `config.operation_timeout`);
/// [`Error::Backend`](distlock_core::Error::Backend) for a missing database or a lock table of the wrong shape.
pub async fn connect(url: &str, config: ClientConfig) -> Result<LockClient<SqlBackend>> {
    connect_with(SqlConfig::from_url(url)?, config).await
}

/// A lock client over the application's own pool (`sqlx::PgPool`, `MySqlPool` or
/// `SqlitePool`), with the default lock table: the locks share the pool's connections, TLS and
/// settings, and fenced writes can run in the application's own transactions
/// ([`FencedUpdate::execute`]). [`SqlBackend::from_pool`] takes a [`SqlConfig::for_pool`] to
/// change the table or turn its creation off.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use distlock_sql::distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
/// use distlock_sql::{FencedUpdate, sqlx};
///
/// let pool = sqlx::PgPool::connect("postgres://app@db.internal/app?sslmode=verify-full").await?;
/// let locks = distlock_sql::from_pool(pool.clone(), ClientConfig::default()).await?;
///
/// let guard = locks.acquire("account-7", &AcquireOptions::default()).await?;
/// let mut tx = pool.begin().await?;
/// // ... the application's own statements in `tx` ...
/// let write = FencedUpdate::new("accounts", "id", 7, "fence").set("balance", 120);
/// if write.execute(&mut *tx, guard.token()).await? {
///     tx.commit().await?; // our token is still the newest on the row
/// } else {
///     tx.rollback().await?; // a later holder wrote the row: the lock was lost
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`SqlBackend::from_pool`], and [`Error::InvalidConfig`](distlock_core::Error::InvalidConfig)
/// for a bad `config`.
pub async fn from_pool(
    pool: impl Into<SqlPool>,
    config: ClientConfig,
) -> Result<LockClient<SqlBackend>> {
    config.validate()?;
    let pool = pool.into();
    let sql = SqlConfig::for_pool(&pool)
        .with_connect_timeout(config::connect_timeout_for(config.operation_timeout));
    let backend = SqlBackend::from_pool(pool, sql).await?;
    LockClient::with_config(backend, config)
}

/// Like [`connect`], from an [`SqlConfig`] (e.g. built with its `with_*` methods).
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(
    mut sql: SqlConfig,
    config: ClientConfig,
) -> Result<LockClient<SqlBackend>> {
    config.validate()?;
    if sql.connect_timeout.is_none() {
        sql.connect_timeout = Some(config::connect_timeout_for(config.operation_timeout));
    }
    let backend = SqlBackend::connect(sql).await?;
    LockClient::with_config(backend, config)
}
