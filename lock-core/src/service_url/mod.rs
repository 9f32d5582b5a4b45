//! One URL syntax for every backend: parsing (with the `url` crate), option values (durations
//! in [`humantime`] syntax), and redaction of secrets for messages.
//!
//! Backend URLs look like `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&...]`.
//! The scheme is case-insensitive; user, password, path and option values are percent-decoded;
//! several hosts may be given, separated by commas (Redlock, etcd and ZooKeeper ensembles).
//!
//! ```
//! use std::time::Duration;
//! use distlock_core::service_url::ServiceUrl;
//!
//! let url = ServiceUrl::parse("REDLOCK://:s3cr%40t@a:1,b:2,[::1]:3/2?handoff=150ms")?;
//! assert_eq!(url.scheme(), "redlock");
//! assert_eq!(url.hosts().len(), 3);
//! assert_eq!(url.hosts()[2].host(), "[::1]");
//! assert_eq!(url.password(), Some("s3cr@t"));
//! assert_eq!(url.path(), "2");
//! let mut options = url.options();
//! assert_eq!(options.duration("handoff")?, Some(Duration::from_millis(150)));
//! options.finish(&["handoff"])?;
//! // Secrets never reach a message:
//! assert!(!format!("{url:?}").contains("s3cr"));
//! # Ok::<(), distlock_core::Error>(())
//! ```

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use crate::Error;

/// The longest piece of user input (a URL, a host) echoed in a message; longer input is cut.
pub const MAX_ECHO: usize = 160;

/// A parsed lock service URL. Its `Debug` output hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct ServiceUrl {
    scheme: String,
    username: Option<String>,
    password: Option<String>,
    hosts: Vec<HostPort>,
    path: String,
    options: Vec<(String, String)>,
    redacted: String,
}

/// One `host[:port]` of a URL's host list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    host: String,
    port: Option<u16>,
}

impl HostPort {
    /// The host as written (IPv6 addresses normalized by the `url` crate, in brackets:
    /// `[::1]`).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, if one was given.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// `host:port`, with `default_port` when none was given.
    pub fn with_default_port(&self, default_port: u16) -> String {
        format!("{}:{}", self.host, self.port.unwrap_or(default_port))
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

impl ServiceUrl {
    /// Parses a URL of the form described in the [module docs](self).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming what is wrong, with the URL redacted and cut to
    /// [`MAX_ECHO`] characters.
    pub fn parse(url: &str) -> Result<Self, Error> {
        let url = url.trim();
        let redacted = redact(url);
        let bad = |why: String| Error::InvalidConfig(format!("{why} (in {redacted})"));
        let (scheme, rest) = split_scheme(url)
            .ok_or_else(|| bad("not a URL: expected scheme://host[:port]...".to_owned()))?;
        let scheme = scheme.to_ascii_lowercase();
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        if tail.contains('@') {
            // A password with a raw '/', '?' or '#' in it: the "host" would be part of it.
            return Err(bad(
                "an '@' after the host list: percent-encode '/', '?', '#' and '@' \
                 in user names and passwords (%2F, %3F, %23, %40)"
                    .to_owned(),
            ));
        }
        let (userinfo, host_list) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, pass) = match userinfo.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (userinfo, None),
                };
                let user = decode(user).map_err(|why| bad(format!("the user name {why}")))?;
                let pass = pass
                    .map(decode)
                    .transpose()
                    .map_err(|why| bad(format!("the password {why}")))?;
                ((!user.is_empty()).then_some(user), pass)
            }
        };
        if host_list.is_empty() {
            return Err(bad("no host given".to_owned()));
        }
        let hosts = host_list
            .split(',')
            .map(parse_host)
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        // The path and the query, parsed by the url crate against a placeholder host.
        let tail_url = url::Url::parse(&format!("x://h{tail}"))
            .map_err(|err| bad(format!("invalid path or query: {err}")))?;
        if tail_url.fragment().is_some() {
            return Err(bad("a #fragment is not supported".to_owned()));
        }
        let path = tail_url.path().strip_prefix('/').unwrap_or(tail_url.path());
        let path = decode(path).map_err(|why| bad(format!("the path {why}")))?;
        let options = tail_url
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Ok(Self {
            scheme,
            username,
            password,
            hosts,
            path,
            options,
            redacted,
        })
    }

    /// The scheme, lowercased.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user name, percent-decoded, if one was given.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The password, percent-decoded, if one was given. Never print it.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The hosts, in the order given (at least one).
    pub fn hosts(&self) -> &[HostPort] {
        &self.hosts
    }

    /// The path without its leading `/`, percent-decoded (`""` when absent).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The URL with its password replaced by `***` and cut to [`MAX_ECHO`] characters, for
    /// messages.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The query options, to be taken one by one and checked with [`UrlOptions::finish`].
    pub fn options(&self) -> UrlOptions {
        UrlOptions {
            pairs: self.options.clone(),
            redacted: self.redacted.clone(),
        }
    }

    /// An error about this URL: `why`, followed by the redacted URL.
    pub fn error(&self, why: impl fmt::Display) -> Error {
        Error::InvalidConfig(format!("{why} (in {})", self.redacted))
    }
}

impl fmt::Debug for ServiceUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ServiceUrl").field(&self.redacted).finish()
    }
}

/// The query options of a URL, consumed by key. Values are percent-decoded.
#[derive(Debug, Clone)]
pub struct UrlOptions {
    pairs: Vec<(String, String)>,
    redacted: String,
}

impl UrlOptions {
    /// Options parsed from a query string (`a=1&b=2`), for URLs that are not host-based
    /// (`sqlite://PATH?...`). `context` names the URL in messages (it is redacted here).
    pub fn from_query(query: &str, context: &str) -> Self {
        Self {
            pairs: url::form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
            redacted: redact(context),
        }
    }

    /// Removes and returns the last value of `key` (keys are case-sensitive).
    pub fn take(&mut self, key: &str) -> Option<String> {
        let mut found = None;
        self.pairs.retain(|(k, v)| {
            if k == key {
                found = Some(v.clone());
                false
            } else {
                true
            }
        });
        found
    }

    /// Takes `key` as a duration in [`humantime`] syntax (`500ms`, `5s`, `2m`, `1h 30m`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a value that is not a duration (a bare number has no unit
    /// and is refused) or is zero.
    pub fn duration(&mut self, key: &str) -> Result<Option<Duration>, Error> {
        self.take(key)
            .map(|value| parse_duration(key, &value).map_err(|why| self.error(why)))
            .transpose()
    }

    /// Takes `key` as a duration in [`humantime`] syntax within `range`: a value outside it
    /// is refused before it can size a timer or a wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock_core::service_url::ServiceUrl;
    ///
    /// let range = Duration::from_millis(1)..=Duration::from_secs(3600);
    /// let mut options = ServiceUrl::parse("x://h?t=2s&u=9000h")?.options();
    /// assert_eq!(options.duration_in("t", range.clone())?, Some(Duration::from_secs(2)));
    /// let err = options.duration_in("u", range).unwrap_err().to_string();
    /// assert!(err.contains("option u=9000h is out of range: expected 1ms to 1h"), "{err}");
    /// # Ok::<(), distlock_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] as [`Self::duration`], and for a duration outside `range`
    /// (naming the option, the value given and the range).
    pub fn duration_in(
        &mut self,
        key: &str,
        range: RangeInclusive<Duration>,
    ) -> Result<Option<Duration>, Error> {
        self.take(key)
            .map(|value| {
                parse_duration(key, &value)
                    .and_then(|d| check_duration(key, &value, d, &range))
                    .map_err(|why| self.error(why))
            })
            .transpose()
    }

    /// Takes `key` as an integer within `range`: a value outside it (also one too large for
    /// `T`) is refused before it can size a pool or a buffer.
    ///
    /// ```
    /// use distlock_core::service_url::ServiceUrl;
    ///
    /// let mut options = ServiceUrl::parse("x://h?a=4&b=100000000&c=x")?.options();
    /// assert_eq!(options.integer::<u32>("a", 1..=1000)?, Some(4));
    /// let err = options.integer::<u32>("b", 1..=1000).unwrap_err().to_string();
    /// assert!(err.contains("option b=100000000 is out of range: expected 1 to 1000"), "{err}");
    /// let err = options.integer::<u32>("c", 1..=1000).unwrap_err().to_string();
    /// assert!(err.contains("option c=\"x\": expected an integer from 1 to 1000"), "{err}");
    /// # Ok::<(), distlock_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a value that is not an integer or lies outside `range`,
    /// naming the option, the value given and the range.
    pub fn integer<T>(&mut self, key: &str, range: RangeInclusive<T>) -> Result<Option<T>, Error>
    where
        T: Copy + fmt::Display + TryFrom<i128> + Into<i128>,
    {
        self.take(key)
            .map(|value| parse_integer(key, &value, &range).map_err(|why| self.error(why)))
            .transpose()
    }

    /// Takes `key` as a boolean: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`; a key with
    /// no value (`?fair`) is `true`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another value.
    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, Error> {
        self.take(key)
            .map(|value| match value.to_ascii_lowercase().as_str() {
                "" | "true" | "1" | "yes" | "on" => Ok(true),
                "false" | "0" | "no" | "off" => Ok(false),
                _ => Err(self.error(format!(
                    "option {key}={:?}: expected true or false",
                    echo(&value)
                ))),
            })
            .transpose()
    }

    /// Takes `key` and parses it with [`FromStr`](std::str::FromStr); `expected` says what a
    /// valid value looks like.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when it does not parse.
    pub fn parse<T: std::str::FromStr>(
        &mut self,
        key: &str,
        expected: &str,
    ) -> Result<Option<T>, Error> {
        self.take(key)
            .map(|value| {
                value.parse().map_err(|_| {
                    self.error(format!(
                        "option {key}={:?}: expected {expected}",
                        echo(&value)
                    ))
                })
            })
            .transpose()
    }

    /// The options not taken yet, in order.
    pub fn remaining(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// Checks that every option was taken.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first unknown option and the `known` ones.
    pub fn finish(self, known: &[&str]) -> Result<(), Error> {
        match self.pairs.first() {
            None => Ok(()),
            Some((key, _)) => Err(self.error(format!(
                "unknown option {:?} (known: {})",
                echo(key),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))),
        }
    }

    fn error(&self, why: impl fmt::Display) -> Error {
        Error::InvalidConfig(format!("{why} (in {})", self.redacted))
    }
}

/// Parses a duration option in [`humantime`] syntax (`500ms`, `5s`, `2m`, `1h 30m`).
///
/// # Errors
/// A message naming `key` for a value without a unit, a malformed value or zero.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration, String> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "option {key}={value}: a duration needs a unit, e.g. {value}ms or {value}s"
        ));
    }
    match humantime::parse_duration(value) {
        Ok(d) if d.is_zero() => Err(format!(
            "option {key}: the duration must be greater than zero"
        )),
        Ok(d) => Ok(d),
        Err(err) => Err(format!(
            "option {key}={:?}: expected a duration such as 500ms, 5s or 2m ({err})",
            echo(value)
        )),
    }
}

/// Parses `value` of option `key` as an integer within `range`.
///
/// # Errors
/// A message naming `key`, the value given and the range, for a value that is not an integer
/// or lies outside `range` (also one too large for `T` or any integer type).
pub fn parse_integer<T>(key: &str, value: &str, range: &RangeInclusive<T>) -> Result<T, String>
where
    T: Copy + fmt::Display + TryFrom<i128> + Into<i128>,
{
    let text = value.trim();
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    let out_of_range = || {
        format!(
            "option {key}={} is out of range: expected {} to {}",
            echo(text),
            range.start(),
            range.end()
        )
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "option {key}={:?}: expected an integer from {} to {}",
            echo(value),
            range.start(),
            range.end()
        ));
    }
    // All digits: a value that does not fit even an i128 is out of any range.
    let wide: i128 = text.parse().map_err(|_| out_of_range())?;
    if wide < (*range.start()).into() || wide > (*range.end()).into() {
        return Err(out_of_range());
    }
    T::try_from(wide).map_err(|_| out_of_range())
}

/// Checks that `value` of option `key` (set through a builder method rather than a URL) lies
/// within `range`, with the message of [`parse_integer`].
///
/// # Errors
/// A message naming `key`, the value and the range.
pub fn check_integer<T>(key: &str, value: T, range: &RangeInclusive<T>) -> Result<T, String>
where
    T: Copy + fmt::Display + PartialOrd,
{
    if range.contains(&value) {
        return Ok(value);
    }
    Err(format!(
        "option {key}={value} is out of range: expected {} to {}",
        range.start(),
        range.end()
    ))
}

/// Checks that `value` (of option `key`, given as `given`) lies within `range`.
///
/// # Errors
/// A message naming `key`, the value given and the range (in [`humantime`] syntax).
pub fn check_duration(
    key: &str,
    given: &str,
    value: Duration,
    range: &RangeInclusive<Duration>,
) -> Result<Duration, String> {
    if range.contains(&value) {
        return Ok(value);
    }
    Err(format!(
        "option {key}={} is out of range: expected {} to {}",
        echo(given.trim()),
        humantime::format_duration(*range.start()),
        humantime::format_duration(*range.end())
    ))
}

/// `url` with any password (in the user info or in a query option such as `password=`) replaced
/// by `***`, cut to [`MAX_ECHO`] characters. Works on malformed URLs too. In the NATS schemes
/// (`nats`, `tls`, `nats+tls`), a user info without a password is a token, replaced whole.
///
/// ```
/// use distlock_core::service_url::redact;
///
/// assert_eq!(redact("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact("redis://h?password=s3cret&db=1"), "redis://h?password=***&db=1");
/// assert_eq!(redact("redis://h:1"), "redis://h:1");
/// assert_eq!(redact("nats://t0ken@h:4222"), "nats://***@h:4222");
/// assert_eq!(redact("postgres://app@db/x"), "postgres://app@db/x");
/// ```
pub fn redact(url: &str) -> String {
    let mut out = String::with_capacity(url.len().min(MAX_ECHO + 16));
    // Everything between the scheme and the last '@' is user info, even when the URL is
    // malformed (a stray "://" or '/' must not let a password through): keep the user name
    // only. Over-redacting a malformed URL is fine; showing a password is not.
    let last_at = url.rfind('@');
    let start = url
        .find("://")
        .map(|at| at + 3)
        .filter(|&start| last_at.is_none_or(|at| start <= at))
        .unwrap_or(0);
    let at = last_at;
    let question = url[start..].find('?').map(|q| start + q);
    let rest = match (at, question) {
        // An '@' after a '?': a password with a '?' in it, or an '@' in the query. Either way
        // no part of it can be told safe.
        (Some(at), Some(q)) if q < at => {
            out.push_str(&url[..start]);
            out.push_str("***");
            return echo(&out);
        }
        (Some(at), _) => {
            let userinfo = &url[start..at];
            out.push_str(&url[..start]);
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                // NATS writes a token as a user without a password.
                None if is_token_scheme(&url[..start]) => out.push_str("***"),
                None => out.push_str(userinfo),
            }
            &url[at..]
        }
        (None, _) => url,
    };
    let (head, query) = match rest.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (rest, None),
    };
    out.push_str(head);
    if let Some(query) = query {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            // The value after the first '=' whose key names a secret (in `=password=x`, the
            // key a parser sees is empty, but the secret is still x).
            let secret = pair
                .match_indices('=')
                .map(|(at, _)| at)
                .find(|&at| is_secret_key(&pair[..at]));
            match secret {
                Some(at) => {
                    out.push_str(&pair[..at]);
                    out.push_str("=***");
                }
                None => out.push_str(pair),
            }
        }
    }
    echo(&out)
}

/// `text` cut to [`MAX_ECHO`] characters (with a note of the full length), for messages that
/// echo user input.
pub fn echo(text: &str) -> String {
    if text.chars().count() <= MAX_ECHO {
        return text.to_owned();
    }
    let cut: String = text.chars().take(MAX_ECHO).collect();
    format!("{cut}... ({} bytes in all)", text.len())
}

/// Schemes (given with their `://`) whose user info without a password is a token.
fn is_token_scheme(scheme: &str) -> bool {
    let scheme = scheme.strip_suffix("://").unwrap_or(scheme);
    ["nats", "tls", "nats+tls"]
        .iter()
        .any(|t| scheme.eq_ignore_ascii_case(t))
}

fn is_secret_key(key: &str) -> bool {
    // Letters only, so that a mangled key (`pa%73s`, `pass-word`) is still recognized.
    let key: String = key
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    [
        "pass",
        "pwd",
        "secret",
        "token",
        "auth",
        "credential",
        "key",
    ]
    .iter()
    .any(|s| key.contains(s))
}

fn split_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some((scheme, rest))
}

fn decode(text: &str) -> Result<String, &'static str> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "is not valid UTF-8 after percent-decoding")
}

fn parse_host(host: &str) -> Result<HostPort, String> {
    let host = host.trim();
    if host.is_empty() {
        return Err("empty host in the host list".to_owned());
    }
    if host.len() > 255 {
        return Err(format!("host {} is too long", echo(host)));
    }
    // The port, if any: after the last ':' outside an IPv6 address's brackets.
    let port_text = match host.rfind(']') {
        Some(end) => host[end..].split_once(':').map(|(_, port)| port),
        None => host.rsplit_once(':').map(|(_, port)| port),
    };
    if let Some(port) = port_text.filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(format!(
            "port {} of host {} is out of range: expected 1 to 65535",
            echo(port),
            echo(host)
        ));
    }
    let parsed = url::Url::parse(&format!("x://{host}/"))
        .map_err(|err| format!("invalid host {}: {err}", echo(host)))?;
    let name = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("missing host name in {}", echo(host)))?;
    let port = parsed.port();
    Ok(HostPort {
        host: name.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests;
