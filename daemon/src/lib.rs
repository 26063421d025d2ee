//! The drivers around dsprep's pipeline core: local-file sources, the offline packer
//! (`dsprep pack`), and the checks on its output (`verify`, `inspect`). The `dsprep` binary in
//! `main.rs` only parses arguments and calls into here.

pub mod files;
pub mod inspect;
pub mod pack;
pub mod sources;
pub mod verify;
