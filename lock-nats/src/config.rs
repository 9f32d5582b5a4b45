//! Servers, bucket, replicas, TLS and credentials, from a URL or programmatically.

use std::fmt;
use std::path::PathBuf;

use distlock_core::Error;
use distlock_core::service_url::{ServiceUrl, echo};
use distlock_core::tls::TlsFiles;

/// The port of a server given without one.
pub const DEFAULT_PORT: u16 = 4222;

/// The default bucket, where every lock lives.
pub const DEFAULT_BUCKET: &str = "distlock";

/// The most replicas a bucket may have (JetStream's limit).
pub const MAX_REPLICAS: u8 = 5;

/// Where the NATS servers are, how to reach them (TLS, credentials), and the JetStream
/// key-value bucket the locks live in.
///
/// ```
/// use distlock_nats::NatsConfig;
///
/// let config = NatsConfig::from_url("nats://10.0.0.1:4222,10.0.0.2/app_locks?replicas=3").unwrap();
/// assert_eq!(config.servers(), ["10.0.0.1:4222", "10.0.0.2:4222"]);
/// assert_eq!(config.bucket(), "app_locks");
/// assert_eq!(config.replicas(), 3);
///
/// // Mutual TLS and a user: the password never shows in Debug or in any error.
/// let config = NatsConfig::from_url(
///     "tls://app:s3cret@10.0.0.1:4222?ca=/etc/nats/ca.pem&cert=/etc/app.pem&key=/etc/app.key",
/// ).unwrap();
/// assert!(config.is_tls());
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct NatsConfig {
    servers: Vec<String>,
    bucket: String,
    replicas: u8,
    /// `Some` for TLS (the files may all be absent: the system's roots).
    tls: Option<TlsFiles>,
    auth: Auth,
}

/// How the client authenticates. `Debug` hides every secret.
#[derive(Clone, PartialEq, Eq, Default)]
enum Auth {
    #[default]
    None,
    User {
        user: String,
        password: String,
    },
    Token(String),
    /// A file holding an NKey seed (`SU...`).
    NKeyFile(PathBuf),
    /// A `.creds` file (a user JWT and its NKey seed).
    CredsFile(PathBuf),
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::User { user, .. } => write!(f, "User({user:?}, password <redacted>)"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::NKeyFile(path) => write!(f, "NKeyFile({path:?})"),
            Self::CredsFile(path) => write!(f, "CredsFile({path:?})"),
        }
    }
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("servers", &self.servers)
            .field("bucket", &self.bucket)
            .field("replicas", &self.replicas)
            .field("tls", &self.tls)
            .field("auth", &self.auth)
            .finish()
    }
}

impl NatsConfig {
    /// A configuration for `servers` (`host:port`, or `host` for port 4222), the
    /// [`DEFAULT_BUCKET`] with one replica, no TLS and no credentials.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty list or an empty server.
    pub fn new<S: AsRef<str>>(servers: impl IntoIterator<Item = S>) -> Result<Self, Error> {
        let servers: Vec<String> = servers
            .into_iter()
            .map(|s| {
                let s = s.as_ref().trim();
                if s.is_empty() {
                    Err(Error::InvalidConfig(
                        "a NATS server address is empty".into(),
                    ))
                } else if s
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                {
                    Ok(s.to_owned())
                } else {
                    Ok(format!("{s}:{DEFAULT_PORT}"))
                }
            })
            .collect::<Result<_, _>>()?;
        if servers.is_empty() {
            return Err(Error::InvalidConfig(
                "a NATS configuration needs at least one server".into(),
            ));
        }
        Ok(Self {
            servers,
            bucket: DEFAULT_BUCKET.into(),
            replicas: 1,
            tls: None,
            auth: Auth::None,
        })
    }

    /// Parses `nats://[user:password@]host1:port1,host2:port2[/bucket][?replicas=N]` (port 4222
    /// when omitted), `tls://` or `nats+tls://` for TLS (`?ca=PATH` the certificate authority
    /// of the servers' certificates, `cert=PATH&key=PATH` a client certificate for mutual
    /// TLS). A user without a password is a token (`nats://TOKEN@host`, as NATS writes it);
    /// `?nkey=PATH` names a file holding an NKey seed, `?creds=PATH` a credentials file. The
    /// bucket (default [`DEFAULT_BUCKET`]) is made of `A-Z a-z 0-9 _ -`; `replicas` (1 to 5,
    /// default 1) is used when the bucket is created.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] saying what is wrong: another scheme, no host, a bad port or
    /// bucket, replicas out of range, more than one way to authenticate, an unknown option,
    /// or TLS files on a plain `nats://` URL (TLS is never implied).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let parsed = ServiceUrl::parse(url)?;
        let tls = match parsed.scheme() {
            "nats" => false,
            "tls" | "nats+tls" => true,
            _ => return Err(parsed.error("the scheme must be nats://, tls:// or nats+tls://")),
        };
        let mut options = parsed.options();
        let files = TlsFiles::take(&mut options)?;
        let replicas = options.integer("replicas", 1..=MAX_REPLICAS)?;
        let nkey = options.take("nkey");
        let creds = options.take("creds");
        let mut known = TlsFiles::OPTIONS.to_vec();
        known.extend(["replicas", "nkey", "creds"]);
        options.finish(&known)?;
        if !tls && !files.is_empty() {
            return Err(parsed.error(
                "ca=, cert= and key= are TLS options: use tls:// (TLS) instead of nats://",
            ));
        }
        let mut config = Self::new(
            parsed
                .hosts()
                .iter()
                .map(|host| host.with_default_port(DEFAULT_PORT)),
        )?;
        if !parsed.path().is_empty() {
            config = config.with_bucket(parsed.path())?;
        }
        config.replicas = replicas.unwrap_or(1);
        if tls {
            config.tls = Some(files);
        }
        let auth = match (parsed.username(), parsed.password(), nkey, creds) {
            (None, None, None, None) => Auth::None,
            (Some(user), Some(password), None, None) => Auth::User {
                user: user.to_owned(),
                password: password.to_owned(),
            },
            (Some(token), None, None, None) => Auth::Token(token.to_owned()),
            (None, None, Some(path), None) => Auth::NKeyFile(PathBuf::from(path)),
            (None, None, None, Some(path)) => Auth::CredsFile(PathBuf::from(path)),
            _ => {
                return Err(parsed.error(
                    "give one way to authenticate: user:password@, TOKEN@, nkey= or creds=",
                ));
            }
        };
        config.auth = auth;
        Ok(config)
    }

    /// Keeps the locks in `bucket` (made of `A-Z a-z 0-9 _ -`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty bucket or one with other characters.
    pub fn with_bucket(mut self, bucket: &str) -> Result<Self, Error> {
        let ok = !bucket.is_empty()
            && bucket.len() <= 128
            && bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return Err(Error::InvalidConfig(format!(
                "NATS bucket {:?}: use 1 to 128 of A-Z a-z 0-9 _ -",
                echo(bucket)
            )));
        }
        bucket.clone_into(&mut self.bucket);
        Ok(self)
    }

    /// Creates the bucket with `replicas` replicas (1 to 5) when it does not exist yet.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a number out of range.
    pub fn with_replicas(mut self, replicas: u8) -> Result<Self, Error> {
        if !(1..=MAX_REPLICAS).contains(&replicas) {
            return Err(Error::InvalidConfig(format!(
                "NATS replicas {replicas}: use 1 to {MAX_REPLICAS}"
            )));
        }
        self.replicas = replicas;
        Ok(self)
    }

    /// Connects over TLS, verified against `files`' CA (the system's roots without one),
    /// with its client certificate for mutual TLS.
    #[must_use]
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Authenticates as `user` with `password`.
    #[must_use]
    pub fn with_user(mut self, user: &str, password: &str) -> Self {
        self.auth = Auth::User {
            user: user.to_owned(),
            password: password.to_owned(),
        };
        self
    }

    /// The servers, `host:port`.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The replicas of a bucket this client creates.
    pub fn replicas(&self) -> u8 {
        self.replicas
    }

    /// Whether the connection uses TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The servers for messages: `host:port,host:port`.
    pub(crate) fn hosts(&self) -> String {
        self.servers.join(",")
    }

    /// The client's connect options (credentials files are read here).
    pub(crate) async fn connect_options(
        &self,
        timeout: std::time::Duration,
    ) -> Result<async_nats::ConnectOptions, Error> {
        let mut options = async_nats::ConnectOptions::new()
            .name("distlock")
            .connection_timeout(timeout)
            .request_timeout(Some(timeout))
            // Reconnect for ever: the lock client's deadlines decide when to give up.
            .max_reconnects(None)
            // The URL's servers only, not the ones a cluster announces: the same list the
            // application gave (and that a proxy in front of the servers stands for).
            .ignore_discovered_servers();
        if let Some(files) = &self.tls {
            // async-nats builds its rustls configuration with the process's default crypto
            // provider, which rustls cannot pick when the build has both ring and aws-lc-rs
            // (cargo unifies features: zookeeper-client brings aws-lc-rs): then it panics.
            // Ring, as the rest of the workspace; Err means one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
            options = options.require_tls(true);
            if let Some(ca) = files.ca() {
                options = options.add_root_certificates(ca.to_path_buf());
            }
            if let Some((cert, key)) = files.identity_paths() {
                options = options.add_client_certificate(cert.to_path_buf(), key.to_path_buf());
            }
        }
        options = match &self.auth {
            Auth::None => options,
            Auth::User { user, password } => {
                options.user_and_password(user.clone(), password.clone())
            }
            Auth::Token(token) => options.token(token.clone()),
            Auth::NKeyFile(path) => {
                let seed = tokio::fs::read_to_string(path).await.map_err(|err| {
                    Error::InvalidConfig(format!("nkey= file {}: {err}", path.display()))
                })?;
                let seed = seed.trim();
                // Checked here: async-nats would dial and fail with "failed signing nonce".
                // The message names the file and the reason, never the content.
                nkeys::KeyPair::from_seed(seed).map_err(|err| {
                    Error::InvalidConfig(format!(
                        "nkey= file {} does not hold an NKey seed (SU...): {err}",
                        path.display()
                    ))
                })?;
                options.nkey(seed.to_owned())
            }
            Auth::CredsFile(path) => options.credentials_file(path).await.map_err(|err| {
                Error::InvalidConfig(format!("creds= file {}: {err}", path.display()))
            })?,
        };
        Ok(options)
    }

    /// The URLs the client dials.
    pub(crate) fn server_urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "tls" } else { "nats" };
        self.servers
            .iter()
            .map(|s| format!("{scheme}://{s}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = NatsConfig::from_url("nats://a,b:5/bk?replicas=3").unwrap();
        assert_eq!(c.servers(), ["a:4222", "b:5"]);
        assert_eq!((c.bucket(), c.replicas(), c.is_tls()), ("bk", 3, false));
        let c = NatsConfig::from_url("NATS+TLS://tok@h").unwrap();
        assert!(c.is_tls());
        assert_eq!(c.auth, Auth::Token("tok".into()));
        assert!(!format!("{c:?}").contains("tok\""));
        let c = NatsConfig::from_url("tls://h?nkey=/k.seed").unwrap();
        assert_eq!(c.auth, Auth::NKeyFile("/k.seed".into()));
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, why) in [
            ("redis://h", "scheme"),
            ("nats://h?ca=/x", "TLS options"),
            ("nats://h?replicas=9", "replicas"),
            ("nats://h/a.b", "bucket"),
            ("nats://u:p@h?creds=/c", "one way"),
            ("nats://h?nope=1", "nope"),
        ] {
            let err = NatsConfig::from_url(url).unwrap_err().to_string();
            assert!(err.contains(why), "{url}: {err}");
        }
        let err = NatsConfig::from_url("nats://u:s3cret@h?x=1")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }
}
