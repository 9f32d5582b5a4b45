//! The owner id that `distlock run` acquires with, so that `status` and `list` can show which
//! host and process hold a lock.
//!
//! The library stores the owner value as `<owner id>:<unique suffix>` when an explicit
//! [`OwnerId`](distlock::OwnerId) is given; `distlock run` uses the owner id
//! `distlock-run@<host>#<pid>`. Host names cannot contain `#` or `:`, so the value parses back
//! unambiguously.

use distlock::{LockInfo, LockKind};

use crate::out::printable;

/// The prefix of every owner id that `distlock run` uses.
const PREFIX: &str = "distlock-run@";

/// Who holds a lock taken by `distlock run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunHolder {
    /// The host name of the machine `distlock run` ran on.
    pub(crate) host: String,
    /// The process id of that `distlock run`.
    pub(crate) pid: u32,
}

/// This machine's host name (`unknown-host` when it has none that fits an owner id).
pub(crate) fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty() && !h.contains(['#', ':', '\0']))
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// The owner id for this process: `distlock-run@<host>#<pid>`, cut to the library's limit.
pub(crate) fn run_owner_id() -> String {
    let host = host_name();
    let pid = std::process::id();
    let suffix = format!("#{pid}");
    let room = distlock::OwnerId::MAX_LEN - PREFIX.len() - suffix.len();
    let host: String = host.chars().take(room).collect();
    let host = host.get(..room.min(host.len())).unwrap_or("unknown-host");
    format!("{PREFIX}{host}{suffix}")
}

/// The holder data `distlock run` stores by default: `host=<host> pid=<pid> cmd=<command>`,
/// cut to [`distlock::MAX_HOLDER_DATA`] bytes at a character boundary.
pub(crate) fn run_data(command: &[String]) -> String {
    let mut data = format!(
        "host={} pid={} cmd={}",
        host_name(),
        std::process::id(),
        command.join(" ")
    );
    data.retain(|c| c != '\0');
    let mut end = data.len().min(distlock::MAX_HOLDER_DATA);
    while !data.is_char_boundary(end) {
        end -= 1;
    }
    data.truncate(end);
    data
}

/// Parses the owner value a backend reports back into the `distlock run` holder, if it is one.
pub(crate) fn parse_run_owner(owner: &str) -> Option<RunHolder> {
    let rest = owner.strip_prefix(PREFIX)?;
    let id = rest.split(':').next()?;
    let (host, pid) = id.rsplit_once('#')?;
    Some(RunHolder {
        host: host.to_owned(),
        pid: pid.parse().ok()?,
    })
}

/// Who holds a lock, in words: `held by distlock run on HOST (pid N)` or `held by owner X`;
/// for shared and permit holds the kind and the number of holders, and the latest of them.
/// The owner and host are made printable (another process chose them).
pub(crate) fn describe_holders(info: &LockInfo) -> String {
    let holder = match parse_run_owner(&info.owner) {
        Some(run) => format!("distlock run on {} (pid {})", printable(&run.host), run.pid),
        None => format!("owner {}", printable(&info.owner)),
    };
    let holders = holders_text(info.holders);
    match info.kind {
        LockKind::Permit { permits } => {
            format!("held as a semaphore of {permits} permits by {holders} (the latest: {holder})")
        }
        LockKind::Shared => format!("held shared by {holders} (the latest: {holder})"),
        _ => format!("held by {holder}"),
    }
}

fn holders_text(holders: u32) -> String {
    if holders == 1 {
        "1 holder".to_owned()
    } else {
        format!("{holders} holders")
    }
}

/// The fields of `status --json` and `list --json` that describe the holders.
pub(crate) fn holder_json(info: &LockInfo) -> serde_json::Map<String, serde_json::Value> {
    let holder = parse_run_owner(&info.owner);
    let permits = match info.kind {
        LockKind::Permit { permits } => Some(permits),
        _ => None,
    };
    let value = serde_json::json!({
        "owner": info.owner,
        "host": holder.as_ref().map(|h| h.host.as_str()),
        "pid": holder.as_ref().map(|h| h.pid),
        "token": info.token.map(|t| t.get()),
        "remaining_ms": info.remaining.map(|d| d.as_millis() as u64),
        "kind": info.kind.as_str(),
        "permits": permits,
        "holders": info.holders,
        "data": info.data,
    });
    match value {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_value_parses_back_to_host_and_pid() {
        let id = run_owner_id();
        assert!(id.len() <= distlock::OwnerId::MAX_LEN);
        assert!(distlock::OwnerId::new(id.clone()).is_ok());
        let holder = parse_run_owner(&format!("{id}:0123456789abcdef")).unwrap();
        assert_eq!(holder.pid, std::process::id());
        assert!(!holder.host.is_empty());
        assert_eq!(parse_run_owner("0123456789abcdef"), None);
        assert_eq!(parse_run_owner("distlock-run@host#notapid:x"), None);
    }

    #[test]
    fn run_data_names_host_pid_and_command_within_the_limit() {
        let data = run_data(&["pg_dump".into(), "-f".into(), "x.sql".into()]);
        assert!(
            data.starts_with("host=") && data.ends_with(" cmd=pg_dump -f x.sql"),
            "{data}"
        );
        assert!(data.contains(&format!(" pid={} ", std::process::id())));
        let long = run_data(&["é".repeat(distlock::MAX_HOLDER_DATA)]);
        assert!(long.len() <= distlock::MAX_HOLDER_DATA && long.len() > 400);
    }
}
