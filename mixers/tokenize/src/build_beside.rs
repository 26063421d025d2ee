//! Two parts of an engine built at once. An engine built from its cache entry is what the run's
//! first document waits for, and on many cores every tokenizer thread waits with it: Llama 3's
//! byte-level engine spent 18 ms compiling its regex copies, 28 ms filling its whole-token table
//! and 18 ms its merge table, one after the other (tests/bench/runs/2026-11-27-2core-vm/NOTES.md,
//! "the engine's parts at once"). Each part has since been made cheaper on its own
//! (tests/bench/runs/2026-11-28-2core-vm/NOTES.md, "the engine's start from its cache entry").
//! Now the regex's first copy compiles beside the vocabulary, and the whole tokens fill beside
//! the merge table, the longest part.

use std::sync::Mutex;

/// `a()` on a thread of its own while `b()` runs here; both here, should no thread start. A panic
/// in either is this call's (the engine's builder reports it).
pub(super) fn join<A: Send, B>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B) -> (A, B) {
    // Kept here until taken, so that a thread that does not start leaves it to run below.
    let part = Mutex::new(Some(a));
    let take_and_run = || {
        let a = part.lock().ok().and_then(|mut part| part.take());
        a.map(|a| a())
    };
    std::thread::scope(|scope| {
        let beside = std::thread::Builder::new()
            .name("dsprep-engine".into())
            .spawn_scoped(scope, take_and_run)
            .ok();
        let b = b();
        let a = match beside.map(|thread| thread.join()) {
            Some(Ok(a)) => a,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => None,
        };
        let a = a
            .or_else(take_and_run)
            .expect("the part is taken once, by whoever runs it");
        (a, b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both parts' results, each from its own closure, the first on another thread.
    #[test]
    fn both_parts_are_built_the_first_beside() {
        let here = std::thread::current().id();
        let ((a, a_thread), (b, b_thread)) = join(
            || (vec![1, 2, 3], std::thread::current().id()),
            || ("b", std::thread::current().id()),
        );
        assert_eq!((a, b), (vec![1, 2, 3], "b"));
        assert_ne!(a_thread, here);
        assert_eq!(b_thread, here);
    }

    /// A panic on the other thread is the caller's.
    #[test]
    fn a_panic_beside_is_the_callers() {
        let caught = std::panic::catch_unwind(|| join(|| panic!("the part's own bug"), || 1));
        let message = caught.expect_err("panics");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"the part's own bug"));
    }
}
