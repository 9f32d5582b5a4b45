//! The embedded default lock service: one SQLite file per user on the machine.
//!
//! Without `--url` and `DISTLOCK_URL`, every `distlock` of a user uses the same file, whatever
//! the current directory: `$XDG_STATE_HOME/distlock/locks.db` (by default
//! `~/.local/state/distlock/locks.db`; on macOS `~/Library/Application Support/distlock/`). The
//! directory is created with mode 0700 and the file with mode 0600 by the first command that
//! takes a lock; commands that only read (`status`, `list`, `unlock`) create nothing.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use crate::exit::{CONFIG, Failure};

/// The default database file, if the platform has a per-user state or data directory.
pub(crate) fn default_db_path() -> Option<PathBuf> {
    dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .map(|dir| dir.join("distlock").join("locks.db"))
}

/// The default URL as `--help` shows it (`sqlite://` + the default file).
pub(crate) fn default_url() -> String {
    match default_db_path() {
        Some(path) => format!("sqlite://{}", path.display()),
        None => String::new(),
    }
}

/// Creates the default file's directory (0700) and the file (0600) if they are missing, so
/// that SQLite does not create them with the umask's permissions.
pub(crate) fn prepare_default_db() -> Result<(), Failure> {
    let path = default_db_path().ok_or_else(no_state_dir)?;
    let cannot = |err: std::io::Error| {
        Failure::new(
            CONFIG,
            format!(
                "cannot create the default lock file {}: {err}",
                path.display()
            ),
        )
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(cannot)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(cannot)?;
    Ok(())
}

/// The failure of an empty URL: `--url ""` or `DISTLOCK_URL=` (set, but empty) is an input
/// error naming them; left out without a per-user state directory, [`no_state_dir`].
pub(crate) fn empty_url() -> Failure {
    let default = default_url();
    let env_empty = std::env::var_os("DISTLOCK_URL").is_some_and(|url| url.is_empty());
    if default.is_empty() && !env_empty {
        // Nothing given (or `--url ""`): both ways there is no URL and no default.
        return no_state_dir();
    }
    let given = if env_empty {
        "DISTLOCK_URL is set but empty"
    } else {
        "--url is empty"
    };
    let instead = if default.is_empty() {
        String::new()
    } else {
        format!(", or unset DISTLOCK_URL and leave out --url for the per-user default {default}")
    };
    Failure::new(
        CONFIG,
        format!("{given}: give a lock service URL (e.g. redis://HOST:6379){instead}"),
    )
}

/// No URL given and no per-user state directory for the default.
pub(crate) fn no_state_dir() -> Failure {
    Failure::new(
        CONFIG,
        "no per-user state directory (HOME is not set): pass --url or set DISTLOCK_URL",
    )
}
