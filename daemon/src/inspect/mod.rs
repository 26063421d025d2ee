//! `dsprep inspect DIR`: look inside a packed directory. `--window N` decodes one window with its
//! document boundaries (`window.rs`); `--mix` prints the ledger of its sources, optionally with a
//! CSV of the realized shares along the stream (`mix.rs`; a lineage's segments: `segments.rs`);
//! `--plot` draws them and the document lengths (`plot.rs`) and, for a padded pack, the
//! windows' fill (`fill.rs`). Given a state directory (or its `lineage.json`), `--decisions`
//! prints `[mix.adaptive]`'s decisions and `--plot` draws the shares and reported loss per source
//! along the steps (`decisions.rs`).

mod decisions;
mod fill;
mod mix;
mod plot;
mod segments;
mod window;

pub use decisions::{Decisions, render_decisions_svg};
pub use fill::{FILL_BUCKETS, WindowFill};
pub use mix::{
    LENGTH_BUCKETS, MixLedger, ShareRow, auto_every, ledger_rows, mix_ledger, phase_points,
};
pub use plot::{HEIGHT, WIDTH, render_svg};
pub use window::inspect_window;
