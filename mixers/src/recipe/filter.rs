//! Row filters on a numeric column, written in the recipe as `"int_score >= 3"`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, PartialEq)]
pub struct RowFilter {
    pub column: String,
    pub op: CompareOp,
    pub value: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Ge,
    Gt,
    Le,
    Lt,
    Eq,
    Ne,
}

impl CompareOp {
    const ALL: [(&'static str, CompareOp); 6] = [
        (">=", CompareOp::Ge),
        ("<=", CompareOp::Le),
        ("==", CompareOp::Eq),
        ("!=", CompareOp::Ne),
        (">", CompareOp::Gt),
        ("<", CompareOp::Lt),
    ];

    fn symbol(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, op)| *op == self)
            .map(|(s, _)| *s)
            .unwrap_or("?")
    }
}

impl RowFilter {
    /// Does a row whose column holds `value` pass? A null never passes.
    pub fn keeps(&self, value: Option<f64>) -> bool {
        let Some(v) = value else { return false };
        match self.op {
            CompareOp::Ge => v >= self.value,
            CompareOp::Gt => v > self.value,
            CompareOp::Le => v <= self.value,
            CompareOp::Lt => v < self.value,
            CompareOp::Eq => v == self.value,
            CompareOp::Ne => v != self.value,
        }
    }

    pub fn parse(text: &str) -> Result<RowFilter, String> {
        let expected = || {
            format!(
                "expected `<column> <op> <number>` with op one of >= > <= < == !=, got {text:?}"
            )
        };
        let (column, op, rest) = CompareOp::ALL
            .iter()
            .find_map(|(sym, op)| text.split_once(sym).map(|(c, r)| (c, *op, r)))
            .ok_or_else(expected)?;
        let column = column.trim();
        if column.is_empty() || column.contains(char::is_whitespace) {
            return Err(expected());
        }
        let value: f64 = rest.trim().parse().map_err(|_| expected())?;
        if !value.is_finite() {
            return Err(expected());
        }
        Ok(RowFilter {
            column: column.to_string(),
            op,
            value,
        })
    }
}

impl std::fmt::Display for RowFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.column, self.op.symbol(), self.value)
    }
}

impl Serialize for RowFilter {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for RowFilter {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        RowFilter::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_operator() {
        assert_eq!(
            RowFilter::parse("int_score >= 3").unwrap().op,
            CompareOp::Ge
        );
        assert_eq!(
            RowFilter::parse("score>2.5").unwrap(),
            RowFilter {
                column: "score".into(),
                op: CompareOp::Gt,
                value: 2.5
            }
        );
        assert_eq!(RowFilter::parse("a <= -1").unwrap().op, CompareOp::Le);
        assert_eq!(RowFilter::parse("a < 1").unwrap().op, CompareOp::Lt);
        assert_eq!(RowFilter::parse("a == 1").unwrap().op, CompareOp::Eq);
        assert_eq!(RowFilter::parse("a != 1").unwrap().op, CompareOp::Ne);
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "int_score",
            ">= 3",
            "int_score >= three",
            "a b >= 1",
            "a >= nan",
        ] {
            assert!(RowFilter::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn null_never_passes() {
        let f = RowFilter::parse("x != 0").unwrap();
        assert!(!f.keeps(None));
        assert!(f.keeps(Some(1.0)));
    }

    #[test]
    fn display_round_trips() {
        let f = RowFilter::parse("int_score>=3").unwrap();
        assert_eq!(f.to_string(), "int_score >= 3");
        assert_eq!(RowFilter::parse(&f.to_string()).unwrap(), f);
    }
}
