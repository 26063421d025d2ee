//! Part numbers written as Slurm writes array indices: `3`, `0-15`, `3,17,40-42`. `--part`
//! reads this form, and `--status` and the finish write it (the resubmission's `--array=`), so
//! the one syntax is parsed and written here, once. A list is sorted and without repeats.

use anyhow::{anyhow, bail};

/// Parse `3,17,40-42` into sorted, distinct part numbers.
pub fn parse(text: &str) -> anyhow::Result<Vec<u32>> {
    let number = |s: &str| -> anyhow::Result<u32> {
        s.trim().parse().map_err(|_| {
            anyhow!("--part {text:?}: {s:?} is not a part number (write parts as 3,17,40-42)")
        })
    };
    let mut parts = Vec::new();
    for item in text.split(',') {
        match item.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if first > last {
                    bail!("--part {text:?}: the range {item:?} runs backwards");
                }
                parts.extend(first..=last);
            }
            None => parts.push(number(item)?),
        }
    }
    parts.sort_unstable();
    parts.dedup();
    Ok(parts)
}

/// Sorted, distinct part numbers as runs: `[3, 17, 40, 41, 42]` → `3,17,40-42`.
pub fn compress(parts: &[u32]) -> String {
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let mut j = i;
        while j + 1 < parts.len() && parts[j + 1] == parts[j] + 1 {
            j += 1;
        }
        runs.push(match j - i {
            0 => parts[i].to_string(),
            _ => format!("{}-{}", parts[i], parts[j]),
        });
        i = j + 1;
    }
    runs.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_round_trip() {
        assert_eq!(parse("42,3,17,40-41,41").unwrap(), vec![3, 17, 40, 41, 42]);
        assert_eq!(compress(&[3, 17, 40, 41, 42]), "3,17,40-42");
        assert_eq!(compress(&[0, 1, 2, 3, 5]), "0-3,5");
        assert_eq!(compress(&[]), "");
        assert_eq!(parse(&compress(&[7, 8, 100])).unwrap(), vec![7, 8, 100]);
    }

    #[test]
    fn bad_lists_are_named() {
        assert_eq!(
            parse("3,x").unwrap_err().to_string(),
            "--part \"3,x\": \"x\" is not a part number (write parts as 3,17,40-42)"
        );
        assert_eq!(
            parse("9-2").unwrap_err().to_string(),
            "--part \"9-2\": the range \"9-2\" runs backwards"
        );
    }
}
