//! `distlock status`.

use crate::Connection;
use crate::exit::Failure;
use crate::out::{self, printable};
use crate::owner::{holder_json, parse_run_owner};
use distlock::LockKind;

/// Flags of `distlock status`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// The lock name.
    #[arg(long)]
    name: String,

    #[command(flatten)]
    connection: Connection,

    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn status(args: StatusArgs) -> Result<u8, Failure> {
    let service = args.connection.shown();
    let name = printable(&args.name);
    let (info, backend) = match args.connection.connect_existing().await? {
        // No database file: nothing can be held there.
        None => (None, ""),
        Some(locks) => {
            let info = locks.inspect(&args.name).await.map_err(|err| {
                Failure::from_lock(&err, format!("cannot inspect {:?}", args.name))
            })?;
            (info, locks.backend())
        }
    };
    if args.json {
        let value = match &info {
            None => serde_json::json!({ "name": args.name, "held": false, "service": service }),
            Some(info) => {
                let mut value = serde_json::Map::new();
                value.insert("name".into(), args.name.clone().into());
                value.insert("held".into(), true.into());
                value.insert("service".into(), service.clone().into());
                value.extend(holder_json(info));
                serde_json::Value::Object(value)
            }
        };
        out::line(value)?;
        return Ok(0);
    }
    let mut text = String::new();
    let mut say = |line: std::fmt::Arguments<'_>| {
        text.push_str(&line.to_string());
        text.push('\n');
    };
    match info {
        None => {
            say(format_args!("{name}: free"));
            say(format_args!("  service:   {}", printable(&service)));
        }
        Some(info) => {
            say(format_args!("{name}: held"));
            say(format_args!("  service:   {}", printable(&service)));
            if info.kind != LockKind::Exclusive {
                let holders = info.holders;
                say(format_args!("  kind:      {}", info.kind));
                say(format_args!(
                    "  holders:   {holders} (owner, token and remaining: the latest)"
                ));
            }
            say(format_args!("  owner:     {}", printable(&info.owner)));
            if let Some(holder) = parse_run_owner(&info.owner) {
                say(format_args!(
                    "  holder:    distlock run on {} (pid {})",
                    printable(&holder.host),
                    holder.pid
                ));
            }
            if let Some(data) = &info.data {
                say(format_args!("  data:      {}", printable(data)));
            }
            match info.token {
                Some(token) => say(format_args!("  token:     {token}")),
                None => say(format_args!("  token:     (not reported by {backend})")),
            }
            match info.remaining {
                Some(left) => say(format_args!(
                    "  remaining: {}",
                    humantime::format_duration(round_ms(left))
                )),
                None => say(format_args!("  remaining: (not reported by {backend})")),
            }
        }
    }
    out::write(text.as_bytes())?;
    Ok(0)
}

fn round_ms(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis() as u64)
}
