//! Configuration: which servers, which mode, and the protocol's timing knobs.

use std::time::Duration;

use distlock_core::Error;

/// How the backend connects and behaves. Built with [`RedisConfig::from_url`],
/// [`RedisConfig::single`] or [`RedisConfig::redlock`], then the `with_*` methods.
///
/// URL forms (query options apply to both):
///
/// - `redis://[user:password@]host:port[/db]`: one master;
/// - `redlock://host1:port1,host2:port2,host3:port3[/db]`: Redlock over N >= 3 independent
///   masters.
///
/// Query options: `fair=true` (strict FIFO queue), `handoff_ms=N` (default 100),
/// `waiter_timeout_ms=N` (default 2000), `node_timeout_ms=N` (Redlock per-node timeout),
/// `client_name=NAME` (reported by `CLIENT SETINFO lib-name`, visible in `CLIENT LIST`).
///
/// ```
/// use distlock_redis::RedisConfig;
///
/// let single = RedisConfig::from_url("redis://127.0.0.1:6379/2?fair=true").unwrap();
/// assert!(!single.is_redlock() && single.fair);
/// let redlock = RedisConfig::from_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").unwrap();
/// assert_eq!(redlock.nodes.len(), 3);
/// assert!(RedisConfig::from_url("redlock://10.0.0.1:6379").is_err()); // fewer than 3
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// One `redis://` URL per master (one for single-master mode).
    pub nodes: Vec<String>,
    /// Redlock over `nodes` (majority quorum) instead of one master.
    pub redlock: bool,
    /// Strict FIFO: a waiter queue kept in Redis decides who is next; `try_acquire` fails while
    /// anybody waits. Default `false`: starvation-free handoff (see the crate docs).
    pub fair: bool,
    /// Default mode: how long a release reserves the lock for the oldest waiter. Default 100 ms.
    pub handoff: Duration,
    /// A waiter that stops polling for this long (crashed without leaving the queue) is dropped
    /// from the queue. Waiters re-register every third of it. Default 2 s.
    pub waiter_timeout: Duration,
    /// Redlock: how long to wait for each node; `None`: a tenth of the ttl, at most the
    /// operation timeout.
    pub node_timeout: Option<Duration>,
    /// Name reported to the server (`CLIENT SETINFO lib-name`), to find connections in
    /// `CLIENT LIST`. Default `distlock`.
    pub client_name: String,
}

impl RedisConfig {
    /// One master at `url` (`redis://...`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `url` is not a valid `redis://` URL.
    pub fn single(url: &str) -> Result<Self, Error> {
        let mut config = Self::from_url(url)?;
        if config.redlock {
            return Err(Error::InvalidConfig(format!(
                "expected a redis:// URL, got {url:?}"
            )));
        }
        config.nodes.truncate(1);
        Ok(config)
    }

    /// Redlock over independent masters given as `redis://` URLs (at least 3).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for fewer than 3 nodes or an invalid URL.
    pub fn redlock<S: AsRef<str>>(urls: &[S]) -> Result<Self, Error> {
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            let single = Self::single(url.as_ref())?;
            nodes.extend(single.nodes);
        }
        let config = Self {
            nodes,
            redlock: true,
            ..Self::defaults()
        };
        config.validate()?;
        Ok(config)
    }

    fn defaults() -> Self {
        Self {
            nodes: Vec::new(),
            redlock: false,
            fair: false,
            handoff: Duration::from_millis(100),
            waiter_timeout: Duration::from_secs(2),
            node_timeout: None,
            client_name: "distlock".into(),
        }
    }

    /// Parses a `redis://` or `redlock://` URL with optional query options.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming what is wrong.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let bad = |why: String| Error::InvalidConfig(format!("{why} (in {url:?})"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            bad("expected redis://host:port or redlock://h1:p1,h2:p2,h3:p3".into())
        })?;
        let redlock = match scheme {
            "redis" => false,
            "redlock" => true,
            "rediss" | "redis+unix" | "unix" => {
                return Err(bad(format!(
                    "the {scheme}:// scheme is not supported by lock-redis (use redis://)"
                )));
            }
            other => return Err(bad(format!("unknown scheme {other:?}"))),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if !path.is_empty() && path != "/" {
            let db = &path[1..];
            if db.parse::<u32>().is_err() {
                return Err(bad(format!("the database {db:?} is not a number")));
            }
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (Some(user), hosts),
            None => (None, authority),
        };
        let mut config = Self {
            redlock,
            ..Self::defaults()
        };
        for host in hosts.split(',') {
            let host = host.trim();
            if host.is_empty() {
                return Err(bad("empty host".into()));
            }
            // `host`, `host:port`, `[v6]` or `[v6]:port`.
            let (name, port) = if host.starts_with('[') && host.ends_with(']') {
                (host, None)
            } else {
                match host.rsplit_once(':') {
                    Some((name, port)) => (name, Some(port)),
                    None => (host, None),
                }
            };
            if name.is_empty() {
                return Err(bad(format!("missing host name in {host:?}")));
            }
            if let Some(port) = port
                && port.parse::<u16>().map_or(true, |p| p == 0)
            {
                return Err(bad(format!("invalid port {port:?}")));
            }
            let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
            let node = format!("redis://{user}{host}{path}");
            url::Url::parse(&node).map_err(|e| bad(format!("invalid address {host:?}: {e}")))?;
            config.nodes.push(node);
        }
        if !redlock && config.nodes.len() != 1 {
            return Err(bad(
                "a redis:// URL names one master; use redlock://h1:p1,h2:p2,h3:p3 for several"
                    .into(),
            ));
        }
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let millis = || {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|v| *v > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| {
                        bad(format!(
                            "{key} must be a positive number of milliseconds, got {value:?}"
                        ))
                    })
            };
            match key {
                "fair" => {
                    config.fair = match value {
                        "" | "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(bad(format!("fair must be true or false, got {value:?}"))),
                    }
                }
                "handoff_ms" => config.handoff = millis()?,
                "waiter_timeout_ms" => config.waiter_timeout = millis()?,
                "node_timeout_ms" => config.node_timeout = Some(millis()?),
                "client_name" => {
                    if value.is_empty()
                        || !value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                    {
                        return Err(bad(format!(
                            "client_name must be letters, digits, '-', '_' or '.', got {value:?}"
                        )));
                    }
                    config.client_name = value.to_owned();
                }
                other => {
                    return Err(bad(format!(
                        "unknown option {other:?} (known: fair, handoff_ms, waiter_timeout_ms, node_timeout_ms, client_name)"
                    )));
                }
            }
        }
        config.validate().map_err(|e| match e {
            Error::InvalidConfig(msg) => bad(msg),
            other => other,
        })?;
        Ok(config)
    }

    /// Strict FIFO mode on or off.
    #[must_use]
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Sets the handoff reservation length (default mode).
    #[must_use]
    pub fn with_handoff(mut self, handoff: Duration) -> Self {
        self.handoff = handoff;
        self
    }

    /// Sets the dead-waiter timeout.
    #[must_use]
    pub fn with_waiter_timeout(mut self, timeout: Duration) -> Self {
        self.waiter_timeout = timeout;
        self
    }

    /// Sets the Redlock per-node timeout.
    #[must_use]
    pub fn with_node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// Sets the name reported to the server.
    #[must_use]
    pub fn with_client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// Whether this is a Redlock configuration.
    pub fn is_redlock(&self) -> bool {
        self.redlock
    }

    /// The number of nodes that must agree: all for one master, a majority for Redlock.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the problem.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.nodes.is_empty() {
            return bad("no Redis node given".into());
        }
        if self.redlock && self.nodes.len() < 3 {
            return bad(format!(
                "Redlock needs at least 3 independent masters, got {}",
                self.nodes.len()
            ));
        }
        if !self.redlock && self.nodes.len() != 1 {
            return bad("single-master mode takes exactly one node".into());
        }
        if self.handoff.is_zero() || self.waiter_timeout < Duration::from_millis(30) {
            return bad("handoff must be > 0 and waiter_timeout >= 30 ms".into());
        }
        if self.node_timeout.is_some_and(|t| t.is_zero()) {
            return bad("node_timeout must be greater than zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_credentials_databases_and_options() {
        let c =
            RedisConfig::from_url("redis://:secret@[::1]:6380/2?fair=1&client_name=a-b").unwrap();
        assert_eq!(c.nodes, ["redis://:secret@[::1]:6380/2"]);
        assert!(c.fair && c.client_name == "a-b");
        let c = RedisConfig::from_url("redis://[::1]").unwrap();
        assert_eq!(c.nodes, ["redis://[::1]"]);
        let c = RedisConfig::from_url("redlock://a:1,b:2,c:3/1?node_timeout_ms=7").unwrap();
        assert_eq!(c.nodes, ["redis://a:1/1", "redis://b:2/1", "redis://c:3/1"]);
        assert_eq!(c.node_timeout, Some(Duration::from_millis(7)));
        assert_eq!(c.quorum(), 2);
        for bad in [
            "redis://a:1,b:2",
            "redlock://a:1,b:2",
            "redis://a:x",
            "redis://a/x",
            "redis://a?x=1",
        ] {
            assert!(
                matches!(RedisConfig::from_url(bad), Err(Error::InvalidConfig(_))),
                "{bad}"
            );
        }
    }
}
