//! Fuzz target for every backend's URL parser: random and mangled URLs must give a config or a
//! typed one-line error that does not show the password, never a panic.
//!
//! A seeded generator runs `FUZZ_CASES` cases (default 5000, about a second in CI); run it longer
//! with `FUZZ_CASES=1000000 FUZZ_SEED=7 cargo test -p distlock --all-features --test url_fuzz`.

use distlock::Error;
use rand::rngs::StdRng;
use rand::{RngCore as _, SeedableRng as _};

/// rand's seeded generator, deterministic per seed, and the picks this target makes.
struct Rng(StdRng);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const SECRET: &str = "Zq9SecretPw";

const SCHEMES: &[&str] = &[
    "redis",
    "REDIS",
    "redlock",
    "rediss",
    "redis+unix",
    "unix",
    "redis+sentinel",
    "Rediss+Cluster",
    "etcd",
    "Etcd",
    "etcds",
    "zk",
    "sqlite",
    "SQLite",
    "postgres",
    "mysql",
    "mariadb",
    "",
    "x",
    "redis:",
    "://",
];
const USERINFO: &[&str] = &[
    "",
    "u@",
    ":Zq9SecretPw@",
    "u:Zq9SecretPw@",
    "u%3A:Zq9SecretPw@",
    "@",
    "::@",
    "u:Zq9SecretPw@@",
];
const HOSTS: &[&str] = &[
    "127.0.0.1:1",
    "h",
    "h:0",
    "h:65535",
    "h:65536",
    "h:-1",
    "[::1]",
    "[::1]:2",
    "[::1",
    "::1",
    "a,b,c",
    "a:1,,b",
    ",",
    "h h",
    "h%00",
    "\u{e9}t\u{e9}.example",
    "",
    "h:99999999999999999999",
    "xn--",
    "[fe80::1%25eth0]:1",
];
const PATHS: &[&str] = &[
    "",
    "/",
    "/0",
    "/99",
    "/4294967296",
    "/-1",
    "/a/b",
    "//x",
    "/a/../b",
    "/%ff",
    "/%",
    "/x.db",
    "/:memory:",
    "/\u{0}",
];
const OPTIONS: &[&str] = &[
    "fair",
    "fair=maybe",
    "handoff=0s",
    "handoff=1ms",
    "handoff=99999999999999999999s",
    "handoff=100",
    "waiter_timeout=1ns",
    "node_timeout=1h",
    "client_name=",
    "client_name=a b",
    "session_timeout=1500ms",
    "session_timeout=100y",
    "table=a.b.c",
    "table=ok",
    "pool_size=0",
    "pool_size=4294967296",
    "connect_timeout=1s",
    "busy_timeout=-1s",
    "synchronous=FULL",
    "create_table=perhaps",
    "mode=memory",
    "db=7",
    "pass=Zq9SecretPw",
    "password=Zq9SecretPw",
    "%zz=1",
    "=",
    "&&",
    "x=%",
    "sslmode=require",
];

fn url(rng: &mut Rng) -> String {
    let mut url = format!(
        "{}://{}{}{}",
        rng.pick(SCHEMES),
        rng.pick(USERINFO),
        rng.pick(HOSTS),
        rng.pick(PATHS)
    );
    for i in 0..rng.below(4) {
        url.push(if i == 0 { '?' } else { '&' });
        url.push_str(rng.pick(OPTIONS));
    }
    // Mangle a few bytes now and then, but never inside the secret or a key that names it
    // (`pa&ss=...` is no password option to anybody, so showing its value is no leak).
    if rng.below(4) == 0 {
        for _ in 0..=rng.below(3) {
            let at = rng.below(url.len() + 1);
            let words = [format!("password={SECRET}"), format!("pass={SECRET}")];
            let inside = words
                .iter()
                .map(String::as_str)
                .chain([SECRET])
                .any(|word| {
                    url.match_indices(word)
                        .any(|(start, _)| start < at && at < start + word.len())
                });
            if !inside && url.is_char_boundary(at) {
                let inserts = [
                    "/", "?", "#", "@", ":", ",", "%", "[", "]", "&", "=", " ", "\0", "\u{fffd}",
                ];
                url.insert_str(at, inserts[rng.below(inserts.len())]);
            }
        }
    }
    url
}

fn check(parser: &str, url: &str, result: Result<String, Error>) {
    if let Err(err) = result {
        let text = err.to_string();
        assert!(
            matches!(err, Error::InvalidConfig(_) | Error::Unsupported(_)),
            "{parser} {url:?}: {err:?}"
        );
        assert!(!text.contains(SECRET), "{parser} {url:?}: {text}");
        assert!(!text.contains('\n'), "{parser} {url:?}: {text}");
        assert!(text.len() < 1200, "{parser} {url:?}: {} bytes", text.len());
    }
}

#[test]
fn url_parsers_never_panic_and_never_show_the_password() {
    let cases: u64 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = Rng(StdRng::seed_from_u64(seed));
    let long = format!("redis://u:{SECRET}@{}:1/0?fair", "h".repeat(100_000));
    for case in 0..cases {
        let url = if case == 0 {
            long.clone()
        } else {
            url(&mut rng)
        };
        let shown = distlock::service_url::redact(&url);
        assert!(!shown.contains(SECRET), "redact {url:?}: {shown}");
        check(
            "ServiceUrl",
            &url,
            distlock::service_url::ServiceUrl::parse(&url).map(|u| format!("{u:?}")),
        );
        #[cfg(feature = "redis")]
        check(
            "redis",
            &url,
            distlock::redis::RedisConfig::from_url(&url).map(|c| c.client_name),
        );
        #[cfg(feature = "etcd")]
        check(
            "etcd",
            &url,
            distlock::etcd::EtcdConfig::from_url(&url).map(|c| c.prefix().to_owned()),
        );
        #[cfg(feature = "zookeeper")]
        check(
            "zk",
            &url,
            distlock::zookeeper::ZkConfig::from_url(&url).map(|c| c.base_path()),
        );
        #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
        check(
            "sql",
            &url,
            distlock::sql::SqlConfig::from_url(&url).map(|c| c.redacted_url()),
        );
    }
}
