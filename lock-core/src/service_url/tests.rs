//! The service URL parser on valid, invalid and hostile URLs.

use super::*;

#[test]
fn parses_hosts_users_paths_and_options() {
    let url = ServiceUrl::parse("Redis://user:p%3Ass@Host.Example:6380/3?a=1&b=x%20y").unwrap();
    assert_eq!(url.scheme(), "redis");
    assert_eq!(url.username(), Some("user"));
    assert_eq!(url.password(), Some("p:ss"));
    assert_eq!(url.hosts()[0].host(), "Host.Example");
    assert_eq!(url.hosts()[0].port(), Some(6380));
    assert_eq!(url.path(), "3");
    let mut options = url.options();
    assert_eq!(options.parse::<u32>("a", "a number").unwrap(), Some(1));
    assert_eq!(options.take("b").as_deref(), Some("x y"));
    options.finish(&[]).unwrap();

    let url = ServiceUrl::parse("zk://a,b:2,[::1]:3/chroot/x").unwrap();
    let hosts: Vec<String> = url
        .hosts()
        .iter()
        .map(|h| h.with_default_port(2181))
        .collect();
    assert_eq!(hosts, ["a:2181", "b:2", "[::1]:3"]);
    assert_eq!(url.path(), "chroot/x");
}

#[test]
fn rejects_malformed_urls_with_one_clear_line() {
    for (url, needle) in [
        ("", "not a URL"),
        ("127.0.0.1:6379", "not a URL"),
        ("redis://", "no host"),
        ("redis://a,,b", "empty host"),
        ("redis://a:x", "invalid host"),
        (
            "redis://a:0",
            "port 0 of host a:0 is out of range: expected 1 to 65535",
        ),
        (
            "redis://a:70000",
            "port 70000 of host a:70000 is out of range: expected 1 to 65535",
        ),
        (
            "redis://[::1]:99999999999999999999999",
            "port 99999999999999999999999 of host [::1]:99999999999999999999999 is out of range",
        ),
        ("redis://a#frag", "fragment"),
    ] {
        let err = ServiceUrl::parse(url).unwrap_err().to_string();
        assert!(err.contains(needle), "{url}: {err}");
        assert!(!err.contains('\n'), "{url}: {err}");
    }
    let long = format!("redis://{}:1", "h".repeat(100_000));
    let err = ServiceUrl::parse(&long).unwrap_err().to_string();
    assert!(err.len() < 2 * MAX_ECHO + 200, "{} bytes", err.len());
}

#[test]
fn durations_use_humantime_and_need_a_unit() {
    assert_eq!(parse_duration("t", "250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("t", "1m 30s"), Ok(Duration::from_secs(90)));
    assert!(
        parse_duration("t", "250")
            .unwrap_err()
            .contains("needs a unit")
    );
    assert!(
        parse_duration("t", "0s")
            .unwrap_err()
            .contains("greater than zero")
    );
    assert!(parse_duration("t", "soon").is_err());
    let mut options = ServiceUrl::parse("x://h?t=5&u=1").unwrap().options();
    assert!(options.duration("t").is_err());
    let err = options.finish(&["t"]).unwrap_err().to_string();
    assert!(err.contains("unknown option \"u\" (known: t)"), "{err}");
}

#[test]
fn numbers_outside_their_range_name_the_option_the_value_and_the_range() {
    let mut options = ServiceUrl::parse(
        "x://h?a=0&b=1001&c=99999999999999999999999999999999999999999&d=-1&e=1e3&f=&g=+7&h=1000",
    )
    .unwrap()
    .options();
    for (key, needle) in [
        ("a", "option a=0 is out of range: expected 1 to 1000"),
        ("b", "option b=1001 is out of range: expected 1 to 1000"),
        (
            "c",
            "option c=99999999999999999999999999999999999999999 is out of range: expected 1 to 1000",
        ),
        ("d", "option d=-1 is out of range: expected 1 to 1000"),
        ("e", "option e=\"1e3\": expected an integer from 1 to 1000"),
        ("f", "option f=\"\": expected an integer from 1 to 1000"),
    ] {
        let err = options
            .integer::<u32>(key, 1..=1000)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{key}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
    assert_eq!(options.integer::<u32>("g", 1..=1000).unwrap(), Some(7));
    assert_eq!(options.integer::<u32>("h", 1..=1000).unwrap(), Some(1000));
    assert_eq!(options.integer::<u32>("absent", 1..=1000).unwrap(), None);
    assert_eq!(check_integer("n", 5u32, &(1..=10)), Ok(5));
    assert_eq!(
        check_integer("n", 0u32, &(1..=10)),
        Err("option n=0 is out of range: expected 1 to 10".to_owned())
    );
    // A range as wide as the type: only the type bounds the value.
    assert_eq!(
        parse_integer::<u16>("p", "65535", &(0..=u16::MAX)),
        Ok(65535)
    );
    assert!(
        parse_integer::<u16>("p", "65536", &(0..=u16::MAX))
            .unwrap_err()
            .contains("out of range: expected 0 to 65535")
    );

    let range = Duration::from_millis(1)..=Duration::from_secs(3600);
    let mut options = ServiceUrl::parse(
        "x://h?a=1ms&b=1h&c=1h%201ms&d=500us&e=5&f=300000000000years&g=9999999999999years",
    )
    .unwrap()
    .options();
    assert_eq!(
        options.duration_in("a", range.clone()).unwrap(),
        Some(Duration::from_millis(1))
    );
    assert_eq!(
        options.duration_in("b", range.clone()).unwrap(),
        Some(Duration::from_secs(3600))
    );
    for (key, needle) in [
        ("c", "option c=1h 1ms is out of range: expected 1ms to 1h"),
        ("d", "option d=500us is out of range: expected 1ms to 1h"),
        ("e", "needs a unit"),
        (
            "f",
            "option f=300000000000years is out of range: expected 1ms to 1h",
        ),
        ("g", "option g=\"9999999999999years\": expected a duration"),
    ] {
        let err = options
            .duration_in(key, range.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{key}: {err}");
    }
}

#[test]
fn no_rendering_shows_the_password() {
    let secret = "s3cr3t-Pw";
    for url in [
        format!("redis://:{secret}@h:1"),
        format!("postgres://u:{secret}@h/db?sslmode=require"),
        format!("redis://h:1?password={secret}"),
        format!("redis://u:{secret}@h:x"),
        format!("etcd://u:{secret}@a,b/p#f"),
        format!("://://:{secret}@[::1]/x"),
        format!("redis://u:{secret}@h/@x"),
        format!("redis:/u:{secret}@h"),
        format!("redis+u?nix&://u:{secret}@h/x?a=b"),
        format!("redis://u:{secret}?x@h"),
        format!("redis://h?a=1&p@ss={secret}"),
        format!("redis://h?=password={secret}"),
        format!(":[//u:{secret}@@&xn--://x"),
        format!("nats://{secret}@h:4222"),
        format!("NATS+TLS://{secret}@a,b/bucket?ca=/c.pem"),
        format!("tls://{secret}@h?x@y"),
    ] {
        let shown = [
            redact(&url),
            ServiceUrl::parse(&url)
                .map(|u| format!("{u:?} {}", u.redacted()))
                .unwrap_or_else(|e| format!("{e} {e:?}")),
        ];
        for text in shown {
            assert!(!text.contains(secret), "{text}");
        }
    }
}
