//! dsprep's pipeline core: the recipe, the mixer, the shuffle buffer, the tokenize stage and the
//! packer. Synchronous, deterministic and IO-free: drivers (`dsprep pack`, the daemon) read the
//! files and move the items; every byte of the output is decided here.
//!
//! `Source → Mixer → Shuffler → TokenizeStage → Packer`
//!
//! Stateful stages (`Mixer`, `Shuffler`, `Packer`) are driven one item at a time and hold all of
//! their state in plain fields; `TokenizeStage` is `&self` and runs in parallel, the driver puts
//! its results back in order.

pub mod adaptive;
pub mod checkpoint;
pub mod doc;
pub mod lanes;
pub mod ledger;
pub mod lineage;
pub mod mixer;
pub mod packer;
pub mod recipe;
pub mod rng;
pub mod shuffle;
pub mod split;
pub mod stream;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod test_fixtures;
pub use dsprep_tokenize as tokenize;

pub use doc::{Doc, DocPos, DocSource, SourceCounters, SourceCursor};
pub use mixer::{MixError, Mixer};
pub use packer::{PackedWindow, Packer, PackerConfig, PackerState, WindowPacker};
pub use recipe::{LanesSpec, Recipe, RecipeError};
pub use shuffle::Shuffler;
pub use stream::{DocStream, StreamState};
pub use tokenize::{EngineChoice, TokenizeError, TokenizeStage};
