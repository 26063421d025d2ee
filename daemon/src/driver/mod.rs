//! The threaded driver that `dsprep pack` and `dsprep serve` both sit on: the recipe built into a
//! document stream (`stream.rs`), the one run path of a stream — restore, pipeline, packer,
//! snapshots, a sink (`run.rs`) — over the reader → tokenizers → in-order sink threads
//! (`pipeline.rs`), the lanes of a partitioned recipe (`lanes.rs`), each source's input from a
//! listing or from the frozen plan (`inputs.rs`, `frozen_plan.rs`), sources that tokenize ahead
//! for a mix in tokens (`pretokenize.rs`).

pub mod frozen_plan;
pub mod inputs;
pub mod lanes;
pub mod lineage;
pub mod pipeline;
pub mod pretokenize;
pub mod run;
pub mod stream;

pub use stream::{
    LoadedRecipe, Locator, build_mixer, build_mixer_with, build_stream, hub_client, load_parsed,
    load_recipe, load_recipe_with,
};
