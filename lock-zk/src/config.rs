//! Connection settings: the `zk://` and `zks://` URLs, hosts, chroot, session timeout, digest
//! credentials and TLS files.

use std::fmt;
use std::time::Duration;

use distlock_core::service_url::ServiceUrl;
use distlock_core::tls::TlsFiles;
use distlock_core::{Error, LockName, Result};

use crate::keys::escape;

/// Where and how to reach ZooKeeper.
///
/// `Debug` never shows the password (only the user name), and no error message does either.
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
///
/// With digest credentials and over TLS:
///
/// ```
/// use distlock_zookeeper::ZkConfig;
///
/// let config = ZkConfig::from_url("zks://billing:s3cret@10.0.0.1:2281/apps?ca=/etc/zk/ca.pem")?;
/// assert_eq!(config.digest_user(), Some("billing"));
/// assert!(config.tls().is_some());
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), distlock_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ZkConfig {
    hosts: Vec<String>,
    chroot: Option<String>,
    session_timeout: Duration,
    digest: Option<Digest>,
    tls: Option<TlsFiles>,
    connector: Option<AppConnector>,
}

/// The application's own connector (see [`ZkConfig::with_connector`]); configurations are
/// equal when they share the same one.
#[derive(Clone)]
pub(crate) struct AppConnector {
    pub(crate) connector: std::sync::Arc<zookeeper_client::Connector>,
    pub(crate) secure: bool,
}

impl PartialEq for AppConnector {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.connector, &other.connector) && self.secure == other.secure
    }
}

impl Eq for AppConnector {}

/// Credentials (`user:password`), digest or SASL DIGEST-MD5. The password never leaves this
/// crate's connector.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Digest {
    pub(crate) user: String,
    pub(crate) password: String,
    /// SASL DIGEST-MD5 (`?auth=sasl`) instead of `addauth digest`.
    pub(crate) sasl: bool,
}

impl Digest {
    fn new(user: &str, password: &str) -> std::result::Result<Self, String> {
        if user.is_empty() {
            return Err("digest credentials need a user name".into());
        }
        if user.contains(':') {
            return Err("a digest user name cannot contain ':'".into());
        }
        Ok(Self {
            user: user.to_owned(),
            password: password.to_owned(),
            sasl: false,
        })
    }

    /// The `user:password` sent with `addauth digest`.
    pub(crate) fn auth_bytes(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Digest")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("sasl", &self.sasl)
            .finish()
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("session_timeout", &self.session_timeout)
            .field("digest_user", &self.digest_user())
            .field("sasl", &self.uses_sasl())
            .field("tls", &self.tls)
            .field("application_connector", &self.connector.is_some())
            .finish()
    }
}

impl ZkConfig {
    /// The session timeout asked for by default. It is also the longest lock ttl (see the crate
    /// documentation, "Sessions and ttls").
    pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);

    /// The port of a host given without one.
    pub const DEFAULT_PORT: u16 = 2181;

    /// The session timeouts accepted (`session_timeout`, [`Self::with_session_timeout`]); the
    /// servers grant at most their `maxSessionTimeout` (by default 40 s) anyway.
    pub const SESSION_TIMEOUT: std::ops::RangeInclusive<Duration> =
        Duration::from_millis(100)..=Duration::from_secs(24 * 3600);

    /// Parses a ZooKeeper connect string: `host[:port][,host[:port]...][/chroot]` (port 2181 by
    /// default).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming what is wrong.
    pub fn new(connect: &str) -> Result<Self> {
        let parsed = ServiceUrl::parse(&format!("zk://{}", connect.trim()))?;
        if parsed.username().is_some() || parsed.password().is_some() {
            return Err(parsed.error(
                "a connect string carries no credentials: use ZkConfig::with_digest_auth \
                 or a zk://user:password@host URL",
            ));
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
            digest: None,
            tls: None,
            connector: None,
        })
    }

    /// Parses `zk://[user:password@]host[:port][,host[:port]...][/chroot][?session_timeout=30s]`
    /// or, over TLS, `zks://[user:password@]host[:port]...[/chroot]?ca=PATH[&cert=PATH&key=PATH]`
    /// (the scheme is case-insensitive; `session_timeout` is a duration such as `20s` or
    /// `1500ms`).
    ///
    /// `user:password` are ZooKeeper digest credentials (percent-encode `:`, `@`, `/`, `?`, `#`
    /// in the password); see the crate documentation, "Authentication", for the ACL of the
    /// nodes. `?auth=sasl` authenticates with SASL DIGEST-MD5 instead (cargo feature `sasl`);
    /// `auth=digest` is the default. `zks://` connects with TLS to the servers' `secureClientPort` (give its port: a
    /// host without one gets 2181 here too), verifying their certificates against `ca=` (PEM);
    /// `cert=` and `key=` add a client certificate. It needs the cargo feature `tls`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another scheme, a malformed host list or chroot, a user
    /// without password, `zks://` without `ca=`, `auth=sasl` without credentials, or an
    /// unknown or malformed query option; [`Error::Unsupported`] for `auth=sasl` without the
    /// cargo feature `sasl`.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = ServiceUrl::parse(url)?;
        let secure = match parsed.scheme() {
            "zk" => false,
            "zks" => true,
            _ => {
                return Err(parsed.error(
                    "not a ZooKeeper URL: expected zk://[user:password@]host:port[,host:port...][/chroot] \
                     or zks://...?ca=PATH",
                ));
            }
        };
        let mut config = Self::from_parsed(&parsed)?;
        match (parsed.username(), parsed.password()) {
            (None, None) => {}
            (Some(user), Some(password)) => {
                config.digest = Some(Digest::new(user, password).map_err(|why| parsed.error(why))?);
            }
            (Some(_), None) => {
                return Err(parsed.error("digest credentials need a password: user:password@host"));
            }
            (None, Some(_)) => {
                return Err(parsed.error("digest credentials need a user name: user:password@host"));
            }
        }
        let mut options = parsed.options();
        if let Some(timeout) = options.duration_in("session_timeout", Self::SESSION_TIMEOUT)? {
            config.session_timeout = timeout;
        }
        let mut known = vec!["session_timeout", "auth"];
        match options.take("auth").as_deref() {
            None | Some("digest") => {}
            Some("sasl") => {
                let Some(digest) = config.digest.as_mut() else {
                    return Err(parsed.error("auth=sasl needs credentials: user:password@host"));
                };
                if cfg!(not(feature = "sasl")) {
                    return Err(Error::Unsupported(SASL_UNSUPPORTED.into()));
                }
                digest.sasl = true;
            }
            Some(other) => {
                return Err(parsed.error(format!(
                    "unknown auth={other:?}: expected auth=digest (the default) or auth=sasl"
                )));
            }
        }
        if secure {
            let files = TlsFiles::take(&mut options).map_err(|err| match err {
                Error::InvalidConfig(why) => parsed.error(why),
                other => other,
            })?;
            if files.ca().is_none() {
                return Err(parsed.error(
                    "zks:// needs ?ca=PATH: the certificate authority (PEM) that signed the servers' certificates",
                ));
            }
            config.tls = Some(files);
            known.extend_from_slice(TlsFiles::OPTIONS);
        }
        options.finish(&known)?;
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

    /// Authenticates the session with ZooKeeper digest credentials (`addauth digest
    /// user:password`), and creates every node under an ACL that only this identity can change
    /// (see the crate documentation, "Authentication").
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty user name or one containing `:`.
    pub fn with_digest_auth(mut self, user: &str, password: &str) -> Result<Self> {
        self.digest = Some(Digest::new(user, password).map_err(Error::InvalidConfig)?);
        Ok(self)
    }

    /// Connects with TLS (to the servers' `secureClientPort`), verifying their certificates
    /// against the certificate authority of `files`, which must name one; a client certificate
    /// in `files` is presented to the servers. Needs the cargo feature `tls`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `files` names no certificate authority.
    pub fn with_tls(mut self, files: TlsFiles) -> Result<Self> {
        if files.ca().is_none() {
            return Err(Error::InvalidConfig(
                "ZooKeeper TLS needs a certificate authority (ca=): the one that signed the servers' certificates".into(),
            ));
        }
        self.tls = Some(files);
        Ok(self)
    }

    /// Opens sessions with the application's own `connector` (its connection timeout,
    /// read-only mode, SASL, TLS options, ...). The backend still sets what the lock protocol
    /// relies on: the session timeout of this configuration (it bounds the ttl), failing
    /// eagerly when no host answers, the digest credentials of this configuration if it has
    /// any (the ACL of its nodes follows them), and its TLS files if it has any. `secure` says
    /// that the connector carries TLS options of its own, so sessions connect with
    /// `tcp+tls` (that needs this crate's `tls` feature).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), distlock_core::Error> {
    /// use distlock_zookeeper::{ZkBackend, ZkConfig, zookeeper_client as zk};
    /// use distlock_core::{ClientConfig, LockClient};
    ///
    /// let app = zk::Client::connector().with_connection_timeout(std::time::Duration::from_secs(2));
    /// let config = ZkConfig::from_url("zk://app:secret@zk1:2181,zk2:2181/app")?
    ///     .with_connector(app, false);
    /// let backend = ZkBackend::connect(config, &ClientConfig::default()).await?;
    /// let locks = LockClient::new(backend);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_connector(mut self, connector: zookeeper_client::Connector, secure: bool) -> Self {
        self.connector = Some(AppConnector {
            connector: std::sync::Arc::new(connector),
            secure,
        });
        self
    }

    /// Whether sessions connect with TLS (a `zks://` configuration, or the application's
    /// connector said so).
    pub fn is_secure(&self) -> bool {
        self.tls.is_some() || self.connector.as_ref().is_some_and(|c| c.secure)
    }

    pub(crate) fn app_connector(&self) -> Option<&zookeeper_client::Connector> {
        self.connector.as_ref().map(|c| &*c.connector)
    }

    /// Authenticates the session with SASL DIGEST-MD5 (`user` and `password` as in the servers'
    /// JAAS `Server` section), and creates every node under an ACL that only this identity
    /// (`sasl:user`) can change (see the crate documentation, "Authentication"). Needs the
    /// cargo feature `sasl` (without it, connecting fails with [`Error::Unsupported`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty user name or one containing `:`.
    pub fn with_sasl_auth(mut self, user: &str, password: &str) -> Result<Self> {
        let mut digest = Digest::new(user, password).map_err(Error::InvalidConfig)?;
        digest.sasl = true;
        self.digest = Some(digest);
        Ok(self)
    }

    /// The user name (digest or SASL), if the session authenticates.
    pub fn digest_user(&self) -> Option<&str> {
        self.digest.as_ref().map(|d| d.user.as_str())
    }

    /// Whether the session authenticates with SASL DIGEST-MD5 (`?auth=sasl`) rather than
    /// digest credentials.
    pub fn uses_sasl(&self) -> bool {
        self.digest.as_ref().is_some_and(|d| d.sasl)
    }

    /// The digest credentials, if any.
    pub(crate) fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// The TLS files, if the connection uses TLS.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
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
        let timeout = self.session_timeout;
        distlock_core::service_url::check_duration(
            "session_timeout",
            &format!("{timeout:?}"),
            timeout,
            &Self::SESSION_TIMEOUT,
        )
        .map(drop)
        .map_err(Error::InvalidConfig)
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

/// `auth=sasl` (or [`ZkConfig::with_sasl_auth`]) in a build without the feature.
pub(crate) const SASL_UNSUPPORTED: &str = "ZooKeeper SASL authentication (auth=sasl) needs the cargo feature `sasl` of \
     distlock-zookeeper (`zookeeper-sasl` of distlock)";

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
    fn parses_credentials_and_tls() {
        let c = ZkConfig::from_url("zk://app:pa%40ss%3Aw@h:1/c").unwrap();
        assert_eq!(c.digest_user(), Some("app"));
        assert_eq!(c.digest().unwrap().auth_bytes(), b"app:pa@ss:w".to_vec());
        assert!(c.tls().is_none());
        let shown = format!("{c:?} {c:#?}");
        assert!(
            !shown.contains("pa@ss") && !shown.contains("pa%40ss"),
            "{shown}"
        );
        let c = ZkConfig::from_url("ZKS://h:2281?ca=/x/ca.pem&cert=/x/c.pem&key=/x/k.pem").unwrap();
        assert_eq!(c.digest_user(), None);
        let tls = c.tls().unwrap();
        assert_eq!(tls.ca().unwrap().to_str(), Some("/x/ca.pem"));
        assert!(tls.has_identity());
        assert!(
            ZkConfig::new("h")
                .unwrap()
                .with_digest_auth("", "p")
                .is_err()
        );
        assert!(
            ZkConfig::new("h")
                .unwrap()
                .with_tls(TlsFiles::default())
                .is_err()
        );
        // Errors about a URL with a password do not show it.
        let err = ZkConfig::from_url("zks://u:topsecret@h")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("topsecret"), "{err}");
        let err = ZkConfig::new("u:topsecret@h").unwrap_err().to_string();
        assert!(!err.contains("topsecret"), "{err}");
    }

    #[test]
    fn parses_auth_option() {
        let c = ZkConfig::from_url("zk://app:pw@h?auth=digest").unwrap();
        assert!(!c.uses_sasl());
        assert_eq!(c.digest_user(), Some("app"));
        let sasl = ZkConfig::from_url("zk://app:topsecret@h:1/c?auth=sasl");
        #[cfg(feature = "sasl")]
        {
            let c = sasl.unwrap();
            assert!(c.uses_sasl());
            assert_eq!(c.digest_user(), Some("app"));
            let shown = format!("{c:?} {c:#?}");
            assert!(!shown.contains("topsecret"), "{shown}");
        }
        #[cfg(not(feature = "sasl"))]
        match sasl {
            Err(Error::Unsupported(why)) => {
                assert!(why.contains("feature `sasl`"), "{why}");
                assert!(!why.contains("topsecret"), "{why}");
            }
            other => panic!("auth=sasl without the feature: {other:?}"),
        }
        let c = ZkConfig::new("h")
            .unwrap()
            .with_sasl_auth("app", "topsecret")
            .unwrap();
        assert!(c.uses_sasl());
        assert!(!format!("{c:?}").contains("topsecret"));
        assert!(
            ZkConfig::new("h")
                .unwrap()
                .with_sasl_auth("a:b", "p")
                .is_err()
        );
        for bad in [
            "zk://h?auth=sasl",
            "zk://u:p@h?auth=kerberos",
            "zk://u:p@h?auth=",
        ] {
            assert!(
                matches!(ZkConfig::from_url(bad), Err(Error::InvalidConfig(_))),
                "{bad:?} was accepted"
            );
        }
    }

    /// Issue 47: numbers outside their range name the option, the value and the range.
    #[test]
    fn session_timeouts_are_bounded() {
        for (url, needle) in [
            (
                "zk://h?session_timeout=99ms",
                "option session_timeout=99ms is out of range: expected 100ms to 1day",
            ),
            (
                "zk://h?session_timeout=300000000000years",
                "option session_timeout=300000000000years is out of range",
            ),
            (
                "zk://h:70000",
                "port 70000 of host h:70000 is out of range: expected 1 to 65535",
            ),
        ] {
            let err = ZkConfig::from_url(url).unwrap_err().to_string();
            assert!(err.contains(needle), "{url}: {err}");
        }
        let c = ZkConfig::from_url("zk://h?session_timeout=1day").unwrap();
        assert_eq!(c.session_timeout(), Duration::from_secs(24 * 3600));
        let err = c
            .with_session_timeout(Duration::from_secs(100_000))
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("option session_timeout=100000s is out of range"),
            "{err}"
        );
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
            "zk://u@h",
            "zk://:p@h",
            "zk://u%3Ax:p@h",
            "zks://u:p@h",
            "zks://h?cert=/c.pem&key=/k.pem",
            "zks://h?ca=/ca.pem&cert=/c.pem",
            "zk://h?ca=/ca.pem",
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
