//! `distlock elect`: campaign to lead an election, and run a command while leader.

use distlock::Error;

use std::path::PathBuf;

use crate::exit::{CONFIG, Failure};
use crate::run::{After, Held, Holding, Role, read_value_file, run_holding};

pub(crate) const AFTER_HELP: &str = "\
Waits until this candidate is the leader of the election NAME (a lock name held exclusively),
then runs CMD while it leads, exactly as `distlock run` runs a command under a lock: the
leadership is renewed every ttl/3, lost leadership terminates CMD (exit 76), signals go to
CMD's process group, and when CMD exits distlock resigns and exits with CMD's status. Then
the next candidate is elected. Like `etcdctl elect`.

CMD gets DISTLOCK_LEADER_TERM (the term: strictly increasing across leaders), the same value in
DISTLOCK_FENCING_TOKEN (pass it to what the leader writes to), DISTLOCK_LEADER_VALUE (--value)
and DISTLOCK_LOCK_NAME. `distlock leader --name NAME` shows the leader and its value. With
--value-file, a new first line written to the file while leading is proclaimed within a second
(the term stays), where the backend stores holder data.

Examples:
  distlock elect --name scheduler -- ./scheduler          # one scheduler at a time, failover
  distlock elect --name api-primary --value 10.0.0.5:8080 --ttl 10s -- ./serve
  distlock elect --name cron --wait 0 -- ./job.sh         # lead now or exit 75
  distlock elect --name db --value-file /run/db.addr -- ./db  # ./db rewrites /run/db.addr";

/// Flags of `distlock elect`.
#[derive(Debug, clap::Args)]
pub(crate) struct ElectArgs {
    /// The election's name (a lock name).
    #[arg(long)]
    name: String,

    /// The value this candidate publishes while it leads (e.g. its address; at most 128
    /// bytes): `distlock leader` shows it. Default: <host>:<pid>.
    #[arg(long, conflicts_with = "value_file")]
    value: Option<String>,

    /// Read the value from the first line of this file, and again every second while
    /// leading (a regular file; a named pipe is read once): a new value is proclaimed (same
    /// term; `distlock leader` and observers see it), so CMD can change what it advertises by
    /// writing the file.
    #[arg(long, value_name = "FILE")]
    value_file: Option<PathBuf>,

    #[command(flatten)]
    holding: Holding,
}

pub(crate) async fn elect(args: ElectArgs, quiet: bool) -> Result<u8, Failure> {
    let value = match (&args.value, &args.value_file) {
        (Some(value), _) => value.clone(),
        (None, Some(file)) => match read_value_file(file).await {
            Ok(value) if !value.is_empty() => value,
            Ok(_) => {
                return Err(Failure::new(
                    CONFIG,
                    format!("--value-file {}: its first line is empty", file.display()),
                ));
            }
            Err(err) => {
                return Err(Failure::new(
                    CONFIG,
                    format!("--value-file {}: {err}", file.display()),
                ));
            }
        },
        (None, None) => default_value(),
    };
    let value_file = args.value_file.clone();
    let name = args.name.clone();
    run_holding(
        &args.holding,
        &args.name,
        Role::Leader,
        quiet,
        After::default(),
        |locks, opts| async move {
            match locks.campaign(&name, &value, &opts).await {
                Ok(guard) => {
                    let term = guard.token().to_string();
                    let env = vec![
                        ("DISTLOCK_LEADER_TERM", term),
                        ("DISTLOCK_LEADER_VALUE", value.clone()),
                    ];
                    let value_file = value_file.map(|file| (file, value));
                    Ok(Some(Held {
                        hold: crate::upgrade::Hold::One(guard),
                        env,
                        value_file,
                    }))
                }
                Err(Error::Timeout { .. }) => Ok(None),
                Err(err) => Err(Failure::from_lock(
                    &err,
                    format!("cannot campaign for {name:?}"),
                )),
            }
        },
    )
    .await
}

/// `<host>:<pid>`: which process leads, when no --value is given.
fn default_value() -> String {
    format!("{}:{}", crate::owner::host_name(), std::process::id())
}
