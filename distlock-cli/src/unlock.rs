//! `distlock unlock --force`.

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

Example:
  distlock list --prefix deploy
  distlock unlock --force --name deploy";

/// Flags of `distlock unlock`.
#[derive(Debug, clap::Args)]
pub(crate) struct UnlockArgs {
    /// The lock name.
    #[arg(long)]
    name: String,

    /// Confirm: free the lock although another process may still hold it (see below).
    #[arg(long)]
    force: bool,

    #[command(flatten)]
    connection: Connection,
}

pub(crate) async fn unlock(args: UnlockArgs) -> Result<u8, Failure> {
    if !args.force {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "refusing to free {:?} without --force: the holder may still be running and \
                 keeps working until it notices the loss at its next renewal; only a resource \
                 that checks fencing tokens is protected from it (see `distlock unlock --help`)",
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
