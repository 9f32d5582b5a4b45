//! `distlock list`.

use std::time::Duration;

use crate::Connection;
use crate::exit::Failure;
use crate::owner::parse_run_owner;

/// Flags of `distlock list`.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Only locks whose name starts with this.
    #[arg(long)]
    prefix: Option<String>,

    /// Show at most this many locks.
    #[arg(long, default_value_t = 100)]
    limit: usize,

    #[command(flatten)]
    connection: Connection,

    /// Print JSON (one array) instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn list(args: ListArgs) -> Result<u8, Failure> {
    let held = match args.connection.connect_existing().await? {
        // No database file: nothing is held there.
        None => Vec::new(),
        Some(locks) => locks
            .list(args.prefix.as_deref(), args.limit)
            .await
            .map_err(|err| Failure::from_lock(&err, "cannot list locks"))?,
    };
    if args.json {
        let items: Vec<_> = held
            .iter()
            .map(|(name, info)| {
                let holder = parse_run_owner(&info.owner);
                serde_json::json!({
                    "name": name.as_str(),
                    "owner": info.owner,
                    "host": holder.as_ref().map(|h| h.host.clone()),
                    "pid": holder.as_ref().map(|h| h.pid),
                    "token": info.token.map(|t| t.get()),
                    "remaining_ms": info.remaining.map(|d| d.as_millis() as u64),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(items));
        return Ok(0);
    }
    if held.is_empty() {
        println!("no locks held");
        return Ok(0);
    }
    let rows: Vec<[String; 4]> = held
        .iter()
        .map(|(name, info)| {
            let owner = match parse_run_owner(&info.owner) {
                Some(h) => format!("{} (distlock run on {}, pid {})", info.owner, h.host, h.pid),
                None => info.owner.clone(),
            };
            [
                name.to_string(),
                info.token.map_or_else(|| "-".into(), |t| t.to_string()),
                info.remaining.map_or_else(
                    || "-".into(),
                    |d| humantime::format_duration(round_ms(d)).to_string(),
                ),
                owner,
            ]
        })
        .collect();
    let header = ["NAME", "TOKEN", "REMAINING", "OWNER"].map(str::to_owned);
    let mut widths = [0; 3];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        println!(
            "{:w0$}  {:w1$}  {:w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
    if held.len() == args.limit {
        eprintln!(
            "distlock: showing the first {} locks; raise --limit or narrow --prefix for more",
            args.limit
        );
    }
    Ok(0)
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
