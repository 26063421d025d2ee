//! What a failed pack leaves behind, and the error that says so: the partial output directory
//! is kept when it holds a checkpoint to continue from, else removed.

use super::output::PackWriter;
use dsprep_client::format::Manifest;
use std::path::Path;

/// What a failed pack leaves: the partial directory when it holds a checkpoint (the same command
/// continues from it, and a transient failure — the network, a full disk — loses nothing), else
/// nothing. The error says which, after its cause.
pub(crate) fn failed(
    writer: PackWriter,
    partial: &Path,
    checkpointed: Option<u64>,
    cause: anyhow::Error,
) -> anyhow::Error {
    drop(writer); // closes its files and lets go of the partial directory's lock
    leave_partial(partial, checkpointed, cause)
}

/// [`failed`] once the writer is gone.
fn leave_partial(partial: &Path, checkpointed: Option<u64>, cause: anyhow::Error) -> anyhow::Error {
    let shown = partial.display();
    let outcome = match checkpointed {
        Some(windows) => format!(
            "kept {shown}: it holds a checkpoint after {windows} windows; the same command \
             continues from there (--fresh starts over)"
        ),
        None => match std::fs::remove_dir_all(partial) {
            Ok(()) => format!("removed {shown}: it held no checkpoint to continue from"),
            Err(e) => format!("could not remove {shown} ({e}); it holds no checkpoint: delete it"),
        },
    };
    anyhow::Error::new(PackFailed { cause, outcome })
}

/// A pack's error with what became of its partial output.
#[derive(Debug)]
struct PackFailed {
    cause: anyhow::Error,
    outcome: String,
}

impl std::fmt::Display for PackFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}\n{}", self.cause, self.outcome)
    }
}

impl std::error::Error for PackFailed {}

/// [`PackWriter::finish`], with what a failure leaves said as [`failed`] says it.
pub(crate) fn finish(
    writer: PackWriter,
    manifest: Manifest,
    partial: &Path,
    checkpointed: Option<u64>,
) -> anyhow::Result<Manifest> {
    match writer.finish(manifest) {
        Ok(manifest) => Ok(manifest),
        // After its rename there is no partial directory left to keep or remove.
        Err(e) if !partial.exists() => Err(e),
        Err(e) => Err(leave_partial(partial, checkpointed, e)),
    }
}
