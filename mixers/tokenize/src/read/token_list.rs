//! A list of tokens as bytes and ids, kept as two allocations (every token's bytes end to end,
//! and each token's end and id) rather than one per token: the pieces that are one token whole,
//! as an engine's tables hold them until [`crate::engines::whole_tokens::WholeTokens`] is built
//! from them. Read from an engine-cache entry, Llama 3's 128,000 tokens were 128,000 allocations, made and
//! freed on the path of the run's first document.

/// Tokens in order, each its bytes and id.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenList {
    /// Every token's bytes, one after another.
    bytes: Vec<u8>,
    /// Each token's end in `bytes` and its id.
    ends: Vec<(usize, u32)>,
}

impl TokenList {
    /// An empty list with room for `tokens` tokens of `bytes` bytes in all.
    pub fn with_capacity(tokens: usize, bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(tokens),
        }
    }

    pub fn push(&mut self, token: &[u8], id: u32) {
        self.bytes.extend_from_slice(token);
        self.ends.push((self.bytes.len(), id));
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Every token's bytes and id, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u32)> {
        let starts = std::iter::once(0).chain(self.ends.iter().map(|&(end, _)| end));
        starts
            .zip(&self.ends)
            .map(|(start, &(end, id))| (&self.bytes[start..end], id))
    }
}

impl<B: AsRef<[u8]>> FromIterator<(B, u32)> for TokenList {
    fn from_iter<I: IntoIterator<Item = (B, u32)>>(tokens: I) -> Self {
        let mut list = Self::default();
        for (token, id) in tokens {
            list.push(token.as_ref(), id);
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens come back in order with their bytes and ids, the empty one included.
    #[test]
    fn gives_back_what_was_pushed() {
        let tokens: Vec<(Vec<u8>, u32)> =
            vec![(b"ab".to_vec(), 7), (Vec::new(), 3), (b"\xffc".to_vec(), 0)];
        let list: TokenList = tokens.iter().map(|(b, id)| (b, *id)).collect();
        assert_eq!(list.len(), 3);
        let back: Vec<(Vec<u8>, u32)> = list.iter().map(|(b, id)| (b.to_vec(), id)).collect();
        assert_eq!(back, tokens);
        assert_eq!(TokenList::default().iter().count(), 0);
    }
}
