//! `distlock status`.

use crate::Connection;
use crate::exit::Failure;
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
        println!("{value}");
        return Ok(0);
    }
    match info {
        None => {
            println!("{}: free", args.name);
            println!("  service:   {service}");
        }
        Some(info) => {
            println!("{}: held", args.name);
            println!("  service:   {service}");
            if info.kind != LockKind::Exclusive {
                let holders = info.holders;
                println!("  kind:      {}", info.kind);
                println!("  holders:   {holders} (owner, token and remaining: the latest)");
            }
            println!("  owner:     {}", info.owner);
            if let Some(holder) = parse_run_owner(&info.owner) {
                println!(
                    "  holder:    distlock run on {} (pid {})",
                    holder.host, holder.pid
                );
            }
            match info.token {
                Some(token) => println!("  token:     {token}"),
                None => println!("  token:     (not reported by {})", backend),
            }
            match info.remaining {
                Some(left) => println!(
                    "  remaining: {}",
                    humantime::format_duration(round_ms(left))
                ),
                None => println!("  remaining: (not reported by {})", backend),
            }
        }
    }
    Ok(0)
}

fn round_ms(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis() as u64)
}
