//! The documentation cannot drift from its generator: the README's CLI section is the part
//! of README-cli.md between the `cli-section` markers, and README-cli.md is its template
//! (transcripts/README-cli.md.in) with the transcripts filled in. Both are written by
//! transcripts/make-transcripts.sh; run it after changing the template or the CLI.

use std::path::Path;

const BEGIN: &str = "<!-- cli-section:begin -->";
const END: &str = "<!-- cli-section:end -->";
const REGENERATE: &str = "run crates/redsem-cli/transcripts/make-transcripts.sh";

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text between the markers, markers included.
fn section<'a>(text: &'a str, file: &str) -> &'a str {
    let a = text
        .find(BEGIN)
        .unwrap_or_else(|| panic!("{file}: no {BEGIN}"));
    let b = text.find(END).unwrap_or_else(|| panic!("{file}: no {END}"));
    assert!(a < b, "{file}: the markers are out of order");
    &text[a..b + END.len()]
}

#[test]
fn the_readme_cli_section_is_the_generated_one() {
    let cli = read("README-cli.md");
    let readme = read("../../README.md");
    assert!(
        section(&readme, "README.md") == section(&cli, "README-cli.md"),
        "README.md's CLI section differs from README-cli.md's: {REGENERATE}"
    );
}

/// Every line of the template outside its `{{…}}` placeholders is in README-cli.md, in the
/// same order.
#[test]
fn readme_cli_is_generated_from_its_template() {
    let template = read("transcripts/README-cli.md.in");
    let generated = read("README-cli.md");
    let mut rest = generated.as_str();
    for line in template.lines() {
        if line.starts_with("{{") && line.ends_with("}}") {
            continue;
        }
        let at = rest.find(line).unwrap_or_else(|| {
            panic!("README-cli.md lacks the template's line {line:?} (or has it elsewhere): {REGENERATE}")
        });
        rest = &rest[at + line.len()..];
    }
    assert!(
        !generated.contains("{{"),
        "a placeholder was left: {REGENERATE}"
    );
}
