//! ZooKeeper backend for distlock.
//!
//! The protocol lands with its backend issue; until then this crate only reserves its place in
//! the workspace and re-exports [`lock_core`], so that depending on it already compiles.

pub use lock_core;
