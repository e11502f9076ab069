//! The pictures the documents show exist: every image that README.md and
//! docs/*.md name (the charts docs/benchmarks.md opens with, which
//! `make charts` draws, and the README's diagram) is a file in the
//! repository, and an SVG where it says so.

use std::path::Path;

/// The image paths a Markdown text names (`![alt](path)`), relative to it.
fn images(text: &str) -> Vec<String> {
    text.split("![")
        .skip(1)
        .filter_map(|rest| {
            let target = rest.split_once("](")?.1;
            Some(target.split_once(')')?.0.to_string())
        })
        .filter(|path| !path.starts_with("http"))
        .collect()
}

#[test]
fn every_image_the_documents_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("an entry of docs/").path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    let mut seen = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("a document");
        for image in images(&text) {
            let path = doc.parent().expect("a folder").join(&image);
            let bytes =
                std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {image}: {e}", doc.display()));
            if image.ends_with(".svg") {
                let head = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).to_string();
                assert!(
                    head.contains("<svg") || head.contains("<?xml"),
                    "{image}: not an SVG"
                );
            }
            seen += 1;
        }
    }
    // The benchmark charts and the README's diagram, at least.
    assert!(seen >= 5, "only {seen} images named");
}

#[test]
fn the_benchmark_charts_are_named_at_the_top() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/benchmarks.md")).expect("benchmarks.md");
    let top: String = text.lines().take(20).collect::<Vec<_>>().join("\n");
    for chart in ["tb-consume", "leases", "gateways", "clients"] {
        assert!(
            top.contains(&format!("(img/{chart}.svg)")),
            "docs/benchmarks.md does not open with img/{chart}.svg"
        );
    }
}
