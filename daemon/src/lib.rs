//! The drivers around dsprep's pipeline core: sources (local files and the Hugging Face Hub),
//! the offline packer (`dsprep pack`), the loader daemon (`dsprep serve`) and its stand-in
//! trainer (`dsprep tap`), the checks on packed output (`verify`, `inspect`) and its exports for
//! other trainers (`export`). The `dsprep` binary in `main.rs` only parses arguments and calls
//! into here.

pub mod checkpoint;
pub mod driver;
pub mod export;
pub mod files;
pub mod hub;
pub mod inspect;
pub mod pack;
pub mod plan;
pub mod progress;
pub mod serve;
pub mod sources;
pub mod tap;
pub mod tokenizer_cache;
pub mod verify;
pub mod waits;
pub mod window_packing;
pub mod writeback;
