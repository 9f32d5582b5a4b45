//! Shared holds (read-write locks) and permits (semaphores) on PostgreSQL, MariaDB and a
//! SQLite file: how many hold at once, writer preference, expiry of crashed holders, the
//! order of fencing tokens, kinds that never mix, forced release, the release of one hold by
//! its owner and token, and lock tables created by an earlier version.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, DistributedLock, Error, LockClient, LockKind, Renewal};
use distlock_sql::SqlBackend;

mod common;

use common::{exec, unique};

async fn client(url: &str) -> LockClient<SqlBackend> {
    common::client_with(url, Duration::from_secs(3)).await
}

fn opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(20))
}

fn shared() -> AcquireOptions {
    opts(Duration::from_secs(10)).shared()
}

fn writer() -> AcquireOptions {
    opts(Duration::from_secs(10))
}

fn permits(n: u32) -> AcquireOptions {
    opts(Duration::from_secs(10)).with_permits(n)
}

/// Checks that no reader of `client` joins the writer `got` handed `name`, then releases it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn writer_alone(client: &LockClient<SqlBackend>, name: &str, got: distlock_core::LockGuard) {
    assert!(
        client
            .try_acquire(name, &shared())
            .await
            .expect("try")
            .is_none(),
        "a reader joined the writer"
    );
    got.release().await.expect("release the handed lock");
}

/// Two readers hold at once, a writer cannot join them, inspection counts them, and the
/// writer gets the lock once both left.
async fn readers_share_and_exclude_writers(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let name = unique("rw");
    let r1 = a.acquire(&name, &shared()).await.expect("first reader");
    let r2 = b
        .try_acquire(&name, &shared())
        .await
        .expect("try")
        .expect("a second reader joins the first");
    assert_eq!(r2.kind(), LockKind::Shared);
    assert!(r2.token() > r1.token());
    assert!(
        b.try_acquire(&name, &writer())
            .await
            .expect("try")
            .is_none()
    );
    let info = a.inspect(&name).await.expect("inspect").expect("held");
    assert_eq!(
        (info.kind, info.holders, info.owner.as_str(), info.token),
        (LockKind::Shared, 2, r2.owner(), Some(r2.token()))
    );
    assert!(info.remaining.expect("remaining") > Duration::from_secs(5));
    let listed = a.list(Some(&name), 10).await.expect("list");
    assert_eq!(listed.len(), 1);
    let seen = &listed[0].1;
    assert_eq!(
        (seen.kind, seen.holders, &seen.owner, seen.token),
        (info.kind, info.holders, &info.owner, info.token)
    );
    r1.renew().await.expect("a reader renews");
    r1.release().await.expect("release");
    assert!(
        b.try_acquire(&name, &writer())
            .await
            .expect("try")
            .is_none()
    );
    let t2 = r2.token();
    r2.release().await.expect("release");
    assert_eq!(a.inspect(&name).await.expect("inspect"), None);
    let w = b
        .try_acquire(&name, &writer())
        .await
        .expect("try")
        .expect("free after the last reader");
    assert!(w.token() > t2);
    w.release().await.expect("release");
}

/// A writer excludes readers; tokens order writer < later reader < later writer.
async fn writer_excludes_readers(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let name = unique("wr");
    let w1 = a.acquire(&name, &writer()).await.expect("writer");
    assert!(
        b.try_acquire(&name, &shared())
            .await
            .expect("try")
            .is_none()
    );
    let reader = {
        let b = b.clone();
        let name = name.clone();
        tokio::spawn(async move { b.acquire(&name, &shared()).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!reader.is_finished(), "a reader joined a writer");
    let t1 = w1.token();
    w1.release().await.expect("release");
    let r = reader
        .await
        .expect("task")
        .expect("reader after the writer");
    let tr = r.token();
    assert!(tr > t1);
    r.release().await.expect("release");
    let w2 = a.acquire(&name, &writer()).await.expect("second writer");
    assert!(w2.token() > tr);
    w2.release().await.expect("release");
}

/// A waiting writer queues new readers behind it and gets the lock within a bounded time
/// under a stream of readers.
async fn waiting_writer_is_not_starved(url: &str) {
    let (a, b, c) = (client(url).await, client(url).await, client(url).await);
    let name = unique("starve");
    let first = a.acquire(&name, &shared()).await.expect("first reader");
    let stop = Arc::new(AtomicBool::new(false));
    let joined = Arc::new(AtomicUsize::new(0));
    // Readers keep coming, overlapping each other, so that without writer preference the
    // lock would never be free of readers.
    let stream = {
        let (c, name, stop, joined) = (c.clone(), name.clone(), stop.clone(), joined.clone());
        tokio::spawn(async move {
            let mut held: Vec<(Instant, distlock_core::LockGuard)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(g) = c.try_acquire(&name, &shared()).await.expect("try") {
                    joined.fetch_add(1, Ordering::Relaxed);
                    held.push((Instant::now(), g));
                }
                // Each reader holds 60 ms: a new one comes every 10-20 ms.
                while held
                    .first()
                    .is_some_and(|(at, _)| at.elapsed() > Duration::from_millis(60))
                {
                    held.remove(0).1.release().await.expect("release");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for (_, g) in held {
                let _ = g.release().await;
            }
        })
    };
    // The first of them joins the first reader (at once on a quiet machine).
    let deadline = Instant::now() + Duration::from_secs(10);
    while joined.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "readers share the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let w = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.acquire(&name, &writer()).await })
    };
    // Once the writer waits (it claimed the reservation), new readers are refused.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = joined.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        joined.load(Ordering::Relaxed),
        before,
        "a reader joined while a writer waited"
    );
    first.release().await.expect("release");
    let w = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .expect("the writer starved")
        .expect("task")
        .expect("writer");
    assert!(started.elapsed() < Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    w.release().await.expect("release");
    stream.await.expect("stream");
}

/// At most N permit holders at once under contention; every permit token is unique.
async fn permits_bound_holders(url: &str) {
    permits_bound_among(&[url; 4]).await;
}

/// [`permits_bound_holders`] with a client of each of `urls`.
async fn permits_bound_among(urls: &[&str]) {
    const N: u32 = 3;
    let name = unique("sem");
    let gauge = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for url in urls {
        let c = client(url).await;
        for _ in 0..3 {
            let (c, name) = (c.clone(), name.clone());
            let (gauge, peak, tokens) = (gauge.clone(), peak.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    let g = c.acquire(&name, &permits(N)).await.expect("permit");
                    let now = gauge.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().unwrap().push(g.token().get());
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    gauge.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= N as usize, "{peak} holders of {N} permits");
    assert!(peak >= 2, "permits were never shared ({peak})");
    let mut tokens = tokens.lock().unwrap().clone();
    let count = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), count, "a token was given twice");
}

/// A crashed reader's hold and a crashed permit holder's permit come back after their ttl.
async fn crashed_holders_expire(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let ttl = Duration::from_millis(600);
    for (what, crashed, next) in [
        ("reader", opts(ttl).shared(), writer()),
        ("permit", opts(ttl).with_permits(1), permits(1)),
    ] {
        let name = unique("crash");
        let g = a
            .acquire(&name, &crashed.with_renewal(Renewal::disabled()))
            .await
            .expect("acquire");
        let token = g.token();
        g.abandon();
        assert!(
            b.try_acquire(&name, &next).await.expect("try").is_none(),
            "{what}: freed before its ttl"
        );
        let started = Instant::now();
        let n = b.acquire(&name, &next).await.expect("after the ttl");
        assert!(
            started.elapsed() < ttl + Duration::from_secs(2),
            "{what}: took {:?}",
            started.elapsed()
        );
        assert!(n.token() > token);
        n.release().await.expect("release");
    }
}

/// Permits of another size, permits on a read-write lock and the reverse are `Mismatch`.
async fn kinds_do_not_mix(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let is_mismatch = |r: Result<Option<distlock_core::LockGuard>, Error>| {
        matches!(r, Err(Error::Mismatch { .. }))
    };
    let sem = unique("sem");
    let p = a.acquire(&sem, &permits(3)).await.expect("permit");
    assert!(is_mismatch(b.try_acquire(&sem, &permits(4)).await));
    assert!(is_mismatch(b.try_acquire(&sem, &shared()).await));
    assert!(is_mismatch(b.try_acquire(&sem, &writer()).await));
    // A waiting acquisition is refused at once too.
    let waited = b.acquire(&sem, &writer()).await;
    assert!(matches!(waited, Err(Error::Mismatch { .. })), "{waited:?}");
    let p2 = b
        .try_acquire(&sem, &permits(3))
        .await
        .expect("try")
        .expect("a second permit");
    p.release().await.expect("release");
    p2.release().await.expect("release");
    // Free again: any kind may use the name.
    let w = b
        .try_acquire(&sem, &writer())
        .await
        .expect("try")
        .expect("free");
    assert!(is_mismatch(a.try_acquire(&sem, &permits(3)).await));
    w.release().await.expect("release");
    let rw = unique("rw");
    let r = a.acquire(&rw, &shared()).await.expect("reader");
    assert!(is_mismatch(b.try_acquire(&rw, &permits(2)).await));
    r.release().await.expect("release");
}

/// A forced release frees every holder; their renewals fail, and the next holder's token is
/// higher.
async fn force_release_frees_all(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let name = unique("force");
    let r1 = a.acquire(&name, &shared()).await.expect("reader");
    let r2 = b.acquire(&name, &shared()).await.expect("reader");
    assert!(a.force_release(&name).await.expect("force"));
    assert!(matches!(
        r1.renew().await,
        Err(Error::NotHeld { .. } | Error::Lost { .. })
    ));
    let r3 = b.acquire(&name, &shared()).await.expect("a new reader");
    assert!(matches!(
        r2.renew().await,
        Err(Error::NotHeld { .. } | Error::Lost { .. })
    ));
    let info = a.inspect(&name).await.expect("inspect").expect("held");
    assert_eq!(info.holders, 1, "the forced-out readers still count");
    assert!(r3.token() > r2.token());
    r3.release().await.expect("release");
    let w = b.acquire(&name, &writer()).await.expect("writer");
    w.release().await.expect("release");
}

/// `release_hold` names one permit of a semaphore by its owner and token: a wrong token (the
/// other holder's), a wrong owner, the lock row's marker as the owner (with the row's version)
/// and the pair again free nothing; the pair frees that permit only (its holder's renewal is
/// refused, the other holder's goes on, one more permit is free and no more).
async fn release_hold_frees_one_permit(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let name = unique("by-token");
    let p1 = a.acquire(&name, &permits(2)).await.expect("permit");
    let p2 = b.acquire(&name, &permits(2)).await.expect("permit");
    let release_hold = async |owner: &str, token| {
        a.release_hold(&name, owner, token)
            .await
            .expect("release_hold")
    };
    assert!(!release_hold(p1.owner(), p2.token()).await, "wrong token");
    assert!(!release_hold(p2.owner(), p1.token()).await, "wrong owner");
    // The lock row's marker with its version (the latest holder's token) is nobody's hold.
    let marker = "\u{1}permits:2";
    assert!(!release_hold(marker, p2.token()).await, "the marker");
    assert!(release_hold(p1.owner(), p1.token()).await, "the pair");
    assert!(
        !release_hold(p1.owner(), p1.token()).await,
        "the pair again"
    );
    assert!(matches!(
        p1.renew().await,
        Err(Error::NotHeld { .. } | Error::Lost { .. })
    ));
    p2.renew().await.expect("the other permit holder holds");
    let info = a.inspect(&name).await.expect("inspect").expect("held");
    assert_eq!((info.holders, info.token), (1, Some(p2.token())));
    let p3 = b
        .try_acquire(&name, &permits(2))
        .await
        .expect("try")
        .expect("the freed permit");
    assert!(p3.token() > p2.token());
    assert!(
        b.try_acquire(&name, &permits(2))
            .await
            .expect("try")
            .is_none(),
        "a third permit of two"
    );
    p2.release().await.expect("release");
    p3.release().await.expect("release");
}

/// A lock table made by an earlier version (no holders table) keeps its locks and gains the
/// holders table at the first shared hold; with `create_table=false` a missing holders table
/// fails shared holds only.
async fn old_table_keeps_working(url: &str, create: &str) {
    let admin = client(url).await;
    let table = unique("old_locks");
    exec(&admin.backend_ref().pool(), create.replace("{t}", &table)).await;
    let sep = if url.contains('?') { '&' } else { '?' };
    let strict = client(&format!("{url}{sep}table={table}&create_table=false")).await;
    let held = strict.acquire("held", &writer()).await.expect("exclusive");
    match strict.try_acquire("other", &shared()).await {
        Err(Error::Backend { message, .. }) => {
            assert!(message.contains("_holders"), "{message}");
        }
        other => panic!("expected the missing holders table, got {other:?}"),
    }
    let c = client(&format!("{url}{sep}table={table}")).await;
    // The upgraded client sees the lock taken before.
    assert!(
        c.try_acquire("held", &writer())
            .await
            .expect("try")
            .is_none()
    );
    let r = c.acquire("other", &shared()).await.expect("shared");
    // Now the strict client can use the table the other created.
    let r2 = strict
        .try_acquire("other", &shared())
        .await
        .expect("try")
        .expect("joins");
    r.release().await.expect("release");
    r2.release().await.expect("release");
    held.release().await.expect("release");
    let pool = admin.backend_ref().pool();
    exec(&pool, format!("DROP TABLE {table}_holders")).await;
    // The queue of permit waiters, made with the routines.
    exec(&pool, format!("DROP TABLE IF EXISTS {table}_queue")).await;
    exec(&pool, format!("DROP TABLE {table}")).await;
    if url.starts_with("postgres") {
        // PostgreSQL's readers' tokens, made with the functions.
        exec(&pool, format!("DROP SEQUENCE {table}_dl_reads")).await;
    }
}

/// What `read` (a read of the queue of permit waiters of `name`) answers once it lists `n`
/// waiters or more; fails after 10 s. (SQLite has no queue of permit waiters.)
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn until_queued<T, F: std::future::Future<Output = Vec<T>>>(
    name: &str,
    n: usize,
    read: impl Fn() -> F,
) -> Vec<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queue = read().await;
        if queue.len() >= n {
            return queue;
        }
        assert!(
            Instant::now() < deadline,
            "{n} waiters did not queue for {name}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A writer that gives up takes its reservation's ttl (`next_ttl`) with it: left behind, a
/// release would hand the lock to the next reservation written without one (by a client of a
/// version before `next_ttl`, a reader's), as to a writer. `reservation` reads the lock row's
/// `(next_owner, next_ttl)` of a name. (SQLite hands nothing over.)
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn an_abandoned_reservation_leaves_no_ttl<
    F: std::future::Future<Output = (Option<String>, Option<i64>)>,
>(
    url: &str,
    reservation: impl Fn(String) -> F,
) {
    let (a, b) = (client(url).await, client(url).await);
    let name = unique("abandoned_ttl");
    let held = a.acquire(&name, &writer()).await.expect("the lock");
    let gave_up = b
        .acquire(&name, &writer().with_wait(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(gave_up, Err(Error::Timeout { .. })),
        "the held lock was granted: {gave_up:?}"
    );
    assert_eq!(
        reservation(name.to_string()).await,
        (None, None),
        "the abandoned reservation's ttl stayed"
    );
    held.release().await.expect("release");
}

/// Acquisitions cut short by their caller at every moment of their first 40 ms, in 0.5 ms
/// steps (a reader's, a permit waiter's and a writer's, each while another client holds the
/// name), leave nothing behind that keeps the holder's kind out once it releases: a take,
/// join or claim of the reservation that was sent when its poll was dropped still runs on
/// the server, and the attempt's clean-up (by owner, on another connection) must come after
/// it, not find nothing and leave it a second (the reservation) or the lease's 10 s. The
/// try of the holder's kind goes every 5 ms for 500 ms.
async fn cut_short_waits_leave_nothing(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    for step in 0..80u64 {
        let cut = Duration::from_micros(500 * step);
        let (hold, ask) = match step % 3 {
            0 => (writer(), shared()),
            1 => (permits(1), permits(1)),
            _ => (writer(), writer()),
        };
        let name = unique("cut_short");
        let holder = a.acquire(&name, &hold).await.expect("the holder");
        let waited = tokio::time::timeout(cut, b.acquire(&name, &ask)).await;
        assert!(waited.is_err(), "{:?} acquired a held name", ask.kind);
        holder.release().await.expect("release");
        let until = Instant::now() + Duration::from_millis(500);
        let free = loop {
            match b.try_acquire(&name, &hold).await.expect("try") {
                Some(guard) => break guard,
                None => assert!(
                    Instant::now() < until,
                    "a {:?} wait cut short after {cut:?} left a trace",
                    ask.kind
                ),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        free.release().await.expect("release");
    }
}

macro_rules! kinds_suite {
    ($url:expr, $old:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn readers_share() {
            let Some(url) = $url else { return };
            super::readers_share_and_exclude_writers(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn writers_exclude() {
            let Some(url) = $url else { return };
            super::writer_excludes_readers(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn writer_preference() {
            let Some(url) = $url else { return };
            super::waiting_writer_is_not_starved(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn permits() {
            let Some(url) = $url else { return };
            super::permits_bound_holders(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn crashed() {
            let Some(url) = $url else { return };
            super::crashed_holders_expire(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mismatch() {
            let Some(url) = $url else { return };
            super::kinds_do_not_mix(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn force_release() {
            let Some(url) = $url else { return };
            super::force_release_frees_all(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn release_hold() {
            let Some(url) = $url else { return };
            super::release_hold_frees_one_permit(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cut_short() {
            let Some(url) = $url else { return };
            super::cut_short_waits_leave_nothing(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn old_table() {
            let Some(url) = $url else { return };
            super::old_table_keeps_working(&url, $old).await;
        }
    };
}

/// PostgreSQL and MySQL run a join, a renewal and a release of a shared hold or a permit as one
/// call of a routine that the first client creates with the table: the three routines exist
/// (`check` fails otherwise; `drop` removes one; `routine` names one by what it does), and
/// clients that call them share one semaphore with clients that run the transactions instead
/// (a table without them, `create_table=false`; or a client of an earlier version).
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn routines_beside_transactions(
    url: &str,
    routine: fn(&str, &str) -> String,
    check: fn(&str) -> String,
    drop_routine: fn(&str) -> String,
    whats: &[&str],
) {
    let table = unique("fn_locks");
    let sep = if url.contains('?') { '&' } else { '?' };
    let with_routines = format!("{url}{sep}table={table}");
    let admin = client(&with_routines).await;
    let pool = admin.backend_ref().pool();
    // Creates the holders table too.
    let g = admin
        .acquire("probe", &permits(2))
        .await
        .expect("a permit by routines");
    g.release().await.expect("release");
    let routines: Vec<String> = whats.iter().map(|what| routine(&table, what)).collect();
    for routine in &routines {
        exec(&pool, check(routine)).await;
        exec(&pool, drop_routine(routine)).await;
    }
    let without = format!("{with_routines}&create_table=false");
    let transactions = client(&without).await;
    let g = transactions
        .acquire("probe", &permits(2))
        .await
        .expect("a permit by transactions");
    g.release().await.expect("release");
    // Created again by the next client that may create the table.
    drop(client(&with_routines).await);
    for routine in &routines {
        exec(&pool, check(routine)).await;
    }
    let (a, b) = (with_routines.as_str(), without.as_str());
    permits_bound_among(&[a, b, a, b]).await;
    for routine in &routines {
        exec(&pool, drop_routine(routine)).await;
    }
    exec(&pool, format!("DROP TABLE {table}_holders")).await;
    // The queue of permit waiters, made with the routines.
    exec(&pool, format!("DROP TABLE IF EXISTS {table}_queue")).await;
    exec(&pool, format!("DROP TABLE {table}")).await;
    if url.starts_with("postgres") {
        // PostgreSQL's readers' tokens, made with the functions.
        exec(&pool, format!("DROP SEQUENCE {table}_dl_reads")).await;
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::{Duration, Instant};

    use distlock_core::{DistributedLock, LockClient, LockGuard};
    use distlock_sql::SqlBackend;

    use super::{client, common, unique, writer};
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_reservation_leaves_no_ttl() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        let pool = common::pg(&client(&url).await);
        super::an_abandoned_reservation_leaves_no_ttl(&url, |name| {
            let pool = pool.clone();
            async move {
                sqlx::query_as("SELECT next_owner, next_ttl FROM distlock_locks WHERE name = $1")
                    .bind(name)
                    .fetch_one(&pool)
                    .await
                    .expect("read the lock row")
            }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn functions_beside_transactions() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        super::routines_beside_transactions(
            &url,
            |table, what| match what {
                "release" => {
                    format!(
                        "{table}_dl_{what}_v11(text, text, text, bigint, boolean, integer, integer)"
                    )
                }
                "renew_many" => {
                    format!("{table}_dl_{what}_v11(text[], text[], text[], bigint[], bigint[])")
                }
                "join" => format!(
                    "{table}_dl_{what}_v11(text, text, text, bigint, bigint, bigint, integer)"
                ),
                "hand_read" => format!("{table}_dl_{what}_v11(text, text, bigint)"),
                _ => format!("{table}_dl_{what}_v11(text, text, text, bigint, bigint)"),
            },
            |f| format!("SELECT '{f}'::regprocedure"),
            |f| format!("DROP FUNCTION {f}"),
            &["join", "renew", "release", "renew_many", "hand_read"],
        )
        .await;
    }

    /// The lock row's reservation: `(version, next_owner, next_ttl)`.
    async fn reservation(pool: &sqlx::PgPool, name: &str) -> (i64, Option<String>, Option<i64>) {
        sqlx::query_as("SELECT version, next_owner, next_ttl FROM distlock_locks WHERE name = $1")
            .bind(name)
            .fetch_one(pool)
            .await
            .expect("read the lock row")
    }

    /// The waiter that reserved `name`, once one did, with its reservation's `next_ttl`.
    async fn reserved(pool: &sqlx::PgPool, name: &str) -> (String, i64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let (_, Some(next), Some(ttl)) = reservation(pool, name).await {
                return (next, ttl);
            }
            assert!(Instant::now() < deadline, "no waiter reserved {name}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A writer whose reservation a release turned into the lock, and which is not told so,
    /// takes that lock. Here the hand-over is written by hand and its notification names
    /// another waiter, which tells the writer only that the reservation is free: its claim is
    /// refused (a claim is never the holder's own), and it looks again at once. Before, a
    /// refused claim made the writer forget its reservation and wait for a wake-up that never
    /// came: its wait ran out, its clean-up did nothing, and the lock it had been handed
    /// stayed held until its ttl.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_handed_the_lock_unawares_takes_it() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        let (a, b) = (client(&url).await, client(&url).await);
        let pool = common::pg(&a);
        let name = unique("handed_unawares");
        let held = a.acquire(&name, &writer()).await.expect("the lock");
        // No poll of its own before its wait runs out (the holder's lease lasts longer): only
        // a wake-up moves it.
        let patient =
            writer()
                .with_wait(Duration::from_secs(3))
                .with_backoff(distlock_core::Backoff::new(
                    Duration::from_millis(2),
                    Duration::from_secs(10),
                ));
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { b.acquire(&name, &patient).await })
        };
        let (next, _) = reserved(&pool, &name).await;
        let version: i64 = sqlx::query_scalar(
            "UPDATE distlock_locks SET owner = next_owner, version = version + 1, \
             expires_at = now() + interval '10 seconds', next_owner = NULL, next_since = NULL, \
             next_expires = NULL, next_ttl = NULL \
             WHERE name = $1 AND next_owner = $2 RETURNING version",
        )
        .bind(&name)
        .bind(&next)
        .fetch_one(&pool)
        .await
        .expect("hand the lock over to the waiter's reservation");
        assert!(
            !waiter.is_finished(),
            "the waiter gave up before the test began"
        );
        sqlx::query("SELECT pg_notify('distlock:distlock_locks', $1)")
            .bind(format!("h{version}:5:other{name}"))
            .execute(&pool)
            .await
            .expect("notify");
        let got = common::granted_within(waiter, Duration::from_secs(3)).await;
        assert!(
            i64::try_from(got.token().get()).is_ok_and(|t| t >= version),
            "token {:?} is below the handed version {version}",
            got.token()
        );
        assert!(
            a.try_acquire(&name, &writer())
                .await
                .expect("try")
                .is_none(),
            "the lock is free while the waiter holds it"
        );
        got.release().await.expect("release what was handed over");
        drop(held);
    }

    /// What a release handed waiter `next` of `name` with `version`: the waiter's guard, with
    /// that version as its token, told by the `h<version>:` notification, and renewable.
    async fn handed(
        waiter: tokio::task::JoinHandle<distlock_core::Result<LockGuard>>,
        listener: &mut sqlx::postgres::PgListener,
        (name, next, version): (&str, &str, i64),
    ) -> LockGuard {
        let got = common::granted(waiter).await;
        assert_eq!(
            i64::try_from(got.token().get()),
            Ok(version),
            "not the handed version"
        );
        let expected = format!("h{version}:{}:{next}{name}", next.len());
        assert_eq!(common::next_note(listener, name).await, expected);
        got.renew().await.expect("renew what was handed over");
        got
    }

    /// A semaphore of `permits` on a new name (`client`, its pool, the name) and one permit
    /// of it, held by that client.
    async fn one_held(
        url: &str,
        prefix: &str,
        permits: u32,
    ) -> (LockClient<SqlBackend>, sqlx::PgPool, String, LockGuard) {
        let client = client(url).await;
        let pool = common::pg(&client);
        let name = unique(prefix);
        let held = client
            .acquire(&name, &super::permits(permits))
            .await
            .expect("a permit");
        (client, pool, name, held)
    }

    /// A semaphore of 2 permits (`client`, its pool, the name, the two permits), both held
    /// by one client.
    async fn full(
        url: &str,
        prefix: &str,
    ) -> (
        LockClient<SqlBackend>,
        sqlx::PgPool,
        String,
        LockGuard,
        LockGuard,
    ) {
        let (client, pool, name, first) = one_held(url, prefix, 2).await;
        let second = client
            .acquire(&name, &super::permits(2))
            .await
            .expect("a permit");
        (client, pool, name, first, second)
    }

    /// The live waiters in the queue of permit waiters of `name`, first in line first, with
    /// the ttl each queued with.
    async fn queue(pool: &sqlx::PgPool, name: &str) -> Vec<(String, i64)> {
        sqlx::query_as(
            "SELECT owner, ttl FROM distlock_locks_queue \
             WHERE name = $1 AND expires_at > now() ORDER BY seq, owner",
        )
        .bind(name)
        .fetch_all(pool)
        .await
        .expect("read the queue")
    }

    /// The owners of the live places in the queue of `name`, first in line first.
    async fn queued_owners(pool: &sqlx::PgPool, name: &str) -> Vec<String> {
        queue(pool, name)
            .await
            .into_iter()
            .map(|(o, _)| o)
            .collect()
    }

    /// The queue of `name` once it has `n` live waiters (within 10 s).
    async fn queued(pool: &sqlx::PgPool, name: &str, n: usize) -> Vec<(String, i64)> {
        super::until_queued(name, n, || queue(pool, name)).await
    }

    /// The token of `owner`'s holder row of `name`, if it has one.
    async fn holder_token(pool: &sqlx::PgPool, name: &str, owner: &str) -> Option<i64> {
        sqlx::query_scalar(
            "SELECT token FROM distlock_locks_holders WHERE name = $1 AND owner = $2",
        )
        .bind(name)
        .bind(owner)
        .fetch_optional(pool)
        .await
        .expect("read the holders")
    }

    /// A permit released from a full semaphore goes to the first waiter of the name's queue
    /// in the release's own call: when the release returns, the waiter's holder row is there
    /// with the next version (since `_v11` the first token of the range of tokens the
    /// hand-over sets: the row's version moves 16 past it) and its place in the queue is
    /// gone; a `h<version>:`
    /// notification tells the waiter, which holds that version as its token, a renewable
    /// permit. The waiter queued with its ttl and reserved nothing. An exclusive release
    /// never hands the lock to a permit waiter's reservation (of an earlier version, its ttl
    /// negated): since the functions' `v8` it takes such a reservation for a reader's, which
    /// it hands a read hold (see `backend.rs`), never the exclusive lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_hands_a_permit_to_the_first_queued_waiter() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        let b = client(&url).await;
        let (a, pool, name, first, second) = full(&url, "permit_handover").await;
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { b.acquire(&name, &super::permits(2)).await })
        };
        let first_in_line = queued(&pool, &name, 1).await;
        let [(next, ttl)] = first_in_line.as_slice() else {
            panic!("one waiter queues: {first_in_line:?}");
        };
        assert_eq!(*ttl, 10_000_000, "a permit waiter queues with its ttl");
        assert_eq!(
            reservation(&pool, &name).await.1,
            None,
            "a queued waiter reserved"
        );
        let mut listener = common::listen(&pool, "distlock_locks").await;
        first.release().await.expect("release");
        let (version, ..) = reservation(&pool, &name).await;
        let token = holder_token(&pool, &name, next).await;
        let token = token.expect("the release did not hand the permit over");
        assert_eq!(
            token,
            version - 16,
            "not the first token of the range it set"
        );
        assert_eq!(
            queue(&pool, &name).await,
            [],
            "the handed waiter is still queued"
        );
        let got = handed(waiter, &mut listener, (&name, next, token)).await;
        got.release().await.expect("release the handed permit");
        second.release().await.expect("release");

        // An exclusive holder and (as a race of mismatched kinds may leave it) a permit
        // waiter's reservation: the release does not hand the exclusive lock over.
        let name = unique("no_exclusive_handover");
        let held = a.acquire(&name, &writer()).await.expect("a lock");
        sqlx::query(
            "UPDATE distlock_locks SET next_owner = 'permit-waiter', next_since = 0, \
             next_expires = now() + interval '10 seconds', next_ttl = -10000000 WHERE name = $1",
        )
        .bind(&name)
        .execute(&pool)
        .await
        .expect("reserve");
        held.release().await.expect("release");
        let owner: Option<String> =
            sqlx::query_scalar("SELECT owner FROM distlock_locks WHERE name = $1")
                .bind(&name)
                .fetch_one(&pool)
                .await
                .expect("read the lock row");
        assert_ne!(
            owner.as_deref(),
            Some("permit-waiter"),
            "an exclusive lock was handed to a permit waiter"
        );
    }

    /// Queued permit waiters are served in the order they queued, each by the release
    /// before its turn; a waiter that gave up (its wait ran out) left the queue, a place
    /// that expired (a waiter that crashed) and the place of a waiter for another number of
    /// permits are passed over: none of them is handed a permit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_waiters_are_served_in_order_and_the_gone_passed_over() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        let (_a, pool, name, held) = one_held(&url, "permit_queue", 1).await;
        sqlx::query(
            "INSERT INTO distlock_locks_queue (name, owner, seq, expires_at, ttl, permits) \
             VALUES ($1, 'crashed', 0, now() - interval '1 second', 10000000, 1), \
             ($1, 'two', 1, now() + interval '1 minute', 10000000, 2)",
        )
        .bind(&name)
        .execute(&pool)
        .await
        .expect("an expired place and one of a semaphore of 2, first in line");
        let mut waiters = Vec::new();
        let mut owners = vec!["two".to_owned()];
        for wait in [20, 1, 20] {
            let c = client(&url).await;
            let (key, options) = (name.clone(), super::permits(1));
            let options = options.with_wait(Duration::from_secs(wait));
            waiters.push(tokio::spawn(async move { c.acquire(&key, &options).await }));
            let now = queued(&pool, &name, owners.len() + 1).await;
            let (first, _) = now
                .iter()
                .find(|(owner, _)| !owners.contains(owner))
                .expect("the new waiter queued");
            owners.push(first.clone());
        }
        let mut waiters = waiters.into_iter();
        let (first, gives_up, third) = (
            waiters.next().expect("w1"),
            waiters.next().expect("w2"),
            waiters.next().expect("w3"),
        );
        match gives_up.await.expect("the waiter's task") {
            Err(super::Error::Timeout { .. }) => {}
            other => panic!("expected the wait to run out, got {other:?}"),
        }
        let expected = [owners[0].clone(), owners[1].clone(), owners[3].clone()];
        let left = queued_owners(&pool, &name).await;
        assert_eq!(left, expected, "the waiter that gave up is still queued");
        // A poll of the waiter that gave up, still on its way then, does not queue it again.
        let join =
            "SELECT o_taken FROM distlock_locks_dl_join_v11($1, $2, $3, 10000000, 1, 1000000, 1)";
        let taken: Option<i64> = sqlx::query_scalar(join)
            .bind(&name)
            .bind(&owners[2])
            .bind("\u{1}permits:1")
            .fetch_one(&pool)
            .await
            .expect("a late poll");
        assert_eq!(taken, None, "the late poll took a held permit");
        let left = queued_owners(&pool, &name).await;
        assert_eq!(left, expected, "a late poll queued the waiter that gave up");
        held.release().await.expect("release");
        let got = common::granted(first).await;
        assert_eq!(holder_token(&pool, &name, &owners[2]).await, None);
        assert_eq!(holder_token(&pool, &name, "two").await, None);
        assert_eq!(holder_token(&pool, &name, "crashed").await, None);
        assert!(!third.is_finished(), "the third waiter overtook");
        got.release().await.expect("release");
        let last = common::granted(third).await;
        last.release().await.expect("release");
        assert_eq!(
            queue(&pool, &name).await,
            [("two".to_owned(), 10_000_000)],
            "places outlived their waiters"
        );
    }

    /// A permit waiter's first join into a full semaphore queues it and is refused without
    /// locking the name's row (`_v10`: every acquisition of a full semaphore was such a
    /// refusal and a release, both queued on that one row lock, issue 44). The waiter gets
    /// its place while another transaction holds the row for update, which a join of `_v9`
    /// waited for, and the release then hands it the permit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_permit_waiter_queues_without_locking_the_row() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        let (_a, pool, name, held) = one_held(&url, "queues-unlocked", 1).await;
        let b = client(&url).await;
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("SELECT 1 FROM distlock_locks WHERE name = $1 FOR UPDATE")
            .bind(&name)
            .execute(&mut *tx)
            .await
            .expect("lock the name's row");
        let waiter = {
            let name = name.clone();
            tokio::spawn(async move { b.acquire(&name, &super::permits(1)).await })
        };
        // Within 10 s, while the name's row stays locked.
        queued(&pool, &name, 1).await;
        tx.rollback().await.expect("rollback");
        let first = held.token();
        held.release().await.expect("release");
        let got = common::granted(waiter).await;
        assert!(
            got.token() > first,
            "the handed permit's token is not above"
        );
        got.release().await.expect("release");
        assert!(
            queue(&pool, &name).await.is_empty(),
            "a place outlived its waiter"
        );
    }

    /// A permit's release hands it to the first queued waiter without locking the name's row
    /// for update, once a hand-over with the row locked has set a range of tokens (`_v11`:
    /// each hand-over kept the name's one row locked until its commit was flushed, so the
    /// hand-overs of different permits waited for each other, issue 44). The second
    /// hand-over goes through while another transaction holds the row for share, which a
    /// release of `_v10` waited for, and the waiter holds on the notification (a poll of its
    /// would wait for the row too: its refusal read the range's last drawn value, below the
    /// handed token); its token is of the range: above the first waiter's, below the row's
    /// version.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_permit_is_handed_over_from_the_range_without_the_row_locked() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        // A table of its own: its sequence, whose draws spend a range, is this test's alone.
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}table=permit_range");
        let (_a, pool, name, held) = one_held(&url, "handed-from-range", 1).await;
        let places = || async {
            sqlx::query_scalar::<_, String>(
                "SELECT owner FROM permit_range_queue WHERE name = $1 AND expires_at > now()",
            )
            .bind(&name)
            .fetch_all(&pool)
            .await
            .expect("read the queue")
        };
        let wait = |client: LockClient<SqlBackend>| {
            let name = name.clone();
            tokio::spawn(async move { client.acquire(&name, &super::permits(1)).await })
        };
        let (b, c) = (client(&url).await, client(&url).await);
        let second = wait(b);
        super::until_queued(&name, 1, places).await;
        held.release().await.expect("release");
        // Handed with the row locked: it sets the range.
        let second = common::granted(second).await;
        let third = wait(c);
        // Its first join queued it; the next (to renew its place) comes a quarter second or
        // more later, long after the hand-over below (a join would wait for the row).
        super::until_queued(&name, 1, places).await;
        let mut tx = pool.begin().await.expect("begin");
        let version: i64 =
            sqlx::query_scalar("SELECT version FROM permit_range WHERE name = $1 FOR SHARE")
                .bind(&name)
                .fetch_one(&mut *tx)
                .await
                .expect("lock the name's row for share");
        let before = second.token();
        tokio::time::timeout(Duration::from_secs(10), second.release())
            .await
            .expect("the release waited for the row")
            .expect("release");
        let third = common::granted(third).await;
        let token = i64::try_from(third.token().get()).expect("token");
        assert!(third.token() > before, "the handed token is not above");
        assert!(
            token < version,
            "not a token of the range: {token} ≥ {version}"
        );
        tx.rollback().await.expect("rollback");
        third.release().await.expect("release");
        assert!(places().await.is_empty(), "a place outlived its waiter");
    }

    /// A release that counted the waiters before a place queued without the row's lock was
    /// committed hands nothing: it frees the permit and wakes every waiter of the name
    /// (`0:<name>`), and the waiter's next join takes the permit. So no permit stays free
    /// while a waiter sleeps in the queue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_before_an_unlocked_place_commits_wakes_every_waiter() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        let (_client, pool, name, held) = one_held(&url, "place-after-release", 1).await;
        let mut listener = common::listen(&pool, "distlock_locks").await;
        let join =
            "SELECT o_taken FROM distlock_locks_dl_join_v11($1, $2, $3, 10000000, 1, 1000000, 0)";
        let owner = unique("late-place");
        let call = |owner: &str| {
            sqlx::query_scalar::<_, Option<i64>>(join)
                .bind(name.clone())
                .bind(owner.to_owned())
                .bind("\u{1}permits:1")
        };
        let mut tx = pool.begin().await.expect("begin");
        let refused = call(&owner)
            .fetch_one(&mut *tx)
            .await
            .expect("the first join");
        assert_eq!(refused, None, "a full semaphore let the join in");
        tokio::time::timeout(Duration::from_secs(10), held.release())
            .await
            .expect("the release waited for the uncommitted place")
            .expect("release");
        tx.commit().await.expect("commit the place");
        assert_eq!(
            common::next_note(&mut listener, &name).await,
            format!("0:{name}")
        );
        let taken = call(&owner).fetch_one(&pool).await.expect("the next join");
        let token = taken.expect("the woken waiter's join found the permit taken");
        assert_eq!(holder_token(&pool, &name, &owner).await, Some(token));
        assert!(
            queue(&pool, &name).await.is_empty(),
            "the place outlived the take"
        );
        let release = "SELECT distlock_locks_dl_release_v11($1, $2, $3, $4, true, 0, 1)";
        let released: Option<bool> = sqlx::query_scalar(release)
            .bind(&name)
            .bind(&owner)
            .bind("\u{1}permits:1")
            .bind(token)
            .fetch_one(&pool)
            .await
            .expect("release the permit");
        assert_eq!(released, Some(true));
    }

    /// A waiter handed a permit while its own poll was in flight may claim the reservation
    /// again: the next release must not hand it a second permit (which would replace its
    /// holder row and the token its guard holds) but clear that stale reservation.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_reservation_of_a_holder_is_cleared_not_handed_over() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        let (a, pool, name, first, second) = full(&url, "stale_reservation").await;
        let token = i64::try_from(second.token().get()).expect("token");
        let owner: String = sqlx::query_scalar(
            "SELECT owner FROM distlock_locks_holders WHERE name = $1 AND token = $2",
        )
        .bind(&name)
        .bind(token)
        .fetch_one(&pool)
        .await
        .expect("the second holder's row");
        sqlx::query(
            "UPDATE distlock_locks SET next_owner = $2, next_since = 0, \
             next_expires = now() + interval '10 seconds', next_ttl = -10000000 WHERE name = $1",
        )
        .bind(&name)
        .bind(&owner)
        .execute(&pool)
        .await
        .expect("reserve");
        first.release().await.expect("release");
        assert_eq!(
            reservation(&pool, &name).await.1,
            None,
            "the stale reservation stayed"
        );
        second
            .renew()
            .await
            .expect("the holder's permit was replaced");
        let third = a
            .try_acquire(&name, &super::permits(2))
            .await
            .expect("try")
            .expect("the released permit is free");
        second.release().await.expect("release");
        third.release().await.expect("release");
    }

    /// The last reader's release hands the lock to the writer holding the reservation, in
    /// the release's own transaction: when it returns, the row is the writer's with the next
    /// version (above both readers' tokens) and no reservation; `h<version>:` tells the
    /// writer, which holds that version as its token, a renewable lock. The first reader's
    /// release (a reader still in) hands nothing over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_readers_release_hands_the_lock_to_the_reserved_writer() {
        let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL");
        let Some(url) = url else { return };
        let (a, b) = (client(&url).await, client(&url).await);
        let pool = common::pg(&a);
        let name = unique("writer_handover");
        let first = a.acquire(&name, &super::shared()).await.expect("a read");
        let second = a.acquire(&name, &super::shared()).await.expect("a read");
        let tokens = [&first, &second].map(|read| i64::try_from(read.token().get()));
        let writer = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { b.acquire(&name, &super::writer()).await })
        };
        let (next, ttl) = reserved(&pool, &name).await;
        assert_eq!(ttl, 10_000_000, "a writer reserves with its ttl");
        let mut listener = common::listen(&pool, "distlock_locks").await;
        first.release().await.expect("release");
        let (_, still, _) = reservation(&pool, &name).await;
        assert_eq!(still.as_ref(), Some(&next), "handed over with a reader in");
        second.release().await.expect("release");
        let (owner, version, reserved): (Option<String>, i64, Option<String>) =
            sqlx::query_as("SELECT owner, version, next_owner FROM distlock_locks WHERE name = $1")
                .bind(&name)
                .fetch_one(&pool)
                .await
                .expect("read the lock row");
        assert_eq!(
            owner,
            Some(next.clone()),
            "the release did not hand the lock over"
        );
        assert_eq!(reserved, None, "the reservation outlived the hand-over");
        for token in tokens {
            assert!(
                token.expect("token") < version,
                "not above the readers' tokens"
            );
        }
        let got = handed(writer, &mut listener, (&name, &next, version)).await;
        super::writer_alone(&a, &name, got).await;
    }

    kinds_suite!(
        conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL"),
        "CREATE TABLE {t} (name TEXT COLLATE \"C\" PRIMARY KEY, owner TEXT, \
         version BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, next_owner TEXT, \
         next_since BIGINT, next_expires TIMESTAMPTZ)"
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_reservation_leaves_no_ttl() {
        let url = conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL");
        let Some(url) = url else { return };
        let client = super::client(&url).await;
        let distlock_sql::SqlPool::MySql(pool) = client.backend_ref().pool() else {
            panic!("a MySQL pool");
        };
        super::an_abandoned_reservation_leaves_no_ttl(&url, |name| {
            let pool = pool.clone();
            async move {
                sqlx::query_as(
                    "SELECT CAST(next_owner AS CHAR), next_ttl FROM distlock_locks WHERE name = ?",
                )
                .bind(name)
                .fetch_one(&pool)
                .await
                .expect("read the lock row")
            }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn procedures_beside_transactions() {
        let url = conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL");
        let Some(url) = url else { return };
        super::routines_beside_transactions(
            &url,
            // The join and the release queue permit waiters since `_v2`; the join takes the
            // holder's wake lock since `_v3`, and the last holder's release hands the lock
            // to the reserved writer; a reader's release leaves without locking the name's
            // row since `_v4`; a permit's hand-over runs two statements fewer since `_v5`, and
            // hands the permit over in place since `_v7`; a reader joins live readers locking
            // the name's row only to step its version since the join's `_v4`, and a queued
            // permit waiter's join counts the holders only when the queue leaves a permit
            // since `_v5`.
            |table, what| match what {
                "join" => format!("{table}_dl_{what}_v5"),
                "release" => format!("{table}_dl_{what}_v7"),
                _ => format!("{table}_dl_{what}_v1"),
            },
            |p| format!("SHOW CREATE PROCEDURE {p}"),
            |p| format!("DROP PROCEDURE {p}"),
            &["join", "renew", "release", "renew_many"],
        )
        .await;
    }

    /// The owners of the live places in the queue of permit waiters of `name`, first in line
    /// first.
    async fn queued_owners(pool: &sqlx::MySqlPool, name: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT CAST(owner AS CHAR) FROM distlock_locks_queue \
             WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) ORDER BY seq, owner",
        )
        .bind(name)
        .fetch_all(pool)
        .await
        .expect("read the queue")
    }

    /// The queue of `name` once it has `n` live waiters (within 10 s).
    async fn queued(pool: &sqlx::MySqlPool, name: &str, n: usize) -> Vec<String> {
        super::until_queued(name, n, || queued_owners(pool, name)).await
    }

    /// The token of `owner`'s holder row of `name`, if it has one.
    async fn holder_token(pool: &sqlx::MySqlPool, name: &str, owner: &str) -> Option<i64> {
        sqlx::query_scalar("SELECT token FROM distlock_locks_holders WHERE name = ? AND owner = ?")
            .bind(name)
            .bind(owner)
            .fetch_optional(pool)
            .await
            .expect("read the holders")
    }

    /// Three clients of `url`, and the first one's pool.
    async fn three_clients(
        url: &str,
    ) -> (
        [distlock_core::LockClient<distlock_sql::SqlBackend>; 3],
        sqlx::MySqlPool,
    ) {
        let clients = [
            super::client(url).await,
            super::client(url).await,
            super::client(url).await,
        ];
        let distlock_sql::SqlPool::MySql(pool) = clients[0].backend_ref().pool() else {
            panic!("a MySQL pool");
        };
        (clients, pool)
    }

    /// A permit handed to a queued waiter lasts no longer than the semaphore's marker: a
    /// release's hand-over dates the name's row before the waiter's holder row (each statement
    /// of a procedure at its own time), so the holder row can end later than the marker, and a
    /// waiter that took its lease from the holder row alone believed it held after the marker
    /// ended, when a join may purge and grant its permit again. Here the name's row is made
    /// to end 2 s from now and the waiter handed a holder row of 30 s by hand: its lease must
    /// end with the marker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handed_permit_ends_with_the_marker() {
        use distlock_core::DistributedLock;
        let url = conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL");
        let Some(url) = url else { return };
        let ([a, b, _], pool) = three_clients(&url).await;
        let name = super::unique("my_permit_marker");
        let held = a
            .acquire(&name, &super::permits(1))
            .await
            .expect("a permit");
        let waiter = {
            let name = name.clone();
            let opts = super::opts(std::time::Duration::from_secs(30)).with_permits(1);
            tokio::spawn(async move { b.acquire(&name, &opts).await })
        };
        let owner = queued(&pool, &name, 1).await.remove(0);
        let mut tx = pool.begin().await.expect("begin");
        let version: i64 =
            sqlx::query_scalar("SELECT version FROM distlock_locks WHERE name = ? FOR UPDATE")
                .bind(&name)
                .fetch_one(&mut *tx)
                .await
                .expect("the name's row");
        for sql in [
            "UPDATE distlock_locks SET version = version + 1, \
             expires_at = UTC_TIMESTAMP(6) + INTERVAL 2 SECOND WHERE name = ?",
            "DELETE FROM distlock_locks_holders WHERE name = ?",
            "DELETE FROM distlock_locks_queue WHERE name = ?",
        ] {
            sqlx::query(sql)
                .bind(&name)
                .execute(&mut *tx)
                .await
                .expect("hand the permit over by hand");
        }
        sqlx::query(
            "INSERT INTO distlock_locks_holders (name, owner, token, expires_at, permits) \
             VALUES (?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, 1)",
        )
        .bind(&name)
        .bind(&owner)
        .bind(version + 1)
        .execute(&mut *tx)
        .await
        .expect("the waiter's holder row");
        tx.commit().await.expect("commit");
        let handed_at = std::time::Instant::now();
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .expect("the waiter saw its permit")
            .expect("join")
            .expect("the handed permit");
        assert_eq!(
            got.token().get(),
            u64::try_from(version + 1).expect("token")
        );
        assert!(
            got.valid_until() <= handed_at + std::time::Duration::from_secs(2),
            "the waiter holds {:?} past the hand-over, the marker only 2 s",
            got.valid_until() - handed_at
        );
        got.abandon();
        held.abandon();
    }

    /// MySQL's permit waiters queue (procedures `_v2`): a release hands its permit to the
    /// first live waiter in the release's own call (its holder row with the next version,
    /// its place gone), and the waiter, which reads rather than being told, holds that
    /// version as its token; the next release serves the next waiter; a waiter that gives up
    /// leaves the queue for good, so no release hands it a permit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_permit_waiters_are_handed_permits_in_order() {
        use distlock_core::DistributedLock;
        let url = conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL");
        let Some(url) = url else { return };
        let ([a, b, c], pool) = three_clients(&url).await;
        let name = super::unique("my_permit_queue");
        let first = a
            .acquire(&name, &super::permits(2))
            .await
            .expect("a permit");
        let second = a
            .acquire(&name, &super::permits(2))
            .await
            .expect("a permit");
        // A waiter that gives up: queued first, gone before any release.
        let quitter = a
            .acquire(
                &name,
                &super::permits(2).with_wait(std::time::Duration::from_millis(300)),
            )
            .await;
        assert!(
            matches!(quitter, Err(distlock_core::Error::Timeout { .. })),
            "a full semaphore granted a third permit: {quitter:?}"
        );
        let spawn = |client: distlock_core::LockClient<distlock_sql::SqlBackend>| {
            let name = name.clone();
            tokio::spawn(async move { client.acquire(&name, &super::permits(2)).await })
        };
        let b_wait = spawn(b);
        let [b_owner] = queued(&pool, &name, 1).await.try_into().expect("one place");
        let c_wait = spawn(c);
        let queue = queued(&pool, &name, 2).await;
        assert_eq!(queue.first(), Some(&b_owner), "the queue is not in order");
        let c_owner = queue[1].clone();

        first.release().await.expect("release");
        let token = holder_token(&pool, &name, &b_owner).await;
        assert!(token.is_some(), "the release did not hand its permit over");
        assert_eq!(
            queued_owners(&pool, &name).await,
            std::slice::from_ref(&c_owner)
        );
        let got_b = b_wait.await.expect("join").expect("the handed permit");
        assert_eq!(
            Some(got_b.token().get()),
            token.and_then(|t| u64::try_from(t).ok())
        );

        second.release().await.expect("release");
        let got_c = c_wait.await.expect("join").expect("the next handed permit");
        assert_eq!(
            Some(got_c.token().get()),
            holder_token(&pool, &name, &c_owner)
                .await
                .and_then(|t| u64::try_from(t).ok())
        );
        assert!(got_c.token() > got_b.token());
        assert_eq!(queued_owners(&pool, &name).await, Vec::<String>::new());
        got_b.release().await.expect("release");
        got_c.release().await.expect("release");
        let holders: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM distlock_locks_holders WHERE name = ?")
                .bind(&name)
                .fetch_one(&pool)
                .await
                .expect("count the holders");
        assert_eq!(holders, 0, "a permit was handed to the waiter that gave up");
    }

    /// The lock row of `name`: `(owner, version, next_owner, next_ttl)`.
    async fn lock_row(
        pool: &sqlx::MySqlPool,
        name: &str,
    ) -> (Option<String>, i64, Option<String>, Option<i64>) {
        sqlx::query_as(
            "SELECT CAST(owner AS CHAR), version, CAST(next_owner AS CHAR), next_ttl \
             FROM distlock_locks WHERE name = ?",
        )
        .bind(name)
        .fetch_one(pool)
        .await
        .expect("read the lock row")
    }

    /// The last reader's release hands the lock to the writer holding the reservation, in
    /// the release procedure's own transaction (`_v3`): when it returns, the row is the
    /// writer's with the next version (above both readers' tokens) and no reservation. The
    /// writer, woken by the latest reader's wake lock (each reader is another client's, so
    /// each took one), reads that the row is its own and holds that version as its token,
    /// where it took the row itself (the next version) before. The first reader's release
    /// (a reader still in) hands nothing over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_readers_release_hands_the_lock_to_the_reserved_writer() {
        use distlock_core::DistributedLock;
        let url = conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL");
        let Some(url) = url else { return };
        let ([a, b, c], pool) = three_clients(&url).await;
        let name = super::unique("my_writer_handover");
        let first = a.acquire(&name, &super::shared()).await.expect("a read");
        let second = c.acquire(&name, &super::shared()).await.expect("a read");
        let tokens = [&first, &second].map(|read| read.token().get());
        let writer = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { b.acquire(&name, &super::writer()).await })
        };
        let reserved = super::until_queued(&name, 1, || async {
            let (_, _, next, ttl) = lock_row(&pool, &name).await;
            next.map(|next| (next, ttl)).into_iter().collect()
        })
        .await;
        let [(next, ttl)] = <[_; 1]>::try_from(reserved).expect("one reservation");
        assert_eq!(ttl, Some(10_000_000), "a writer reserves with its ttl");
        // Time for the writer to start its wait on the latest reader's wake lock, well
        // within the quarter of its reservation (250 ms) in which its polls read nothing.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        first.release().await.expect("release");
        let (_, _, still, _) = lock_row(&pool, &name).await;
        assert_eq!(still.as_ref(), Some(&next), "handed over with a reader in");
        second.release().await.expect("release");
        let (owner, _, reserved, ttl) = lock_row(&pool, &name).await;
        assert_eq!(
            owner.as_ref(),
            Some(&next),
            "the release did not hand the lock over"
        );
        assert_eq!(
            (reserved, ttl),
            (None, None),
            "the reservation outlived the hand-over"
        );
        // The version after the latest reader's (readers are refused behind the writer's
        // reservation): above both readers' tokens.
        let handed = tokens[1] + 1;
        let got = super::common::granted(writer).await;
        assert_eq!(
            got.token().get(),
            handed,
            "not the handed version: the writer took the row again"
        );
        let (_, version, _, _) = lock_row(&pool, &name).await;
        assert_eq!(u64::try_from(version), Ok(handed), "the row moved on");
        got.renew().await.expect("renew what was handed over");
        super::writer_alone(&a, &name, got).await;
    }

    kinds_suite!(
        conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL"),
        "CREATE TABLE {t} (name VARBINARY(512) NOT NULL PRIMARY KEY, \
         owner VARBINARY(255) NULL, version BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
         next_owner VARBINARY(255) NULL, next_since BIGINT NULL, next_expires DATETIME(6) NULL) \
         ENGINE=InnoDB"
    );
}

#[cfg(feature = "sqlite")]
mod sqlite {
    fn url() -> Option<crate::common::SqliteUrl> {
        Some(crate::common::SqliteUrl::new("distlock-kinds-"))
    }

    kinds_suite!(
        url(),
        "CREATE TABLE {t} (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
         version INTEGER NOT NULL, expires_at INTEGER NOT NULL, next_owner TEXT, \
         next_since INTEGER, next_expires INTEGER) WITHOUT ROWID"
    );
}
