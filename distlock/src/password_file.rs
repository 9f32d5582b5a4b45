//! The `password_file=PATH` URL option of every backend with a password: the password is read
//! from a file once, at connect, so that it never appears in a process's arguments or
//! environment. The file's content (one trailing newline removed) becomes the URL's password;
//! it is never echoed.

use std::borrow::Cow;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use crate::{Descriptor, Error, Result, service_url};

/// The option's name.
pub(crate) const OPTION: &str = "password_file";

/// The longest password file read (a password, not a document).
const MAX_LEN: u64 = 4096;

/// What may stay unencoded in a URL's userinfo.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `url` with the option `password_file=<path>` added (the path percent-encoded).
pub(crate) fn add_option(url: &str, path: &std::path::Path) -> String {
    let path = path.to_string_lossy();
    let encoded = utf8_percent_encode(&path, USERINFO);
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{OPTION}={encoded}")
}

/// `url` with the password of its `password_file` option in place of the option, or `None`
/// when it has no such option.
///
/// # Errors
/// [`Error::InvalidConfig`] when the file cannot be read, is empty or too long, the URL has a
/// password already, or the backend takes no password.
pub(crate) async fn resolve(url: &str, backend: &Descriptor) -> Result<Option<String>> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(None);
    };
    let mut path = None;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == OPTION {
            let decoded = percent_decode_str(value).decode_utf8_lossy();
            if path.replace(decoded).is_some() {
                return Err(invalid(url, "password_file is given twice"));
            }
        } else {
            rest.push(pair);
        }
    }
    let Some(path) = path else {
        return Ok(None);
    };
    if !backend.takes_password() {
        return Err(invalid(
            url,
            &format!("the {} backend takes no password", backend.name()),
        ));
    }
    if path.is_empty() {
        return Err(invalid(url, "password_file needs a path"));
    }
    let password = read(&path).await.map_err(|why| invalid(url, &why))?;
    let (scheme_part, after) = base
        .split_once("://")
        .ok_or_else(|| invalid(url, "password_file needs a URL with a host"))?;
    let authority_end = after.find('/').unwrap_or(after.len());
    let (authority, tail) = after.split_at(authority_end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => {
            return Err(invalid(
                url,
                "the URL has a password already: give it there or in password_file, not both",
            ));
        }
        Some((user, hosts)) => (user, hosts),
        None => ("", authority),
    };
    let encoded: Cow<'_, str> = utf8_percent_encode(&password, USERINFO).into();
    let mut resolved = format!("{scheme_part}://{user}:{encoded}@{hosts}{tail}");
    if !rest.is_empty() {
        resolved.push('?');
        resolved.push_str(&rest.join("&"));
    }
    Ok(Some(resolved))
}

/// The password in the file at `path`: its content without one trailing newline.
async fn read(path: &str) -> std::result::Result<String, String> {
    let cannot = |err: std::io::Error| format!("cannot read password_file {path:?}: {err}");
    let meta = tokio::fs::metadata(path).await.map_err(cannot)?;
    if !meta.is_file() {
        return Err(format!("password_file {path:?} is not a file"));
    }
    if meta.len() > MAX_LEN {
        return Err(format!(
            "password_file {path:?} has {} bytes; a password file holds at most {MAX_LEN}",
            meta.len()
        ));
    }
    let content = tokio::fs::read(path).await.map_err(cannot)?;
    let mut content = String::from_utf8(content)
        .map_err(|_| format!("password_file {path:?} is not UTF-8 text"))?;
    if content.ends_with('\n') {
        content.pop();
        if content.ends_with('\r') {
            content.pop();
        }
    }
    if content.is_empty() {
        return Err(format!("password_file {path:?} is empty"));
    }
    Ok(content)
}

fn invalid(url: &str, why: &str) -> Error {
    Error::InvalidConfig(format!("{why} (in {})", service_url::redact(url)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that takes passwords, for URLs of any scheme (never connected).
    const NETWORK: Descriptor = Descriptor::new("network", &[], "", |_, _| {
        Box::pin(async { Err(Error::Unsupported("never connected".into())) })
    });

    fn file(content: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), content).unwrap();
        file
    }

    fn option(file: &tempfile::NamedTempFile) -> String {
        format!("password_file={}", file.path().display())
    }

    #[tokio::test]
    async fn the_password_replaces_the_option() {
        let secret = file("s3cr@t:/x\n");
        let opt = option(&secret);
        let cases = [
            (
                format!("redis://app@h:6379/2?{opt}&timeout=1s"),
                "redis://app:s3cr%40t%3A%2Fx@h:6379/2?timeout=1s",
            ),
            (
                format!("redlock://a:1,b:2?{opt}"),
                "redlock://:s3cr%40t%3A%2Fx@a:1,b:2",
            ),
            (
                format!("postgres://u@db/x?sslmode=require&{opt}"),
                "postgres://u:s3cr%40t%3A%2Fx@db/x?sslmode=require",
            ),
        ];
        for (url, want) in cases {
            let got = resolve(&url, &NETWORK).await.unwrap();
            assert_eq!(got.as_deref(), Some(want));
        }
        assert_eq!(resolve("redis://h?db=1", &NETWORK).await.unwrap(), None);
        // As the CLI adds it (DISTLOCK_PASSWORD_FILE): a path with '&' and spaces survives.
        let odd = tempfile::Builder::new().prefix("a&b c").tempfile().unwrap();
        std::fs::write(odd.path(), "pw").unwrap();
        let url = add_option("redis://u@h?db=1", odd.path());
        let got = resolve(&url, &NETWORK).await.unwrap();
        assert_eq!(got.as_deref(), Some("redis://u:pw@h?db=1"));
    }

    #[tokio::test]
    async fn bad_files_and_urls_are_named_without_the_secret() {
        let secret = file("hunter2\n");
        let opt = option(&secret);
        let empty = file("\n");
        let cases = [
            (format!("redis://u:pw@h?{opt}"), "has a password already"),
            (format!("memory://x?{opt}"), "takes no password"),
            (format!("redis://h?{opt}&{opt}"), "given twice"),
            ("redis://h?password_file=".to_owned(), "needs a path"),
            (
                "redis://h?password_file=/nonexistent/pw".to_owned(),
                "cannot read password_file \"/nonexistent/pw\"",
            ),
            (format!("redis://h?{}", option(&empty)), "is empty"),
            ("redis://h?password_file=/".to_owned(), "is not a file"),
        ];
        for (url, want) in cases {
            let backend = if url.starts_with("memory:") {
                &crate::memory::DESCRIPTOR
            } else {
                &NETWORK
            };
            let err = resolve(&url, backend).await.unwrap_err().to_string();
            assert!(err.contains(want), "{url}: {err}");
            assert!(!err.contains("hunter2") && !err.contains(":pw@"), "{err}");
        }
    }
}
