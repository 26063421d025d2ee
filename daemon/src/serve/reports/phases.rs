//! Which segment of the lineage and which of its recipe's phases a step is in, for the loss per
//! phase in `/metrics`. A step belongs to the phase in force at its first token (a phase starts
//! at a token point of the stream, `[[mix.phase]] at_tokens`); phase 0 is the `[[source]]`
//! weights. `[mix.adaptive]`'s decisions are not counted as phases here (there are as many as
//! decisions): the lineage records the loss each decision saw (`dsprep inspect --decisions`).

use dsprep_mixers::lineage::Lineage;

/// Where each (segment, phase) begins, in steps, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPhases {
    starts: Vec<(u64, u32, u32)>,
}

impl StepPhases {
    /// The phases of `lineage`'s segments, with windows of `window_tokens`.
    pub fn new(lineage: &Lineage, window_tokens: u64) -> StepPhases {
        let mut starts = Vec::new();
        for (k, segment) in lineage.segments.iter().enumerate() {
            let until = (lineage.segments.get(k + 1)).map_or(u64::MAX, |next| next.from_step);
            starts.push((segment.from_step, k as u32, 0));
            for (p, phase) in segment.recipe.mix.phases.iter().enumerate() {
                let window = phase.at_tokens.div_ceil(window_tokens.max(1));
                let step = lineage.step_at_window(window).max(segment.from_step);
                if step < until {
                    starts.push((step, k as u32, p as u32 + 1));
                }
            }
        }
        starts.sort();
        StepPhases { starts }
    }

    /// The (segment, phase) of `step` ((0, 0) before any is known).
    pub fn of(&self, step: u64) -> (u32, u32) {
        match self.starts.partition_point(|&(from, _, _)| from <= step) {
            0 => (0, 0),
            i => (self.starts[i - 1].1, self.starts[i - 1].2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsprep_mixers::Recipe;

    #[test]
    fn steps_take_the_phase_in_force_at_their_first_token() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../config/quickstart.toml"
        ))
        .unwrap();
        let phased = format!(
            "{}\n[[mix.phase]]\nat_tokens = 10260\nweights = {{ c4 = 1.0 }}\n",
            text.replace("[mix]\n", "[mix]\nunit = \"tokens\"\n")
        );
        let recipe = Recipe::parse(&phased).unwrap();
        // 4 windows of 513 tokens a step: at_tokens 10260 is window 20, step 5's first.
        let lineage = Lineage::start(recipe, String::new(), 4, 1);
        let phases = StepPhases::new(&lineage, 513);
        assert_eq!(phases.of(0), (0, 0));
        assert_eq!(phases.of(4), (0, 0));
        assert_eq!(phases.of(5), (0, 1));
        assert_eq!(phases.of(500), (0, 1));
    }
}
