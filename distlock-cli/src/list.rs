//! `distlock list`.

use std::time::Duration;

use crate::Connection;
use crate::exit::Failure;
use crate::out::{self, printable};
use crate::owner::{holder_json, parse_run_owner};
use distlock::LockKind;

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
                let mut value = serde_json::Map::new();
                value.insert("name".into(), name.as_str().into());
                value.extend(holder_json(info));
                serde_json::Value::Object(value)
            })
            .collect();
        out::line(serde_json::Value::Array(items))?;
        return Ok(0);
    }
    if held.is_empty() {
        out::line("no locks held")?;
        return Ok(0);
    }
    let rows: Vec<[String; 5]> = held
        .iter()
        .map(|(name, info)| {
            let owner = match parse_run_owner(&info.owner) {
                Some(h) => format!(
                    "{} (distlock run on {}, pid {})",
                    printable(&info.owner),
                    printable(&h.host),
                    h.pid
                ),
                None => printable(&info.owner).into_owned(),
            };
            let kind = match info.kind {
                LockKind::Exclusive => "exclusive".to_owned(),
                LockKind::Permit { permits } => format!("{}/{permits} permits", info.holders),
                kind => format!("{} x{}", kind.as_str(), info.holders),
            };
            [
                printable(name.as_str()).into_owned(),
                kind,
                info.token.map_or_else(|| "-".into(), |t| t.to_string()),
                info.remaining.map_or_else(
                    || "-".into(),
                    |d| humantime::format_duration(round_ms(d)).to_string(),
                ),
                owner,
            ]
        })
        .collect();
    let header = ["NAME", "KIND", "TOKEN", "REMAINING", "OWNER"].map(str::to_owned);
    let mut widths = [0; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut table = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        table.push_str(&format!(
            "{:w0$}  {:w1$}  {:w2$}  {:w3$}  {}\n",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        ));
    }
    out::write(table.as_bytes())?;
    if held.len() == args.limit {
        out::stderr_line(format_args!(
            "distlock: showing the first {} locks; raise --limit or narrow --prefix for more",
            args.limit
        ));
    }
    Ok(0)
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
