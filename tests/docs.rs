//! Docs that cannot drift: the guide is checked against the product it describes.
//!
//! - Every `--flag` of `dsprep --help` and of every subcommand's `--help` is in docs/settings.md,
//!   under that command, and every flag settings.md documents is in that command's `--help`.
//! - Every environment variable the product reads (found by scanning daemon/src, mixers/src and
//!   client/ for the names passed to the environment) is in settings.md, and nothing else is.
//! - Every relative link and `#anchor` of the top-level pages and docs/*.md resolves.
//! - Every ```console block of docs/*.md runs: each `$ dsprep …` line against the built binary,
//!   in a temporary directory holding `config/`, its stdout compared with the lines below it
//!   (`...` on a line of its own: any lines; `[..]` in a line: any text).
//!
//! Each checker is a plain function over text, with a fixture test that shows it reporting a
//! drift by name. The examples runner is hand-written rather than `trycmd`: trycmd runs a
//! Markdown page in the page's own folder, or in a sandbox copied from a `<page>.in/` folder,
//! so the guide's commands (`--recipe config/quickstart.toml`, `--out packed`) would either write
//! into docs/ or need the 14 MB config/ tree kept twice; here a temporary directory with a link
//! to config/ does it, with no new dependency to build.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("daemon/ has a parent")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of a Markdown page outside its fenced code blocks, line by line (code lines are
/// replaced by empty ones so line numbers stay).
fn prose_lines(md: &str) -> Vec<&str> {
    let mut fenced = false;
    md.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return "";
            }
            if fenced { "" } else { line }
        })
        .collect()
}

/// `--name` tokens in `text`, in order.
fn long_flags(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("--") {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + 2..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let starts_word = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-');
        if starts_word && name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
            flags.push(format!("--{}", name.trim_end_matches('-')));
        }
        rest = &after[name.len()..];
    }
    flags
}

// ---------------------------------------------------------------------------------------------
// Flags

/// The flags a clap `--help` defines: the first `--name` of each option line (a line whose text
/// starts with `-` within clap's option indent of at most 6 spaces), so a flag only mentioned in
/// a description, or in a description's wrapped line, does not count.
fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|l| {
            let text = l.trim_start();
            text.starts_with('-') && l.len() - text.len() <= 6
        })
        .filter_map(|l| long_flags(l).into_iter().next())
        .filter(|f| f != "--help")
        .collect()
}

/// The rows of the first Markdown table under `## {heading}`: each row's cells, trimmed.
fn table_rows(md: &str, heading: &str) -> Vec<Vec<String>> {
    let lines = prose_lines(md);
    let Some(start) = lines
        .iter()
        .position(|l| l.trim() == format!("## {heading}"))
    else {
        return Vec::new();
    };
    lines[start + 1..]
        .iter()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.trim_start().starts_with('|'))
        .skip(2) // the header row and the |---| row
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// settings.md's flags table: (command, flag) for every flag of every command a row names.
fn settings_flags(md: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for row in table_rows(md, "Flags") {
        let (Some(commands), Some(flags)) = (row.first(), row.get(1)) else {
            continue;
        };
        for command in commands.split(',') {
            for flag in long_flags(flags) {
                out.insert((command.trim().to_string(), flag));
            }
        }
    }
    out
}

/// What differs between the commands' `--help` (command name → text; `dsprep` for the top
/// level) and settings.md, one line per flag, naming it.
fn check_flags(helps: &BTreeMap<String, String>, settings_md: &str) -> Vec<String> {
    let documented = settings_flags(settings_md);
    let mut problems = Vec::new();
    for (command, help) in helps {
        for flag in help_flags(help) {
            if !documented.contains(&(command.clone(), flag.clone())) {
                problems.push(format!(
                    "{command} {flag} is in `{command} --help` but not in docs/settings.md"
                ));
            }
        }
    }
    for (command, flag) in &documented {
        match helps.get(command) {
            None => problems.push(format!(
                "docs/settings.md documents {flag} of {command:?}, which is not a command"
            )),
            Some(help) if !help_flags(help).contains(flag) => problems.push(format!(
                "docs/settings.md documents {command} {flag}, which `{command} --help` does not have"
            )),
            Some(_) => {}
        }
    }
    problems
}

fn dsprep_help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dsprep"))
        .args(args)
        .arg("--help")
        .output()
        .expect("the dsprep binary runs");
    assert!(out.status.success(), "dsprep {args:?} --help failed");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands `dsprep --help` lists.
fn subcommands(top_help: &str) -> Vec<String> {
    let mut lines = top_help.lines().skip_while(|l| l.trim() != "Commands:");
    lines.next();
    lines
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn every_flag_of_every_help_is_in_settings_and_every_documented_flag_exists() {
    let top = dsprep_help(&[]);
    let commands = subcommands(&top);
    assert!(commands.contains(&"pack".to_string()), "{top}");
    let mut helps = BTreeMap::from([("dsprep".to_string(), top)]);
    for command in commands {
        let help = dsprep_help(&[&command]);
        helps.insert(command, help);
    }
    let settings = read(&repo_root().join("docs/settings.md"));
    let problems = check_flags(&helps, &settings);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

const FIXTURE_HELP: &str = "\
Run a recipe and write memory-mappable token shards.

Usage: dsprep pack [OPTIONS] --recipe <RECIPE>

Options:
      --recipe <RECIPE>    The recipe (TOML)
      --shard-mib <N>      Target size of one shard; see also --recipe [default: 256]
      --brand-new <N>      A flag added without docs
  -q, --quiet              No progress display
  -h, --help               Print help
";

const FIXTURE_SETTINGS: &str = "\
# Settings

## Flags

| command | flag | default | what |
|---|---|---|---|
| pack | `--recipe FILE` | required | the recipe |
| pack | `--shard-mib N` | `256` | shard size |
| pack, export | `--quiet`, `-q` | off | no progress |
| pack | `--gone` | off | a flag that was removed |

## Environment variables
";

#[test]
fn the_flag_check_names_an_undocumented_flag_and_a_documented_flag_that_is_gone() {
    let helps = BTreeMap::from([
        ("pack".to_string(), FIXTURE_HELP.to_string()),
        (
            "export".to_string(),
            "Options:\n  -q, --quiet  quiet\n".to_string(),
        ),
    ]);
    let problems = check_flags(&helps, FIXTURE_SETTINGS);
    assert_eq!(
        problems,
        [
            "pack --brand-new is in `pack --help` but not in docs/settings.md",
            "docs/settings.md documents pack --gone, which `pack --help` does not have",
        ],
        "{problems:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Environment variables

/// The calls that read an environment variable by a name given as a string literal: the
/// standard library's, and the small closures the product wraps them in (`var`, `number`,
/// `read`), and Python's `os.environ.get`.
const ENV_READERS: [&str; 6] = [
    "var(",
    "var_os(",
    "number(",
    "read(",
    "try_from_env(",
    "environ.get(",
];

/// Prefixes of names that are environment variables wherever they appear as a literal (the
/// product's own, and the Hub's, Slurm's and XDG's): a name held in a constant first
/// (`const PLAIN_EVERY_ENV: &str = "DSPREP_PROGRESS_SECS"`) is found so.
const ENV_PREFIXES: [&str; 4] = ["DSPREP_", "HF_", "SLURM_", "XDG_"];

/// The environment variables read by the source files given (path, text).
fn env_names_in_source(files: &[(PathBuf, String)]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, text) in files {
        let mut rest = text.as_str();
        while let Some(i) = rest.find('"') {
            let before = &rest[..i];
            let after = &rest[i + 1..];
            let Some(end) = after.find('"') else { break };
            let literal = &after[..end];
            let is_name = !literal.is_empty()
                && literal.starts_with(|c: char| c.is_ascii_uppercase())
                && literal
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            let read_by_call = ENV_READERS.iter().any(|r| before.ends_with(r));
            let prefixed = ENV_PREFIXES.iter().any(|p| literal.starts_with(p));
            if is_name && (read_by_call || prefixed) {
                names.insert(literal.to_string());
            }
            rest = &after[end + 1..];
        }
    }
    names
}

/// settings.md's environment table: every backticked name in the first column.
fn settings_env(md: &str) -> BTreeSet<String> {
    table_rows(md, "Environment variables")
        .iter()
        .filter_map(|row| row.first())
        .flat_map(|cell| {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn check_env(read_by_product: &BTreeSet<String>, settings_md: &str) -> Vec<String> {
    let documented = settings_env(settings_md);
    let mut problems: Vec<String> = read_by_product
        .difference(&documented)
        .map(|n| format!("{n} is read by the product but not in docs/settings.md"))
        .collect();
    problems.extend(
        documented
            .difference(read_by_product)
            .map(|n| format!("docs/settings.md documents {n}, which the product does not read")),
    );
    problems
}

fn source_files(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            // Tests and examples are not the product; zmq-sys is the vendored libzmq build.
            if !["tests", "examples", "bench", "zmq-sys", "target"].contains(&name) {
                source_files(&path, out);
            }
        } else if name.ends_with(".rs") || name.ends_with(".py") {
            out.push((path.clone(), read(&path)));
        }
    }
}

#[test]
fn every_environment_variable_the_product_reads_is_in_settings_and_no_other() {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ["daemon/src", "mixers/src", "client"] {
        source_files(&root.join(dir), &mut files);
    }
    let names = env_names_in_source(&files);
    for known in [
        "DSPREP_LOG",
        "HF_TOKEN",
        "RANK",
        "SLURM_NNODES",
        "DSPREP_TP",
    ] {
        assert!(names.contains(known), "the scan misses {known}: {names:?}");
    }
    let problems = check_env(&names, &read(&root.join("docs/settings.md")));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_env_check_names_an_undocumented_variable_and_a_documented_one_that_is_gone() {
    let source = vec![(
        PathBuf::from("fixture.rs"),
        r#"const NEW_ENV: &str = "DSPREP_BRAND_NEW";
           let rank = read("RANK")?; let magic = b"PAR1"; let x = "NOT_AN_ENV_READ";"#
            .to_string(),
    )];
    let names = env_names_in_source(&source);
    assert_eq!(
        names,
        BTreeSet::from(["DSPREP_BRAND_NEW".to_string(), "RANK".to_string()])
    );
    let settings = "## Environment variables\n\n| variable | default |\n|---|---|\n\
                    | `RANK`, `WORLD_SIZE` | |\n";
    assert_eq!(
        check_env(&names, settings),
        [
            "DSPREP_BRAND_NEW is read by the product but not in docs/settings.md",
            "docs/settings.md documents WORLD_SIZE, which the product does not read",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Links and anchors

/// GitHub's anchor for a heading: lowercase, punctuation removed (letters, digits, spaces, `-`
/// and `_` kept), spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a page has: its headings' slugs, a repeated one with `-1`, `-2`, … as GitHub
/// numbers them.
fn anchors(md: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose_lines(md) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
    }
    out
}

/// Every `[text](target)` link of a page outside code, with its line number.
fn links(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in prose_lines(md).iter().enumerate() {
        let mut rest = *line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every relative link of `pages` (path relative to the repository → text) that does not
/// resolve: the file must exist (`exists`, or be one of the pages), and an anchor must be a
/// heading of the page it names.
fn check_links(pages: &BTreeMap<PathBuf, String>, exists: &dyn Fn(&Path) -> bool) -> Vec<String> {
    let mut problems = Vec::new();
    for (page, text) in pages {
        for (line, target) in links(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = match file {
                "" => page.clone(),
                _ => normalize(&page.parent().unwrap_or(Path::new("")).join(file)),
            };
            let here = format!("{}:{line}: ({target})", page.display());
            if !pages.contains_key(&resolved) && !exists(&resolved) {
                problems.push(format!("{here}: {} does not exist", resolved.display()));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            match pages.get(&resolved) {
                Some(target_text) if anchors(target_text).contains(anchor) => {}
                Some(_) => problems.push(format!(
                    "{here}: {} has no heading whose anchor is #{anchor}",
                    resolved.display()
                )),
                None => problems.push(format!(
                    "{here}: an anchor into {}, which is not a checked page",
                    resolved.display()
                )),
            }
        }
    }
    problems
}

/// The pages whose links are checked: the top-level Markdown pages and docs/*.md.
fn doc_pages() -> BTreeMap<PathBuf, String> {
    let root = repo_root();
    let mut pages = BTreeMap::new();
    for name in [
        "README.md",
        "CONTRIBUTING.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "FORMAT.md",
        "PROTOCOL.md",
    ] {
        pages.insert(PathBuf::from(name), read(&root.join(name)));
    }
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/ exists") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            let relative = path
                .strip_prefix(&root)
                .expect("under the root")
                .to_path_buf();
            pages.insert(relative, read(&path));
        }
    }
    pages
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = repo_root();
    let pages = doc_pages();
    assert!(pages.len() >= 12, "{:?}", pages.keys());
    let problems = check_links(&pages, &|p| root.join(p).exists());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_link_check_names_a_missing_file_and_a_missing_anchor() {
    let pages = BTreeMap::from([
        (
            PathBuf::from("README.md"),
            "# dsprep\n\nSee [the recipe](docs/recipe.md#mixing-in-tokens-mix-unit--tokens), \
             [gone](docs/gone.md), [web](https://example.com/x.md) and \
             [a typo](docs/recipe.md#mixing-in-token).\n\n```\n[in code](nowhere.md)\n```\n"
                .to_string(),
        ),
        (
            PathBuf::from("docs/recipe.md"),
            "# The recipe\n\n## Mixing in tokens: `[mix] unit = \"tokens\"`\n\n\
             [back](../README.md#dsprep) [self](#the-recipe)\n"
                .to_string(),
        ),
    ]);
    let problems = check_links(&pages, &|_| false);
    assert_eq!(
        problems,
        [
            "README.md:3: (docs/gone.md): docs/gone.md does not exist",
            "README.md:3: (docs/recipe.md#mixing-in-token): docs/recipe.md has no heading whose \
             anchor is #mixing-in-token",
        ],
        "{problems:#?}"
    );
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("Mixing in tokens: `[mix] unit = \"tokens\"`"),
        "mixing-in-tokens-mix-unit--tokens"
    );
    assert_eq!(slug("`dsprep pack`"), "dsprep-pack");
    assert_eq!(
        slug("Plan file (`dsprep plan --out`), version 1"),
        "plan-file-dsprep-plan---out-version-1"
    );
    assert_eq!(slug("FSDP (and plain DDP)"), "fsdp-and-plain-ddp");
}

// ---------------------------------------------------------------------------------------------
// Examples

/// One `$ command` of a ```console block, with the stdout it shows.
#[derive(Debug, PartialEq)]
struct Example {
    page: String,
    line: usize,
    command: String,
    expected: Vec<String>,
}

/// The `$ …` commands of every ```console block of `md`, in order.
fn console_examples(page: &str, md: &str) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let mut in_console = false;
    for (i, line) in md.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_console = !in_console && trimmed == "```console";
            continue;
        }
        if !in_console {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            out.push(Example {
                page: page.to_string(),
                line: i + 1,
                command: command.trim().to_string(),
                expected: Vec::new(),
            });
        } else if let Some(last) = out.last_mut() {
            last.expected.push(line.to_string());
        }
    }
    out
}

/// Does `actual` match `pattern`, where `[..]` matches any text within the line?
fn line_matches(pattern: &str, actual: &str) -> bool {
    let mut parts = pattern.split("[..]");
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = actual.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (k, part) in parts.iter().enumerate() {
        if k + 1 == parts.len() {
            return rest.ends_with(part) && rest.len() >= part.len();
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Does `actual` (lines) match `expected`, where a line `...` matches any number of lines?
fn output_matches(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| output_matches(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(a, more)| line_matches(first, a) && output_matches(rest, more)),
    }
}

#[test]
fn the_output_matcher_takes_wildcards_and_reports_a_difference() {
    let expected: Vec<String> = ["packed 12 windows in [..] s", "...", "recipe [..]"]
        .map(String::from)
        .to_vec();
    assert!(output_matches(
        &expected,
        &["packed 12 windows in 0.3 s", "a", "b", "recipe 23ab"]
    ));
    assert!(output_matches(
        &expected,
        &["packed 12 windows in 0.3 s", "recipe 23ab"]
    ));
    assert!(!output_matches(
        &expected,
        &["packed 13 windows in 0.3 s", "recipe 23ab"]
    ));
    assert!(!output_matches(&expected, &["packed 12 windows in 0.3 s"]));
    let md = "text\n```console\n$ dsprep verify packed\nok\n...\n```\n```bash\n$ not run\n```\n";
    assert_eq!(
        console_examples("p.md", md),
        [Example {
            page: "p.md".into(),
            line: 3,
            command: "dsprep verify packed".into(),
            expected: vec!["ok".into(), "...".into()],
        }]
    );
}

#[test]
fn every_console_example_of_the_guide_runs_as_written() {
    let root = repo_root();
    let mut examples = Vec::new();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    for path in pages {
        let name = path
            .strip_prefix(&root)
            .expect("under the root")
            .display()
            .to_string();
        examples.extend(console_examples(&name, &read(&path)));
    }
    let commands: Vec<&str> = examples.iter().map(|e| e.command.as_str()).collect();
    for needed in [
        "dsprep pack ",
        "dsprep verify ",
        "dsprep inspect ",
        "dsprep plan ",
    ] {
        assert!(
            commands.iter().any(|c| c.starts_with(needed)),
            "no console example runs {needed:?}: {commands:?}"
        );
    }
    // One directory for the whole guide, as a user's clone: config/ there, outputs beside it.
    let tmp = tempfile::tempdir().expect("a temporary directory");
    std::os::unix::fs::symlink(root.join("config"), tmp.path().join("config"))
        .expect("config/ is linked");
    let mut failures = Vec::new();
    for example in &examples {
        let mut words = example.command.split_whitespace();
        assert_eq!(
            words.next(),
            Some("dsprep"),
            "{}:{}: console examples run dsprep only",
            example.page,
            example.line
        );
        let out = Command::new(env!("CARGO_BIN_EXE_dsprep"))
            .args(words)
            .current_dir(tmp.path())
            .env_remove("DSPREP_LOG")
            .env("DSPREP_ENGINE_CACHE", tmp.path().join("engines"))
            .output()
            .expect("the dsprep binary runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let actual: Vec<&str> = stdout.lines().collect();
        if !out.status.success() || !output_matches(&example.expected, &actual) {
            failures.push(format!(
                "{}:{}: $ {}\n{}\n--- expected\n{}\n--- stdout\n{stdout}--- stderr\n{}",
                example.page,
                example.line,
                example.command,
                out.status,
                example.expected.join("\n"),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
