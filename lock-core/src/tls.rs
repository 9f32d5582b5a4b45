//! TLS files named in a URL, read once for every backend: `?ca=PATH` (the certificate
//! authority that signed the server's certificate, PEM), `?cert=PATH&key=PATH` (a client
//! certificate and its private key, PEM, for mutual TLS).
//!
//! The backends hand the PEM bytes to their client library (rustls underneath, the one TLS
//! stack of the workspace). Paths appear in messages; file contents never do: the `Debug` of
//! [`TlsMaterial`] shows sizes only.
//!
//! ```
//! use distlock_core::service_url::ServiceUrl;
//! use distlock_core::tls::TlsFiles;
//!
//! let url = ServiceUrl::parse("rediss://h:1?ca=/etc/ca.pem&cert=/etc/me.pem&key=/etc/me.key")?;
//! let mut options = url.options();
//! let files = TlsFiles::take(&mut options)?;
//! assert_eq!(files.ca().unwrap().to_str(), Some("/etc/ca.pem"));
//! assert!(files.has_identity());
//! options.finish(TlsFiles::OPTIONS)?;
//! # Ok::<(), distlock_core::Error>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use crate::Error;
use crate::service_url::{UrlOptions, echo};

/// The paths of a URL's TLS options. Nothing is read until [`TlsFiles::load`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// The PEM contents of [`TlsFiles`], read and checked. `Debug` shows sizes, never contents.
#[derive(Clone, Default)]
pub struct TlsMaterial {
    /// The certificate authority (one or more PEM certificates), if one was given.
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate chain and its private key (PEM), if given.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_pem_bytes", &self.ca_pem.as_ref().map(Vec::len))
            .field(
                "identity",
                &self.identity.as_ref().map(|(cert, _)| {
                    format!("{} bytes of certificate, key <redacted>", cert.len())
                }),
            )
            .finish()
    }
}

impl TlsFiles {
    /// The URL option names this type takes, for [`UrlOptions::finish`].
    pub const OPTIONS: &'static [&'static str] = &["ca", "cert", "key"];

    /// Takes `ca`, `cert` and `key` from `options`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when an option is empty, or `cert` comes without `key` (or the
    /// other way round).
    pub fn take(options: &mut UrlOptions) -> Result<Self, Error> {
        let mut path = |key: &str| -> Result<Option<PathBuf>, Error> {
            match options.take(key) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Err(Error::InvalidConfig(format!(
                    "option {key}= needs a file path"
                ))),
                Some(v) => Ok(Some(PathBuf::from(v))),
            }
        };
        let files = Self {
            ca: path("ca")?,
            cert: path("cert")?,
            key: path("key")?,
        };
        files.check()?;
        Ok(files)
    }

    /// Files from paths given in code; `cert` and `key` go together.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a certificate without its key or a key without its
    /// certificate.
    pub fn new(
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Self, Error> {
        let files = Self { ca, cert, key };
        files.check()?;
        Ok(files)
    }

    fn check(&self) -> Result<(), Error> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(Error::InvalidConfig(
                "a client certificate (cert=) needs its private key (key=)".into(),
            )),
            (None, Some(_)) => Err(Error::InvalidConfig(
                "a private key (key=) needs its client certificate (cert=)".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Whether no TLS file was given.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none()
    }

    /// The certificate authority's path.
    pub fn ca(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// Whether a client certificate and key were given.
    pub fn has_identity(&self) -> bool {
        self.cert.is_some()
    }

    /// The paths of the client certificate and its key, for a client library that reads
    /// them itself.
    pub fn identity_paths(&self) -> Option<(&Path, &Path)> {
        Some((self.cert.as_deref()?, self.key.as_deref()?))
    }

    /// The URL query for these files (`ca=...&cert=...&key=...`, percent-encoded), empty when
    /// there are none; for backends that rebuild a URL.
    pub fn query(&self) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (key, path) in [("ca", &self.ca), ("cert", &self.cert), ("key", &self.key)] {
            if let Some(path) = path {
                query.append_pair(key, &path.to_string_lossy());
            }
        }
        query.finish()
    }

    /// Reads the files (off the async runtime's threads) and checks that each holds PEM.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the path and the reason (missing, unreadable, not PEM);
    /// never the contents.
    pub async fn load(&self) -> Result<TlsMaterial, Error> {
        async fn read(what: &str, path: &Option<PathBuf>) -> Result<Option<Vec<u8>>, Error> {
            let Some(path) = path else { return Ok(None) };
            let shown = echo(&path.to_string_lossy());
            let bytes = tokio::fs::read(path).await.map_err(|err| {
                Error::InvalidConfig(format!(
                    "cannot read the {what} file {shown:?}: {}",
                    crate::io_cause(&err).unwrap_or_else(|| err.to_string())
                ))
            })?;
            if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
                return Err(Error::InvalidConfig(format!(
                    "the {what} file {shown:?} holds no PEM block (-----BEGIN ...)"
                )));
            }
            Ok(Some(bytes))
        }
        let ca_pem = read("certificate authority (ca=)", &self.ca).await?;
        let cert = read("client certificate (cert=)", &self.cert).await?;
        let key = read("private key (key=)", &self.key).await?;
        Ok(TlsMaterial {
            ca_pem,
            identity: cert.zip(key),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service_url::ServiceUrl;

    fn files(url: &str) -> Result<TlsFiles, Error> {
        let url = ServiceUrl::parse(url)?;
        let mut options = url.options();
        let files = TlsFiles::take(&mut options)?;
        options.finish(TlsFiles::OPTIONS)?;
        Ok(files)
    }

    #[test]
    fn takes_paths_and_pairs_cert_with_key() {
        let f = files("x://h?ca=%2Ftmp%2Fa%20b.pem").unwrap();
        assert_eq!(f.ca(), Some(Path::new("/tmp/a b.pem")));
        assert!(!f.has_identity() && !f.is_empty());
        assert_eq!(f.query(), "ca=%2Ftmp%2Fa+b.pem");
        assert!(files("x://h").unwrap().is_empty());
        for bad in [
            "x://h?cert=/a",
            "x://h?key=/a",
            "x://h?ca=",
            "x://h?ca=/a&cert=/b",
        ] {
            assert!(matches!(files(bad), Err(Error::InvalidConfig(_))), "{bad}");
        }
    }

    #[tokio::test]
    async fn load_names_the_file_never_the_contents() {
        let dir = std::env::temp_dir().join(format!("distlock-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = dir.join("a.pem");
        let junk = dir.join("junk");
        std::fs::write(
            &pem,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(&junk, "SECRET-KEY-MATERIAL").unwrap();
        let ok = TlsFiles::new(Some(pem.clone()), Some(pem.clone()), Some(pem.clone())).unwrap();
        let material = ok.load().await.unwrap();
        assert!(material.ca_pem.is_some() && material.identity.is_some());
        assert!(!format!("{material:?}").contains("AAAA"));
        let bad = TlsFiles::new(None, Some(pem.clone()), Some(junk.clone())).unwrap();
        let err = bad.load().await.unwrap_err().to_string();
        assert!(err.contains("junk") && err.contains("no PEM"), "{err}");
        assert!(!err.contains("SECRET"), "{err}");
        let missing = TlsFiles::new(Some(dir.join("nope.pem")), None, None).unwrap();
        let err = missing.load().await.unwrap_err().to_string();
        assert!(
            err.contains("nope.pem") && err.contains("no such file"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
