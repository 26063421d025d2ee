//! `dsprep inspect DIR`: look inside a packed directory. `--window N` decodes one window with its
//! document boundaries (`window.rs`); `--mix` prints the ledger of its sources, optionally with a
//! CSV of the realized shares along the stream (`mix.rs`).

mod mix;
mod window;

pub use mix::{MixLedger, mix_ledger};
pub use window::inspect_window;
