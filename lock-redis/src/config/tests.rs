//! The URL parser and the configuration on valid and invalid URLs.

use super::*;

#[test]
fn redlock_takes_at_most_as_many_masters_as_its_tokens_can_name() {
    let urls: Vec<String> = (0..65).map(|i| format!("redis://h{i}:1")).collect();
    let err = RedisConfig::redlock(&urls).unwrap_err();
    assert!(err.to_string().contains("at most 64 masters"), "{err}");
    assert!(RedisConfig::redlock(&urls[..64]).is_ok());
    // Distinct masters give distinct tokens; a larger counter is a larger token.
    use crate::redlock::token_of;
    assert!(token_of(7, 0) < token_of(7, 1) && token_of(7, 63) < token_of(8, 0));
}

#[test]
fn parses_hosts_credentials_databases_and_options() {
    let c = RedisConfig::from_url("redis://:secret@[::1]:6380/2?fair=1&client_name=a-b").unwrap();
    assert_eq!(c.nodes, ["redis://:secret@[::1]:6380/2"]);
    assert!(c.fair && c.client_name == "a-b");
    let c = RedisConfig::from_url("redis://[::1]").unwrap();
    assert_eq!(c.nodes, ["redis://[::1]"]);
    // Hand-over: on by default (Redlock too), off by option, never with `wait_replicas`.
    let ttl = Duration::from_secs(3);
    assert_eq!(c.hand_over_lease(ttl), Some(ttl));
    let c = RedisConfig::from_url("redis://[::1]?hand_over=false").unwrap();
    assert!(!c.hand_over && c.hand_over_lease(ttl).is_none());
    let c = RedisConfig::from_url("redlock://a:1,b:2,c:3").unwrap();
    assert_eq!(c.hand_over_lease(ttl), Some(ttl));
    let c = RedisConfig::from_url("redis+sentinel://a:1/m?wait_replicas=1").unwrap();
    assert!(c.hand_over_lease(ttl).is_none());
    let c = RedisConfig::from_url("REDLOCK://a:1,b:2,c:3/1?node_timeout=7ms").unwrap();
    assert_eq!(c.nodes, ["redis://a:1/1", "redis://b:2/1", "redis://c:3/1"]);
    assert_eq!(c.node_timeout, Some(Duration::from_millis(7)));
    assert_eq!(c.quorum(), 2);
    for bad in [
        "redis://a:1,b:2",
        "redlock://a:1,b:2",
        "redis://a:x",
        "redis://a/x",
        "redis://a?x=1",
        "redis://a?handoff=100",
        "redis://a?handoff_ms=100",
        "rediss://a?danger_skip_verify=maybe",
        "redis://a?hand_over=perhaps",
        "redis://a?ca=/x.pem",
        "redlock://a,b,c?danger_skip_verify=true",
        "rediss://a?cert=/x.pem",
        "redis+unix://",
        "redis+unix://host/x.sock",
    ] {
        assert!(
            matches!(RedisConfig::from_url(bad), Err(Error::InvalidConfig(_))),
            "{bad}"
        );
    }
    let c =
        RedisConfig::from_url("Redis+Unix:///run/redis.sock?db=2&pass=p%40ss&fair=true").unwrap();
    assert_eq!(c.nodes, ["redis+unix:///run/redis.sock?db=2&pass=p%40ss"]);
    assert!(c.fair);
    let c = RedisConfig::from_url("redis://us%3Ar:p%40ss@h:1").unwrap();
    assert_eq!(c.nodes, ["redis://us%3Ar:p%40ss@h:1"]);
}

/// Issue 47: every number of a Redis URL has a range, and a value outside it is refused
/// with the option, the value and the range, in the URL and through the builders alike.
#[test]
fn numeric_options_are_bounded() {
    let c = RedisConfig::from_url(
        "redis+sentinel://a:1/m/2147483647?wait_replicas=1000&wait_timeout=10m&handoff=1m\
         &waiter_timeout=1h",
    )
    .unwrap();
    assert_eq!(
        (c.wait_replicas, c.handoff),
        (1000, Duration::from_secs(60))
    );
    for (url, needle) in [
        (
            "redis://a/2147483648",
            "option database=2147483648 is out of range: expected 0 to 2147483647",
        ),
        (
            "redis://a/99999999999999999999999",
            "option database=99999999999999999999999 is out of range",
        ),
        ("redis://a/x", "option database=\"x\": expected an integer"),
        (
            "redis+unix:///r.sock?db=4294967296",
            "option db=4294967296 is out of range: expected 0 to 2147483647",
        ),
        (
            "redis+sentinel://a:1/m?wait_replicas=100000000",
            "option wait_replicas=100000000 is out of range: expected 0 to 1000",
        ),
        (
            "redis+sentinel://a:1/m?wait_replicas=1&wait_timeout=1h",
            "option wait_timeout=1h is out of range: expected 1ms to 10m",
        ),
        (
            "redis://a?handoff=300000000000years",
            "option handoff=300000000000years is out of range: expected 1ms to 1m",
        ),
        (
            "redis://a?waiter_timeout=10ms",
            "option waiter_timeout=10ms is out of range: expected 30ms to 1h",
        ),
        (
            "redlock://a,b,c?node_timeout=2h",
            "option node_timeout=2h is out of range: expected 1ms to 10m",
        ),
    ] {
        let err = RedisConfig::from_url(url).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{url}: {err:?}");
        let err = err.to_string();
        assert!(err.contains(needle), "{url}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
    let built = RedisConfig::from_url("redis://a").unwrap();
    let err = built
        .clone()
        .with_handoff(Duration::from_secs(3600))
        .validate()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("option handoff=3600s is out of range: expected 1ms to 1m"),
        "{err}"
    );
    assert!(
        built
            .with_waiter_timeout(Duration::ZERO)
            .validate()
            .is_err()
    );
}

#[test]
fn sentinel_and_cluster_urls() {
    let c = RedisConfig::from_url("redis+sentinel://u:p%40ss@a:1,b:2/mymaster/3?wait_replicas=1")
        .unwrap();
    assert_eq!(c.topology(), Topology::Sentinel);
    assert_eq!(c.sentinel_master.as_deref(), Some("mymaster"));
    assert_eq!(
        c.nodes,
        ["redis://u:p%40ss@a:1/3", "redis://u:p%40ss@b:2/3"]
    );
    assert!(c.clock_tokens && c.wait_replicas == 1 && c.quorum() == 1);
    let c = RedisConfig::from_url("REDISS+CLUSTER://a:1,b:2?clock_tokens=false&ca=/x.pem").unwrap();
    assert_eq!(c.topology(), Topology::Cluster);
    assert_eq!(c.nodes, ["rediss://a:1", "rediss://b:2"]);
    assert!(!c.clock_tokens && c.is_tls());
    for bad in [
        "redis+sentinel://a:1,b:2",
        "redis+sentinel://a:1/m/x",
        "redis+cluster://a:1/2",
        "redis://a:1?wait_replicas=1",
        "redis+cluster://a:1?wait_replicas=x",
    ] {
        assert!(
            matches!(RedisConfig::from_url(bad), Err(Error::InvalidConfig(_))),
            "{bad}"
        );
    }
    assert!(RedisConfig::single("redis+cluster://a:1").is_err());
    let err = RedisConfig::from_url("redis+sentinel://:s3cret@a:1").unwrap_err();
    assert!(!err.to_string().contains("s3cret"), "{err}");
}

#[test]
fn tls_urls_mark_every_node_and_keep_the_files() {
    let c = RedisConfig::from_url("REDISS://u:p@h:1/3?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
    assert_eq!(c.nodes, ["rediss://u:p@h:1/3"]);
    assert!(c.is_tls() && c.tls.has_identity() && !c.danger_skip_verify);
    let c = RedisConfig::from_url("redlocks://a:1,b:2,c:3?danger_skip_verify=true").unwrap();
    assert_eq!(c.nodes, ["rediss://a:1", "rediss://b:2", "rediss://c:3"]);
    assert!(c.danger_skip_verify && c.tls.is_empty());
    let mixed = RedisConfig::redlock(&["rediss://a:1?ca=/x", "redis://b:2", "rediss://c:3?ca=/x"]);
    assert!(mixed.is_err(), "a plain node has no ca= and so differs");
    let same = RedisConfig::redlock(&[
        "rediss://a:1?ca=/x",
        "rediss://b:2?ca=/x",
        "rediss://c:3?ca=/x",
    ])
    .unwrap();
    assert_eq!(same.tls.ca(), Some(std::path::Path::new("/x")));
    assert!(!RedisConfig::from_url("redis://h").unwrap().is_tls());
}

#[test]
fn errors_are_one_short_line_without_the_password() {
    let long = format!("redis://:s3cret@{}:1", "h".repeat(100_000));
    for url in [
        long.as_str(),
        "redis://:s3cret@h:1/x",
        "rediss://:s3cret@h:1?cert=/x",
        "redis+unix://:s3cret@h/x",
        "redis://:s3cret@h:1?handoff=soon",
    ] {
        let err = RedisConfig::from_url(url).unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.len() < 500 && !err.contains('\n'), "{err}");
    }
}
