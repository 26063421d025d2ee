//! The trainer side of dsprep: the packed-shard format (v3; v1 and v2 are still read) written by `dsprep
//! pack` and a memory-mapped reader that hands out windows and per-rank batches without copying.
//! The wire protocol (v6, answering v1 to v5) and the per-rank client of the daemon, which checks the
//! stream chain (`chain`) of every step it receives, over CURVE when given keys (`curve`), and keeps
//! its rank at the daemon while it lives (`keepalive`).

pub mod batch;
pub mod chain;
mod connection;
pub mod curve;
pub mod format;
mod keepalive;
pub mod packed;
pub mod parallel;
pub mod protocol;
pub mod served;

pub use batch::{Batch, BatchLayout};
pub use format::{Dtype, Manifest};
pub use packed::{PackedDataset, ReadError, TokenSlice, Window};
pub use parallel::{Parallelism, RankOrder};
pub use served::{
    Client, ClientConfig, ClientError, ServedBatch, process_session, process_session_started,
};
