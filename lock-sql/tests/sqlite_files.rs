//! SQLite files that cannot be used: a configuration error naming the path and the cause
//! (issue 47), never SQLite's bare "(code: 14) unable to open database file". A read-only file
//! or directory needs another user than root to happen: `distlock-cli/tests/sqlite_input.rs`
//! runs the binary as one.
#![cfg(feature = "sqlite")]

use distlock_core::{ClientConfig, Error};

/// The error of connecting to `url`, which must fail.
async fn refused(url: &str) -> Error {
    match distlock_sql::connect(url, ClientConfig::default()).await {
        Ok(_) => panic!("{url}: connected"),
        Err(err) => err,
    }
}

/// Asserts that `err` is a one-line configuration error that contains every one of `needles`.
fn assert_config_error(err: &Error, needles: &[&str]) {
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    let text = err.to_string();
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    assert!(!text.contains("code: 14") && !text.contains('\n'), "{text}");
}

#[tokio::test]
async fn a_missing_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no").join("such");
    let file = missing.join("x.db");
    let err = refused(&format!("sqlite://{}", file.display())).await;
    assert_config_error(
        &err,
        &[
            &format!("cannot open the SQLite database {}", file.display()),
            &format!("the directory {} does not exist", missing.display()),
        ],
    );
    assert!(!missing.exists(), "nothing was created");
}

#[tokio::test]
async fn a_directory_or_a_file_in_place_of_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused(&format!("sqlite://{}", dir.path().display())).await;
    assert_config_error(
        &err,
        &[&format!(
            "{} is a directory, not a database file",
            dir.path().display()
        )],
    );
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"not a directory").unwrap();
    let err = refused(&format!("sqlite://{}/x.db", plain.display())).await;
    assert_config_error(&err, &[&format!("{} is not a directory", plain.display())]);
}

/// `mode=ro` of a missing file is SQLite's own refusal, explained: the file does not exist and
/// a read-only URL creates none; `immutable=true` cannot take the lock table. A usable path
/// still connects.
#[tokio::test]
async fn a_missing_file_of_a_read_only_url_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ok.db");
    let err = refused(&format!("sqlite://{}?mode=ro", file.display())).await;
    assert_config_error(
        &err,
        &[&format!(
            "cannot open the SQLite database {}: the file does not exist",
            file.display()
        )],
    );
    // SQLite creates an immutable file but writes nothing to it, not even the lock table.
    let immutable = dir.path().join("immutable.db");
    let err = refused(&format!("sqlite://{}?immutable=true", immutable.display())).await;
    assert_config_error(
        &err,
        &[&format!(
            "cannot open the SQLite database {}: its URL opens it read-only",
            immutable.display()
        )],
    );
    distlock_sql::connect(
        &format!("sqlite://{}", file.display()),
        ClientConfig::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(file.exists());
}
