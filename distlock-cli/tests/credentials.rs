//! A password kept in a file (`--password-file`, DISTLOCK_PASSWORD_FILE, or the URL option
//! `password_file=`): read at connect, never in argv, the environment or a message.

#![cfg(feature = "postgres")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;

/// The TLS user's URL (it has a password), and the same URL without its password.
fn urls() -> Option<(String, String, String)> {
    let url = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_TLS_URL")?;
    let (scheme, rest) = url.split_once("://").expect("scheme");
    let (userinfo, rest) = rest.split_once('@').expect("userinfo");
    let (user, password) = userinfo.split_once(':').expect("a password");
    Some((
        url.clone(),
        format!("{scheme}://{user}@{rest}"),
        password.to_owned(),
    ))
}

#[test]
fn a_password_file_replaces_the_password_in_the_url() {
    let Some((_, without, password)) = urls() else {
        return;
    };
    let env = Env::new();
    let file = env.path("pw");
    std::fs::write(&file, format!("{password}\n")).expect("write the password file");
    let file = file.to_string_lossy().into_owned();
    // Without it: refused by the server.
    let out = env.run(&["run", "--url", &without, "--name", "pw", "--", "true"]);
    assert_ne!(out.status.code(), Some(0));
    // The flag, the variable, the URL option: each connects.
    let out = env.run(&[
        "run",
        "--url",
        &without,
        "--password-file",
        &file,
        "--name",
        "pw",
        "--",
        "true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = env
        .distlock(&["run", "--url", &without, "--name", "pw", "--", "env"])
        .env("DISTLOCK_PASSWORD_FILE", &file)
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    // (The test's own DISTLOCK_TEST_* variables hold the password: not distlock's doing.)
    let leaked = printed
        .lines()
        .filter(|line| !line.starts_with("DISTLOCK_TEST_"))
        .any(|line| line.starts_with("DISTLOCK_PASSWORD_FILE=") || line.contains(&password));
    assert!(!leaked, "{printed}");
    let with_option = format!("{without}&password_file={file}");
    let out = env.run(&["status", "--url", &with_option, "--name", "pw"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A wrong file is named, its content never shown.
    std::fs::write(env.path("wrong"), "not-the-password-xyz").expect("write");
    let wrong = env.path("wrong").to_string_lossy().into_owned();
    let out = env.run(&[
        "run",
        "--url",
        &without,
        "--password-file",
        &wrong,
        "--name",
        "pw",
        "--",
        "true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(!stderr.contains("not-the-password-xyz"), "{stderr}");
    let missing = env.run(&[
        "run",
        "--url",
        &without,
        "--password-file",
        "/nonexistent/pw",
        "--name",
        "pw",
        "--",
        "true",
    ]);
    assert_eq!(missing.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("/nonexistent/pw"), "{stderr}");
}
