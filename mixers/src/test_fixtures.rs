//! Fixtures for tests, this crate's and the daemon's (feature `test-fixtures`, which the
//! daemon's dev-dependency turns on): one home for what their lineage tests share.

use crate::Recipe;
use crate::lineage::Lineage;

/// A recipe of one JSON-lines source `a` (`seq_len` 8, EOS id 0): its paths are never read.
pub fn recipe() -> Recipe {
    Recipe::parse(
        "version = 1\n[tokenizer]\npath = \"t.json\"\neos = 0\n[packing]\nseq_len = 8\n\
         [[source]]\nname = \"a\"\nfiles = [\"a/*.jsonl\"]\nformat = \"jsonl\"\n",
    )
    .expect("the fixture's recipe parses")
}

/// A lineage of two segments at 2 × 4 = 8 windows a step: [`recipe`] from step 0, then the
/// same with `a` weighted 2 from step 5 (window 40, document 31).
pub fn lineage() -> Lineage {
    let mut b = recipe();
    b.sources[0].weight = 2.0;
    Lineage::start(recipe(), "/r".into(), 2, 4).changed(b, "/r".into(), 5, 40, 31, 2, 4)
}
