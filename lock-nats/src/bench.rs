//! The raw floor of NATS JetStream for the shared benchmark harness (feature `bench`).

use std::collections::HashMap;

use async_nats::jetstream::message::PublishMessage;
use async_trait::async_trait;
use distlock_bench::{BenchHooks, RawFloor, Target};
use distlock_core::{ClientConfig, Error};

use crate::NatsConfig;
use crate::backend::{BackendState, open};
use crate::error::{Written, backend_msg};
use crate::keys::escape;

/// How long a floor waits for its connection (TLS handshake and authentication included).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The cheapest correct lock cycle on a JetStream KV bucket: a create-if-absent with a ttl
/// (expected last revision of the key), then a purge expecting the created revision (two
/// stream writes, as a KV lock written by hand).
pub struct KvFloor {
    state: std::sync::Arc<BackendState>,
    /// Per key, its last revision (the marker of the last purge): what the next create expects.
    last: HashMap<String, u64>,
}

impl KvFloor {
    /// Connects its own client to `config`'s servers, the way the lock client connects (TLS
    /// and credentials included, so a TLS target is measured next to a TLS floor).
    ///
    /// # Errors
    /// As [`NatsBackend::connect`](crate::NatsBackend::connect).
    pub async fn connect(config: &NatsConfig) -> Result<Self, Error> {
        Ok(Self {
            state: open(config, CONNECT_TIMEOUT).await?,
            last: HashMap::new(),
        })
    }
}

impl std::fmt::Debug for KvFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvFloor")
            .field("bucket", &self.state.bucket.name)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl RawFloor for KvFloor {
    fn label(&self) -> &str {
        "KV create with ttl + purge"
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        let subject = format!("{}floor.{}", self.state.bucket.kv_prefix, escape(name));
        // The last purge's marker, until it expires (then the key has no message).
        let mut expected = self.last.get(&subject).copied().unwrap_or(0);
        let rev = loop {
            let create = PublishMessage::build()
                .payload(bytes::Bytes::from_static(b"floor"))
                .header("Nats-TTL", "60")
                .expected_last_subject_sequence(expected);
            match self.state.send("create", &subject, create).await? {
                Written::Stored(rev) => break rev,
                Written::Conflict if expected != 0 => expected = 0,
                Written::Conflict => {
                    return Err(backend_msg(format!("{subject:?} already exists")));
                }
            }
        };
        match self.state.purge(&subject, rev, None).await? {
            Written::Stored(marker) => {
                self.last.insert(subject, marker);
                Ok(())
            }
            Written::Conflict => Err(backend_msg(format!("{subject:?} changed under the floor"))),
        }
    }
}

/// A benchmark target: distlock over NATS at `config`, next to [`KvFloor`].
pub fn target(label: &str, config: &NatsConfig) -> Target {
    let (a, b) = (config.clone(), config.clone());
    Target::new(label, move || {
        let config = a.clone();
        async move {
            let client = crate::connect_with(config, ClientConfig::default()).await?;
            Ok(client.into_dyn())
        }
    })
    .with_floor(move || {
        let config = b.clone();
        async move { Ok(Box::new(KvFloor::connect(&config).await?) as Box<dyn RawFloor>) }
    })
}

/// The raw floor for a lock URL (`nats://`, `tls://`, credentials included): [`KvFloor`].
/// `distlock bench` calls it.
///
/// # Errors
/// [`Error::InvalidConfig`] for a bad URL, and the errors of [`NatsBackend::connect`](crate::NatsBackend::connect).
pub async fn floor(url: &str) -> Result<Box<dyn RawFloor>, Error> {
    let config = NatsConfig::from_url(url)?;
    Ok(Box::new(KvFloor::connect(&config).await?))
}

/// NATS's hooks: [`floor`]. NATS has no server-side blocking lock to serve as a contended
/// floor, and its request counters are on a separate monitoring port the lock URL does not
/// name.
pub const NATS: BenchHooks =
    BenchHooks::new().with_floor(|url| Box::pin(async move { floor(&url).await }));
