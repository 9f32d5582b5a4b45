//! Connection settings: the `zk://` URL, hosts, chroot and session timeout.

use std::time::Duration;

use distlock_core::{Error, LockName, Result};

use crate::names::escape;

/// Where and how to reach ZooKeeper.
///
/// ```
/// use std::time::Duration;
/// use distlock_zookeeper::ZkConfig;
///
/// let config = ZkConfig::from_url("zk://10.0.0.1:2181,10.0.0.2:2181/apps/billing?session_timeout=20s")?;
/// assert_eq!(config.hosts(), ["10.0.0.1:2181", "10.0.0.2:2181"]);
/// assert_eq!(config.chroot(), Some("/apps/billing"));
/// assert_eq!(config.session_timeout(), Duration::from_secs(20));
/// # Ok::<(), distlock_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkConfig {
    hosts: Vec<String>,
    chroot: Option<String>,
    session_timeout: Duration,
}

impl ZkConfig {
    /// The session timeout asked for by default. It is also the longest lock ttl (see the crate
    /// documentation, "Sessions and ttls").
    pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);

    /// Parses a ZooKeeper connect string: `host[:port][,host[:port]...][/chroot]` (port 2181 by
    /// default).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming what is wrong.
    pub fn new(connect: &str) -> Result<Self> {
        let bad = |msg: String| {
            Error::InvalidConfig(format!("ZooKeeper connect string {connect:?}: {msg}"))
        };
        let (hosts_part, chroot) = match connect.find('/') {
            Some(i) => (&connect[..i], Some(&connect[i..])),
            None => (connect, None),
        };
        if hosts_part.trim().is_empty() {
            return Err(bad("no host given".into()));
        }
        let mut hosts = Vec::new();
        for host in hosts_part.split(',') {
            hosts.push(parse_host(host.trim()).map_err(bad)?);
        }
        let chroot = match chroot {
            None | Some("/") => None,
            Some(path) => Some(check_chroot(path).map_err(bad)?.to_owned()),
        };
        Ok(Self {
            hosts,
            chroot,
            session_timeout: Self::DEFAULT_SESSION_TIMEOUT,
        })
    }

    /// Parses `zk://host[:port][,host[:port]...][/chroot][?session_timeout=30s]`.
    /// `session_timeout` accepts `ms`, `s` or `m` suffixes (plain numbers are milliseconds).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another scheme, a malformed host list or chroot, or an
    /// unknown or malformed query parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let Some(rest) = url.strip_prefix("zk://") else {
            return Err(Error::InvalidConfig(format!(
                "{url:?} is not a ZooKeeper URL: expected zk://host:port[,host:port...][/chroot]"
            )));
        };
        let (connect, query) = match rest.split_once('?') {
            Some((c, q)) => (c, Some(q)),
            None => (rest, None),
        };
        let mut config = Self::new(connect)?;
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "session_timeout" => {
                    config.session_timeout = parse_duration(value).ok_or_else(|| {
                        Error::InvalidConfig(format!(
                            "session_timeout={value:?} in {url:?}: expected a duration like 30s or 500ms"
                        ))
                    })?;
                }
                other => {
                    return Err(Error::InvalidConfig(format!(
                        "unknown parameter {other:?} in {url:?} (known: session_timeout)"
                    )));
                }
            }
        }
        config.check()?;
        Ok(config)
    }

    /// Sets the session timeout to ask the server for (it may grant less or more within its
    /// `minSessionTimeout..maxSessionTimeout`); the granted one is the longest lock ttl.
    #[must_use]
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The `host:port` list.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The chroot every node lives under, if any.
    pub fn chroot(&self) -> Option<&str> {
        self.chroot.as_deref()
    }

    /// The session timeout asked for.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// Checks the values that a builder may have set.
    pub(crate) fn check(&self) -> Result<()> {
        if self.session_timeout < Duration::from_millis(100)
            || self.session_timeout > Duration::from_secs(24 * 3600)
        {
            return Err(Error::InvalidConfig(format!(
                "session timeout {:?} is outside 100ms..=24h",
                self.session_timeout
            )));
        }
        Ok(())
    }

    /// The connect string handed to the client library (hosts only: the chroot is applied by
    /// this crate, so that it is created when missing).
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// The node under which every lock's node lives: `<chroot>/distlock`.
    pub fn base_path(&self) -> String {
        format!("{}/distlock", self.chroot.as_deref().unwrap_or(""))
    }

    /// The node of lock `name`: `<base>/<escaped name>`; its children are the queue.
    pub fn lock_path(&self, name: &LockName) -> String {
        format!("{}/{}", self.base_path(), escape(name.as_str()))
    }
}

fn parse_host(host: &str) -> std::result::Result<String, String> {
    if host.is_empty() {
        return Err("empty host in the host list".into());
    }
    if host.contains(|c: char| c.is_whitespace() || c == '@' || c == '?' || c == '#') {
        return Err(format!("invalid host {host:?}"));
    }
    // `[v6]:port`, `[v6]`, `name:port`, `name`.
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else {
            return Err(format!("unclosed '[' in host {host:?}"));
        };
        match after.strip_prefix(':') {
            Some(port) => (format!("[{addr}]"), Some(port)),
            None if after.is_empty() => (format!("[{addr}]"), None),
            None => return Err(format!("invalid host {host:?}")),
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if !name.contains(':') => (name.to_owned(), Some(port)),
            Some(_) => {
                return Err(format!(
                    "IPv6 address {host:?} must be written as [addr]:port"
                ));
            }
            None => (host.to_owned(), None),
        }
    };
    if name.is_empty() || name == "[]" {
        return Err(format!("empty host name in {host:?}"));
    }
    let port = match port {
        None => 2181,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(format!("invalid port {p:?} in {host:?}")),
        },
    };
    Ok(format!("{name}:{port}"))
}

fn check_chroot(path: &str) -> std::result::Result<&str, String> {
    let path = path.strip_suffix('/').unwrap_or(path);
    for segment in path.split('/').skip(1) {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(format!("invalid chroot {path:?}"));
        }
        if segment.chars().any(|c| {
            c.is_control() || matches!(c, '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}')
        }) {
            return Err(format!(
                "chroot {path:?} contains a character ZooKeeper does not allow"
            ));
        }
    }
    Ok(path)
}

fn parse_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    let (number, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&value[..i], &value[i..]),
        None => (value, "ms"),
    };
    let n: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_chroot_and_options() {
        let c = ZkConfig::from_url("zk://a:1,b,[::1]:3/x/y?session_timeout=1500").unwrap();
        assert_eq!(c.hosts(), ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(c.chroot(), Some("/x/y"));
        assert_eq!(c.session_timeout(), Duration::from_millis(1500));
        assert_eq!(c.base_path(), "/x/y/distlock");
        let c = ZkConfig::from_url("zk://127.0.0.1:12181").unwrap();
        assert_eq!(c.chroot(), None);
        assert_eq!(c.base_path(), "/distlock");
        assert_eq!(ZkConfig::from_url("zk://h/").unwrap().chroot(), None);
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "redis://h:1",
            "zk://",
            "zk://h:0",
            "zk://h:x",
            "zk://h:99999",
            "zk://a,,b",
            "zk://h//x",
            "zk://h/a/../b",
            "zk://h?nope=1",
            "zk://h?session_timeout=abc",
            "zk://h?session_timeout=1ms",
            "zk://::1:2181",
            "zk://[::1",
        ] {
            assert!(
                matches!(ZkConfig::from_url(bad), Err(Error::InvalidConfig(_))),
                "{bad:?} was accepted"
            );
        }
    }
}
