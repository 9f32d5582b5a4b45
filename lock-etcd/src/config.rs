//! Endpoints, key prefix, TLS and credentials, from a URL or programmatically.

use std::fmt;
use std::time::Duration;

use distlock_core::Error;
use distlock_core::service_url::ServiceUrl;
use distlock_core::tls::TlsFiles;
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

/// The port of an endpoint given without one.
pub const DEFAULT_PORT: u16 = 2379;

/// The default key prefix under which every lock lives.
pub const DEFAULT_PREFIX: &str = "distlock";

/// Where the etcd cluster is, how to reach it (TLS, user) and under which key prefix locks
/// live.
///
/// ```
/// use distlock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::from_url("etcd://127.0.0.1:2379,127.0.0.1:22379/app/locks").unwrap();
/// assert_eq!(config.endpoints(), ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]);
/// assert_eq!(config.prefix(), "app/locks");
///
/// // Mutual TLS and a user: the password never shows in Debug or in any error.
/// let config = EtcdConfig::from_url(
///     "etcds://app:s3cret@10.0.0.1:2379/app?ca=/etc/etcd/ca.pem&cert=/etc/app.pem&key=/etc/app.key",
/// ).unwrap();
/// assert_eq!(config.endpoints(), ["https://10.0.0.1:2379"]);
/// assert!(config.is_tls());
/// assert_eq!(config.username(), Some("app"));
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    prefix: String,
    /// `Some` when the endpoints are `https://` (the files may all be absent: public roots).
    tls: Option<TlsFiles>,
    user: Option<Credentials>,
}

/// A user name and password; `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
struct Credentials {
    user: String,
    password: String,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|c| &c.user))
            .field("password", &self.user.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl EtcdConfig {
    /// A configuration for `endpoints` (`http://host:port`, `https://host:port` or `host:port`),
    /// with the [`DEFAULT_PREFIX`]. `https://` endpoints mean TLS, verified against the public
    /// roots (webpki-roots) unless [`with_tls`](Self::with_tls) names a CA; a bare `host:port`
    /// follows the others (plain when all are bare).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty list, a malformed endpoint, or a mix of `http://`
    /// and `https://`.
    pub fn new<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Result<Self, Error> {
        let parsed = endpoints
            .into_iter()
            .map(|e| normalize_endpoint(e.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if parsed.is_empty() {
            return Err(Error::InvalidConfig(
                "an etcd configuration needs at least one endpoint".into(),
            ));
        }
        let https = parsed.iter().any(|(scheme, _)| *scheme == Some("https"));
        if https && parsed.iter().any(|(scheme, _)| *scheme == Some("http")) {
            return Err(Error::InvalidConfig(
                "etcd endpoints mix http:// and https://: use one for all".into(),
            ));
        }
        let scheme = if https { "https" } else { "http" };
        Ok(Self {
            endpoints: parsed
                .into_iter()
                .map(|(_, hostport)| format!("{scheme}://{hostport}"))
                .collect(),
            prefix: DEFAULT_PREFIX.into(),
            tls: https.then(TlsFiles::default),
            user: None,
        })
    }

    /// Parses `etcd://[user:password@]host1:port1,host2:port2[/prefix]` (port 2379 when
    /// omitted), or `etcds://...[?ca=PATH][&cert=PATH&key=PATH]` for TLS: `ca` is the
    /// certificate authority that signed the servers' certificates (PEM; without it the public
    /// roots of webpki-roots), `cert` and `key` a client certificate and its key for mutual
    /// TLS. The scheme is case-insensitive; the user, password and prefix are percent-decoded.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] saying what is wrong: another scheme, no host, a bad port, a
    /// user without a password, an unknown query option, or TLS files on a plain `etcd://`
    /// URL (write `etcds://`: TLS is never implied).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let parsed = ServiceUrl::parse(url)?;
        let tls = match parsed.scheme() {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(parsed.error("the scheme must be etcd:// or etcds://")),
        };
        let mut options = parsed.options();
        let files = TlsFiles::take(&mut options)?;
        options.finish(TlsFiles::OPTIONS)?;
        if !tls && !files.is_empty() {
            return Err(parsed.error(
                "ca=, cert= and key= are TLS options: use etcds:// (TLS) instead of etcd://",
            ));
        }
        let mut config = Self::new(
            parsed
                .hosts()
                .iter()
                .map(|host| host.with_default_port(DEFAULT_PORT)),
        )?;
        if tls {
            config = config.with_tls(files);
        }
        match (parsed.username(), parsed.password()) {
            (None, None) => {}
            (Some(user), Some(password)) => config = config.with_user(user, password)?,
            (Some(_), None) => {
                return Err(parsed.error("an etcd user needs a password (user:password@host)"));
            }
            (None, Some(_)) => {
                return Err(parsed.error("a password needs a user name (user:password@host)"));
            }
        }
        if !parsed.path().is_empty() {
            config = config.with_prefix(parsed.path())?;
        }
        Ok(config)
    }

    /// Sets the key prefix (leading and trailing `/` are trimmed; empty means the default).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the prefix contains NUL.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, Error> {
        if prefix.contains('\0') {
            return Err(Error::InvalidConfig(
                "the etcd key prefix must not contain NUL".into(),
            ));
        }
        let prefix = prefix.trim_matches('/');
        self.prefix = if prefix.is_empty() {
            DEFAULT_PREFIX.into()
        } else {
            prefix.into()
        };
        Ok(self)
    }

    /// Connects over TLS (the endpoints become `https://`), trusting the CA of `files` (or the
    /// public roots when it names none) and presenting its client certificate, if any.
    ///
    /// ```
    /// use distlock_etcd::EtcdConfig;
    /// use distlock_etcd::distlock_core::tls::TlsFiles;
    ///
    /// let files = TlsFiles::new(Some("/etc/etcd/ca.pem".into()), None, None)?;
    /// let config = EtcdConfig::new(["10.0.0.1:2379"])?.with_tls(files);
    /// assert_eq!(config.endpoints(), ["https://10.0.0.1:2379"]);
    /// # Ok::<(), distlock_etcd::distlock_core::Error>(())
    /// ```
    #[must_use]
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        for endpoint in &mut self.endpoints {
            if let Some(hostport) = endpoint.strip_prefix("http://") {
                *endpoint = format!("https://{hostport}");
            }
        }
        self.tls = Some(files);
        self
    }

    /// Authenticates as `user` with `password` (etcd's auth; the token it hands out is
    /// refreshed when it expires). The password appears in no `Debug` output and no error.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty user name.
    pub fn with_user(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Result<Self, Error> {
        let user = user.into();
        if user.is_empty() {
            return Err(Error::InvalidConfig("the etcd user name is empty".into()));
        }
        self.user = Some(Credentials {
            user,
            password: password.into(),
        });
        Ok(self)
    }

    /// The endpoints, as `http://host:port` or, with TLS, `https://host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix (without a trailing `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the endpoints are reached over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The TLS files (CA, client certificate and key), when TLS is on.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The user name, when etcd authentication is on.
    pub fn username(&self) -> Option<&str> {
        self.user.as_ref().map(|c| c.user.as_str())
    }

    /// The endpoints without their scheme (`host:port,host:port`), for messages.
    pub(crate) fn hosts(&self) -> String {
        self.endpoints
            .iter()
            .map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The etcd client options for this configuration: TLS (the files read now), the user
    /// (with token refresh on expiry), `connect_timeout` for each connection attempt, and
    /// HTTP/2 keep-alive pings. For building an [`etcd_client::Client`] the way this crate
    /// does, e.g. to share it with the application:
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use distlock_etcd::{EtcdBackend, EtcdConfig, etcd_client::Client};
    ///
    /// let config = EtcdConfig::from_url("etcds://app:pw@10.0.0.1:2379?ca=/etc/etcd/ca.pem")?;
    /// let options = config.connect_options(Duration::from_secs(5)).await?;
    /// let client = Client::connect(config.endpoints(), Some(options)).await?;
    /// let backend = EtcdBackend::from_client(client.clone(), &config);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when a TLS file cannot be read or holds no PEM (the path is
    /// named, the contents never).
    pub async fn connect_options(
        &self,
        connect_timeout: Duration,
    ) -> Result<ConnectOptions, Error> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(connect_timeout)
            .with_keep_alive(Duration::from_secs(2), connect_timeout)
            .with_keep_alive_while_idle(true);
        if let Some(files) = &self.tls {
            let material = files.load().await?;
            let mut tls = TlsOptions::new();
            tls = match material.ca_pem {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
                None => tls.with_webpki_roots(),
            };
            if let Some((cert, key)) = material.identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        if let Some(creds) = &self.user {
            options = options
                .with_user(creds.user.clone(), creds.password.clone())
                .with_auto_token_refresh(true);
        }
        Ok(options)
    }
}

/// An endpoint as (its scheme, if written, `host:port`).
fn normalize_endpoint(endpoint: &str) -> Result<(Option<&'static str>, String), Error> {
    let bad = |why: &str| {
        Err(Error::InvalidConfig(format!(
            "etcd endpoint {:?}: {why}",
            distlock_core::service_url::redact(endpoint)
        )))
    };
    let endpoint = endpoint.trim();
    let (scheme, hostport) = if let Some(rest) = endpoint.strip_prefix("http://") {
        (Some("http"), rest)
    } else if let Some(rest) = endpoint.strip_prefix("https://") {
        (Some("https"), rest)
    } else if endpoint.contains("://") {
        return bad("only http:// and https:// endpoints are supported");
    } else {
        (None, endpoint)
    };
    let hostport = hostport.trim_end_matches('/');
    if hostport.is_empty() || hostport.contains('/') {
        return bad("expected host:port");
    }
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        match v6.split_once(']') {
            Some((addr, rest)) => (
                format!("[{addr}]"),
                rest.strip_prefix(':').map(str::to_owned),
            ),
            None => return bad("unterminated IPv6 address"),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port.to_owned())),
            None => (hostport.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return bad("empty host");
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c == ',' || c == '@')
    {
        return bad("invalid character in the host");
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => {
                let p = distlock_core::service_url::echo(&p);
                return bad(&if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                    format!("port {p} is out of range: expected 1 to 65535")
                } else {
                    format!("port {p:?}: expected a number from 1 to 65535")
                });
            }
            Ok(p) => p,
        },
    };
    Ok((scheme, format!("{host}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = EtcdConfig::from_url("etcd://a:1,b").unwrap();
        assert_eq!(c.endpoints(), ["http://a:1", "http://b:2379"]);
        assert_eq!(c.prefix(), DEFAULT_PREFIX);
        assert!(!c.is_tls() && c.username().is_none());
        let c = EtcdConfig::from_url("ETCD://[::1]:5/x/y/").unwrap();
        assert_eq!(c.endpoints(), ["http://[::1]:5"]);
        assert_eq!(c.prefix(), "x/y");
        let c = EtcdConfig::new(["http://127.0.0.1:12379"]).unwrap();
        assert_eq!(c.endpoints(), ["http://127.0.0.1:12379"]);
    }

    #[test]
    fn parses_tls_and_credentials() {
        let c = EtcdConfig::from_url(
            "etcds://u%40x:p%3Aw%40d@a:1,b/pre?ca=%2Fc%20a.pem&cert=/c.pem&key=/c.key",
        )
        .unwrap();
        assert_eq!(c.endpoints(), ["https://a:1", "https://b:2379"]);
        assert_eq!(c.prefix(), "pre");
        assert_eq!(c.username(), Some("u@x"));
        let files = c.tls_files().unwrap();
        assert_eq!(files.ca(), Some(std::path::Path::new("/c a.pem")));
        assert!(files.has_identity());
        assert_eq!(c.user.as_ref().unwrap().password, "p:w@d");
        // etcds:// without files: public roots.
        let c = EtcdConfig::from_url("etcds://h").unwrap();
        assert!(c.tls_files().unwrap().is_empty());
        assert_eq!(c.endpoints(), ["https://h:2379"]);
        // A plain URL with a user: auth without TLS.
        let c = EtcdConfig::from_url("etcd://root:pw@h:1").unwrap();
        assert!(!c.is_tls());
        assert_eq!(c.username(), Some("root"));
        // https:// endpoints are TLS; bare ones follow them.
        let c = EtcdConfig::new(["https://a:1", "b:2"]).unwrap();
        assert_eq!(c.endpoints(), ["https://a:1", "https://b:2"]);
        assert!(c.is_tls());
        let c = EtcdConfig::new(["a:1"])
            .unwrap()
            .with_tls(TlsFiles::default());
        assert_eq!(c.endpoints(), ["https://a:1"]);
    }

    #[test]
    fn never_shows_the_password() {
        let c = EtcdConfig::from_url("etcds://root:hunter2-secret@a:1?ca=/ca.pem").unwrap();
        for shown in [format!("{c:?}"), format!("{c:#?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(
                shown.contains("root") && shown.contains("redacted"),
                "{shown}"
            );
        }
        for url in [
            "etcd://root:hunter2-secret@a:1?ca=/x",
            "etcd://root:hunter2-secret@a:x",
            "redis://root:hunter2-secret@a:1",
            "etcds://root:hunter2-secret@a:1?cert=/x",
            "etcds://:hunter2-secret@a:1",
        ] {
            let err = EtcdConfig::from_url(url).unwrap_err();
            for shown in [format!("{err}"), format!("{err:?}"), format!("{err:#?}")] {
                assert!(!shown.contains("hunter2"), "{shown}");
            }
        }
        let err = EtcdConfig::new(["https://u:hunter2-secret@a:1"]).unwrap_err();
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "redis://a:1",
            "etcd://",
            "etcd:///p",
            "etcd://a:1,,b:2",
            "etcd://a:x",
            "etcd://a:0",
            "etcd://a:70000",
            "etcd://a:1?x=1",
            "etcd://u@a:1",
            "etcd://:pw@a:1",
            "etcd://[::1:5",
            "etcd://a b:1",
            // TLS files need etcds://.
            "etcd://a:1?ca=/ca.pem",
            "etcd://a:1?cert=/c.pem&key=/c.key",
            "etcds://a:1?cert=/c.pem",
            "etcds://a:1?key=/c.key",
            "etcds://a:1?ca=",
            "etcds://a:1?tls=1",
        ] {
            assert!(
                matches!(EtcdConfig::from_url(url), Err(Error::InvalidConfig(_))),
                "{url}"
            );
        }
        for (endpoint, needle) in [
            ("a:70000", "port 70000 is out of range: expected 1 to 65535"),
            ("http://a:0", "port 0 is out of range: expected 1 to 65535"),
            ("a:x", "port \"x\": expected a number from 1 to 65535"),
        ] {
            let err = EtcdConfig::new([endpoint]).unwrap_err().to_string();
            assert!(err.contains(needle), "{endpoint}: {err}");
        }
        let err = EtcdConfig::from_url("etcd://a:70000")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("port 70000 of host a:70000 is out of range: expected 1 to 65535"),
            "{err}"
        );
        assert!(EtcdConfig::new(Vec::<String>::new()).is_err());
        assert!(EtcdConfig::new(["https://a:1", "http://b:1"]).is_err());
        assert!(EtcdConfig::new(["unix://a"]).is_err());
        assert!(
            EtcdConfig::new(["a:1"])
                .unwrap()
                .with_user("", "x")
                .is_err()
        );
    }
}
