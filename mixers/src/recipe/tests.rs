use super::*;

const GOOD: &str = r#"
version = 1
[tokenizer]
path = "tok/tokenizer.json"
eos = "<|endoftext|>"
[packing]
seq_len = 2048
[shuffle]
seed = 7
buffer_size = 100
[mix]
stopping = "all_exhausted"
[[source]]
name = "fineweb-edu"
weight = 0.7
files = ["fw/*.parquet"]
format = "parquet"
filter = "int_score >= 3"
[[source]]
name = "stack"
weight = 0.3
files = ["stack/*.parquet"]
format = "parquet"
text = { list = "files", field = "content", separator = "\n" }
"#;

fn messages(text: &str) -> Vec<String> {
    match Recipe::parse(text) {
        Err(RecipeError::Invalid(errors)) => errors
            .iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect(),
        Err(other) => vec![other.to_string()],
        Ok(_) => vec![],
    }
}

#[test]
fn parses_a_full_recipe() {
    let recipe = Recipe::parse(GOOD).unwrap();
    assert_eq!(recipe.packing.window_tokens(), 2049);
    assert_eq!(recipe.mix.stopping, Stopping::AllExhausted);
    assert_eq!(
        recipe.sources[0].filter.as_ref().unwrap().to_string(),
        "int_score >= 3"
    );
    assert_eq!(recipe.sources[0].text, TextField::Column("text".into()));
    assert_eq!(
        recipe.sources[1].text,
        TextField::Join(JoinField {
            list: "files".into(),
            field: "content".into(),
            separator: "\n".into()
        })
    );
    assert_eq!(recipe.tokenizer.eos, TokenRef::Text("<|endoftext|>".into()));
}

#[test]
fn defaults_fill_in() {
    let recipe = Recipe::parse(
        "version = 1\n[tokenizer]\npath = \"t.json\"\neos = 0\n[packing]\nseq_len = 8\n[[source]]\nname = \"a\"\nfiles = [\"x\"]\nformat = \"jsonl\"\n",
    )
    .unwrap();
    assert_eq!(
        recipe.shuffle,
        ShuffleSpec {
            seed: 0,
            buffer_size: 10_000,
            shuffle_shards: true
        }
    );
    assert_eq!(recipe.mix.stopping, Stopping::FirstExhausted);
    assert_eq!(recipe.sources[0].weight, 1.0);
    assert_eq!(recipe.tokenizer.eos, TokenRef::Id(0));
}

#[test]
fn hash_ignores_spelling_but_not_meaning() {
    let a = Recipe::parse(GOOD).unwrap();
    let respelled = GOOD
        .replace("seed = 7", "seed    =    7 # same")
        .replace("weight = 0.3", "weight = 0.30");
    assert_eq!(a.hash(), Recipe::parse(&respelled).unwrap().hash());
    let other = GOOD.replace("seed = 7", "seed = 8");
    assert_ne!(a.hash(), Recipe::parse(&other).unwrap().hash());
    assert_eq!(a.hash().len(), 64);
}

#[test]
fn every_unknown_key_is_reported_with_its_path() {
    let text = GOOD
        .replace("seq_len = 2048", "seq_len = 2048\nseq_length = 4")
        .replace("weight = 0.3", "weight = 0.3\nweights = 1");
    assert_eq!(
        messages(&text),
        vec![
            "packing.seq_length: unknown key",
            "source[1].weights: unknown key"
        ]
    );
}

#[test]
fn every_invalid_value_is_reported_with_its_path() {
    let text = GOOD
        .replace("version = 1", "version = 2")
        .replace("seq_len = 2048", "seq_len = 0")
        .replace("weight = 0.7", "weight = -1.0")
        .replace("name = \"stack\"", "name = \"fineweb-edu\"")
        .replace("files = [\"stack/*.parquet\"]", "files = []");
    assert_eq!(
        messages(&text),
        vec![
            "version: unsupported recipe version 2 (this dsprep reads version 1)",
            "packing.seq_len: must be between 1 and 16777216, got 0",
            "source[0].weight: must be a finite number >= 0, got -1",
            "source[1].name: \"fineweb-edu\" is used by an earlier source",
            "source[1].files: must list at least one file or glob pattern",
        ]
    );
}

#[test]
fn all_zero_weights_are_refused() {
    let text = GOOD
        .replace("weight = 0.7", "weight = 0.0")
        .replace("weight = 0.3", "weight = 0");
    assert_eq!(
        messages(&text),
        vec!["source: all weights are zero: at least one source needs weight > 0"]
    );
}

#[test]
fn a_bad_filter_names_the_field() {
    let text = GOOD.replace("int_score >= 3", "int_score is big");
    let message = messages(&text).join("\n");
    assert!(
        message.contains("source[0].filter") || message.contains("filter"),
        "{message}"
    );
    assert!(
        message.contains("expected `<column> <op> <number>`"),
        "{message}"
    );
}

#[test]
fn a_wrong_type_is_a_syntax_error_with_its_location() {
    let text = GOOD.replace("seq_len = 2048", "seq_len = \"long\"");
    let message = messages(&text).join("\n");
    assert!(message.contains("seq_len"), "{message}");
    assert!(message.contains("line 7"), "{message}");
}

#[test]
fn unknown_keys_inside_a_join_are_refused() {
    let text = GOOD.replace("separator = \"\\n\"", "sep = \"\\n\"");
    assert!(!messages(&text).is_empty());
}

const STACK_IDS: &str = "[[source]]\nname = \"stack\"\nfiles = [\"hf://datasets/bigcode/the-stack-v2-train-smol-ids/data/*.parquet\"]\n\
                         format = \"parquet\"\ntext = { list = \"files\", field = \"blob_id\" }\n";

fn with_source(source: &str) -> String {
    format!(
        "version = 1\n[tokenizer]\npath = \"t.json\"\neos = 0\n[packing]\nseq_len = 8\n{source}"
    )
}

#[test]
fn content_defaults_to_the_software_heritage_template_and_concurrency_is_not_hashed() {
    let text = with_source(&format!("{STACK_IDS}[source.content]\nper = \"file\"\n"));
    let recipe = Recipe::parse(&text).unwrap();
    let content = recipe.sources[0].content.as_ref().unwrap();
    assert_eq!(content.url_template.as_deref(), Some(DEFAULT_CONTENT_URL));
    assert_eq!(content.per, ContentPer::File);
    assert_eq!(content.concurrency, 16);
    assert_eq!(content.encoding_field, "src_encoding");
    assert!(recipe.needs_network());
    let faster = Recipe::parse(&text.replace("per = ", "concurrency = 64\nper = ")).unwrap();
    assert_eq!(
        recipe.hash(),
        faster.hash(),
        "concurrency never changes the bytes"
    );
    let spelled = text.replace(
        "per = ",
        "url_template = \"https://softwareheritage.s3.amazonaws.com/content/{blob_id}\"\nper = ",
    );
    assert_eq!(recipe.hash(), Recipe::parse(&spelled).unwrap().hash());
    let mirrored =
        Recipe::parse(&text.replace("per = ", "mirror_dir = \"blobs\"\nper = ")).unwrap();
    assert_ne!(recipe.hash(), mirrored.hash());
    assert!(
        Recipe::parse(&with_source(STACK_IDS))
            .unwrap()
            .needs_network()
    );
}

#[test]
fn recipes_without_content_keep_their_hash() {
    // The canonical form of a recipe without [source.content] is what it was before content
    // existed: no `content` key at all.
    let recipe = Recipe::parse(GOOD).unwrap();
    assert!(!recipe.canonical_json().contains("content\":{"));
    assert!(!recipe.needs_network());
}

#[test]
fn bad_content_and_hub_locations_are_reported_with_their_paths() {
    let text = with_source(
        "[[source]]\nname = \"stack\"\nfiles = [\"hf://models/gpt2/*.bin\", \"hf://datasets/bigcode/x@/data/*.parquet\"]\n\
         format = \"jsonl\"\ntext = \"content\"\n\
         [source.content]\nurl_template = \"https://example.org/blobs\"\nconcurrency = 0\nsize = 3\n",
    );
    assert_eq!(
        messages(&text),
        vec![
            "source[0].content.size: unknown key",
            "source[0].files[0]: only dataset repos can be read (expected hf://datasets/OWNER/NAME[@REVISION]/PATH_GLOB)",
            "source[0].files[1]: has an empty revision after '@' (expected hf://datasets/OWNER/NAME[@REVISION]/PATH_GLOB)",
            "source[0].content.url_template: must contain {blob_id}, got \"https://example.org/blobs\"",
            "source[0].content.concurrency: must be between 1 and 1024, got 0",
            "source[0].content: needs text = { list = \"files\", field = \"blob_id\" }: the list of files and their id field",
            "source[0].content: needs format = \"parquet\"",
        ]
    );
    let both = with_source(&format!(
        "{STACK_IDS}[source.content]\nurl_template = \"x/{{blob_id}}\"\nmirror_dir = \"m\"\n"
    ));
    assert_eq!(
        messages(&both),
        vec!["source[0].content: set either url_template or mirror_dir, not both"]
    );
}

#[test]
fn lanes_are_optional_hashed_when_present_and_checked() {
    let plain = Recipe::parse(GOOD).unwrap();
    assert!(plain.lanes.is_none());
    assert!(
        !plain.canonical_json().contains("lanes"),
        "a recipe without [lanes] keeps the hash it had before lanes existed"
    );
    let laned = Recipe::parse(&format!("{GOOD}\n[lanes]\ncount = 4\nblock_windows = 2\n")).unwrap();
    assert_eq!(
        laned.lanes,
        Some(LanesSpec {
            count: 4,
            block_windows: 2
        })
    );
    assert_ne!(laned.hash(), plain.hash());
    assert_eq!(
        messages(&format!("{GOOD}\n[lanes]\ncount = 0\nblock_windows = 0\n")),
        vec![
            "lanes.count: must be between 1 and 4096, got 0".to_string(),
            "lanes.block_windows: must be at least 1 (windows taken from one lane in a row)"
                .to_string(),
        ]
    );
    let typo = messages(&format!(
        "{GOOD}\n[lanes]\ncount = 2\nblock_windows = 1\nblocks = 3\n"
    ));
    assert!(typo.iter().any(|m| m.contains("blocks")), "{typo:?}");
}

/// `GOOD` mixed in tokens with `phases` (TOML `[[mix.phase]]` tables) after the sources.
fn with_phases(phases: &str) -> String {
    format!(
        "{}\n{phases}",
        GOOD.replace(
            "stopping = \"all_exhausted\"",
            "stopping = \"all_exhausted\"\nunit = \"tokens\""
        )
    )
}

#[test]
fn phases_parse_join_the_hash_and_name_the_sources_that_take_part() {
    let recipe = Recipe::parse(&with_phases(
        "[[mix.phase]]\nat_tokens = 1000\nweights = { stack = 1.0 }\n",
    ))
    .unwrap();
    assert_eq!(recipe.mix.unit, MixUnit::Tokens);
    assert_eq!(recipe.phase_weights(), vec![vec![0.7, 0.3], vec![0.0, 1.0]]);
    let plain = Recipe::parse(&with_phases("")).unwrap();
    assert_ne!(recipe.hash(), plain.hash());
    assert!(plain.mix.phases.is_empty());
    let joins = Recipe::parse(
        &with_phases("[[mix.phase]]\nat_tokens = 5\nweights = { stack = 1.0 }\n")
            .replace("weight = 0.3", "weight = 0"),
    )
    .unwrap();
    assert!(
        joins.takes_part(1),
        "weight 0, then 1 in a phase: listed and read"
    );
    assert_eq!(joins.active_sources().count(), 2);
}

#[test]
fn every_phase_problem_is_reported_with_its_path() {
    let phases = "[[mix.phase]]\nat_tokens = 0\nweights = { stack = 1.0, web = 2.0 }\n\
                  [[mix.phase]]\nat_tokens = 500\nweights = { stack = 0.0 }\n\
                  [[mix.phase]]\nat_tokens = 400\nweights = { fineweb-edu = -1.0 }\n";
    assert_eq!(
        messages(&with_phases(phases)),
        vec![
            "mix.phase[0].at_tokens: must be above 0, got 0",
            "mix.phase[0].weights.web: no [[source]] has this name",
            "mix.phase[1].weights: no source has weight > 0 in this phase",
            "mix.phase[2].at_tokens: must be after phase[1]'s 500, got 400",
            "mix.phase[2].weights.fineweb-edu: must be a finite number >= 0, got -1",
            "mix.phase[2].weights: no source has weight > 0 in this phase",
        ]
    );
    let in_documents = with_phases("[[mix.phase]]\nat_tokens = 9\nweights = { stack = 1.0 }\n")
        .replace("unit = \"tokens\"", "");
    assert_eq!(
        messages(&in_documents),
        vec!["mix.phase: phases switch at a number of tokens: they need [mix] unit = \"tokens\""]
    );
    let unknown = with_phases("[[mix.phase]]\nat_tokens = 9\nweights = {}\nat_steps = 3\n");
    assert!(
        messages(&unknown)[0].contains("unknown field `at_steps`"),
        "{:?}",
        messages(&unknown)
    );
}

#[test]
fn oversize_split_is_hashed_reads_up_to_1_gib_and_needs_room_for_a_character() {
    let source = "[[source]]\nname = \"code\"\nfiles = [\"c/*.parquet\"]\nformat = \"parquet\"\n";
    let split = with_source(&format!(
        "{source}max_document_bytes = 4096\noversize = \"split\"\n"
    ));
    let recipe = Recipe::parse(&split).unwrap();
    let spec = &recipe.sources[0];
    assert_eq!(spec.oversize, Some(Oversize::Split));
    assert_eq!((spec.document_limit(), spec.read_limit()), (4096, 1 << 30));
    let skip = Recipe::parse(&split.replace("\"split\"", "\"skip\"")).unwrap();
    assert_eq!(skip.sources[0].read_limit(), 4096);
    assert_ne!(recipe.hash(), skip.hash());
    assert!(recipe.canonical_json().contains("\"oversize\":\"split\""));

    assert_eq!(
        messages(&split.replace("= 4096", "= 3")),
        [
            "source[0].max_document_bytes: must be at least 4 with oversize = \"split\" (a piece \
          must hold any character), got 3"
        ]
    );
    assert!(messages(&split.replace("= 4096", "= 4")).is_empty());
    let misspelled = messages(&split.replace("\"split\"", "\"cut\""));
    assert!(
        misspelled[0].contains("unknown variant `cut`, expected one of `error`, `skip`, `split`"),
        "{misspelled:?}"
    );
}
