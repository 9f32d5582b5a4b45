//! Endpoints and key prefix, from a URL or programmatically.

use distlock_core::Error;
use distlock_core::service_url::ServiceUrl;

/// The port of an endpoint given without one.
pub const DEFAULT_PORT: u16 = 2379;

/// The default key prefix under which every lock lives.
pub const DEFAULT_PREFIX: &str = "distlock";

/// Where the etcd cluster is and under which key prefix locks live.
///
/// ```
/// use distlock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::from_url("etcd://127.0.0.1:2379,127.0.0.1:22379/app/locks").unwrap();
/// assert_eq!(config.endpoints(), ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]);
/// assert_eq!(config.prefix(), "app/locks");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    prefix: String,
}

impl EtcdConfig {
    /// A configuration for `endpoints` (`http://host:port` or `host:port`), with the
    /// [`DEFAULT_PREFIX`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty list or a malformed endpoint.
    pub fn new<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Result<Self, Error> {
        let endpoints = endpoints
            .into_iter()
            .map(|e| normalize_endpoint(e.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(Error::InvalidConfig(
                "an etcd configuration needs at least one endpoint".into(),
            ));
        }
        Ok(Self {
            endpoints,
            prefix: DEFAULT_PREFIX.into(),
        })
    }

    /// Parses `etcd://host1:port1,host2:port2[/prefix]` (port 2379 when omitted). The scheme is
    /// case-insensitive and the prefix percent-decoded.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] saying what is wrong: another scheme, no host, a bad port,
    /// credentials or query options (none are defined yet).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let parsed = ServiceUrl::parse(url)?;
        if parsed.scheme() != "etcd" {
            return Err(parsed.error("the scheme must be etcd://"));
        }
        if parsed.username().is_some() || parsed.password().is_some() {
            return Err(parsed.error("credentials are not supported yet"));
        }
        parsed.options().finish(&[])?;
        let mut config = Self::new(
            parsed
                .hosts()
                .iter()
                .map(|host| host.with_default_port(DEFAULT_PORT)),
        )?;
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

    /// The endpoints, as `http://host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix (without a trailing `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

fn normalize_endpoint(endpoint: &str) -> Result<String, Error> {
    let bad = |why: &str| {
        Err(Error::InvalidConfig(format!(
            "etcd endpoint {endpoint:?}: {why}"
        )))
    };
    let endpoint = endpoint.trim();
    let (scheme, hostport) = if let Some(rest) = endpoint.strip_prefix("http://") {
        ("http", rest)
    } else if endpoint.starts_with("https://") {
        return bad("TLS endpoints are not supported by this build");
    } else if endpoint.contains("://") {
        return bad("only http:// endpoints are supported");
    } else {
        ("http", endpoint)
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
            Ok(0) | Err(_) => return bad("the port must be a number in 1..=65535"),
            Ok(p) => p,
        },
    };
    Ok(format!("{scheme}://{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = EtcdConfig::from_url("etcd://a:1,b").unwrap();
        assert_eq!(c.endpoints(), ["http://a:1", "http://b:2379"]);
        assert_eq!(c.prefix(), DEFAULT_PREFIX);
        let c = EtcdConfig::from_url("ETCD://[::1]:5/x/y/").unwrap();
        assert_eq!(c.endpoints(), ["http://[::1]:5"]);
        assert_eq!(c.prefix(), "x/y");
        let c = EtcdConfig::new(["http://127.0.0.1:12379"]).unwrap();
        assert_eq!(c.endpoints(), ["http://127.0.0.1:12379"]);
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
            "etcd://[::1:5",
            "etcd://a b:1",
        ] {
            assert!(
                matches!(EtcdConfig::from_url(url), Err(Error::InvalidConfig(_))),
                "{url}"
            );
        }
        assert!(EtcdConfig::new(Vec::<String>::new()).is_err());
        assert!(EtcdConfig::new(["https://a:1"]).is_err());
    }
}
