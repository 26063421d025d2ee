//! What a failed pack leaves behind, and the error that says so on its last line: the partial
//! output directory is kept when it holds a checkpoint to continue from, else removed; a lane
//! part's `OUT.lanes` is kept while it holds complete lanes (a rerun keeps them), else removed.
//!
//! Every failure path of `dsprep pack` ends here once a partial directory is the pack's (its lock
//! taken): the plain pack (a failed start, a failed continue, the run, the manifest, the
//! rename), each lane of a part, and the finish.

use super::output;
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

/// [`failed`] once the writer is gone (or before there is one: a writer that failed to start
/// after it took the directory's lock).
pub(crate) fn leave_partial(
    partial: &Path,
    checkpointed: Option<u64>,
    cause: anyhow::Error,
) -> anyhow::Error {
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
    with_outcome(cause, outcome)
}

/// `cause`, with what became of the output said on a last line of its own.
pub(crate) fn with_outcome(cause: anyhow::Error, outcome: String) -> anyhow::Error {
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
    let out = writer.out().to_path_buf();
    match writer.finish(manifest) {
        Ok(manifest) => Ok(manifest),
        // After its rename there is no partial directory left to keep or remove.
        Err(e) if !partial.exists() => Err(e),
        // The checkpoint is removed just before the rename: a directory past that point is the
        // whole output, and only its move failed.
        Err(e) if output::is_whole(partial) => Err(with_outcome(
            e,
            format!(
                "kept {}: it holds the whole output (manifest.json written), only moving it to \
                 {} failed: move it there",
                partial.display(),
                out.display()
            ),
        )),
        Err(e) => Err(leave_partial(partial, checkpointed, e)),
    }
}
