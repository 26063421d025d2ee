//! An engine cache kept in memory, by tokenizer sha256: a stage built through it takes the path
//! `pack` and `serve` take once an entry exists, without a folder on disk.

use std::collections::HashMap;
use std::sync::Mutex;

use dsprep_tokenize::EngineCache;

#[derive(Default)]
pub struct MemoryCache(Mutex<HashMap<String, Vec<u8>>>);

impl EngineCache for MemoryCache {
    fn load(&self, tokenizer_sha256: &str) -> Option<Vec<u8>> {
        self.0.lock().ok()?.get(tokenizer_sha256).cloned()
    }

    fn store(&self, tokenizer_sha256: &str, entry: &[u8]) {
        if let Ok(mut entries) = self.0.lock() {
            entries.insert(tokenizer_sha256.to_string(), entry.to_vec());
        }
    }
}
