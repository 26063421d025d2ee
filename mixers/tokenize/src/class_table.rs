//! The character classes of the pre-tokenizer scanners whose patterns test more classes than
//! [`super::char_classes::CharClasses`] keeps (DeepSeek V3's, o200k's): one byte per character,
//! looked up in a table of every code point below U+10000 (64 KiB) or in sorted ranges above it,
//! built from `regex-syntax`'s Unicode tables, the ones fancy-regex compiles HF's patterns with.

use super::char_classes::{range_holding, ranges};

pub(crate) struct ClassTable {
    /// The byte of every code point below U+10000 (ASCII included).
    bmp: Box<[u8]>,
    /// Sorted, disjoint ranges of code points from U+10000 whose byte is not 0.
    astral: Vec<(u32, u32, u8)>,
}

/// The number of code points below U+10000.
const BMP: u32 = 0x1_0000;

impl ClassTable {
    /// Each class expression (`\p{Lu}`, `[\p{P}\p{S}]`) gives its characters its byte (not 0);
    /// the classes must be disjoint. A character in none has byte 0.
    pub(crate) fn new(classes: &[(&str, u8)]) -> Result<Self, String> {
        let mut bmp = vec![0u8; BMP as usize].into_boxed_slice();
        let mut astral = Vec::new();
        for &(class, byte) in classes {
            if byte == 0 {
                return Err(format!("{class} is given byte 0, which means no class"));
            }
            for (lo, hi) in ranges(class)? {
                for c in lo..=hi.min(BMP - 1) {
                    let slot = &mut bmp[c as usize];
                    if *slot != 0 {
                        return Err(format!("{class} overlaps another class at U+{c:04X}"));
                    }
                    *slot = byte;
                }
                if hi >= BMP {
                    astral.push((lo.max(BMP), hi, byte));
                }
            }
        }
        astral.sort_unstable();
        if let Some(pair) = astral.windows(2).find(|pair| pair[0].1 >= pair[1].0) {
            return Err(format!("classes overlap at U+{:04X}", pair[1].0));
        }
        Ok(Self { bmp, astral })
    }

    /// Adds the bit `flag` to the byte of every character of `class`, all below U+10000.
    pub(crate) fn add_flag(&mut self, class: &str, flag: u8) -> Result<(), String> {
        for (lo, hi) in ranges(class)? {
            for c in lo..=hi {
                *self
                    .bmp
                    .get_mut(c as usize)
                    .ok_or_else(|| format!("{class} reaches past U+FFFF"))? |= flag;
            }
        }
        Ok(())
    }

    /// The byte of `b`, an ASCII character (for any other byte, that of `b & 0x7f`).
    #[inline]
    pub(crate) fn ascii(&self, b: u8) -> u8 {
        self.bmp[usize::from(b & 0x7f)]
    }

    /// The byte of the character `c`.
    pub(crate) fn of(&self, c: char) -> u8 {
        let code = u32::from(c);
        if let Some(&byte) = self.bmp.get(code as usize) {
            return byte;
        }
        range_holding(&self.astral, code, |&(lo, hi, _)| (lo, hi)).map_or(0, |i| self.astral[i].2)
    }

    /// The byte and byte width of the character at byte `at` of `text` (a char boundary), or
    /// `None` at the end. ASCII is one look-up; other characters are decoded.
    #[inline]
    pub(crate) fn at(&self, text: &str, at: usize) -> Option<(u8, usize)> {
        let &b = text.as_bytes().get(at)?;
        if b.is_ascii() {
            return Some((self.bmp[usize::from(b)], 1));
        }
        self.wide_at(text, at)
    }

    #[inline(never)]
    fn wide_at(&self, text: &str, at: usize) -> Option<(u8, usize)> {
        let c = text.get(at..)?.chars().next()?;
        Some((self.of(c), c.len_utf8()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_up_every_plane_and_refuses_overlaps() {
        let mut table = ClassTable::new(&[(r"\p{Lu}", 1), (r"\p{N}", 2)]).expect("disjoint");
        table.add_flag("[ぁ-ゖ]", 8).expect("below U+10000");
        for (c, byte) in [
            ('A', 1),
            ('a', 0),
            ('7', 2),
            ('Ⅻ', 2),
            ('𝐀', 1),
            ('𝟙', 2),
            ('😀', 0),
        ] {
            assert_eq!(table.of(c), byte, "{c:?}");
            assert_eq!(table.at(&format!("{c}x"), 0), Some((byte, c.len_utf8())));
        }
        assert_eq!(table.of('ぁ'), 8);
        assert_eq!(table.at("", 0), None);
        assert_eq!(
            ClassTable::new(&[(r"\p{L}", 1), (r"\p{Lu}", 2)])
                .err()
                .as_deref(),
            Some(r"\p{Lu} overlaps another class at U+0041")
        );
        assert!(table.add_flag(r"\p{N}", 16).is_err(), "numbers past U+FFFF");
    }
}
