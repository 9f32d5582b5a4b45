//! `distlock leader`: who leads an election, once or as it changes.

use std::time::Duration;

use distlock::Leader;
use futures::StreamExt;

use crate::Connection;
use crate::exit::{Failure, NO_LEADER};
use crate::out::{self, printable};
use crate::run::Signals;

/// Flags of `distlock leader`.
#[derive(Debug, clap::Args)]
pub(crate) struct LeaderArgs {
    /// The election's name.
    #[arg(long)]
    name: String,

    #[command(flatten)]
    connection: Connection,

    /// Print the leader, then every change (a new leader or term, or none) until interrupted
    /// (Ctrl-C or SIGTERM: exit 0).
    #[arg(long)]
    watch: bool,

    /// With --watch: read the leader at least this often (backends that signal changes are
    /// read again at once).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s", requires = "watch")]
    interval: Duration,

    /// Print JSON instead of text (with --watch: one object per line).
    #[arg(long)]
    json: bool,
}

pub(crate) async fn leader(args: LeaderArgs) -> Result<u8, Failure> {
    if args.watch {
        return watch(&args).await;
    }
    let leader = match args.connection.connect_existing().await? {
        // No database file: nobody can lead there.
        None => None,
        Some(locks) => locks
            .leader(&args.name)
            .await
            .map_err(|err| cannot_read(&args, &err))?,
    };
    print(&args, leader.as_ref())?;
    Ok(if leader.is_some() { 0 } else { NO_LEADER })
}

/// `--watch`: every change until the stream ends or a signal arrives.
async fn watch(args: &LeaderArgs) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    // Like `run`, this creates the default SQLite file: a leader is awaited there.
    let locks = args.connection.connect().await?;
    let mut changes = locks.observe(&args.name, args.interval);
    loop {
        tokio::select! {
            next = changes.next() => match next {
                Some(Ok(leader)) => print(args, leader.as_ref())?,
                // The observation goes on after errors the backend may recover from.
                Some(Err(err)) if err.is_retryable() => cannot_read(args, &err).report(false),
                Some(Err(err)) => return Err(cannot_read(args, &err)),
                None => return Ok(0),
            },
            _ = signals.recv() => return Ok(0),
        }
    }
}

fn cannot_read(args: &LeaderArgs, err: &distlock::Error) -> Failure {
    Failure::from_lock(err, format!("cannot read the leader of {:?}", args.name))
}

/// Prints the leader (or none) on stdout; a closed stdout ends the command (exit 141).
fn print(args: &LeaderArgs, leader: Option<&Leader>) -> Result<(), Failure> {
    if args.json {
        let value = match leader {
            None => serde_json::json!({ "name": args.name, "leader": false }),
            Some(l) => serde_json::json!({
                "name": args.name,
                "leader": true,
                "value": l.value,
                "term": l.term.map(|t| t.get()),
                "owner": l.owner,
                "remaining_ms": l.remaining.map(|d| d.as_millis() as u64),
            }),
        };
        return out::line(value);
    }
    match leader {
        None => out::line(format_args!("{}: no leader", printable(&args.name))),
        Some(leader) => out::line(format_args!(
            "{}: {}",
            printable(&args.name),
            describe(leader)
        )),
    }
}

/// The leader in words: `leader VALUE (term N, remaining 29s)`, or for a plain lock
/// `held by a lock, not a campaign (owner X, term N)`; the value and owner made printable.
pub(crate) fn describe(leader: &Leader) -> String {
    let mut details = Vec::new();
    if let Some(term) = leader.term {
        details.push(format!("term {term}"));
    }
    if let Some(left) = leader.remaining {
        let left = Duration::from_millis(left.as_millis() as u64);
        details.push(format!("remaining {}", humantime::format_duration(left)));
    }
    match &leader.value {
        Some(value) => format!("leader {} ({})", printable(value), details.join(", ")),
        None => {
            details.insert(0, format!("owner {}", printable(&leader.owner)));
            format!("held by a lock, not a campaign ({})", details.join(", "))
        }
    }
}
