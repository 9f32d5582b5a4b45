//! `distlock status`.

use crate::Connection;
use crate::exit::Failure;

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
    let locks = args.connection.connect().await?;
    let info = locks
        .inspect(&args.name)
        .await
        .map_err(|err| Failure::from_lock(&err, format!("cannot inspect {:?}", args.name)))?;
    if args.json {
        let value = match &info {
            None => serde_json::json!({ "name": args.name, "held": false }),
            Some(info) => serde_json::json!({
                "name": args.name,
                "held": true,
                "owner": info.owner,
                "token": info.token.map(|t| t.get()),
                "remaining_ms": info.remaining.map(|d| d.as_millis() as u64),
            }),
        };
        println!("{value}");
        return Ok(0);
    }
    match info {
        None => println!("{}: free", args.name),
        Some(info) => {
            println!("{}: held", args.name);
            println!("  owner:     {}", info.owner);
            match info.token {
                Some(token) => println!("  token:     {token}"),
                None => println!("  token:     (not reported by {})", locks.backend()),
            }
            match info.remaining {
                Some(left) => println!(
                    "  remaining: {}",
                    humantime::format_duration(round_ms(left))
                ),
                None => println!("  remaining: (not reported by {})", locks.backend()),
            }
        }
    }
    Ok(0)
}

fn round_ms(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis() as u64)
}
