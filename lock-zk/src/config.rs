//! Connection settings: the `zk://` URL, hosts, chroot and session timeout.

use std::time::Duration;

use distlock_core::service_url::ServiceUrl;
use distlock_core::{Error, LockName, Result};

use crate::keys::escape;

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

    /// The port of a host given without one.
    pub const DEFAULT_PORT: u16 = 2181;

    /// Parses a ZooKeeper connect string: `host[:port][,host[:port]...][/chroot]` (port 2181 by
    /// default).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming what is wrong.
    pub fn new(connect: &str) -> Result<Self> {
        let parsed = ServiceUrl::parse(&format!("zk://{}", connect.trim()))?;
        if parsed.username().is_some() || parsed.password().is_some() {
            return Err(parsed.error("credentials are not supported yet"));
        }
        parsed.options().finish(&[])?;
        Self::from_parsed(&parsed)
    }

    fn from_parsed(parsed: &ServiceUrl) -> Result<Self> {
        let hosts = parsed
            .hosts()
            .iter()
            .map(|host| host.with_default_port(Self::DEFAULT_PORT))
            .collect();
        let chroot = match parsed.path().trim_end_matches('/') {
            "" if parsed.path().len() <= 1 => None,
            path => Some(check_chroot(&format!("/{path}")).map_err(|why| parsed.error(why))?),
        };
        Ok(Self {
            hosts,
            chroot,
            session_timeout: Self::DEFAULT_SESSION_TIMEOUT,
        })
    }

    /// Parses `zk://host[:port][,host[:port]...][/chroot][?session_timeout=30s]` (the scheme is
    /// case-insensitive; `session_timeout` is a duration such as `20s` or `1500ms`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another scheme, a malformed host list or chroot, or an
    /// unknown or malformed query option.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = ServiceUrl::parse(url)?;
        if parsed.scheme() != "zk" {
            return Err(parsed
                .error("not a ZooKeeper URL: expected zk://host:port[,host:port...][/chroot]"));
        }
        if parsed.username().is_some() || parsed.password().is_some() {
            return Err(parsed.error("credentials are not supported yet"));
        }
        let mut config = Self::from_parsed(&parsed)?;
        let mut options = parsed.options();
        if let Some(timeout) = options.duration("session_timeout")? {
            config.session_timeout = timeout;
        }
        options.finish(&["session_timeout"])?;
        config.check().map_err(|err| match err {
            Error::InvalidConfig(why) => parsed.error(why),
            other => other,
        })?;
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

fn check_chroot(path: &str) -> std::result::Result<String, String> {
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
    Ok(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_chroot_and_options() {
        let c = ZkConfig::from_url("ZK://a:1,b,[::1]:3/x/y?session_timeout=1500ms").unwrap();
        assert_eq!(c.hosts(), ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(c.chroot(), Some("/x/y"));
        assert_eq!(c.session_timeout(), Duration::from_millis(1500));
        assert_eq!(c.base_path(), "/x/y/distlock");
        let c = ZkConfig::from_url("zk://127.0.0.1:12181").unwrap();
        assert_eq!(c.chroot(), None);
        assert_eq!(c.base_path(), "/distlock");
        assert_eq!(ZkConfig::from_url("zk://h/").unwrap().chroot(), None);
        // Dot segments are resolved as in any URL.
        let c = ZkConfig::from_url("zk://h/a/../b").unwrap();
        assert_eq!(c.chroot(), Some("/b"));
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
            "zk://h?nope=1",
            "zk://h?session_timeout=abc",
            "zk://h?session_timeout=1ms",
            "zk://h?session_timeout=1500",
            "zk://u:p@h",
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
