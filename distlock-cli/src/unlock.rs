//! `distlock unlock --force`, and `distlock unlock --owner O --token T` for exactly one hold.

use crate::Connection;
use crate::exit::{self, Failure};
use crate::out::{self, printable};

/// Shown by `distlock unlock --help`.
pub(crate) const AFTER_HELP: &str = "\
DANGER: this frees the lock whoever holds it. The holder is NOT stopped: it keeps running,
believing it holds the lock, until its next renewal is refused (`distlock run` then terminates
its command and exits 76). Until then two processes may act as holders at once.

What keeps a protected resource safe is fencing: the next holder gets a higher fencing token
(DISTLOCK_FENCING_TOKEN), so a resource that checks tokens refuses the old holder's late
writes. A resource that does not check tokens is not protected. Use this only for a lock whose
holder is known to be dead or stuck, and pass --force to confirm.

Safer: --owner and --token (as `distlock list` or `distlock status --json` show them) release
only that hold, never a newer one that took the lock meanwhile, nor another reader or permit
holder of the name; no --force needed. The released holder is not stopped either: it learns of
the loss at its next renewal.

Examples:
  distlock list --prefix deploy
  distlock unlock --force --name deploy
  distlock unlock --name deploy --owner 'distlock-run@host#4242:9f3c...' --token 1234";

/// Flags of `distlock unlock`.
#[derive(Debug, clap::Args)]
pub(crate) struct UnlockArgs {
    /// The lock name.
    #[arg(long)]
    name: String,

    /// Confirm: free the lock although another process may still hold it (see below).
    #[arg(long, conflicts_with = "owner")]
    force: bool,

    /// Release only the hold of this owner (with --token), as `list` and `status --json` show it.
    #[arg(long, requires = "token", value_name = "OWNER")]
    owner: Option<String>,

    /// The fencing token of the hold to release (with --owner).
    #[arg(long, requires = "owner", value_name = "TOKEN")]
    token: Option<u64>,

    #[command(flatten)]
    connection: Connection,
}

pub(crate) async fn unlock(args: UnlockArgs) -> Result<u8, Failure> {
    if let (Some(owner), Some(token)) = (&args.owner, args.token) {
        return release_hold(&args, owner, token).await;
    }
    if !args.force {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "refusing to free {:?} without --force: the holder may still be running and \
                 keeps working until it notices the loss at its next renewal; only a resource \
                 that checks fencing tokens is protected from it (see `distlock unlock --help`; \
                 --owner and --token release one known hold and nothing newer)",
                args.name
            ),
        ));
    }
    let removed = match args.connection.connect_existing().await? {
        // No database file: nothing was held there.
        None => false,
        Some(locks) => locks
            .force_release(&args.name)
            .await
            .map_err(|err| Failure::from_lock(&err, format!("cannot unlock {:?}", args.name)))?,
    };
    if removed {
        out::line(format_args!(
            "{}: force-released; its holder learns of it at its next renewal",
            printable(&args.name)
        ))?;
    } else {
        out::line(format_args!("{}: was not held", printable(&args.name)))?;
    }
    Ok(0)
}

/// `--owner O --token T`: releases exactly that hold.
async fn release_hold(args: &UnlockArgs, owner: &str, token: u64) -> Result<u8, Failure> {
    let removed = match args.connection.connect_existing().await? {
        None => false,
        Some(locks) => locks
            .release_hold(&args.name, owner, distlock::FencingToken::new(token))
            .await
            .map_err(|err| Failure::from_lock(&err, format!("cannot unlock {:?}", args.name)))?,
    };
    if removed {
        out::line(format_args!(
            "{}: released the hold of {} (token {token}); its holder learns of it at its next \
             renewal",
            printable(&args.name),
            printable(owner)
        ))?;
    } else {
        out::line(format_args!(
            "{}: no live hold of {} with token {token} (released, expired or replaced): \
             nothing released",
            printable(&args.name),
            printable(owner)
        ))?;
    }
    Ok(0)
}
