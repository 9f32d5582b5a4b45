//! Whether queue keys still exist: concurrent checks of one client batched into few transactions.

use std::sync::Arc;

use distlock_core::Result;
use etcd_client::{Client, GetOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, oneshot};

use crate::backend::BackendState;
use crate::error::{AttemptError, attempts, map_err, protocol, retryable, shared_err};
use crate::members::Members;

impl BackendState {
    /// Whether `key` still exists with create revision `rev`. Concurrent checks of one client
    /// are batched into one transaction (see [`check_keys`]).
    pub(crate) async fn key_is_ours(&self, key: &str, rev: i64) -> Result<bool> {
        let queue = self.checks.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(check_keys(self.client.clone(), self.members.clone(), rx));
            tx
        });
        let (reply, answer) = oneshot::channel();
        let check = KeyCheck {
            key: key.to_owned(),
            rev,
            reply,
        };
        if queue.send(check).is_ok()
            && let Ok(ours) = answer.await
        {
            return ours;
        }
        // The batcher is gone (the runtime that started it shut down): read directly.
        let options = GetOptions::new().with_keys_only();
        let resp = self
            .client
            .kv_client()
            .get(key, Some(options))
            .await
            .map_err(|e| map_err("renewing", e))?;
        Ok(resp
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == rev))
    }
}

/// One key-existence check of a renewal.
pub(crate) struct KeyCheck {
    pub(crate) key: String,
    pub(crate) rev: i64,
    pub(crate) reply: oneshot::Sender<Result<bool>>,
}

/// The most reads in one transaction (etcd's default `--max-txn-ops` is 128).
pub(crate) const CHECKS_PER_TXN: usize = 100;

/// The most transactions one batch sends at once.
pub(crate) const TXNS_PER_BATCH: usize = 8;

/// The renewal batcher of one client: every renewal must confirm that its key still exists
/// with its create revision. Checks that arrive while a batch is in flight wait for the next
/// one, which reads all their keys in one transaction per [`CHECKS_PER_TXN`] keys (group
/// commit: no added delay when idle, one round trip for a burst). Ends with the client.
pub(crate) async fn check_keys(
    client: Client,
    members: Members,
    mut queue: mpsc::UnboundedReceiver<KeyCheck>,
) {
    let mut batch = Vec::new();
    while queue
        .recv_many(&mut batch, CHECKS_PER_TXN * TXNS_PER_BATCH)
        .await
        > 0
    {
        let chunks: Vec<Vec<KeyCheck>> = {
            let mut chunks = Vec::new();
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(CHECKS_PER_TXN));
                chunks.push(std::mem::replace(&mut batch, rest));
            }
            chunks
        };
        futures::future::join_all(
            chunks
                .into_iter()
                .map(|chunk| check_chunk(&client, &members, chunk)),
        )
        .await;
    }
}

pub(crate) async fn check_chunk(client: &Client, members: &Members, chunk: Vec<KeyCheck>) {
    let keys: Vec<(&str, i64)> = chunk.iter().map(|c| (c.key.as_str(), c.rev)).collect();
    match keys_are_ours(client, members, &keys).await {
        Ok(answers) => {
            let mut answers = answers.into_iter();
            for check in chunk {
                let ours = answers
                    .next()
                    .flatten()
                    .ok_or_else(|| protocol("a transaction answered without its read"));
                let _ = check.reply.send(ours);
            }
        }
        Err(AttemptError::Client(err)) => {
            let err = Arc::new(err);
            for check in chunk {
                let _ = check.reply.send(Err(shared_err("renewing", &err)));
            }
        }
        Err(AttemptError::Unanswered) => {
            for check in chunk {
                let _ = check
                    .reply
                    .send(Err(AttemptError::Unanswered.into_error("renewing")));
            }
        }
    }
}

/// Whether each key still exists with its create revision: one transaction of reads (at
/// most [`CHECKS_PER_TXN`] keys), repeated on a transport failure (reads only: safe). `None`
/// for a read the answer lacks (a protocol error, never seen); the answer may be shorter.
pub(crate) async fn keys_are_ours(
    client: &Client,
    members: &Members,
    keys: &[(&str, i64)],
) -> std::result::Result<Vec<Option<bool>>, AttemptError> {
    let reads = keys
        .iter()
        .map(|(key, _)| TxnOp::get(*key, Some(GetOptions::new().with_keys_only())));
    let txn = Txn::new().and_then(reads.collect::<Vec<_>>());
    // Read only: safe to repeat.
    let (resp, _) = attempts("checking held keys", retryable, members, || {
        let mut kv = client.kv_client();
        let txn = txn.clone();
        async move { kv.txn(txn).await }
    })
    .await?;
    Ok(resp
        .op_responses()
        .into_iter()
        .zip(keys)
        .map(|(answer, (_, rev))| match answer {
            TxnOpResponse::Get(get) => Some(
                get.kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == *rev),
            ),
            _ => None,
        })
        .collect())
}
