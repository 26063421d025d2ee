//! The trainer side of dsprep. Now: the packed-shard format (v1) written by `dsprep pack` and a
//! memory-mapped reader that hands out windows and per-rank batches without copying.
//! Later: the wire protocol and the client that talks to the daemon.

pub mod batch;
pub mod format;
pub mod packed;

pub use batch::{Batch, BatchLayout};
pub use format::{Dtype, Manifest};
pub use packed::{PackedDataset, ReadError, TokenSlice, Window};
