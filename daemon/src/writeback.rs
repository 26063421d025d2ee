//! Writeback while a file is written: every so many bytes its writer nudges a thread of its own
//! that fdatasyncs the file, so the disk writes as the run goes and the last fsync (before a
//! pack's output is renamed into place) finds little left to write. The first error of a
//! background sync is kept and returned by [`Writeback::finish`]: Linux reports a writeback error
//! once per open file, and the background handle shares the writer's.

use crossbeam_channel::{Sender, bounded};
use std::fs::File;
use std::io;
use std::thread::JoinHandle;

/// A thread syncing one file when nudged.
pub struct Writeback {
    nudge: Option<Sender<()>>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl Writeback {
    /// A writeback thread for `file`, or none when the handle cannot be shared or no thread
    /// started (then the file is synced only when its writer syncs it, as without one).
    pub fn start(file: &File) -> Option<Self> {
        let file = file.try_clone().ok()?;
        let (nudge, nudged) = bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("dsprep-writeback".into())
            .spawn(move || {
                for () in nudged.iter() {
                    file.sync_data()?;
                }
                Ok(())
            })
            .ok()?;
        Some(Self {
            nudge: Some(nudge),
            thread: Some(thread),
        })
    }

    /// Sync what has been written so far, soon. A nudge already waiting covers this one; a
    /// thread that stopped on an error takes none (its error comes from [`Self::finish`]).
    pub fn nudge(&self) {
        if let Some(nudge) = &self.nudge {
            let _ = nudge.try_send(());
        }
    }

    /// Wait for the thread's last sync; the first error of its syncs.
    pub fn finish(mut self) -> io::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> io::Result<()> {
        drop(self.nudge.take());
        match self.thread.take().map(JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(io::Error::other("the writeback thread panicked")),
        }
    }
}

impl Drop for Writeback {
    /// No writeback thread outlives its writer (a writer dropped without finishing has failed
    /// already: its file is not kept).
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
