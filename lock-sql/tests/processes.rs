//! Two OS processes on one SQLite file exclude each other: this test binary runs itself twice
//! as a child; both children increment a counter kept in a plain file (a non-atomic
//! read-modify-write) under the lock, and log the token they held.

#![cfg(feature = "sqlite")]

use std::path::Path;
use std::time::Duration;

use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};

const CHILD_DB: &str = "DISTLOCK_SQLITE_CHILD_DB";
const CHILD_DIR: &str = "DISTLOCK_SQLITE_CHILD_DIR";
const CHILD_ID: &str = "DISTLOCK_SQLITE_CHILD_ID";
const ROUNDS: u64 = 60;
const TEST: &str = "two_processes_exclude_each_other_on_one_file";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_exclude_each_other_on_one_file() {
    if let (Ok(db), Ok(dir), Ok(id)) = (
        std::env::var(CHILD_DB),
        std::env::var(CHILD_DIR),
        std::env::var(CHILD_ID),
    ) {
        child(&db, Path::new(&dir), &id).await;
        return;
    }
    let dir =
        std::env::temp_dir().join(format!("distlock-procs-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("counter"), "0").expect("counter");
    let db = dir.join("locks.db");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..2)
        .map(|id| {
            tokio::process::Command::new(&exe)
                .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(CHILD_DB, &db)
                .env(CHILD_DIR, &dir)
                .env(CHILD_ID, id.to_string())
                .output()
        })
        .collect();
    for out in futures::future::join_all(children).await {
        let out = out.expect("child ran");
        assert!(
            out.status.success(),
            "child failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let counter: u64 = std::fs::read_to_string(dir.join("counter"))
        .expect("counter")
        .trim()
        .parse()
        .expect("number");
    assert_eq!(
        counter,
        2 * ROUNDS,
        "lost update: the processes did not exclude each other"
    );
    // In counter order (the order of the critical sections), tokens strictly increase.
    let mut entries: Vec<(u64, u64, String)> = Vec::new();
    for id in ["0", "1"] {
        let log = std::fs::read_to_string(dir.join(format!("log-{id}"))).expect("log");
        for line in log.lines() {
            let (value, token) = line.split_once(' ').expect("line");
            entries.push((
                value.parse().expect("value"),
                token.parse().expect("token"),
                id.into(),
            ));
        }
    }
    entries.sort();
    assert_eq!(entries.len() as u64, 2 * ROUNDS);
    for pair in entries.windows(2) {
        assert_eq!(
            pair[1].0,
            pair[0].0 + 1,
            "two sections saw the same counter"
        );
        assert!(pair[1].1 > pair[0].1, "tokens did not increase: {pair:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

async fn child(db: &str, dir: &Path, id: &str) {
    let url = format!("sqlite://{db}");
    let client = distlock_sql::connect(&url, ClientConfig::default())
        .await
        .expect("child connects");
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(60));
    let mut log = String::new();
    for _ in 0..ROUNDS {
        let guard = client
            .acquire("shared", &opts)
            .await
            .expect("child acquires");
        let counter = dir.join("counter");
        let value: u64 = std::fs::read_to_string(&counter)
            .expect("read")
            .trim()
            .parse()
            .expect("number");
        tokio::time::sleep(Duration::from_millis(1)).await;
        std::fs::write(&counter, (value + 1).to_string()).expect("write");
        log.push_str(&format!("{value} {}\n", guard.token()));
        guard.release().await.expect("child releases");
    }
    std::fs::write(dir.join(format!("log-{id}")), log).expect("log");
}
